//! Builds a policy from its registry name.
//!
//! [`POLICY_NAMES`] is the stable list of names that users' scripts pass to `--policy`; [`build`]
//! turns one of them and a [`PolicyConfig`] into a boxed [`Policy`]. Adding a policy touches two
//! places: its module and one arm of [`build`].

use crate::policy::config::{PolicyConfig, RegistryError, invalid};
use crate::policy::{Policy, best_fit, buddy, first_fit, pool};
use crate::trace::TraceView;

/// Every registered policy name, in the order frontends list them.
pub const POLICY_NAMES: &[&str] = &[
    "first-fit",
    "best-fit",
    "bfc",
    "buddy",
    "pool",
    "glibc",
    "oracle",
    "pytorch",
    "predictive",
];

impl RegistryError {
    /// The error for a name outside [`POLICY_NAMES`], which it lists: here, beside the list.
    fn unknown(name: &str) -> Self {
        Self::UnknownPolicy {
            name: name.to_owned(),
            known: POLICY_NAMES.to_vec(),
        }
    }
}

/// Builds the policy called `name`. `trace` is the trace about to be replayed: offline policies
/// (`oracle`) plan from it, `predictive` reads its allocations' features (and, with
/// `lifetimes=true`, their true lifetimes) from it; online policies ignore it.
///
/// # Errors
/// [`RegistryError::UnknownPolicy`] for a name outside [`POLICY_NAMES`], and
/// [`RegistryError::InvalidConfig`] when `config` makes no sense for that policy.
pub fn build(
    name: &str,
    config: &PolicyConfig,
    trace: &TraceView<'_>,
) -> Result<Box<dyn Policy>, RegistryError> {
    build_observed(name, config, trace, None)
}

/// [`build`], telling `progress` how far a policy that prepares before the replay has got (the
/// oracle plans the whole trace first); the others leave it untouched.
///
/// # Errors
/// As [`build`].
pub fn build_observed(
    name: &str,
    config: &PolicyConfig,
    trace: &TraceView<'_>,
    progress: Option<&crate::plan::greedy_by_size::Progress>,
) -> Result<Box<dyn Policy>, RegistryError> {
    match name {
        "first-fit" => Ok(Box::new(
            first_fit::FirstFit::new(config).map_err(invalid(name))?,
        )),
        "best-fit" => Ok(Box::new(
            best_fit::BestFit::new(config).map_err(invalid(name))?,
        )),
        "bfc" => Ok(Box::new(crate::policy::bfc::Bfc::from_config(config)?)),
        "buddy" => Ok(Box::new(buddy::Buddy::new(config).map_err(invalid(name))?)),
        "pool" => Ok(Box::new(pool::Pool::new(config).map_err(invalid(name))?)),
        "glibc" => Ok(Box::new(crate::policy::glibc::Glibc::from_config(config)?)),
        "oracle" => Ok(Box::new(
            crate::policy::oracle::Oracle::new_observed(trace, config, progress)
                .map_err(|e| invalid(name)(e.to_string()))?,
        )),
        "pytorch" => Ok(Box::new(
            crate::policy::pytorch::Pytorch::new(config.pytorch.clone(), config)
                .map_err(invalid(name))?,
        )),
        "predictive" => Ok(Box::new(
            crate::policy::predictive::Predictive::new(trace, config).map_err(invalid(name))?,
        )),
        _ => Err(RegistryError::unknown(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::OwnedTrace;

    #[test]
    fn unknown_name_lists_the_known_ones() {
        let owned = OwnedTrace::new();
        let view = owned.view().unwrap();
        let err = build("tlsf", &PolicyConfig::default(), &view).unwrap_err();
        assert_eq!(
            err,
            RegistryError::UnknownPolicy {
                name: "tlsf".to_owned(),
                known: POLICY_NAMES.to_vec(),
            }
        );
        assert!(err.to_string().contains("first-fit, best-fit, bfc"));
    }

    #[test]
    fn every_listed_name_is_known() {
        let owned = OwnedTrace::new();
        let view = owned.view().unwrap();
        // Every policy the registry lists is built (none is a placeholder any more).
        for name in POLICY_NAMES {
            match build(name, &PolicyConfig::default(), &view) {
                Ok(policy) => assert_eq!(policy.name(), *name),
                Err(e) => panic!("{name}: {e}"),
            }
        }
    }
}
