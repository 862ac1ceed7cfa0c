//! A stream planned piece by piece ([`plan_stream`]): the events are cut into pieces as they
//! come ([`PieceCutter`]; why a piece's plan is the whole plan's is in [`super`]), and each is
//! planned alone on one of `jobs` threads while the file is read on.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use super::super::greedy_by_size;
use super::super::{Buffer, Plan, PlanError};
use crate::stream::EventRow;
use crate::trace::{EventKind, NO_ALLOC_ID};

/// One piece of a stream: its allocations (ids in allocation order) and their buffers, with
/// lifetimes in events counted from the piece's first allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Piece {
    /// Index in the stream of the piece's first allocation.
    pub first_event: u64,
    pub ids: Vec<u32>,
    pub buffers: Vec<Buffer>,
}

/// Cuts a stream of events into [`Piece`]s, as [`crate::plan::trace_buffers`] and [`super::pieces`]
/// would cut the whole trace: an `Alloc` opens a buffer of its size (one byte for zero), its
/// `Free` closes it, and a piece ends after the event that leaves nothing live. Allocations
/// still live when the stream ends live to its end. Memory holds the open piece; the table of
/// live allocations is indexed by the stream's slots.
#[derive(Debug, Default)]
pub struct PieceCutter {
    /// A piece ends only once it has this many allocations (consecutive pieces together are
    /// still a set no other allocation meets).
    min_allocations: usize,
    /// Events seen.
    events: u64,
    open: Piece,
    /// Buffer index (in `open`) of the allocation in each slot.
    by_slot: Vec<u32>,
    live: u64,
}

/// `by_slot` entry of a slot holding nothing.
const EMPTY: u32 = u32::MAX;

impl PieceCutter {
    /// A cutter whose pieces end at the first moment nothing is live once they have
    /// `min_allocations` allocations (the default cutter ends them at every such moment).
    #[must_use]
    pub fn new(min_allocations: usize) -> Self {
        Self {
            min_allocations,
            ..Self::default()
        }
    }

    /// Takes the next event; returns the piece it ends, if it leaves nothing live.
    ///
    /// # Errors
    /// When the event frees a slot that holds nothing, or allocates into one that is taken (the
    /// stream's slots are broken).
    pub fn push(&mut self, e: &EventRow) -> Result<Option<Piece>, String> {
        let at = self.events;
        self.events += 1;
        let slot = e.slot as usize;
        if e.kind == EventKind::Alloc as u8 && e.alloc_id != NO_ALLOC_ID {
            if self.open.buffers.is_empty() {
                self.open.first_event = at;
            }
            if self.by_slot.len() <= slot {
                self.by_slot.resize(slot + 1, EMPTY);
            }
            let index = u32::try_from(self.open.buffers.len())
                .ok()
                .filter(|&i| i < EMPTY);
            let index = index.ok_or_else(|| {
                format!("event {at}: more than {EMPTY} allocations without a moment where nothing is live")
            })?;
            match self.by_slot.get_mut(slot) {
                Some(s) if *s == EMPTY => *s = index,
                _ => {
                    return Err(format!(
                        "event {at}: allocation into slot {slot}, which is taken"
                    ));
                }
            }
            let lower = at - self.open.first_event;
            // Live to the end of the stream unless freed (`finish` sets the end).
            self.open
                .buffers
                .push(Buffer::new(e.size_bytes.max(1), lower, u64::MAX));
            self.open.ids.push(e.alloc_id);
            self.live += 1;
        } else if e.kind == EventKind::Free as u8 && e.alloc_id != NO_ALLOC_ID {
            let index = match self.by_slot.get_mut(slot) {
                Some(s) if *s != EMPTY => std::mem::replace(s, EMPTY),
                _ => {
                    return Err(format!(
                        "event {at}: free of slot {slot}, which holds nothing"
                    ));
                }
            };
            if let Some(b) = self.open.buffers.get_mut(index as usize) {
                b.upper = at - self.open.first_event;
            }
            self.live -= 1;
            if self.live == 0 && self.open.buffers.len() >= self.min_allocations {
                return Ok(Some(std::mem::take(&mut self.open)));
            }
        }
        Ok(None)
    }

    /// Allocations in the open piece.
    #[must_use]
    pub fn open_allocations(&self) -> usize {
        self.open.buffers.len()
    }

    /// The last piece, its live allocations held to the end of the stream.
    #[must_use]
    pub fn finish(mut self) -> Option<Piece> {
        if self.open.buffers.is_empty() {
            return None;
        }
        let end = self.events - self.open.first_event;
        for b in &mut self.open.buffers {
            if b.upper == u64::MAX {
                b.upper = end;
            }
        }
        Some(self.open)
    }
}

