//! Replaying a trace that is not in memory: events come in batches from an [`EventSource`]
//! (a binary trace decoded block by block), and [`replay_stream`] feeds them to the policy
//! with the same loop as the in-memory replay ([`crate::replay`]), so the figures are the same.
//!
//! What a replay holds must not grow with the trace: the address table is indexed by *slot*,
//! a small number the source gives each allocation and reuses once it is freed (so the table
//! has as many entries as the most allocations ever live at once), the series has a fixed
//! number of buckets, only the initial state is kept as a checkpoint, and at most
//! [`STREAM_OOMS_KEPT`] failed allocations are kept in full (all are counted).

pub mod packed;
pub mod window;

use std::time::Instant;

use crate::policy::Policy;
pub use crate::replay::STREAM_OOMS_KEPT;
use crate::replay::{Replay, ReplayOptions, Run};
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
    /// The pointer of each event (what the file says; 0 where it says nothing).
    pub addr: Vec<u64>,
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
        self.addr.clear();
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

    /// Event `j`, if the batch has it.
    #[must_use]
    pub fn row(&self, j: usize) -> Option<EventRow> {
        Some(EventRow {
            t_ns: *self.t_ns.get(j)?,
            kind: *self.kind.get(j)?,
            size_bytes: *self.size_bytes.get(j)?,
            alloc_id: *self.alloc_id.get(j)?,
            slot: *self.slot.get(j)?,
            thread: *self.thread.get(j)?,
            addr: self.addr.get(j).copied().unwrap_or(0),
        })
    }

    /// Appends one event.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        t_ns: i64,
        kind: u8,
        size_bytes: u64,
        alloc_id: u32,
        slot: u32,
        thread: u16,
        addr: u64,
    ) {
        self.t_ns.push(t_ns);
        self.kind.push(kind);
        self.size_bytes.push(size_bytes);
        self.alloc_id.push(alloc_id);
        self.slot.push(slot);
        self.thread.push(thread);
        self.addr.push(addr);
    }
}

impl EventBatch {
    /// Appends `e`.
    pub fn push_row(&mut self, e: &EventRow) {
        self.push(
            e.t_ns,
            e.kind,
            e.size_bytes,
            e.alloc_id,
            e.slot,
            e.thread,
            e.addr,
        );
    }
}

/// One event of an [`EventBatch`] (its columns' values at one row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventRow {
    pub t_ns: i64,
    pub kind: u8,
    pub size_bytes: u64,
    pub alloc_id: u32,
    pub slot: u32,
    pub thread: u16,
    pub addr: u64,
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
    replay_stream_until(source, policy, opts, progress, usize::MAX)
}

/// [`replay_stream`] up to event `last_event` included (the state there is the replay's
/// `final_state`: the heap at one moment, without seeking); the rest of the source is left
/// unread.
///
/// # Errors
/// When the source fails.
pub fn replay_stream_until(
    source: &mut dyn EventSource,
    policy: Box<dyn Policy>,
    opts: &ReplayOptions,
    progress: Option<&std::sync::atomic::AtomicUsize>,
    last_event: usize,
) -> Result<Replay, String> {
    let (t0_ns, t_last_ns) = source.time_span();
    let bucketing = Bucketing::for_span(t0_ns, t_last_ns, opts.buckets);
    let mut run = Run::new(policy, opts, bucketing, 0, None);
    let mut batch = EventBatch::default();
    let mut i = 0usize;
    let started = Instant::now();
    while i <= last_event && source.next_batch(&mut batch)? {
        let span = crate::replay::Span::new(
            i,
            &batch.kind,
            &batch.alloc_id,
            Some(&batch.slot),
            &batch.size_bytes,
            &batch.t_ns,
        );
        let len = span
            .len()
            .min(last_event.saturating_sub(i).saturating_add(1));
        run.run(&span.part(0, len));
        i += len;
        if let Some(p) = progress {
            p.store(i, std::sync::atomic::Ordering::Relaxed);
        }
    }
    Ok(run.finish(i, started.elapsed().as_secs_f64(), true))
}

/// An [`EventSource`] read ahead on its own thread: the next batches are decoded while the
/// replay works on the current one, so decoding costs a core rather than replay time.
pub struct Prefetched<S> {
    span: (i64, i64),
    batches: std::sync::mpsc::Receiver<Result<EventBatch, String>>,
    /// Batches handed back for reuse, so the reader allocates nothing per batch.
    spent: std::sync::mpsc::SyncSender<EventBatch>,
    reader: Option<std::thread::JoinHandle<S>>,
}

/// Batches read ahead.
const PREFETCH_BATCHES: usize = 2;

