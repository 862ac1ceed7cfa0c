//! The recorded program's own memory over time: its resident set, sampled by the tracer's
//! clock thread about every 10 ms while it records (`record`), and the mappings it made
//! outside the allocator (`mmap`, `munmap`, `mremap`, the break), kept in a trace beside its
//! events. The figures come from the recording, not from any model.
//!
//! Mappings: in a spool, each call is a frame (`0x15 MAPPING`: tick u64, call u8, address u64,
//! length u64, new address u64, new length u64, flags u32, protection u32; see the tracer's
//! `mappings.rs`); in a trace, all are one frame (`0x0b MAPPINGS`, after the last EVENTS
//! frame): varint n, then per call its time as a zigzag varint of the difference from the
//! previous one's, the call u8, and the address, length, new address, new length, flags and
//! protection as varints.
//!
//! In a spool, each sample is a frame of its own (`0x14 MEMORY`: the clock's tick u64, the
//! resident bytes u64, the anonymous resident bytes u64, all little-endian), timed like the
//! events. In a trace, the samples are one frame (`0x0a MEMORY`, after the last EVENTS frame):
//! varint n, then per sample its time in nanoseconds as a zigzag varint of the difference from
//! the previous sample's (the first from 0), the resident bytes and the anonymous resident
//! bytes as varints.

use super::codec::{Cursor, put_varint, zigzag};

/// A trace's MEMORY frame.
pub(crate) const FRAME_MEMORY: u8 = 0x0a;
/// A spool's MEMORY frame (one sample).
pub(crate) const FRAME_MEMORY_SAMPLE: u8 = 0x14;

/// A trace's MAPPINGS frame.
pub(crate) const FRAME_MAPPINGS: u8 = 0x0b;
/// A spool's MAPPING frame (one call).
pub(crate) const FRAME_MAPPING: u8 = 0x15;

/// What a recorded mapping call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapCall {
    Mmap,
    Munmap,
    Mremap,
    /// The break moved (`brk`, `sbrk`): from `addr` to `len` (the new break).
    Break,
}

impl MapCall {
    fn code(self) -> u8 {
        match self {
            Self::Mmap => 1,
            Self::Munmap => 2,
            Self::Mremap => 3,
            Self::Break => 4,
        }
    }

    fn of(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::Mmap,
            2 => Self::Munmap,
            3 => Self::Mremap,
            4 => Self::Break,
            _ => return None,
        })
    }
}

/// One mapping call the program made outside the allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub t_ns: i64,
    pub call: MapCall,
    pub addr: u64,
    pub len: u64,
    /// `mremap`'s result (else 0).
    pub new_addr: u64,
    pub new_len: u64,
    /// `mmap`'s flags; bit 31 set for a mapping of a file.
    pub flags: u32,
    /// `mmap`'s protection (0: `PROT_NONE`, a reservation nothing can use yet).
    pub prot: u32,
}

/// Bit 31 of [`Mapping::flags`]: a mapping of a file.
pub const MAPPING_FILE_BACKED: u32 = 1 << 31;

/// One sample of the recorded process's memory (`/proc/self/statm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySample {
    /// On the events' time axis.
    pub t_ns: i64,
    /// The resident set: anonymous memory, and the pages of files and shared memory mapped.
    pub resident_bytes: u64,
    /// The anonymous part (the heap, the stacks, private mappings): what allocators hold.
    pub anon_bytes: u64,
}

/// A trace's MEMORY frame's payload.
#[must_use]
pub fn encode_frame(samples: &[MemorySample]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + samples.len() * 10);
    put_varint(&mut out, samples.len() as u64);
    let mut prev = 0i64;
    for s in samples {
        put_varint(&mut out, zigzag(s.t_ns.wrapping_sub(prev)));
        put_varint(&mut out, s.resident_bytes);
        put_varint(&mut out, s.anon_bytes);
        prev = s.t_ns;
    }
    out
}

/// Reads a trace's MEMORY frame; a count larger than the payload can hold (three bytes a
/// sample at least) is damage, refused before anything is allocated by it.
///
/// # Errors
/// A cut or damaged frame, in words.
pub(crate) fn decode_frame(payload: &[u8]) -> Result<Vec<MemorySample>, String> {
    let mut c = Cursor::new(payload);
    let n = c.varint().ok_or("a cut memory sample count")?;
    if n.saturating_mul(3) > payload.len() as u64 {
        return Err(format!(
            "{n} memory samples in a {}-byte frame",
            payload.len()
        ));
    }
    let mut out = Vec::with_capacity(n as usize);
    let mut t = 0i64;
    for _ in 0..n {
        let dt = c.zigzag().ok_or("a cut memory sample")?;
        let resident_bytes = c.varint().ok_or("a cut memory sample")?;
        let anon_bytes = c.varint().ok_or("a cut memory sample")?;
        t = t.wrapping_add(dt);
        out.push(MemorySample {
            t_ns: t,
            resident_bytes,
            anon_bytes,
        });
    }
    if !c.at_end() {
        return Err("bytes after the memory samples".into());
    }
    Ok(out)
}

