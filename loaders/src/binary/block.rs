//! An EVENTS block: its header, checked against what the format's writer produces, and its
//! bytes decompressed (bounded by that) and decoded into records.

use std::path::Path;

use super::codec::Cursor;
use super::{
    BLOCK_EVENTS, CODEC_STORED, CODEC_ZSTD, MAX_BLOCK_RAW_BYTES, OP_CALL_MASK, OP_FREE, OP_HEAP,
    OP_NO_CALL, OP_STACK, OP_THREAD,
};
use crate::error::LoadError;
use crate::events::{CALL_NAMES, Record};

/// Smallest encoding of an event: op byte, time delta, address delta.
const MIN_EVENT_BYTES: usize = 3;

pub(super) fn call_of(op: u8) -> Option<Option<u8>> {
    match op & OP_CALL_MASK {
        OP_NO_CALL => Some(None),
        c if usize::from(c) < CALL_NAMES.len() => Some(Some(c)),
        _ => None,
    }
}

/// Decodes EVENTS payloads, reusing its buffers from block to block.
pub(super) struct BlockDecoder {
    raw: Vec<u8>,
    decompressor: zstd::bulk::Decompressor<'static>,
}

impl BlockDecoder {
    pub(super) fn new(path: &Path) -> Result<Self, LoadError> {
        Ok(Self {
            raw: Vec::new(),
            decompressor: zstd::bulk::Decompressor::new().map_err(|e| LoadError::io(path, e))?,
        })
    }

    /// Decompresses and decodes an EVENTS payload into `out` (cleared first).
    pub(super) fn decode(
        &mut self,
        payload: &[u8],
        threads: &[u64],
        out: &mut Vec<Record>,
    ) -> Result<(), String> {
        self.decode_with(payload, threads, &[], out)
    }

    /// [`Self::decode`], with thread indices past `threads` referring to `more_threads`.
    pub(super) fn decode_with(
        &mut self,
        payload: &[u8],
        threads: &[u64],
        more_threads: &[u64],
        out: &mut Vec<Record>,
    ) -> Result<(), String> {
        let head = BlockHeader::read(payload)?;
        let (events, raw_bytes) = (head.events, head.raw_bytes);
        let data = payload.get(head.data_at..).unwrap_or(&[]);
        let block: &[u8] = match head.codec {
            CODEC_STORED => data,
            CODEC_ZSTD => {
                // The zstd frame says how much it holds: check before decompressing.
                match zstd::zstd_safe::get_frame_content_size(data) {
                    Ok(Some(n)) if n != raw_bytes as u64 => {
                        return Err(format!(
                            "the block says {raw_bytes} bytes, its zstd frame {n}"
                        ));
                    }
                    Ok(_) => {}
                    Err(_) => return Err("not a zstd frame".into()),
                }
                // The output is bounded by the header's size, itself bounded by what the
                // writer produces (`BlockHeader::read`): a frame that would decompress to more
                // (or says nothing of its size) fails here instead of growing the buffer.
                self.raw.clear();
                self.raw.reserve(raw_bytes);
                self.decompressor
                    .decompress_to_buffer(data, &mut self.raw)
                    .map_err(|e| format!("zstd: {e}"))?;
                &self.raw
            }
            other => return Err(format!("an unknown codec {other}")),
        };
        if block.len() != raw_bytes {
            return Err(format!(
                "the block says {raw_bytes} bytes and holds {}",
                block.len()
            ));
        }
        out.clear();
        decode_block(block, events, threads, more_threads, out)
    }
}

/// The header of an EVENTS payload: codec u8, varint events, varint decoded bytes, checked
/// against what the format's writer can produce ([`BLOCK_EVENTS`] events of at most
/// [`MAX_EVENT_BYTES`](super::MAX_EVENT_BYTES) bytes each), so nothing is reserved or decompressed by a larger claim.
pub(super) struct BlockHeader {
    pub(super) codec: u8,
    pub(super) events: u64,
    pub(super) raw_bytes: usize,
    /// Where the (compressed) bytes start in the payload.
    pub(super) data_at: usize,
}

