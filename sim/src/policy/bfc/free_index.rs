//! The free-chunk index behind BFC's 21 bins: answers "smallest free chunk >= n, lowest address
//! on ties" exactly like TF's per-bin `std::set` ordered by (size, address), but faster.
//!
//! Sizes up to [`SMALL_CLASSES`] x 256 B (1 MiB) get one bucket per exact size: a min-heap of
//! addresses with lazy deletion (an entry is valid while a free chunk of that size still sits at
//! that address under that handle), plus a two-level bitmap of non-empty buckets. Larger sizes go
//! to an ordered map, except the most recently inserted one, which waits in a one-chunk slot:
//! BFC keeps carving requests off one big free chunk (a region's tail), and the slot turns each
//! such take-and-reinsert into no map operation at all. Best fit is a bitmap scan and a heap pop
//! (or a map lookup compared with the slot); removing a chunk that merges away only decrements its
//! bucket's count, and its stale entry is dropped when it surfaces or when the bucket is
//! compacted.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::{Chunk, MIN_ALLOCATION_BYTES};

/// Exact-size buckets: sizes 256 B ..= 1 MiB.
pub(super) const SMALL_CLASSES: usize = 4096;
const WORDS: usize = SMALL_CLASSES / 64;

#[derive(Clone, Debug, Default)]
struct Bucket {
    /// (addr, handle), smallest address on top; may hold stale entries.
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    /// Free chunks of this size.
    live: usize,
}

#[derive(Clone, Debug)]
pub(super) struct FreeIndex {
    buckets: Vec<Bucket>,
    words: [u64; WORDS],
    summary: u64,
    large: BTreeMap<u128, u32>,
    /// One large free chunk kept out of `large`: (key, handle).
    slot: Option<(u128, u32)>,
    len: usize,
}

fn large_key(size_bytes: u64, addr: u64) -> u128 {
    (u128::from(size_bytes) << 64) | u128::from(addr)
}

/// Bucket of an exact chunk size, if small.
fn class(size_bytes: u64) -> Option<usize> {
    let k = usize::try_from(size_bytes / MIN_ALLOCATION_BYTES).ok()?;
    (1..=SMALL_CLASSES).contains(&k).then(|| k - 1)
}

fn class_size(class: usize) -> u64 {
    (class as u64 + 1) * MIN_ALLOCATION_BYTES
}

/// True while `h` is a free chunk of `size_bytes` at `addr`.
fn valid(chunks: &[Chunk], h: u32, addr: u64, size_bytes: u64) -> bool {
    chunks
        .get(h as usize)
        .is_some_and(|c| !c.in_use() && c.addr == addr && c.size_bytes == size_bytes)
}

impl Default for FreeIndex {
    fn default() -> Self {
        Self {
            buckets: vec![Bucket::default(); SMALL_CLASSES],
            words: [0; WORDS],
            summary: 0,
            large: BTreeMap::new(),
            slot: None,
            len: 0,
        }
    }
}

impl FreeIndex {
    /// Bytes a copy of the index holds (a copied vector or heap is as long as the original,
    /// stale entries included).
    pub(super) fn copy_bytes(&self) -> usize {
        let heaps: usize = self.buckets.iter().map(|b| b.heap.len()).sum();
        self.buckets.len() * std::mem::size_of::<Bucket>()
            + heaps * std::mem::size_of::<Reverse<(u64, u32)>>()
            + self.large.len()
                * (std::mem::size_of::<(u128, u32)>() + crate::policy::BTREE_ENTRY_OVERHEAD_BYTES)
            + std::mem::size_of::<Self>()
    }

