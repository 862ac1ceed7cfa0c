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

use crate::layout::LayoutIndex;
use crate::policy::{Addr, AllocError, Block, Counters, FreeError, Placement, Policy, Request};
use crate::series::{Bucketing, Series};
use crate::trace::{EventKind, TraceView};

mod addrs;
mod peaks;
mod run;
pub(crate) use addrs::{AddrLookup, AddrTable};
pub(crate) use run::Run;
pub use run::STREAM_OOMS_KEPT;
// In `Policy::replay_span`'s signature only: the engine's, not for use elsewhere.
#[doc(hidden)]
pub use run::{Meter, Span};

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
            checkpoint_budget_bytes: 512 << 20,
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
    policy: Box<dyn Policy>,
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
    let all = Span::new(
        0,
        trace.kind,
        trace.alloc_id,
        None,
        trace.size_bytes,
        trace.t_ns,
    );
    let n = all.len();
    let bucketing = Bucketing::for_trace(trace, opts.buckets);
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
mod tests {
    use super::*;
    use crate::policy::registry::{PolicyConfig, build};
    use crate::trace::OwnedTrace;

    fn sample_trace() -> OwnedTrace {
        let mut t = OwnedTrace::new();
        let a = t.alloc(0, 100); // first fit: [0, 112)
        let b = t.alloc(10, 200); // [112, 320)
        t.free(20, a);
        let c = t.alloc(30, 50); // reuses [0, 64)
        t.free(40, b);
        t.free(50, c);
        t
    }

    #[test]
    fn fragmentation_at_peak_is_taken_where_the_peak_is_best_used() {
        let mut t = OwnedTrace::new();
        let a = t.alloc(0, 100); // [0, 112)
        t.alloc(1, 200); // [112, 320): peak footprint 320 first reached with 300 live
        t.free(2, a);
        t.alloc(3, 112); // [0, 112) again: 312 live in the same 320
        let view = t.view().unwrap();
        let policy = build("first-fit", &PolicyConfig::default(), &view).unwrap();
        let r = replay(&view, policy, &ReplayOptions::default());
        assert_eq!(r.summary.peak_footprint_bytes, 320);
        assert_eq!(r.summary.peak_footprint_event, Some(1));
        assert!((r.summary.fragmentation_at_peak - (1.0 - 312.0 / 320.0)).abs() < 1e-12);
    }

    /// A policy whose copy alone would overrun the checkpoint budget is not copied past the
    /// initial state, and seeks still work (from the start).
    #[test]
    fn a_copy_bigger_than_the_budget_is_not_made() {
        let mut t = OwnedTrace::new();
        // 200 top-level buddy blocks of 64 MiB, each filled with one block of every order from
        // 32 MiB down and two of 256 B: every order's bitmap reaches 12.5 GiB of addresses.
        let mut at = 0i64;
        for _ in 0..200 {
            for order in (0..18).rev() {
                t.alloc(at, 256u64 << order);
                at += 1;
            }
            t.alloc(at, 256);
            at += 1;
        }
        let view = t.view().unwrap();
        let policy = build("buddy", &PolicyConfig::default(), &view).unwrap();
        let opts = ReplayOptions {
            checkpoint_every: 1,
            checkpoint_budget_bytes: 1 << 20,
            ..ReplayOptions::default()
        };
        let r = replay(&view, policy, &opts);
        assert!(
            r.final_state.state_bytes() > 1 << 20,
            "the bitmaps outgrow the budget"
        );
        // 64 bytes per live allocation would charge the last state under 300 KB.
        assert!(r.final_state.counters().live_allocs * 64 < 300 << 10);
        let real: u64 = r.checkpoints.iter().map(|c| c.policy.state_bytes()).sum();
        assert!(real <= 1 << 20, "checkpoints hold {real} bytes");
        let (_, c) = r.state_at(&view, 150).unwrap();
        assert_eq!(c.live_allocs, 151);
        assert_eq!(r.summary.final_footprint_bytes, 200 * (64 << 20));
    }

