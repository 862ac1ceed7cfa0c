//! [`AddrMap`]: the address-keyed hash map every policy uses to find a used block from the
//! address `free` receives.
//!
//! Open addressing with linear probing in one array of `(address, value)` pairs, Fibonacci
//! hashing (the address times 2^64/φ, top bits), and backward-shift deletion
//! (no tombstones, so probe runs stay short however long the replay). A lookup usually touches
//! a single cache line: the policies' replay loops spend much of their time here, and this runs
//! markedly faster than a general-purpose map with a custom hasher. `u64::MAX` marks an empty
//! slot; it is never a block address, since a block of at least one byte must end inside the
//! address space.
//!
//! A table in use grows when it is more than a quarter full: fuller, probe runs are longer and
//! a deletion walks further to close its gap, and the map was the most expensive part of
//! bfc's free (about half its samples in `perf annotate`, most of them the deletion's walk). A copy (a
//! checkpoint) is sized for at most half full instead, as memory matters more than speed there,
//! and grows again at its first insertions. Growing at a quarter instead of a half took bfc's
//! `compare` replay of the python trace from 33.1-34.7 to 35.5-36.8 M events/s and buddy's of
//! the git trace from 1.03-1.04 to 1.10 times libc's rate (two alternating runs); the short
//! traces, whose tables stay small, did not change.

use crate::hash::HASH_MUL;
use crate::heap::Addr;

const EMPTY: Addr = Addr::MAX;
/// Smallest table, in slots.
const MIN_SLOTS: usize = 16;

/// Hash map from simulated address to a small `Copy` value (see the module docs).
#[derive(Debug)]
pub(crate) struct AddrMap<V> {
    slots: Vec<(Addr, V)>,
    /// `slots.len() - 1`; the table is a power of two long.
    mask: usize,
    /// 64 minus log2 of the table length: the hash keeps the product's top bits.
    shift: u32,
    len: usize,
}

/// A table in use grows past `1 / GROW_LOAD_INVERSE` full (see the module docs).
const GROW_LOAD_INVERSE: usize = 4;

/// A copy holds its entries in the table size [`AddrMap::slots_for`] gives (at most half full)
/// rather than the original's: the original's never shrinks after its busiest moment, and is
/// sized for speed. A table already at that size is copied as it is.
impl<V: Copy + Default> Clone for AddrMap<V> {
    fn clone(&self) -> Self {
        if self.slots.len() <= Self::slots_for(self.len) {
            return Self {
                slots: self.slots.clone(),
                mask: self.mask,
                shift: self.shift,
                len: self.len,
            };
        }
        let mut copy = Self::with_slots(Self::slots_for(self.len));
        for &(k, v) in &self.slots {
            if k != EMPTY {
                copy.place_new(k, v);
            }
        }
        copy
    }
}

/// Slots of a new map: 64 KiB of entries, so a replay does not spend its first thousands of
/// allocations rehashing a growing table (checkpoint copies shrink to what they hold).
const INITIAL_SLOTS: usize = 4096;

impl<V: Copy + Default> Default for AddrMap<V> {
    fn default() -> Self {
        Self::with_slots(INITIAL_SLOTS)
    }
}

impl<V: Copy + Default> AddrMap<V> {
    fn with_slots(n: usize) -> Self {
        let n = n.max(MIN_SLOTS).next_power_of_two();
        Self {
            slots: vec![(EMPTY, V::default()); n],
            mask: n - 1,
            shift: 64 - n.trailing_zeros(),
            len: 0,
        }
    }

    /// Slots needed to hold `len` entries at most half full (a copy's size).
    fn slots_for(len: usize) -> usize {
        (len.saturating_mul(2) + 1)
            .max(MIN_SLOTS)
            .next_power_of_two()
    }

    #[inline]
    fn home(&self, addr: Addr) -> usize {
        (addr.wrapping_mul(HASH_MUL) >> self.shift) as usize & self.mask
    }

