//! The policies a frontend replays: `--policy` (names and variants), `--limit`, `--align`,
//! `--jobs` ([`PolicyArgs`]); their configuration for a given input (a PyTorch snapshot's own
//! allocator settings); and what the `predictive` policy knows of each allocation.

use std::path::Path;
use std::sync::Arc;

use allocview_loaders::Loaded;
use allocview_loaders::analysis::site_stats::{EventSites, SiteKind};
use allocview_loaders::analysis::stats::thread_indices;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry::POLICY_NAMES;
use allocview_sim::policy::spec::{PolicySpec, split_specs};
use allocview_sim::predict::lifetime::AllocFeatures;
use allocview_sim::trace::TraceView;
use anyhow::{Context as _, Result, bail};

use super::input::{require_events, sites_of};
use super::options::PolicyArgs;
use crate::real::{RealSpec, is_real};

impl PolicyArgs {
    /// The policies and variants to run, validated, in the order given (duplicates dropped).
    /// A real-allocator row (`real-jemalloc`) is refused: the commands that run them call
    /// [`Self::specs_and_real`].
    pub fn specs(&self) -> Result<Vec<PolicySpec>> {
        let (specs, real) = self.specs_and_real()?;
        if let Some(r) = real.first() {
            bail!(
                "{} is a real-allocator row, which `compare`, `report` and `diff` run; this \
                 command replays the simulated policies only",
                r.label
            );
        }
        Ok(specs)
    }

    /// The simulated policies, and the real-allocator rows (`real-glibc`, `real-jemalloc`,
    /// ...: [`crate::real`]), each validated, in the order given (duplicates dropped).
    pub fn specs_and_real(&self) -> Result<(Vec<PolicySpec>, Vec<RealSpec>)> {
        let written: Vec<&str> = self.policy.iter().flat_map(|p| split_specs(p)).collect();
        let mut real: Vec<RealSpec> = Vec::new();
        for w in written.iter().filter(|w| is_real(w)) {
            let spec = RealSpec::parse(w)?;
            if !real.contains(&spec) {
                real.push(spec);
            }
        }
        let sim: Vec<&str> = written.into_iter().filter(|w| !is_real(w)).collect();
        // Real rows alone: no simulated policy unless one is named.
        if sim.is_empty() && !real.is_empty() {
            return Ok((Vec::new(), real));
        }
        Ok((Self::sim_specs(&sim)?, real))
    }

    fn sim_specs(written: &[&str]) -> Result<Vec<PolicySpec>> {
        if written.is_empty() || written.contains(&"all") {
            let mut out: Vec<PolicySpec> =
                POLICY_NAMES.iter().map(|&n| PolicySpec::plain(n)).collect();
            // `all` plus variants: the variants follow the plain policies.
            for w in written.iter().filter(|&&w| w != "all") {
                let spec = PolicySpec::parse(w)?;
                if !out.contains(&spec) {
                    out.push(spec);
                }
            }
            return Ok(out);
        }
        let mut out = Vec::new();
        for w in written {
            let spec = PolicySpec::parse(w)?;
            if !out.contains(&spec) {
                out.push(spec);
            }
        }
        Ok(out)
    }

    /// The policies for an explorer on `file`: as [`Self::specs`], but with no `--policy` a
    /// PyTorch snapshot or profiler trace opens on `pytorch` (its recorded heap), the others
    /// after it.
    pub fn explorer_specs(&self, file: Option<&std::path::Path>) -> Result<Vec<PolicySpec>> {
        let mut specs = self.specs()?;
        let is_snapshot = file.is_some_and(|f| {
            matches!(
                allocview_loaders::detect(f),
                Ok(allocview_loaders::InputKind::PytorchSnapshot
                    | allocview_loaders::InputKind::KinetoTrace)
            )
        });
        if self.policy.is_empty() && is_snapshot {
            specs.sort_by_key(|s| s.name != "pytorch");
        }
        Ok(specs)
    }