    #[test]
    fn replays_first_fit_with_exact_scalars() {
        let owned = sample_trace();
        let view = owned.view().unwrap();
        let policy = build("first-fit", &PolicyConfig::default(), &view).unwrap();
        let opts = ReplayOptions {
            checkpoint_every: 2,
            buckets: 3,
            ..ReplayOptions::default()
        };
        let r = replay(&view, policy, &opts);
        let s = &r.summary;
        assert_eq!(s.events, 6);
        assert_eq!(s.peak_footprint_bytes, 320);
        assert_eq!(s.peak_footprint_event, Some(1));
        assert_eq!(s.final_footprint_bytes, 0);
        assert_eq!(s.peak_live_bytes, 300);
        assert_eq!(s.peak_allocated_bytes, 112 + 208);
        assert!((s.fragmentation_at_peak - (1.0 - 300.0 / 320.0)).abs() < 1e-12);
        assert_eq!(s.oom_count, 0);
        // (live, footprint) after each event: (100, 112), (300, 320), (200, 320), (250, 320),
        // (50, 64), (0, 0).
        let by_hand =
            (12.0 / 112.0 + 20.0 / 320.0 + 120.0 / 320.0 + 70.0 / 320.0 + 14.0 / 64.0) / 6.0;
        assert!((s.mean_fragmentation - by_hand).abs() < 1e-12);
        assert_eq!(r.addr_of(2), Some(0));
        assert_eq!(r.series.len(), 3);
        assert_eq!(r.series.footprint_bytes.max, vec![320, 320, 64]);
        assert_eq!(r.series.footprint_bytes.last, vec![320, 320, 0]);
        assert_eq!(r.checkpoint_count(), 3);

        for event in 0..6 {
            let (_, from_seek) = r.state_at(&view, event).unwrap();
            let mut fresh = build("first-fit", &PolicyConfig::default(), &view).unwrap();
            let mut addrs = vec![FAILED; 3];
            for i in 0..=event {
                let out = apply(
                    fresh.as_mut(),
                    view.kind[i],
                    view.alloc_id[i],
                    view.alloc_id[i],
                    view.size_bytes[i],
                    16,
                    addrs.as_slice(),
                );
                if let Ok(Some(a)) = out {
                    addrs[view.alloc_id[i] as usize] = a.addr;
                }
            }
            assert_eq!(from_seek, fresh.counters(), "event {event}");
        }
        assert!(matches!(
            r.state_at(&view, 6),
            Err(SeekError::OutOfRange { .. })
        ));
    }

