//! Greedy-by-size in independent pieces: the oracle's plan of a malloc trace, on every core and
//! without holding the whole trace.
//!
//! **Why a piece's plan is the whole plan.** Cut the time line wherever nothing is live (no
//! buffer's lifetime spans the cut): the buffers between two cuts form a *piece*, and buffers of
//! different pieces never meet. Greedy-by-size ([`super::greedy_by_size`]) places each buffer by
//! the placed buffers that meet it, taken in a stable largest-first order, so a buffer's offset
//! depends only on the buffers of its own piece that precede it in that order, and those precede
//! it in the piece's own stable order too (a piece keeps the input order). Each piece planned
//! alone therefore gives exactly the whole plan's offsets for its buffers, and the whole plan's
//! size is the largest piece's.
//!
//! The loaded oracle plans its pieces on `jobs` threads ([`plan_in_pieces`]); a streamed replay
//! cuts its events into pieces as they come ([`PieceCutter`]) and plans each alone, so it holds
//! one piece, not the trace. A trace that never empties its heap is one piece.
//!
//! Buffers that need no memory (an empty lifetime) belong to no piece: they get offset 0, as
//! the whole plan gives them. Input with overwrite chains is planned whole.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use super::greedy_by_size::{self, Progress};
use super::{Buffer, Plan, PlanError, align_up};

/// Pieces are planned at least this many buffers at a time: consecutive pieces together are
/// still a set no other buffer meets, and a trace that empties its heap after every
/// allocation would otherwise cost a planner's set-up per allocation.
pub const MIN_PIECE_BUFFERS: usize = 4096;

/// The overflow check [`super::units`] makes of a whole input (every buffer that needs memory,
/// rounded up to its alignment plus one alignment of slack, in input order), made as the
/// buffers come, so that a plan in pieces fails exactly where the whole plan would.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NaiveTotal(u64);

impl NaiveTotal {
    pub(crate) fn add(&mut self, b: &Buffer, min_align_bytes: u64) -> Result<(), PlanError> {
        if b.lower >= b.upper || b.size_bytes == 0 {
            return Ok(());
        }
        let align = b.align_bytes.max(min_align_bytes);
        self.0 = align_up(self.0, align)
            .and_then(|t| t.checked_add(b.size_bytes))
            .and_then(|t| t.checked_add(align))
            .ok_or(PlanError::Overflow)?;
        Ok(())
    }
}

/// The buffers of each piece, by index, each list in increasing index order; pieces in time
/// order. Buffers with an empty lifetime are in none.
#[must_use]
pub fn pieces(buffers: &[Buffer]) -> Vec<Vec<usize>> {
    let mut by_start: Vec<usize> = (0..buffers.len())
        .filter(|&i| buffers.get(i).is_some_and(|b| b.lower < b.upper))
        .collect();
    by_start.sort_by_key(|&i| buffers.get(i).map_or(0, |b| b.lower));
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut reach = 0u64;
    for i in by_start {
        let Some(b) = buffers.get(i) else { continue };
        match out.last_mut() {
            Some(piece) if b.lower < reach => piece.push(i),
            _ => out.push(vec![i]),
        }
        reach = reach.max(b.upper);
    }
    for piece in &mut out {
        piece.sort_unstable();
    }
    out
}

/// `cut`'s consecutive pieces joined until each has at least `min_buffers` (the last may have
/// fewer), each list in increasing index order.
fn joined(cut: Vec<Vec<usize>>, min_buffers: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    for piece in cut {
        match out.last_mut() {
            Some(last) if last.len() < min_buffers => last.extend(piece),
            _ => out.push(piece),
        }
    }
    for piece in &mut out {
        piece.sort_unstable();
    }
    out
}

/// Greedy-by-size of `buffers` ([`greedy_by_size::plan_observed`]'s plan, the same offsets and
/// size, or the same error), its pieces planned on up to `jobs` threads. `progress` counts
/// buffers of finished pieces (and a lone piece's planning units as they are placed).
///
/// # Errors
/// As [`greedy_by_size::plan`].
pub fn plan_in_pieces(
    buffers: &[Buffer],
    align_bytes: u64,
    jobs: usize,
    progress: Option<&Progress>,
) -> Result<Plan, PlanError> {
    plan_in_pieces_of(buffers, align_bytes, jobs, MIN_PIECE_BUFFERS, progress)
}

