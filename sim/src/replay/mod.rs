//! The replay engine: feeds a trace's events to a policy and measures it.
//!
//! [`replay`] walks the events in order: an `Alloc` becomes [`Policy::alloc`], a `Free` becomes
//! [`Policy::free`] of the address its allocation got; the other kinds (free of NULL or of an
//! unknown pointer, failed mallocs) do not reach the policy. A failed allocation is recorded as
//! an [`Oom`] and the run goes on; the later free of that allocation is skipped. After every
//! event the policy's O(1) [`Counters`] feed the downsampled [`Series`] and the exact
//! [`Summary`] scalars; the loop itself allocates nothing per event.
//!
//! Seeking: a `clone_box()` checkpoint of the policy is kept every `checkpoint_every` events, so
//! [`Replay::state_at`] replays at most that many events from the nearest one. Addresses never
//! move, so the id → address table of the full run (4 bytes per allocation when every address
//! fits in 32 bits, else 8: `replay/addrs.rs`) resolves every free of the replayed stretch.
//! Checkpoint memory is bounded by [`ReplayOptions::checkpoint_budget_bytes`]: each checkpoint
//! is charged the policy's estimate of its size ([`Policy::state_bytes`]), and when the total
//! exceeds the budget the interval doubles and every other checkpoint is dropped, so a seek
//! then replays up to twice as many events. A copy that alone would exceed the budget is not
//! made.
//!
//! Where the policy allows it and [`ReplayOptions::layout_index`] asks for it, the replay also
//! keeps a [`LayoutIndex`], from which [`Replay::blocks_at`] gives the block list at any event
//! without replaying; checkpoints then get a 64th of the budget.

use std::time::Instant;

use crate::heap::{Addr, AllocError, Block, Counters, FreeError, Placement, Request};
use crate::layout::LayoutIndex;
use crate::policy::Policy;
use crate::series::{Bucketing, Series};
use crate::trace::{EventKind, TraceView};

mod addrs;
mod live;
mod peaks;
mod run;
pub(crate) use addrs::{AddrLookup, AddrTable};
pub use live::{LIVE_BUCKET_WIDTH_NS, LiveReplay};
pub(crate) use run::Run;
pub use run::STREAM_OOMS_KEPT;
// In `Policy::replay_span`'s signature only: the engine's, not for use elsewhere.
#[doc(hidden)]
pub use run::{Meter, Span};

/// [`ReplayOptions::checkpoint_budget_bytes`]' default, and the most that
/// [`ReplayOptions::checkpoint_min_copies`] raises a budget to.
pub const DEFAULT_CHECKPOINT_BUDGET_BYTES: u64 = 512 << 20;

/// Knobs of a replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Events between policy checkpoints (the longest replay a seek does). Default 16384.
    /// Each checkpoint deep-copies the policy, which costs about `64 · (live allocations + free
    /// blocks) / checkpoint_every` bytes of copying per event; 0 keeps only the initial state,
    /// for runs that never seek (a seek then replays from the first event).
    pub checkpoint_every: usize,
    /// Upper bound on the estimated memory of all checkpoints; the interval doubles past it.
    /// Default 512 MiB.
    pub checkpoint_budget_bytes: u64,
    /// Raises the budget, up to the default 512 MiB, to hold at least this many copies of the
    /// largest state copied so far. Default 0. A budget sized by the trace's length is too
    /// small for a heap that is large for its trace; the explorers ask for 8.
    pub checkpoint_min_copies: u64,
    /// Number of time buckets of the series. Default 2048.
    pub buckets: usize,
    /// Alignment of every request (traces do not record one); should match the policy's
    /// `PolicyConfig::align_bytes`. Default 16.
    pub align_bytes: u64,
    /// Build a [`LayoutIndex`] where the policy allows one, so [`Replay::blocks_at`] answers
    /// without replaying. Default false: only seeking frontends need it.
    pub layout_index: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            checkpoint_every: 16_384,
            checkpoint_budget_bytes: DEFAULT_CHECKPOINT_BUDGET_BYTES,
            checkpoint_min_copies: 0,
            buckets: 2048,
            align_bytes: 16,
            layout_index: false,
        }
    }
}

/// An allocation the policy could not serve: out of memory, or a request it cannot model
/// ([`AllocError::Unsupported`]). Both count as OOM events in the summary and the series.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Oom {
    /// Index of the `Alloc` event.
    pub event: usize,
    /// Its time.
    pub t_ns: i64,
    pub request: Request,
    pub error: AllocError,
    /// The policy's counters when the request failed.
    pub counters_at_failure: Counters,
}

