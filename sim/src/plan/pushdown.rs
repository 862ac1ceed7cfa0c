//! `pushdown`: MegEngine's production static allocator (`StaticMemAllocPushdown`).
//!
//! 1. **Event sweep** (MegEngine's `BestFitHelper`, shared with [`super::best_fit`]): times in
//!    increasing order; at each, first free every buffer ending there, then allocate every buffer
//!    starting there (by increasing end, then input order: MegEngine sorts its chunks by
//!    `(begin, end)` before adding them).
//! 2. **Best-fit pre-allocation over relative order** (`BestfitPrealloc`): memory is an ordered
//!    list of blocks with sizes but no addresses. An allocation takes the smallest free block that
//!    fits (its low end; the rest stays free above it), or, when no free block fits, the largest
//!    free block grown to the request, or a new block at the top when nothing is free. Freed
//!    blocks merge with free neighbours.
//! 3. Each buffer, when placed, records the nearest used blocks below and above it: "i lies on
//!    prev" and "next lies on i". These edges form a DAG in which every two buffers live at the
//!    same time are connected.
//! 4. **Push down**: in topological order, each buffer's address is the highest end among the
//!    buffers it lies on (aligned), so it sinks as low as the relative order allows. The pool is
//!    the highest end.
//!
//! Overwrite chains are planned as one buffer (the root's size over the chain's lifetime): in
//! MegEngine too the overwriter takes over its parent's block, which is freed when the chain's
//! last member ends. Free blocks are kept in an ordered set by (size, block), so every step is
//! O(log n), and the whole plan O(n log n).

use std::collections::{BTreeSet, VecDeque};

use super::units::{Unit, prepare};
use super::{Buffer, Plan, PlanError, align_up};

/// Plans `buffers`; `align_bytes` is the minimum alignment of every buffer.
///
/// # Errors
/// An input error of the buffers ([`super::validate()`]'s rules), a bad alignment option, or
/// [`PlanError::Internal`] if the relative order had a cycle (a bug).
pub fn plan(buffers: &[Buffer], align_bytes: u64) -> Result<Plan, PlanError> {
    let units = prepare(buffers, align_bytes)?;
    let offsets = unit_offsets(&units.units)?;
    units.expand(&offsets, 0)
}

/// One step of MegEngine's event sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Alloc(usize),
    Free(usize),
}

/// The sweep order of step 1: at each time the frees, then the allocations by (end, index).
pub(crate) fn event_order(units: &[Unit]) -> Vec<Step> {
    // (time, frees before allocs, end for allocs, unit)
    let mut keys: Vec<(u64, bool, u64, usize)> = Vec::with_capacity(units.len() * 2);
    for (i, u) in units.iter().enumerate() {
        keys.push((u.upper, false, 0, i));
        keys.push((u.lower, true, u.upper, i));
    }
    keys.sort_unstable();
    keys.into_iter()
        .map(|(_, is_alloc, _, i)| {
            if is_alloc {
                Step::Alloc(i)
            } else {
                Step::Free(i)
            }
        })
        .collect()
}

const NIL: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Block {
    size: u64,
    prev: usize,
    next: usize,
    /// The unit holding it, `None` when free.
    owner: Option<usize>,
}

/// The address-less block list of step 2.
struct Prealloc {
    blocks: Vec<Block>,
    tail: usize,
    /// Free blocks by (size, block id).
    free: BTreeSet<(u64, usize)>,
}

impl Prealloc {
    fn block(&self, b: usize) -> Option<&Block> {
        self.blocks.get(b)
    }

    /// The used block nearest to `b` in direction `dir` (free blocks never touch, so it is the
    /// neighbour or the one after it).
    fn used_neighbour(&self, b: usize, dir: impl Fn(&Block) -> usize) -> Option<usize> {
        let n = self.block(b).map_or(NIL, &dir);
        let nb = self.block(n)?;
        match nb.owner {
            Some(u) => Some(u),
            None => self.block(dir(nb)).and_then(|x| x.owner),
        }
    }

