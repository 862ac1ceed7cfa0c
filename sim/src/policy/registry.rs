//! Builds a policy from its registry name.
//!
//! [`POLICY_NAMES`] is the stable list of names that users' scripts pass to `--policy`; [`build`]
//! turns one of them and a [`PolicyConfig`] into a boxed [`Policy`]. Adding a policy touches two
//! places: its module and one arm of [`build`].

use std::sync::Arc;

use crate::policy::pytorch::{PytorchScript, PytorchSettings};
use crate::policy::{Policy, best_fit, buddy, first_fit, pool};
use crate::predict::lifetime::{AllocFeatures, DEFAULT_SHORT_ALLOCS};
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

/// Knobs for every policy. Each policy reads the fields it understands and ignores the rest, so
/// one config can drive a whole `compare` run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyConfig {
    /// Alignment (a power of two) of every placement and rounding unit of the fit policies'
    /// reserved sizes. Default 16, as malloc on x86-64.
    pub align_bytes: u64,
    /// Upper bound on the footprint; an allocation that would push the footprint past it fails
    /// with out-of-memory. `None` means unlimited.
    pub limit_bytes: Option<u64>,
    /// Buddy: size of an order-0 block (a power of two). Default 256 B.
    pub buddy_min_block_bytes: u64,
    /// Buddy: highest order; a top-level block is `buddy_min_block_bytes << buddy_max_order`.
    /// Default 18, so the default top-level block is 256 B << 18 = 64 MiB.
    pub buddy_max_order: u32,
    /// Pool: size of each bump block. Default 64 MiB, as in alphaFM's memory pool.
    pub pool_block_bytes: u64,
    /// BFC: grow regions on demand (2 MiB, then doubling) instead of reserving the whole limit
    /// at once. Default true (TensorFlow's `allow_growth`).
    pub bfc_allow_growth: bool,
    /// BFC: release wholly free regions and retry when an allocation would otherwise fail.
    /// Default false.
    pub bfc_garbage_collection: bool,
    /// glibc: initial mmap threshold; requests at or above it are served by mmap until the
    /// dynamic threshold moves. Default 128 KiB (glibc's `DEFAULT_MMAP_THRESHOLD_MIN`).
    pub glibc_mmap_threshold_bytes: u64,
    /// PyTorch: the caching allocator's options. Default: PyTorch's defaults.
    pub pytorch: PytorchSettings,
    /// PyTorch: a snapshot's recorded start state and segment events, to replay it
    /// faithfully and score the replay. Default `None` (an empty allocator).
    pub pytorch_script: Option<Arc<PytorchScript>>,
    /// Predictive: a block freed before this many more allocations is short-lived. Default 64.
    pub predictive_short_allocs: u64,
    /// Predictive: class blocks by their true lifetimes (read from the trace's future) instead
    /// of predicting them: the upper bound of prediction. Default false.
    pub predictive_true_lifetimes: bool,
    /// Predictive: what is known at each allocation (threads' recent calls, sites), built by the
    /// frontend from the trace's thread and site columns. Default `None`: one thread, no sites.
    pub alloc_features: Option<Arc<AllocFeatures>>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            align_bytes: 16,
            limit_bytes: None,
            buddy_min_block_bytes: 256,
            buddy_max_order: 18,
            pool_block_bytes: 64 << 20,
            bfc_allow_growth: true,
            bfc_garbage_collection: false,
            glibc_mmap_threshold_bytes: 128 << 10,
            pytorch: PytorchSettings::default(),
            pytorch_script: None,
            predictive_short_allocs: DEFAULT_SHORT_ALLOCS,
            predictive_true_lifetimes: false,
            alloc_features: None,
        }
    }
}

/// Why [`build`] could not make a policy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("unknown policy {name:?}; known policies: {}", known.join(", "))]
    UnknownPolicy {
        name: String,
        known: Vec<&'static str>,
    },
    #[error("policy {name:?}: invalid configuration: {reason}")]
    InvalidConfig { name: String, reason: String },
}

/// Maps a constructor's reason into [`RegistryError::InvalidConfig`] for policy `name`.
fn invalid(name: &str) -> impl Fn(String) -> RegistryError + '_ {
    move |reason| RegistryError::InvalidConfig {
        name: name.to_owned(),
        reason,
    }
}

impl RegistryError {
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
