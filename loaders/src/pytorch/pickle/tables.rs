//! Interning tables: strings and bytes by content, 4-byte runs by content, and FxHash.

use std::hash::{BuildHasherDefault, Hasher};

use super::raw::Raw;

/// Storage for interned strings (`String`) or byte strings (`Vec<u8>`), back to back.
pub(super) trait Arena: Default {
    type Item: ?Sized;
    fn bytes(item: &Self::Item) -> &[u8];
    fn push(&mut self, item: &Self::Item);
    fn slice(&self, start: usize, end: usize) -> Option<&Self::Item>;
    fn len_bytes(&self) -> usize;
    fn capacity_bytes(&self) -> usize;
}

impl Arena for String {
    type Item = str;
    fn bytes(item: &str) -> &[u8] {
        item.as_bytes()
    }
    fn push(&mut self, item: &str) {
        self.push_str(item);
    }
    fn slice(&self, start: usize, end: usize) -> Option<&str> {
        self.get(start..end)
    }
    fn len_bytes(&self) -> usize {
        self.len()
    }
    fn capacity_bytes(&self) -> usize {
        self.capacity()
    }
}

impl Arena for Vec<u8> {
    type Item = [u8];
    fn bytes(item: &[u8]) -> &[u8] {
        item
    }
    fn push(&mut self, item: &[u8]) {
        self.extend_from_slice(item);
    }
    fn slice(&self, start: usize, end: usize) -> Option<&[u8]> {
        self.get(start..end)
    }
    fn len_bytes(&self) -> usize {
        self.len()
    }
    fn capacity_bytes(&self) -> usize {
        self.capacity()
    }
}

/// Interned strings: all stored back to back, found by an open-addressing table.
#[derive(Default)]
pub(super) struct Interner<A: Arena> {
    pub(super) data: A,
    /// `starts[i]..starts[i + 1]` is string `i` (one more entry than strings).
    pub(super) starts: Vec<u64>,
    /// `(hash >> 32) << 32 | (id + 1)`, 0 for an empty slot; the length is a power of two.
    pub(super) slots: Vec<u64>,
}

