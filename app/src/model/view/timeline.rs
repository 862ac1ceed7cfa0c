//! The timeline's view-model: every run's live and footprint series over the zoomed window,
//! fragmentation, OOMs, the cursor, the selected site's share and a snapshot's phases.

use allocview_sim::series::Series;

use super::vm::{LineVm, RECORDED_PALETTE, SITE_PALETTE, TimelineVm, Viewport};
use crate::format;
use crate::model::state::{AppState, Mode, PolicySlot, RealStatus};

/// The visible part of the timeline (fractions `lo..hi` of the trace's time span) and the
/// points it is drawn with.
#[derive(Clone, Copy)]
struct Window {
    lo: f64,
    hi: f64,
    points: usize,
}

impl Window {
    /// Where bucket `b` of `len` stands, in 0..1 of the window (its middle).
    fn x_of(self, b: usize, len: usize) -> f64 {
        let f = (b as f64 + 0.5) / len as f64;
        (f - self.lo) / (self.hi - self.lo)
    }

    /// Whether bucket `b` of `len` lies in the window.
    fn holds(self, b: usize, len: usize) -> bool {
        let f = (b as f64 + 0.5) / len as f64;
        f >= self.lo && f <= self.hi
    }

    /// The visible buckets of `values` (of `len` buckets), downsampled to at most `points` by
    /// their maximum, so peaks survive.
    fn sample(self, values: &[u64], len: usize) -> Vec<(f64, f64)> {
        let lo = ((self.lo * len as f64).floor() as usize).min(len);
        let hi = ((self.hi * len as f64).ceil() as usize).clamp(lo, len);
        let span = hi - lo;
        if span == 0 {
            return Vec::new();
        }
        let per = span.div_ceil(self.points).max(1);
        (lo..hi)
            .step_by(per)
            .map(|start| {
                let end = (start + per).min(hi);
                let v = values
                    .get(start..end)
                    .map_or(0, |s| s.iter().copied().max().unwrap_or(0));
                (self.x_of((start + end - 1) / 2, len), v as f64)
            })
            .collect()
    }
}

/// The replayed policies' lines: the trace's live bytes once, each shown policy's footprint,
/// the selected one's fragmentation and OOMs, and the highest byte value drawn.
struct PolicyLines {
    byte_lines: Vec<LineVm>,
    y_max: u64,
    fragmentation: Option<LineVm>,
    oom_x: Vec<f64>,
}

/// The timeline at `vp`'s resolution.
pub(super) fn timeline(state: &AppState, vp: &Viewport) -> TimelineVm {
    let (zlo, zhi) = state.zoom;
    let w = Window {
        lo: zlo,
        hi: zhi,
        points: vp.timeline_points.max(2),
    };
    let PolicyLines {
        mut byte_lines,
        mut y_max,
        fragmentation,
        oom_x,
    } = policy_lines(state, w);
    if let Some(line) = recorded_line(state, w) {
        y_max = y_max.max(line.points.iter().map(|p| p.1 as u64).max().unwrap_or(0));
        byte_lines.push(line);
    }
    if let Some((name, series)) = state.sites.series() {
        let pts = w.sample(series, series.len());
        byte_lines.push(LineVm {
            label: format!("site {name} live"),
            palette: SITE_PALETTE,
            points: pts,
        });
    }
    let span = state.bucketing().map_or(1.0, |b| b.span_ns as f64);
    let t_cursor = state.cursor_t_ns() as f64 / span;
    let cursor_x = ((zlo..=zhi).contains(&t_cursor)).then(|| (t_cursor - zlo) / (zhi - zlo));
    let title = format!(
        "timeline{}  (zoom {:.0}x)",
        if state.mode == Mode::Compare {
            ": footprint of every policy"
        } else {
            ""
        },
        1.0 / (zhi - zlo)
    );
    let mut phases = phases(state, span, (zlo, zhi));
    let phases_in_view = phases.len();
    // More boundaries than one per eight points would cover the lines they annotate (a big
    // snapshot repeats its phases thousands of times): say how many, and mark them once zoomed.
    if phases_in_view * 16 > w.points {
        phases.clear();
    }
    TimelineVm {
        byte_lines,
        fragmentation,
        y_max_bytes: y_max as f64,
        y_max_label: format::bytes(y_max),
        t_start_label: format::seconds_fixed(zlo * span / 1e9),
        t_end_label: format::seconds_fixed(zhi * span / 1e9),
        cursor_x,
        oom_x,
        phases,
        phases_in_view,
        marks: marks(state, (zlo, zhi)),
        title,
    }
}

/// The run's marks in the window, placed on the timeline's buckets.
fn marks(state: &AppState, (zlo, zhi): (f64, f64)) -> Vec<(f64, String)> {
    let (Some(data), Some(b)) = (state.data.as_ref(), state.bucketing()) else {
        return Vec::new();
    };
    let span_ns = (b.span_ns as f64).max(1.0);
    let w = (zhi - zlo).max(f64::MIN_POSITIVE);
    data.marks
        .iter()
        .filter_map(|m| {
            let x = (m.t_ns.saturating_sub(b.t0_ns) as f64 / span_ns - zlo) / w;
            (0.0..=1.0).contains(&x).then(|| (x, m.label().to_owned()))
        })
        .collect()
}

