//! The layout index's columns: one vector per field of the allocations it keeps.

use std::collections::BTreeMap;

use crate::heap::{Addr, Block, BlockState};
use crate::replay::AddrTable;

/// Allocations, one column per field.
#[derive(Clone, Debug, Default)]
pub(super) struct Tier {
    /// Addresses, in 32 bits when they all fit.
    pub(super) addr: AddrTable,
    pub(super) lengths: Lengths,
    pub(super) id: U32s,
    /// Birth positions (kept plain in the long tier, whose lookups read them as a slice).
    pub(super) birth: U32s,
    /// Death positions; empty when the tier keeps lives instead.
    pub(super) death: Vec<u32>,
    /// Death minus birth, for a tier of short lives (at most `SHORT_LIFE_MAX`): half the bytes
    /// of a death position.
    pub(super) life: Vec<u16>,
}

impl Tier {
    /// The tier of allocations `order`, in that order. When `short` (in birth order, every one
    /// living at most `SHORT_LIFE_MAX` events) it keeps lives instead of deaths, and its
    /// births and ids stepped ([`U32s`]); the long tier keeps its births plain, for the slices
    /// its lookups read.
    pub(super) fn gather(
        order: &[usize],
        short: bool,
        addr: &[Addr],
        lengths: &Lengths,
        birth: &[u32],
        death: &[u32],
    ) -> Self {
        let column = |values: Vec<u32>| -> U32s {
            if short {
                U32s::compact(values)
            } else {
                U32s::Plain(values)
            }
        };
        let (deaths, life) = if short {
            let life = order.iter().map(|&i| {
                let life = death[i].saturating_sub(birth[i]);
                u16::try_from(life).unwrap_or(u16::MAX)
            });
            (Vec::new(), life.collect())
        } else {
            (order.iter().map(|&i| death[i]).collect(), Vec::new())
        };
        Self {
            addr: AddrTable::of(order.iter().map(|&i| addr[i])),
            lengths: Lengths::gather(lengths, order),
            id: column(
                order
                    .iter()
                    .map(|&i| u32::try_from(i).unwrap_or(u32::MAX))
                    .collect(),
            ),
            birth: column(order.iter().map(|&i| birth[i]).collect()),
            death: deaths,
            life,
        }
    }

    /// Allocation `i`'s death position.
    pub(super) fn death_at(&self, i: usize) -> u32 {
        match (self.life.get(i), self.birth.get(i)) {
            (Some(&life), Some(birth)) => birth.saturating_add(u32::from(life)),
            _ => self.death.get(i).copied().unwrap_or(0),
        }
    }

    pub(super) fn block(&self, i: usize) -> Block {
        let (len_bytes, requested_bytes) = self.lengths.get(i);
        Block {
            addr: self.addr.at(i),
            len_bytes,
            state: BlockState::Used {
                id: self.id.at(i),
                requested_bytes,
            },
        }
    }
}

/// Values in a group of [`U32s::Stepped`].
const STEP: usize = 64;

/// A column of `u32`s. One ascending within each group of [`STEP`] values and growing by less
/// than 65,536 over it is kept as each group's first value plus 16-bit offsets: a little over
/// 2 bytes a value ([`Self::partition_point`] further needs the whole column sorted, as births
/// are). The short tier's births and ids are such (allocations in birth order, ids given
/// in allocation order), and they are most of the index.
#[derive(Clone, Debug)]
pub(super) enum U32s {
    Plain(Vec<u32>),
    Stepped { base: Vec<u32>, offset: Vec<u16> },
}

impl Default for U32s {
    fn default() -> Self {
        Self::Plain(Vec::new())
    }
}

