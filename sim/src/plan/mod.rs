//! Static ("offline") memory planning: every buffer's lifetime is known before anything runs, so
//! a planner assigns each one a byte offset in a single pool, once.
//!
//! Vocabulary: a [`Buffer`] has a size, a half-open lifetime `[lower, upper)` in abstract time
//! units (operator indices, event indices, minimalloc's time points), an alignment and an
//! optional [`Overwrite`] spec (MegEngine's `alloc_overwrite`: this buffer lives inside another
//! one at a fixed offset, for in-place operators). A [`Plan`] gives one offset per buffer and the
//! pool size. Two buffers *conflict* when their lifetimes intersect (`a.lower < b.upper &&
//! b.lower < a.upper`); a plan is valid when no two conflicting buffers share a byte, except an
//! overwrite child at its declared place inside an ancestor ([`validate()`]).
//!
//! Planners, by registry name ([`PLANNER_NAMES`], run through [`run_planner`]):
//! - `naive` ([`naive`]): every buffer its own slot, the sum of the sizes;
//! - `greedy-by-size` ([`greedy_by_size`]): TFLite's offset planner, largest first, best fit;
//! - `greedy-by-breadth` ([`greedy_by_breadth`]) and `shared-objects` ([`shared_objects`]):
//!   TFLite's shared-object planners (buffers grouped into objects laid end to end);
//! - `pushdown` ([`pushdown`]) and `pushdown-best-fit` ([`best_fit`]): MegEngine's planners;
//! - `search` ([`mod@search`]): an exact branch-and-bound planner after google/minimalloc.
//!
//! `lower-bound` ([`BOUND_NAMES`], [`lower_bound`]) is a bound, not a plan: no valid plan is
//! smaller than the maximum over time of the live bytes.
//!
//! Overwrite groups (a root buffer and the chain of buffers overwriting it) are planned as one
//! unit: the root's size, held from the group's first start to its last end. Buffers that need
//! no memory (size 0, or an empty lifetime) get offset 0 unless they belong to such a group.

use std::time::Duration;

pub mod best_fit;
pub mod bounds;
pub mod greedy_by_breadth;
pub mod greedy_by_size;
mod interval_index;
pub mod naive;
mod occupancy;
pub mod pieces;
pub mod pushdown;
pub mod search;
pub mod shared_objects;
#[cfg(test)]
mod tests;
mod units;
pub mod validate;

pub use bounds::{Bounds, lower_bound, max_live_buffers, max_live_bytes, positional_max_bytes};
pub use search::{SearchMode, SearchOptions, SearchOutcome, SearchParams, SearchStats, search};
pub use validate::validate;

/// "This buffer lives inside buffer `parent`, starting `offset_bytes` into it" (MegEngine's
/// `add_overwrite_spec`). A parent has at most one child; the child must fit inside the parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Overwrite {
    /// Index of the overwritten buffer in the same slice.
    pub parent: usize,
    /// Where the child starts inside the parent.
    pub offset_bytes: u64,
}

/// One buffer to place. Its identity is its index in the slice handed to a planner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Buffer {
    pub size_bytes: u64,
    /// First time unit at which the buffer is live.
    pub lower: u64,
    /// First time unit at which it is dead again (half-open lifetime, minimalloc's convention).
    pub upper: u64,
    /// The offset must be a multiple of this (a non-zero power of two; 1 means none).
    pub align_bytes: u64,
    pub overwrite: Option<Overwrite>,
}

impl Buffer {
    /// A buffer of `size_bytes` live over `[lower, upper)`, no alignment, no overwrite.
    #[must_use]
    pub fn new(size_bytes: u64, lower: u64, upper: u64) -> Self {
        Self {
            size_bytes,
            lower,
            upper,
            align_bytes: 1,
            overwrite: None,
        }
    }

