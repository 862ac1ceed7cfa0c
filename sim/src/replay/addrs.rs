//! A finished replay's id → address table ([`AddrTable`]), in 4 bytes an allocation where the
//! addresses allow it.
//!
//! The replay fills a table of 8-byte addresses (the loop writes one an allocation); a replay
//! kept for seeking holds it for good, and with millions of allocations that was a tenth of the
//! explorer's memory. Policies place from address 0, so their addresses nearly always fit in
//! 32 bits: the finished table is narrowed then, and stays wide otherwise.

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

/// A finished replay's address table.
#[derive(Clone, Debug)]
pub(crate) enum AddrTable {
    /// Every address below `u32::MAX`; [`NARROW_FAILED`] for a failed allocation.
    Narrow(Vec<u32>),
    Wide(Vec<Addr>),
}

impl AddrTable {
    /// The table of a finished replay, narrowed when every address fits.
    pub(crate) fn finished(addrs: Vec<Addr>) -> Self {
        let fits = |a: &Addr| *a == FAILED || *a < Addr::from(NARROW_FAILED);
        if !addrs.iter().all(fits) {
            return Self::Wide(addrs);
        }
        Self::Narrow(
            addrs
                .iter()
                .map(|&a| u32::try_from(a).unwrap_or(NARROW_FAILED))
                .collect(),
        )
    }
}

impl AddrLookup for AddrTable {
    #[inline]
    fn addr_at(&self, slot: u32) -> Addr {
        match self {
            Self::Narrow(v) => match v.get(slot as usize) {
                Some(&a) if a != NARROW_FAILED => Addr::from(a),
                _ => FAILED,
            },
            Self::Wide(v) => v.addr_at(slot),
        }
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
}
