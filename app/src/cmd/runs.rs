//! Replaying one trace through several policies on threads, shared by `compare`, `report`,
//! `diff` and `min_limit`.

use std::sync::atomic::{AtomicU64, Ordering};

use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::replay::{Replay, ReplayOptions, replay};
use allocview_sim::trace::TraceView;

/// One policy's replay, or why it could not run.
pub struct PolicyRun {
    /// The row's label: the policy name, with its parameters for a variant.
    pub name: String,
    pub result: Result<Replay, String>,
}

/// Replays `trace` through each policy variant, `jobs` at a time, in the given order.
pub fn run_policies(
    trace: &TraceView<'_>,
    specs: &[PolicySpec],
    config: &PolicyConfig,
    jobs: usize,
) -> Vec<PolicyRun> {
    run_policies_counted(trace, specs, config, jobs, &AtomicU64::new(0))
}

/// [`run_policies`], adding one to `done` as each replay ends (for a progress display).
pub fn run_policies_counted(
    trace: &TraceView<'_>,
    specs: &[PolicySpec],
    config: &PolicyConfig,
    jobs: usize,
    done: &AtomicU64,
) -> Vec<PolicyRun> {
    per_spec(specs, jobs, |spec| {
        let result = spec
            .apply(config)
            .and_then(|cfg| {
                let opts = ReplayOptions {
                    align_bytes: cfg.align_bytes,
                    // These commands seek at most once (`report`'s heap at the peak), so the
                    // initial state is the only checkpoint: copying the heap every 16,384
                    // events made best fit's replay of the python trace 1.8 times slower,
                    // while the one seek replays from the start (at most one more replay).
                    checkpoint_every: 0,
                    ..ReplayOptions::default()
                };
                registry::build(spec.name, &cfg, trace).map(|policy| replay(trace, policy, &opts))
            })
            .map_err(|e| e.to_string());
        done.fetch_add(1, Ordering::Relaxed);
        result
    })
    .into_iter()
    .map(|(name, result)| PolicyRun { name, result })
    .collect()
}

/// Runs `work` on each spec, `jobs` at a time, and returns each spec's label and result in the
/// given order (a run that panics gives an error).
pub fn per_spec<T: Send>(
    specs: &[PolicySpec],
    jobs: usize,
    work: impl Fn(&PolicySpec) -> Result<T, String> + Sync,
) -> Vec<(String, Result<T, String>)> {
    let mut out = Vec::with_capacity(specs.len());
    let work = &work;
    for chunk in specs.chunks(jobs.max(1)) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|spec| s.spawn(move || work(spec)))
                .collect();
            for (h, spec) in handles.into_iter().zip(chunk) {
                let result = h
                    .join()
                    .unwrap_or_else(|_| Err("the replay thread panicked".to_owned()));
                out.push((spec.label(), result));
            }
        });
    }
    out
}

/// Max over time of live bytes: the bound every policy's footprint is measured against.
pub fn max_live_bytes(trace: &TraceView<'_>) -> u64 {
    trace.peak_live().0
}