    /// TFLite's `TensorUsageRecord{size, first_task, last_task}`, whose interval is closed.
    #[must_use]
    pub fn from_closed(size_bytes: u64, first_task: u64, last_task: u64) -> Self {
        Self::new(size_bytes, first_task, last_task.saturating_add(1))
    }

    /// The same buffer with an alignment.
    #[must_use]
    pub fn with_align(mut self, align_bytes: u64) -> Self {
        self.align_bytes = align_bytes;
        self
    }

    /// The same buffer declared to overwrite `parent` at `offset_bytes`.
    #[must_use]
    pub fn overwriting(mut self, parent: usize, offset_bytes: u64) -> Self {
        self.overwrite = Some(Overwrite {
            parent,
            offset_bytes,
        });
        self
    }

    /// True when both lifetimes share a time unit.
    #[must_use]
    pub fn overlaps_in_time(&self, other: &Self) -> bool {
        self.lower < other.upper && other.lower < self.upper
    }

    /// True when the buffer occupies memory at some time.
    #[must_use]
    pub fn needs_memory(&self) -> bool {
        self.size_bytes > 0 && self.lower < self.upper
    }
}

/// One offset per buffer (same order as the input) and the pool size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub offsets: Vec<u64>,
    /// Bytes the pool must have: at least every `offset + size`.
    pub total_bytes: u64,
}

/// The shared-object form of a plan (TFLite's `ObjectsAssignment`): buffers grouped into objects
/// whose members never live at the same time; an object is as large as its largest member.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedObjects {
    /// The object holding each buffer; `None` for a buffer that needs no memory.
    pub object_of: Vec<Option<usize>>,
    pub object_sizes_bytes: Vec<u64>,
}

impl SharedObjects {
    /// Sum of the object sizes: the figure the shared-object planners minimise.
    #[must_use]
    pub fn total_bytes(&self) -> u64 {
        self.object_sizes_bytes
            .iter()
            .fold(0u64, |acc, &s| acc.saturating_add(s))
    }

    /// Start of each object when they are laid end to end in id order with no padding
    /// (TFLite's `ObjectsToOffsets`). The planners' own [`Plan`]s also pad each object to its
    /// members' alignment.
    #[must_use]
    pub fn object_offsets_bytes(&self) -> Vec<u64> {
        let mut top = 0u64;
        self.object_sizes_bytes
            .iter()
            .map(|&s| {
                let at = top;
                top = top.saturating_add(s);
                at
            })
            .collect()
    }
}

/// Lays shared objects end to end (each aligned to its members' largest alignment) and turns
/// the per-unit object ids into a plan plus the per-buffer grouping.
pub(crate) fn objects_plan(
    units: &units::Units,
    unit_object: &[usize],
    object_sizes_bytes: Vec<u64>,
) -> Result<(Plan, SharedObjects), PlanError> {
    let mut object_align = vec![1u64; object_sizes_bytes.len()];
    for (u, &o) in units.units.iter().zip(unit_object) {
        if let Some(a) = object_align.get_mut(o) {
            *a = (*a).max(u.align_bytes);
        }
    }
    let mut object_offset = Vec::with_capacity(object_sizes_bytes.len());
    let mut top = 0u64;
    for (&size, &align) in object_sizes_bytes.iter().zip(&object_align) {
        let at = align_up(top, align).ok_or(PlanError::Overflow)?;
        object_offset.push(at);
        top = at.checked_add(size).ok_or(PlanError::Overflow)?;
    }
    let unit_offsets: Vec<u64> = unit_object
        .iter()
        .map(|&o| object_offset.get(o).copied().unwrap_or(0))
        .collect();
    let plan = units.expand(&unit_offsets, top)?;
    let object_of = (0..units.num_buffers())
        .map(|i| {
            units
                .unit_of_buffer(i)
                .and_then(|u| unit_object.get(u).copied())
        })
        .collect();
    Ok((
        plan,
        SharedObjects {
            object_of,
            object_sizes_bytes,
        },
    ))
}

