//! `compare --min-limit`: the smallest limit at which each policy replays the trace without
//! an OOM (the method is [`allocview_sim::min_limit`]'s), and for a TensorFlow log's `bfc`, the
//! same search over the replay at TensorFlow's addresses.

use allocview_loaders::analysis::tf_fidelity::{self as fidelity, FidelityOptions};
use allocview_loaders::tf::memlog::TfMemoryLog;
use allocview_sim::min_limit::{Method, MinLimit, min_limit, search};
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::trace::TraceView;
use serde_json::{Map, Value, json};

use crate::session::runs::per_spec;

/// One policy's minimum, or why it could not be found.
pub struct MinLimitRun {
    pub label: String,
    pub result: Result<MinLimit, String>,
}

/// Finds the minimum of every spec, `jobs` policies at a time, in the given order.
#[must_use]
pub fn for_specs(
    trace: &TraceView<'_>,
    specs: &[PolicySpec],
    config: &PolicyConfig,
    jobs: usize,
) -> Vec<MinLimitRun> {
    per_spec(specs, jobs, |spec| {
        spec.apply(config)
            .and_then(|cfg| min_limit(trace, spec.name, &cfg))
            .map_err(|e| e.to_string())
    })
    .into_iter()
    .map(|(label, result)| MinLimitRun { label, result })
    .collect()
}

/// `bfc` on a TensorFlow memory log, replayed at TensorFlow's addresses: BFC's growth depends
/// on the limit, so this is always a search. A limit at which the replay cannot even start
/// (the checkpoint's regions exceed it) does not work, and none below the log's peak live
/// bytes can.
pub fn tf_bfc(
    log: &TfMemoryLog,
    from_start: bool,
    no_guidance: bool,
    peak_live_bytes: u64,
    unlimited_peak_bytes: u64,
) -> MinLimit {
    let works = |limit: u64| -> Result<bool, std::convert::Infallible> {
        let opts = FidelityOptions {
            limit_bytes: Some(limit),
            allow_growth: None,
            stop_at_first_oom: true,
            // The same replay the row shows: guided unless --no-guidance.
            no_guidance,
        };
        let f = if from_start {
            fidelity::replay_from_start(log, &opts)
        } else {
            fidelity::replay_checkpointed(log, &opts)
        };
        Ok(f.is_ok_and(|f| f.ooms == 0))
    };
    let Ok(found) = search(peak_live_bytes.checked_sub(1), unlimited_peak_bytes, works);
    MinLimit {
        min_limit_bytes: found.min_limit_bytes,
        method: Method::Search,
        replays: found.replays,
        larger_limit_failing: found.larger_limit_failing,
    }
}

/// The keys `compare --json` adds to a policy: `min_limit_bytes` and how it was found.
pub fn insert_json(extra: &mut Map<String, Value>, m: &MinLimit) {
    extra.insert("min_limit_bytes".into(), json!(m.min_limit_bytes));
    extra.insert("min_limit_method".into(), json!(m.method.name()));
    extra.insert("min_limit_replays".into(), json!(m.replays));
    extra.insert(
        "min_limit_larger_failing_bytes".into(),
        json!(m.larger_limit_failing),
    );
}
