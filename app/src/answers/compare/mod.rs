//! `compare`'s answer: one trace replayed through several policies, a row each (peak
//! footprint, fragmentation, OOMs, and what only some inputs have: a PyTorch replay's fidelity,
//! a TensorFlow log's `bfc` at TensorFlow's addresses), with, when asked, each row's smallest
//! limit without an OOM and every policy's series.

mod min_limit;
mod real;
mod row;
mod tf_bfc;

use std::path::Path;
use std::sync::atomic::AtomicU64;

use allocview_loaders::Loaded;
use allocview_loaders::tf::memlog::TfMemoryLog;
use allocview_sim::min_limit::MinLimit;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::replay::ReplayOptions;
use allocview_sim::series::Series;
use allocview_sim::trace::TraceView;
use anyhow::{Result, bail};
use polars::prelude::DataFrame;
use serde_json::{Value, json};

pub use min_limit::{MinLimitRun, for_specs};
pub use real::{Advice, against_recorded, real_rows, threads_and_calls, with_program_allocator};
pub use row::{Row, note_unsupported, pytorch_fidelity};
use tf_bfc::tf_bfc_row;

use crate::answers::recorded_memory::RecordedMemory;
use crate::session::PolicyArgs;
use crate::session::input::require_events;
use crate::session::policies::{config_for_input, with_predictive_features};
use crate::session::runs::{max_live_bytes, run_policies_counted};

/// What `compare` is asked, besides the trace.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    /// The policies, the limit, the alignment and the threads.
    pub policies: PolicyArgs,
    /// For a TensorFlow memory log: replay `bfc` from process start instead of from the
    /// checkpoint rebuilt from the log.
    pub from_start: bool,
    /// For a TensorFlow memory log: replay `bfc` without consulting TensorFlow's logged
    /// addresses for the choices the log leaves open.
    pub no_guidance: bool,
    /// Find each policy's smallest limit without an OOM.
    pub min_limit: bool,
    /// The input was loaded as a window (`--from`, `--to`, `--events`): a TensorFlow log's
    /// `bfc` then has no rebuilt checkpoint at the window's start, and is simulated.
    pub windowed: bool,
}

/// What `compare` found for one input: the rows of its table and JSON, and the series.
pub struct Compared {
    pub format: &'static str,
    pub events: usize,
    pub max_live_bytes: u64,
    pub limit_bytes: Option<u64>,
    pub rows: Vec<Row>,
    /// Each row's smallest limit without an OOM (`--min-limit`), in row order.
    pub minima: Vec<(String, MinLimit)>,
    /// Every replayed policy's series (`report`'s `timeline.csv`), when asked for.
    pub series: Option<DataFrame>,
    /// One line per real allocator whose peak RSS beats the C library's.
    pub advice: Vec<real::Advice>,
    /// The recorded program's own memory (a trace made by `record`).
    pub recorded_memory: Option<RecordedMemory>,
}

impl Compared {
    /// The object `compare --json` prints (`path` names the trace).
    #[must_use]
    pub fn json(&self, path: &Path) -> Value {
        json!({
            "trace": path.display().to_string(),
            "format": self.format,
            "events": self.events,
            "max_live_bytes": self.max_live_bytes,
            "limit_bytes": self.limit_bytes,
            "policies": self.rows.iter().map(|r| r.json(self.max_live_bytes)).collect::<Vec<_>>(),
            "advice": self.advice,
            "recorded_memory": self.recorded_memory,
        })
    }
}

