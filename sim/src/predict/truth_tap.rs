//! The true lifetime classes of a streamed trace (`predictive:lifetimes=true`), found by
//! looking a bounded distance ahead instead of reading the whole trace's future.
//!
//! [`true_short`](super::lifetime::true_short)'s rule: an allocation is short-lived when it is
//! freed before `short_allocs` more allocations are made. So its class is known at its free, or
//! once `short_allocs` later allocations have come without one, and never later. [`TruthTap`]
//! wraps the replay's event source and holds events back until the allocation at their front has
//! its class: memory is the events that span `short_allocs` allocations (a long run of frees
//! between two allocations is held whole, about 40 bytes an event).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::streamed::ByIdQueue;
use crate::stream::{EventBatch, EventRow, EventSource};
use crate::trace::{EventKind, NO_ALLOC_ID};

/// Allocations' true classes (short-lived or not), queued in allocation order.
#[derive(Debug, Default)]
pub struct StreamedTruth(ByIdQueue<bool>);

impl StreamedTruth {
    /// Whether allocation `id` is short-lived, taken off the queue with every allocation before
    /// it; `false` (long) when the queue does not hold it, as for a never-freed allocation.
    pub fn take(&self, id: u32) -> bool {
        self.0.take(id).unwrap_or(false)
    }
}

/// Events handed out at most at a time.
const BATCH_EVENTS: usize = 1 << 16;

/// An event source that hands an allocation out only once its true class is known, queued in
/// `out` for the replay's policy.
pub struct TruthTap<'a> {
    inner: &'a mut dyn EventSource,
    short_allocs: u64,
    out: Arc<StreamedTruth>,
    held: VecDeque<EventRow>,
    /// Classes of held allocations freed while held.
    freed: HashMap<u32, bool>,
    /// Allocations read so far.
    allocs: u64,
    ended: bool,
    batch: EventBatch,
}

impl<'a> TruthTap<'a> {
    /// `inner`, each allocation's class (short when freed before `short_allocs` more
    /// allocations) queued in `out` as it is handed out.
    pub fn new(inner: &'a mut dyn EventSource, short_allocs: u64, out: Arc<StreamedTruth>) -> Self {
        Self {
            inner,
            short_allocs,
            out,
            held: VecDeque::new(),
            freed: HashMap::new(),
            allocs: 0,
            ended: false,
            batch: EventBatch::default(),
        }
    }

    /// Reads the next batch into `held`, classing the held allocations it frees.
    fn read(&mut self) -> Result<(), String> {
        if !self.inner.next_batch(&mut self.batch)? {
            self.ended = true;
            return Ok(());
        }
        for j in 0..self.batch.len() {
            let Some(e) = self.batch.row(j) else { continue };
            if e.kind == EventKind::Alloc as u8 {
                self.allocs += 1;
            } else if e.kind == EventKind::Free as u8 && e.alloc_id != NO_ALLOC_ID {
                // `true_short`'s count: the allocations made after this one, up to now.
                let lived = self.allocs.saturating_sub(u64::from(e.alloc_id) + 1);
                if lived < self.short_allocs {
                    self.freed.insert(e.alloc_id, true);
                }
            }
            self.held.push_back(e);
        }
        Ok(())
    }

    /// The class of the held allocation `id`, if it is known yet.
    fn class(&mut self, id: u32) -> Option<bool> {
        if self.freed.remove(&id).is_some() {
            return Some(true);
        }
        let later = self.allocs.saturating_sub(u64::from(id) + 1);
        (later >= self.short_allocs || self.ended).then_some(false)
    }
}

impl EventSource for TruthTap<'_> {
    fn time_span(&self) -> (i64, i64) {
        self.inner.time_span()
    }

    fn next_batch(&mut self, out: &mut EventBatch) -> Result<bool, String> {
        out.clear();
        while out.len() < BATCH_EVENTS {
            let Some(&e) = self.held.front() else {
                if self.ended {
                    break;
                }
                self.read()?;
                continue;
            };
            if e.kind == EventKind::Alloc as u8 && e.alloc_id != NO_ALLOC_ID {
                let Some(short) = self.class(e.alloc_id) else {
                    if !out.is_empty() {
                        break;
                    }
                    self.read()?;
                    continue;
                };
                self.out.0.push(e.alloc_id, short);
            }
            self.held.pop_front();
            out.push_row(&e);
        }
        Ok(!out.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::lifetime::true_short;
    use crate::trace::OwnedTrace;

    /// A trace whose allocations live for all sorts of spans, some never freed.
    fn trace() -> OwnedTrace {
        let mut t = OwnedTrace::new();
        let mut live = Vec::new();
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for i in 0..6_000i64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            live.push(t.alloc(2 * i, 16 + x % 500));
            if !x.is_multiple_of(3) && !live.is_empty() {
                // Mostly the newest, sometimes one from long ago.
                let k = if x.is_multiple_of(7) {
                    (x >> 8) as usize % live.len()
                } else {
                    live.len() - 1
                };
                let id = live.swap_remove(k);
                t.free(2 * i + 1, id);
            }
        }
        t
    }

    /// Handed out through the tap in batches of any size, every event comes out in order and
    /// every allocation has `true_short`'s class when it comes out.
    #[test]
    fn the_tap_gives_the_classes_of_the_whole_trace() {
        let t = trace();
        let view = t.view().unwrap();
        for short_allocs in [1, 16, 64, 1000] {
            let truth = true_short(&view, short_allocs);
            assert!(truth.iter().any(|&s| s) && truth.iter().any(|&s| !s));
            for per_batch in [1, 13, 4096] {
                let mut source = Rows {
                    t: &t,
                    at: 0,
                    per_batch,
                };
                let out = Arc::new(StreamedTruth::default());
                let mut tap = TruthTap::new(&mut source, short_allocs, Arc::clone(&out));
                let mut batch = EventBatch::default();
                let mut seen = 0usize;
                while tap.next_batch(&mut batch).unwrap() {
                    // Held back: the events from the first unclassed allocation on, which span
                    // fewer than `short_allocs` later allocations (two events each at most
                    // here), and the last batch read.
                    let bound = 2 * (short_allocs as usize + 1) + per_batch;
                    assert!(tap.held.len() <= bound, "{} > {bound}", tap.held.len());
                    for j in 0..batch.len() {
                        assert_eq!(batch.kind[j], t.kind[seen]);
                        assert_eq!(batch.alloc_id[j], t.alloc_id[seen]);
                        seen += 1;
                        if batch.kind[j] == EventKind::Alloc as u8 {
                            let id = batch.alloc_id[j];
                            assert_eq!(out.take(id), truth[id as usize], "{short_allocs} {id}");
                        }
                    }
                }
                assert_eq!(seen, t.kind.len());
                assert!(tap.held.is_empty() && tap.freed.is_empty());
            }
        }
    }

    struct Rows<'a> {
        t: &'a OwnedTrace,
        at: usize,
        per_batch: usize,
    }

    impl EventSource for Rows<'_> {
        fn time_span(&self) -> (i64, i64) {
            (0, *self.t.t_ns.last().unwrap())
        }

        fn next_batch(&mut self, out: &mut EventBatch) -> Result<bool, String> {
            out.clear();
            let end = (self.at + self.per_batch).min(self.t.kind.len());
            for i in self.at..end {
                let t = self.t;
                out.push(
                    t.t_ns[i],
                    t.kind[i],
                    t.size_bytes[i],
                    t.alloc_id[i],
                    0,
                    0,
                    0,
                );
            }
            self.at = end;
            Ok(!out.is_empty())
        }
    }
}
