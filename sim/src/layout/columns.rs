//! The layout index's columns: one vector per field of the allocations it keeps.

use std::collections::BTreeMap;

use crate::policy::{Addr, Block, BlockState};

/// Allocations, one column per field.
#[derive(Clone, Debug, Default)]
pub(super) struct Tier {
    pub(super) addr: Vec<Addr>,
    pub(super) lengths: Lengths,
    pub(super) id: Vec<u32>,
    pub(super) birth: Vec<u32>,
    pub(super) death: Vec<u32>,
}

impl Tier {
    pub(super) fn block(&self, i: usize) -> Block {
        let (len_bytes, requested_bytes) = self.lengths.get(i);
        Block {
            addr: self.addr[i],
            len_bytes,
            state: BlockState::Used {
                id: self.id[i],
                requested_bytes,
            },
        }
    }
}

/// Marks a block whose lengths are kept in [`Lengths::wide`].
const WIDE: u32 = u32::MAX;

/// Each block's reserved and requested bytes in 8 bytes: the length as a `u32`, and what it
/// leaves over the request as another (a policy reserves at most a little more than asked).
/// The rare block that does not fit (4 GiB or more, or more than that over its request) is
/// kept aside by index. Millions of allocations make the index's size, so it counts.
#[derive(Clone, Debug, Default)]
pub(super) struct Lengths {
    len: Vec<u32>,
    slack: Vec<u32>,
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
                .and_then(|s| u32::try_from(s).ok()),
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
    fn lengths_keep_narrow_and_wide_values_exactly() {
        let cases = [
            (256, 200),
            (0, 0),
            (u64::from(u32::MAX) - 1, 0),
            (u64::from(u32::MAX), 5),
            (1 << 40, (1 << 40) - 3),
            (1 << 40, 1),
            (10, 20),
            (u64::MAX, u64::MAX),
        ];
        let mut l = Lengths::zeroed(cases.len());
        for (i, &(len, req)) in cases.iter().enumerate() {
            l.set(i, len, req);
        }
        for (i, &c) in cases.iter().enumerate() {
            assert_eq!(l.get(i), c, "case {i}");
        }
        assert_eq!(l.wide.len(), 5, "{:?}", l.wide);
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
    }
}
