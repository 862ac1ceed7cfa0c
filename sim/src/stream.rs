//! Replaying a trace that is not in memory: events come in batches from an [`EventSource`]
//! (a binary trace decoded block by block), and [`replay_stream`] feeds them to the policy
//! with the same loop as the in-memory replay ([`crate::replay`]), so the figures are the same.
//!
//! What a replay holds must not grow with the trace: the address table is indexed by *slot*,
//! a small number the source gives each allocation and reuses once it is freed (so the table
//! has as many entries as the most allocations ever live at once), the series has a fixed
//! number of buckets, only the initial state is kept as a checkpoint, and at most
//! [`STREAM_OOMS_KEPT`] failed allocations are kept in full (all are counted).

use std::time::Instant;

use crate::policy::Policy;
use crate::replay::{ReplayOptions, Replay, Run};
pub use crate::replay::STREAM_OOMS_KEPT;
use crate::series::Bucketing;

/// A batch of events, in trace order: the columns of [`crate::trace::TraceView`] and each
/// event's slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventBatch {
    pub t_ns: Vec<i64>,
    pub kind: Vec<u8>,
    pub size_bytes: Vec<u64>,
    pub alloc_id: Vec<u32>,
    /// For an `Alloc` and its `Free`: a number no other live allocation has, reused after the
    /// free ([`crate::trace::NO_ALLOC_ID`] for the other kinds).
    pub slot: Vec<u32>,
    /// Thread index of each event.
    pub thread: Vec<u16>,
}

impl EventBatch {
    /// Empties the batch, keeping its buffers.
    pub fn clear(&mut self) {
        self.t_ns.clear();
        self.kind.clear();
        self.size_bytes.clear();
        self.alloc_id.clear();
        self.slot.clear();
        self.thread.clear();
    }

    /// Number of events.
    #[must_use]
    pub fn len(&self) -> usize {
        self.kind.len()
    }

    /// True when the batch holds no event.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.kind.is_empty()
    }

    /// Appends one event.
    pub fn push(&mut self, t_ns: i64, kind: u8, size_bytes: u64, alloc_id: u32, slot: u32, thread: u16) {
        self.t_ns.push(t_ns);
        self.kind.push(kind);
        self.size_bytes.push(size_bytes);
        self.alloc_id.push(alloc_id);
        self.slot.push(slot);
        self.thread.push(thread);
    }
}

/// Where a streaming replay gets its events.
pub trait EventSource {
    /// Time of the first event and of the last one (what the in-memory replay's time buckets
    /// span), known before the events are read.
    fn time_span(&self) -> (i64, i64);

    /// Fills `out` (cleared first) with the next events; `Ok(false)` once there are none.
    ///
    /// # Errors
    /// When the events cannot be read.
    fn next_batch(&mut self, out: &mut EventBatch) -> Result<bool, String>;
}

/// Replays the events of `source` through `policy` in one pass, block by block (see the module
/// docs), storing the events replayed so far in `progress` after each batch. The replay cannot
/// seek ([`Replay::state_at`] says so): its figures, series and final state are those of
/// [`crate::replay::replay`] on the same events.
///
/// # Errors
/// When the source fails.
pub fn replay_stream(
    source: &mut dyn EventSource,
    policy: Box<dyn Policy>,
    opts: &ReplayOptions,
    progress: Option<&std::sync::atomic::AtomicUsize>,
) -> Result<Replay, String> {
    let (t0_ns, t_last_ns) = source.time_span();
    let bucketing = Bucketing::for_span(t0_ns, t_last_ns, opts.buckets);
    let mut run = Run::new(policy, opts, bucketing, 0, None);
    let mut batch = EventBatch::default();
    let mut i = 0usize;
    let started = Instant::now();
    while source.next_batch(&mut batch)? {
        let events = batch
            .kind
            .iter()
            .zip(&batch.alloc_id)
            .zip(&batch.slot)
            .zip(&batch.size_bytes)
            .zip(&batch.t_ns);
        for ((((&code, &id), &slot), &size), &t) in events {
            run.step(i, code, id, slot, size, t);
            i += 1;
        }
        if let Some(p) = progress {
            p.store(i, std::sync::atomic::Ordering::Relaxed);
        }
    }
    Ok(run.finish(i, started.elapsed().as_secs_f64(), true))
}