/// [`plan_in_pieces`] with pieces of at least `min_buffers` where the input allows.
fn plan_in_pieces_of(
    buffers: &[Buffer],
    align_bytes: u64,
    jobs: usize,
    min_buffers: usize,
    progress: Option<&Progress>,
) -> Result<Plan, PlanError> {
    let cut = if buffers.iter().any(|b| b.overwrite.is_some()) {
        Vec::new()
    } else {
        joined(pieces(buffers), min_buffers)
    };
    if cut.len() <= 1 {
        return greedy_by_size::plan_observed(buffers, align_bytes, progress);
    }
    // The whole input's checks, which no piece sees whole.
    if !align_bytes.is_power_of_two() {
        return Err(PlanError::BadAlignOption(align_bytes));
    }
    super::units::structure(buffers)?;
    let mut naive = NaiveTotal::default();
    for b in buffers {
        naive.add(b, align_bytes)?;
    }
    if let Some(p) = progress {
        p.total.store(buffers.len(), Relaxed);
    }
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let planned: Mutex<Vec<Option<Result<Plan, PlanError>>>> =
        Mutex::new((0..cut.len()).map(|_| None).collect());
    let work = || {
        let mut mine = Vec::new();
        while !failed.load(Relaxed) {
            let k = next.fetch_add(1, Relaxed);
            let Some(piece) = cut.get(k) else { break };
            let own: Vec<Buffer> = piece
                .iter()
                .filter_map(|&i| buffers.get(i))
                .copied()
                .collect();
            let plan = greedy_by_size::plan(&own, align_bytes);
            failed.fetch_or(plan.is_err(), Relaxed);
            mine.push((k, plan));
            if let Some(p) = progress {
                p.done.fetch_add(piece.len(), Relaxed);
            }
        }
        let mut all = planned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (k, plan) in mine {
            if let Some(slot) = all.get_mut(k) {
                *slot = Some(plan);
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 1..jobs.clamp(1, cut.len()) {
            s.spawn(work);
        }
        work();
    });
    let planned = planned
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut whole = Plan {
        offsets: vec![0; buffers.len()],
        total_bytes: 0,
    };
    // The first failed piece's error; pieces after it may not have been planned.
    if let Some(e) = planned.iter().flatten().find_map(|p| p.as_ref().err()) {
        return Err(e.clone());
    }
    for (piece, plan) in cut.iter().zip(planned) {
        let plan = plan.ok_or_else(|| PlanError::Internal("a piece was not planned".into()))??;
        whole.total_bytes = whole.total_bytes.max(plan.total_bytes);
        for (&i, &off) in piece.iter().zip(&plan.offsets) {
            if let Some(o) = whole.offsets.get_mut(i) {
                *o = off;
            }
        }
    }
    if let Some(p) = progress {
        p.done.store(buffers.len(), Relaxed);
    }
    Ok(whole)
}

pub mod stream;

pub use stream::{Piece, PieceCutter, PlanSink, StreamPlan, plan_stream};

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::trace::OwnedTrace;

    /// A trace that empties its heap now and then (every `quiet` allocations, all are freed),
    /// with sizes that make greedy-by-size's choices matter, and a few allocations never freed
    /// when `leak` is set (so the last piece runs to the end).
    pub(crate) fn trace(seed: u64, allocs: usize, quiet: usize, leak: bool) -> OwnedTrace {
        let mut x = seed | 1;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut t = OwnedTrace::new();
        let mut live = Vec::new();
        let mut now = 0i64;
        for k in 0..allocs {
            now += 1;
            let size = if next(8) == 0 { 0 } else { 16 << next(10) } + next(100);
            live.push(t.alloc(now, size));
            while !live.is_empty() && next(3) == 0 {
                now += 1;
                let victim = live.swap_remove(next(live.len() as u64) as usize);
                t.free(now, victim);
            }
            if k % quiet == quiet - 1 && !(leak && k + quiet >= allocs) {
                for id in live.drain(..) {
                    now += 1;
                    t.free(now, id);
                }
            }
        }
        t
    }

    #[test]
    fn pieces_never_meet_and_cover_every_live_buffer() {
        let t = trace(7, 2_000, 97, true);
        let buffers = crate::plan::trace_buffers(&t.view().unwrap());
        let cut = pieces(&buffers);
        assert!(cut.len() >= 15, "{} pieces", cut.len());
        let mut piece_of = vec![usize::MAX; buffers.len()];
        for (k, p) in cut.iter().enumerate() {
            assert!(p.is_sorted());
            for &i in p {
                piece_of[i] = k;
            }
        }
        for (i, a) in buffers.iter().enumerate() {
            assert_eq!(piece_of[i] == usize::MAX, a.lower >= a.upper, "buffer {i}");
            for (j, b) in buffers.iter().enumerate() {
                if a.lower < b.upper && b.lower < a.upper {
                    assert_eq!(piece_of[i], piece_of[j], "{i} and {j} meet");
                }
            }
        }
    }

    /// The plan in pieces is the whole plan, on one thread or two, with and without a piece
    /// that runs to the end.
    #[test]
    fn the_plan_in_pieces_is_the_whole_plan() {
        for (seed, leak) in [(3, false), (11, true), (29, false)] {
            let t = trace(seed, 3_000, 61, leak);
            let buffers = crate::plan::trace_buffers(&t.view().unwrap());
            let whole = greedy_by_size::plan(&buffers, 16).unwrap();
            for (jobs, min_buffers) in [(1, 1), (2, 1), (3, 1), (2, 200)] {
                let progress = Progress::default();
                let split =
                    plan_in_pieces_of(&buffers, 16, jobs, min_buffers, Some(&progress)).unwrap();
                assert_eq!(split, whole, "seed {seed}, {jobs} jobs, {min_buffers}");
                assert_eq!(
                    progress.total.load(Relaxed),
                    buffers.len(),
                    "split, not whole"
                );
            }
            // Pieces joined up to 200 buffers: fewer, none under 200 but the last.
            let few = joined(pieces(&buffers), 200);
            assert!(
                few.len() > 3 && few.len() < pieces(&buffers).len(),
                "{}",
                few.len()
            );
            assert!(
                few[..few.len() - 1]
                    .iter()
                    .all(|p| p.len() >= 200 && p.is_sorted())
            );
            // The pieces do differ from one another: the largest is not every piece's size.
            let cut = pieces(&buffers);
            let sizes: Vec<u64> = cut
                .iter()
                .map(|p| {
                    let own: Vec<Buffer> = p.iter().map(|&i| buffers[i]).collect();
                    greedy_by_size::plan(&own, 16).unwrap().total_bytes
                })
                .collect();
            assert!(sizes.iter().any(|&s| s < whole.total_bytes), "{sizes:?}");
        }
    }
}