impl U32s {
    /// `values`, stepped when they allow it.
    pub(super) fn compact(values: Vec<u32>) -> Self {
        let mut base = Vec::with_capacity(values.len().div_ceil(STEP));
        let mut offset = Vec::with_capacity(values.len());
        for group in values.chunks(STEP) {
            let first = group.first().copied().unwrap_or(0);
            base.push(first);
            let mut prev = first;
            for &v in group {
                match u16::try_from(v.wrapping_sub(first)) {
                    Ok(o) if v >= prev => offset.push(o),
                    _ => return Self::Plain(values),
                }
                prev = v;
            }
        }
        Self::Stepped { base, offset }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Self::Plain(v) => v.len(),
            Self::Stepped { offset, .. } => offset.len(),
        }
    }

    /// Value `i` (`i < len`).
    #[inline]
    pub(super) fn at(&self, i: usize) -> u32 {
        match self {
            Self::Plain(v) => v[i],
            Self::Stepped { base, offset } => base[i / STEP] + u32::from(offset[i]),
        }
    }

    /// Value `i`, `None` past the end.
    pub(super) fn get(&self, i: usize) -> Option<u32> {
        (i < self.len()).then(|| self.at(i))
    }

    /// The plain values; `None` when stepped.
    pub(super) fn as_slice(&self) -> Option<&[u32]> {
        match self {
            Self::Plain(v) => Some(v),
            Self::Stepped { .. } => None,
        }
    }

    /// The index of the first value for which `pred` is false, `pred` being true for a prefix
    /// of the values (as [`slice::partition_point`]).
    pub(super) fn partition_point(&self, pred: impl Fn(u32) -> bool) -> usize {
        match self {
            Self::Plain(v) => v.partition_point(|&x| pred(x)),
            Self::Stepped { base, offset } => {
                // The groups whose first value passes; the answer lies in the last of them.
                let groups = base.partition_point(|&b| pred(b));
                let Some(g) = groups.checked_sub(1) else {
                    return 0;
                };
                let (b, from) = (base[g], g * STEP);
                let to = (from + STEP).min(offset.len());
                from + offset[from..to].partition_point(|&o| pred(b + u32::from(o)))
            }
        }
    }
}

/// Each block's reserved and requested bytes in 4 to 8 bytes: the length in units of `2^shift`
/// bytes (the largest power of two that divides every length: 256 for BFC's rounded chunks),
/// and what it leaves over the request (rounding, a header, a remainder too small to split
/// off), each as a `u16` when nearly all fit, else as a `u32`. A block that does not fit is
/// kept aside by index. Millions of allocations make the index's size, so it counts; a
/// recorder's lengths, filled during the replay, are 32-bit.
#[derive(Clone, Debug, Default)]
pub(super) struct Lengths {
    len: Units,
    shift: u32,
    slack: Units,
    wide: BTreeMap<usize, (u64, u64)>,
}

/// A column of lengths in units, or of slack; the type's largest value marks a block kept
/// aside.
#[derive(Clone, Debug)]
enum Units {
    U16(Vec<u16>),
    U32(Vec<u32>),
}

impl Default for Units {
    fn default() -> Self {
        Self::U32(Vec::new())
    }
}

impl Units {
    fn len(&self) -> usize {
        match self {
            Self::U16(v) => v.len(),
            Self::U32(v) => v.len(),
        }
    }

    /// The largest value kept in the column (the next one marks "aside").
    fn max_kept(&self) -> u64 {
        match self {
            Self::U16(_) => u64::from(u16::MAX - 1),
            Self::U32(_) => u64::from(u32::MAX - 1),
        }
    }

    /// Value `i`; `None` for a block kept aside or past the end.
    fn get(&self, i: usize) -> Option<u64> {
        match self {
            Self::U16(v) => v.get(i).filter(|&&u| u != u16::MAX).map(|&u| u64::from(u)),
            Self::U32(v) => v.get(i).filter(|&&u| u != u32::MAX).map(|&u| u64::from(u)),
        }
    }

    /// Stores `value` (`None`: aside) at `i`, when `i` is in the column.
    fn set(&mut self, i: usize, units: Option<u64>) {
        match self {
            Self::U16(v) => {
                if let Some(u) = v.get_mut(i) {
                    *u = units
                        .and_then(|n| u16::try_from(n).ok())
                        .unwrap_or(u16::MAX);
                }
            }
            Self::U32(v) => {
                if let Some(u) = v.get_mut(i) {
                    *u = units
                        .and_then(|n| u32::try_from(n).ok())
                        .unwrap_or(u32::MAX);
                }
            }
        }
    }
}

/// Blocks kept aside, at most, for every one kept in 16 bits: each costs tens of bytes in the
/// map, where narrowing saves two.
const ASIDE_PER_NARROW: usize = 256;