/// Settings shared by the planners; each reads what it understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanOptions {
    /// Minimum alignment of every planned unit, on top of each buffer's own (TFLite's
    /// `base_addr_align_bytes`, MegEngine's `alignment`). A power of two; 1 means none.
    pub align_bytes: u64,
    /// Pool size to fit in: sets [`PlanResult::fits`], and turns `search` into a decision
    /// problem (find any plan within the capacity) instead of a minimisation.
    pub capacity_bytes: Option<u64>,
    /// Wall-clock budget of `search`; after it, the best plan so far is returned, unproven.
    pub time_budget: Option<Duration>,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            align_bytes: 1,
            capacity_bytes: None,
            time_budget: None,
        }
    }
}

/// What [`run_planner`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanResult {
    /// The registry name of the planner.
    pub planner: &'static str,
    pub plan: Plan,
    /// The object grouping, for the shared-object planners (`naive`, `greedy-by-breadth`,
    /// `shared-objects`).
    pub objects: Option<SharedObjects>,
    /// `search` only: whether the plan is proven minimal for the planning model (overwrite
    /// groups held whole). `None` for the heuristics, which prove nothing.
    pub proven_optimal: Option<bool>,
    /// With a capacity: whether the plan fits in it. `search` may also answer `Some(false)`
    /// when it proved that nothing fits, or `None` when it ran out of time undecided.
    pub fits: Option<bool>,
}

/// Why a planner or the validator rejected its input or a plan.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("buffer {index}: lifetime [{lower}, {upper}) ends before it starts")]
    BadLifetime {
        index: usize,
        lower: u64,
        upper: u64,
    },
    #[error("buffer {index}: alignment {align_bytes} is not a power of two")]
    BadAlign { index: usize, align_bytes: u64 },
    #[error("alignment option {0} is not a power of two")]
    BadAlignOption(u64),
    #[error("buffer {index}: bad overwrite spec: {reason}")]
    BadOverwrite { index: usize, reason: String },
    #[error("sizes overflow 64 bits")]
    Overflow,
    #[error("plan has {offsets} offsets for {buffers} buffers")]
    LengthMismatch { buffers: usize, offsets: usize },
    #[error("buffers {a} and {b} are live at the same time and overlap in memory")]
    Overlap { a: usize, b: usize },
    #[error("buffer {index}: offset {offset_bytes} is not a multiple of {align_bytes}")]
    Misaligned {
        index: usize,
        offset_bytes: u64,
        align_bytes: u64,
    },
    #[error("buffer {index}: ends at {end_bytes}, beyond the plan's {total_bytes} B")]
    BeyondTotal {
        index: usize,
        end_bytes: u64,
        total_bytes: u64,
    },
    #[error("buffer {index}: overwrite child at {offset_bytes}, declared at {expected_bytes}")]
    OverwriteMisplaced {
        index: usize,
        offset_bytes: u64,
        expected_bytes: u64,
    },
    #[error("unknown planner {name:?}; known planners: {}", PLANNER_NAMES.join(", "))]
    UnknownPlanner { name: String },
    #[error("{0:?} is a bound, not a planner: use plan::lower_bound")]
    NotAPlanner(String),
    #[error("internal planner error: {0}")]
    Internal(String),
}

/// Every planner name, in the order frontends list them.
pub const PLANNER_NAMES: &[&str] = &[
    "naive",
    "greedy-by-size",
    "greedy-by-breadth",
    "shared-objects",
    "pushdown",
    "pushdown-best-fit",
    "search",
];

/// Names of the bounds reported beside the planners (see [`lower_bound`]).
pub const BOUND_NAMES: &[&str] = &["lower-bound"];

