//! `greedy-by-size`: TFLite's offset planner (`GreedyBySizeAssignment`, Pisarchyk & Lee 2020,
//! Algorithm 3; the same rule as XLA's spatial `GlobalDecreasingSizeBestFitHeap`).
//!
//! Buffers are taken largest first (a stable sort, so equal sizes keep input order). Each one
//! looks only at the already placed buffers whose lifetimes intersect its own, in increasing
//! offset order, tracking the highest end seen so far (`prev_end`, from 0). Every time the next
//! placed buffer starts at or above `prev_end` (rounded up to the alignment), the hole between is
//! a candidate; the smallest hole that fits wins, the lowest on a tie. If none fits, the buffer
//! goes at the final `prev_end`, on top of everything it meets. The pool is the highest end.
//!
//! TFLite scans every placed buffer for each new one (quadratic, and on a malloc trace a
//! long-lived buffer meets hundreds of thousands of others). The holes are the gaps of the union
//! of the met buffers' byte ranges, so an index over time that stores unions
//! (the `occupancy` module) answers with a few ranges instead: O(log n) range-set updates per
//! buffer, and a query costs the size of the unions it reads (small unless memory is very
//! fragmented), so the plan is about O(n log n).

use super::occupancy::{Occupancy, Source};
use super::units::{Unit, prepare};
use super::{Buffer, Plan, PlanError, align_up};

/// Plans `buffers`; `align_bytes` is the minimum alignment of every buffer (TFLite's
/// `base_addr_align_bytes`).
///
/// # Errors
/// An input error of the buffers ([`super::validate()`]'s rules), or a bad alignment option.
pub fn plan(buffers: &[Buffer], align_bytes: u64) -> Result<Plan, PlanError> {
    plan_observed(buffers, align_bytes, None)
}

/// [`plan`], telling `progress` how many of how many planning units are placed as it goes (a
/// plan of millions of buffers takes seconds).
///
/// # Errors
/// As [`plan`].
pub fn plan_observed(
    buffers: &[Buffer],
    align_bytes: u64,
    progress: Option<&Progress>,
) -> Result<Plan, PlanError> {
    let units = prepare(buffers, align_bytes)?;
    let offsets = unit_offsets_observed(&units.units, progress)?;
    units.expand(&offsets, 0)
}

/// How far a long computation has got: `done` of `total` steps, read from another thread.
#[derive(Debug, Default)]
pub struct Progress {
    pub done: std::sync::atomic::AtomicUsize,
    pub total: std::sync::atomic::AtomicUsize,
}

/// Greedy-by-size offsets of planning units.
#[cfg(test)]
pub(crate) fn unit_offsets(units: &[Unit]) -> Result<Vec<u64>, PlanError> {
    offsets_only(unit_offsets_with(units, None, None, Occupancy::new))
        .map(Option::unwrap_or_default)
}

/// [`plan`] over an occupancy index of `bucket` ranks a bucket and `up` unions on `cache_depth`
/// levels: small shapes give small instances every kind of union a query merges.
#[cfg(test)]
pub(crate) fn plan_shaped(
    buffers: &[Buffer],
    align_bytes: u64,
    bucket: usize,
    cache_depth: u32,
) -> Result<Plan, PlanError> {
    let units = prepare(buffers, align_bytes)?;
    let shape = |spans: &[(u64, u64)]| Occupancy::with_shape(spans, bucket, cache_depth);
    let offsets =
        offsets_only(unit_offsets_with(&units.units, None, None, shape))?.unwrap_or_default();
    units.expand(&offsets, 0)
}

/// [`plan`], and the steps its occupancy index took ([`Occupancy::work`]): the cost of the plan,
/// counted rather than timed.
#[cfg(test)]
pub(crate) fn plan_counted(buffers: &[Buffer], align_bytes: u64) -> Result<(Plan, u64), PlanError> {
    let units = prepare(buffers, align_bytes)?;
    let (offsets, work) =
        unit_offsets_with(&units.units, None, None, Occupancy::new)?.unwrap_or_default();
    Ok((units.expand(&offsets, 0)?, work))
}

fn unit_offsets_observed(
    units: &[Unit],
    progress: Option<&Progress>,
) -> Result<Vec<u64>, PlanError> {
    offsets_only(unit_offsets_with(units, progress, None, Occupancy::new))
        .map(Option::unwrap_or_default)
}

