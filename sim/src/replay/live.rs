//! Replaying a trace that is still being written: each call goes on from where the last one
//! stopped, never from the first event.
//!
//! A [`LiveReplay`] holds the replay loop's state ([`Run`]) between calls. [`LiveReplay::extend`]
//! replays the events a longer view of the same trace adds; [`LiveReplay::snapshot`] hands out
//! a [`Replay`] of the events so far that seeks like any other (checkpoints, shared rather than
//! copied, and the id → address table). Its series grows with the trace: buckets start
//! [`LIVE_BUCKET_WIDTH_NS`] wide and merge pairwise whenever the trace passes the span
//! (`series/growing.rs`), so a snapshot's buckets are those a replay of the same events with
//! the final bucketing would have. No layout index is kept (it is sized by the trace's length):
//! the heap map of a snapshot replays from the nearest checkpoint.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::run::{Run, Span};
use super::{Replay, ReplayOptions};
use crate::policy::Policy;
use crate::trace::TraceView;

/// The width of a live series' buckets before the first merge: 1,024 ns, so a run of a
/// second is drawn in buckets of half a millisecond, and an hour after 21 merges.
pub const LIVE_BUCKET_WIDTH_NS: u64 = 1024;

/// Events replayed between two looks at the cancel flag.
const CANCEL_EVERY: usize = 1 << 16;

/// A replay that goes on as its trace grows (see the module docs).
pub struct LiveReplay {
    /// Made at the first event (the series starts at its time).
    run: Option<Run>,
    /// The policy, until the run takes it.
    policy: Option<Box<dyn Policy>>,
    opts: ReplayOptions,
    events: usize,
    replay_seconds: f64,
}

impl LiveReplay {
    /// A replay of no events yet through `policy`.
    #[must_use]
    pub fn new(policy: Box<dyn Policy>, opts: &ReplayOptions) -> Self {
        Self {
            run: None,
            policy: Some(policy),
            opts: opts.clone(),
            events: 0,
            replay_seconds: 0.0,
        }
    }

    /// Events replayed so far.
    #[must_use]
    pub fn events(&self) -> usize {
        self.events
    }

    /// Replays the events of `trace` past those replayed so far. `trace` is the same trace as
    /// before, longer: its first [`Self::events`] events are those already replayed. Stops
    /// early, between two stretches, once `cancel` is set; returns whether it did.
    pub fn extend(&mut self, trace: &TraceView<'_>, cancel: &AtomicBool) -> bool {
        let n = trace.len();
        if n <= self.events {
            return false;
        }
        let run = match (&mut self.run, self.policy.take()) {
            (Some(run), _) => run,
            (None, Some(policy)) => {
                let t0_ns = trace.t_ns.first().copied().unwrap_or(0);
                self.run.insert(Run::growing(
                    policy,
                    &self.opts,
                    t0_ns,
                    LIVE_BUCKET_WIDTH_NS,
                ))
            }
            (None, None) => return false,
        };
        let all = Span::of_trace(trace);
        let started = Instant::now();
        let mut cancelled = false;
        while self.events < n {
            if cancel.load(Ordering::Relaxed) {
                cancelled = true;
                break;
            }
            let to = (self.events + CANCEL_EVERY).min(n);
            run.run(&all.part(self.events, to));
            self.events = to;
        }
        self.replay_seconds += started.elapsed().as_secs_f64();
        cancelled
    }

