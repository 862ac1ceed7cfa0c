//! `best-fit`: best fit with immediate coalescing.
//!
//! A request takes the SMALLEST free block that is large enough, the lowest address among
//! equally small ones; it is carved from the block's low end and the remainder stays free. With
//! no such block the request is placed at the heap top, which grows. Freeing coalesces with both
//! physical neighbours (boundary tags, O(1)) and a freed block that reaches the heap top lowers
//! it. Sizes are rounded up to `align_bytes` (default 16); a zero-byte request reserves one
//! alignment unit. See `fit_common` for the heap layout shared with `first-fit`.
//!
//! Free blocks shorter than 1024 alignment units sit in exact-size bins (one set per length)
//! found through a two-level bit map; longer ones in one set ordered by `(len, addr)`. The best
//! fit is the lowest address of the first non-empty bin at or after the request's length, else
//! the first large block at or after `(n, 0)`: O(1) bit scans and O(log n) set operations for
//! the search, the insertions and the removals. Most bins hold a handful of blocks, so a bin
//! keeps up to six inline and unordered (its lowest address found by a scan) and becomes an
//! ordered map only when fuller; the most recently freed large block waits in a one-entry slot
//! beside the large set, since programs free and take back the same large buffer over and over.
//! The used blocks sit in a hash map (O(1)).

use std::collections::BTreeMap;

use crate::heap::Addr;
use crate::policy::config::PolicyConfig;
use crate::policy::fit_common::{FitHeap, FitIndex, FitPolicy, FreeIndex};

/// Best fit, lowest address on ties (see the module docs).
pub type BestFit = FitPolicy<SizeBins>;

impl FitIndex for SizeBins {
    const POLICY_NAME: &'static str = "best-fit";
}

impl BestFit {
    /// A best-fit heap honouring `config.align_bytes` and `config.limit_bytes`.
    ///
    /// # Errors
    /// When `align_bytes` is not a power of two.
    pub fn new(config: &PolicyConfig) -> Result<Self, String> {
        Ok(Self {
            heap: FitHeap::new(config, SizeBins::new(config.align_bytes))?,
        })
    }

    /// Changes the footprint limit; see `FitHeap::set_limit`.
    pub(crate) fn set_limit(&mut self, limit: Option<u64>) {
        self.heap.set_limit(limit);
    }
}

/// Lengths (in alignment units) below this have an exact-size bin of their own.
const SMALL_UNITS: usize = 1024;
const WORDS: usize = SMALL_UNITS / 64;

/// Entries a bin holds inline before it moves to an ordered map.
const FEW: usize = 6;

/// The free blocks of one exact length, `(addr, handle)`. Most bins hold a handful of blocks and
/// flip between empty and not all the time: a short unordered array kept inline serves them
/// without allocating or shifting (the lowest address is a scan of at most [`FEW`] entries, a
/// removal swaps the last entry in), and a bin that outgrows it becomes an ordered map (back to
/// the array when it shrinks to half), so operations stay O(log n) however full a bin gets.
#[derive(Clone, Debug)]
enum Bin {
    Few { n: usize, items: [(Addr, u32); FEW] },
    Many(BTreeMap<Addr, u32>),
}

impl Default for Bin {
    fn default() -> Self {
        Self::Few {
            n: 0,
            items: [(0, 0); FEW],
        }
    }
}