    /// Slot holding `addr`, or the empty slot where it would go.
    #[inline]
    fn probe(&self, addr: Addr) -> (usize, bool) {
        let mut i = self.home(addr);
        loop {
            match self.slots.get(i) {
                Some(&(k, _)) if k == addr => return (i, true),
                Some(&(k, _)) if k == EMPTY => return (i, false),
                Some(_) => i = (i + 1) & self.mask,
                // Unreachable: `i` is masked into the table. Reporting "absent, here" keeps the
                // map total without a panic path.
                None => return (i, false),
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Slots of the table.
    #[cfg(test)]
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    pub(crate) fn get(&self, addr: &Addr) -> Option<&V> {
        match self.probe(*addr) {
            (i, true) => self.slots.get(i).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Inserts or replaces; returns the previous value.
    #[inline]
    pub(crate) fn insert(&mut self, addr: Addr, value: V) -> Option<V> {
        if (self.len + 1) * GROW_LOAD_INVERSE > self.slots.len() {
            self.grow();
        }
        let (i, found) = self.probe(addr);
        let slot = self.slots.get_mut(i)?;
        let old = found.then_some(slot.1);
        *slot = (addr, value);
        if !found {
            self.len += 1;
        }
        old
    }

    #[inline]
    pub(crate) fn remove(&mut self, addr: &Addr) -> Option<V> {
        let (mut hole, found) = self.probe(*addr);
        if !found {
            return None;
        }
        let value = self.slots.get(hole).map(|s| s.1);
        // Backward shift: pull later entries of the run into the hole when the hole lies
        // between their home and their slot, so no lookup ever stops short of its key.
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let Some(&(k, v)) = self.slots.get(j) else {
                break;
            };
            if k == EMPTY {
                break;
            }
            let home = self.home(k);
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                if let Some(s) = self.slots.get_mut(hole) {
                    *s = (k, v);
                }
                hole = j;
            }
        }
        if let Some(s) = self.slots.get_mut(hole) {
            *s = (EMPTY, V::default());
        }
        self.len -= 1;
        value
    }

    /// Doubles the table until it is at most a quarter full with one more entry.
    #[cold]
    fn grow(&mut self) {
        let mut n = self.slots.len().max(MIN_SLOTS);
        while (self.len + 1) * GROW_LOAD_INVERSE > n {
            n *= 2;
        }
        self.rehash(n);
    }

    fn rehash(&mut self, n: usize) {
        let old = std::mem::replace(self, Self::with_slots(n));
        for &(k, v) in &old.slots {
            if k != EMPTY {
                self.place_new(k, v);
            }
        }
    }

    /// Stores `addr`, which is not in the map, without growing the table (which has room).
    fn place_new(&mut self, addr: Addr, value: V) {
        let (i, _) = self.probe(addr);
        if let Some(s) = self.slots.get_mut(i) {
            *s = (addr, value);
        }
        self.len += 1;
    }

    /// Shrinks the table to a copy's size, at most half full (a final state kept for good
    /// calls this: the table never shrinks by itself after the busiest moment).
    pub(crate) fn shrink_to_fit(&mut self) {
        let n = Self::slots_for(self.len);
        if n < self.slots.len() {
            self.rehash(n);
        }
    }

    /// Bytes of the table [`Self::shrink_to_fit`] would leave: what a checkpoint copy holds.
    pub(crate) fn shrunk_bytes(&self) -> usize {
        Self::slots_for(self.len).min(self.slots.len()) * std::mem::size_of::<(Addr, V)>()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Addr, &V)> {
        self.slots
            .iter()
            .filter(|(k, _)| *k != EMPTY)
            .map(|(k, v)| (k, v))
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.slots
            .iter_mut()
            .filter(|(k, _)| *k != EMPTY)
            .map(|(_, v)| v)
    }
}

impl<'a, V: Copy + Default> IntoIterator for &'a AddrMap<V> {
    type Item = (&'a Addr, &'a V);
    type IntoIter = Box<dyn Iterator<Item = (&'a Addr, &'a V)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn agrees_with_a_hash_map_under_churn() {
        let mut ours: AddrMap<u32> = AddrMap::default();
        let mut model: HashMap<Addr, u32> = HashMap::new();
        let mut x: u64 = 11;
        for step in 0..200_000u32 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            // Aligned addresses in a window, so runs collide, wrap around and empty out.
            let addr = (x >> 33) % 20_000 * 16;
            let phase = (step / 50_000) % 2 == 0;
            if phase || x.is_multiple_of(3) {
                assert_eq!(ours.insert(addr, step), model.insert(addr, step));
            } else {
                assert_eq!(ours.remove(&addr), model.remove(&addr));
            }
            let probe = (x >> 20) % 20_000 * 16;
            assert_eq!(ours.get(&probe), model.get(&probe));
            assert_eq!(ours.len(), model.len());
            if step % 40_000 == 0 {
                ours.shrink_to_fit();
            }
        }
        let mut a: Vec<_> = ours.iter().map(|(&k, &v)| (k, v)).collect();
        let mut b: Vec<_> = model.into_iter().collect();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }

    #[test]
    fn shrinks_and_keeps_every_entry() {
        let mut m: AddrMap<u32> = AddrMap::default();
        for i in 0..10_000u64 {
            m.insert(i * 4096, i as u32);
        }
        for i in 0..9_990u64 {
            assert_eq!(m.remove(&(i * 4096)), Some(i as u32));
        }
        let before = m.slots.len();
        m.shrink_to_fit();
        assert!(m.slots.len() < before / 100, "{} slots", m.slots.len());
        for i in 9_990..10_000u64 {
            assert_eq!(m.get(&(i * 4096)), Some(&(i as u32)));
        }
        assert_eq!(m.get(&0), None);
    }

    #[test]
    fn grows_at_a_quarter_and_copies_at_half() {
        let mut m: AddrMap<u32> = AddrMap::default();
        for i in 0..50_000u64 {
            m.insert(i * 256, i as u32);
            assert!(
                m.len() * 4 <= m.slots.len(),
                "{} in {}",
                m.len(),
                m.slots.len()
            );
        }
        // A copy of the busy table is half its size, at most half full, and holds the same.
        let copy = m.clone();
        assert_eq!(copy.slots.len(), AddrMap::<u32>::slots_for(50_000));
        assert!(copy.slots.len() < m.slots.len());
        for i in 0..50_000u64 {
            assert_eq!(copy.get(&(i * 256)), Some(&(i as u32)));
        }
        // After most entries go, a copy shrinks to what is left.
        for i in 0..49_000u64 {
            m.remove(&(i * 256));
        }
        let mut copy = m.clone();
        assert_eq!(copy.slots.len(), AddrMap::<u32>::slots_for(1_000));
        assert_eq!(copy.len(), 1_000);
        // A copy of a table already at its size is the same table, and the copy grows back to a
        // quarter full as it takes entries.
        assert_eq!(copy.clone().slots, copy.slots);
        for i in 0..1_000u64 {
            copy.insert((100_000 + i) * 256, 7);
            assert!(copy.len() * 4 <= copy.slots.len());
        }
        let mut a: Vec<_> = copy.iter().map(|(&k, &v)| (k, v)).collect();
        a.sort_unstable();
        assert_eq!(a.len(), 2_000);
        assert_eq!(a.first(), Some(&(49_000 * 256, 49_000)));
        assert_eq!(a.last(), Some(&(100_999 * 256, 7)));
    }

    #[test]
    fn aligned_addresses_spread_over_the_table() {
        let m: AddrMap<u32> = AddrMap::with_slots(4096);
        for align in [16u64, 256, 4096] {
            let homes: std::collections::HashSet<usize> =
                (0..4096u64).map(|i| m.home(i * align)).collect();
            assert!(homes.len() > 2000, "align {align}: {} homes", homes.len());
        }
    }
}
