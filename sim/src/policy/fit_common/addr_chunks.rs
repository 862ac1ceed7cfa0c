//! [`AddrChunks`]: the free index in address order that first fit and the oracle's gaps use,
//! free blocks in sorted chunks of at most 32 under a tree of their largest lengths.

use super::FreeIndex;
use crate::heap::Addr;

/// Most free blocks one chunk holds; a full chunk splits in two.
const CHUNK_CAP: usize = 32;
/// A chunk this short merges into a neighbour when the two fit in half a chunk.
const CHUNK_MERGE: usize = CHUNK_CAP / 8;

/// Index of the first length of at least `min_len`. Compares eight at a time without an early
/// exit inside a group, which the compiler turns into vector compares: a plain `position` loop
/// is scalar and was the search's main cost on real traces.
fn first_at_least(lens: &[u64], min_len: u64) -> Option<usize> {
    let mut groups = lens.chunks_exact(8);
    let mut base = 0;
    for group in &mut groups {
        let mask = group
            .iter()
            .enumerate()
            .fold(0u32, |m, (k, &l)| m | (u32::from(l >= min_len) << k));
        if mask != 0 {
            return Some(base + mask.trailing_zeros() as usize);
        }
        base += 8;
    }
    groups
        .remainder()
        .iter()
        .position(|&l| l >= min_len)
        .map(|i| base + i)
}

/// Free blocks of one stretch of the address order, as parallel sorted arrays (the lengths
/// contiguous, so the in-chunk search is a short linear scan the compiler vectorises).
#[derive(Clone, Debug, Default)]
struct Chunk {
    addr: Vec<Addr>,
    len: Vec<u64>,
    handle: Vec<u32>,
    max_len: u64,
}

impl Chunk {
    fn recompute_max(&mut self) {
        self.max_len = self.len.iter().copied().max().unwrap_or(0);
    }

    /// Position of `addr` in this chunk, or where it would be inserted.
    fn position(&self, addr: Addr) -> Result<usize, usize> {
        // Counting the smaller addresses compares the whole (short) chunk with vector
        // instructions and no branches, faster here than a binary search's dependent steps.
        let i = self.addr.iter().filter(|&&a| a < addr).count();
        if self.addr.get(i) == Some(&addr) {
            Ok(i)
        } else {
            Err(i)
        }
    }

    fn insert_at(&mut self, i: usize, addr: Addr, len: u64, handle: u32) {
        self.addr.insert(i, addr);
        self.len.insert(i, len);
        self.handle.insert(i, handle);
        self.max_len = self.max_len.max(len);
    }

    fn remove_at(&mut self, i: usize) {
        if i < self.addr.len() {
            self.addr.remove(i);
            let len = self.len.remove(i);
            self.handle.remove(i);
            if len == self.max_len {
                self.recompute_max();
            }
        }
    }

    /// Moves the upper half into a new chunk.
    fn split_off_half(&mut self) -> Chunk {
        let at = self.addr.len() / 2;
        let mut upper = Chunk {
            addr: self.addr.split_off(at),
            len: self.len.split_off(at),
            handle: self.handle.split_off(at),
            max_len: 0,
        };
        upper.recompute_max();
        self.recompute_max();
        upper
    }

    fn append(&mut self, other: Chunk) {
        self.addr.extend(other.addr);
        self.len.extend(other.len);
        self.handle.extend(other.handle);
        self.max_len = self.max_len.max(other.max_len);
    }
}

/// Free blocks in address order (first fit's index, the oracle's gaps): sorted chunks of at most
/// [`CHUNK_CAP`] blocks and a max-tree over the chunks' largest lengths (the `first_fit` module
/// docs describe the operations and their costs).
#[derive(Clone, Debug, Default)]
pub struct AddrChunks {
    chunks: Vec<Chunk>,
    /// First address of each chunk (chunks are never empty), for locating an address.
    firsts: Vec<Addr>,
    /// Implicit binary tree over the chunks: leaf `leaves + c` holds chunk `c`'s largest
    /// length, each inner node the larger of its children; `tree[1]` is the largest of all.
    tree: Vec<u64>,
    leaves: usize,
    len: usize,
    /// `(chunk, index)` of the block the last search returned, while nothing has moved.
    found: Option<(usize, usize)>,
    /// Per handle, the chunk its block was last seen in (possibly stale).
    hint: Vec<u32>,
}

