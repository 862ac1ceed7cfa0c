//! DHAT's JSON (`dhatFileVersion` 2, heap mode), what Valgrind's `dh_view.html`, the Firefox
//! Profiler and dhat-rs's tools read: per allocation site (a program point), the blocks and
//! bytes it allocated, their total lifetime, its most bytes live at once, its bytes at the
//! global peak and at the end. The input's run (or window) is the whole profile; time is in
//! microseconds from its first event. Block accesses are not recorded (`bkacc` false). With
//! sampled stacks the figures are estimates (`EventSites::alloc_weight`, said in `cmd`).

use std::collections::HashMap;

use allocview_loaders::analysis::sampling::Weight;
use allocview_loaders::analysis::site_stats::EventSites;
use allocview_loaders::sites::StackTable;
use allocview_sim::trace::{EventKind, NO_ALLOC_ID, TraceView};
use serde_json::{Value, json};

/// Blocks shorter-lived than this many microseconds count as short-lived in `dh_view`.
const SHORT_LIVED_US: u64 = 500;

/// One program point's figures (fractional: with sampled stacks, each allocation counts for
/// its weight).
#[derive(Clone, Copy, Default)]
struct Point {
    stack: u32,
    total_bytes: f64,
    total_blocks: f64,
    total_lifetime_us: f64,
    live_bytes: f64,
    live_blocks: f64,
    max_bytes: f64,
    max_blocks: f64,
    peak_bytes: f64,
    peak_blocks: f64,
}

/// The DHAT file of `view`'s run, whose sites `sites` gives; `cmd` names the input.
#[must_use]
pub fn write(view: &TraceView<'_>, sites: &EventSites, cmd: &str) -> Value {
    let (points, times) = points_of(view, sites);
    let n = |v: f64| v.round() as u64;
    let cmd = match sites.sampling() {
        Some(s) => format!("{cmd} ({})", s.note()),
        None => cmd.to_owned(),
    };
    let mut ftbl: Vec<String> = vec!["[root]".to_owned()];
    let mut frame_index: HashMap<u32, usize> = HashMap::new();
    let stacks = &sites.stacks;
    let pps: Vec<Value> = points
        .iter()
        .map(|pt| {
            let fs = frames_of(stacks, pt.stack, &mut ftbl, &mut frame_index);
            json!({
                "tb": n(pt.total_bytes), "tbk": n(pt.total_blocks),
                "tl": n(pt.total_lifetime_us),
                "mb": n(pt.max_bytes), "mbk": n(pt.max_blocks),
                "gb": n(pt.peak_bytes), "gbk": n(pt.peak_blocks),
                "eb": n(pt.live_bytes), "ebk": n(pt.live_blocks),
                "fs": fs,
            })
        })
        .collect();
    json!({
        "dhatFileVersion": 2,
        "mode": "heap",
        "verb": "Allocated",
        "bklt": true,
        "bkacc": false,
        "tu": "µs",
        "Mtu": "s",
        "tuth": SHORT_LIVED_US,
        "cmd": cmd,
        "pid": 0,
        "te": times.end_us,
        "tg": times.peak_us,
        "pps": pps,
        "ftbl": ftbl,
    })
}

/// The trace's end and the moment of its peak of live bytes, in µs from its first event.
struct Times {
    end_us: u64,
    peak_us: u64,
}

