//! `search`: an exact planner in the manner of google/minimalloc (Moffitt, ASPLOS 2023).
//!
//! Decision problem: do the buffers fit in `capacity`? Depth-first search over *canonical*
//! solutions: the branching choice is which unplaced buffer goes next, and it always goes at its
//! lowest feasible offset (just above the placed buffers it collides with), since any packing can
//! be pushed down until every buffer rests on 0 or on another. Along a branch placements increase
//! in (offset, preorder index), which removes permuted duplicates. Candidates are tried by
//! increasing (lowest offset, preorder index); a candidate is *dominated* (and so are all after
//! it) when its offset is at or above some unplaced buffer's lowest offset plus size. Inference
//! prunes dead branches: the buffers live together just before each end time form a *section*;
//! a section's unplaced bytes must fit between its floor (the highest placed member's top, the
//! lowest unplaced member's lowest offset, the current offset) and the capacity. After a failure
//! under a buffer that had nothing unplaced above it, its siblings are not tried (hatless
//! pruning). When the last buffer crossing a section boundary is placed, the rest splits into
//! independent sub-problems (dynamic decomposition). Each sub-problem orders its buffers by a
//! heuristic (`WAT`: area, then width, then section total, descending); several heuristics take
//! turns with a doubling node budget, which stops one unlucky order from stalling the search.
//!
//! Minimisation: the incumbent is the better of greedy-by-size and pushdown; the bound is the
//! max-live bytes; the search probes the bound first, then bisects between the two, keeping each
//! plan found. A time budget stops the search; the best plan so far is returned, not proven.
//!
//! Cost: the preprocessing sweep is O(n log n + overlap pairs + total section size); each search
//! node costs O(k log k) to order k candidates plus, per tried candidate, O(overlaps + sections)
//! propagation and an O(sections) check. The search is exponential in the worst case (the problem
//! is NP-complete); instances above [`MAX_SEARCH_UNITS`] units or [`MAX_OVERLAP_PAIRS`] pairs are
//! not searched, only bounded.

mod solver;
mod sweep;

use std::time::{Duration, Instant};

use super::units::{Unit, prepare};
use super::{Buffer, Plan, PlanError, greedy_by_size, pushdown};
use solver::{Solver, Status};

/// Largest number of planning units the search will take on.
pub const MAX_SEARCH_UNITS: usize = 20_000;
/// Largest number of pairs of units live at the same time the search will take on.
pub const MAX_OVERLAP_PAIRS: usize = 20_000_000;

/// What the search is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchMode {
    /// Find any plan of at most `capacity_bytes` (the decision problem of minimalloc's CLI).
    Fit { capacity_bytes: u64 },
    /// Find the smallest plan.
    Minimise,
}

/// minimalloc's solver switches (all on by default; the tests turn them off one at a time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchParams {
    /// Placements increase in (offset, preorder index) along a branch.
    pub canonical_only: bool,
    /// The check adds a section's unplaced bytes to its floor.
    pub section_inference: bool,
    /// Skip candidates at or above the lowest unplaced top.
    pub check_dominance: bool,
    /// Raise a section's floor to the lowest offset of its unplaced members.
    pub unallocated_floor: bool,
    /// Split into independent sub-problems when a section boundary is no longer crossed.
    pub dynamic_decomposition: bool,
    /// The check uses max(floor, current offset) (sound only with `canonical_only`).
    pub monotonic_floor: bool,
    /// Stop trying siblings after a failed buffer that had nothing unplaced above it.
    pub hatless_pruning: bool,
    /// Preordering heuristics, letters compared descending: A area, C sections, L lower,
    /// O overlaps, T section total, U upper, W width, Z size. More than one: round-robin.
    pub heuristics: &'static [&'static str],
}

impl Default for SearchParams {
    fn default() -> Self {
        Self {
            canonical_only: true,
            section_inference: true,
            check_dominance: true,
            unallocated_floor: true,
            dynamic_decomposition: true,
            monotonic_floor: true,
            hatless_pruning: true,
            heuristics: &["WAT", "TAW", "TWA"],
        }
    }
}