    /// The replay of the events so far, seekable as any replay is (see the module docs);
    /// `None` before the first event.
    #[must_use]
    pub fn snapshot(&self) -> Option<Replay> {
        let run = self.run.as_ref()?;
        Some(run.snapshot(self.events, self.replay_seconds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::registry;
    use crate::replay::replay;
    use crate::series::Bucketing;
    use crate::trace::OwnedTrace;

    /// A trace of `n` events over a long, uneven time (so the live series merges many
    /// times), some allocations freed, some left live.
    fn uneven(n: usize) -> OwnedTrace {
        let mut t = OwnedTrace::new();
        let mut ids = Vec::new();
        let mut time = 5_000_i64;
        let mut x = 0x9e37_79b9_u64;
        for i in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            time += (x % 50_000) as i64 * if i.is_multiple_of(97) { 400 } else { 1 };
            if x.is_multiple_of(3) && !ids.is_empty() {
                let id = ids.swap_remove((x as usize / 3) % ids.len());
                t.free(time, id);
            } else {
                ids.push(t.alloc(time, 16 + x % 9_000));
            }
        }
        t
    }

    fn policy(name: &str) -> Box<dyn Policy> {
        let empty = OwnedTrace::new();
        let config = crate::policy::config::PolicyConfig::default();
        registry::build(name, &config, &empty.view().unwrap()).unwrap()
    }

    /// The first `end` events of `t`.
    fn prefix(t: &OwnedTrace, end: usize) -> TraceView<'_> {
        TraceView::new(
            &t.t_ns[..end],
            &t.kind[..end],
            &t.size_bytes[..end],
            &t.alloc_id[..end],
        )
        .unwrap()
    }

    #[test]
    fn a_replay_extended_in_steps_equals_one_replay_of_the_whole() {
        let trace = uneven(20_000);
        let view = trace.view().unwrap();
        for name in ["first-fit", "bfc", "buddy"] {
            let opts = ReplayOptions {
                checkpoint_every: 1_000,
                ..ReplayOptions::default()
            };
            let mut live = LiveReplay::new(policy(name), &opts);
            let never = AtomicBool::new(false);
            // Views of the same trace, longer each time, in uneven steps.
            for end in [1, 7, 500, 4_321, 4_322, 12_000, 20_000] {
                let part = prefix(&trace, end);
                assert!(!live.extend(&part, &never));
                assert_eq!(live.events(), end);
            }
            let got = live.snapshot().unwrap();
            let b = got.series.bucketing;
            assert!(b.buckets > 1024 && b.buckets <= 2048, "{name}: {b:?}");
            // The same events replayed at once, with the bucketing the live one grew into.
            let full = Bucketing::of_width(b.t0_ns, b.span_ns / b.buckets as u64, 2048);
            let whole = replay(&view, policy(name), &opts);
            let n = view.len();
            let mut one = Run::new(policy(name), &opts, full, view.num_allocs as usize, Some(n));
            one.run(&Span::of_trace(&view));
            let one = one.finish(view.len(), 0.0, false);
            let s = &one.series;
            let k = b.buckets;
            assert_eq!(got.series.first_event, s.first_event[..k], "{name}");
            assert_eq!(got.series.last_event, s.last_event[..k], "{name}");
            assert_eq!(got.series.event_count, s.event_count[..k], "{name}");
            assert_eq!(
                got.series.footprint_bytes.max,
                s.footprint_bytes.max[..k],
                "{name}"
            );
            assert_eq!(
                got.series.footprint_bytes.min,
                s.footprint_bytes.min[..k],
                "{name}"
            );
            assert_eq!(got.series.live_bytes.last, s.live_bytes.last[..k], "{name}");
            assert_eq!(
                got.series.fragmentation.max,
                s.fragmentation.max[..k],
                "{name}"
            );
            assert_eq!(
                got.series.fragmentation.min,
                s.fragmentation.min[..k],
                "{name}"
            );
            assert_eq!(
                got.series.external_fragmentation.min,
                s.external_fragmentation.min[..k],
                "{name}"
            );
            let (mut g, mut w) = (got.summary.clone(), whole.summary.clone());
            (g.replay_seconds, w.replay_seconds) = (0.0, 0.0);
            (g.events_per_second, w.events_per_second) = (0.0, 0.0);
            assert_eq!(g, w, "{name}");
            // It seeks as the whole replay does.
            for e in [0, 999, 1_000, 13_337, 19_999] {
                let (_, c) = got.state_at(&view, e).unwrap();
                let (_, d) = whole.state_at(&view, e).unwrap();
                assert_eq!(c, d, "{name} at {e}");
            }
        }
    }

    #[test]
    fn a_set_cancel_flag_stops_the_extension() {
        let trace = uneven(1_000);
        let view = trace.view().unwrap();
        let mut live = LiveReplay::new(policy("first-fit"), &ReplayOptions::default());
        assert!(live.extend(&view, &AtomicBool::new(true)));
        assert_eq!(live.events(), 0);
        assert!(!live.extend(&view, &AtomicBool::new(false)));
        assert_eq!(live.events(), 1_000);
    }
}