/// One pass over the events: each allocation site's totals, maxima, bytes at the trace's peak
/// and at its end, and lifetimes (a block still live at the end lives until it).
fn points_of(view: &TraceView<'_>, sites: &EventSites) -> (Vec<Point>, Times) {
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    let us = |i: usize| (view.t_ns.get(i).copied().unwrap_or(t0) - t0).max(0) as u64 / 1000;
    let (peak_live, peak_at) = view.peak_live();
    let mut points: Vec<Point> = Vec::new();
    let mut index: HashMap<u32, usize> = HashMap::new();
    // Per allocation id: its point, weight and time of allocation while live.
    let mut live: Vec<Option<(usize, Weight, u64)>> = vec![None; view.num_allocs as usize];
    for i in 0..view.len() {
        let id = view.alloc_id.get(i).copied().unwrap_or(NO_ALLOC_ID);
        let size = view.size_bytes.get(i).copied().unwrap_or(0);
        match view.kind_at(i) {
            Some(EventKind::Alloc) => {
                let w = sites.alloc_weight(i, size);
                if w.count == 0.0 {
                    continue;
                }
                let stack = sites.stack_at(i);
                let p = *index.entry(stack).or_insert_with(|| {
                    points.push(Point {
                        stack,
                        ..Point::default()
                    });
                    points.len() - 1
                });
                if let Some(pt) = points.get_mut(p) {
                    pt.total_bytes += w.bytes;
                    pt.total_blocks += w.count;
                    pt.live_bytes += w.bytes;
                    pt.live_blocks += w.count;
                    if pt.live_bytes > pt.max_bytes {
                        pt.max_bytes = pt.live_bytes;
                        pt.max_blocks = pt.live_blocks;
                    }
                }
                if let Some(slot) = live.get_mut(id as usize) {
                    *slot = Some((p, w, us(i)));
                }
            }
            Some(EventKind::Free) => {
                if let Some((p, w, born)) = live.get_mut(id as usize).and_then(Option::take)
                    && let Some(pt) = points.get_mut(p)
                {
                    pt.live_bytes = (pt.live_bytes - w.bytes).max(0.0);
                    pt.live_blocks = (pt.live_blocks - w.count).max(0.0);
                    pt.total_lifetime_us += us(i).saturating_sub(born) as f64 * w.count;
                }
            }
            _ => {}
        }
        if i == peak_at && peak_live > 0 {
            for pt in &mut points {
                pt.peak_bytes = pt.live_bytes;
                pt.peak_blocks = pt.live_blocks;
            }
        }
    }
    let end_us = us(view.len().saturating_sub(1));
    // Blocks still live at the end lived until it.
    for (p, w, born) in live.iter().flatten() {
        if let Some(pt) = points.get_mut(*p) {
            pt.total_lifetime_us += end_us.saturating_sub(*born) as f64 * w.count;
        }
    }
    let times = Times {
        end_us,
        peak_us: us(peak_at),
    };
    (points, times)
}

/// The `ftbl` indices of stack `stack`'s frames, innermost first, adding new ones; a stack
/// without frames is one frame that says so (`dh_view` needs a distinct path per point).
fn frames_of(
    stacks: &StackTable,
    stack: u32,
    ftbl: &mut Vec<String>,
    index: &mut HashMap<u32, usize>,
) -> Vec<usize> {
    let mut fs: Vec<usize> = stacks
        .stack(stack)
        .iter()
        .map(|&f| {
            *index.entry(f).or_insert_with(|| {
                let text = stacks.frame(f).map_or_else(|| "??".to_owned(), frame_text);
                ftbl.push(text);
                ftbl.len() - 1
            })
        })
        .collect();
    if fs.is_empty() {
        fs.push(*index.entry(u32::MAX).or_insert_with(|| {
            ftbl.push("(no stack recorded)".to_owned());
            ftbl.len() - 1
        }));
    }
    fs
}

/// A frame as DHAT writes one: `function (file:line)`, or `function (in module)`.
fn frame_text(f: &allocview_loaders::sites::Frame) -> String {
    if f.line > 0 && !f.file.is_empty() && f.file != "??" {
        format!("{} ({}:{})", f.function, f.file, f.line)
    } else if !f.module.is_empty() {
        format!("{} (in {})", f.function, f.module)
    } else {
        f.function.clone()
    }
}

/// The DHAT file of a heap profile's samples: what was allocated by each stack. A profile
/// holds no block lifetimes, so the file says none (`bklt` false) rather than invent them.
#[must_use]
pub fn of_profile(p: &allocview_loaders::profile::HeapProfile, cmd: &str) -> Value {
    let mut ftbl: Vec<String> = vec!["[root]".to_owned()];
    let mut frame_index: HashMap<u32, usize> = HashMap::new();
    let pps: Vec<Value> = p
        .samples
        .iter()
        .filter(|s| s.alloc_bytes > 0 || s.live_bytes > 0)
        .map(|s| {
            let fs = frames_of(&p.stacks, s.stack, &mut ftbl, &mut frame_index);
            // A profile without allocation totals (only what is in use) gives its live figures.
            let (tb, tbk) = if p.has.alloc {
                (s.alloc_bytes, s.alloc_objects)
            } else {
                (s.live_bytes, s.live_objects)
            };
            json!({"tb": tb, "tbk": tbk, "fs": fs})
        })
        .collect();
    json!({
        "dhatFileVersion": 2,
        "mode": "heap",
        "verb": "Allocated",
        "bklt": false,
        "bkacc": false,
        "tu": "µs",
        "Mtu": "s",
        "cmd": cmd,
        "pid": 0,
        "te": p.duration_ns.map_or(0, |d| d / 1000),
        "pps": pps,
        "ftbl": ftbl,
    })
}
