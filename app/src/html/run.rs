//! A run's part of the page from its replays: the summary rows, the timeline, the heap maps,
//! the sites and the size classes.

use std::path::Path;

use allocview_loaders::Loaded;
use allocview_sim::classes::ClassSeries;
use allocview_sim::heap::Counters;
use allocview_sim::policy::Policy;
use allocview_sim::replay::Replay;
use allocview_sim::series::Series;
use allocview_sim::trace::TraceView;
use anyhow::{Result, anyhow};

use super::heap::HeapMoment;
use super::{ClassRow, Classes, Line, PolicyRow, Recorded, Run, Timeline, file_label, sites};
use crate::answers::compare::Row;
use crate::answers::recorded_memory::samples_of;

/// OOM markers drawn per line: the first ones say where it starts to fail, and thousands of
/// markers would say no more.
const OOM_MARKERS_PER_LINE: usize = 50;
/// Policies whose heap at the peak is drawn (a run of many variants would repeat them).
const PEAK_HEAPS: usize = 8;

/// `x` to six significant digits: what a chart can show, in fewer characters of JSON.
fn round6(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(5 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// What a run's part of the page is built from (what `report` has gathered).
pub struct RunInput<'a> {
    pub path: &'a Path,
    pub loaded: &'a Loaded,
    pub view: &'a TraceView<'a>,
    /// The replayed policies, the first being the one whose heap is drawn at more moments.
    pub replays: &'a [(&'a str, &'a Replay)],
    /// Real allocators' rows and their measured series.
    pub real: &'a [(&'a Row, &'a Series)],
    pub classes: &'a ClassSeries,
    /// Each replay's heap just after `peak_event`, in `replays`' order.
    pub peak_heaps: &'a [(Box<dyn Policy>, Counters)],
    pub peak_event: usize,
}

/// A run's part of the page.
///
/// # Errors
/// When a replay cannot be sought to a moment or the sites cannot be read.
pub fn build_run(input: &RunInput<'_>) -> Result<Run> {
    let view = input.view;
    let mut run = summary(input.path, input.loaded, view);
    run.rows = rows(input.replays, input.real);
    run.timeline = Some(timeline(input.loaded, view, input.replays, input.real));
    run.classes = Some(classes(input.classes));
    run.heaps = heaps(input)?;
    let (sites, flame) = sites::of(input.path, input.loaded)?;
    run.sites = sites;
    run.flame = flame;
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    super::dump::snapshot_extras(input.loaded, t0, &mut run);
    Ok(run)
}

/// A run's part of `diff`'s page: its summary, rows and timeline (the sites are compared in
/// a table of their own).
#[must_use]
pub fn diff_run(
    path: &Path,
    loaded: &Loaded,
    view: &TraceView<'_>,
    replays: &[(&str, &Replay)],
) -> Run {
    let mut run = summary(path, loaded, view);
    run.rows = rows(replays, &[]);
    run.timeline = Some(timeline(loaded, view, replays, &[]));
    run
}

fn summary(path: &Path, loaded: &Loaded, view: &TraceView<'_>) -> Run {
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    let t_last = view.t_ns.last().copied().unwrap_or(t0);
    let (peak, at) = view.peak_live();
    Run {
        file: file_label(path),
        format: crate::session::input::events_of(loaded)
            .map_or("", |e| e.format)
            .to_owned(),
        events: view.len() as u64,
        duration_s: (t_last - t0) as f64 / 1e9,
        peak_live_bytes: peak,
        peak_live_t_s: (view.t_ns.get(at).copied().unwrap_or(t0) - t0) as f64 / 1e9,
        ..Run::default()
    }
}

fn rows(replays: &[(&str, &Replay)], real: &[(&Row, &Series)]) -> Vec<PolicyRow> {
    replays
        .iter()
        .map(|&(name, r)| PolicyRow::of(&Row::from_replay(name, r), false))
        .chain(real.iter().map(|(row, _)| PolicyRow::of(row, true)))
        .collect()
}

fn seconds(s: &Series) -> Vec<f64> {
    let t0 = s.bucketing.t0_ns;
    (0..s.len())
        .map(|b| round6((s.bucketing.start_ns(b) - t0) as f64 / 1e9))
        .collect()
}

fn timeline(
    loaded: &Loaded,
    view: &TraceView<'_>,
    replays: &[(&str, &Replay)],
    real: &[(&Row, &Series)],
) -> Timeline {
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    let mut t = timeline_of(t0, replays, real);
    t.recorded = recorded(loaded, t0, t.t_s.len().max(1));
    t.marks = marks(crate::answers::marks::marks_of(loaded), t0);
    t
}

/// The run's marks, times from `t0_ns`.
fn marks(marks: &[allocview_loaders::binary::Mark], t0_ns: i64) -> Vec<(f64, String)> {
    marks
        .iter()
        .map(|m| (round6((m.t_ns - t0_ns) as f64 / 1e9), m.label().to_owned()))
        .collect()
}

/// The timeline of `replays` and `real` rows, times from `t0_ns`, without recorded memory.
fn timeline_of(t0: i64, replays: &[(&str, &Replay)], real: &[(&Row, &Series)]) -> Timeline {
    let mut t = Timeline::default();
    // Live bytes are the trace's, the same in every replay: the first series has them.
    if let Some((_, r)) = replays.first() {
        t.t_s = seconds(&r.series);
        t.live_bytes = r.series.live_bytes.max.clone();
    }
    for (i, &(name, r)) in replays.iter().enumerate() {
        t.lines.push(line(name, i + 1, &r.series, false, &t.t_s));
        for oom in r.ooms.iter().take(OOM_MARKERS_PER_LINE) {
            t.ooms.push((i, (oom.t_ns - t0) as f64 / 1e9));
        }
    }
    for (i, (row, series)) in real.iter().enumerate() {
        t.lines
            .push(line(&row.name, replays.len() + i + 1, series, true, &t.t_s));
    }
    t
}

/// A line of the timeline; its times only where they are not the timeline's own.
fn line(name: &str, palette: usize, s: &Series, measured: bool, shared_t_s: &[f64]) -> Line {
    let t_s = seconds(s);
    Line {
        name: name.to_owned(),
        palette,
        t_s: (t_s != shared_t_s).then_some(t_s),
        footprint_bytes: s.footprint_bytes.max.clone(),
        fragmentation: s.fragmentation.last.iter().map(|&f| round6(f)).collect(),
        measured,
    }
}

/// The recorded memory samples, at most `points` of them (each the largest of its stretch),
/// on the events' time axis.
fn recorded(loaded: &Loaded, t0_ns: i64, points: usize) -> Option<Recorded> {
    let (samples, _) = samples_of(loaded);
    let first = samples.first()?;
    let last = samples.last()?;
    let span_ns = (last.t_ns - first.t_ns).max(1) as f64;
    let mut out = Recorded {
        label: recorded_label(loaded).to_owned(),
        t_s: Vec::new(),
        bytes: Vec::new(),
    };
    let mut slot = usize::MAX;
    for s in samples {
        let b = (((s.t_ns - first.t_ns) as f64 / span_ns) * points as f64) as usize;
        if b == slot {
            if let Some(v) = out.bytes.last_mut() {
                *v = (*v).max(s.resident_bytes);
            }
        } else {
            slot = b;
            out.t_s.push(round6((s.t_ns - t0_ns) as f64 / 1e9));
            out.bytes.push(s.resident_bytes);
        }
    }
    Some(out)
}

fn recorded_label(loaded: &Loaded) -> &'static str {
    match loaded {
        Loaded::MallocTrace(t)
            if t.memory_series == allocview_loaders::RecordedSeries::AllocatorReserved =>
        {
            "reserved (measured)"
        }
        _ => "RSS (measured)",
    }
}

