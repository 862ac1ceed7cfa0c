//! `compare`'s real-allocator rows ([`crate::real`]): each run's row (its footprint is the
//! measured resident memory of the replay process), `glibc` against `real-glibc` (model
//! against measurement), and the advice line for each real allocator that beats the C
//! library's, which a recorded program used.

use std::path::Path;

use allocview_loaders::Loaded;
use allocview_sim::trace::TraceView;
use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use serde_json::{Map, json};

use super::row::Row;
use crate::format;
use crate::real::{RealRun, RealSpec};
use crate::session::input::require_events;
use crate::session::policies::events_and_threads;

/// Runs each real row, one at a time (each measures its own process's memory and rate). When
/// any is asked, `real-glibc` runs too (first, unless it is named): the C library's allocator
/// is the one a recorded program used, and the advice compares with it.
///
/// # Errors
/// A library that is not installed, or a replay that failed: a real row is always asked for
/// by name.
pub fn run_all(
    loaded: &Loaded,
    path: &Path,
    view: &TraceView<'_>,
    specs: &[RealSpec],
) -> Result<Vec<RealRun>> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    if !matches!(loaded, Loaded::MallocTrace(_)) {
        bail!(
            "{} replays malloc traces through a C allocator; {} is not one (GPU memory is \
             replayed by the models: pytorch, bfc)",
            specs.first().map_or("real-glibc", |s| s.label.as_str()),
            path.display()
        );
    }
    let specs = with_program_allocator(specs)?;
    let (threads, calls) = threads_and_calls(loaded, path)?;
    // The calls are written once, for every row.
    let prepared = crate::real::prepare(&specs, view, &threads, calls.as_deref())?;
    specs
        .iter()
        .map(|spec| {
            crate::real::run_prepared(spec, view, &prepared).with_context(|| {
                format!("while replaying {} through {}", path.display(), spec.label)
            })
        })
        .collect()
}

/// The real rows that run for `specs`: `real-glibc` first when it is not among them (and any
/// is asked for), the allocator a recorded program used, which the advice compares with.
///
/// # Errors
/// None in practice (`real-glibc` parses).
pub fn with_program_allocator(specs: &[RealSpec]) -> Result<Vec<RealSpec>> {
    let mut specs = specs.to_vec();
    if !specs.is_empty() && !specs.iter().any(|s| s.label == "real-glibc") {
        specs.insert(0, RealSpec::parse("real-glibc")?);
    }
    Ok(specs)
}

/// Each real row's row and series (on the time axis of every policy's replay), for the
/// frontends that draw them beside the policies (`report`).
///
/// # Errors
/// As [`run_all`].
pub fn real_rows(
    loaded: &Loaded,
    path: &Path,
    view: &TraceView<'_>,
    specs: &[RealSpec],
) -> Result<Vec<(Row, allocview_sim::series::Series)>> {
    let buckets = allocview_sim::replay::ReplayOptions::default().buckets;
    Ok(run_all(loaded, path, view, specs)?
        .iter()
        .map(|r| (row(r, view), r.series(view, buckets)))
        .collect())
}

/// Each event's thread index, and its call where the trace names calls: what a real replay
/// needs besides the view.
///
/// # Errors
/// An input without events, or an unreadable thread column.
pub fn threads_and_calls(loaded: &Loaded, path: &Path) -> Result<(Vec<u16>, Option<Vec<u8>>)> {
    let (_, threads) = events_and_threads(loaded, path, "compare")?;
    let ev = require_events(loaded, path, "compare")?;
    let calls = ev.events.column("call").ok().and_then(|c| {
        c.u8()
            .ok()
            .map(|c| c.iter().map(|v| v.unwrap_or(0)).collect())
    });
    Ok((threads, calls))
}

