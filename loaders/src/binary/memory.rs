//! The recorded program's own memory over time: its resident set, sampled by the tracer's
//! clock thread about every 10 ms while it records (`record`), kept in a trace beside its
//! events. The figures come from the recording, not from any model.
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
}