    /// The replay, which measures stretches of events in runs of one time bucket, gives the
    /// series and the summary that event-by-event shadows give on the states after each event
    /// (one fresh policy replayed by hand): for traces longer than a stretch, with checkpoints
    /// cutting the spans, out-of-memory failures, and times that stall.
    #[test]
    fn the_replay_measures_as_event_by_event_shadows_do() {
        use crate::replay::peaks::tests::shadow as peaks_shadow;
        use crate::series::State;
        use crate::series::tests::shadow as series_shadow;

        let mut t = OwnedTrace::new();
        let (mut x, mut live, mut time) = (12345u64, Vec::new(), 0i64);
        for _ in 0..1500 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            time += (x >> 61) as i64;
            if x % 3 != 0 || live.is_empty() {
                live.push(t.alloc(time, 1 + (x >> 20) % 70_000));
            } else {
                let id = live.swap_remove((x >> 7) as usize % live.len());
                t.free(time, id);
            }
        }
        let view = t.view().unwrap();
        for (name, limit) in [
            ("first-fit", None),
            ("best-fit", Some(3 << 20)),
            ("bfc", Some(4 << 20)),
            ("buddy", Some(8 << 20)),
            ("glibc", None),
        ] {
            let config = PolicyConfig {
                limit_bytes: limit,
                ..PolicyConfig::default()
            };
            let opts = ReplayOptions {
                checkpoint_every: 97,
                buckets: 37,
                ..ReplayOptions::default()
            };
            let r = replay(&view, build(name, &config, &view).unwrap(), &opts);
            let mut fresh = build(name, &config, &view).unwrap();
            let mut addrs = vec![FAILED; view.num_allocs as usize];
            let mut states = Vec::new();
            for i in 0..view.kind.len() {
                let id = view.alloc_id[i];
                let out = apply(
                    fresh.as_mut(),
                    view.kind[i],
                    id,
                    id,
                    view.size_bytes[i],
                    opts.align_bytes,
                    addrs.as_slice(),
                );
                if let Ok(Some(p)) = out {
                    addrs[id as usize] = p.addr;
                }
                states.push(State::of(&fresh.counters(), matches!(out, Err(Ok(_)))));
            }
            let ooms = states.iter().filter(|s| s.failed).count();
            assert_eq!(r.summary.oom_count, ooms as u64, "{name}");
            assert_eq!(
                limit.is_some(),
                ooms > 0,
                "{name}: the limits are meant to bind"
            );
            let b = Bucketing::for_trace(&view, opts.buckets);
            assert_eq!(r.series, series_shadow(b, view.t_ns, &states), "{name}");
            let (fp, fp_event, live_at, live, live_event, allocated, frag) = peaks_shadow(&states);
            let s = &r.summary;
            assert_eq!(
                (s.peak_footprint_bytes, s.peak_footprint_event),
                (fp, fp_event),
                "{name}"
            );
            assert_eq!(
                (s.peak_live_bytes, s.peak_live_event),
                (live, live_event),
                "{name}"
            );
            assert_eq!(s.peak_allocated_bytes, allocated, "{name}");
            let at_peak = crate::metrics::fragmentation(&Counters {
                live_bytes: live_at,
                footprint_bytes: fp,
                ..Counters::default()
            });
            assert_eq!(
                s.fragmentation_at_peak.to_bits(),
                at_peak.to_bits(),
                "{name}"
            );
            let mean = frag / view.kind.len() as f64;
            assert_eq!(s.mean_fragmentation.to_bits(), mean.to_bits(), "{name}");
            assert_eq!(s.final_counters, fresh.counters(), "{name}");
            for id in 0..view.num_allocs {
                assert_eq!(
                    r.addr_of(id),
                    Some(addrs[id as usize]).filter(|&a| a != FAILED),
                    "{name}"
                );
            }
        }
    }

    /// Addresses that pass 4 GiB midway widen the replay's address table without losing the
    /// addresses placed before: every free still finds its block, and the table answers for
    /// each allocation.
    #[test]
    fn addresses_past_4_gib_widen_the_table_midway() {
        let mut t = OwnedTrace::new();
        let small = t.alloc(0, 64);
        let big = t.alloc(1, 5 << 30);
        let high = t.alloc(2, 64);
        t.free(3, small);
        t.free(4, high);
        t.free(5, big);
        let view = t.view().unwrap();
        let r = replay(
            &view,
            build("first-fit", &PolicyConfig::default(), &view).unwrap(),
            &ReplayOptions::default(),
        );
        assert!(r.free_failures.is_empty());
        assert_eq!(r.summary.final_counters.live_allocs, 0);
        assert_eq!(r.addr_of(small), Some(0));
        assert_eq!(r.addr_of(big), Some(64));
        assert_eq!(r.addr_of(high), Some(64 + (5 << 30)));
    }

    /// A cancelled replay stops at its next check and says so; one never cancelled is the
    /// plain replay.
    #[test]
    fn a_cancelled_replay_stops() {
        let mut t = OwnedTrace::new();
        for i in 0..3 * PROGRESS_EVERY as i64 {
            let id = t.alloc(i, 16);
            t.free(i, id);
        }
        let view = t.view().unwrap();
        let config = PolicyConfig::default();
        let opts = ReplayOptions::default();
        let cancel = std::sync::atomic::AtomicBool::new(true);
        let (r, cancelled) = replay_cancellable(
            &view,
            build("first-fit", &config, &view).unwrap(),
            &opts,
            None,
            &cancel,
        );
        assert!(cancelled);
        assert_eq!(r.summary.events, 0);
        cancel.store(false, std::sync::atomic::Ordering::Relaxed);
        let (whole, cancelled) = replay_cancellable(
            &view,
            build("first-fit", &config, &view).unwrap(),
            &opts,
            None,
            &cancel,
        );
        assert!(!cancelled);
        assert_eq!(whole.summary.events, view.len());
    }

    #[test]
    fn failed_allocations_are_recorded_and_their_frees_skipped() {
        let mut t = OwnedTrace::new();
        let a = t.alloc(0, 64);
        let big = t.alloc(1, 1000);
        let c = t.alloc(2, 32);
        t.free(3, big);
        t.free(4, a);
        t.free(5, c);
        let view = t.view().unwrap();
        let config = PolicyConfig {
            limit_bytes: Some(256),
            ..PolicyConfig::default()
        };
        let policy = build("best-fit", &config, &view).unwrap();
        let r = replay(&view, policy, &ReplayOptions::default());
        assert_eq!(r.ooms.len(), 1);
        let oom = &r.ooms[0];
        assert_eq!(oom.event, 1);
        assert_eq!(oom.request.size_bytes, 1000);
        assert_eq!(oom.counters_at_failure.live_bytes, 64);
        assert!(matches!(oom.error, AllocError::OutOfMemory { .. }));
        let first = r.first_oom_state.as_ref().unwrap();
        assert_eq!(first.counters().footprint_bytes, 64);
        assert!(r.free_failures.is_empty());
        assert_eq!(r.addr_of(big), None);
        assert_eq!(r.addr_of(c), Some(64));
        assert_eq!(r.summary.oom_count, 1);
        assert_eq!(r.series.ooms.iter().sum::<u64>(), 1);
        assert_eq!(r.summary.final_counters, Counters::default());
        let (_, c3) = r.state_at(&view, 3).unwrap();
        assert_eq!(c3.live_bytes, 96);
    }

    #[test]
    fn zero_interval_keeps_only_the_initial_state() {
        let owned = sample_trace();
        let view = owned.view().unwrap();
        let policy = build("best-fit", &PolicyConfig::default(), &view).unwrap();
        let opts = ReplayOptions {
            checkpoint_every: 0,
            ..ReplayOptions::default()
        };
        let r = replay(&view, policy, &opts);
        assert_eq!(r.checkpoint_count(), 1);
        assert_eq!(r.checkpoint_every(), 6);
        let (_, c) = r.state_at(&view, 3).unwrap();
        assert_eq!(c.live_bytes, 250);
    }

    #[test]
    fn checkpoint_budget_thins_checkpoints() {
        let mut t = OwnedTrace::new();
        for i in 0..1000 {
            t.alloc(i, 16);
        }
        let view = t.view().unwrap();
        let policy = build("first-fit", &PolicyConfig::default(), &view).unwrap();
        let opts = ReplayOptions {
            checkpoint_every: 10,
            // Room for a few thousand estimated bytes only.
            checkpoint_budget_bytes: 20_000,
            ..ReplayOptions::default()
        };
        let r = replay(&view, policy, &opts);
        assert!(r.checkpoint_every() > 10);
        let total: u64 = r.checkpoints.iter().map(|c| c.approx_bytes).sum();
        assert!(total <= 20_000, "{total}");
        for c in &r.checkpoints {
            assert_eq!(c.next_event % r.checkpoint_every(), 0);
        }
        let (_, c) = r.state_at(&view, 537).unwrap();
        assert_eq!(c.live_allocs, 538);
    }
}