    /// Number of free chunks.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn set_bit(&mut self, class: usize, on: bool) {
        let w = class / 64;
        if let Some(word) = self.words.get_mut(w) {
            if on {
                *word |= 1 << (class % 64);
            } else {
                *word &= !(1 << (class % 64));
            }
            if *word == 0 {
                self.summary &= !(1 << w);
            } else {
                self.summary |= 1 << w;
            }
        }
    }

    /// First non-empty bucket at or above `class`.
    fn next_class(&self, class: usize) -> Option<usize> {
        let w = class / 64;
        let here = self.words.get(w)? & (u64::MAX << (class % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let above = self.summary & u64::MAX.checked_shl(w as u32 + 1).unwrap_or(0);
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros() as usize;
        Some(w * 64 + self.words.get(w)?.trailing_zeros() as usize)
    }

    /// Adds free chunk `h` (already marked free, with its final address and size).
    pub(super) fn insert(&mut self, chunks: &[Chunk], size_bytes: u64, addr: u64, h: u32) {
        self.len += 1;
        let Some(c) = class(size_bytes) else {
            if let Some((key, old)) = self.slot.replace((large_key(size_bytes, addr), h)) {
                self.large.insert(key, old);
            }
            return;
        };
        let mut newly_live = false;
        if let Some(b) = self.buckets.get_mut(c) {
            // Stale entries would otherwise pile up in a bucket that is never emptied.
            if b.heap.len() > 2 * b.live + 32 {
                let size = class_size(c);
                b.heap
                    .retain(|&Reverse((a, hh))| valid(chunks, hh, a, size));
            }
            b.heap.push(Reverse((addr, h)));
            b.live += 1;
            newly_live = b.live == 1;
        }
        if newly_live {
            self.set_bit(c, true);
        }
    }

    /// Forgets free chunk `h` of `size_bytes` at `addr` (about to merge or be released).
    pub(super) fn remove(&mut self, size_bytes: u64, addr: u64) {
        self.len = self.len.saturating_sub(1);
        let Some(c) = class(size_bytes) else {
            let key = large_key(size_bytes, addr);
            if self.slot.is_some_and(|(k, _)| k == key) {
                self.slot = None;
            } else {
                self.large.remove(&key);
            }
            return;
        };
        let mut emptied = false;
        if let Some(b) = self.buckets.get_mut(c) {
            b.live = b.live.saturating_sub(1);
            if b.live == 0 {
                b.heap.clear();
                emptied = true;
            }
        }
        if emptied {
            self.set_bit(c, false);
        }
    }

    /// Takes the smallest free chunk of at least `size_bytes`, lowest address on ties:
    /// (size, addr, handle).
    pub(super) fn take_best_fit(
        &mut self,
        chunks: &[Chunk],
        size_bytes: u64,
    ) -> Option<(u64, u64, u32)> {
        let mut from = class(size_bytes.max(MIN_ALLOCATION_BYTES));
        while let Some(c) = from.and_then(|f| self.next_class(f)) {
            let size = class_size(c);
            let mut found = None;
            let mut emptied = false;
            if let Some(b) = self.buckets.get_mut(c) {
                while let Some(Reverse((addr, h))) = b.heap.pop() {
                    if valid(chunks, h, addr, size) {
                        found = Some((size, addr, h));
                        b.live = b.live.saturating_sub(1);
                        break;
                    }
                }
                if b.live == 0 || found.is_none() {
                    // `found.is_none()` with live > 0 cannot happen; clearing keeps the search
                    // from looping if it ever did.
                    b.live = 0;
                    b.heap.clear();
                    emptied = true;
                }
            }
            if emptied {
                self.set_bit(c, false);
            }
            if let Some(hit) = found {
                self.len = self.len.saturating_sub(1);
                return Some(hit);
            }
            from = Some(c);
        }
        let lower = if class(size_bytes).is_some() {
            0
        } else {
            large_key(size_bytes, 0)
        };
        let mapped = self.large.range(lower..).next().map(|(&k, &h)| (k, h));
        let slotted = self.slot.filter(|&(k, _)| k >= lower);
        let (key, h) = match (mapped, slotted) {
            (Some(m), Some(s)) if m.0 < s.0 => {
                self.large.remove(&m.0);
                m
            }
            (_, Some(s)) => {
                self.slot = None;
                s
            }
            (Some(m), None) => {
                self.large.remove(&m.0);
                m
            }
            (None, None) => return None,
        };
        self.len = self.len.saturating_sub(1);
        Some(((key >> 64) as u64, key as u64, h))
    }

    /// Entries (valid or stale) in the bucket of `size_bytes`.
    #[cfg(test)]
    pub(super) fn bucket_entries(&self, size_bytes: u64) -> usize {
        class(size_bytes)
            .and_then(|c| self.buckets.get(c))
            .map_or(0, |b| b.heap.len())
    }

    /// Size of the largest free chunk (0 when none).
    pub(super) fn largest(&self) -> u64 {
        let mapped = self.large.last_key_value().map(|(&k, _)| k);
        if let Some(k) = mapped.max(self.slot.map(|(k, _)| k)) {
            return (k >> 64) as u64;
        }
        if self.summary == 0 {
            return 0;
        }
        let w = 63 - self.summary.leading_zeros() as usize;
        let word = self.words.get(w).copied().unwrap_or(0);
        if word == 0 {
            return 0;
        }
        class_size(w * 64 + 63 - word.leading_zeros() as usize)
    }

    /// Self-check against the chunk list: `free` holds every free chunk (handle, size, addr).
    pub(super) fn check(&self, chunks: &[Chunk], free: &[(u32, u64, u64)]) -> Result<(), String> {
        if free.len() != self.len {
            return Err(format!(
                "index counts {} free chunks, regions hold {}",
                self.len,
                free.len()
            ));
        }
        let mut live = vec![0usize; SMALL_CLASSES];
        let mut large = 0;
        for &(h, size, addr) in free {
            match class(size) {
                Some(c) => {
                    let Some(b) = self.buckets.get(c) else {
                        return Err(format!("no bucket for size {size}"));
                    };
                    if !b.heap.iter().any(|&Reverse(e)| e == (addr, h)) {
                        return Err(format!("free chunk {h} at {addr:#x} not in its bucket"));
                    }
                    if let Some(n) = live.get_mut(c) {
                        *n += 1;
                    }
                }
                None => {
                    let key = large_key(size, addr);
                    if self.large.get(&key) != Some(&h) && self.slot != Some((key, h)) {
                        return Err(format!("free chunk {h} at {addr:#x} not in its bin"));
                    }
                    large += 1;
                }
            }
        }
        if large != self.large.len() + usize::from(self.slot.is_some()) {
            return Err("large-chunk map holds chunks that are not free".into());
        }
        for (c, (b, &n)) in self.buckets.iter().zip(&live).enumerate() {
            if b.live != n {
                return Err(format!("bucket {c} counts {} chunks, {n} are free", b.live));
            }
            let bit = self
                .words
                .get(c / 64)
                .is_some_and(|w| w >> (c % 64) & 1 == 1);
            if bit != (n > 0) {
                return Err(format!("bitmap bit {c} is wrong"));
            }
            let valid_entries = b
                .heap
                .iter()
                .filter(|&&Reverse((a, h))| valid(chunks, h, a, class_size(c)))
                .count();
            if valid_entries < n {
                return Err(format!("bucket {c} lost entries"));
            }
        }
        for (w, &word) in self.words.iter().enumerate() {
            if (self.summary >> w & 1 == 1) != (word != 0) {
                return Err(format!("summary bit {w} is wrong"));
            }
        }
        Ok(())
    }
}
