//! A series of a measurement rather than a model: [`measured`].

use super::{Bucketing, Series, SeriesBuilder, State};
use crate::trace::TraceView;

/// Events measured at a time by [`measured`]: its states are built and absorbed in runs.
const MEASURED_RUN: usize = 4096;

/// A series whose footprint is measured rather than modelled (a real allocator's resident
/// memory, sampled by a replay process that ran the trace's calls): live bytes follow the
/// trace, the footprint after each event is the last sample taken at or before it
/// (`footprint` holds `(events done, bytes)` in ascending order; a sample at 0 applies from
/// the start), allocated bytes are the live bytes (what the allocator rounds is not seen), and
/// nothing is known of free blocks.
#[must_use]
pub fn measured(trace: &TraceView<'_>, buckets: usize, footprint: &[(usize, u64)]) -> Series {
    let mut builder = SeriesBuilder::new(Bucketing::for_trace(trace, buckets.max(1)));
    let mut size_of = vec![0u64; trace.num_allocs as usize];
    let (mut live, mut fp, mut next) = (0u64, 0u64, 0usize);
    let mut states = Vec::with_capacity(MEASURED_RUN);
    let n = trace.len();
    let mut start = 0;
    while start < n {
        let end = (start + MEASURED_RUN).min(n);
        states.clear();
        for i in start..end {
            let id = trace.alloc_id.get(i).map_or(usize::MAX, |&a| a as usize);
            match trace.kind_at(i) {
                Some(crate::trace::EventKind::Alloc) => {
                    let size = trace.size_bytes.get(i).copied().unwrap_or(0);
                    if let Some(s) = size_of.get_mut(id) {
                        *s = size;
                    }
                    live += size;
                }
                Some(crate::trace::EventKind::Free) => {
                    live = live.saturating_sub(size_of.get(id).copied().unwrap_or(0));
                }
                _ => {}
            }
            while let Some(&(done, bytes)) = footprint.get(next)
                && done <= i + 1
            {
                fp = bytes;
                next += 1;
            }
            states.push(State {
                live_bytes: live,
                allocated_bytes: live,
                footprint_bytes: fp,
                free_bytes: fp.saturating_sub(live),
                free_blocks: 0,
                largest_free_bytes: 0,
                failed: false,
            });
        }
        let t_ns = trace.t_ns.get(start..end).unwrap_or_default();
        let mut from = 0;
        while from < states.len() {
            let to = builder.bucket_run_end(t_ns, from);
            builder.absorb(states.get(from..to).unwrap_or_default());
            from = to;
        }
        start = end;
    }
    builder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::OwnedTrace;

    #[test]
    fn a_measured_series_steps_to_each_sample_and_keeps_the_live_bytes() {
        let mut t = OwnedTrace::new();
        let a = t.alloc(0, 100);
        let b = t.alloc(10, 50);
        t.free(20, a);
        t.free(30, b);
        let v = t.view().unwrap();
        // Sampled before the first event and after the second and the fourth.
        let s = measured(&v, 4, &[(0, 7), (2, 4096), (4, 1000)]);
        assert_eq!(s.live_bytes.max, vec![100, 150, 50, 0]);
        assert_eq!(s.footprint_bytes.max, vec![7, 4096, 4096, 1000]);
        assert_eq!(s.footprint_bytes.min, vec![7, 4096, 4096, 1000]);
    }
}