    /// Places `unit` of `size`; returns its block and the units just below and above it.
    fn alloc(&mut self, unit: usize, size: u64) -> (usize, Option<usize>, Option<usize>) {
        let pick = self
            .free
            .range((size, 0)..)
            .next()
            .copied()
            .or_else(|| self.free.last().copied());
        let b = match pick {
            None => {
                let b = self.blocks.len();
                self.blocks.push(Block {
                    size,
                    prev: self.tail,
                    next: NIL,
                    owner: Some(unit),
                });
                if let Some(t) = self.blocks.get_mut(self.tail) {
                    t.next = b;
                }
                self.tail = b;
                b
            }
            Some((free_size, b)) => {
                self.free.remove(&(free_size, b));
                if free_size > size {
                    // The rest stays free above; its upper neighbour is used (free blocks never
                    // touch), so nothing merges.
                    let rest = self.blocks.len();
                    let next = self.block(b).map_or(NIL, |x| x.next);
                    self.blocks.push(Block {
                        size: free_size - size,
                        prev: b,
                        next,
                        owner: None,
                    });
                    if let Some(nb) = self.blocks.get_mut(next) {
                        nb.prev = rest;
                    }
                    if self.tail == b {
                        self.tail = rest;
                    }
                    if let Some(x) = self.blocks.get_mut(b) {
                        x.next = rest;
                    }
                    self.free.insert((free_size - size, rest));
                }
                if let Some(x) = self.blocks.get_mut(b) {
                    x.size = size;
                    x.owner = Some(unit);
                }
                b
            }
        };
        let below = self.used_neighbour(b, |x| x.prev);
        let above = self.used_neighbour(b, |x| x.next);
        (b, below, above)
    }

    fn free(&mut self, b: usize) {
        let Some(mut cur) = self.block(b).copied() else {
            return;
        };
        cur.owner = None;
        // Absorb a free lower neighbour.
        if let Some(p) = self.block(cur.prev).copied()
            && p.owner.is_none()
        {
            self.free.remove(&(p.size, cur.prev));
            cur.size += p.size;
            cur.prev = p.prev;
            if let Some(pp) = self.blocks.get_mut(p.prev) {
                pp.next = b;
            }
        }
        // Absorb a free upper neighbour.
        if let Some(nx) = self.block(cur.next).copied()
            && nx.owner.is_none()
        {
            self.free.remove(&(nx.size, cur.next));
            if self.tail == cur.next {
                self.tail = b;
            }
            cur.size += nx.size;
            cur.next = nx.next;
            if let Some(nn) = self.blocks.get_mut(nx.next) {
                nn.prev = b;
            }
        }
        if let Some(x) = self.blocks.get_mut(b) {
            *x = cur;
        }
        self.free.insert((cur.size, b));
    }
}

/// PUSHDOWN offsets of planning units.
pub(crate) fn unit_offsets(units: &[Unit]) -> Result<Vec<u64>, PlanError> {
    let mut pre = Prealloc {
        blocks: Vec::with_capacity(units.len() * 2),
        tail: NIL,
        free: BTreeSet::new(),
    };
    let mut block_of = vec![NIL; units.len()];
    // below[i]: the units i lies on.
    let mut below: Vec<Vec<usize>> = vec![Vec::new(); units.len()];
    for step in event_order(units) {
        match step {
            Step::Alloc(i) => {
                let size = units.get(i).map_or(0, |u| u.size_bytes);
                let (b, under, over) = pre.alloc(i, size);
                if let Some(slot) = block_of.get_mut(i) {
                    *slot = b;
                }
                if let (Some(j), Some(list)) = (under, below.get_mut(i)) {
                    list.push(j);
                }
                if let Some(k) = over
                    && let Some(list) = below.get_mut(k)
                {
                    list.push(i);
                }
            }
            Step::Free(i) => {
                if let Some(&b) = block_of.get(i) {
                    pre.free(b);
                }
            }
        }
    }
    push_down(units, &below)
}

/// Step 4: addresses in topological order of the "lies on" DAG (Kahn's algorithm).
fn push_down(units: &[Unit], below: &[Vec<usize>]) -> Result<Vec<u64>, PlanError> {
    let n = units.len();
    let mut above: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut pending = vec![0usize; n];
    for (i, list) in below.iter().enumerate() {
        for &j in list {
            if let Some(a) = above.get_mut(j) {
                a.push(i);
            }
        }
        if let Some(p) = pending.get_mut(i) {
            *p = list.len();
        }
    }
    let mut offsets = vec![0u64; n];
    let mut ready: VecDeque<usize> = (0..n)
        .filter(|&i| pending.get(i).is_some_and(|&p| p == 0))
        .collect();
    let mut done = 0;
    while let Some(i) = ready.pop_front() {
        done += 1;
        let mut floor = 0u64;
        for &j in below.get(i).map_or(&[][..], Vec::as_slice) {
            let end =
                offsets.get(j).copied().unwrap_or(0) + units.get(j).map_or(0, |u| u.size_bytes);
            floor = floor.max(end);
        }
        let align = units.get(i).map_or(1, |u| u.align_bytes);
        if let Some(o) = offsets.get_mut(i) {
            *o = align_up(floor, align).ok_or(PlanError::Overflow)?;
        }
        for &k in above.get(i).map_or(&[][..], Vec::as_slice) {
            if let Some(p) = pending.get_mut(k) {
                *p -= 1;
                if *p == 0 {
                    ready.push_back(k);
                }
            }
        }
    }
    if done != n {
        return Err(PlanError::Internal(
            "pushdown: the relative order has a cycle".to_owned(),
        ));
    }
    Ok(offsets)
}