/// Input of [`search()`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchOptions {
    /// Minimum alignment of every buffer (a power of two).
    pub align_bytes: u64,
    pub mode: SearchMode,
    /// Wall-clock limit; `None` searches to the end.
    pub time_budget: Option<Duration>,
    pub params: SearchParams,
}

impl Default for SearchOptions {
    fn default() -> Self {
        Self {
            align_bytes: 1,
            mode: SearchMode::Minimise,
            time_budget: None,
            params: SearchParams::default(),
        }
    }
}

/// Counters of a search, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SearchStats {
    /// Search nodes visited, over all probes.
    pub nodes: u64,
    /// Nodes whose every child failed.
    pub backtracks: u64,
    /// Decision problems solved (one per capacity tried).
    pub probes: u32,
    /// The max-live lower bound of the planning units.
    pub lower_bound_bytes: u64,
}

/// What [`search()`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchOutcome {
    /// The best plan found: the search's own, or the heuristic incumbent when the search found
    /// nothing better (or nothing within the capacity).
    pub plan: Plan,
    /// True when no smaller plan exists for the planning model: the plan meets the lower bound,
    /// or the search proved every smaller capacity infeasible. With [`SearchMode::Fit`] only the
    /// first of these is tried.
    pub proven_optimal: bool,
    /// [`SearchMode::Fit`]: `Some(true)` when the plan fits, `Some(false)` when nothing can,
    /// `None` when the budget ran out first (or the instance was too large to search).
    /// [`SearchMode::Minimise`]: `None`.
    pub fits: Option<bool>,
    pub stats: SearchStats,
}

fn height(units: &[Unit], offsets: &[u64]) -> u64 {
    units
        .iter()
        .zip(offsets)
        .map(|(u, &o)| o.saturating_add(u.size_bytes))
        .max()
        .unwrap_or(0)
}

fn max_live(units: &[Unit]) -> u64 {
    let mut events: Vec<(u64, bool, u64)> = Vec::with_capacity(units.len() * 2);
    for u in units {
        events.push((u.lower, true, u.size_bytes));
        events.push((u.upper, false, u.size_bytes));
    }
    events.sort_unstable();
    let (mut live, mut max) = (0u64, 0u64);
    for (_, is_start, size) in events {
        if is_start {
            live = live.saturating_add(size);
            max = max.max(live);
        } else {
            live = live.saturating_sub(size);
        }
    }
    max
}

/// Result of one decision probe.
enum Probe {
    Found(Vec<u64>),
    Infeasible,
    OutOfTime,
}

/// Solves the decision problem at `capacity` from a fresh state.
fn probe(
    problem: &sweep::Problem,
    params: &SearchParams,
    capacity: u64,
    deadline: Option<Instant>,
    stats: &mut SearchStats,
) -> Probe {
    let mut solver = Solver::new(problem, params, capacity, deadline);
    let status = solver.solve();
    stats.nodes += solver.nodes;
    stats.backtracks += solver.backtracks;
    stats.probes += 1;
    match status {
        Status::Found => Probe::Found(solver.solution),
        Status::NotFound => Probe::Infeasible,
        Status::Aborted | Status::Deadline => Probe::OutOfTime,
    }
}