impl AddrChunks {
    /// Number of blocks held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The block with the highest address at or below `addr`, as `(addr, len)`.
    pub(crate) fn at_or_below(&self, addr: Addr) -> Option<(Addr, u64)> {
        let c = self.chunk_for(addr);
        let chunk = self.chunks.get(c)?;
        let i = chunk.addr.partition_point(|&a| a <= addr).checked_sub(1)?;
        Some((*chunk.addr.get(i)?, *chunk.len.get(i)?))
    }

    /// Rebuilds the max-tree after chunks were added or removed.
    fn rebuild(&mut self) {
        self.leaves = self.chunks.len().next_power_of_two();
        self.tree.clear();
        self.tree.resize(2 * self.leaves, 0);
        for (c, chunk) in self.chunks.iter().enumerate() {
            if let Some(slot) = self.tree.get_mut(self.leaves + c) {
                *slot = chunk.max_len;
            }
        }
        for node in (1..self.leaves).rev() {
            let m = self.child_max(node);
            if let Some(slot) = self.tree.get_mut(node) {
                *slot = m;
            }
        }
        self.firsts.clear();
        self.firsts.extend(
            self.chunks
                .iter()
                .map(|c| c.addr.first().copied().unwrap_or(0)),
        );
    }

    fn child_max(&self, node: usize) -> u64 {
        let l = self.tree.get(2 * node).copied().unwrap_or(0);
        let r = self.tree.get(2 * node + 1).copied().unwrap_or(0);
        l.max(r)
    }

    /// Propagates chunk `c`'s largest length (and first address) up the tree.
    fn refresh(&mut self, c: usize) {
        let Some(chunk) = self.chunks.get(c) else {
            return;
        };
        let (max_len, first) = (chunk.max_len, chunk.addr.first().copied().unwrap_or(0));
        if let Some(f) = self.firsts.get_mut(c) {
            *f = first;
        }
        let mut node = self.leaves + c;
        if let Some(slot) = self.tree.get_mut(node) {
            if *slot == max_len {
                return;
            }
            *slot = max_len;
        }
        while node > 1 {
            node /= 2;
            let m = self.child_max(node);
            match self.tree.get_mut(node) {
                Some(slot) if *slot != m => *slot = m,
                _ => break,
            }
        }
    }

    /// The chunk whose range holds `addr`: the last one starting at or below it (or the first).
    fn chunk_for(&self, addr: Addr) -> usize {
        self.firsts
            .partition_point(|&f| f <= addr)
            .saturating_sub(1)
    }

    /// `(chunk, index)` of block `handle` at `addr`: the last search's result, else the chunk
    /// the block was last seen in (chunks shift when one splits or empties, so the hint is
    /// checked), else a binary search of the chunks by address.
    fn locate(&mut self, addr: Addr, handle: u32) -> Option<(usize, usize)> {
        if let Some((c, i)) = self.found
            && self.chunks.get(c).and_then(|ch| ch.addr.get(i)) == Some(&addr)
        {
            return Some((c, i));
        }
        if let Some(&c) = self.hint.get(handle as usize)
            && let Some(Ok(i)) = self.chunks.get(c as usize).map(|ch| ch.position(addr))
        {
            return Some((c as usize, i));
        }
        let c = self.chunk_for(addr);
        let i = self.chunks.get(c)?.position(addr).ok()?;
        self.set_hint(handle, c);
        Some((c, i))
    }

    fn set_hint(&mut self, handle: u32, c: usize) {
        let h = handle as usize;
        if h >= self.hint.len() {
            self.hint.resize(h + 1, u32::MAX);
        }
        if let Some(slot) = self.hint.get_mut(h) {
            *slot = c as u32;
        }
    }

    /// Chunk `c` lost blocks: drops it when empty, or merges it into a neighbour when both are
    /// short.
    fn after_removal(&mut self, c: usize) {
        let Some(n) = self.chunks.get(c).map(|ch| ch.addr.len()) else {
            return;
        };
        if n == 0 {
            self.chunks.remove(c);
            self.rebuild();
            return;
        }
        if n <= CHUNK_MERGE {
            let small_neighbour = |d: usize| {
                self.chunks
                    .get(d)
                    .is_some_and(|ch| ch.addr.len() + n <= CHUNK_CAP / 2)
            };
            let pair = if c > 0 && small_neighbour(c - 1) {
                Some(c - 1)
            } else if small_neighbour(c + 1) {
                Some(c)
            } else {
                None
            };
            if let Some(lower) = pair
                && lower + 1 < self.chunks.len()
            {
                let upper = self.chunks.remove(lower + 1);
                if let Some(ch) = self.chunks.get_mut(lower) {
                    ch.append(upper);
                }
                self.rebuild();
                return;
            }
        }
        self.refresh(c);
    }
}

