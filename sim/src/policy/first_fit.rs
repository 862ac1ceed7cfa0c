//! `first-fit`: address-ordered first fit with immediate coalescing.
//!
//! A request takes the free block with the LOWEST ADDRESS among those large enough; it is
//! carved from the block's low end and the remainder stays free. With no such block the request
//! is placed at the heap top, which grows. Freeing coalesces with both physical neighbours
//! (boundary tags, O(1)) and a freed block that reaches the heap top lowers it. Sizes are
//! rounded up to `align_bytes` (default 16); a zero-byte request reserves one alignment unit.
//! See `fit_common` for the heap layout shared with `best-fit`.
//!
//! Finding the lowest fitting address without scanning: free blocks live in a treap keyed by
//! address whose every node also stores the largest block length in its subtree. The search
//! descends left whenever the left subtree holds a large enough block, so it is O(log n)
//! expected, as are insertions and removals; a block whose address changes without passing
//! another free block is updated in place. The used blocks sit in a hash map (O(1)).

use std::any::Any;

use crate::policy::fit_common::{FitHeap, FreeIndex};
use crate::policy::registry::PolicyConfig;
use crate::policy::{Addr, AllocError, Block, Counters, FreeError, Placement, Policy, Request};

/// Address-ordered first fit (see the module docs).
#[derive(Clone, Debug)]
pub struct FirstFit {
    heap: FitHeap<AddrTree>,
}

impl FirstFit {
    /// A first-fit heap honouring `config.align_bytes` and `config.limit_bytes`.
    ///
    /// # Errors
    /// When `align_bytes` is not a power of two.
    pub fn new(config: &PolicyConfig) -> Result<Self, String> {
        Ok(Self {
            heap: FitHeap::new(config, AddrTree::default())?,
        })
    }
}

impl Policy for FirstFit {
    fn name(&self) -> &'static str {
        "first-fit"
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
        let mut c = self.clone();
        c.heap.compact();
        Box::new(c)
    }

    fn check_invariants(&self) -> Result<(), String> {
        self.heap.check_invariants()?;
        if self.heap.index().len != self.heap.counters().free_blocks as usize {
            return Err("treap size differs from the free block count".to_owned());
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node {
    addr: Addr,
    len: u64,
    /// Largest `len` in this node's subtree.
    max_len: u64,
    /// Heap priority (max at the root); drawn from a seeded generator, so the tree shape, and
    /// hence nothing observable, depends only on the operation sequence.
    prio: u64,
    left: u32,
    right: u32,
}

/// Treap of free blocks keyed by address, augmented with subtree maxima. Nodes live in a vector
/// (indices instead of pointers); freed slots are recycled.
#[derive(Clone, Debug)]
struct AddrTree {
    nodes: Vec<Node>,
    spare: Vec<u32>,
    root: u32,
    len: usize,
    rng: u64,
    /// Root-to-node path of the last [`FreeIndex::find`] or [`Self::update`], kept to avoid
    /// allocating per operation.
    path: Vec<u32>,
    /// Address of the node at the end of `path`, while the tree has not changed shape since.
    found: Option<Addr>,
}

impl Default for AddrTree {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            spare: Vec::new(),
            root: NIL,
            len: 0,
            rng: 0x2545_F491_4F6C_DD1D,
            path: Vec::new(),
            found: None,
        }
    }
}

impl AddrTree {
    fn node(&self, i: u32) -> Option<&Node> {
        self.nodes.get(i as usize)
    }

    fn node_mut(&mut self, i: u32) -> Option<&mut Node> {
        self.nodes.get_mut(i as usize)
    }

    fn max_of(&self, i: u32) -> u64 {
        self.node(i).map_or(0, |n| n.max_len)
    }

    /// Recomputes `max_len` of `i` from its children.
    fn pull(&mut self, i: u32) {
        let Some(&n) = self.node(i) else { return };
        let m = n.len.max(self.max_of(n.left)).max(self.max_of(n.right));
        if let Some(n) = self.node_mut(i) {
            n.max_len = m;
        }
    }

    fn set_children(&mut self, i: u32, left: u32, right: u32) {
        if let Some(n) = self.node_mut(i) {
            n.left = left;
            n.right = right;
        }
        self.pull(i);
    }