fn classes(c: &ClassSeries) -> Classes {
    use allocview_sim::trace::NUM_SIZE_CLASSES;
    let buckets = c.buckets();
    let mut rows: Vec<ClassRow> = Vec::new();
    for class in 0..NUM_SIZE_CLASSES {
        let live: Vec<u64> = (0..buckets)
            .map(|b| {
                c.live_bytes_peak(b)
                    .and_then(|row| row.get(class).copied())
                    .unwrap_or(0)
            })
            .collect();
        if live.iter().any(|&v| v > 0) {
            let class = u8::try_from(class).unwrap_or(u8::MAX);
            rows.push(ClassRow {
                class,
                label: crate::format::class_range(class),
                live_bytes: live,
            });
        }
    }
    Classes {
        t_s: (0..buckets)
            .map(|b| round6((c.bucketing.start_ns(b) - c.bucketing.t0_ns) as f64 / 1e9))
            .collect(),
        rows,
    }
}

/// Every policy's heap at the peak of live bytes; the first policy's at its first OOM and at
/// the end too.
fn heaps(input: &RunInput<'_>) -> Result<Vec<HeapMoment>> {
    let view = input.view;
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    let t_s = |event: usize| (view.t_ns.get(event).copied().unwrap_or(t0) - t0) as f64 / 1e9;
    let mut out = Vec::new();
    for (&(name, _), (policy, counters)) in
        input.replays.iter().zip(input.peak_heaps).take(PEAK_HEAPS)
    {
        out.push(HeapMoment::of(
            name,
            "peak of live bytes",
            (input.peak_event, t_s(input.peak_event)),
            policy.as_ref(),
            counters,
        ));
    }
    let Some(&(name, rep)) = input.replays.first() else {
        return Ok(out);
    };
    let mut moments = Vec::new();
    if let Some(oom) = rep.ooms.first() {
        moments.push(("first OOM", oom.event));
    }
    if !view.is_empty() {
        moments.push(("end", view.len() - 1));
    }
    for (label, event) in moments {
        let (policy, counters) = rep
            .state_at(view, event)
            .map_err(|e| anyhow!("{name}: seeking to event {event}: {e}"))?;
        out.push(HeapMoment::of(
            name,
            label,
            (event, t_s(event)),
            policy.as_ref(),
            &counters,
        ));
    }
    Ok(out)
}