impl Bin {
    fn len(&self) -> usize {
        match self {
            Self::Few { n, .. } => *n,
            Self::Many(m) => m.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn first(&self) -> Option<(Addr, u32)> {
        match self {
            Self::Few { n, items } => items.iter().take(*n).min_by_key(|(a, _)| *a).copied(),
            Self::Many(m) => m.first_key_value().map(|(&a, &h)| (a, h)),
        }
    }

    fn insert(&mut self, addr: Addr, handle: u32) {
        if let Self::Few { n, items } = self
            && let Some(slot) = items.iter_mut().take(*n).find(|(a, _)| *a == addr)
        {
            slot.1 = handle;
            return;
        }
        match self {
            Self::Few { n, items } if *n < FEW => {
                if let Some(slot) = items.get_mut(*n) {
                    *slot = (addr, handle);
                }
                *n += 1;
            }
            Self::Few { items, .. } => {
                let mut m: BTreeMap<Addr, u32> = items.iter().copied().collect();
                m.insert(addr, handle);
                *self = Self::Many(m);
            }
            Self::Many(m) => {
                m.insert(addr, handle);
            }
        }
    }

    fn remove(&mut self, addr: &Addr) -> Option<u32> {
        match self {
            Self::Few { n, items } => {
                let i = items.iter().take(*n).position(|&(a, _)| a == *addr)?;
                let handle = items.get(i)?.1;
                *n -= 1;
                items.swap(i, *n);
                Some(handle)
            }
            Self::Many(m) => {
                let handle = m.remove(addr);
                if m.len() <= FEW / 2 {
                    let mut items = [(0, 0); FEW];
                    for (slot, (&a, &h)) in items.iter_mut().zip(m.iter()) {
                        *slot = (a, h);
                    }
                    *self = Self::Few { n: m.len(), items };
                }
                handle
            }
        }
    }

    fn iter(&self) -> Box<dyn Iterator<Item = (Addr, u32)> + '_> {
        match self {
            Self::Few { n, items } => Box::new(items.iter().take(*n).copied()),
            Self::Many(m) => Box::new(m.iter().map(|(&a, &h)| (a, h))),
        }
    }

    fn values_mut(&mut self) -> Box<dyn Iterator<Item = &mut u32> + '_> {
        match self {
            Self::Few { n, items } => Box::new(items.iter_mut().take(*n).map(|(_, h)| h)),
            Self::Many(m) => Box::new(m.values_mut()),
        }
    }
}

/// Free blocks of at least [`SMALL_UNITS`] units, ordered by `(len, addr)`, except the most
/// recently inserted one, which waits in a one-entry slot outside the map (BFC's free index does
/// the same): programs free and take back the same large buffer over and over, and the slot
/// turns each such round into no map operation at all. Searches compare the map's candidate
/// with the slot's, so the choice is exactly the map's would be.
#[derive(Clone, Debug, Default)]
struct LargeSet {
    map: BTreeMap<(u64, Addr), u32>,
    slot: Option<((u64, Addr), u32)>,
    /// Largest length held (0 when empty), asked after every operation.
    max_len: u64,
}

impl LargeSet {
    fn len(&self) -> usize {
        self.map.len() + usize::from(self.slot.is_some())
    }

    fn insert(&mut self, key: (u64, Addr), handle: u32) {
        if let Some((k, h)) = self.slot.replace((key, handle)) {
            self.map.insert(k, h);
        }
        self.max_len = self.max_len.max(key.0);
    }

    fn remove(&mut self, key: (u64, Addr)) -> Option<u32> {
        let handle = match self.slot {
            Some((k, h)) if k == key => {
                self.slot = None;
                Some(h)
            }
            _ => self.map.remove(&key),
        };
        if handle.is_some() && key.0 == self.max_len {
            let in_map = self.map.last_key_value().map_or(0, |(&(l, _), _)| l);
            let in_slot = self.slot.map_or(0, |((l, _), _)| l);
            self.max_len = in_map.max(in_slot);
        }
        handle
    }

    /// The smallest `(len, addr)` with `len >= min_len`, and its handle.
    fn first_at_least(&self, min_len: u64) -> Option<((u64, Addr), u32)> {
        let in_map = self.map.range((min_len, 0)..).next().map(|(&k, &h)| (k, h));
        let in_slot = self.slot.filter(|((l, _), _)| *l >= min_len);
        match (in_map, in_slot) {
            (Some(m), Some(s)) => Some(if s.0 < m.0 { s } else { m }),
            (m, None) => m,
            (None, s) => s,
        }
    }

    fn iter(&self) -> impl Iterator<Item = ((u64, Addr), u32)> + '_ {
        self.map.iter().map(|(&k, &h)| (k, h)).chain(self.slot)
    }
}

/// Free blocks for best fit: one set per exact length (a [`Bin`]) for lengths under
/// [`SMALL_UNITS`] alignment units, found through a two-level bit map (non-empty bins, then
/// non-empty words), and one `(len, addr)`-ordered set for larger blocks. The smallest fitting
/// block is the lowest address of the first non-empty bin at or after the request's length, or
/// the first large block of at least that length: O(1) bit scans plus O(log n) set operations,
/// on sets that are usually tiny.
#[derive(Clone, Debug)]
pub struct SizeBins {
    unit_shift: u32,
    /// Address -> the heap's slot, per exact length.
    small: Vec<Bin>,
    words: [u64; WORDS],
    /// Bit w set when `words[w] != 0`.
    summary: u64,
    large: LargeSet,
    len: usize,
}

