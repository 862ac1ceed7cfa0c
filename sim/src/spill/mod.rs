//! Spill and reload under a memory limit: what an out-of-core runtime would write to disk and
//! read back to run a trace in less memory than it needs.
//!
//! **Model.** The trace replays through a policy built with the limit. An allocation the
//! policy cannot serve evicts live data to disk (frees it in the policy) until the allocation
//! fits; evicted data is reloaded (allocated again, anywhere) before its next use, which needs
//! room too and may evict in turn. A trace shows only births and deaths, so what counts as a
//! *use* is a choice:
//! - [`Units::Blocks`] (the default): each allocation is its own unit, used at its allocation
//!   and at its free (a program reads a buffer before it lets it go). Between the two the trace
//!   says nothing, so the model cannot see a buffer being read in the meantime: real programs
//!   touch their data more often, and every figure here is a lower estimate of their I/O.
//! - [`Units::Executors`]: each event belongs to a unit (a thread of a malloc trace, a
//!   TensorFlow operation, a PyTorch annotation phase) and an allocation belongs to the unit
//!   that made it. Whenever a unit has an event, all its evicted data is reloaded first, and
//!   evictions take a whole unit's resident data at once (the article's executors). A unit
//!   larger than the limit can never be wholly resident: its allocations past the limit fail.
//!
//! The block being served and the unit having the event are never evicted. An allocation that
//! still does not fit once nothing else is evictable counts as `failed` and is dropped (its
//! free is ignored); a reload that cannot fit counts as a `reload_failure`.
//!
//! **Eviction policies** ([`Evict`]): `lru` evicts the unit used longest ago; `furthest` the
//! one whose next use is furthest in the future (Belady's choice, possible because the trace
//! knows the future); `largest` the one with the most resident bytes; `executor` the article's
//! queue: only the next [`EXECUTOR_QUEUE_EVENTS`] events are known (the queued tasks), units
//! with no use among them are evicted first (the least recently used of them), then the unit
//! whose next use in the queue is furthest.
//!
//! **Costs.** Every eviction writes the victim's bytes (no clean copies are kept) and every
//! reload reads them; each eviction of a unit and each reload of a unit (or of one block) is
//! one I/O operation. [`IoModel::seconds`] = bytes / bandwidth + operations × latency. A
//! *stall* is an event that waited for at least one write or read.
//!
//! **OS swap baseline** ([`os_swap`]): the same trace through the same policy without a limit
//! (virtual memory is not limited), with physical memory of `limit / 4 KiB` page frames
//! managed by LRU. A use touches every 4 KiB page of the block's reserved range (in executor
//! mode, every page of the unit's live blocks when the unit becomes active, and the block's
//! own pages at its allocation and free); touching a swapped-out page reads it back, a new
//! page costs nothing, and a page that no live block overlaps any more is dropped at once,
//! from memory and swap (as if the allocator returned it to the kernel, which favours the
//! baseline). Each page moved is one I/O operation.
//!
//! **Lower bound.** At the peak, live bytes exceed the limit by `peak live − limit`, and those
//! bytes must be on disk then, so no eviction policy spills less ([`lower_bound_bytes`]).

mod engine;
mod os_swap;
mod victims;

pub use engine::simulate;
pub use os_swap::os_swap;

use crate::trace::TraceView;

/// Page size of the OS swap baseline.
pub const PAGE_BYTES: u64 = 4096;

/// How many upcoming events the `executor` policy knows (its task queue).
pub const EXECUTOR_QUEUE_EVENTS: u64 = 1024;

/// Which unit to evict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Evict {
    Lru,
    Furthest,
    Largest,
    Executor,
}

impl Evict {
    /// Every policy, in the order tables list them.
    pub const ALL: [Self; 4] = [Self::Lru, Self::Furthest, Self::Largest, Self::Executor];

    /// The name on the command line and in JSON.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::Furthest => "furthest",
            Self::Largest => "largest",
            Self::Executor => "executor",
        }
    }

    /// Parses a name.
    ///
    /// # Errors
    /// A message listing the known names.
    pub fn parse(text: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|e| e.name() == text.trim())
            .ok_or_else(|| {
                format!("unknown eviction policy {text:?}: use lru, furthest, largest or executor")
            })
    }
}