/// The lines of the policies shown (the selected one, or every one in compare mode) that have
/// replayed.
fn policy_lines(state: &AppState, w: Window) -> PolicyLines {
    let mut lines = PolicyLines {
        byte_lines: Vec::new(),
        y_max: 1,
        fragmentation: None,
        oom_x: Vec::new(),
    };
    let shown: Vec<usize> = match state.mode {
        Mode::Single => vec![state.selected],
        Mode::Compare => (0..state.policies.len()).collect(),
    };
    let mut live_done = false;
    for i in shown {
        let Some(slot) = state.policies.get(i) else {
            continue;
        };
        let Some(r) = slot.replay() else { continue };
        let s = &r.series;
        let len = s.len();
        if !live_done {
            let pts = w.sample(&s.live_bytes.max, len);
            lines.y_max = lines
                .y_max
                .max(pts.iter().map(|p| p.1 as u64).max().unwrap_or(0));
            lines.byte_lines.push(LineVm {
                label: "live".to_owned(),
                palette: 0,
                points: pts,
            });
            live_done = true;
        }
        let pts = w.sample(&s.footprint_bytes.max, len);
        lines.y_max = lines
            .y_max
            .max(pts.iter().map(|p| p.1 as u64).max().unwrap_or(0));
        lines.byte_lines.push(LineVm {
            label: format!("{} footprint", slot.name),
            palette: i + 1,
            points: pts,
        });
        if i == state.selected {
            lines.fragmentation = Some(fragmentation_line(slot, s, w));
            lines.oom_x = r
                .ooms
                .iter()
                .map(|o| s.bucket_of_event(o.event))
                .filter(|&b| w.holds(b, len))
                .map(|b| w.x_of(b, len))
                .collect();
        }
    }
    // The real allocators' measured RSS, after the policies' footprints (in either mode).
    for (j, slot) in state.real.iter().enumerate() {
        let RealStatus::Done(s) = &slot.status else {
            continue;
        };
        let pts = w.sample(&s.footprint_bytes.max, s.len());
        lines.y_max = lines
            .y_max
            .max(pts.iter().map(|p| p.1 as u64).max().unwrap_or(0));
        lines.byte_lines.push(LineVm {
            label: format!("{} RSS", slot.name),
            palette: state.policies.len() + j + 1,
            points: pts,
        });
    }
    lines
}

/// The recorded program's resident memory (a trace made by `record`), on the timeline's
/// buckets: each bucket's largest sample, or the last sample before it (the memory stays what
/// it was between samples). A measurement, drawn beside the policies' footprints.
fn recorded_line(state: &AppState, w: Window) -> Option<LineVm> {
    let data = state.data.as_ref()?;
    let first = data.memory.first()?;
    let b = state.bucketing()?;
    let len = b.buckets;
    let mut values = vec![0u64; len];
    let mut has = vec![false; len];
    let end_ns = b
        .t0_ns
        .saturating_add(i64::try_from(b.span_ns).unwrap_or(i64::MAX));
    for m in &data.memory {
        if m.t_ns < b.t0_ns || m.t_ns > end_ns {
            continue;
        }
        let i = b.bucket_of(m.t_ns).min(len - 1);
        if let (Some(v), Some(h)) = (values.get_mut(i), has.get_mut(i)) {
            *v = (*v).max(m.resident_bytes);
            *h = true;
        }
    }
    // Before the first sample in view: the last one before the view, if any.
    let mut last = data
        .memory
        .iter()
        .take_while(|m| m.t_ns < b.t0_ns)
        .last()
        .map_or(0, |m| m.resident_bytes);
    let mut seen = last > 0 || first.t_ns <= b.t0_ns;
    for (v, h) in values.iter_mut().zip(&has) {
        if *h {
            last = *v;
            seen = true;
        } else if seen {
            *v = last;
        }
    }
    Some(LineVm {
        label: if data.format == "pytorch-profiler" {
            "recorded reserved".to_owned()
        } else {
            "recorded RSS".to_owned()
        },
        palette: RECORDED_PALETTE,
        points: w.sample(&values, len),
    })
}

/// The fragmentation (0..1) of `slot`'s series `s` at the end of each visible bucket with
/// events, thinned to the window's points.
fn fragmentation_line(slot: &PolicySlot, s: &Series, w: Window) -> LineVm {
    let len = s.len();
    let frag: Vec<(f64, f64)> = (0..len)
        .filter(|&b| w.holds(b, len) && s.event_count.get(b).copied().unwrap_or(0) > 0)
        .map(|b| {
            (
                w.x_of(b, len),
                s.fragmentation.last.get(b).copied().unwrap_or(0.0),
            )
        })
        .collect();
    let per = frag.len().div_ceil(w.points).max(1);
    LineVm {
        label: format!("{} fragmentation", slot.name),
        palette: usize::MAX,
        points: frag.into_iter().step_by(per).collect(),
    }
}

/// A snapshot's annotated phases in the window: each `START` paired with the next `END` of
/// the same name (an unpaired one runs to the edge of the trace).
fn phases(state: &AppState, span_ns: f64, (zlo, zhi): (f64, f64)) -> Vec<(f64, f64, String)> {
    let Some(s) = state.data.as_ref().and_then(|d| d.snapshot.as_ref()) else {
        return Vec::new();
    };
    let mut open: Vec<(&str, f64)> = Vec::new();
    let mut spans: Vec<(f64, f64, String)> = Vec::new();
    for (t, stage, name) in &s.annotations {
        let x = *t as f64 / span_ns.max(1.0);
        if stage == "END" {
            let start = open
                .iter()
                .rposition(|(n, _)| n == name)
                .map_or(0.0, |i| open.remove(i).1);
            spans.push((start, x, name.clone()));
        } else {
            open.push((name, x));
        }
    }
    spans.extend(open.into_iter().map(|(n, x)| (x, 1.0, n.to_owned())));
    let w = (zhi - zlo).max(f64::MIN_POSITIVE);
    spans
        .into_iter()
        .filter(|(a, b, _)| *b >= zlo && *a <= zhi)
        .map(|(a, b, n)| (((a - zlo) / w).max(0.0), ((b - zlo) / w).min(1.0), n))
        .collect()
}