/// A real run's row: its footprint the measured resident memory above the replay process's
/// baseline, its fragmentation what of it was not live data.
#[must_use]
pub fn row(run: &RealRun, view: &TraceView<'_>) -> Row {
    let (peak_live, _) = view.peak_live();
    let live_at = live_bytes_at(view, run.samples.iter().map(|s| s.0));
    let frag = |live: u64, rss: u64| {
        if rss == 0 {
            0.0
        } else {
            1.0 - (live.min(rss) as f64 / rss as f64)
        }
    };
    let at_peak = run
        .samples
        .iter()
        .zip(&live_at)
        .find(|((done, _), _)| *done == run.peak_rss_event)
        .map_or(0.0, |((_, rss), live)| frag(*live, *rss));
    let mean = if live_at.is_empty() {
        0.0
    } else {
        run.samples
            .iter()
            .zip(&live_at)
            .map(|((_, rss), live)| frag(*live, *rss))
            .sum::<f64>()
            / live_at.len() as f64
    };
    let mut extra = Map::new();
    extra.insert("real".into(), json!(true));
    extra.insert(
        "measured".into(),
        json!(
            "resident memory of a process that replayed the trace's calls through the library \
             (above what it held before the first call): a measurement, not a model"
        ),
    );
    extra.insert("peak_rss_bytes".into(), json!(run.peak_rss_bytes));
    extra.insert(
        "rss_at_peak_live_bytes".into(),
        json!(run.rss_at_peak_live_bytes),
    );
    extra.insert("final_rss_bytes".into(), json!(run.final_rss_bytes));
    extra.insert("baseline_rss_bytes".into(), json!(run.baseline_rss_bytes));
    extra.insert(
        "library".into(),
        json!(run.library.as_ref().map(|l| l.display().to_string())),
    );
    extra.insert("env".into(), json!(run.env_line));
    extra.insert("touch".into(), json!(run.spec.touch.name()));
    extra.insert(
        "threads".into(),
        json!(if run.spec.one_thread { "one" } else { "each" }),
    );
    extra.insert("samples".into(), json!(run.samples.len()));
    extra.insert("failed_allocations".into(), json!(run.failed_allocations));
    extra.insert("replay_seconds".into(), json!(run.replay_seconds));
    extra.insert("limit_applied".into(), json!(false));
    let lib = run
        .library
        .as_ref()
        .map_or_else(|| "the C library".to_owned(), |l| l.display().to_string());
    let mut notes = vec![format!(
        "measured, not modelled: resident memory of a replay through {lib} (pages written: \
         {}; threads: {}); peak RSS {}, {} at the peak of live bytes, {} at the end{}",
        run.spec.touch.name(),
        if run.spec.one_thread { "one" } else { "each" },
        format::bytes(run.peak_rss_bytes),
        format::bytes(run.rss_at_peak_live_bytes),
        format::bytes(run.final_rss_bytes),
        if run.env_line.is_empty() {
            String::new()
        } else {
            format!("; as set by {}", run.env_line)
        }
    )];
    if run.failed_allocations > 0 {
        notes.push(format!(
            "{} allocations failed (the library returned NULL)",
            format::count(run.failed_allocations)
        ));
    }
    Row {
        name: run.spec.label.clone(),
        peak_footprint_bytes: run.peak_rss_bytes,
        peak_footprint_event: Some(run.peak_rss_event.saturating_sub(1)),
        final_footprint_bytes: run.final_rss_bytes,
        peak_live_bytes: peak_live,
        peak_allocated_bytes: peak_live,
        fragmentation_at_peak: at_peak,
        mean_fragmentation: mean,
        ooms: 0,
        events_per_second: run.events_per_second,
        first_oom: None,
        first_oom_text: None,
        extra,
        notes,
    }
}

