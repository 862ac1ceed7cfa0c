//! `best-fit`: best fit with immediate coalescing.
//!
//! A request takes the SMALLEST free block that is large enough, the lowest address among
//! equally small ones; it is carved from the block's low end and the remainder stays free. With
//! no such block the request is placed at the heap top, which grows. Freeing coalesces with both
//! physical neighbours (boundary tags, O(1)) and a freed block that reaches the heap top lowers
//! it. Sizes are rounded up to `align_bytes` (default 16); a zero-byte request reserves one
//! alignment unit. See `fit_common` for the heap layout shared with `first-fit`.
//!
//! Free blocks live in an ordered set of `(len, addr)` pairs, so the best fit is the first pair
//! at or after `(n, 0)`: O(log n) for the search, the insertions and the removals. The used
//! blocks sit in a hash map (O(1)).

use std::any::Any;
use std::collections::BTreeSet;

use crate::policy::fit_common::{FitHeap, FreeIndex};
use crate::policy::registry::PolicyConfig;
use crate::policy::{Addr, AllocError, Block, Counters, FreeError, Placement, Policy, Request};

/// Best fit, lowest address on ties (see the module docs).
#[derive(Clone, Debug)]
pub struct BestFit {
    heap: FitHeap<SizeSet>,
}

impl BestFit {
    /// A best-fit heap honouring `config.align_bytes` and `config.limit_bytes`.
    ///
    /// # Errors
    /// When `align_bytes` is not a power of two.
    pub fn new(config: &PolicyConfig) -> Result<Self, String> {
        Ok(Self {
            heap: FitHeap::new(config, SizeSet::default())?,
        })
    }
}

impl Policy for BestFit {
    fn name(&self) -> &'static str {
        "best-fit"
    }

    fn alloc(&mut self, req: Request) -> Result<Placement, AllocError> {
        self.heap.alloc(req)
    }

    fn free(&mut self, addr: Addr) -> Result<(), FreeError> {
        self.heap.free(addr)
    }

    fn counters(&self) -> Counters {
        self.heap.counters()
    }

    fn blocks(&self, out: &mut Vec<Block>) {
        self.heap.blocks(out);
    }

    fn clone_box(&self) -> Box<dyn Policy> {
        Box::new(self.clone())
    }

    fn check_invariants(&self) -> Result<(), String> {
        self.heap.check_invariants()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Free blocks ordered by `(len, addr)`.
#[derive(Clone, Debug, Default)]
struct SizeSet {
    set: BTreeSet<(u64, Addr)>,
}

impl FreeIndex for SizeSet {
    fn insert(&mut self, addr: Addr, len: u64) {
        self.set.insert((len, addr));
    }

    fn remove(&mut self, addr: Addr, len: u64) {
        self.set.remove(&(len, addr));
    }

    fn relocate(&mut self, old_addr: Addr, old_len: u64, new_addr: Addr, new_len: u64) {
        self.set.remove(&(old_len, old_addr));
        self.set.insert((new_len, new_addr));
    }

    fn find(&self, min_len: u64) -> Option<(Addr, u64)> {
        self.set
            .range((min_len, 0)..)
            .next()
            .map(|&(len, addr)| (addr, len))
    }

    fn largest(&self) -> u64 {
        self.set.last().map_or(0, |&(len, _)| len)
    }

    fn entries(&self) -> Vec<(Addr, u64)> {
        let mut out: Vec<(Addr, u64)> = self.set.iter().map(|&(len, addr)| (addr, len)).collect();
        out.sort_unstable();
        out
    }

    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_set_picks_smallest_then_lowest_address() {
        let mut s = SizeSet::default();
        for (addr, len) in [(0, 64), (100, 32), (200, 32), (300, 128)] {
            s.insert(addr, len);
        }
        assert_eq!(s.find(1), Some((100, 32)));
        assert_eq!(s.find(33), Some((0, 64)));
        assert_eq!(s.find(65), Some((300, 128)));
        assert_eq!(s.find(129), None);
        assert_eq!(s.largest(), 128);
        s.relocate(100, 32, 116, 16);
        assert_eq!(s.find(1), Some((116, 16)));
    }
}