impl<S: EventSource + Send + 'static> Prefetched<S> {
    /// Starts reading `source` on a thread of its own.
    pub fn start(mut source: S) -> Self {
        let span = source.time_span();
        let (send, batches) = std::sync::mpsc::sync_channel(PREFETCH_BATCHES);
        let (spent, returned) = std::sync::mpsc::sync_channel::<EventBatch>(PREFETCH_BATCHES + 2);
        let reader = std::thread::spawn(move || {
            loop {
                let mut batch = returned.try_recv().unwrap_or_default();
                let next = match source.next_batch(&mut batch) {
                    Ok(true) => Ok(batch),
                    Ok(false) => break,
                    Err(e) => Err(e),
                };
                let failed = next.is_err();
                // The replay has stopped listening (it failed): stop too.
                if send.send(next).is_err() || failed {
                    break;
                }
            }
            source
        });
        Self {
            span,
            batches,
            spent,
            reader: Some(reader),
        }
    }

    /// Waits for the reader and gives the source back (with whatever it counted), `None` if
    /// its thread panicked.
    pub fn finish(mut self) -> Option<S> {
        // Unblock a reader waiting to send: nothing more is read.
        let (_, unused) = std::sync::mpsc::sync_channel(0);
        drop(std::mem::replace(&mut self.batches, unused));
        self.reader.take()?.join().ok()
    }
}

impl<S> EventSource for Prefetched<S> {
    fn time_span(&self) -> (i64, i64) {
        self.span
    }

    fn next_batch(&mut self, out: &mut EventBatch) -> Result<bool, String> {
        match self.batches.recv() {
            Ok(Ok(batch)) => {
                let spent = std::mem::replace(out, batch);
                // A full return queue only means the reader has buffers enough.
                let _ = self.spent.try_send(spent);
                Ok(true)
            }
            Ok(Err(e)) => Err(e),
            // The reader has finished.
            Err(_) => {
                out.clear();
                Ok(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::config::PolicyConfig;
    use crate::policy::registry::build;
    use crate::replay::replay;
    use crate::trace::{EventKind, OwnedTrace};

    /// An owned trace handed out `per_batch` events at a time, slots as the loader gives them.
    struct Batches {
        trace: OwnedTrace,
        slots: Vec<u32>,
        at: usize,
        per_batch: usize,
    }

    impl Batches {
        fn new(trace: OwnedTrace, per_batch: usize) -> Self {
            let (mut free, mut next, mut by_id) =
                (Vec::new(), 0u32, std::collections::HashMap::new());
            let mut slots = Vec::new();
            for (&k, &id) in trace.kind.iter().zip(&trace.alloc_id) {
                if k == EventKind::Alloc as u8 {
                    let s = free.pop().unwrap_or_else(|| {
                        next += 1;
                        next - 1
                    });
                    by_id.insert(id, s);
                    slots.push(s);
                } else {
                    let s = by_id.remove(&id).unwrap();
                    free.push(s);
                    slots.push(s);
                }
            }
            Self {
                trace,
                slots,
                at: 0,
                per_batch,
            }
        }
    }

    impl EventSource for Batches {
        fn time_span(&self) -> (i64, i64) {
            (self.trace.t_ns[0], *self.trace.t_ns.last().unwrap())
        }

        fn next_batch(&mut self, out: &mut EventBatch) -> Result<bool, String> {
            out.clear();
            let end = (self.at + self.per_batch).min(self.trace.kind.len());
            for i in self.at..end {
                let t = &self.trace;
                out.push(
                    t.t_ns[i],
                    t.kind[i],
                    t.size_bytes[i],
                    t.alloc_id[i],
                    self.slots[i],
                    0,
                    0,
                );
            }
            self.at = end;
            Ok(!out.is_empty())
        }
    }

    #[test]
    fn a_prefetched_streamed_replay_equals_the_in_memory_one() {
        // Allocations freed out of order, so that slots are reused while others stay live.
        let mut t = OwnedTrace::new();
        let mut live = Vec::new();
        for i in 0..3000i64 {
            live.push(t.alloc(i * 10, (i as u64 * 7919) % 5000 + 1));
            if i % 3 == 2 {
                let victim = live.swap_remove((i as usize * 31) % live.len());
                t.free(i * 10 + 5, victim);
            }
        }
        let view = t.view().unwrap();
        let config = PolicyConfig::default();
        let opts = ReplayOptions::default();
        let loaded = replay(&view, build("best-fit", &config, &view).unwrap(), &opts);
        let mut source = Prefetched::start(Batches::new(t.clone(), 97));
        let streamed = replay_stream(
            &mut source,
            build("best-fit", &config, &view).unwrap(),
            &opts,
            None,
        )
        .unwrap();
        let back = source.finish().unwrap();
        assert_eq!(back.at, t.kind.len());
        assert_eq!(streamed.summary.events, loaded.summary.events);
        assert_eq!(
            streamed.summary.peak_footprint_bytes,
            loaded.summary.peak_footprint_bytes
        );
        assert_eq!(
            streamed.summary.mean_fragmentation.to_bits(),
            loaded.summary.mean_fragmentation.to_bits()
        );
        assert_eq!(streamed.series, loaded.series);
        assert_eq!(
            streamed.final_state.counters(),
            loaded.final_state.counters()
        );
        assert!(matches!(
            streamed.state_at(&view, 5),
            Err(crate::replay::SeekError::Streamed)
        ));
    }
}
