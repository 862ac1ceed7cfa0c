//! [`AddrMap`]: the address-keyed hash map every policy uses to find a used block from the
//! address `free` receives.
//!
//! Open addressing with linear probing in one array of `(address, value)` pairs, Fibonacci
//! hashing (the address times 2^64/φ, top bits), at most half full, and backward-shift deletion
//! (no tombstones, so probe runs stay short however long the replay). A lookup usually touches
//! a single cache line: the policies' replay loops spend much of their time here, and this runs
//! markedly faster than a general-purpose map with a custom hasher. `u64::MAX` marks an empty
//! slot; it is never a block address, since a block of at least one byte must end inside the
//! address space.

use crate::policy::Addr;

const EMPTY: Addr = Addr::MAX;
const HASH_MUL: u64 = 0x9E37_79B9_7F4A_7C15;
/// Smallest table, in slots.
const MIN_SLOTS: usize = 16;

/// Hash map from simulated address to a small `Copy` value (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct AddrMap<V> {
    slots: Vec<(Addr, V)>,
    /// `slots.len() - 1`; the table is a power of two long.
    mask: usize,
    /// 64 minus log2 of the table length: the hash keeps the product's top bits.
    shift: u32,
    len: usize,
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

    /// Slots needed to hold `len` entries at most half full.
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
        if (self.len + 1) * 2 > self.slots.len() {
            self.rehash(self.slots.len() * 2);
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

    fn rehash(&mut self, n: usize) {
        let old = std::mem::replace(self, Self::with_slots(n));
        for &(k, v) in &old.slots {
            if k != EMPTY {
                let (i, _) = self.probe(k);
                if let Some(s) = self.slots.get_mut(i) {
                    *s = (k, v);
                }
                self.len += 1;
            }
        }
    }

    /// Shrinks the table to the size its entries need (checkpoint copies call this: a clone
    /// copies the whole table, which never shrinks by itself after the busiest moment).
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
    fn aligned_addresses_spread_over_the_table() {
        let m: AddrMap<u32> = AddrMap::with_slots(4096);
        for align in [16u64, 256, 4096] {
            let homes: std::collections::HashSet<usize> =
                (0..4096u64).map(|i| m.home(i * align)).collect();
            assert!(homes.len() > 2000, "align {align}: {} homes", homes.len());
        }
    }
}