/// Disk speed for the time estimates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IoModel {
    pub bandwidth_bytes_per_s: f64,
    pub latency_s: f64,
}

impl IoModel {
    /// Seconds to move `bytes` in `ops` operations.
    #[must_use]
    pub fn seconds(&self, bytes: u64, ops: u64) -> f64 {
        let transfer = if self.bandwidth_bytes_per_s > 0.0 {
            bytes as f64 / self.bandwidth_bytes_per_s
        } else {
            0.0
        };
        transfer + ops as f64 * self.latency_s
    }
}

/// What one unit of data is (see the module docs).
#[derive(Clone, Copy, Debug)]
pub enum Units<'a> {
    /// Each allocation, used at its allocation and its free.
    Blocks,
    /// The unit of each event (dense ids from 0), one per event of the trace.
    Executors(&'a [u32]),
}

/// One eviction policy's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct SpillStats {
    pub evict: Evict,
    /// Bytes written to disk (every eviction).
    pub spilled_bytes: u64,
    /// Bytes read back.
    pub reloaded_bytes: u64,
    /// Units evicted.
    pub evictions: u64,
    /// Reload operations.
    pub reloads: u64,
    /// Events that waited for I/O.
    pub stalls: u64,
    /// Allocations not served even after evicting everything evictable.
    pub failed: u64,
    /// Reloads that could not fit even after evicting everything evictable.
    pub reload_failures: u64,
    /// Highest bytes on disk at once.
    pub peak_spilled_bytes: u64,
    pub estimated_io_seconds: f64,
}

impl SpillStats {
    /// Nothing moved yet.
    #[must_use]
    pub fn zero(evict: Evict) -> Self {
        Self {
            evict,
            spilled_bytes: 0,
            reloaded_bytes: 0,
            evictions: 0,
            reloads: 0,
            stalls: 0,
            failed: 0,
            reload_failures: 0,
            peak_spilled_bytes: 0,
            estimated_io_seconds: 0.0,
        }
    }
}

/// The OS swap baseline's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct OsSwapStats {
    pub spilled_bytes: u64,
    pub reloaded_bytes: u64,
    pub page_outs: u64,
    pub page_ins: u64,
    pub estimated_io_seconds: f64,
}

/// Why a simulation could not run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpillError {
    #[error("{units} units for {events} events: one unit per event is needed")]
    UnitsLength { units: usize, events: usize },
    #[error("event {event}: the policy rejected a free: {reason}")]
    FreeRejected { event: usize, reason: String },
    #[error(
        "event {event}: the OS swap baseline models every 4 KiB page, and the live blocks would \
         span {pages} pages, more than it tracks (2^24, 64 GiB)"
    )]
    TooManyPages { event: usize, pages: u64 },
}

/// Bytes no eviction policy can avoid spilling: peak live bytes minus the limit.
#[must_use]
pub fn lower_bound_bytes(trace: &TraceView<'_>, limit_bytes: u64) -> u64 {
    trace.peak_live().0.saturating_sub(limit_bytes)
}

/// For each event, the index of the next event of the same unit (`u64::MAX`: none).
fn next_same_unit(units: &[u32]) -> Vec<u64> {
    let count = units.iter().map(|&u| u as usize + 1).max().unwrap_or(0);
    let mut seen = vec![u64::MAX; count];
    let mut next = vec![u64::MAX; units.len()];
    for (i, &u) in units.iter().enumerate().rev() {
        if let (Some(n), Some(s)) = (next.get_mut(i), seen.get_mut(u as usize)) {
            *n = *s;
            *s = i as u64;
        }
    }
    next
}

/// Removes `item` from `list`, where `pos[item]` is its index, keeping `pos` right.
fn swap_remove_at(list: &mut Vec<u32>, pos: &mut [u32], item: u32) {
    let Some(&at) = pos.get(item as usize) else {
        return;
    };
    let at = at as usize;
    if list.get(at) != Some(&item) {
        return;
    }
    list.swap_remove(at);
    if let Some(&moved) = list.get(at)
        && let Some(p) = pos.get_mut(moved as usize)
    {
        *p = at as u32;
    }
}