/// Plans `buffers` exactly (or as well as the time budget allows); see the module docs.
///
/// # Errors
/// An input error of the buffers ([`super::validate()`]'s rules), a bad alignment option, or
/// [`PlanError::Internal`] if the search thread could not run.
pub fn search(buffers: &[Buffer], opts: &SearchOptions) -> Result<SearchOutcome, PlanError> {
    let start = Instant::now();
    let deadline = opts.time_budget.and_then(|b| start.checked_add(b));
    let units = prepare(buffers, opts.align_bytes)?;
    let us = &units.units;

    // Pushdown first (fast); greedy-by-size only while the budget lasts.
    let mut best = pushdown::unit_offsets(us)?;
    let mut best_height = height(us, &best);
    if let Some(gs) = greedy_by_size::unit_offsets_until(us, deadline)?
        && height(us, &gs) <= best_height
    {
        best_height = height(us, &gs);
        best = gs;
    }
    let lb = max_live(us);
    let stats = SearchStats {
        lower_bound_bytes: lb,
        ..SearchStats::default()
    };

    let searchable = us.len() <= MAX_SEARCH_UNITS;
    let problem = if searchable {
        sweep::sweep(us, MAX_OVERLAP_PAIRS)
    } else {
        None
    };
    let params = opts.params;
    // Deep instances recurse deeply: run the search on a thread with room for it.
    let stack_bytes = (16usize << 20).saturating_add(us.len().saturating_mul(4096));
    let run = |stats: &mut SearchStats| -> (Vec<u64>, u64, bool, Option<bool>) {
        match opts.mode {
            SearchMode::Fit { capacity_bytes } => {
                if best_height <= capacity_bytes {
                    return (best.clone(), best_height, best_height == lb, Some(true));
                }
                if lb > capacity_bytes {
                    return (best.clone(), best_height, false, Some(false));
                }
                let Some(problem) = &problem else {
                    return (best.clone(), best_height, false, None);
                };
                match probe(problem, &params, capacity_bytes, deadline, stats) {
                    Probe::Found(sol) => {
                        let h = height(us, &sol);
                        (sol, h, h == lb, Some(true))
                    }
                    Probe::Infeasible => (best.clone(), best_height, false, Some(false)),
                    Probe::OutOfTime => (best.clone(), best_height, false, None),
                }
            }
            SearchMode::Minimise => {
                let (mut plan, mut h) = (best.clone(), best_height);
                if h <= lb {
                    return (plan, h, true, None);
                }
                let Some(problem) = &problem else {
                    return (plan, h, false, None);
                };
                let mut complete = true;
                // The bound is often the optimum, and then it is found quickly; but proving it
                // infeasible can take long, so it gets at most half of the budget.
                let first_deadline = deadline.map(|d| {
                    let now = Instant::now();
                    now.checked_add(d.saturating_duration_since(now) / 2)
                        .unwrap_or(d)
                });
                let mut lo = lb;
                match probe(problem, &params, lb, first_deadline, stats) {
                    Probe::Found(sol) => {
                        h = height(us, &sol);
                        plan = sol;
                    }
                    Probe::Infeasible => lo = lb.saturating_add(1),
                    Probe::OutOfTime => {
                        complete = false;
                        lo = lb.saturating_add(1);
                    }
                }
                let mut hi = h.saturating_sub(1);
                while lo <= hi && h > lb {
                    let mid = lo + (hi - lo) / 2;
                    match probe(problem, &params, mid, deadline, stats) {
                        Probe::Found(sol) => {
                            h = height(us, &sol);
                            plan = sol;
                            hi = h.saturating_sub(1);
                        }
                        Probe::Infeasible => lo = mid.saturating_add(1),
                        Probe::OutOfTime => {
                            complete = false;
                            break;
                        }
                    }
                }
                let proven = h <= lb || (complete && lo > hi);
                (plan, h, proven, None)
            }
        }
    };
    let initial_stats = stats;
    let ((offsets, total, proven_optimal, fits), stats) = std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("plan-search".to_owned())
            .stack_size(stack_bytes)
            .spawn_scoped(scope, || {
                let mut s = initial_stats;
                let r = run(&mut s);
                (r, s)
            })
            .map_err(|e| PlanError::Internal(format!("cannot start the search thread: {e}")))?;
        handle
            .join()
            .map_err(|_| PlanError::Internal("the search thread panicked".to_owned()))
    })?;
    let plan = units.expand(&offsets, total)?;
    Ok(SearchOutcome {
        plan,
        proven_optimal,
        fits,
        stats,
    })
}