/// What a page of a binary trace read block by block (`report --stream`) is built from: no
/// events in memory, so no sites and no heaps but at the peak.
pub struct StreamedInput<'a> {
    pub path: &'a Path,
    pub events: u64,
    pub t0_ns: i64,
    pub t_last_ns: i64,
    pub peak_live_bytes: u64,
    pub peak_event: usize,
    pub replays: &'a [(&'a str, &'a Replay)],
    pub classes: &'a ClassSeries,
    /// Each replay's heap just after `peak_event`, in `replays`' order.
    pub peak_heaps: &'a [(Box<dyn Policy>, Counters)],
}

/// A run's part of the page from a streamed report: the summary, the rows, the timeline, the
/// heaps at the peak and the size classes; a note says why there are no sites.
#[must_use]
pub fn build_streamed_run(input: &StreamedInput<'_>) -> Run {
    let t0 = input.t0_ns;
    let mut timeline = timeline_of(t0, input.replays, &[]);
    timeline.marks = marks(&crate::answers::marks::marks_in_file(input.path), t0);
    if let Some(&(_, r)) = input.replays.first()
        && timeline.live_bytes.is_empty()
    {
        timeline.live_bytes = r.series.live_bytes.max.clone();
    }
    // The peak's time: the bucket where the live bytes were highest (the stream keeps the
    // peak's event, not its time).
    let peak_t_s = timeline
        .live_bytes
        .iter()
        .enumerate()
        .max_by_key(|&(i, &v)| (v, std::cmp::Reverse(i)))
        .and_then(|(i, _)| timeline.t_s.get(i).copied())
        .unwrap_or(0.0);
    let heaps = input
        .replays
        .iter()
        .zip(input.peak_heaps)
        .take(PEAK_HEAPS)
        .map(|(&(name, _), (policy, counters))| {
            HeapMoment::of(
                name,
                "peak of live bytes",
                (input.peak_event, peak_t_s),
                policy.as_ref(),
                counters,
            )
        })
        .collect();
    Run {
        file: file_label(input.path),
        format: "binary-trace".to_owned(),
        events: input.events,
        duration_s: (input.t_last_ns - t0) as f64 / 1e9,
        peak_live_bytes: input.peak_live_bytes,
        peak_live_t_s: peak_t_s,
        rows: rows(input.replays, &[]),
        timeline: Some(timeline),
        heaps,
        classes: Some(classes(input.classes)),
        notes: vec![
            "read block by block (--stream): the sites, the flame graph and the heaps at the \
             first OOM and the end need the trace loaded; a window of it (--from/--to/--events) \
             has them"
                .to_owned(),
        ],
        ..Run::default()
    }
}
