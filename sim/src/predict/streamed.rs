//! The `predictive` policy's features for a replay that streams its trace
//! ([`StreamedFeatures`]): computed as the events come, by [`AllocFeatures::from_trace`]'s rule
//! (the allocating thread's last two calls), instead of for every allocation of the trace
//! beforehand, which a trace of a billion allocations does not leave room for. A stream carries
//! no stacks, so there are no sites.
//!
//! [`Tapped`] wraps the replay's event source: each batch, before the replay gets it, adds its
//! allocations' features to a queue; the policy takes them in allocation order, so the queue
//! holds one batch at most.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use super::lifetime::{AllocFeatures, RecentCalls};
use crate::stream::{EventBatch, EventSource};
use crate::trace::NO_ALLOC_ID;

/// Values by allocation id, queued in allocation order by a tap on the stream and taken by the
/// policy as the replay reaches each allocation.
#[derive(Debug)]
pub struct ByIdQueue<T>(Mutex<VecDeque<(u32, T)>>);

impl<T> Default for ByIdQueue<T> {
    fn default() -> Self {
        Self(Mutex::new(VecDeque::new()))
    }
}

impl<T: Copy> ByIdQueue<T> {
    /// The value of allocation `id`, taken off the queue with every allocation before it (an
    /// allocation the replay did not ask about leaves nothing behind); `None` when the queue
    /// does not hold it.
    pub fn take(&self, id: u32) -> Option<T> {
        let mut q = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        while q.front().is_some_and(|&(front, _)| front < id) {
            q.pop_front();
        }
        match q.front() {
            Some(&(front, v)) if front == id => {
                q.pop_front();
                Some(v)
            }
            _ => None,
        }
    }

    /// Queues `v` for allocation `id`, after the allocations before it.
    pub fn push(&self, id: u32, v: T) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back((id, v));
    }
}

/// Allocations' features, by allocation id, queued in allocation order.
#[derive(Debug, Default)]
pub struct StreamedFeatures(ByIdQueue<u16>);

impl StreamedFeatures {
    /// The recent calls of allocation `id` ([`ByIdQueue::take`]).
    pub fn take(&self, id: u32) -> Option<u16> {
        self.0.take(id)
    }

    /// The features of `batch`'s allocations, after those of the batches before it.
    fn note(&self, recent: &mut RecentCalls, batch: &EventBatch) {
        let mut q = self.0.0.lock().unwrap_or_else(PoisonError::into_inner);
        for j in 0..batch.len() {
            let Some(e) = batch.row(j) else { continue };
            // `AllocFeatures::from_trace`'s rule, event by event.
            if let Some(r) = recent.note(e.kind, e.size_bytes, e.thread)
                && e.alloc_id != NO_ALLOC_ID
            {
                q.push_back((e.alloc_id, r));
            }
        }
    }
}

/// An event source that queues its allocations' features for a `predictive` replay of it.
pub struct Tapped<'a> {
    inner: &'a mut dyn EventSource,
    recent: RecentCalls,
    out: Arc<StreamedFeatures>,
}

impl<'a> Tapped<'a> {
    /// `inner`, its features queued in `out`.
    pub fn new(inner: &'a mut dyn EventSource, out: Arc<StreamedFeatures>) -> Self {
        Self {
            inner,
            recent: RecentCalls::default(),
            out,
        }
    }
}

impl EventSource for Tapped<'_> {
    fn time_span(&self) -> (i64, i64) {
        self.inner.time_span()
    }

    fn next_batch(&mut self, out: &mut EventBatch) -> Result<bool, String> {
        let more = self.inner.next_batch(out)?;
        self.out.note(&mut self.recent, out);
        Ok(more)
    }
}