    /// [`Self::explorer_specs`] and the real-allocator rows, which the explorers draw on the
    /// timeline beside the policies (with real rows alone, every policy is replayed too).
    pub fn explorer_specs_and_real(
        &self,
        file: Option<&std::path::Path>,
    ) -> Result<(Vec<PolicySpec>, Vec<RealSpec>)> {
        let (_, real) = self.specs_and_real()?;
        let sim_only = Self {
            policy: self
                .policy
                .iter()
                .flat_map(|p| split_specs(p))
                .filter(|w| !is_real(w))
                .map(str::to_owned)
                .collect(),
            ..self.clone()
        };
        Ok((sim_only.explorer_specs(file)?, real))
    }

    /// The policy configuration these flags describe.
    pub fn config(&self) -> Result<PolicyConfig> {
        if !self.align.is_power_of_two() {
            bail!("--align must be a power of two, got {}", self.align);
        }
        Ok(PolicyConfig {
            align_bytes: self.align,
            limit_bytes: self.limit,
            ..PolicyConfig::default()
        })
    }
}

/// The configuration for replaying `loaded`: a PyTorch snapshot's own allocator settings and
/// rebuilt start state go to the `pytorch` policy.
#[must_use]
pub fn config_for_input(loaded: &Loaded, mut config: PolicyConfig) -> PolicyConfig {
    if let Loaded::PytorchSnapshot(snap) = loaded {
        config.pytorch = snap.settings.policy.clone();
        config.pytorch_script = Some(Arc::new(snap.script.clone()));
    }
    config
}

/// The file's thread id of each thread index of `loaded`'s events.
#[must_use]
pub fn tids_of(loaded: &Loaded) -> Vec<u64> {
    super::input::events_of(loaded)
        .and_then(|ev| ev.threads.column("tid").ok()?.u64().ok().cloned())
        .map(|c| c.into_no_null_iter().collect())
        .unwrap_or_default()
}

/// The replay view and per-event thread indices of `loaded`'s events (`command` names the
/// command in the error for an input without events).
pub fn events_and_threads<'a>(
    loaded: &'a Loaded,
    path: &Path,
    command: &str,
) -> Result<(TraceView<'a>, Vec<u16>)> {
    let ev = require_events(loaded, path, command)?;
    let view = allocview_loaders::trace_view(ev.events, path)?;
    let threads = thread_indices(ev.events)
        .with_context(|| format!("reading the thread column of {}", path.display()))?;
    Ok((view, threads))
}

/// What the `predictive` policy knows at each allocation of `loaded`: each thread's recent
/// calls and, where the input has them, allocation sites (stacks or TensorFlow operations).
#[must_use]
pub fn features_for(loaded: &Loaded, view: &TraceView<'_>, threads: &[u16]) -> AllocFeatures {
    // A malloc trace without stacks has no sites: skip building its size-class stand-ins.
    let sites = match loaded {
        Loaded::MallocTrace(t) if t.stacks.is_none() => None,
        _ => sites_of(loaded),
    };
    features_with(view, threads, sites.as_ref())
}

/// [`features_for`] from the events' threads and sites (the size classes that stand in for
/// the sites of a trace without any are not sites): the one rule of `compare`, `report` and
/// the explorers.
#[must_use]
pub fn features_with(
    view: &TraceView<'_>,
    threads: &[u16],
    sites: Option<&EventSites>,
) -> AllocFeatures {
    let sites = sites.filter(|s| s.kind != SiteKind::SizeClasses);
    AllocFeatures::from_trace(view, Some(threads), sites.map(|s| &s.event_stack[..]))
}

/// `config` with `predictive`'s features for `loaded` when `specs` has it (other policies do
/// not read them).
///
/// # Errors
/// When the event table's thread column cannot be read.
pub fn with_predictive_features(
    mut config: PolicyConfig,
    specs: &[PolicySpec],
    loaded: &Loaded,
    view: &TraceView<'_>,
    path: &Path,
) -> Result<PolicyConfig> {
    if specs.iter().any(|s| s.name == "predictive") {
        config.alloc_features = Some(alloc_features(loaded, view, path)?);
    }
    Ok(config)
}

/// The `predictive` policy's features for `loaded` (for `compare`).
///
/// # Errors
/// When the event table's thread column cannot be read.
pub fn alloc_features(
    loaded: &Loaded,
    view: &TraceView<'_>,
    path: &Path,
) -> Result<Arc<AllocFeatures>> {
    let (_, threads) = events_and_threads(loaded, path, "compare")?;
    Ok(Arc::new(features_for(loaded, view, &threads)))
}
