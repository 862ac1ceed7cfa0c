//! `oracle`: the offline plan of a whole trace, knowing the future ("if an oracle told us the
//! whole plan in advance", the libtracemalloc article).
//!
//! At construction the trace becomes one static-planning buffer per allocation: its lifetime is
//! `[index of its Alloc event, index of its Free event)`, or up to the trace length if it is never
//! freed, and its size is the request (a zero-byte request is planned as one byte, so that it has
//! an address of its own, as `malloc(0)` does). The buffers are planned once with greedy-by-size
//! best fit ([`crate::plan::greedy_by_size`], aligned to `align_bytes`), and each `alloc` is then
//! served at its planned offset, looked up by allocation id. The footprint is the plan's size,
//! held from the first event to the last (a static pool is allocated once); under a
//! `limit_bytes` smaller than the plan the footprint is the limit, and every allocation the plan
//! puts beyond it fails with out-of-memory. [`Oracle::lower_bound_bytes`] is the exact bound the
//! plan is measured against: the trace's maximum live bytes.
//!
//! The plan is made in pieces, between the moments where nothing is live, on every core
//! ([`crate::plan::pieces`]: each piece's plan is the whole plan's offsets for it). A replay that
//! streams its trace cannot hold a plan of every allocation: [`Oracle::streamed`] takes the plan
//! from a [`PlanFeed`] instead, one allocation at a time in allocation order, with the whole
//! plan's size known beforehand (the caller plans the stream's pieces in a first pass).
//!
//! A request the plan does not cover (unknown id, larger than planned, an alignment the offset
//! breaks, or a range that meets a live allocation because the replay left the trace's order)
//! is refused as unsupported. Live allocations are keyed by address; the free gaps between them
//! sit in address order in the chunked max-tree first fit uses (so the gap count and the largest
//! gap are at hand for the metrics): alloc and free find the gaps around a block by address,
//! O(log n); planning is greedy-by-size's cost.

use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError};

use super::Policy;
use super::config::PolicyConfig;
use super::fit_common::{AddrChunks, AddrMap, FreeIndex};
use crate::heap::{Addr, AllocError, Block, BlockState, Counters, FreeError, Placement, Request};
use crate::plan::{PlanError, pieces};
use crate::replay::{AddrTable, FAILED};
use crate::trace::TraceView;

/// Where a streamed [`Oracle`] finds its plan.
pub trait PlanFeed: Send {
    /// The next allocation of the plan, in allocation order: its id and planned offset (its
    /// planned size is its request, one byte for zero); `None` after the last.
    ///
    /// # Errors
    /// When the plan cannot be read.
    fn next_planned(&mut self) -> Result<Option<(u32, u64)>, String>;
}

/// The plan, shared by every clone (checkpoints copy only the live state).
#[derive(Debug)]
struct Planned {
    /// By allocation id; empty for a streamed plan. In 4 bytes each where they all fit, as
    /// they nearly always do (a plan under 4 GiB of allocations under 4 GiB): the explorers
    /// hold the plan for good, 16 bytes an allocation when wide. A planned size is never the
    /// table's "none" (sizes are at most 2^48 B: the replay refuses larger requests).
    offsets: AddrTable,
    sizes: AddrTable,
    /// A streamed plan's allocations, in allocation order.
    feed: Option<Feed>,
    total_bytes: u64,
    max_live_bytes: u64,
}

/// A streamed plan, read once: the feed and the record read ahead of the allocation it
/// belongs to (one the replay has not reached).
struct Feed(Mutex<(Box<dyn PlanFeed>, Option<Record>)>);

/// A plan's record: an allocation id and its planned offset.
type Record = (u32, u64);

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Feed")
    }
}

