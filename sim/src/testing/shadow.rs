//! A shadow model of the live allocations, independent of every policy.
//!
//! [`Shadow`] records each placement as a range `[addr, addr + reserved)` in an ordered map and
//! refuses one that overlaps a live range or breaks the requested alignment. [`Shadow::check`]
//! then holds a policy's own view (its blocks and counters) against the shadow.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::heap::{Addr, Block, BlockState, Counters, Placement, Request};
use crate::policy::Policy;

/// What a policy promises about its block list, beyond the universal contract.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Promises {
    /// No two address-adjacent blocks are both free.
    pub coalesces_free_neighbours: bool,
    /// The blocks cover `[0, footprint)` with no gap.
    pub tiles_from_zero: bool,
    /// Under a limit, an allocation fails as out of memory only when the policy could neither
    /// grow by the request within the limit nor held a free block of the request's size
    /// (checked by `drive_checked` when given the limit). Every policy but `pytorch`, whose
    /// small and large pools each grow by segments of their own size (20 MiB for a 1 MiB
    /// request) and never lend each other free blocks.
    pub oom_only_without_room: bool,
}

/// The promises of each registered policy (unknown names promise nothing extra).
#[must_use]
pub fn promises_for(name: &str) -> Promises {
    match name {
        "first-fit" | "best-fit" | "pool" => Promises {
            coalesces_free_neighbours: true,
            tiles_from_zero: true,
            oom_only_without_room: true,
        },
        // Buddies of different parents stay apart even when both are free.
        "buddy" => Promises {
            coalesces_free_neighbours: false,
            tiles_from_zero: true,
            oom_only_without_room: true,
        },
        "pytorch" => Promises::default(),
        // BFC never merges chunks of different regions; glibc keeps tcache and fastbin chunks
        // unmerged and maps large chunks far from the heap; a plan may leave holes.
        _ => Promises {
            oom_only_without_room: true,
            ..Promises::default()
        },
    }
}

/// One live allocation as the shadow sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveRange {
    pub len_bytes: u64,
    pub id: u32,
    pub requested_bytes: u64,
}

/// The live ranges handed out so far.
#[derive(Clone, Debug, Default)]
pub struct Shadow {
    live: BTreeMap<Addr, LiveRange>,
    live_bytes: u64,
}

impl Shadow {
    /// An empty shadow.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Live ranges by address.
    #[must_use]
    pub fn live(&self) -> &BTreeMap<Addr, LiveRange> {
        &self.live
    }

    /// Sum of the requested sizes of live allocations.
    #[must_use]
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Records a placement.
    ///
    /// # Errors
    /// When it overlaps a live range, is misaligned, or reserves less than requested.
    pub fn on_alloc(&mut self, req: &Request, p: &Placement) -> Result<(), String> {
        if p.reserved_bytes < req.size_bytes || p.reserved_bytes == 0 {
            return Err(format!(
                "allocation {} of {} B reserved only {} B",
                req.id, req.size_bytes, p.reserved_bytes
            ));
        }
        if !p.addr.is_multiple_of(req.align_bytes) {
            return Err(format!(
                "allocation {} at {:#x} breaks alignment {}",
                req.id, p.addr, req.align_bytes
            ));
        }
        let end = p
            .addr
            .checked_add(p.reserved_bytes)
            .ok_or_else(|| format!("allocation {} wraps the address space", req.id))?;
        if let Some((&a, r)) = self.live.range(..=p.addr).next_back()
            && a + r.len_bytes > p.addr
        {
            return Err(format!(
                "allocation {} at [{:#x}, {end:#x}) overlaps allocation {} at [{a:#x}, {:#x})",
                req.id,
                p.addr,
                r.id,
                a + r.len_bytes
            ));
        }
        if let Some((&a, r)) = self
            .live
            .range((Bound::Excluded(p.addr), Bound::Unbounded))
            .next()
            && a < end
        {
            return Err(format!(
                "allocation {} at [{:#x}, {end:#x}) overlaps allocation {} at {a:#x}",
                req.id, p.addr, r.id
            ));
        }
        self.live.insert(
            p.addr,
            LiveRange {
                len_bytes: p.reserved_bytes,
                id: req.id,
                requested_bytes: req.size_bytes,
            },
        );
        self.live_bytes += req.size_bytes;
        Ok(())
    }

    /// Records a free.
    ///
    /// # Errors
    /// When no live range starts at `addr`.
    pub fn on_free(&mut self, addr: Addr) -> Result<LiveRange, String> {
        let r = self
            .live
            .remove(&addr)
            .ok_or_else(|| format!("free of {addr:#x}, which is not live"))?;
        self.live_bytes -= r.requested_bytes;
        Ok(r)
    }