/// Runs the planner called `name` (one of [`PLANNER_NAMES`]). `search` minimises the pool size,
/// or with `opts.capacity_bytes` looks for any plan within it.
///
/// # Errors
/// [`PlanError::UnknownPlanner`] / [`PlanError::NotAPlanner`] for a bad name, and the input
/// errors of [`validate()`] (bad lifetime, alignment or overwrite spec, overflow).
pub fn run_planner(
    name: &str,
    buffers: &[Buffer],
    opts: &PlanOptions,
) -> Result<PlanResult, PlanError> {
    let planner = PLANNER_NAMES
        .iter()
        .copied()
        .find(|n| *n == name)
        .ok_or_else(|| {
            if BOUND_NAMES.contains(&name) {
                PlanError::NotAPlanner(name.to_owned())
            } else {
                PlanError::UnknownPlanner {
                    name: name.to_owned(),
                }
            }
        })?;
    let (plan, objects, proven_optimal, search_fits) = match planner {
        "naive" => {
            let (plan, objects) = naive::plan(buffers, opts.align_bytes)?;
            (plan, Some(objects), None, None)
        }
        "greedy-by-size" => (
            greedy_by_size::plan(buffers, opts.align_bytes)?,
            None,
            None,
            None,
        ),
        "greedy-by-breadth" => {
            let (plan, objects) = greedy_by_breadth::plan(buffers, opts.align_bytes)?;
            (plan, Some(objects), None, None)
        }
        "shared-objects" => {
            let (plan, objects) = shared_objects::plan(buffers, opts.align_bytes)?;
            (plan, Some(objects), None, None)
        }
        "pushdown" => (pushdown::plan(buffers, opts.align_bytes)?, None, None, None),
        "pushdown-best-fit" => (best_fit::plan(buffers, opts.align_bytes)?, None, None, None),
        _ => {
            let mode = match opts.capacity_bytes {
                Some(capacity_bytes) => SearchMode::Fit { capacity_bytes },
                None => SearchMode::Minimise,
            };
            let outcome = search::search(
                buffers,
                &SearchOptions {
                    align_bytes: opts.align_bytes,
                    mode,
                    time_budget: opts.time_budget,
                    params: SearchParams::default(),
                },
            )?;
            (
                outcome.plan,
                None,
                Some(outcome.proven_optimal),
                Some(outcome.fits),
            )
        }
    };
    let fits = match search_fits {
        Some(fits) => fits,
        None => opts.capacity_bytes.map(|c| plan.total_bytes <= c),
    };
    Ok(PlanResult {
        planner,
        plan,
        objects,
        proven_optimal,
        fits,
    })
}

/// `x` rounded up to a multiple of the power of two `align`, or `None` on overflow.
pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    let mask = align.checked_sub(1)?;
    x.checked_add(mask).map(|v| v & !mask)
}

/// Like [`align_up`], saturating at `u64::MAX` (for bounds that are compared, never stored).
pub(crate) fn align_up_saturating(x: u64, align: u64) -> u64 {
    align_up(x, align).unwrap_or(u64::MAX)
}

/// One buffer per allocation of a trace, indexed by allocation id: alive from its `Alloc`
/// event to its `Free` event (or the end of the trace), in event-index time. Zero-byte requests
/// are planned as 1 byte so each still gets its own address. This is what the `oracle` policy
/// plans and what `allocview plan` makes of a trace.
#[must_use]
pub fn trace_buffers(trace: &crate::trace::TraceView<'_>) -> Vec<Buffer> {
    use crate::trace::EventKind;
    let end = trace.len() as u64;
    // An id that never shows an alloc event (none in a valid trace) holds no memory.
    let mut buffers = vec![Buffer::new(1, end, end); trace.num_allocs as usize];
    for (i, ((&kind, &id), &size)) in trace
        .kind
        .iter()
        .zip(trace.alloc_id)
        .zip(trace.size_bytes)
        .enumerate()
    {
        let Some(b) = buffers.get_mut(id as usize) else {
            continue;
        };
        match EventKind::from_code(kind) {
            Some(EventKind::Alloc) => *b = Buffer::new(size.max(1), i as u64, end),
            Some(EventKind::Free) => b.upper = i as u64,
            _ => {}
        }
    }
    buffers
}