/// A free the policy rejected: a bug in the policy, reported rather than hidden.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreeFailure {
    pub event: usize,
    pub error: FreeError,
}

/// Exact scalars of a replay (not downsampled).
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Events replayed.
    pub events: usize,
    /// Highest footprint after any event.
    pub peak_footprint_bytes: u64,
    /// First event at which the peak footprint was reached (`None` for an empty trace).
    pub peak_footprint_event: Option<usize>,
    /// Footprint after the last event.
    pub final_footprint_bytes: u64,
    /// Highest live bytes (of the allocations the policy served).
    pub peak_live_bytes: u64,
    /// First event at which the peak live bytes were reached.
    pub peak_live_event: Option<usize>,
    /// Highest allocated (reserved) bytes.
    pub peak_allocated_bytes: u64,
    /// Lowest [`crate::metrics::fragmentation`] while the footprint is at its peak: how much
    /// of the peak footprint is wasted at the moment it is best used. (At the first event of the
    /// peak a policy that never shrinks, such as BFC after its first Extend, is nearly empty.)
    pub fragmentation_at_peak: f64,
    /// Event-weighted mean of [`crate::metrics::fragmentation`] over the states after each
    /// event. Event-weighted rather than time-weighted because traced timestamps are coarse
    /// (many events share one) and include the tracer's own pauses.
    pub mean_fragmentation: f64,
    /// Failed allocations (all of them: a streamed replay keeps only the first
    /// [`STREAM_OOMS_KEPT`] in [`Replay::ooms`]).
    pub oom_count: u64,
    /// Wall-clock seconds of the replay loop (policy calls, metrics and checkpoints).
    pub replay_seconds: f64,
    /// `events / replay_seconds`.
    pub events_per_second: f64,
    /// Counters after the last event.
    pub final_counters: Counters,
}

/// Why a seek failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SeekError {
    #[error("event {event} is past the end of the trace ({events} events)")]
    OutOfRange { event: usize, events: usize },
    #[error("trace has {got} events but the replay was made from {expected}")]
    TraceMismatch { expected: usize, got: usize },
    #[error("event {event}: replaying from a checkpoint placed allocation {id} elsewhere")]
    Diverged { event: usize, id: u32 },
    #[error("a replay streamed from a file keeps no checkpoints to seek with")]
    Streamed,
}

#[derive(Clone, Debug)]
struct Checkpoint {
    /// The policy state before this event (after all earlier ones).
    next_event: usize,
    /// Shared, so that the replays a live run hands out ([`LiveReplay::snapshot`]) share its
    /// checkpoints instead of copying them.
    policy: std::sync::Arc<dyn Policy>,
    approx_bytes: u64,
}

/// Marks an allocation that failed, in the id → address table.
pub(crate) const FAILED: Addr = Addr::MAX;

/// The result of replaying one trace through one policy.
#[derive(Clone, Debug)]
pub struct Replay {
    /// The policy's registry name.
    pub policy_name: &'static str,
    pub summary: Summary,
    pub series: Series,
    /// Every failed allocation, in event order (`summary.oom_count` of them).
    pub ooms: Vec<Oom>,
    /// The policy as it was when the first allocation failed.
    pub first_oom_state: Option<Box<dyn Policy>>,
    /// Frees the policy rejected (always empty for a correct policy).
    pub free_failures: Vec<FreeFailure>,
    /// The policy after the last event.
    pub final_state: Box<dyn Policy>,
    checkpoints: Vec<Checkpoint>,
    checkpoint_every: usize,
    addrs: AddrTable,
    align_bytes: u64,
    layout: Option<LayoutIndex>,
    /// Replayed from a stream ([`crate::stream`]): no address table nor checkpoints to seek
    /// with.
    streamed: bool,
}

/// Applies event `i` to `policy`, with the addresses from `addrs` (the allocation's at
/// `slot`). Returns the failure of an
/// allocation, if any; `Ok(Some(placement))` for a served allocation.
#[inline(always)]
pub(crate) fn apply<P: Policy + ?Sized, A: AddrLookup + ?Sized>(
    policy: &mut P,
    code: u8,
    id: u32,
    slot: u32,
    size_bytes: u64,
    align_bytes: u64,
    addrs: &A,
) -> Result<Option<Placement>, Result<AllocError, FreeError>> {
    if code == EventKind::Alloc as u8 {
        let req = Request {
            id,
            size_bytes,
            align_bytes,
        };
        return match crate::policy::alloc_capped(policy, req) {
            Ok(p) => Ok(Some(p)),
            Err(e) => Err(Ok(e)),
        };
    }
    if code == EventKind::Free as u8 {
        let addr = addrs.addr_at(slot);
        if addr != FAILED {
            policy.free(addr).map_err(Err)?;
        }
    }
    Ok(None)
}