/// The keys `predictive` classes allocation `id` of `size_bytes` by, from a stream's features.
#[must_use]
pub fn streamed_keys(
    features: &StreamedFeatures,
    id: u32,
    size_bytes: u64,
) -> super::lifetime::Keys {
    AllocFeatures::keys_of(super::lifetime::NO_SITE, features.take(id), size_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{EventKind, TraceView};

    /// The columns of a trace of three threads with every kind of event, allocation ids dense.
    struct Columns {
        t_ns: Vec<i64>,
        kind: Vec<u8>,
        size: Vec<u64>,
        id: Vec<u32>,
        thread: Vec<u16>,
    }

    fn columns() -> Columns {
        let mut c = Columns {
            t_ns: Vec::new(),
            kind: Vec::new(),
            size: Vec::new(),
            id: Vec::new(),
            thread: Vec::new(),
        };
        let mut live: Vec<(u32, u64)> = Vec::new();
        let mut next_id = 0u32;
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for i in 0..3_000i64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let thread = (x % 3) as u16;
            let size = 8 << ((x >> 8) % 12);
            let (kind, size, id) = match (x >> 20) % 10 {
                0 => (EventKind::AllocFailed, size, NO_ALLOC_ID),
                1 => (EventKind::FreeNull, 0, NO_ALLOC_ID),
                2 => (EventKind::FreeUnknown, 0, NO_ALLOC_ID),
                3 => (EventKind::FreeRequested, size, NO_ALLOC_ID),
                4..=6 if !live.is_empty() => {
                    let (id, size) = live.swap_remove((x >> 32) as usize % live.len());
                    (EventKind::Free, size, id)
                }
                _ => {
                    next_id += 1;
                    live.push((next_id - 1, size));
                    (EventKind::Alloc, size, next_id - 1)
                }
            };
            c.t_ns.push(i);
            c.kind.push(kind as u8);
            c.size.push(size);
            c.id.push(id);
            c.thread.push(thread);
        }
        c
    }

    /// The columns handed out `per_batch` events at a time.
    struct Batches<'a> {
        c: &'a Columns,
        at: usize,
        per_batch: usize,
    }

    impl EventSource for Batches<'_> {
        fn time_span(&self) -> (i64, i64) {
            (0, self.c.t_ns.last().copied().unwrap_or(0))
        }

        fn next_batch(&mut self, out: &mut EventBatch) -> Result<bool, String> {
            out.clear();
            let end = (self.at + self.per_batch).min(self.c.t_ns.len());
            for j in self.at..end {
                let c = self.c;
                out.push(c.t_ns[j], c.kind[j], c.size[j], c.id[j], 0, c.thread[j], 0);
            }
            self.at = end;
            Ok(!out.is_empty())
        }
    }

    /// Through the tap, in batches of 1, 7 and 97 events, every allocation's features are the
    /// ones `from_trace` gives it with the threads, whatever the other kinds of events around
    /// it; an allocation the replay never asks about is passed over.
    #[test]
    fn the_tap_gives_each_allocation_the_features_of_the_whole_trace() {
        let c = columns();
        let view = TraceView::new(&c.t_ns, &c.kind, &c.size, &c.id).unwrap();
        let whole = AllocFeatures::from_trace(&view, Some(&c.thread), None);
        let single = AllocFeatures::from_trace(&view, None, None);
        assert!(whole.recent.len() > 500, "{}", whole.recent.len());
        assert_ne!(whole.recent, single.recent, "the threads matter here");
        for per_batch in [1, 7, 97] {
            for skip_every in [0u32, 3] {
                let mut source = Batches {
                    c: &c,
                    at: 0,
                    per_batch,
                };
                let out = Arc::new(StreamedFeatures::default());
                let mut tapped = Tapped::new(&mut source, Arc::clone(&out));
                let mut batch = EventBatch::default();
                while tapped.next_batch(&mut batch).unwrap() {
                    for j in 0..batch.len() {
                        let id = batch.alloc_id[j];
                        if batch.kind[j] != EventKind::Alloc as u8
                            || (skip_every > 0 && id % skip_every == 0)
                        {
                            continue;
                        }
                        let got = out.take(id);
                        assert_eq!(got, whole.recent.get(id as usize).copied(), "id {id}");
                    }
                }
                // What was queued is all taken or passed over.
                assert!(out.take(u32::MAX - 1).is_none());
            }
        }
    }
}