    fn next_prio(&mut self) -> u64 {
        // xorshift64*: cheap, deterministic, good enough for treap balance.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn new_node(&mut self, addr: Addr, len: u64) -> u32 {
        let node = Node {
            addr,
            len,
            max_len: len,
            prio: self.next_prio(),
            left: NIL,
            right: NIL,
        };
        if let Some(i) = self.spare.pop()
            && let Some(slot) = self.node_mut(i)
        {
            *slot = node;
            return i;
        }
        // More than u32::MAX - 1 simultaneous free blocks would need more than 150 GiB of
        // nodes; saturating keeps this total without a panic path.
        let i = u32::try_from(self.nodes.len()).unwrap_or(NIL);
        self.nodes.push(node);
        i
    }

    /// Splits subtree `t` into (addresses < `key`, addresses >= `key`).
    fn split(&mut self, t: u32, key: Addr) -> (u32, u32) {
        let Some(&n) = self.node(t) else {
            return (NIL, NIL);
        };
        if n.addr < key {
            let (l, r) = self.split(n.right, key);
            self.set_children(t, n.left, l);
            (t, r)
        } else {
            let (l, r) = self.split(n.left, key);
            self.set_children(t, r, n.right);
            (l, t)
        }
    }

    /// Joins two subtrees where every address in `a` is below every address in `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        let (Some(&na), Some(&nb)) = (self.node(a), self.node(b)) else {
            return if a == NIL { b } else { a };
        };
        if na.prio >= nb.prio {
            let r = self.merge(na.right, b);
            self.set_children(a, na.left, r);
            a
        } else {
            let l = self.merge(a, nb.left);
            self.set_children(b, l, nb.right);
            b
        }
    }

    fn insert_at(&mut self, t: u32, new: u32) -> u32 {
        let (Some(&n), Some(&nn)) = (self.node(t), self.node(new)) else {
            return new;
        };
        if nn.prio > n.prio {
            let (l, r) = self.split(t, nn.addr);
            self.set_children(new, l, r);
            return new;
        }
        if nn.addr < n.addr {
            let l = self.insert_at(n.left, new);
            self.set_children(t, l, n.right);
        } else {
            let r = self.insert_at(n.right, new);
            self.set_children(t, n.left, r);
        }
        t
    }

    fn remove_at(&mut self, t: u32, key: Addr) -> u32 {
        let Some(&n) = self.node(t) else { return NIL };
        if key == n.addr {
            self.spare.push(t);
            self.len -= 1;
            return self.merge(n.left, n.right);
        }
        if key < n.addr {
            let l = self.remove_at(n.left, key);
            self.set_children(t, l, n.right);
        } else {
            let r = self.remove_at(n.right, key);
            self.set_children(t, n.left, r);
        }
        t
    }

    /// Re-keys the node at `key` to `new_addr`/`new_len`, then fixes the maxima on the path
    /// back up, stopping where a maximum no longer changes. Valid only when the new address
    /// keeps the node's rank.
    fn update(&mut self, key: Addr, new_addr: Addr, new_len: u64) {
        let mut path = std::mem::take(&mut self.path);
        if self.found != Some(key) {
            path.clear();
            let mut t = self.root;
            while let Some(&n) = self.node(t) {
                path.push(t);
                if key == n.addr {
                    break;
                }
                t = if key < n.addr { n.left } else { n.right };
            }
        }
        self.found = None;
        if let Some(&last) = path.last()
            && let Some(m) = self.node_mut(last)
            && m.addr == key
        {
            m.addr = new_addr;
            m.len = new_len;
            self.found = Some(new_addr);
        }
        for &i in path.iter().rev() {
            let before = self.max_of(i);
            self.pull(i);
            if self.max_of(i) == before {
                break;
            }
        }
        self.path = path;
    }

    fn collect(&self, t: u32, out: &mut Vec<(Addr, u64)>) {
        if let Some(&n) = self.node(t) {
            self.collect(n.left, out);
            out.push((n.addr, n.len));
            self.collect(n.right, out);
        }
    }

    /// Checks order, heap priorities and maxima of subtree `t`; returns its node count.
    fn check_at(&self, t: u32, lo: Option<Addr>, hi: Option<Addr>) -> Result<usize, String> {
        let Some(&n) = self.node(t) else { return Ok(0) };
        if lo.is_some_and(|lo| n.addr <= lo) || hi.is_some_and(|hi| n.addr >= hi) {
            return Err(format!("treap order broken at {:#x}", n.addr));
        }
        for c in [n.left, n.right] {
            if self.node(c).is_some_and(|c| c.prio > n.prio) {
                return Err(format!("treap heap order broken below {:#x}", n.addr));
            }
        }
        let expected = n.len.max(self.max_of(n.left)).max(self.max_of(n.right));
        if n.max_len != expected {
            return Err(format!("treap max wrong at {:#x}", n.addr));
        }
        Ok(1 + self.check_at(n.left, lo, Some(n.addr))?
            + self.check_at(n.right, Some(n.addr), hi)?)
    }
}