    /// Holds `policy` against the shadow and against itself: blocks in address order without
    /// overlap and summing to the footprint, the used blocks exactly the shadow's live ranges,
    /// counters equal to the ones recomputed from the blocks, the promises kept, and the
    /// policy's own invariant check.
    ///
    /// # Errors
    /// A description of the first broken rule.
    pub fn check(&self, policy: &dyn Policy, promises: Promises) -> Result<(), String> {
        let name = policy.name();
        let counters = policy.counters();
        let mut blocks = Vec::new();
        policy.blocks(&mut blocks);
        check_block_list(&blocks, &counters, promises).map_err(|e| format!("{name}: {e}"))?;

        let mut used = 0usize;
        for b in &blocks {
            if let BlockState::Used {
                id,
                requested_bytes,
            } = b.state
            {
                used += 1;
                let expected = LiveRange {
                    len_bytes: b.len_bytes,
                    id,
                    requested_bytes,
                };
                if self.live.get(&b.addr) != Some(&expected) {
                    return Err(format!(
                        "{name}: used block {b:?} is not the shadow's {:?}",
                        self.live.get(&b.addr)
                    ));
                }
            }
        }
        if used != self.live.len() {
            return Err(format!(
                "{name}: {used} used blocks but {} live allocations",
                self.live.len()
            ));
        }
        if counters.live_bytes != self.live_bytes {
            return Err(format!(
                "{name}: live bytes {} but the shadow has {}",
                counters.live_bytes, self.live_bytes
            ));
        }
        policy
            .check_invariants()
            .map_err(|e| format!("{name}: check_invariants: {e}"))
    }
}

/// The policy-independent checks of a block list.
///
/// # Errors
/// A description of the first broken rule.
pub fn check_block_list(
    blocks: &[Block],
    counters: &Counters,
    promises: Promises,
) -> Result<(), String> {
    let mut prev: Option<&Block> = None;
    let mut total = 0u64;
    for b in blocks {
        if b.len_bytes == 0 {
            return Err(format!("empty block at {:#x}", b.addr));
        }
        if let Some(p) = prev {
            if b.addr < p.end() {
                return Err(format!("block {b:?} overlaps or precedes {p:?}"));
            }
            if promises.tiles_from_zero && b.addr != p.end() {
                return Err(format!("gap between {p:?} and {b:?}"));
            }
            if promises.coalesces_free_neighbours
                && b.addr == p.end()
                && b.state == BlockState::Free
                && p.state == BlockState::Free
            {
                return Err(format!("free neighbours {p:?} and {b:?} not coalesced"));
            }
        } else if promises.tiles_from_zero && b.addr != 0 {
            return Err(format!("first block {b:?} does not start at 0"));
        }
        total += b.len_bytes;
        prev = Some(b);
    }
    if total != counters.footprint_bytes {
        return Err(format!(
            "blocks sum to {total} B, footprint is {} B",
            counters.footprint_bytes
        ));
    }
    let expected = Counters::from_blocks(blocks, counters.footprint_bytes);
    if expected != *counters {
        return Err(format!(
            "counters {counters:?} but blocks give {expected:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: u32, size_bytes: u64) -> Request {
        Request {
            id,
            size_bytes,
            align_bytes: 16,
        }
    }

    #[test]
    fn shadow_rejects_overlaps_and_misalignment() {
        let mut s = Shadow::new();
        let p = |addr, reserved_bytes| Placement {
            addr,
            reserved_bytes,
        };
        s.on_alloc(&req(0, 10), &p(32, 16)).unwrap();
        assert!(s.on_alloc(&req(1, 10), &p(16, 32)).is_err());
        assert!(s.on_alloc(&req(1, 10), &p(32, 16)).is_err());
        assert!(s.on_alloc(&req(1, 10), &p(40, 16)).is_err());
        assert!(s.on_alloc(&req(1, 10), &p(48, 8)).is_err());
        s.on_alloc(&req(1, 10), &p(16, 16)).unwrap();
        s.on_alloc(&req(2, 10), &p(48, 16)).unwrap();
        assert_eq!(s.live_bytes(), 30);
        assert_eq!(s.on_free(32).unwrap().id, 0);
        assert!(s.on_free(32).is_err());
        assert_eq!(s.live_bytes(), 20);
    }

    #[test]
    fn block_list_checks_catch_each_rule() {
        let free = |addr, len_bytes| Block {
            addr,
            len_bytes,
            state: BlockState::Free,
        };
        let used = |addr, len_bytes| Block {
            addr,
            len_bytes,
            state: BlockState::Used {
                id: 0,
                requested_bytes: len_bytes,
            },
        };
        let strict = Promises {
            coalesces_free_neighbours: true,
            tiles_from_zero: true,
            oom_only_without_room: true,
        };
        let good = [used(0, 16), free(16, 32), used(48, 16)];
        let c = Counters::from_blocks(&good, 64);
        check_block_list(&good, &c, strict).unwrap();
        let gap = [used(0, 16), used(32, 16)];
        let cg = Counters::from_blocks(&gap, 32);
        assert!(check_block_list(&gap, &cg, strict).is_err());
        assert!(check_block_list(&gap, &cg, Promises::default()).is_ok());
        let uncoalesced = [free(0, 16), free(16, 16)];
        let cu = Counters::from_blocks(&uncoalesced, 32);
        assert!(check_block_list(&uncoalesced, &cu, strict).is_err());
        assert!(check_block_list(&uncoalesced, &cu, Promises::default()).is_ok());
        let wrong = Counters {
            free_blocks: 2,
            ..c
        };
        assert!(check_block_list(&good, &wrong, strict).is_err());
        let short = Counters::from_blocks(&good, 80);
        assert!(check_block_list(&good, &short, Promises::default()).is_err());
    }
}
