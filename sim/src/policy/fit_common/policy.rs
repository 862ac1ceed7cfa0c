//! The one [`Policy`] of the fit heaps: `first-fit` and `best-fit` differ only in their free
//! index (which block a request takes) and their name, so both are a [`FitPolicy`] over their
//! index, and every other answer is the heap's.

use std::any::Any;

use super::{FitHeap, FreeIndex};
use crate::heap::{Addr, AllocError, Block, Counters, FreeError, Placement, Request};
use crate::policy::Policy;

/// A free index that gives a fit policy its choice, and the policy its name.
pub(crate) trait FitIndex: FreeIndex {
    /// The policy's registry name.
    const POLICY_NAME: &'static str;
}

/// A fit policy: the boundary-tag heap of `fit_common` choosing its blocks with index `I`.
#[derive(Clone, Debug)]
pub struct FitPolicy<I> {
    /// Built by each policy's constructor (in its own module, with its own index).
    pub(crate) heap: FitHeap<I>,
}

impl<I: FitIndex> Policy for FitPolicy<I> {
    fn name(&self) -> &'static str {
        I::POLICY_NAME
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

    fn held_up_to_tops(&self, bases: &mut Vec<Addr>) -> bool {
        // See `fit_common`: the blocks tile [0, top), the topmost is in use, and a freed block
        // merges with both free neighbours.
        bases.push(0);
        true
    }

    fn shrink_to_fit(&mut self) {
        self.heap.shrink_to_fit();
    }

    fn clone_box(&self) -> Box<dyn Policy> {
        let mut c = self.clone();
        c.heap.compact();
        Box::new(c)
    }

    fn check_invariants(&self) -> Result<(), String> {
        // The heap checks that its index holds exactly its free blocks (first fit also
        // compared the index's size with the free block count, which that implies).
        self.heap.check_invariants()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