/// The live bytes after each of `done` events (ascending).
fn live_bytes_at(view: &TraceView<'_>, done: impl Iterator<Item = usize>) -> Vec<u64> {
    use allocview_sim::trace::EventKind;
    let mut size_of = vec![0u64; view.num_allocs as usize];
    let (mut live, mut i) = (0u64, 0usize);
    let mut out = Vec::new();
    for d in done {
        while i < d.min(view.len()) {
            let id = view.alloc_id.get(i).map_or(usize::MAX, |&a| a as usize);
            match view.kind_at(i) {
                Some(EventKind::Alloc) => {
                    let size = view.size_bytes.get(i).copied().unwrap_or(0);
                    if let Some(s) = size_of.get_mut(id) {
                        *s = size;
                    }
                    live += size;
                }
                Some(EventKind::Free) => {
                    live = live.saturating_sub(size_of.get(id).copied().unwrap_or(0));
                }
                _ => {}
            }
            i += 1;
        }
        out.push(live);
    }
    out
}

/// The `glibc` model against `real-glibc` when both are rows: how far the model's peak
/// footprint is from the measured peak RSS, in both rows' notes and JSON
/// (`model_vs_real`).
pub fn compare_glibc(rows: &mut [Row]) {
    let real = rows
        .iter()
        .find(|r| r.name == "real-glibc")
        .map(|r| r.peak_footprint_bytes);
    let model = rows
        .iter()
        .find(|r| r.name == "glibc")
        .map(|r| r.peak_footprint_bytes);
    let (Some(real), Some(model)) = (real, model) else {
        return;
    };
    let diff = if real == 0 {
        0.0
    } else {
        (model as f64 - real as f64) / real as f64
    };
    let text = format!(
        "glibc model against real-glibc: peak footprint {} vs peak RSS {} ({:+.1}%)",
        format::bytes(model),
        format::bytes(real),
        100.0 * diff
    );
    for r in rows
        .iter_mut()
        .filter(|r| r.name == "glibc" || r.name == "real-glibc")
    {
        r.extra.insert(
            "model_vs_real".into(),
            json!({
                "model_peak_footprint_bytes": model,
                "real_peak_rss_bytes": real,
                "difference_fraction": diff,
            }),
        );
        r.notes.push(text.clone());
    }
}

/// A real allocator that beats the C library's on this trace.
#[derive(Clone, Debug, Serialize)]
pub struct Advice {
    pub policy: String,
    pub baseline: String,
    pub peak_rss_bytes: u64,
    pub baseline_peak_rss_bytes: u64,
    /// How much lower the peak is, as a fraction of the baseline's.
    pub peak_lower_fraction: f64,
    pub final_rss_bytes: u64,
    pub baseline_final_rss_bytes: u64,
    pub final_lower_fraction: f64,
    /// The line to set.
    pub env: String,
    pub text: String,
}

/// How much lower a peak must be to be advice.
const MIN_ADVICE: f64 = 0.01;