/// The offsets of a [`unit_offsets_with`] answer, without its count of steps.
fn offsets_only(
    placed: Result<Option<(Vec<u64>, u64)>, PlanError>,
) -> Result<Option<Vec<u64>>, PlanError> {
    placed.map(|p| p.map(|(offsets, _)| offsets))
}

/// Buffers placed between two looks at the clock in [`unit_offsets_until`].
const CLOCK_EVERY: usize = 256;

/// [`unit_offsets`], giving up (`Ok(None)`) once `deadline` has passed: `search` starts from
/// this plan, and on instances of long-lived, heavily overlapping buffers it alone can take
/// far longer than the search's time budget (50 s for 100,000 buffers).
pub(crate) fn unit_offsets_until(
    units: &[Unit],
    deadline: Option<std::time::Instant>,
) -> Result<Option<Vec<u64>>, PlanError> {
    offsets_only(unit_offsets_with(units, None, deadline, Occupancy::new))
}

/// The greedy-by-size placement, telling `progress` how far it is and giving up at `deadline`:
/// the offsets, and the steps the occupancy index took ([`Occupancy::work`]).
fn unit_offsets_with(
    units: &[Unit],
    progress: Option<&Progress>,
    deadline: Option<std::time::Instant>,
    occupancy_of: impl FnOnce(&[(u64, u64)]) -> Occupancy,
) -> Result<Option<(Vec<u64>, u64)>, PlanError> {
    use std::sync::atomic::Ordering::Relaxed;
    if let Some(p) = progress {
        p.total.store(units.len(), Relaxed);
    }
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by(|&a, &b| {
        let size = |i: usize| units.get(i).map_or(0, |u| u.size_bytes);
        size(b).cmp(&size(a))
    });
    let spans: Vec<(u64, u64)> = units.iter().map(|u| (u.lower, u.upper)).collect();
    let mut occupancy = occupancy_of(&spans);
    // Every offset is a multiple of the smallest alignment, so a placed range blocks everything
    // up to its end rounded up to it. Recording it so changes no decision, and lets the ranges of
    // packed buffers touch and merge (with 16-byte alignment, most malloc sizes leave a sliver).
    let grain = units.iter().map(|u| u.align_bytes).min().unwrap_or(1);
    let mut offsets = vec![0u64; units.len()];
    let mut sources = Vec::new();
    let mut cursors: Vec<(Source, usize)> = Vec::new();
    let mut loose: Vec<(u64, u64)> = Vec::new();
    for (k, i) in order.into_iter().enumerate() {
        if k % CLOCK_EVERY == CLOCK_EVERY - 1
            && deadline.is_some_and(|d| std::time::Instant::now() >= d)
        {
            return Ok(None);
        }
        if k % 4096 == 0
            && let Some(p) = progress
        {
            p.done.store(k, Relaxed);
        }
        let Some(u) = units.get(i) else { continue };
        loose.clear();
        let second_run = occupancy.taken(i, &mut sources, &mut loose);
        cursors.clear();
        cursors.extend(sources.iter().map(|&s| (s, 0)));
        let mut fit = BestFit::new(u.size_bytes, u.align_bytes);
        let (first_run, second_run) = loose.split_at(second_run.min(loose.len()));
        visit_union(&mut fit, &occupancy, &mut cursors, [first_run, second_run]);
        let offset = fit.offset().ok_or(PlanError::Overflow)?;
        if let Some(o) = offsets.get_mut(i) {
            *o = offset;
        }
        let end = align_up(offset + u.size_bytes, grain).ok_or(PlanError::Overflow)?;
        occupancy.place(i, offset, end);
    }
    if let Some(p) = progress {
        p.done.store(units.len(), Relaxed);
    }
    Ok(Some((offsets, occupancy.work())))
}