impl FreeIndex for AddrTree {
    fn insert(&mut self, addr: Addr, len: u64) {
        self.found = None;
        let new = self.new_node(addr, len);
        self.root = self.insert_at(self.root, new);
        self.len += 1;
    }

    fn remove(&mut self, addr: Addr, _len: u64) {
        self.found = None;
        self.root = self.remove_at(self.root, addr);
    }

    fn relocate(&mut self, old_addr: Addr, _old_len: u64, new_addr: Addr, new_len: u64) {
        self.update(old_addr, new_addr, new_len);
    }

    fn find(&mut self, min_len: u64) -> Option<(Addr, u64)> {
        self.found = None;
        if self.max_of(self.root) < min_len {
            return None;
        }
        // Remember the path: the carve that follows re-keys this very node.
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        let mut t = self.root;
        let mut hit = None;
        while let Some(&n) = self.node(t) {
            path.push(t);
            if self.max_of(n.left) >= min_len {
                t = n.left;
            } else if n.len >= min_len {
                hit = Some((n.addr, n.len));
                self.found = Some(n.addr);
                break;
            } else {
                t = n.right;
            }
        }
        self.path = path;
        hit
    }

    fn largest(&self) -> u64 {
        self.max_of(self.root)
    }

    fn entries(&self) -> Vec<(Addr, u64)> {
        let mut out = Vec::with_capacity(self.len);
        self.collect(self.root, &mut out);
        out
    }

    fn check(&self) -> Result<(), String> {
        let count = self.check_at(self.root, None, None)?;
        if count != self.len {
            return Err(format!("treap holds {count} nodes, len says {}", self.len));
        }
        if count + self.spare.len() != self.nodes.len() {
            return Err("treap leaks node slots".to_owned());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn treap_finds_lowest_fitting_address() {
        let mut t = AddrTree::default();
        for (addr, len) in [(0, 32), (100, 64), (200, 16), (300, 128), (500, 64)] {
            t.insert(addr, len);
            t.check().unwrap();
        }
        assert_eq!(t.find(16), Some((0, 32)));
        assert_eq!(t.find(33), Some((100, 64)));
        assert_eq!(t.find(65), Some((300, 128)));
        assert_eq!(t.find(129), None);
        assert_eq!(t.largest(), 128);
        t.remove(300, 128);
        t.check().unwrap();
        assert_eq!(t.find(65), None);
        assert_eq!(t.largest(), 64);
        t.relocate(100, 64, 110, 200);
        t.check().unwrap();
        assert_eq!(t.find(65), Some((110, 200)));
        assert_eq!(t.entries(), vec![(0, 32), (110, 200), (200, 16), (500, 64)]);
    }

    #[test]
    fn treap_stays_consistent_under_many_operations() {
        let mut t = AddrTree::default();
        let mut model = std::collections::BTreeMap::new();
        let mut x: u64 = 7;
        for _ in 0..3000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let addr = (x >> 40) % 512 * 16;
            let len = (x >> 20) % 64 + 1;
            if model.remove(&addr).is_some() {
                t.remove(addr, 0);
            } else {
                model.insert(addr, len);
                t.insert(addr, len);
            }
        }
        t.check().unwrap();
        assert_eq!(t.entries(), model.into_iter().collect::<Vec<_>>());
    }
}