impl Lengths {
    pub(super) fn zeroed(n: usize) -> Self {
        Self {
            len: Units::U32(vec![0; n]),
            shift: 0,
            slack: Units::U32(vec![0; n]),
            wide: BTreeMap::new(),
        }
    }

    /// `order`'s entries of `from`, in that order, in the narrowest form that holds them.
    pub(super) fn gather(from: &Self, order: &[usize]) -> Self {
        let values: Vec<(u64, u64)> = order.iter().map(|&i| from.get(i)).collect();
        let shift = values
            .iter()
            .filter(|&&(len, _)| len > 0)
            .map(|&(len, _)| len.trailing_zeros())
            .min()
            .unwrap_or(0)
            .min(31);
        let n = values.len();
        // A column in 16 bits unless that would keep too many blocks aside.
        let width = |over: usize| {
            if over <= n / ASIDE_PER_NARROW {
                Units::U16(vec![0; n])
            } else {
                Units::U32(vec![0; n])
            }
        };
        let narrow_max = u64::from(u16::MAX - 1);
        let long = values.iter().filter(|&&(l, _)| l >> shift > narrow_max);
        let slack = |&&(l, r): &&(u64, u64)| l.checked_sub(r).is_none_or(|s| s > narrow_max);
        let mut out = Self {
            len: width(long.count()),
            shift,
            slack: width(values.iter().filter(slack).count()),
            wide: BTreeMap::new(),
        };
        for (i, &(len_bytes, requested_bytes)) in values.iter().enumerate() {
            out.set(i, len_bytes, requested_bytes);
        }
        out
    }

    pub(super) fn set(&mut self, i: usize, len_bytes: u64, requested_bytes: u64) {
        if i >= self.len.len() {
            return;
        }
        let units = Some(len_bytes >> self.shift)
            .filter(|&u| u << self.shift == len_bytes && u <= self.len.max_kept());
        let slack = len_bytes
            .checked_sub(requested_bytes)
            .filter(|&s| s <= self.slack.max_kept());
        match units.zip(slack) {
            Some((u, s)) => {
                self.len.set(i, Some(u));
                self.slack.set(i, Some(s));
                self.wide.remove(&i);
            }
            None => {
                self.len.set(i, None);
                self.slack.set(i, None);
                self.wide.insert(i, (len_bytes, requested_bytes));
            }
        }
    }