pub(super) fn hash_bytes(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let (words, tail) = bytes.as_chunks::<8>();
    let mut h = (bytes.len() as u64).wrapping_mul(K);
    for w in words {
        h = (h.rotate_left(23) ^ u64::from_le_bytes(*w)).wrapping_mul(K);
    }
    let mut last = [0u8; 8];
    for (d, s) in last.iter_mut().zip(tail) {
        *d = *s;
    }
    h = (h.rotate_left(23) ^ u64::from_le_bytes(last)).wrapping_mul(K);
    // murmur3's finaliser: every input bit reaches the high bits used for the slot.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

impl<A: Arena> Interner<A> {
    pub(super) fn len(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    pub(super) fn get(&self, id: u32) -> Option<&A::Item> {
        let i = id as usize;
        let start = usize::try_from(*self.starts.get(i)?).ok()?;
        let end = usize::try_from(*self.starts.get(i + 1)?).ok()?;
        self.data.slice(start, end)
    }

    pub(super) fn get_bytes(&self, id: u32) -> Option<&[u8]> {
        self.get(id).map(A::bytes)
    }

    pub(super) fn slot_of(&self, hash: u64) -> usize {
        let bits = self.slots.len().trailing_zeros();
        if bits == 0 {
            0
        } else {
            (hash >> (64 - bits)) as usize
        }
    }

    /// The slot holding `item`, or the empty slot where it would go.
    pub(super) fn probe(&self, bytes: &[u8], hash: u64) -> Option<(usize, Option<u32>)> {
        let mask = self.slots.len().checked_sub(1)?;
        let mut i = self.slot_of(hash);
        loop {
            let slot = *self.slots.get(i)?;
            if slot == 0 {
                return Some((i, None));
            }
            let id = (slot as u32).wrapping_sub(1);
            if slot >> 32 == hash >> 32 && self.get_bytes(id) == Some(bytes) {
                return Some((i, Some(id)));
            }
            i = (i + 1) & mask;
        }
    }

    /// The id of `item` if it was interned.
    pub(super) fn find(&self, item: &A::Item) -> Option<u32> {
        let bytes = A::bytes(item);
        self.probe(bytes, hash_bytes(bytes))?.1
    }

    /// The id of `item`, storing it if it is new; `None` past 2^32 - 2 strings.
    pub(super) fn intern(&mut self, item: &A::Item) -> Option<u32> {
        if self.starts.is_empty() {
            self.starts.push(0);
        }
        if (self.len() + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let bytes = A::bytes(item);
        let hash = hash_bytes(bytes);
        let (i, found) = self.probe(bytes, hash)?;
        if let Some(id) = found {
            return Some(id);
        }
        let id = u32::try_from(self.len())
            .ok()
            .filter(|&id| id < u32::MAX - 1)?;
        self.data.push(item);
        self.starts.push(self.data.len_bytes() as u64);
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = (hash >> 32 << 32) | u64::from(id + 1);
        }
        Some(id)
    }

    pub(super) fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(64);
        let old = std::mem::replace(&mut self.slots, vec![0; size]);
        let mask = size - 1;
        for slot in old.into_iter().filter(|&s| s != 0) {
            let id = (slot as u32).wrapping_sub(1);
            let hash = self.get_bytes(id).map(hash_bytes).unwrap_or_default();
            let mut i = self.slot_of(hash);
            while let Some(s) = self.slots.get_mut(i) {
                if *s == 0 {
                    *s = slot;
                    break;
                }
                i = (i + 1) & mask;
            }
        }
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.data.capacity_bytes() + self.starts.capacity() * 8 + self.slots.capacity() * 8
    }
}

/// Narrow runs of at least this many values are shared by all lists with the same content.
pub(super) const MIN_SHARED_RUN: usize = 4;

/// Finds a narrow run by content, so that lists with equal items (frames lists of the same
/// call stack) store them once. Sharing is safe because a run's values never change: a list
/// grows in place only past the end of every run that shares its start.
#[derive(Default)]
pub(super) struct RunIndex {
    /// `(hash >> 32) << 32 | (start + 1)`, 0 for an empty slot; the length is a power of two.
    pub(super) slots: Vec<u64>,
    pub(super) len: usize,
}

pub(super) fn hash_narrow(values: &[Raw]) -> u64 {
    let mut h = (values.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for r in values {
        h = (h.rotate_left(5) ^ u64::from(r.0 as u32)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

impl RunIndex {
    /// Where a run equal to `values` starts in `narrow`, or `None` after noting that one will
    /// start at `narrow.len()`.
    pub(super) fn find_or_add(&mut self, narrow: &[u32], values: &[Raw]) -> Option<u32> {
        let new_start = u32::try_from(narrow.len()).ok().filter(|&s| s < u32::MAX)?;
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let hash = hash_narrow(values);
        let mask = self.slots.len() - 1;
        let mut i = (hash >> (64 - self.slots.len().trailing_zeros())) as usize;
        loop {
            let slot = *self.slots.get(i)?;
            if slot == 0 {
                break;
            }
            if slot >> 32 == hash >> 32 {
                let start = (slot as u32).wrapping_sub(1);
                let run = narrow.get(start as usize..start as usize + values.len());
                if run.is_some_and(|run| run.iter().zip(values).all(|(&n, r)| n == r.0 as u32)) {
                    return Some(start);
                }
            }
            i = (i + 1) & mask;
        }
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = (hash >> 32 << 32) | u64::from(new_start + 1);
            self.len += 1;
        }
        None
    }

    pub(super) fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(1024);
        let old = std::mem::replace(&mut self.slots, vec![0; size]);
        let mask = size - 1;
        let bits = size.trailing_zeros();
        for slot in old.into_iter().filter(|&s| s != 0) {
            let mut i = ((slot >> 32) >> (32 - bits)) as usize;
            while let Some(s) = self.slots.get_mut(i) {
                if *s == 0 {
                    *s = slot;
                    break;
                }
                i = (i + 1) & mask;
            }
        }
    }
}

/// FxHash: the key-shape table hashes a few `u64`s per dict, where SipHash would be slow.
#[derive(Default)]
pub(super) struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = (self.0.rotate_left(5) ^ hash_bytes(bytes)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(super) type FxBuild = BuildHasherDefault<FxHasher>;