impl Planned {
    /// The planned offset and size of allocation `id` of `size_bytes`.
    fn lookup(&self, id: u32, size_bytes: u64) -> Result<(u64, u64), String> {
        let Some(Feed(feed)) = &self.feed else {
            let (addr, planned) = (self.offsets.at(id as usize), self.sizes.at(id as usize));
            return if addr == FAILED || planned == FAILED {
                Err(format!("allocation {id} is not in the plan"))
            } else {
                Ok((addr, planned))
            };
        };
        let mut guard = feed.lock().unwrap_or_else(PoisonError::into_inner);
        let (feed, ahead) = &mut *guard;
        // Ids grow in allocation order. The plan's records of allocations the replay never
        // asked for (a request refused before the policy sees it) are passed over; a record
        // of a later allocation waits for it.
        loop {
            let record = match ahead.take() {
                Some(r) => Some(r),
                None => feed.next_planned()?,
            };
            match record {
                Some((planned_id, addr)) if planned_id == id => {
                    return Ok((addr, size_bytes.max(1)));
                }
                Some((planned_id, _)) if planned_id < id => {}
                Some(later) => {
                    *ahead = Some(later);
                    return Err(format!(
                        "allocation {id} is not in the plan, which goes on with allocation {} \
                         (the replay is not the planned trace)",
                        later.0
                    ));
                }
                None => return Err(format!("allocation {id} comes after the plan's last")),
            }
        }
    }
}

/// A free gap, `(addr, len)`.
type Gap = (Addr, u64);

/// One live allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Live {
    id: u32,
    reserved_bytes: u64,
    requested_bytes: u64,
}

/// The `oracle` policy; see the module docs.
#[derive(Clone, Debug)]
pub struct Oracle {
    plan: Arc<Planned>,
    limit_bytes: Option<u64>,
    live: AddrMap<Live>,
    /// The free gaps between live allocations, in address order. Gaps are found by address
    /// alone, so every one carries handle 0.
    gaps: AddrChunks,
    counters: Counters,
    /// False in the copies `clone_box` makes (checkpoints, the state at the first OOM): a
    /// streamed plan is read once, by the oracle the replay drives.
    reads_plan: bool,
}

impl Oracle {
    /// Plans `trace` with `config.align_bytes` and `config.limit_bytes`.
    ///
    /// # Errors
    /// [`PlanError::BadAlignOption`] when the alignment is not a power of two, or
    /// [`PlanError::Overflow`] when the sizes do not fit in 64 bits.
    pub fn new(trace: &TraceView<'_>, config: &PolicyConfig) -> Result<Self, PlanError> {
        Self::new_observed(trace, config, None)
    }

    /// [`Self::new`], telling `progress` how far the plan has got (it places every allocation
    /// of the trace before the first event is replayed).
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn new_observed(
        trace: &TraceView<'_>,
        config: &PolicyConfig,
        progress: Option<&crate::plan::greedy_by_size::Progress>,
    ) -> Result<Self, PlanError> {
        let buffers = crate::plan::trace_buffers(trace);
        let (max_live, _) = trace.peak_live();
        let jobs = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let plan = pieces::plan_in_pieces(&buffers, config.align_bytes, jobs, progress)?;
        let sizes = AddrTable::of(buffers.iter().map(|b| b.size_bytes));
        Ok(Self::with_plan(
            Planned {
                offsets: AddrTable::of(plan.offsets.iter().copied()),
                sizes,
                feed: None,
                total_bytes: plan.total_bytes,
                max_live_bytes: max_live,
            },
            config,
        ))
    }

    /// The oracle of a streamed trace whose plan (see the module docs) is `total_bytes` large
    /// and whose maximum live bytes are `max_live_bytes`, its allocations' offsets read from
    /// `feed` as they come.
    #[must_use]
    pub fn streamed(
        config: &PolicyConfig,
        total_bytes: u64,
        max_live_bytes: u64,
        feed: Box<dyn PlanFeed>,
    ) -> Self {
        Self::with_plan(
            Planned {
                offsets: AddrTable::default(),
                sizes: AddrTable::default(),
                feed: Some(Feed(Mutex::new((feed, None)))),
                total_bytes,
                max_live_bytes,
            },
            config,
        )
    }