impl FreeIndex for AddrChunks {
    fn insert(&mut self, addr: Addr, len: u64, handle: u32) {
        self.found = None;
        self.len += 1;
        if self.chunks.is_empty() {
            self.chunks.push(Chunk::default());
            self.rebuild();
        }
        let c = self.chunk_for(addr);
        let Some(chunk) = self.chunks.get_mut(c) else {
            return;
        };
        let i = chunk.position(addr).unwrap_or_else(|i| i);
        chunk.insert_at(i, addr, len, handle);
        if chunk.addr.len() > CHUNK_CAP {
            let upper = chunk.split_off_half();
            for &h in &upper.handle {
                self.set_hint(h, c + 1);
            }
            self.chunks.insert(c + 1, upper);
            self.rebuild();
        } else {
            self.refresh(c);
        }
        // After a split the block may sit in either half: a wrong hint is only a slower lookup.
        self.set_hint(handle, c);
    }

    fn remove(&mut self, addr: Addr, _len: u64, handle: u32) {
        let Some((c, i)) = self.locate(addr, handle) else {
            return;
        };
        self.found = None;
        self.len -= 1;
        if let Some(chunk) = self.chunks.get_mut(c) {
            chunk.remove_at(i);
        }
        self.after_removal(c);
    }

    fn relocate(
        &mut self,
        handle: u32,
        old_addr: Addr,
        old_len: u64,
        new_addr: Addr,
        new_len: u64,
    ) {
        let Some((c, i)) = self.locate(old_addr, handle) else {
            return;
        };
        let Some(chunk) = self.chunks.get_mut(c) else {
            return;
        };
        // The caller guarantees no free block lies between the two addresses: the rank holds.
        if let (Some(a), Some(l)) = (chunk.addr.get_mut(i), chunk.len.get_mut(i)) {
            *a = new_addr;
            *l = new_len;
        }
        if new_len >= chunk.max_len {
            chunk.max_len = new_len;
        } else if old_len == chunk.max_len {
            chunk.recompute_max();
        }
        self.found = Some((c, i));
        self.refresh(c);
    }

    fn find(&mut self, min_len: u64) -> Option<(Addr, u64, u32)> {
        self.found = None;
        if self.tree.get(1).copied().unwrap_or(0) < min_len {
            return None;
        }
        let mut node = 1;
        while node < self.leaves {
            node = if self.tree.get(2 * node).is_some_and(|&m| m >= min_len) {
                2 * node
            } else {
                2 * node + 1
            };
        }
        let c = node - self.leaves;
        let chunk = self.chunks.get(c)?;
        let i = first_at_least(&chunk.len, min_len)?;
        self.found = Some((c, i));
        Some((
            *chunk.addr.get(i)?,
            *chunk.len.get(i)?,
            *chunk.handle.get(i)?,
        ))
    }

    fn largest(&self) -> u64 {
        self.tree.get(1).copied().unwrap_or(0)
    }

    fn entries(&self) -> Vec<(Addr, u64, u32)> {
        let mut out = Vec::with_capacity(self.len);
        for ch in &self.chunks {
            out.extend(
                ch.addr
                    .iter()
                    .zip(&ch.len)
                    .zip(&ch.handle)
                    .map(|((&a, &l), &h)| (a, l, h)),
            );
        }
        out
    }

    fn remap_handles(&mut self, new_of: &[u32]) {
        for h in self.chunks.iter_mut().flat_map(|ch| ch.handle.iter_mut()) {
            *h = new_of.get(*h as usize).copied().unwrap_or(u32::MAX);
        }
        self.hint = Vec::new();
        let placed: Vec<(u32, usize)> = (0..self.chunks.len())
            .flat_map(|c| {
                let handles = self.chunks.get(c).map_or(&[][..], |ch| &ch.handle[..]);
                handles.iter().map(move |&h| (h, c))
            })
            .collect();
        for (h, c) in placed {
            self.set_hint(h, c);
        }
    }

