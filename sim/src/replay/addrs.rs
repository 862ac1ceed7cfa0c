//! A column of addresses kept in 4 bytes each where they allow it ([`AddrTable`]): a finished
//! replay's id → address table, and the layout index's addresses.
//!
//! The replay fills the table as it goes (the loop writes one address an allocation); a replay
//! kept for seeking holds it for good, and with millions of allocations 8-byte addresses were a
//! tenth of the explorer's memory, as the layout index's addresses were another. Policies place
//! from address 0, so their addresses nearly always fit in 32 bits: the table starts narrow and
//! widens, once, at the first address that does not fit. Half the bytes to fill, to touch
//! beside the policy's own, and no narrowing pass at the end.

use super::FAILED;
use crate::heap::Addr;

/// Where each allocation slot's allocation was placed; [`FAILED`] for none.
pub(crate) trait AddrLookup {
    fn addr_at(&self, slot: u32) -> Addr;
}

impl AddrLookup for [Addr] {
    #[inline(always)]
    fn addr_at(&self, slot: u32) -> Addr {
        self.get(slot as usize).copied().unwrap_or(FAILED)
    }
}

/// "Failed" in a narrow table.
const NARROW_FAILED: u32 = u32::MAX;

/// A column of addresses ([`FAILED`] for none).
#[derive(Clone, Debug)]
pub(crate) enum AddrTable {
    /// Every address below `u32::MAX`; [`NARROW_FAILED`] for none.
    Narrow(Vec<u32>),
    Wide(Vec<Addr>),
}

impl Default for AddrTable {
    fn default() -> Self {
        Self::Narrow(Vec::new())
    }
}

/// Whether `a` can be kept narrow.
fn fits(a: Addr) -> bool {
    a == FAILED || a < Addr::from(NARROW_FAILED)
}

fn narrowed(a: Addr) -> u32 {
    u32::try_from(a).unwrap_or(NARROW_FAILED)
}

impl AddrTable {
    /// A table of `n` slots, none placed.
    pub(crate) fn unplaced(n: usize) -> Self {
        Self::Narrow(vec![NARROW_FAILED; n])
    }

    /// Places slot `i` at `a` ([`FAILED`]: none); a slot past the end is ignored (and does
    /// not widen the table).
    #[inline(always)]
    pub(crate) fn set(&mut self, i: usize, a: Addr) {
        match self {
            Self::Narrow(v) if fits(a) => {
                if let Some(slot) = v.get_mut(i) {
                    *slot = narrowed(a);
                }
            }
            Self::Narrow(_) => self.widen_and_set(i, a),
            Self::Wide(v) => {
                if let Some(slot) = v.get_mut(i) {
                    *slot = a;
                }
            }
        }
    }

    #[cold]
    fn widen_and_set(&mut self, i: usize, a: Addr) {
        if i >= self.len() {
            return;
        }
        if let Self::Narrow(v) = self {
            let wide = v
                .iter()
                .map(|&x| {
                    if x == NARROW_FAILED {
                        FAILED
                    } else {
                        Addr::from(x)
                    }
                })
                .collect();
            *self = Self::Wide(wide);
        }
        self.set(i, a);
    }

    /// Grows the table to `n` slots (new ones unplaced); never shrinks it.
    pub(crate) fn grow_to(&mut self, n: usize) {
        match self {
            Self::Narrow(v) if v.len() < n => v.resize(n, NARROW_FAILED),
            Self::Wide(v) if v.len() < n => v.resize(n, FAILED),
            _ => {}
        }
    }

    /// `addrs`, narrowed when every one fits.
    pub(crate) fn of(addrs: impl Iterator<Item = Addr> + Clone) -> Self {
        if addrs.clone().all(fits) {
            Self::Narrow(addrs.map(narrowed).collect())
        } else {
            Self::Wide(addrs.collect())
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Narrow(v) => v.len(),
            Self::Wide(v) => v.len(),
        }
    }