    fn with_plan(plan: Planned, config: &PolicyConfig) -> Self {
        let footprint_bytes = config
            .limit_bytes
            .map_or(plan.total_bytes, |l| l.min(plan.total_bytes));
        let mut gaps = AddrChunks::default();
        if footprint_bytes > 0 {
            gaps.insert(0, footprint_bytes, 0);
        }
        Self {
            plan: Arc::new(plan),
            limit_bytes: config.limit_bytes,
            live: AddrMap::default(),
            gaps,
            counters: Counters {
                footprint_bytes,
                free_bytes: footprint_bytes,
                free_blocks: u64::from(footprint_bytes > 0),
                largest_free_bytes: footprint_bytes,
                ..Counters::default()
            },
            reads_plan: true,
        }
    }

    /// The exact lower bound of any plan of this trace: its maximum live (requested) bytes.
    #[must_use]
    pub fn lower_bound_bytes(&self) -> u64 {
        self.plan.max_live_bytes
    }

    /// The size of the whole plan (the footprint, unless a limit cuts it).
    #[must_use]
    pub fn plan_total_bytes(&self) -> u64 {
        self.plan.total_bytes
    }

    /// The planned offset of allocation `id` (`None` for a streamed plan, read once).
    #[must_use]
    pub fn planned_offset(&self, id: u32) -> Option<u64> {
        Some(self.plan.offsets.at(id as usize)).filter(|&a| a != FAILED)
    }

    /// The gap that ends exactly at `addr` and the one that starts exactly at `end`.
    fn gaps_around(&self, addr: Addr, end: Addr) -> (Option<Gap>, Option<Gap>) {
        let below = addr
            .checked_sub(1)
            .and_then(|a| self.gaps.at_or_below(a))
            .filter(|&(g, len)| g + len == addr);
        let above = self.gaps.at_or_below(end).filter(|&(g, _)| g == end);
        (below, above)
    }

    fn refresh_gap_counters(&mut self) {
        self.counters.free_blocks = self.gaps.len() as u64;
        self.counters.largest_free_bytes = self.gaps.largest();
    }
}

