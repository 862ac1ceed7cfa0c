//! Event columns the explorers read a value at a time, kept compact ([`Compact`]).
//!
//! The explorers show an event's address only in the event list, a screenful at a time, and
//! read its stack id for the one allocation under the pointer (the sites panel decodes them
//! all when opened), yet as columns they took 12 bytes an event: a quarter of their memory on
//! a 27-million-event trace. Kept instead as LEB128 varints in groups of [`GROUP_EVENTS`]
//! events, each group starting afresh so that one value is found by decoding at most one
//! group: an address as the difference from the event before (zigzag: a heap's addresses are
//! near one another, so most take two or three bytes), a stack id as itself plus one (a free's
//! "no stack", `u32::MAX`, takes one byte; a program's few thousand stacks two).

use allocview_loaders::binary::codec::{Cursor, put_varint, unzigzag, zigzag};

/// Events in a group: one value decodes at most this many varints.
pub const GROUP_EVENTS: usize = 128;

/// How a column's values become varints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Coding {
    /// Zigzag difference from the value before (addresses).
    #[default]
    Deltas,
    /// The value plus one, modulo 2^32 (ids whose null is `u32::MAX`).
    IdsPlusOne,
}

/// One column, varint-coded in groups.
#[derive(Debug, Default)]
pub struct Compact {
    coding: Coding,
    /// Where each group's bytes start in `bytes`.
    group_starts: Vec<u64>,
    bytes: Vec<u8>,
    len: usize,
}

impl Compact {
    /// Addresses (any `u64`s), in event order.
    #[must_use]
    pub fn addresses(values: impl IntoIterator<Item = u64>) -> Self {
        Self::encode(Coding::Deltas, values)
    }

    /// Ids (`u32`s, `u32::MAX` for none), in event order.
    #[must_use]
    pub fn ids(values: impl IntoIterator<Item = u32>) -> Self {
        Self::encode(Coding::IdsPlusOne, values.into_iter().map(u64::from))
    }

    fn encode(coding: Coding, values: impl IntoIterator<Item = u64>) -> Self {
        let mut out = Self {
            coding,
            ..Self::default()
        };
        let mut prev = 0u64;
        for (i, v) in values.into_iter().enumerate() {
            if i % GROUP_EVENTS == 0 {
                out.group_starts.push(out.bytes.len() as u64);
                prev = 0;
            }
            let coded = match coding {
                Coding::Deltas => zigzag(v.wrapping_sub(prev).cast_signed()),
                Coding::IdsPlusOne => v.wrapping_add(1) & u64::from(u32::MAX),
            };
            put_varint(&mut out.bytes, coded);
            prev = v;
            out.len = i + 1;
        }
        out.bytes.shrink_to_fit();
        out.group_starts.shrink_to_fit();
        out
    }

    /// Number of events.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no events.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of event `i`; `None` past the end.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<u64> {
        if i >= self.len {
            return None;
        }
        let start = usize::try_from(*self.group_starts.get(i / GROUP_EVENTS)?).ok()?;
        let mut cursor = Cursor::new(self.bytes.get(start..)?);
        let mut value = 0u64;
        for _ in 0..=i % GROUP_EVENTS {
            value = self.decoded(value, cursor.varint()?);
        }
        Some(value)
    }

    /// Calls `f` with every value, in event order, decoding as it goes.
    pub fn for_each(&self, mut f: impl FnMut(u64)) {
        let mut cursor = Cursor::new(&self.bytes);
        let mut value = 0u64;
        for i in 0..self.len {
            let Some(v) = cursor.varint() else {
                break;
            };
            if i % GROUP_EVENTS == 0 {
                value = 0;
            }
            value = self.decoded(value, v);
            f(value);
        }
    }

    /// The value coded as `v` after `prev`.
    fn decoded(&self, prev: u64, v: u64) -> u64 {
        match self.coding {
            Coding::Deltas => prev.wrapping_add(unzigzag(v).cast_unsigned()),
            Coding::IdsPlusOne => v.wrapping_sub(1) & u64::from(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(c: &Compact) -> Vec<u64> {
        let mut out = Vec::new();
        c.for_each(|v| out.push(v));
        out
    }

    #[test]
    fn every_address_comes_back_across_groups_and_extremes() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut addrs = vec![0, u64::MAX, 1, u64::MAX - 1, 0x7f00_0000_0000, 0];
        for i in 0..1000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly near neighbours, as in a heap, sometimes far.
            let near = 0x5555_0000_0000 + (x % 4096) * 16;
            addrs.push(if i % 17 == 0 { x } else { near });
        }
        let a = Compact::addresses(addrs.iter().copied());
        assert_eq!(a.len(), addrs.len());
        for (i, &want) in addrs.iter().enumerate() {
            assert_eq!(a.get(i), Some(want), "event {i}");
        }
        assert_eq!(a.get(addrs.len()), None);
        assert_eq!(all(&a), addrs);
        // Near neighbours take a few bytes, not eight.
        assert!(a.bytes.len() < addrs.len() * 4, "{} bytes", a.bytes.len());
    }

    #[test]
    fn ids_come_back_with_none_in_one_byte() {
        let ids: Vec<u32> = (0..300u32)
            .map(|i| if i % 2 == 0 { u32::MAX } else { i * 7 })
            .chain([0, u32::MAX - 1, u32::MAX])
            .collect();
        let c = Compact::ids(ids.iter().copied());
        for (i, &want) in ids.iter().enumerate() {
            assert_eq!(c.get(i), Some(u64::from(want)), "event {i}");
        }
        let want_all: Vec<u64> = ids.iter().map(|&v| u64::from(v)).collect();
        assert_eq!(all(&c), want_all);
        // 151 nones of one byte, 150 ids below 2,100 of at most two, and the three last.
        assert!(
            c.bytes.len() <= 151 + 2 * 150 + 1 + 5 + 1,
            "{} bytes",
            c.bytes.len()
        );
    }

    #[test]
    fn empty() {
        let a = Compact::addresses(std::iter::empty());
        assert!(a.is_empty());
        assert_eq!(a.get(0), None);
        assert!(all(&a).is_empty());
    }
}
