//! The event table's `address` column, kept compact ([`Addresses`]).
//!
//! The explorers show an event's address only in the event list, a screenful at a time, yet as
//! a column it took 8 bytes an event: a seventh of their memory on a 27-million-event trace.
//! Kept instead as the difference from the event before (zigzag, then LEB128: a heap's
//! addresses are near one another, so most take two or three bytes), in groups of
//! [`GROUP_EVENTS`] events, each starting afresh, so that one address is found by decoding at
//! most one group.

/// Events in a group: one address decodes at most this many differences.
pub const GROUP_EVENTS: usize = 128;

/// Every event's address, delta-coded in groups.
#[derive(Debug, Default)]
pub struct Addresses {
    /// Where each group's bytes start in `bytes`.
    group_starts: Vec<u64>,
    bytes: Vec<u8>,
    len: usize,
}

impl Addresses {
    /// Encodes `addresses`, in event order.
    #[must_use]
    pub fn encode(addresses: impl IntoIterator<Item = u64>) -> Self {
        let mut out = Self::default();
        let mut prev = 0u64;
        for (i, a) in addresses.into_iter().enumerate() {
            if i % GROUP_EVENTS == 0 {
                out.group_starts.push(out.bytes.len() as u64);
                prev = 0;
            }
            push_varint(&mut out.bytes, zigzag(a.wrapping_sub(prev)));
            prev = a;
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

    /// The address of event `i`; `None` past the end.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<u64> {
        if i >= self.len {
            return None;
        }
        let start = usize::try_from(*self.group_starts.get(i / GROUP_EVENTS)?).ok()?;
        let mut bytes = self.bytes.get(start..)?;
        let mut addr = 0u64;
        for _ in 0..=i % GROUP_EVENTS {
            let (v, rest) = read_varint(bytes)?;
            addr = addr.wrapping_add(unzigzag(v));
            bytes = rest;
        }
        Some(addr)
    }
}

fn zigzag(d: u64) -> u64 {
    // The difference as a signed number, small in magnitude either way.
    let s = d.cast_signed();
    ((s << 1) ^ (s >> 63)).cast_unsigned()
}

fn unzigzag(z: u64) -> u64 {
    (z >> 1) ^ (z & 1).wrapping_neg()
}

fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The varint at the start of `bytes` and what follows it; `None` when cut short.
fn read_varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (k, &b) in bytes.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * k);
        if b < 0x80 {
            return Some((v, bytes.get(k + 1..)?));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let a = Addresses::encode(addrs.iter().copied());
        assert_eq!(a.len(), addrs.len());
        for (i, &want) in addrs.iter().enumerate() {
            assert_eq!(a.get(i), Some(want), "event {i}");
        }
        assert_eq!(a.get(addrs.len()), None);
        // Near neighbours take a few bytes, not eight.
        assert!(a.bytes.len() < addrs.len() * 4, "{} bytes", a.bytes.len());
    }

    #[test]
    fn empty() {
        let a = Addresses::encode(std::iter::empty());
        assert!(a.is_empty());
        assert_eq!(a.get(0), None);
    }
}