impl BlockHeader {
    /// Bytes of the longest header: the codec and two varints of ten bytes at most.
    pub(super) const MAX_BYTES: usize = 21;

    pub(super) fn read(payload: &[u8]) -> Result<Self, String> {
        let mut c = Cursor::new(payload);
        let (Some(codec), Some(events), Some(raw_bytes)) = (c.u8(), c.varint(), c.varint()) else {
            return Err("a cut events block header".into());
        };
        if events > u64::from(BLOCK_EVENTS) {
            return Err(format!(
                "a block of {events} events (the format holds at most {BLOCK_EVENTS} in a block)"
            ));
        }
        let raw_bytes = usize::try_from(raw_bytes)
            .ok()
            .filter(|&n| n <= MAX_BLOCK_RAW_BYTES)
            .ok_or_else(|| {
                format!(
                    "a block of {raw_bytes} bytes decoded (a block of the format holds at most \
                     {MAX_BLOCK_RAW_BYTES})"
                )
            })?;
        if events > (raw_bytes / MIN_EVENT_BYTES) as u64 {
            return Err(format!("{events} events in a block of {raw_bytes} bytes"));
        }
        Ok(Self {
            codec,
            events,
            raw_bytes,
            data_at: c.pos,
        })
    }
}
/// Decodes `events` events of `block` into `out`; thread indices refer to `threads` and then
/// `more_threads`.
fn decode_block(
    block: &[u8],
    events: u64,
    threads: &[u64],
    more_threads: &[u64],
    out: &mut Vec<Record>,
) -> Result<(), String> {
    let mut c = Cursor::new(block);
    let mut t_ns: i64 = 0;
    let mut addr: u64 = 0;
    let mut thread: u64 = 0;
    // `events` is at most a third of the block's real (decompressed) bytes, and at most
    // `BLOCK_EVENTS` (`BlockHeader::read`).
    out.reserve(usize::try_from(events).unwrap_or(0));
    for i in 0..events {
        let bad = |what: &str| format!("event {i} of the block: {what}");
        let op = c.u8().ok_or_else(|| bad("cut"))?;
        let call = call_of(op).ok_or_else(|| bad("unknown call code"))?;
        if op & OP_THREAD != 0 {
            thread = c.varint().ok_or_else(|| bad("thread"))?;
        }
        let tid = *usize::try_from(thread)
            .ok()
            .and_then(|i| {
                threads
                    .get(i)
                    .or_else(|| more_threads.get(i.checked_sub(threads.len())?))
            })
            .ok_or_else(|| bad("thread index not introduced"))?;
        t_ns = t_ns.wrapping_add(c.zigzag().ok_or_else(|| bad("time"))?);
        let size_bytes = if op & OP_FREE != 0 {
            None
        } else {
            Some(c.varint().ok_or_else(|| bad("size"))?)
        };
        addr = addr.wrapping_add(c.zigzag().ok_or_else(|| bad("address"))? as u64);
        let stack = if op & OP_STACK != 0 {
            let id = c.varint().ok_or_else(|| bad("stack id"))?;
            Some(u32::try_from(id).map_err(|_| bad("stack id"))?)
        } else {
            None
        };
        let heap = if op & OP_HEAP != 0 {
            let id = c.varint().ok_or_else(|| bad("heap id"))?;
            u32::try_from(id)
                .ok()
                .filter(|&id| id != 0)
                .ok_or_else(|| bad("heap id"))?
        } else {
            0
        };
        out.push(Record {
            t_ns,
            tid,
            size_bytes,
            addr,
            call,
            stack,
            heap,
        });
    }
    if !c.at_end() {
        return Err("bytes after the block's last event".into());
    }
    Ok(())
}