impl SizeBins {
    fn new(unit_bytes: u64) -> Self {
        Self {
            unit_shift: unit_bytes.trailing_zeros(),
            small: vec![Bin::default(); SMALL_UNITS],
            words: [0; WORDS],
            summary: 0,
            large: LargeSet::default(),
            len: 0,
        }
    }

    /// The exact bin of a block length, if it is small.
    fn bin(&self, len: u64) -> Option<usize> {
        usize::try_from(len >> self.unit_shift)
            .ok()
            .filter(|&u| u < SMALL_UNITS)
    }

    fn mark(&mut self, bin: usize, non_empty: bool) {
        let (w, bit) = (bin / 64, 1u64 << (bin % 64));
        if let Some(word) = self.words.get_mut(w) {
            if non_empty {
                *word |= bit;
            } else {
                *word &= !bit;
            }
            if *word == 0 {
                self.summary &= !(1 << w);
            } else {
                self.summary |= 1 << w;
            }
        }
    }

    /// Removes a block, returning its handle.
    fn take(&mut self, addr: Addr, len: u64) -> Option<u32> {
        let handle = match self.bin(len) {
            Some(b) => {
                let set = self.small.get_mut(b)?;
                let handle = set.remove(&addr);
                if set.is_empty() {
                    self.mark(b, false);
                }
                handle
            }
            None => self.large.remove((len, addr)),
        };
        if handle.is_some() {
            self.len -= 1;
        }
        handle
    }