/// One advice per real row whose peak RSS is at least [`MIN_ADVICE`] below `real-glibc`'s.
#[must_use]
pub fn advice(rows: &[Row]) -> Vec<Advice> {
    let Some(base) = rows.iter().find(|r| r.name == "real-glibc") else {
        return Vec::new();
    };
    let lower = |a: u64, b: u64| {
        if b == 0 {
            0.0
        } else {
            (b as f64 - a as f64) / b as f64
        }
    };
    let env_of = |r: &Row| {
        r.extra
            .get("env")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    rows.iter()
        // A row with nothing to set (`real-glibc:threads=one`) is no advice; a peak less than
        // 1% lower is within what two runs of one allocator differ by.
        .filter(|r| r.extra.contains_key("real") && !env_of(r).is_empty())
        .filter(|r| lower(r.peak_footprint_bytes, base.peak_footprint_bytes) >= MIN_ADVICE)
        .map(|r| {
            let env = env_of(r);
            let peak = lower(r.peak_footprint_bytes, base.peak_footprint_bytes);
            let fin = lower(r.final_footprint_bytes, base.final_footprint_bytes);
            let link = r
                .name
                .strip_prefix("real-")
                .and_then(|n| n.split(':').next())
                .unwrap_or_default();
            let how = if link == "glibc" {
                format!("set {env}")
            } else {
                format!("set {env} or link {link}")
            };
            let text = format!(
                "{}: peak RSS {:.0}% lower ({} vs {}), final {} ({} vs {}); {how}",
                r.name,
                100.0 * peak,
                format::bytes(r.peak_footprint_bytes),
                format::bytes(base.peak_footprint_bytes),
                if fin >= 0.0 {
                    format!("{:.0}% lower", 100.0 * fin)
                } else {
                    format!("{:.0}% higher", -100.0 * fin)
                },
                format::bytes(r.final_footprint_bytes),
                format::bytes(base.final_footprint_bytes),
            );
            Advice {
                policy: r.name.clone(),
                baseline: base.name.clone(),
                peak_rss_bytes: r.peak_footprint_bytes,
                baseline_peak_rss_bytes: base.peak_footprint_bytes,
                peak_lower_fraction: peak,
                final_rss_bytes: r.final_footprint_bytes,
                baseline_final_rss_bytes: base.final_footprint_bytes,
                final_lower_fraction: fin,
                env,
                text,
            }
        })
        .collect()
}

/// The `pytorch` rows against the bytes PyTorch's caching allocator held reserved as a
/// profiler trace recorded them: a note in each and `error_against_recorded` in their JSON.
/// (The recorded figure also holds what was allocated before the profiler started, which the
/// replay does not see.)
pub fn against_reserved(
    rows: &mut [Row],
    recorded: &crate::answers::recorded_memory::RecordedMemory,
) {
    let reserved = recorded.peak_rss_bytes;
    if reserved == 0 {
        return;
    }
    for r in rows.iter_mut().filter(|r| r.name.starts_with("pytorch")) {
        let error = (r.peak_footprint_bytes as f64 - reserved as f64) / reserved as f64;
        r.extra.insert(
            "error_against_recorded".into(),
            json!({
                "peak_footprint_bytes": r.peak_footprint_bytes,
                "recorded_peak_reserved_bytes": reserved,
                "error_fraction": error,
            }),
        );
        r.notes.push(format!(
            "against the recording: peak {} vs the {} PyTorch's allocator reserved at most \
             (recorded; it also holds what was allocated before the profiler started): {:+.1}%",
            format::bytes(r.peak_footprint_bytes),
            format::bytes(reserved),
            100.0 * error
        ));
    }
}

/// The rows `glibc` and `real-glibc` against the memory the recorded program really held (its
/// anonymous resident memory's growth from the first sample to its peak, which also holds its
/// threads' stacks and what it mapped outside the allocator): a note in each and
/// `error_against_recorded` in their JSON.
pub fn against_recorded(
    rows: &mut [Row],
    recorded: &crate::answers::recorded_memory::RecordedMemory,
) {
    let program = recorded.anon_growth_bytes();
    // A whole resident set (code and file pages in it) is no measure of a heap's footprint.
    if program == 0 || recorded.is_resident_only() || recorded.is_reserved() {
        return;
    }
    for r in rows
        .iter_mut()
        .filter(|r| r.name == "glibc" || r.name == "real-glibc")
    {
        let error = (r.peak_footprint_bytes as f64 - program as f64) / program as f64;
        r.extra.insert(
            "error_against_recorded".into(),
            json!({
                "peak_footprint_bytes": r.peak_footprint_bytes,
                "recorded_anon_growth_bytes": program,
                "error_fraction": error,
            }),
        );
        r.notes.push(format!(
            "against the recording: peak {} vs the {} of anonymous memory the program grew by \
             (measured; it also holds its stacks and up to {} it mapped outside the \
             allocator): {:+.1}%",
            format::bytes(r.peak_footprint_bytes),
            format::bytes(program),
            format::bytes(recorded.mapped_outside_allocator_peak_bytes),
            100.0 * error
        ));
    }
}
