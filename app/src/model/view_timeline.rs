//! The timeline's view-model: every run's live and footprint series over the zoomed window,
//! fragmentation, OOMs, the cursor, the selected site's share and a snapshot's phases.

use super::state::{AppState, Mode};
use super::view::{LineVm, SITE_PALETTE, TimelineVm, Viewport};
use crate::format;

/// The timeline at `vp`'s resolution.
pub(super) fn timeline(state: &AppState, vp: &Viewport) -> TimelineVm {
    let (zlo, zhi) = state.zoom;
    let points = vp.timeline_points.max(2);
    let mut byte_lines = Vec::new();
    let mut y_max: u64 = 1;
    let mut fragmentation = None;
    let mut oom_x = Vec::new();
    let to_x = |b: usize, len: usize| -> f64 {
        let f = (b as f64 + 0.5) / len as f64;
        (f - zlo) / (zhi - zlo)
    };
    let in_window = |b: usize, len: usize| {
        let f = (b as f64 + 0.5) / len as f64;
        f >= zlo && f <= zhi
    };
    // Downsample the visible buckets to at most `points` by max, so peaks survive.
    let sample = |values: &[u64], len: usize| -> Vec<(f64, f64)> {
        let lo = ((zlo * len as f64).floor() as usize).min(len);
        let hi = ((zhi * len as f64).ceil() as usize).clamp(lo, len);
        let span = hi - lo;
        if span == 0 {
            return Vec::new();
        }
        let per = span.div_ceil(points).max(1);
        (lo..hi)
            .step_by(per)
            .map(|start| {
                let end = (start + per).min(hi);
                let v = values
                    .get(start..end)
                    .map_or(0, |s| s.iter().copied().max().unwrap_or(0));
                (to_x((start + end - 1) / 2, len), v as f64)
            })
            .collect()
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
            let pts = sample(&s.live_bytes.max, len);
            y_max = y_max.max(pts.iter().map(|p| p.1 as u64).max().unwrap_or(0));
            byte_lines.push(LineVm {
                label: "live".to_owned(),
                palette: 0,
                points: pts,
            });
            live_done = true;
        }
        let pts = sample(&s.footprint_bytes.max, len);
        y_max = y_max.max(pts.iter().map(|p| p.1 as u64).max().unwrap_or(0));
        byte_lines.push(LineVm {
            label: format!("{} footprint", slot.name),
            palette: i + 1,
            points: pts,
        });
        if i == state.selected {
            let frag: Vec<(f64, f64)> = (0..len)
                .filter(|&b| in_window(b, len) && s.event_count.get(b).copied().unwrap_or(0) > 0)
                .map(|b| {
                    (
                        to_x(b, len),
                        s.fragmentation.last.get(b).copied().unwrap_or(0.0),
                    )
                })
                .collect();
            let per = frag.len().div_ceil(points).max(1);
            fragmentation = Some(LineVm {
                label: format!("{} fragmentation", slot.name),
                palette: usize::MAX,
                points: frag.into_iter().step_by(per).collect(),
            });
            for o in &r.ooms {
                let b = s.bucket_of_event(o.event);
                if in_window(b, len) {
                    oom_x.push(to_x(b, len));
                }
            }
        }
    }
    if let Some((name, series)) = state.sites.series() {
        let pts = sample(series, series.len());
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
    if phases_in_view * 16 > points {
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
        title,
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