impl Policy for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }

    fn alloc(&mut self, req: Request) -> Result<Placement, AllocError> {
        let unsupported = |why: String| Err(AllocError::Unsupported(why));
        let id = req.id;
        if self.plan.feed.is_some() && !self.reads_plan {
            return unsupported(
                "a copy of a streamed oracle's state cannot allocate: its plan is read once, \
                 by the replay"
                    .to_owned(),
            );
        }
        let (addr, planned) = match self.plan.lookup(id, req.size_bytes) {
            Ok(found) => found,
            Err(why) => return unsupported(why),
        };
        if req.size_bytes > planned {
            return unsupported(format!(
                "allocation {id} asks {} B, the plan holds {planned} B",
                req.size_bytes
            ));
        }
        if req.align_bytes == 0 || addr % req.align_bytes != 0 {
            return unsupported(format!(
                "planned offset {addr:#x} of allocation {id} breaks alignment {}",
                req.align_bytes
            ));
        }
        let end = addr + planned;
        if end > self.counters.footprint_bytes {
            return Err(AllocError::OutOfMemory {
                requested_bytes: req.size_bytes,
                largest_free_bytes: self.counters.largest_free_bytes,
                footprint_bytes: self.counters.footprint_bytes,
                limit_bytes: self.limit_bytes,
            });
        }
        // The plan puts the block inside one gap, unless the replay left the trace's order.
        let Some((gap, gap_len)) = self
            .gaps
            .at_or_below(addr)
            .filter(|&(g, len)| g + len >= end)
        else {
            return unsupported(format!(
                "planned range [{addr:#x}, {end:#x}) of allocation {id} meets a live allocation \
                 (the replay is not the planned trace)"
            ));
        };
        let gap_end = gap + gap_len;
        match (addr > gap, end < gap_end) {
            (true, true) => {
                self.gaps.relocate(0, gap, gap_len, gap, addr - gap);
                self.gaps.insert(end, gap_end - end, 0);
            }
            (true, false) => self.gaps.relocate(0, gap, gap_len, gap, addr - gap),
            (false, true) => self.gaps.relocate(0, gap, gap_len, end, gap_end - end),
            (false, false) => self.gaps.remove(gap, gap_len, 0),
        }
        self.refresh_gap_counters();
        self.live.insert(
            addr,
            Live {
                id,
                reserved_bytes: planned,
                requested_bytes: req.size_bytes,
            },
        );
        let c = &mut self.counters;
        c.live_allocs += 1;
        c.live_bytes += req.size_bytes;
        c.allocated_bytes += planned;
        c.free_bytes -= planned;
        Ok(Placement {
            addr,
            reserved_bytes: planned,
        })
    }

    fn free(&mut self, addr: Addr) -> Result<(), FreeError> {
        let l = self
            .live
            .remove(&addr)
            .ok_or(FreeError::UnknownAddr(addr))?;
        let end = addr + l.reserved_bytes;
        match self.gaps_around(addr, end) {
            (Some((b, b_len)), Some((_, a_len))) => {
                self.gaps.remove(end, a_len, 0);
                self.gaps
                    .relocate(0, b, b_len, b, b_len + l.reserved_bytes + a_len);
            }
            (Some((b, b_len)), None) => {
                self.gaps.relocate(0, b, b_len, b, b_len + l.reserved_bytes);
            }
            (None, Some((_, a_len))) => {
                self.gaps
                    .relocate(0, end, a_len, addr, a_len + l.reserved_bytes);
            }
            (None, None) => self.gaps.insert(addr, l.reserved_bytes, 0),
        }
        self.refresh_gap_counters();
        let c = &mut self.counters;
        c.live_allocs -= 1;
        c.live_bytes -= l.requested_bytes;
        c.allocated_bytes -= l.reserved_bytes;
        c.free_bytes += l.reserved_bytes;
        Ok(())
    }

    fn counters(&self) -> Counters {
        self.counters
    }

    fn blocks(&self, out: &mut Vec<Block>) {
        let mut live: Vec<(Addr, Live)> = self.live.iter().map(|(&a, &l)| (a, l)).collect();
        live.sort_unstable_by_key(|&(a, _)| a);
        let mut at = 0;
        for (addr, l) in live {
            if addr > at {
                out.push(Block {
                    addr: at,
                    len_bytes: addr - at,
                    state: BlockState::Free,
                });
            }
            out.push(Block {
                addr,
                len_bytes: l.reserved_bytes,
                state: BlockState::Used {
                    id: l.id,
                    requested_bytes: l.requested_bytes,
                },
            });
            at = addr + l.reserved_bytes;
        }
        if self.counters.footprint_bytes > at {
            out.push(Block {
                addr: at,
                len_bytes: self.counters.footprint_bytes - at,
                state: BlockState::Free,
            });
        }
    }

    fn held_ranges(&self, out: &mut Vec<(Addr, u64)>) -> bool {
        // The static pool, held whole from the first event to the last; the free blocks are
        // the gaps between the live allocations in it.
        if self.counters.footprint_bytes > 0 {
            out.push((0, self.counters.footprint_bytes));
        }
        true
    }

    fn shrink_to_fit(&mut self) {
        self.live.shrink_to_fit();
    }

    fn clone_box(&self) -> Box<dyn Policy> {
        // The address map's copy is sized to its entries (see `AddrMap`'s `Clone`).
        let mut c = self.clone();
        c.reads_plan = false;
        Box::new(c)
    }

    fn check_invariants(&self) -> Result<(), String> {
        let mut blocks = Vec::new();
        self.blocks(&mut blocks);
        let mut prev_end = 0;
        let mut gaps: Vec<(Addr, u64, u32)> = Vec::new();
        for b in &blocks {
            if b.addr < prev_end {
                return Err(format!("block {b:?} overlaps the one before"));
            }
            prev_end = b.end();
            match b.state {
                BlockState::Used { id, .. } => {
                    // A streamed plan is read once: its blocks are where it said.
                    if self.plan.feed.is_none() && self.planned_offset(id) != Some(b.addr) {
                        return Err(format!("allocation {id} at {:#x} is off its plan", b.addr));
                    }
                }
                BlockState::Free => gaps.push((b.addr, b.len_bytes, 0)),
                BlockState::Dead => return Err(format!("dead block {b:?}")),
            }
        }
        if prev_end > self.counters.footprint_bytes {
            return Err(format!(
                "blocks end at {prev_end}, beyond the footprint {}",
                self.counters.footprint_bytes
            ));
        }
        self.gaps.check()?;
        if gaps != self.gaps.entries() {
            return Err(format!(
                "gap index {:?} but blocks give {gaps:?}",
                self.gaps.entries()
            ));
        }
        let expected = Counters::from_blocks(&blocks, self.counters.footprint_bytes);
        if expected != self.counters {
            return Err(format!(
                "counters {:?} but blocks give {expected:?}",
                self.counters
            ));
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::OwnedTrace;

    fn served(o: &mut Oracle, id: u32, size_bytes: u64) -> Result<Placement, AllocError> {
        o.alloc(Request {
            id,
            size_bytes,
            align_bytes: 16,
        })
    }

    #[test]
    fn serves_the_greedy_plan_with_a_constant_footprint() {
        // a 100 B [0,3), b 50 B [1,5), c 100 B [4,6): c reuses a's slot, b sits above it.
        let mut t = OwnedTrace::new();
        let a = t.alloc(0, 100);
        let b = t.alloc(1, 50);
        t.free(2, a);
        let c = t.alloc(3, 100);
        t.free(4, b);
        t.free(5, c);
        let view = t.view().unwrap();
        let mut o = Oracle::new(&view, &PolicyConfig::default()).unwrap();
        assert_eq!(o.lower_bound_bytes(), 150);
        // Greedy-by-size with 16-byte alignment: a at 0, c at 0 (after a), b at 112.
        assert_eq!(o.plan_total_bytes(), 162);
        assert_eq!(o.counters().footprint_bytes, 162);
        assert_eq!(served(&mut o, a, 100).unwrap().addr, 0);
        assert_eq!(served(&mut o, b, 50).unwrap().addr, 112);
        let c0 = o.counters();
        assert_eq!((c0.free_blocks, c0.largest_free_bytes), (1, 12));
        o.free(0).unwrap();
        assert_eq!(served(&mut o, c, 100).unwrap().addr, 0);
        o.check_invariants().unwrap();
        o.free(112).unwrap();
        o.free(0).unwrap();
        assert_eq!(o.counters().footprint_bytes, 162, "the pool stays");
        assert_eq!(o.counters().free_blocks, 1);
        o.check_invariants().unwrap();
    }

    #[test]
    fn refuses_what_the_plan_does_not_cover() {
        let mut t = OwnedTrace::new();
        t.alloc(0, 64);
        t.alloc(1, 64);
        let view = t.view().unwrap();
        let mut o = Oracle::new(&view, &PolicyConfig::default()).unwrap();
        assert!(matches!(
            served(&mut o, 7, 8),
            Err(AllocError::Unsupported(_))
        ));
        assert!(matches!(
            served(&mut o, 0, 65),
            Err(AllocError::Unsupported(_))
        ));
        served(&mut o, 0, 64).unwrap();
        // Allocation 0 again while it is live: its planned range is taken.
        assert!(matches!(
            served(&mut o, 0, 64),
            Err(AllocError::Unsupported(_))
        ));
        o.check_invariants().unwrap();
    }

    #[test]
    fn a_limit_below_the_plan_fails_what_lies_beyond_it() {
        let mut t = OwnedTrace::new();
        for i in 0..4 {
            t.alloc(i, 1000);
        }
        let view = t.view().unwrap();
        let config = PolicyConfig {
            limit_bytes: Some(2500),
            ..PolicyConfig::default()
        };
        let mut o = Oracle::new(&view, &config).unwrap();
        assert_eq!(o.counters().footprint_bytes, 2500);
        let placed: Vec<bool> = (0..4).map(|id| served(&mut o, id, 1000).is_ok()).collect();
        assert_eq!(placed.iter().filter(|&&p| p).count(), 2);
        assert!(matches!(
            served(&mut o, 3, 1000),
            Err(AllocError::OutOfMemory {
                footprint_bytes: 2500,
                limit_bytes: Some(2500),
                ..
            })
        ));
        o.check_invariants().unwrap();
    }
}