/// Replays `loaded` (read from `path`) through the policies `args` name, with each
/// policy's series when `with_series`, adding one to `replayed` as each replay ends.
///
/// # Errors
/// When a policy named explicitly cannot run, or the input has no events.
pub fn evaluate(
    path: &Path,
    args: &CompareOptions,
    loaded: &Loaded,
    with_series: bool,
    replayed: &AtomicU64,
) -> Result<Compared> {
    let (specs, real_specs) = args.policies.specs_and_real()?;
    let config = config_for_input(loaded, args.policies.config()?);
    let ev = require_events(loaded, path, "compare")?;
    let view = allocview_loaders::trace_view(ev.events, path)?;
    let config = with_predictive_features(config, &specs, loaded, &view, path)?;
    let jobs = args.policies.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let explicit = !args.policies.policy.is_empty();
    // A TensorFlow memory log: plain `bfc` is replayed against TensorFlow's own addresses,
    // from a checkpoint rebuilt from the log (or from process start with --from-start).
    // A window of the log has no rebuilt checkpoint at its start: `bfc` is then simulated like
    // every other policy, over the window.
    let memlog = match loaded {
        Loaded::TfMemoryLog(log) if !args.windowed => Some(log.as_ref()),
        _ => None,
    };
    let is_tf_bfc = |s: &PolicySpec| memlog.is_some() && s.name == "bfc" && s.is_plain();
    let sim_specs: Vec<PolicySpec> = specs.iter().filter(|s| !is_tf_bfc(s)).cloned().collect();
    let runs = run_policies_counted(&view, &sim_specs, &config, jobs, replayed);
    let max_live = max_live_bytes(&view);
    let mut rows: Vec<Row> = Vec::new();
    for spec in &specs {
        if is_tf_bfc(spec)
            && let Some(log) = memlog
        {
            rows.push(tf_bfc_row(log, &config, args.from_start, args.no_guidance)?);
            continue;
        }
        let label = spec.label();
        let Some(run) = runs.iter().find(|r| r.name == label) else {
            continue;
        };
        match &run.result {
            Ok(rep) => {
                let mut row = Row::from_replay(&label, rep);
                note_unsupported(&mut row, rep);
                pytorch_fidelity(&mut row, rep, config.limit_bytes);
                rows.push(row);
            }
            Err(e) if explicit => bail!("policy {label}: {e}"),
            Err(e) => eprintln!("note: skipping {label}: {e}"),
        }
    }
    let real_runs = real::run_all(loaded, path, &view, &real_specs)?;
    for run in &real_runs {
        rows.push(real::row(run, &view));
    }
    real::compare_glibc(&mut rows);
    let recorded_memory = recorded(loaded, &view, args.windowed, &mut rows);
    let series = if with_series {
        Some(all_series(&runs, &real_runs, &view)?)
    } else {
        None
    };
    let minima = if args.min_limit {
        min_limits(args, &view, &sim_specs, &config, jobs, memlog, &mut rows)
    } else {
        Vec::new()
    };
    Ok(Compared {
        format: ev.format,
        events: view.len(),
        max_live_bytes: max_live,
        limit_bytes: config.limit_bytes,
        advice: real::advice(&rows),
        recorded_memory,
        rows,
        minima,
        series,
    })
}

/// The recorded program's own memory (none for a window: the samples cover the whole
/// recording), and the `glibc` rows set against it.
fn recorded(
    loaded: &Loaded,
    view: &TraceView<'_>,
    windowed: bool,
    rows: &mut [Row],
) -> Option<RecordedMemory> {
    if windowed {
        return None;
    }
    let (_, peak_live_event) = view.peak_live();
    let m = RecordedMemory::of_loaded(
        loaded,
        view.t_ns.first().copied().unwrap_or(0),
        view.t_ns.get(peak_live_event).copied(),
    )?;
    if m.is_reserved() {
        real::against_reserved(rows, &m);
    } else {
        real::against_recorded(rows, &m);
    }
    Some(m)
}

/// Every replayed policy's series and every real row's, as one table.
fn all_series(
    runs: &[crate::session::runs::PolicyRun],
    real_runs: &[crate::real::RealRun],
    view: &TraceView<'_>,
) -> Result<DataFrame> {
    let real_series: Vec<(String, Series)> = real_runs
        .iter()
        .map(|r| {
            (
                r.spec.label.clone(),
                r.series(view, ReplayOptions::default().buckets),
            )
        })
        .collect();
    let done: Vec<(&str, &Series)> = runs
        .iter()
        .filter_map(|r| {
            r.result
                .as_ref()
                .ok()
                .map(|rep| (r.name.as_str(), &rep.series))
        })
        .chain(real_series.iter().map(|(n, s)| (n.as_str(), s)))
        .collect();
    crate::answers::series::timeline_frame(&done)
}

/// `--min-limit`: each row's smallest limit without OOM, added to its JSON; the rows for the
/// table, in row order.
fn min_limits(
    args: &CompareOptions,
    view: &TraceView<'_>,
    sim_specs: &[PolicySpec],
    config: &PolicyConfig,
    jobs: usize,
    memlog: Option<&TfMemoryLog>,
    rows: &mut [Row],
) -> Vec<(String, MinLimit)> {
    let runs = min_limit::for_specs(view, sim_specs, config, jobs);
    let mut out = Vec::new();
    for row in rows.iter_mut() {
        if row.extra.contains_key("real") {
            row.notes
                .push("no minimum limit: a real allocator's replay runs under no limit".to_owned());
            continue;
        }
        let found = match runs.iter().find(|r| r.label == row.name) {
            Some(run) => match &run.result {
                Ok(m) => m.clone(),
                Err(e) => {
                    row.notes.push(format!("no minimum limit: {e}"));
                    continue;
                }
            },
            // The one row not in `sim_specs`: bfc at TensorFlow's addresses.
            None => match memlog {
                Some(log) => min_limit::tf_bfc(
                    log,
                    args.from_start,
                    args.no_guidance,
                    max_live_bytes(view),
                    row.peak_footprint_bytes,
                ),
                None => continue,
            },
        };
        min_limit::insert_json(&mut row.extra, &found);
        out.push((row.name.clone(), found));
    }
    out
}