/// Reads a spool's MEMORY frame: `(tick, resident bytes, anonymous bytes)`.
pub(crate) fn decode_spool_sample(payload: &[u8]) -> Option<(u64, u64, u64)> {
    let mut c = Cursor::new(payload);
    let sample = (c.u64()?, c.u64()?, c.u64()?);
    c.at_end().then_some(sample)
}

/// A trace's MAPPINGS frame's payload.
#[must_use]
pub fn encode_mappings(calls: &[Mapping]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + calls.len() * 24);
    put_varint(&mut out, calls.len() as u64);
    let mut prev = 0i64;
    for m in calls {
        put_varint(&mut out, zigzag(m.t_ns.wrapping_sub(prev)));
        out.push(m.call.code());
        for v in [
            m.addr,
            m.len,
            m.new_addr,
            m.new_len,
            u64::from(m.flags),
            u64::from(m.prot),
        ] {
            put_varint(&mut out, v);
        }
        prev = m.t_ns;
    }
    out
}

/// Reads a trace's MAPPINGS frame (a count past what the payload can hold, eight bytes a call
/// at least, is refused before anything is allocated by it).
///
/// # Errors
/// A cut or damaged frame, in words.
pub(crate) fn decode_mappings(payload: &[u8]) -> Result<Vec<Mapping>, String> {
    let mut c = Cursor::new(payload);
    let n = c.varint().ok_or("a cut mapping count")?;
    if n.saturating_mul(8) > payload.len() as u64 {
        return Err(format!(
            "{n} mapping calls in a {}-byte frame",
            payload.len()
        ));
    }
    let mut out = Vec::with_capacity(n as usize);
    let mut t = 0i64;
    for _ in 0..n {
        let dt = c.zigzag().ok_or("a cut mapping call")?;
        let call = c
            .u8()
            .and_then(MapCall::of)
            .ok_or("a mapping call of no known kind")?;
        let mut v = [0u64; 6];
        for x in &mut v {
            *x = c.varint().ok_or("a cut mapping call")?;
        }
        t = t.wrapping_add(dt);
        out.push(Mapping {
            t_ns: t,
            call,
            addr: v[0],
            len: v[1],
            new_addr: v[2],
            new_len: v[3],
            flags: u32::try_from(v[4]).map_err(|_| "mapping flags past 32 bits")?,
            prot: u32::try_from(v[5]).map_err(|_| "a mapping protection past 32 bits")?,
        });
    }
    if !c.at_end() {
        return Err("bytes after the mapping calls".into());
    }
    Ok(out)
}

/// Reads a spool's MAPPING frame: the tick, and the call with its time still 0.
pub(crate) fn decode_spool_mapping(payload: &[u8]) -> Option<(u64, Mapping)> {
    let mut c = Cursor::new(payload);
    let tick = c.u64()?;
    let call = MapCall::of(c.u8()?)?;
    let (addr, len, new_addr, new_len) = (c.u64()?, c.u64()?, c.u64()?, c.u64()?);
    let (flags, prot) = (c.u32()?, c.u32()?);
    c.at_end().then_some((
        tick,
        Mapping {
            t_ns: 0,
            call,
            addr,
            len,
            new_addr,
            new_len,
            flags,
            prot,
        },
    ))
}

/// The bytes the program had mapped outside the allocator after each call of `calls` (in
/// time order), in whole pages: mappings added by `mmap` and moved by `mremap`, taken away (in
/// part, as the kernel does) by `munmap` and `mremap`; and what its own moves of the break
/// added (the allocator's moves of it in between are not among the calls).
#[must_use]
pub fn mapped_bytes(calls: &[Mapping]) -> Vec<(i64, u64)> {
    use std::collections::BTreeMap;
    // start -> end of every range mapped, none overlapping.
    let mut ranges: BTreeMap<u64, u64> = BTreeMap::new();
    let mut total = 0u64;
    let mut break_bytes = 0i64;
    let mut out = Vec::with_capacity(calls.len());
    for m in calls {
        match m.call {
            MapCall::Mmap => {
                total -= unmap(&mut ranges, m.addr, m.len);
                total += map(&mut ranges, m.addr, m.len);
            }
            MapCall::Munmap => total -= unmap(&mut ranges, m.addr, m.len),
            MapCall::Mremap => {
                // A remap moves what was mapped: of a range not mapped here (another set's),
                // nothing.
                let moved = unmap(&mut ranges, m.addr, m.len);
                total -= moved;
                if moved > 0 {
                    total -= unmap(&mut ranges, m.new_addr, m.new_len);
                    total += map(&mut ranges, m.new_addr, m.new_len);
                }
            }
            MapCall::Break => {
                break_bytes = break_bytes.saturating_add(m.len as i64 - m.addr as i64);
            }
        }
        out.push((m.t_ns, total + break_bytes.max(0) as u64));
    }
    out
}

