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
use super::tokens::token_of;
use crate::stream::{EventBatch, EventSource};
use crate::trace::{EventKind, NO_ALLOC_ID};

/// Allocations' features, by allocation id, queued in allocation order.
#[derive(Debug, Default)]
pub struct StreamedFeatures {
    queue: Mutex<VecDeque<(u32, u16)>>,
}

impl StreamedFeatures {
    /// The recent calls of allocation `id`, taken off the queue with every allocation before
    /// it (an allocation the replay did not ask about leaves nothing behind); `None` when the
    /// queue does not hold it.
    pub fn take(&self, id: u32) -> Option<u16> {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        while q.front().is_some_and(|&(front, _)| front < id) {
            q.pop_front();
        }
        match q.front() {
            Some(&(front, recent)) if front == id => {
                q.pop_front();
                Some(recent)
            }
            _ => None,
        }
    }

    /// The features of `batch`'s allocations, after those of the batches before it.
    fn note(&self, recent: &mut RecentCalls, batch: &EventBatch) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        for j in 0..batch.len() {
            let Some(e) = batch.row(j) else { continue };
            let Some(kind) = EventKind::from_code(e.kind) else {
                continue;
            };
            if kind == EventKind::Alloc && e.alloc_id != NO_ALLOC_ID {
                q.push_back((e.alloc_id, recent.get(e.thread)));
            }
            if let Some(tok) = token_of(kind, e.size_bytes) {
                recent.push(e.thread, tok);
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
