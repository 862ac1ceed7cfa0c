//! The layout index's columns: one vector per field of the allocations it keeps.

use std::collections::BTreeMap;

use crate::policy::{Addr, Block, BlockState};

/// Allocations, one column per field.
#[derive(Clone, Debug, Default)]
pub(super) struct Tier {
    pub(super) addr: Addrs,
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

/// A tier's addresses: 4 bytes each when every one fits in 32 bits (policies place from address
/// 0, so nearly always), else 8.
#[derive(Clone, Debug)]
pub(super) enum Addrs {
    Narrow(Vec<u32>),
    Wide(Vec<Addr>),
}

impl Default for Addrs {
    fn default() -> Self {
        Self::Narrow(Vec::new())
    }
}

impl Addrs {
    /// `addrs`, narrowed when every one fits.
    pub(super) fn of(addrs: impl Iterator<Item = Addr> + Clone) -> Self {
        if addrs.clone().all(|a| u32::try_from(a).is_ok()) {
            Self::Narrow(addrs.filter_map(|a| u32::try_from(a).ok()).collect())
        } else {
            Self::Wide(addrs.collect())
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Self::Narrow(v) => v.len(),
            Self::Wide(v) => v.len(),
        }
    }

    /// Address `i` (`i < len`).
    #[inline]
    pub(super) fn at(&self, i: usize) -> Addr {
        match self {
            Self::Narrow(v) => Addr::from(v[i]),
            Self::Wide(v) => v[i],
        }
    }

    /// The first index whose address is not below `addr`, in a tier sorted by address.
    pub(super) fn first_at_or_above(&self, addr: Addr) -> usize {
        match self {
            Self::Narrow(v) => v.partition_point(|&a| Addr::from(a) < addr),
            Self::Wide(v) => v.partition_point(|&a| a < addr),
        }
    }
}

/// Values in a group of [`U32s::Stepped`].
const STEP: usize = 64;

/// A column of `u32`s. An ascending one whose values grow by less than 65,536 over each group
/// of [`STEP`] is kept as each group's first value plus 16-bit offsets: a little over 2 bytes
/// a value. The short tier's births and ids are such (allocations in birth order, ids given
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

/// Marks a block whose lengths are kept in [`Lengths::wide`].
const WIDE: u32 = u32::MAX;

/// Each block's reserved and requested bytes in 6 bytes: the length as a `u32`, and what it
/// leaves over the request as a `u16` (a policy reserves at most a little more than asked:
/// rounding, a header, a remainder too small to split off). The rare block that does not fit
/// (4 GiB or more, or 64 KiB or more over its request) is kept aside by index. Millions of
/// allocations make the index's size, so it counts.
#[derive(Clone, Debug, Default)]
pub(super) struct Lengths {
    len: Vec<u32>,
    slack: Vec<u16>,
    wide: BTreeMap<usize, (u64, u64)>,
}

impl Lengths {
    pub(super) fn zeroed(n: usize) -> Self {
        Self {
            len: vec![0; n],
            slack: vec![0; n],
            wide: BTreeMap::new(),
        }
    }

    /// `order`'s entries of `from`, in that order.
    pub(super) fn gather(from: &Self, order: &[usize]) -> Self {
        let mut out = Self {
            len: Vec::with_capacity(order.len()),
            slack: Vec::with_capacity(order.len()),
            wide: BTreeMap::new(),
        };
        for &i in order {
            let (len_bytes, requested_bytes) = from.get(i);
            out.len.push(0);
            out.slack.push(0);
            out.set(out.len.len() - 1, len_bytes, requested_bytes);
        }
        out
    }

    pub(super) fn set(&mut self, i: usize, len_bytes: u64, requested_bytes: u64) {
        let narrow = u32::try_from(len_bytes).ok().filter(|&l| l != WIDE).zip(
            len_bytes
                .checked_sub(requested_bytes)
                .and_then(|s| u16::try_from(s).ok()),
        );
        let (Some(len), Some(slack)) = (self.len.get_mut(i), self.slack.get_mut(i)) else {
            return;
        };
        match narrow {
            Some((l, s)) => {
                (*len, *slack) = (l, s);
                self.wide.remove(&i);
            }
            None => {
                (*len, *slack) = (WIDE, 0);
                self.wide.insert(i, (len_bytes, requested_bytes));
            }
        }
    }

    /// Block `i`'s (reserved, requested) bytes.
    pub(super) fn get(&self, i: usize) -> (u64, u64) {
        match self.len.get(i).copied() {
            Some(WIDE) => self.wide.get(&i).copied().unwrap_or((0, 0)),
            Some(l) => {
                let slack = self.slack.get(i).copied().unwrap_or(0);
                (u64::from(l), u64::from(l).saturating_sub(u64::from(slack)))
            }
            None => (0, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lengths that fit in 32 bits are kept in 8 bytes; the others aside, by index, exactly.
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
    fn addresses_narrow_only_when_every_one_fits() {
        let small = [0, 7, Addr::from(u32::MAX)];
        let a = Addrs::of(small.iter().copied());
        assert!(matches!(a, Addrs::Narrow(_)));
        let big = [0, 7, Addr::from(u32::MAX) + 1];
        let b = Addrs::of(big.iter().copied());
        assert!(matches!(b, Addrs::Wide(_)));
        for (t, want) in [(&a, &small), (&b, &big)] {
            assert_eq!(t.len(), 3);
            assert_eq!((0..3).map(|i| t.at(i)).collect::<Vec<_>>(), want.to_vec());
            assert_eq!(t.first_at_or_above(7), 1);
            assert_eq!(t.first_at_or_above(8), 2);
            assert_eq!(t.first_at_or_above(Addr::MAX), 3);
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
        // Aside: lengths of 4 GiB or more, requests above their lengths, and slack of 64 KiB or
        // more (cases 2 and 8; case 9 is 65,535 over, which fits).
        assert_eq!(
            l.wide.keys().copied().collect::<Vec<_>>(),
            [2, 3, 4, 5, 6, 8, 10]
        );
        // Overwritten narrow, a wide entry goes.
        l.set(3, 7, 7);
        assert_eq!(l.get(3), (7, 7));
        assert_eq!(l.wide.len(), 6);
        let order = [7, 0, 4];
        let g = Lengths::gather(&l, &order);
        assert_eq!(
            (0..3).map(|i| g.get(i)).collect::<Vec<_>>(),
            order.iter().map(|&i| cases[i]).collect::<Vec<_>>()
        );
    }
}