/// A length in whole pages, as the kernel maps and unmaps.
fn pages(len: u64) -> u64 {
    len.saturating_add(PAGE_BYTES - 1) & !(PAGE_BYTES - 1)
}

const PAGE_BYTES: u64 = 4096;

/// Adds `[addr, addr + len)` (free of other ranges: unmapped first); returns its length.
fn map(ranges: &mut std::collections::BTreeMap<u64, u64>, addr: u64, len: u64) -> u64 {
    let end = addr.saturating_add(pages(len));
    if end > addr {
        ranges.insert(addr, end);
    }
    end - addr
}

/// Takes `[addr, addr + len)` out of the ranges, cutting those it overlaps; returns the bytes
/// taken out.
fn unmap(ranges: &mut std::collections::BTreeMap<u64, u64>, addr: u64, len: u64) -> u64 {
    let end = addr.saturating_add(pages(len));
    if end <= addr {
        return 0;
    }
    let mut removed = 0;
    // The range starting before `addr` that reaches into it, then those starting inside.
    let first = ranges.range(..addr).next_back().map(|(&s, &e)| (s, e));
    let inside: Vec<(u64, u64)> = ranges.range(addr..end).map(|(&s, &e)| (s, e)).collect();
    for (s, e) in first.into_iter().filter(|&(_, e)| e > addr).chain(inside) {
        ranges.remove(&s);
        if s < addr {
            ranges.insert(s, addr);
        }
        if e > end {
            ranges.insert(end, e);
        }
        removed += e.min(end) - s.max(addr);
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_round_trip_and_a_lying_count_is_refused() {
        let samples = [
            MemorySample {
                t_ns: 5,
                resident_bytes: 4096,
                anon_bytes: 1024,
            },
            MemorySample {
                t_ns: 3,
                resident_bytes: 1 << 40,
                anon_bytes: 0,
            },
        ];
        let frame = encode_frame(&samples);
        assert_eq!(decode_frame(&frame).unwrap(), samples);
        let mut lying = Vec::new();
        put_varint(&mut lying, u64::MAX / 4);
        assert!(decode_frame(&lying).is_err());
        assert!(decode_frame(&frame[..frame.len() - 1]).is_err());
    }

    fn call(call: MapCall, addr: u64, len: u64, new: (u64, u64)) -> Mapping {
        Mapping {
            t_ns: 0,
            call,
            addr,
            len,
            new_addr: new.0,
            new_len: new.1,
            flags: 0,
            prot: 3,
        }
    }

    #[test]
    fn mapped_bytes_follow_partial_unmaps_remaps_and_the_break() {
        let calls = [
            call(MapCall::Mmap, 0x10000, 0x4000, (0, 0)),
            // A hole in the middle, then the start.
            call(MapCall::Munmap, 0x11000, 0x1000, (0, 0)),
            call(MapCall::Munmap, 0x10000, 0x1000, (0, 0)),
            // The last part grows elsewhere.
            call(MapCall::Mremap, 0x13000, 0x1000, (0x40000, 0x3000)),
            call(MapCall::Break, 0x800000, 0x821000, (0, 0)),
            call(MapCall::Break, 0x821000, 0x811000, (0, 0)),
            // Unmapping what was never mapped takes nothing away, nor maps a remap of it.
            call(MapCall::Munmap, 0x90000, 0x1000, (0, 0)),
            call(MapCall::Mremap, 0x90000, 0x1000, (0xa0000, 0x1000)),
        ];
        let bytes: Vec<u64> = mapped_bytes(&calls).into_iter().map(|(_, b)| b).collect();
        assert_eq!(
            bytes,
            [
                0x4000, 0x3000, 0x2000, 0x4000, 0x25000, 0x15000, 0x15000, 0x15000
            ]
        );
        let frame = encode_mappings(&calls);
        assert_eq!(decode_mappings(&frame).unwrap(), calls);
        assert!(decode_mappings(&frame[..frame.len() - 1]).is_err());
    }
}