/// Where [`plan_stream`] puts each piece's plan: its allocations' ids and offsets.
pub type PlanSink<'a> = dyn FnMut(&[u32], &[u64]) -> Result<(), String> + 'a;

/// What [`plan_stream`] planned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamPlan {
    /// The plan's size: the largest piece's.
    pub total_bytes: u64,
    pub allocations: u64,
    pub pieces: u64,
    /// Allocations of the largest piece.
    pub largest_piece_allocations: u64,
}

/// Greedy-by-size of a stream, piece by piece ([`PieceCutter`], pieces of at least
/// `piece_allocations.start()` allocations where the stream allows, [`super::MIN_PIECE_BUFFERS`]
/// is a good choice) on `jobs` threads while the stream is read: `sink` gets every allocation's
/// id and planned offset, piece after piece, in allocation order. Memory holds at most
/// `2 * jobs + 1` pieces (queued, being planned, or planned and waiting for an earlier one),
/// each of at most `piece_allocations.end()` allocations. `progress` counts the events read.
///
/// # Errors
/// When the source or `sink` fails, when a piece has more than `piece_allocations.end()`
/// allocations (the stream goes that long without a moment where nothing is live), or when a
/// piece cannot be planned (the whole plan's checks, made as the pieces come).
pub fn plan_stream(
    source: &mut dyn crate::stream::EventSource,
    align_bytes: u64,
    jobs: usize,
    piece_allocations: std::ops::RangeInclusive<usize>,
    progress: Option<&AtomicU64>,
    sink: &mut PlanSink<'_>,
) -> Result<StreamPlan, String> {
    plan_stream_with(
        source,
        align_bytes,
        jobs,
        piece_allocations,
        progress,
        sink,
        &greedy_by_size::plan,
    )
}

/// How a piece is planned: its buffers and the alignment give its plan.
type PlanPiece<'a> = dyn Fn(&[Buffer], u64) -> Result<Plan, PlanError> + Sync + 'a;

/// [`plan_stream`], each piece planned by `plan_piece`.
fn plan_stream_with(
    source: &mut dyn crate::stream::EventSource,
    align_bytes: u64,
    jobs: usize,
    piece_allocations: std::ops::RangeInclusive<usize>,
    progress: Option<&AtomicU64>,
    sink: &mut PlanSink<'_>,
    plan_piece: &PlanPiece<'_>,
) -> Result<StreamPlan, String> {
    use std::sync::mpsc;
    let jobs = jobs.max(1);
    let (to_plan, queue) = mpsc::sync_channel::<(u64, Piece)>(jobs);
    // Only the planners hold the queue, so that once they have all stopped (even by a panic)
    // sending to it fails instead of waiting forever.
    let queue = std::sync::Arc::new(Mutex::new(queue));
    let (done, results) = mpsc::channel::<Planned>();
    // Set on an error: the planners drop what is queued instead of planning it.
    let stop = AtomicBool::new(false);
    let planner = |queue: std::sync::Arc<Mutex<mpsc::Receiver<(u64, Piece)>>>,
                   done: mpsc::Sender<Planned>| {
        let stop = &stop;
        move || {
            loop {
                let next = queue.lock().map(|q| q.recv());
                let Ok(Ok((seq, piece))) = next else { break };
                if stop.load(Relaxed) {
                    break;
                }
                // A planner that panics must still answer for its piece: the reader waits for
                // every piece in turn, and the other planners, waiting for more pieces, keep
                // the results open, so a piece lost with its thread hung the command.
                let plan = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    plan_piece(&piece.buffers, align_bytes)
                }))
                .unwrap_or_else(|panic| Err(PlanError::Internal(panic_message(&*panic))));
                if done.send((seq, piece.ids, plan)).is_err() {
                    break;
                }
            }
        }
    };
    let mut out = StreamPlan::default();
    let mut in_order = InOrder {
        pending: std::collections::BTreeMap::new(),
        flushed: 0,
        sink,
    };
    let in_flight = 2 * jobs as u64;
    let mut naive = super::NaiveTotal::default();
    let planned = std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(planner(std::sync::Arc::clone(&queue), done.clone()));
        }
        drop(queue);
        drop(done);
        let stopped = || "a planning thread stopped".to_owned();
        let fed = feed_pieces(
            source,
            &piece_allocations,
            progress,
            |piece, out| {
                for b in &piece.buffers {
                    naive
                        .add(b, align_bytes)
                        .map_err(|e| format!("piece {} of the plan: {e}", out.pieces))?;
                }
                for planned in results.try_iter() {
                    in_order.take(planned, out)?;
                }
                // Planned pieces wait for the earliest: bound how far ahead the others may get.
                while out.pieces >= in_order.flushed + in_flight {
                    in_order.take(results.recv().map_err(|_| stopped())?, out)?;
                }
                out.allocations += piece.ids.len() as u64;
                out.largest_piece_allocations =
                    out.largest_piece_allocations.max(piece.ids.len() as u64);
                let seq = out.pieces;
                out.pieces += 1;
                to_plan.send((seq, piece)).map_err(|_| stopped())
            },
            &mut out,
        );
        let rest = fed.and_then(|()| {
            while in_order.flushed < out.pieces {
                in_order.take(results.recv().map_err(|_| stopped())?, &mut out)?;
            }
            Ok(())
        });
        stop.store(rest.is_err(), Relaxed);
        // The planners stop once the queue is empty and closed.
        drop(to_plan);
        rest
    });
    planned.map(|()| out)
}

