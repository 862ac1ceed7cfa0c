//! A column of addresses kept in 4 bytes each where they allow it ([`AddrTable`]): a finished
//! replay's id → address table, and the layout index's addresses.
//!
//! The replay fills a table of 8-byte addresses (the loop writes one an allocation); a replay
//! kept for seeking holds it for good, and with millions of allocations that was a tenth of the
//! explorer's memory, as the layout index's addresses were another. Policies place from
//! address 0, so their addresses nearly always fit in 32 bits: the column is narrowed then, and
//! stays wide otherwise.

use super::FAILED;
use crate::policy::Addr;

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
    /// The table of a finished replay, narrowed when every address fits.
    pub(crate) fn finished(addrs: Vec<Addr>) -> Self {
        if addrs.iter().all(|&a| fits(a)) {
            Self::Narrow(addrs.into_iter().map(narrowed).collect())
        } else {
            Self::Wide(addrs)
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
        let t = AddrTable::finished(small.clone());
        assert!(matches!(t, AddrTable::Narrow(_)));
        for (slot, &a) in (0u32..).zip(&small) {
            assert_eq!(t.addr_at(slot), a);
        }
        assert_eq!(t.addr_at(4), FAILED);

        // u32::MAX itself would read as "failed" narrowed: it keeps the table wide.
        let big = vec![0, Addr::from(u32::MAX), FAILED, 1 << 40];
        let t = AddrTable::finished(big.clone());
        assert!(matches!(t, AddrTable::Wide(_)));
        for (slot, &a) in (0u32..).zip(&big) {
            assert_eq!(t.addr_at(slot), a);
        }
        assert_eq!(t.addr_at(9), FAILED);
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