/// Feeds `fit`, in offset order, the ranges of the `sources` (each a union: sorted, disjoint,
/// paired with the index of its next range) and of two `loose` runs (each sorted by offset;
/// they overlap one another and the sources), passing over every range that ends within what
/// `fit` has already covered: such a range changes nothing, since a hole only opens past the
/// covered end. The sources repeat one another (a long-lived buffer is in the unions of
/// several nodes): planning a 2-million-event window of a recorded Python program met 393
/// million ranges, of which 56 million start past what the ranges before them cover. Merging
/// them all, copied and sorted, was half the plan's time.
fn visit_union(
    fit: &mut BestFit,
    occupancy: &Occupancy,
    sources: &mut [(Source, usize)],
    mut loose: [&[(u64, u64)]; 2],
) {
    loop {
        let covered = fit.prev_end;
        // (offset, end, source index; `sources.len() + k` for loose run `k`)
        let mut next: Option<(u64, u64, usize)> = None;
        for (k, (source, at)) in sources.iter_mut().enumerate() {
            let ranges = occupancy.ranges(*source);
            let rest = ranges.get(*at..).unwrap_or(&[]);
            if rest.first().is_some_and(|r| r.1 <= covered) {
                // A source's ends ascend with its offsets.
                *at += rest.partition_point(|r| r.1 <= covered);
            }
            if let Some(&(off, end)) = ranges.get(*at)
                && next.is_none_or(|n| off < n.0)
            {
                next = Some((off, end, k));
            }
        }
        for (k, run) in loose.iter_mut().enumerate() {
            // Ends need not ascend in a loose run: only its head is passed over.
            while let Some((r, rest)) = run.split_first()
                && r.1 <= covered
            {
                *run = rest;
            }
            if let Some(&(off, end)) = run.first()
                && next.is_none_or(|n| off < n.0)
            {
                next = Some((off, end, sources.len() + k));
            }
        }
        let Some((off, end, k)) = next else {
            return;
        };
        match sources.get_mut(k) {
            Some((_, at)) => *at += 1,
            None => {
                if let Some(run) = loose.get_mut(k - sources.len()) {
                    *run = run.get(1..).unwrap_or(&[]);
                }
            }
        }
        if !fit.visit(off, end) {
            return;
        }
    }
}

/// The best-fit rule, fed byte ranges in increasing offset order (the placed buffers a new one
/// meets, or any ranges with the same union).
struct BestFit {
    size: u64,
    align: u64,
    prev_end: u64,
    /// (hole size, offset) of the best hole so far.
    best: Option<(u64, u64)>,
    overflow: bool,
}

impl BestFit {
    fn new(size: u64, align: u64) -> Self {
        Self {
            size,
            align,
            prev_end: 0,
            best: None,
            overflow: false,
        }
    }

    /// Takes the next range; false once nothing later can change the answer (an exact fit:
    /// later holes can only tie, and ties go to the lowest).
    fn visit(&mut self, off: u64, end: u64) -> bool {
        let Some(start) = align_up(self.prev_end, self.align) else {
            self.overflow = true;
            return false;
        };
        if off >= start {
            let hole = off - start;
            if hole >= self.size && self.best.is_none_or(|(h, _)| hole < h) {
                self.best = Some((hole, start));
                if hole == self.size {
                    return false;
                }
            }
        }
        self.prev_end = self.prev_end.max(end);
        true
    }

    /// The chosen offset: the best hole, else on top of everything met.
    fn offset(&self) -> Option<u64> {
        if self.overflow {
            return None;
        }
        match self.best {
            Some((_, at)) => Some(at),
            None => align_up(self.prev_end, self.align),
        }
    }
}

