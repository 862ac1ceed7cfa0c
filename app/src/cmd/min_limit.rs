//! `allocview compare FILE --min-limit`: the smallest `--limit` at which each policy replays
//! the trace without an OOM, beside the peak live bytes (the method is
//! [`allocview_sim::min_limit`]'s).

use allocview_loaders::analysis::tf_fidelity::{self as fidelity, FidelityOptions};
use allocview_loaders::tf::memlog::TfMemoryLog;
use allocview_sim::min_limit::{Method, MinLimit, min_limit, search};
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::trace::TraceView;
use anyhow::Result;
use serde_json::{Map, Value, json};

use crate::format;

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
    super::compare::per_spec(specs, jobs, |spec| {
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
    peak_live_bytes: u64,
    unlimited_peak_bytes: u64,
) -> MinLimit {
    let works = |limit: u64| -> Result<bool, std::convert::Infallible> {
        let opts = FidelityOptions {
            limit_bytes: Some(limit),
            allow_growth: None,
            stop_at_first_oom: true,
            no_guidance: false,
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

/// The table's section: each policy's minimum against the peak live bytes.
pub fn print_table(rows: &[(String, MinLimit)], max_live_bytes: u64) -> Result<()> {
    use format::{bytes, count};
    outln!();
    outln!(
        "  smallest limit without OOM (peak live {}):",
        bytes(max_live_bytes)
    );
    let w = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0).max(10);
    outln!(
        "  {:<w$} {:>15} {:>11} {:>9} {:>14} {:>8}",
        "policy",
        "min limit (B)",
        "min limit",
        "/ live",
        "method",
        "replays"
    );
    for (name, m) in rows {
        let (exact, human, ratio) = match m.min_limit_bytes {
            Some(b) => (
                b.to_string(),
                bytes(b),
                if max_live_bytes == 0 {
                    "-".to_owned()
                } else {
                    format!("{:.3}", b as f64 / max_live_bytes as f64)
                },
            ),
            None => ("none".to_owned(), "-".to_owned(), "-".to_owned()),
        };
        outln!(
            "  {:<w$} {:>15} {:>11} {:>9} {:>14} {:>8}",
            name,
            exact,
            human,
            ratio,
            m.method.name(),
            count(u64::from(m.replays))
        );
    }
    for (name, m) in rows {
        if let Some(l) = m.larger_limit_failing {
            outln!(
                "  {name}: not monotone: a larger limit, {} ({}), fails again",
                bytes(l),
                l
            );
        }
        if m.min_limit_bytes.is_none() {
            outln!("  {name}: fails even without a limit (requests it cannot serve)");
        }
    }
    Ok(())
}