    /// Address `i`; [`FAILED`] for none or past the end.
    #[inline]
    pub(crate) fn at(&self, i: usize) -> Addr {
        match self {
            Self::Narrow(v) => match v.get(i) {
                Some(&a) if a != NARROW_FAILED => Addr::from(a),
                _ => FAILED,
            },
            Self::Wide(v) => v.get(i).copied().unwrap_or(FAILED),
        }
    }

    /// The first index whose address is not below `addr`, in a column sorted by address
    /// (narrowing keeps the order: [`NARROW_FAILED`] stands for the largest address).
    pub(crate) fn first_at_or_above(&self, addr: Addr) -> usize {
        match self {
            Self::Narrow(v) => v.partition_point(|&a| Addr::from(a) < addr),
            Self::Wide(v) => v.partition_point(|&a| a < addr),
        }
    }
}

impl AddrLookup for AddrTable {
    #[inline]
    fn addr_at(&self, slot: u32) -> Addr {
        self.at(slot as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_when_every_address_fits_and_exact_either_way() {
        let small = vec![0, 16, FAILED, Addr::from(u32::MAX) - 1];
        let t = AddrTable::of(small.iter().copied());
        assert!(matches!(t, AddrTable::Narrow(_)));
        for (slot, &a) in (0u32..).zip(&small) {
            assert_eq!(t.addr_at(slot), a);
        }
        assert_eq!(t.addr_at(4), FAILED);

        // u32::MAX itself would read as "failed" narrowed: it keeps the table wide.
        let big = vec![0, Addr::from(u32::MAX), FAILED, 1 << 40];
        let t = AddrTable::of(big.iter().copied());
        assert!(matches!(t, AddrTable::Wide(_)));
        for (slot, &a) in (0u32..).zip(&big) {
            assert_eq!(t.addr_at(slot), a);
        }
        assert_eq!(t.addr_at(9), FAILED);
    }

    #[test]
    fn a_table_filled_in_place_widens_at_the_first_address_that_does_not_fit() {
        let mut t = AddrTable::unplaced(4);
        t.set(0, 16);
        t.set(1, Addr::from(u32::MAX) - 1);
        t.set(9, 32); // past the end: ignored
        assert!(matches!(t, AddrTable::Narrow(_)));
        assert_eq!(
            (0..5).map(|i| t.at(i)).collect::<Vec<_>>(),
            [16, Addr::from(u32::MAX) - 1, FAILED, FAILED, FAILED]
        );
        t.set(2, Addr::from(u32::MAX));
        assert!(matches!(t, AddrTable::Wide(_)));
        t.set(3, 1 << 40);
        t.set(0, FAILED);
        t.grow_to(6);
        t.set(5, 48);
        let want = [
            FAILED,
            Addr::from(u32::MAX) - 1,
            Addr::from(u32::MAX),
            1 << 40,
            FAILED,
            48,
        ];
        assert_eq!(t.len(), 6);
        assert_eq!((0..6).map(|i| t.at(i)).collect::<Vec<_>>(), want);
        let mut n = AddrTable::unplaced(1);
        n.grow_to(3);
        n.set(2, 7);
        assert_eq!(
            (0..3).map(|i| n.at(i)).collect::<Vec<_>>(),
            [FAILED, FAILED, 7]
        );
    }

    #[test]
    fn a_column_of_addresses_narrows_when_all_fit_and_searches_alike() {
        let small = [0, 7, Addr::from(u32::MAX) - 1];
        let a = AddrTable::of(small.iter().copied());
        assert!(matches!(a, AddrTable::Narrow(_)));
        let big = [0, 7, Addr::from(u32::MAX)];
        let b = AddrTable::of(big.iter().copied());
        assert!(matches!(b, AddrTable::Wide(_)));
        for (t, want) in [(&a, &small), (&b, &big)] {
            assert_eq!(t.len(), 3);
            assert_eq!((0..3).map(|i| t.at(i)).collect::<Vec<_>>(), want.to_vec());
            assert_eq!(t.first_at_or_above(7), 1);
            assert_eq!(t.first_at_or_above(8), 2);
            assert_eq!(t.first_at_or_above(Addr::MAX), 3);
            assert_eq!(t.at(3), FAILED);
        }
    }
}