/// What a panic says, as `std` prints it: its message when it has one.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned());
    match message {
        Some(m) => format!("the planner panicked: {m}"),
        None => "the planner panicked".to_owned(),
    }
}

/// A planned piece: its place in the stream, its allocations' ids and its plan.
type Planned = (u64, Vec<u32>, Result<Plan, PlanError>);

/// Planned pieces, handed to the sink in stream order as they come in any order.
struct InOrder<'a> {
    pending: std::collections::BTreeMap<u64, (Vec<u32>, Result<Plan, PlanError>)>,
    flushed: u64,
    sink: &'a mut PlanSink<'a>,
}

impl InOrder<'_> {
    fn take(&mut self, (seq, ids, plan): Planned, out: &mut StreamPlan) -> Result<(), String> {
        self.pending.insert(seq, (ids, plan));
        while let Some((ids, plan)) = self.pending.remove(&self.flushed) {
            let plan = plan.map_err(|e| format!("piece {} of the plan: {e}", self.flushed))?;
            out.total_bytes = out.total_bytes.max(plan.total_bytes);
            (self.sink)(&ids, &plan.offsets)?;
            self.flushed += 1;
        }
        Ok(())
    }
}

/// Reads `source`, cutting its events into pieces handed to `deliver`.
fn feed_pieces(
    source: &mut dyn crate::stream::EventSource,
    piece_allocations: &std::ops::RangeInclusive<usize>,
    progress: Option<&AtomicU64>,
    mut deliver: impl FnMut(Piece, &mut StreamPlan) -> Result<(), String>,
    out: &mut StreamPlan,
) -> Result<(), String> {
    let mut cutter = PieceCutter::new(*piece_allocations.start());
    let max_piece_allocations = *piece_allocations.end();
    let mut batch = crate::stream::EventBatch::default();
    let mut events = 0u64;
    while source.next_batch(&mut batch)? {
        for j in 0..batch.len() {
            let Some(e) = batch.row(j) else { continue };
            if let Some(piece) = cutter.push(&e)? {
                deliver(piece, out)?;
            } else if cutter.open_allocations() > max_piece_allocations {
                let first = cutter.open.first_event;
                return Err(format!(
                    "from event {first} on, more than {max_piece_allocations} allocations come \
                     without a moment where nothing is live: a streamed plan is made between \
                     such moments, and one this long does not fit in memory"
                ));
            }
        }
        events += batch.len() as u64;
        if let Some(p) = progress {
            p.store(events, Relaxed);
        }
    }
    if let Some(piece) = cutter.finish() {
        deliver(piece, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::pieces::pieces;
    use crate::plan::pieces::tests::trace;

    /// The events of `view` as a stream gives them, slots reused after the free.
    fn rows(view: &crate::trace::TraceView<'_>) -> Vec<EventRow> {
        let (mut free_slots, mut slot_of) = (Vec::new(), std::collections::HashMap::new());
        (0..view.len())
            .map(|i| {
                let (kind, id) = (view.kind[i], view.alloc_id[i]);
                let slot = if kind == EventKind::Alloc as u8 {
                    let fresh = (slot_of.len() + free_slots.len()) as u32;
                    let s = free_slots.pop().unwrap_or(fresh);
                    slot_of.insert(id, s);
                    s
                } else {
                    let s = slot_of.remove(&id).unwrap();
                    free_slots.push(s);
                    s
                };
                EventRow {
                    t_ns: view.t_ns[i],
                    kind,
                    size_bytes: view.size_bytes[i],
                    alloc_id: id,
                    slot,
                    thread: 0,
                    addr: 0,
                }
            })
            .collect()
    }

    /// The cutter, fed the events one by one, gives the pieces `pieces` finds in the whole
    /// trace, with the same buffers shifted to the piece's first allocation.
    #[test]
    fn the_cutter_cuts_a_stream_as_the_whole_trace_is_cut() {
        for leak in [false, true] {
            let t = trace(5, 1_500, 43, leak);
            let view = t.view().unwrap();
            let buffers = crate::plan::trace_buffers(&view);
            let want = pieces(&buffers);
            let mut cutter = PieceCutter::default();
            let mut got = Vec::new();
            for row in rows(&view) {
                got.extend(cutter.push(&row).unwrap());
            }
            got.extend(cutter.finish());
            assert_eq!(got.len(), want.len(), "leak {leak}");
            for (piece, indices) in got.iter().zip(&want) {
                let ids: Vec<u32> = indices.iter().map(|&i| i as u32).collect();
                assert_eq!(piece.ids, ids);
                let first = buffers[indices[0]].lower;
                assert_eq!(piece.first_event, first);
                let shifted: Vec<Buffer> = indices
                    .iter()
                    .map(|&i| {
                        let b = buffers[i];
                        Buffer::new(b.size_bytes, b.lower - first, b.upper - first)
                    })
                    .collect();
                assert_eq!(piece.buffers, shifted);
            }
        }
    }

    /// Rows handed out `per_batch` at a time.
    struct Rows {
        rows: Vec<EventRow>,
        at: usize,
        per_batch: usize,
        span: (i64, i64),
    }

    impl crate::stream::EventSource for Rows {
        fn time_span(&self) -> (i64, i64) {
            self.span
        }

        fn next_batch(&mut self, out: &mut crate::stream::EventBatch) -> Result<bool, String> {
            out.clear();
            let end = (self.at + self.per_batch).min(self.rows.len());
            for r in &self.rows[self.at..end] {
                out.push_row(r);
            }
            self.at = end;
            Ok(!out.is_empty())
        }
    }

    struct VecFeed(std::vec::IntoIter<(u32, u64)>);

    impl crate::policy::oracle::PlanFeed for VecFeed {
        fn next_planned(&mut self) -> Result<Option<(u32, u64)>, String> {
            Ok(self.0.next())
        }
    }

    fn source(view: &crate::trace::TraceView<'_>, per_batch: usize) -> Rows {
        Rows {
            rows: rows(view),
            at: 0,
            per_batch,
            span: (view.t_ns[0], *view.t_ns.last().unwrap()),
        }
    }

    /// The stream planned piece by piece on two threads, then replayed by the streamed oracle,
    /// gives the loaded oracle's every figure, series and final heap, with and without a limit
    /// that cuts the plan.
    #[test]
    fn a_streamed_oracle_replays_as_the_loaded_one() {
        use crate::policy::config::PolicyConfig;
        use crate::policy::oracle::Oracle;
        use crate::policy::registry::build;
        use crate::replay::{ReplayOptions, replay};
        for (seed, leak, min_piece, huge) in [
            (13, false, 1, false),
            (17, true, 1, false),
            (13, false, 300, false),
            (23, false, 1, true),
        ] {
            let mut t = trace(seed, 4_000, 89, leak);
            if huge {
                // A request past what any policy serves fails before the policy sees it: the
                // streamed plan must not lose its place.
                let n = t.kind.len() as i64;
                let big = t.alloc(n + 1, 1 << 49);
                t.free(n + 2, big);
                let small = t.alloc(n + 3, 100);
                t.free(n + 4, small);
            }
            let view = t.view().unwrap();
            let mut planned = Vec::new();
            let summary = plan_stream(
                &mut source(&view, 211),
                16,
                2,
                min_piece..=usize::MAX,
                None,
                &mut |ids, offs| {
                    planned.extend(ids.iter().copied().zip(offs.iter().copied()));
                    Ok(())
                },
            )
            .unwrap();
            if min_piece == 1 {
                assert!(summary.pieces > 20, "{summary:?}");
            } else {
                assert!((3..=14).contains(&summary.pieces), "{summary:?}");
                assert!(summary.largest_piece_allocations >= 300, "{summary:?}");
            }
            assert_eq!(summary.allocations, view.num_allocs as u64);
            let (max_live, _) = view.peak_live();
            for limit in [None, Some(summary.total_bytes * 3 / 4)] {
                let config = PolicyConfig {
                    limit_bytes: limit,
                    ..PolicyConfig::default()
                };
                let opts = ReplayOptions::default();
                let loaded = replay(&view, build("oracle", &config, &view).unwrap(), &opts);
                let feed = VecFeed(planned.clone().into_iter());
                let oracle =
                    Oracle::streamed(&config, summary.total_bytes, max_live, Box::new(feed));
                let streamed = crate::stream::replay_stream(
                    &mut source(&view, 97),
                    Box::new(oracle),
                    &opts,
                    None,
                )
                .unwrap();
                let untimed = |r: &crate::replay::Replay| crate::replay::Summary {
                    replay_seconds: 0.0,
                    events_per_second: 0.0,
                    ..r.summary.clone()
                };
                assert_eq!(
                    untimed(&streamed),
                    untimed(&loaded),
                    "seed {seed}, limit {limit:?}"
                );
                assert_eq!(streamed.series, loaded.series);
                let (mut a, mut b) = (Vec::new(), Vec::new());
                streamed.final_state.blocks(&mut a);
                loaded.final_state.blocks(&mut b);
                assert_eq!(a, b);
                streamed.final_state.check_invariants().unwrap();
                if limit.is_some() || huge {
                    assert!(loaded.summary.oom_count > 0, "the limit bites");
                }
            }
        }
    }

    /// A stream that never empties its heap for longer than the bound is refused, naming
    /// where the piece began; a planner's error reaches the caller.
    #[test]
    fn a_piece_past_the_bound_is_refused() {
        let t = trace(19, 500, 1_000, false);
        let view = t.view().unwrap();
        let err = plan_stream(&mut source(&view, 64), 16, 2, 1..=100, None, &mut |_, _| {
            Ok(())
        })
        .unwrap_err();
        assert!(
            err.contains("on, more than 100 allocations come without"),
            "{err}"
        );
        let err = plan_stream(
            &mut source(&view, 64),
            3,
            2,
            1..=usize::MAX,
            None,
            &mut |_, _| Ok(()),
        )
        .unwrap_err();
        assert!(err.contains("piece 0 of the plan"), "{err}");
        let err = plan_stream(
            &mut source(&view, 64),
            16,
            1,
            1..=usize::MAX,
            None,
            &mut |_, _| Err("disk full".to_owned()),
        )
        .unwrap_err();
        assert_eq!(err, "disk full");
    }

    /// A planner that panics on one piece while the others plan on makes the plan an error
    /// that names the piece and the panic. It hung: the reader waited for the lost piece, and
    /// the other planners, waiting for more pieces, held the channel of results open. The plan
    /// runs on a thread of its own, so that a hang fails the test instead of stalling the suite.
    #[test]
    fn a_panicking_planner_is_an_error_not_a_hang() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::mpsc::RecvTimeoutError;
        for jobs in [2, 3, 1] {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let t = trace(31, 3_000, 40, false);
                let view = t.view().unwrap();
                let calls = AtomicUsize::new(0);
                let plan_piece = |buffers: &[Buffer], align_bytes: u64| {
                    assert!(calls.fetch_add(1, Relaxed) != 4, "injected");
                    greedy_by_size::plan(buffers, align_bytes)
                };
                let planned = plan_stream_with(
                    &mut source(&view, 64),
                    16,
                    jobs,
                    1..=usize::MAX,
                    None,
                    &mut |_, _| Ok(()),
                    &plan_piece,
                );
                tx.send(planned).unwrap();
            });
            let planned = match rx.recv_timeout(std::time::Duration::from_secs(120)) {
                Ok(planned) => planned,
                Err(RecvTimeoutError::Timeout) => panic!("{jobs} jobs: the plan hangs"),
                Err(RecvTimeoutError::Disconnected) => panic!("{jobs} jobs: the panic escaped"),
            };
            let err = planned.unwrap_err();
            assert!(
                err.starts_with("piece ")
                    && err.ends_with(
                        " of the plan: internal planner error: the planner panicked: injected"
                    ),
                "{jobs} jobs: {err}"
            );
        }
    }

    #[test]
    fn the_cutter_refuses_broken_slots() {
        let row = |kind: EventKind, slot: u32| EventRow {
            t_ns: 0,
            kind: kind as u8,
            size_bytes: 8,
            alloc_id: 0,
            slot,
            thread: 0,
            addr: 0,
        };
        let mut c = PieceCutter::default();
        assert!(
            c.push(&row(EventKind::Free, 0))
                .unwrap_err()
                .contains("holds nothing")
        );
        c.push(&row(EventKind::Alloc, 3)).unwrap();
        assert!(
            c.push(&row(EventKind::Alloc, 3))
                .unwrap_err()
                .contains("taken")
        );
    }
}