#[cfg(test)]
fn best_fit_offset(placed: &[(u64, u64)], size: u64, align: u64) -> Result<u64, PlanError> {
    let mut fit = BestFit::new(size, align);
    for &(off, end) in placed {
        if !fit.visit(off, end) {
            break;
        }
    }
    fit.offset().ok_or(PlanError::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The observed plan is the plan, and its progress ends with every unit placed.
    #[test]
    fn progress_counts_every_unit_and_changes_nothing() {
        let buffers: Vec<Buffer> = (0..10_000u64)
            .map(|i| Buffer::new(16 + (i * 7919) % 4096, i, i + 1 + (i * 31) % 50))
            .collect();
        let progress = Progress::default();
        let observed = plan_observed(&buffers, 16, Some(&progress));
        assert_eq!(observed, plan(&buffers, 16));
        let total = progress.total.load(std::sync::atomic::Ordering::Relaxed);
        assert!(total > 4096, "{total} units");
        assert_eq!(
            progress.done.load(std::sync::atomic::Ordering::Relaxed),
            total
        );
    }

    /// `search` starts from this plan only while its budget lasts: past the deadline, the
    /// greedy gives up after at most one batch of buffers; without one, it plans them all.
    #[test]
    fn a_passed_deadline_stops_the_greedy() {
        let buffers: Vec<Buffer> = (0..1000u64)
            .map(|i| Buffer {
                lower: i,
                upper: i + 500,
                size_bytes: 16 + i % 7,
                align_bytes: 1,
                overwrite: None,
            })
            .collect();
        let units = prepare(&buffers, 1).unwrap();
        let past = std::time::Instant::now();
        assert_eq!(unit_offsets_until(&units.units, Some(past)), Ok(None));
        let all = unit_offsets_until(&units.units, None).unwrap().unwrap();
        assert_eq!(all, unit_offsets(&units.units).unwrap());
        assert_eq!(all.len(), units.units.len());
    }

    /// What `oracle` and `plan` make of a malloc trace of `n` allocations (sizes 16 to 63 B)
    /// that all live to its end: buffer `i` lives over `[i, n)`. With `waves` of 2, they are
    /// all freed at once (in allocation order) and `n` more allocations follow, live to the end.
    fn live_to_the_end(n: u64, waves: u64) -> Vec<Buffer> {
        let size = |i: u64| 16 + (i * 7) % 48;
        if waves == 1 {
            return (0..n).map(|i| Buffer::new(size(i), i, n)).collect();
        }
        let first = (0..n).map(|i| Buffer::new(size(i), i, n + i));
        let second = (0..n).map(|i| Buffer::new(size(i), 2 * n + i, 3 * n));
        first.chain(second).collect()
    }

    /// The cost of a plan (the occupancy index's steps, counted) grows near-linearly with the
    /// buffers, whatever their number. The index once listed every buffer that ends inside a
    /// time bucket (128 start times) in that bucket and scanned the list for each buffer it
    /// placed: buffers live to the end of a trace all end in the last bucket, so unless the
    /// number of start times was a multiple of 128 the plan was quadratic (262,144 buffers in
    /// 0.8 s, 262,145 in 73 s, 399,999 in 249 s, 400,000 in 1 s). A burst of frees with no
    /// allocation between ends its buffers in one bucket too.
    #[test]
    fn the_cost_of_a_plan_grows_near_linearly() {
        for waves in [1, 2] {
            let cost = |n: u64| {
                let buffers = live_to_the_end(n, waves);
                let (plan, work) = plan_counted(&buffers, 16).unwrap();
                assert_eq!(crate::plan::validate(&buffers, &plan), Ok(()));
                assert_eq!(plan, super::plan(&buffers, 16).unwrap());
                work
            };
            let (aligned, odd) = (cost(8192), cost(8193));
            let (double, odd_double) = (cost(16_384), cost(16_385));
            let per = |work: u64, n: u64| work as f64 / (n * waves) as f64;
            // A placement updates at most a few hundred unions (the `up` unions of the cached
            // levels below its nodes, 2^8 at most), however many buffers came before.
            for (work, n) in [
                (aligned, 8192),
                (odd, 8193),
                (double, 16_384),
                (odd_double, 16_385),
            ] {
                assert!(per(work, n) < 512.0, "{waves} waves of {n}: {work} steps");
            }
            // One more start time costs about nothing more; twice the buffers about twice.
            assert!(
                odd <= aligned * 3 / 2,
                "{waves} waves: {aligned} then {odd}"
            );
            assert!(
                odd_double <= 3 * odd,
                "{waves} waves: {odd} then {odd_double}"
            );
        }
    }

    #[test]
    fn smallest_fitting_hole_wins_lowest_on_a_tie() {
        // Holes [2,6) (4 B) and [8,11) (3 B): a 3-byte buffer takes the tighter one.
        let placed = [(0, 2), (6, 8), (11, 12)];
        assert_eq!(best_fit_offset(&placed, 3, 1), Ok(8));
        assert_eq!(best_fit_offset(&placed, 4, 1), Ok(2));
        assert_eq!(best_fit_offset(&placed, 5, 1), Ok(12));
        // Two equal holes: the lower one.
        assert_eq!(best_fit_offset(&[(2, 4), (6, 8)], 2, 1), Ok(0));
    }

    #[test]
    fn alignment_rounds_each_hole_start() {
        // With alignment 8 the hole after [0,3) starts at 8: [8,16) fits 8 bytes, [8,12) does not.
        assert_eq!(best_fit_offset(&[(0, 3), (16, 20)], 8, 8), Ok(8));
        assert_eq!(best_fit_offset(&[(0, 3), (12, 20)], 8, 8), Ok(24));
    }
}