    /// Block `i`'s (reserved, requested) bytes.
    pub(super) fn get(&self, i: usize) -> (u64, u64) {
        match self.len.get(i) {
            Some(units) => {
                let len = units << self.shift;
                let slack = self.slack.get(i).unwrap_or(0);
                (len, len.saturating_sub(slack))
            }
            None => self.wide.get(&i).copied().unwrap_or((0, 0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u32s_step_ascending_values_and_search_them_exactly() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut v = 7u32;
        let ascending: Vec<u32> = (0..1000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly small steps, some repeated values, a few of up to 1,000.
                v += [0, 1, 3, (x % 1000) as u32][(x % 4) as usize];
                v
            })
            .collect();
        let stepped = U32s::compact(ascending.clone());
        assert!(matches!(stepped, U32s::Stepped { .. }));
        // A group that grows by 65,536 or more, or a value that falls, keeps the column plain.
        let mut jump = ascending.clone();
        jump[130] += 70_000;
        jump.iter_mut().skip(131).for_each(|x| *x += 70_000);
        let mut fall = ascending.clone();
        fall[500] = 0;
        for (values, stepped_expected) in [(ascending, true), (jump, false), (fall, false)] {
            let c = U32s::compact(values.clone());
            assert_eq!(matches!(c, U32s::Stepped { .. }), stepped_expected);
            assert_eq!(c.len(), values.len());
            assert!((0..values.len()).all(|i| c.get(i) == Some(values[i])));
            assert_eq!(c.get(values.len()), None);
            if stepped_expected {
                for probe in [
                    0,
                    7,
                    8,
                    100,
                    values[64],
                    values[64] + 1,
                    values[999],
                    u32::MAX,
                ] {
                    let want = values.partition_point(|&x| x <= probe);
                    assert_eq!(c.partition_point(|x| x <= probe), want, "probe {probe}");
                }
            }
        }
    }

    #[test]
    fn lengths_keep_narrow_and_wide_values_exactly() {
        let cases = [
            (256, 200),
            (0, 0),
            (u64::from(u32::MAX) - 1, 0),
            (u64::from(u32::MAX), 5),
            (1 << 40, (1 << 40) - 3),
            (1 << 40, 1),
            (10, 20),
            (70_000, 65_535),
            (70_000, 4_464),
            (70_000, 4_465),
            (u64::MAX, u64::MAX),
        ];
        let mut l = Lengths::zeroed(cases.len());
        for (i, &(len, req)) in cases.iter().enumerate() {
            l.set(i, len, req);
        }
        for (i, &c) in cases.iter().enumerate() {
            assert_eq!(l.get(i), c, "case {i}");
        }
        // Aside: lengths of 4 GiB - 1 or more, slack of as much, and requests above their
        // lengths.
        assert_eq!(l.wide.keys().copied().collect::<Vec<_>>(), [3, 4, 5, 6, 10]);
        // Overwritten narrow, a wide entry goes.
        l.set(3, 7, 7);
        assert_eq!(l.get(3), (7, 7));
        assert_eq!(l.wide.len(), 4);
        let order = [7, 0, 4];
        let g = Lengths::gather(&l, &order);
        assert_eq!(
            (0..3).map(|i| g.get(i)).collect::<Vec<_>>(),
            order.iter().map(|&i| cases[i]).collect::<Vec<_>>()
        );
        let all: Vec<usize> = (0..cases.len()).collect();
        let g = Lengths::gather(&l, &all);
        assert!(all.iter().all(|&i| g.get(i) == l.get(i)));
    }

    #[test]
    fn gathered_lengths_narrow_to_units_of_their_common_power_of_two() {
        // Multiples of 4 KiB up to 4 MiB fit 16-bit units of 4 KiB; one of 1 GiB among 1,000
        // is kept aside.
        let mut cases: Vec<(u64, u64)> = (1..=999u64)
            .map(|k| (k * 4096, k * 4096 - k % 200))
            .collect();
        cases.push((1 << 30, (1 << 30) - 100));
        let all: Vec<usize> = (0..cases.len()).collect();
        let mut l = Lengths::zeroed(cases.len());
        for (i, &(len, req)) in cases.iter().enumerate() {
            l.set(i, len, req);
        }
        let g = Lengths::gather(&l, &all);
        assert!(matches!(g.len, Units::U16(_)));
        assert!(matches!(g.slack, Units::U16(_)));
        assert_eq!(g.shift, 12);
        assert_eq!(g.wide.keys().copied().collect::<Vec<_>>(), [999]);
        assert!(all.iter().all(|&i| g.get(i) == cases[i]));

        // One odd length: units of one byte, and most lengths then need 32 bits.
        cases[0] = (4095, 4000);
        let mut l = Lengths::zeroed(cases.len());
        for (i, &(len, req)) in cases.iter().enumerate() {
            l.set(i, len, req);
        }
        let g = Lengths::gather(&l, &all);
        assert!(matches!(g.len, Units::U32(_)));
        assert_eq!(g.shift, 0);
        assert!(g.wide.is_empty());
        assert!(all.iter().all(|&i| g.get(i) == cases[i]));

        // BFC's whole chunks for big tensors: slack of megabytes on most blocks keeps the
        // slack 32-bit rather than sending them aside.
        let big: Vec<(u64, u64)> = (1..=100u64)
            .map(|k| (k << 22, (k << 22) - (k << 20)))
            .collect();
        let mut l = Lengths::zeroed(big.len());
        for (i, &(len, req)) in big.iter().enumerate() {
            l.set(i, len, req);
        }
        let all: Vec<usize> = (0..big.len()).collect();
        let g = Lengths::gather(&l, &all);
        assert!(matches!(g.slack, Units::U32(_)));
        assert!(matches!(g.len, Units::U16(_)));
        assert!(g.wide.is_empty());
        assert!(all.iter().all(|&i| g.get(i) == big[i]));
    }
}