/// Replays `trace` through `policy` (see the module docs).
#[must_use]
pub fn replay(trace: &TraceView<'_>, policy: Box<dyn Policy>, opts: &ReplayOptions) -> Replay {
    replay_observed(trace, policy, opts, None)
}

/// Events between two progress updates of [`replay_observed`]: rare enough to cost nothing.
const PROGRESS_EVERY: usize = 1 << 16;

/// [`replay`], storing the number of events replayed so far in `progress` every few tens of
/// thousands of events, so a frontend can show how far a long replay has come.
#[must_use]
pub fn replay_observed(
    trace: &TraceView<'_>,
    policy: Box<dyn Policy>,
    opts: &ReplayOptions,
    progress: Option<&std::sync::atomic::AtomicUsize>,
) -> Replay {
    let never = std::sync::atomic::AtomicBool::new(false);
    replay_cancellable(trace, policy, opts, progress, &never).0
}

/// [`replay_observed`] that stops once `cancel` is set (checked every few thousand events),
/// returning the replay of the events before and `true`: a frontend that moves on to other
/// data ends the replays of the old data instead of letting them finish while it holds their
/// memory.
pub fn replay_cancellable(
    trace: &TraceView<'_>,
    policy: Box<dyn Policy>,
    opts: &ReplayOptions,
    progress: Option<&std::sync::atomic::AtomicUsize>,
    cancel: &std::sync::atomic::AtomicBool,
) -> (Replay, bool) {
    // In memory, allocation ids are dense: each has its own slot of the address table.
    let all = Span::of_trace(trace);
    let bucketing = Bucketing::for_trace(trace, opts.buckets);
    replay_all(trace, all, policy, opts, bucketing, progress, cancel)
}

/// [`replay`] into the buckets of `bucketing` instead of the trace's own span: a trace that
/// was followed while it was written is drawn in the buckets its live replays grew into
/// ([`LiveReplay`]), and a policy replayed once it ended joins them there.
#[must_use]
pub fn replay_with_bucketing(
    trace: &TraceView<'_>,
    policy: Box<dyn Policy>,
    opts: &ReplayOptions,
    bucketing: Bucketing,
) -> Replay {
    let all = Span::of_trace(trace);
    let never = std::sync::atomic::AtomicBool::new(false);
    replay_all(trace, all, policy, opts, bucketing, None, &never).0
}

/// The loop of [`replay_cancellable`] over `all`, the whole of `trace`, into `bucketing`.
fn replay_all(
    trace: &TraceView<'_>,
    all: Span<'_>,
    policy: Box<dyn Policy>,
    opts: &ReplayOptions,
    bucketing: Bucketing,
    progress: Option<&std::sync::atomic::AtomicUsize>,
    cancel: &std::sync::atomic::AtomicBool,
) -> (Replay, bool) {
    let n = all.len();
    let mut run = Run::new(policy, opts, bucketing, trace.num_allocs as usize, Some(n));
    let started = Instant::now();
    let mut from = 0;
    while from < n {
        if cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return (
                run.finish(from, started.elapsed().as_secs_f64(), false),
                true,
            );
        }
        if let Some(p) = progress {
            p.store(from, std::sync::atomic::Ordering::Relaxed);
        }
        let to = (from + PROGRESS_EVERY).min(n);
        run.run(&all.part(from, to));
        from = to;
    }
    if let Some(p) = progress {
        p.store(n, std::sync::atomic::Ordering::Relaxed);
    }
    (run.finish(n, started.elapsed().as_secs_f64(), false), false)
}

impl Replay {
    /// The current checkpoint interval (the configured one, doubled while over budget): the
    /// most events a seek replays.
    #[must_use]
    pub fn checkpoint_every(&self) -> usize {
        self.checkpoint_every
    }

    /// Number of checkpoints kept.
    #[must_use]
    pub fn checkpoint_count(&self) -> usize {
        self.checkpoints.len()
    }