    /// First non-empty bin at or after `from`.
    fn first_from(&self, from: usize) -> Option<usize> {
        let w = from / 64;
        let here = self.words.get(w)? & (!0u64 << (from % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let above = self.summary & (!0u64).checked_shl(w as u32 + 1).unwrap_or(0);
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros() as usize;
        Some(w * 64 + self.words.get(w)?.trailing_zeros() as usize)
    }
}

impl FreeIndex for SizeBins {
    fn insert(&mut self, addr: Addr, len: u64, handle: u32) {
        self.len += 1;
        match self.bin(len) {
            Some(b) => {
                if let Some(set) = self.small.get_mut(b) {
                    set.insert(addr, handle);
                    self.mark(b, true);
                }
            }
            None => self.large.insert((len, addr), handle),
        }
    }

    fn remove(&mut self, addr: Addr, len: u64, _handle: u32) {
        self.take(addr, len);
    }

    fn relocate(
        &mut self,
        _handle: u32,
        old_addr: Addr,
        old_len: u64,
        new_addr: Addr,
        new_len: u64,
    ) {
        if let Some(handle) = self.take(old_addr, old_len) {
            self.insert(new_addr, new_len, handle);
        }
    }

    fn find(&mut self, min_len: u64) -> Option<(Addr, u64, u32)> {
        let unit_mask = (1u64 << self.unit_shift) - 1;
        if let Some(from) = min_len
            .checked_add(unit_mask)
            .and_then(|l| self.bin(l & !unit_mask))
            && let Some(b) = self.first_from(from)
        {
            let (addr, handle) = self.small.get(b)?.first()?;
            return Some((addr, (b as u64) << self.unit_shift, handle));
        }
        self.large
            .first_at_least(min_len)
            .map(|((len, addr), handle)| (addr, len, handle))
    }

    fn largest(&self) -> u64 {
        if self.large.max_len > 0 {
            return self.large.max_len;
        }
        if self.summary == 0 {
            return 0;
        }
        let w = 63 - self.summary.leading_zeros() as usize;
        let bit = self
            .words
            .get(w)
            .map_or(0, |word| 63 - word.leading_zeros() as usize);
        ((w * 64 + bit) as u64) << self.unit_shift
    }

    fn entries(&self) -> Vec<(Addr, u64, u32)> {
        let mut out: Vec<(Addr, u64, u32)> = self
            .large
            .iter()
            .map(|((len, addr), h)| (addr, len, h))
            .collect();
        for (b, set) in self.small.iter().enumerate() {
            let len = (b as u64) << self.unit_shift;
            out.extend(set.iter().map(|(addr, h)| (addr, len, h)));
        }
        out.sort_unstable();
        out
    }

    fn remap_handles(&mut self, new_of: &[u32]) {
        let remap = |h: &mut u32| *h = new_of.get(*h as usize).copied().unwrap_or(u32::MAX);
        self.small
            .iter_mut()
            .flat_map(|set| set.values_mut())
            .for_each(remap);
        self.large.map.values_mut().for_each(remap);
        if let Some((_, h)) = &mut self.large.slot {
            remap(h);
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.large.max_len != self.large.iter().map(|((l, _), _)| l).max().unwrap_or(0) {
            return Err("cached largest length of the large set is stale".to_owned());
        }
        let mut count = self.large.len();
        for (b, set) in self.small.iter().enumerate() {
            let marked = self
                .words
                .get(b / 64)
                .is_some_and(|w| w & (1 << (b % 64)) != 0);
            if marked == set.is_empty() {
                return Err(format!("bit map wrong for bin {b}"));
            }
            count += set.len();
        }
        for (w, word) in self.words.iter().enumerate() {
            if (*word != 0) != (self.summary & (1 << w) != 0) {
                return Err(format!("summary wrong for word {w}"));
            }
        }
        if let Some(((len, addr), _)) = self.large.iter().min()
            && self.bin(len).is_some()
        {
            return Err(format!("small block {addr:#x}+{len} in the large set"));
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
    use std::collections::BTreeSet;

    #[test]
    fn a_bin_agrees_with_an_ordered_map_while_it_grows_and_shrinks() {
        let mut bin = Bin::default();
        let mut model = BTreeMap::new();
        let mut x: u64 = 9;
        for step in 0..20_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let addr = (x >> 40) % 64 * 16;
            // Phases of growth and shrinkage cross the inline capacity both ways.
            if (step / 500) % 2 == 0 && !x.is_multiple_of(3) {
                bin.insert(addr, addr as u32);
                model.insert(addr, addr as u32);
            } else {
                assert_eq!(bin.remove(&addr), model.remove(&addr));
            }
            assert_eq!(bin.len(), model.len());
            assert_eq!(bin.first(), model.first_key_value().map(|(&a, &h)| (a, h)));
        }
        let mut held: Vec<_> = bin.iter().collect();
        held.sort_unstable();
        assert!(held.into_iter().eq(model.iter().map(|(&a, &h)| (a, h))));
    }

    #[test]
    fn bins_pick_smallest_then_lowest_address() {
        let mut s = SizeBins::new(16);
        for (addr, len) in [(0, 64), (100, 32), (200, 32), (300, 128), (400, 1 << 20)] {
            s.insert(addr, len, addr as u32 + 1);
        }
        s.check().unwrap();
        assert_eq!(s.find(1), Some((100, 32, 101)));
        assert_eq!(s.find(33), Some((0, 64, 1)));
        assert_eq!(s.find(65), Some((300, 128, 301)));
        assert_eq!(s.find(129), Some((400, 1 << 20, 401)));
        assert_eq!(s.find((1 << 20) + 1), None);
        assert_eq!(s.largest(), 1 << 20);
        s.relocate(101, 100, 32, 116, 16);
        assert_eq!(s.find(1), Some((116, 16, 101)));
        s.remove(400, 1 << 20, 401);
        assert_eq!(s.largest(), 128);
        s.check().unwrap();
        assert_eq!(
            s.entries(),
            vec![(0, 64, 1), (116, 16, 101), (200, 32, 201), (300, 128, 301)]
        );
    }

    #[test]
    fn bins_agree_with_a_sorted_set() {
        let mut bins = SizeBins::new(16);
        let mut model = BTreeSet::new();
        let mut x: u64 = 3;
        for _ in 0..5000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let addr = (x >> 40) % 4096 * 16;
            // Lengths on both sides of the small/large boundary.
            let len = ((x >> 20) % 1500 + 1) * 16;
            let existing = model.iter().find(|&&(_, a)| a == addr).copied();
            if let Some((l, a)) = existing {
                model.remove(&(l, a));
                bins.remove(a, l, a as u32);
            } else {
                model.insert((len, addr));
                bins.insert(addr, len, addr as u32);
            }
            let want = (x >> 12) % 1600 * 16;
            let expected = model
                .range((want, 0)..)
                .next()
                .map(|&(l, a)| (a, l, a as u32));
            assert_eq!(bins.find(want), expected);
            assert_eq!(bins.largest(), model.last().map_or(0, |&(l, _)| l));
        }
        bins.check().unwrap();
    }
}
