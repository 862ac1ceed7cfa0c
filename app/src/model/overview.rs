//! The whole-trace strip of a trace shown in parts: the background scan's overview
//! ([`super::scan::Overview`]) as a row of levels, the part shown marked on it, for both
//! frontends to draw at their own width.

use super::scan::Overview;
use super::trace_data::Part;
use crate::format;

/// Levels of a cell, lowest to highest (a stretch not read yet is blank).
const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// What the strip shows.
#[derive(Clone, Debug, PartialEq)]
pub struct OverviewVm {
    /// The highest live bytes of each stretch of the trace read so far (`None`: not yet).
    pub max_live_bytes: Vec<Option<u64>>,
    /// The part shown, as fractions of the trace.
    pub part: (f64, f64),
    /// What the strip is, and how far the read is.
    pub label: String,
}

/// One cell of the strip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverviewCell {
    pub glyph: char,
    /// Inside the part shown.
    pub in_part: bool,
}

impl OverviewVm {
    /// The strip of `part` of a trace whose scan found `o`.
    #[must_use]
    pub fn new(o: &Overview, part: Part) -> Self {
        let total = o.trace_events.max(part.trace_events).max(1) as f64;
        let read = o
            .scanned_events
            .div_ceil(o.bucket_events.max(1))
            .try_into()
            .unwrap_or(usize::MAX);
        let max_live_bytes = (0..super::scan::OVERVIEW_BUCKETS)
            .map(|b| {
                if b < read {
                    Some(o.max_live_bytes.get(b).copied().unwrap_or(0))
                } else {
                    None
                }
            })
            .collect();
        let peak = o.max_live_bytes.iter().max().copied().unwrap_or(0);
        let label = if let Some(e) = &o.error {
            format!("whole trace: not read ({e})")
        } else if o.done {
            format!(
                "whole trace, peak live {} ({} resume points)",
                format::bytes(peak),
                format::count(o.points as u64)
            )
        } else {
            format!(
                "whole trace: {:.0}% read, peak live {} so far",
                // An index that understates the trace must not read past 100%.
                100.0 * (o.scanned_events as f64 / total).min(1.0),
                format::bytes(peak)
            )
        };
        Self {
            max_live_bytes,
            part: (part.start as f64 / total, part.end as f64 / total),
            label,
        }
    }

    /// The strip in `width` cells: each the highest level of the stretches it covers (blank
    /// where none is read yet), scaled to the highest of all; a cell is in the part when the
    /// stretch of the trace it stands for overlaps it.
    #[must_use]
    pub fn cells(&self, width: usize) -> Vec<OverviewCell> {
        let n = self.max_live_bytes.len();
        let w = width.max(1);
        let top = self
            .max_live_bytes
            .iter()
            .flatten()
            .max()
            .copied()
            .unwrap_or(0);
        (0..width)
            .map(|c| {
                let lo = c * n / w;
                let hi = ((c + 1) * n / w).max(lo + 1).min(n);
                let level = self
                    .max_live_bytes
                    .get(lo..hi)
                    .unwrap_or_default()
                    .iter()
                    .flatten()
                    .max()
                    .map(|&v| level_of(v, top));
                let (from, to) = (c as f64 / w as f64, (c + 1) as f64 / w as f64);
                OverviewCell {
                    glyph: level.map_or(' ', |l| LEVELS.get(l).copied().unwrap_or('█')),
                    in_part: from < self.part.1.max(self.part.0 + f64::EPSILON) && to > self.part.0,
                }
            })
            .collect()
    }
}

/// The level of `v` bytes on a scale whose top level holds `top`: the lowest level holds 0
/// up to an eighth of the top.
fn level_of(v: u64, top: u64) -> usize {
    if top == 0 {
        return 0;
    }
    let eighths = (v as f64 / top as f64 * LEVELS.len() as f64).ceil() as usize;
    eighths.clamp(1, LEVELS.len()) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_strip_scales_to_the_peak_marks_the_part_and_leaves_unread_stretches_blank() {
        let mut max_live_bytes = vec![0u64; super::super::scan::OVERVIEW_BUCKETS];
        for (i, v) in max_live_bytes.iter_mut().enumerate() {
            *v = i as u64 * 10;
        }
        let o = Overview {
            bucket_events: 1000,
            max_live_bytes,
            // Half the trace read.
            scanned_events: 512_000,
            trace_events: 1_024_000,
            points: 3,
            spacing_events: 4096,
            done: false,
            error: None,
        };
        let part = Part {
            start: 256_000,
            end: 384_000,
            trace_events: 1_024_000,
        };
        let vm = OverviewVm::new(&o, part);
        assert!(vm.label.contains("50% read"), "{}", vm.label);
        let cells = vm.cells(8);
        let glyphs: String = cells.iter().map(|c| c.glyph).collect();
        // The read half rises to the highest level; the unread half is blank.
        assert_eq!(glyphs, "▂▄▆█    ");
        let marked: Vec<bool> = cells.iter().map(|c| c.in_part).collect();
        assert_eq!(
            marked,
            [false, false, true, false, false, false, false, false]
        );
        // A part narrower than a cell is still marked.
        let thin = OverviewVm::new(
            &o,
            Part {
                start: 900_000,
                end: 900_010,
                trace_events: 1_024_000,
            },
        );
        let marked: Vec<usize> = (0..8).filter(|&i| thin.cells(8)[i].in_part).collect();
        assert_eq!(marked, [7]);
        let done = OverviewVm::new(
            &Overview {
                done: true,
                scanned_events: 1_024_000,
                ..o
            },
            part,
        );
        assert!(done.label.contains("3 resume points"), "{}", done.label);
        assert!(!done.cells(8).iter().any(|c| c.glyph == ' '));
    }
}
