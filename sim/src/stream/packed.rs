//! Resume points packed small: a whole-trace scan keeps thousands of them (one every few
//! hundred thousand events, so that any part of the trace opens from a point near it), and
//! each holds the allocations live there. Kept as they are ([`Before`]'s map), those cost about
//! a hundred bytes each; packed, as LEB128 varints in id order with each id and address given
//! as the difference from the one before, about a dozen ([`PackedBefore`]). The numbers
//! helpers ([`put`], [`get`]) also pack the loader's side of a point.

use super::window::{Before, Live, WindowSpec};

/// Appends `v` as a LEB128 varint (seven bits a byte, low first).
pub fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a varint [`put`] wrote from the front of `bytes`, moving past it; `None` when the
/// bytes end first or it runs past 64 bits.
pub fn get(bytes: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        // The tenth byte holds bit 63 only: anything more would be cut off by the shift.
        if shift == 63 && b > 1 {
            return None;
        }
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

/// The difference `b - a` of two 64-bit numbers, as a varint-friendly number (small either way).
#[must_use]
pub fn delta(a: u64, b: u64) -> u64 {
    let d = b.wrapping_sub(a) as i64;
    ((d << 1) ^ (d >> 63)) as u64
}

/// `a` plus a difference [`delta`] gave.
#[must_use]
pub fn undelta(a: u64, d: u64) -> u64 {
    let d = ((d >> 1) as i64) ^ -((d & 1) as i64);
    a.wrapping_add(d as u64)
}

/// A [`Before`] packed ([`Before::pack`]): the counts as they are, the live allocations as
/// varints.
#[derive(Clone, Debug)]
pub struct PackedBefore {
    at: usize,
    t_first_ns: Option<i64>,
    t_last_ns: Option<i64>,
    live_bytes: u64,
    live_count: usize,
    live: Box<[u8]>,
}

impl Before {
    /// This, packed small (see the module docs).
    #[must_use]
    pub fn pack(&self) -> PackedBefore {
        let mut out = Vec::with_capacity(self.live.len() * 12);
        let (mut prev_id, mut prev_addr) = (0u64, 0u64);
        for (&id, l) in &self.live {
            put(&mut out, u64::from(id) - prev_id);
            put(&mut out, l.size_bytes);
            put(&mut out, u64::from(l.thread));
            put(&mut out, u64::from(l.slot));
            put(&mut out, delta(prev_addr, l.addr));
            (prev_id, prev_addr) = (u64::from(id), l.addr);
        }
        PackedBefore {
            at: self.at,
            t_first_ns: self.t_first_ns,
            t_last_ns: self.t_last_ns,
            live_bytes: self.live_bytes,
            live_count: self.live.len(),
            live: out.into_boxed_slice(),
        }
    }
}

impl PackedBefore {
    /// The [`Before`] packed; `None` if the bytes do not hold what [`Before::pack`] wrote
    /// (never, for bytes it wrote).
    #[must_use]
    pub fn unpack(&self) -> Option<Before> {
        let mut bytes: &[u8] = &self.live;
        let mut live = std::collections::BTreeMap::new();
        let (mut id, mut addr) = (0u64, 0u64);
        for _ in 0..self.live_count {
            id = id.checked_add(get(&mut bytes)?)?;
            let size_bytes = get(&mut bytes)?;
            let thread = u16::try_from(get(&mut bytes)?).ok()?;
            let slot = u32::try_from(get(&mut bytes)?).ok()?;
            addr = undelta(addr, get(&mut bytes)?);
            let live_alloc = Live {
                size_bytes,
                thread,
                slot,
                addr,
            };
            live.insert(u32::try_from(id).ok()?, live_alloc);
        }
        bytes.is_empty().then_some(Before {
            at: self.at,
            t_first_ns: self.t_first_ns,
            t_last_ns: self.t_last_ns,
            live,
            live_bytes: self.live_bytes,
        })
    }

    /// Events read before the point.
    #[must_use]
    pub fn events(&self) -> usize {
        self.at
    }

    /// Allocations live at the point.
    #[must_use]
    pub fn live_allocations(&self) -> usize {
        self.live_count
    }

    /// Bytes this takes (the packed allocations and the counts).
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.live.len() + std::mem::size_of::<Self>()
    }

    /// [`Before::precedes`], without unpacking.
    #[must_use]
    pub fn precedes(&self, spec: &WindowSpec) -> bool {
        super::window::precedes(self.at, self.t_last_ns, spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::EventBatch;
    use crate::trace::EventKind;

    #[test]
    fn varints_and_deltas_round_trip_at_the_edges() {
        let values = [
            0,
            1,
            0x7f,
            0x80,
            0x3fff,
            0x4000,
            u64::from(u32::MAX),
            u64::MAX,
        ];
        let mut out = Vec::new();
        for v in values {
            put(&mut out, v);
        }
        let mut bytes: &[u8] = &out;
        for v in values {
            assert_eq!(get(&mut bytes), Some(v));
        }
        assert!(bytes.is_empty());
        assert_eq!(get(&mut bytes), None, "no bytes left");
        // Eleven continuation bytes run past 64 bits, and so does a tenth byte above 1.
        let mut long: &[u8] = &[0xff; 11];
        assert_eq!(get(&mut long), None);
        let mut wide = vec![0xff; 9];
        wide.push(0x02);
        assert_eq!(get(&mut wide.as_slice()), None);
        wide[9] = 0x01;
        assert_eq!(get(&mut wide.as_slice()), Some(u64::MAX));
        for (a, b) in [
            (0, u64::MAX),
            (u64::MAX, 0),
            (5, 3),
            (3, 5),
            (1 << 44, 1 << 47),
        ] {
            assert_eq!(undelta(a, delta(a, b)), b);
        }
        assert_eq!(delta(10, 9), 1, "a small step back stays small");
    }

    /// A live set with gaps in its ids, addresses going up and down, several threads and a
    /// freed allocation unpacks to the same map, counts and figures, and answers `precedes`
    /// as the unpacked one does.
    #[test]
    fn a_before_unpacks_to_what_was_packed() {
        let mut batch = EventBatch::default();
        let allocs = [
            (10, 100u64, 0u32, 0u16, 0x7f00_0000_1000u64),
            (20, 1 << 40, 1, 3, 0x1000),
            (30, 16, 2, 1, 0x7f00_0000_0fff),
            (40, 0, 3, 0, u64::MAX),
        ];
        for (id, (t, size, slot, thread, addr)) in allocs.into_iter().enumerate() {
            let id = u32::try_from(id * 7).unwrap();
            batch.push(t, EventKind::Alloc as u8, size, id, slot, thread, addr);
        }
        batch.push(50, EventKind::Free as u8, 1 << 40, 7, 1, 3, 0x1000);
        let mut before = Before::default();
        before.note_batch(&batch);
        let packed = before.pack();
        let back = packed.unpack().unwrap();
        assert_eq!(back.at, before.at);
        assert_eq!((back.t_first_ns, back.t_last_ns), (Some(10), Some(50)));
        assert_eq!(back.live_bytes, before.live_bytes);
        let flat = |b: &Before| -> Vec<(u32, u64, u16, u32, u64)> {
            b.live
                .iter()
                .map(|(&id, l)| (id, l.size_bytes, l.thread, l.slot, l.addr))
                .collect()
        };
        assert_eq!(flat(&back), flat(&before));
        assert_eq!(flat(&back).len(), 3);
        assert_eq!(packed.live_allocations(), 3);
        for first_event in 0..8 {
            let spec = WindowSpec {
                first_event,
                ..WindowSpec::default()
            };
            assert_eq!(packed.precedes(&spec), before.precedes(&spec));
        }
        // Damaged bytes are refused, not misread.
        let mut cut = packed.clone();
        cut.live = cut.live[..cut.live.len() - 1].into();
        assert!(cut.unpack().is_none());
    }
}