    /// Where allocation `id` was placed; `None` when it failed or is not in the trace.
    #[must_use]
    pub fn addr_of(&self, id: u32) -> Option<Addr> {
        if self.streamed {
            return None;
        }
        Some(self.addrs.addr_at(id)).filter(|&a| a != FAILED)
    }

    /// Fills `out` with the blocks just after `event` from the layout index, without
    /// replaying, and returns the counters; `None` when the replay has no index (see
    /// [`ReplayOptions::layout_index`]) or `event` is past the end.
    pub fn blocks_at(&self, event: usize, out: &mut Vec<Block>) -> Option<Counters> {
        if event >= self.summary.events {
            return None;
        }
        self.layout.as_ref()?.blocks_at(event, out)
    }

    /// [`LayoutIndex::fold_blocks_at`]: the blocks just after `event` passed to sinks instead
    /// of listed; `None` as for [`Self::blocks_at`].
    pub fn fold_blocks_at<A, B>(
        &self,
        event: usize,
        first: &mut A,
        second: impl FnOnce(u64) -> B + Send,
    ) -> Option<(Option<B>, Counters)>
    where
        A: crate::layout::BlockSink + Send,
        B: crate::layout::BlockSink + Send,
    {
        if event >= self.summary.events {
            return None;
        }
        self.layout.as_ref()?.fold_blocks_at(event, first, second)
    }

    /// [`LayoutIndex::held_bytes_at`]; `None` without an index or past the end.
    #[must_use]
    pub fn held_bytes_at(&self, event: usize) -> Option<u64> {
        if event >= self.summary.events {
            return None;
        }
        self.layout.as_ref()?.held_bytes_at(event)
    }

    /// [`LayoutIndex::block_at_offset`]; `None` without an index or past the end.
    #[must_use]
    pub fn block_at_offset(&self, event: usize, offset: u64) -> Option<Block> {
        if event >= self.summary.events {
            return None;
        }
        self.layout.as_ref()?.block_at_offset(event, offset)
    }

    /// The layout index, when the replay keeps one.
    #[must_use]
    pub fn layout_index(&self) -> Option<&LayoutIndex> {
        self.layout.as_ref()
    }

    /// Whether [`Self::blocks_at`] can answer.
    #[must_use]
    pub fn has_layout_index(&self) -> bool {
        self.layout.is_some()
    }

    /// The policy before the first event.
    #[must_use]
    pub fn initial_state(&self) -> Box<dyn Policy> {
        self.checkpoints
            .first()
            .map_or_else(|| self.final_state.clone_box(), |c| c.policy.clone_box())
    }

    /// The policy state just after `event` and its counters, replaying at most
    /// [`Self::checkpoint_every`] events from the nearest checkpoint.
    ///
    /// # Errors
    /// When `event` is past the end, `trace` is not the replayed trace, or the policy turns
    /// out not to be deterministic.
    pub fn state_at(
        &self,
        trace: &TraceView<'_>,
        event: usize,
    ) -> Result<(Box<dyn Policy>, Counters), SeekError> {
        let events = self.summary.events;
        if self.streamed {
            return Err(SeekError::Streamed);
        }
        if trace.len() != events {
            return Err(SeekError::TraceMismatch {
                expected: events,
                got: trace.len(),
            });
        }
        if event >= events {
            return Err(SeekError::OutOfRange { event, events });
        }
        if event + 1 == events {
            let policy = self.final_state.clone_box();
            let counters = policy.counters();
            return Ok((policy, counters));
        }
        let k = self
            .checkpoints
            .partition_point(|c| c.next_event <= event)
            .saturating_sub(1);
        let (mut policy, from) = match self.checkpoints.get(k) {
            Some(c) => (c.policy.clone_box(), c.next_event),
            None => return Err(SeekError::OutOfRange { event, events }),
        };
        let stretch = trace
            .kind
            .iter()
            .zip(trace.alloc_id)
            .zip(trace.size_bytes)
            .enumerate()
            .take(event + 1)
            .skip(from);
        for (i, ((&code, &id), &size)) in stretch {
            match apply(
                policy.as_mut(),
                code,
                id,
                id,
                size,
                self.align_bytes,
                &self.addrs,
            ) {
                Ok(Some(p)) if self.addr_of(id) == Some(p.addr) => {}
                Ok(None) => {}
                // A failure that the full run also saw replays identically.
                Err(Ok(_)) if self.addr_of(id).is_none() => {}
                _ => return Err(SeekError::Diverged { event: i, id }),
            }
        }
        let counters = policy.counters();
        Ok((policy, counters))
    }
}

#[cfg(test)]
mod tests;