    fn check(&self) -> Result<(), String> {
        let mut count = 0;
        let mut prev: Option<Addr> = None;
        for (c, ch) in self.chunks.iter().enumerate() {
            if ch.addr.is_empty() || ch.addr.len() > CHUNK_CAP {
                return Err(format!("chunk {c} holds {} blocks", ch.addr.len()));
            }
            if ch.len.len() != ch.addr.len() || ch.handle.len() != ch.addr.len() {
                return Err(format!("chunk {c}: arrays of different lengths"));
            }
            for &a in &ch.addr {
                if prev.is_some_and(|p| p >= a) {
                    return Err(format!("address order broken at {a:#x}"));
                }
                prev = Some(a);
            }
            if ch.max_len != ch.len.iter().copied().max().unwrap_or(0) {
                return Err(format!("chunk {c}: largest length wrong"));
            }
            if self.firsts.get(c) != ch.addr.first() {
                return Err(format!("chunk {c}: first address wrong"));
            }
            if self.tree.get(self.leaves + c) != Some(&ch.max_len) {
                return Err(format!("chunk {c}: max-tree leaf wrong"));
            }
            count += ch.addr.len();
        }
        if self.firsts.len() != self.chunks.len() {
            return Err("one first address per chunk expected".to_owned());
        }
        for node in 1..self.leaves {
            if self.tree.get(node) != Some(&self.child_max(node)) {
                return Err(format!("max-tree node {node} wrong"));
            }
        }
        if count != self.len {
            return Err(format!(
                "{count} free blocks indexed, len says {}",
                self.len
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::fit_common::FreeIndex;

    #[test]
    fn chunks_finds_lowest_fitting_address() {
        let mut t = AddrChunks::default();
        for (addr, len) in [(0, 32), (100, 64), (200, 16), (300, 128), (500, 64)] {
            t.insert(addr, len, addr as u32);
            t.check().unwrap();
        }
        assert_eq!(t.find(16), Some((0, 32, 0)));
        assert_eq!(t.find(33), Some((100, 64, 100)));
        assert_eq!(t.find(65), Some((300, 128, 300)));
        assert_eq!(t.find(129), None);
        assert_eq!(t.largest(), 128);
        t.remove(300, 128, 300);
        t.check().unwrap();
        assert_eq!(t.find(65), None);
        assert_eq!(t.largest(), 64);
        t.relocate(100, 100, 64, 110, 200);
        t.check().unwrap();
        assert_eq!(t.find(65), Some((110, 200, 100)));
        assert_eq!(
            t.entries(),
            vec![(0, 32, 0), (110, 200, 100), (200, 16, 200), (500, 64, 500)]
        );
    }

    #[test]
    fn chunks_stay_consistent_under_many_operations() {
        let mut t = AddrChunks::default();
        let mut model = std::collections::BTreeMap::new();
        let mut x: u64 = 7;
        // Grows to thousands of blocks (many splits), shrinks back to none (merges and empty
        // chunks), and grows again; every search is checked against the sorted map.
        for step in 0..60_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let addr = (x >> 40) % 8192 * 16;
            let len = (x >> 20) % 4096 + 1;
            let growing = (step / 20_000) % 2 == 0;
            if model.contains_key(&addr) && (!growing || x.is_multiple_of(4)) {
                model.remove(&addr);
                t.remove(addr, 0, addr as u32);
            } else if growing && !model.contains_key(&addr) {
                model.insert(addr, len);
                t.insert(addr, len, addr as u32);
            } else if let Some((&a, &l)) = model.range(addr..).next() {
                // Shrink or grow a block in place, as carving and coalescing do.
                let new_len = (l / 2).max(1) + x % 3;
                model.insert(a, new_len);
                t.relocate(a as u32, a, l, a, new_len);
            }
            let want = (x >> 8) % 4200;
            let expected = model
                .iter()
                .find(|&(_, &l)| l >= want)
                .map(|(&a, &l)| (a, l, a as u32));
            assert_eq!(t.find(want), expected, "step {step}");
            assert_eq!(t.largest(), model.values().copied().max().unwrap_or(0));
            let at = (x >> 30) % 8300 * 16;
            assert_eq!(
                t.at_or_below(at),
                model.range(..=at).next_back().map(|(&a, &l)| (a, l))
            );
            if step % 997 == 0 {
                t.check().unwrap();
            }
        }
        t.check().unwrap();
        assert_eq!(
            t.entries(),
            model
                .into_iter()
                .map(|(a, l)| (a, l, a as u32))
                .collect::<Vec<_>>()
        );
    }
}
