//! Reading a trace (kind 0): its frames in order, and the decoding of its event blocks.

use std::path::Path;

use super::codec::Cursor;
use super::frames::{Frames, Next, parse_meta};
use super::{
    BinaryInfo, CODEC_STORED, CODEC_ZSTD, FRAME_END, FRAME_EVENTS, FRAME_META, FRAME_THREADS,
    FileKind, MAX_FRAME_BYTES, OP_CALL_MASK, OP_FREE, OP_NO_CALL, OP_THREAD, corrupt,
};
use crate::error::LoadError;
use crate::malloc_trace::{CALL_NAMES, Record};

pub(super) fn call_of(op: u8) -> Option<Option<u8>> {
    match op & OP_CALL_MASK {
        OP_NO_CALL => Some(None),
        c if usize::from(c) < CALL_NAMES.len() => Some(Some(c)),
        _ => None,
    }
}

pub(super) fn read_trace(
    path: &Path,
    mut frames: Frames<'_>,
    f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
) -> Result<BinaryInfo, LoadError> {
    let mut info = BinaryInfo {
        kind: FileKind::Trace,
        meta: Vec::new(),
        records: 0,
        truncated: None,
    };
    let mut threads: Vec<u64> = Vec::new();
    let mut raw: Vec<u8> = Vec::new();
    let mut decompressor = zstd::bulk::Decompressor::new().map_err(|e| LoadError::io(path, e))?;
    let mut ended = false;
    loop {
        let (tag, payload, at) = match frames.next() {
            Next::Frame(tag, payload, at) => (tag, payload, (at + 10) as u64),
            Next::End => break,
            Next::Cut(why) => {
                info.truncated = Some(why);
                break;
            }
        };
        let mut c = Cursor::new(payload);
        match tag {
            FRAME_META => info.meta.extend(parse_meta(payload)),
            FRAME_THREADS => {
                let n = c
                    .varint()
                    .ok_or_else(|| corrupt(path, at, "thread count"))?;
                for _ in 0..n {
                    threads.push(c.varint().ok_or_else(|| corrupt(path, at, "thread id"))?);
                }
            }
            FRAME_EVENTS => {
                let (Some(codec), Some(events), Some(raw_bytes)) = (c.u8(), c.varint(), c.varint())
                else {
                    return Err(corrupt(path, at, "events block header"));
                };
                let data = c.take(payload.len() - c.pos).unwrap_or(&[]);
                let raw_bytes = usize::try_from(raw_bytes)
                    .ok()
                    .filter(|&n| n <= MAX_FRAME_BYTES)
                    .ok_or_else(|| corrupt(path, at, "events block size"))?;
                let block: &[u8] = match codec {
                    CODEC_STORED => data,
                    CODEC_ZSTD => {
                        raw.clear();
                        raw.reserve(raw_bytes);
                        decompressor
                            .decompress_to_buffer(data, &mut raw)
                            .map_err(|e| corrupt(path, at, &format!("zstd: {e}")))?;
                        &raw
                    }
                    _ => return Err(corrupt(path, at, "unknown codec")),
                };
                if block.len() != raw_bytes {
                    return Err(corrupt(path, at, "events block size mismatch"));
                }
                decode_block(path, at, block, events, &threads, f)?;
                info.records += events;
            }
            FRAME_END => {
                let total = c.varint().ok_or_else(|| corrupt(path, at, "end frame"))?;
                if total != info.records {
                    return Err(corrupt(
                        path,
                        at,
                        &format!(
                            "the end frame counts {total} events, the blocks hold {}",
                            info.records
                        ),
                    ));
                }
                ended = true;
                break;
            }
            // Unknown frames are skipped, so later versions may add informative ones.
            _ => {}
        }
    }
    if !ended && info.truncated.is_none() {
        info.truncated = Some("the file has no end frame (the writer was interrupted)".into());
    }
    Ok(info)
}

fn decode_block(
    path: &Path,
    at: u64,
    block: &[u8],
    events: u64,
    threads: &[u64],
    f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
) -> Result<(), LoadError> {
    let mut c = Cursor::new(block);
    let mut t_ns: i64 = 0;
    let mut addr: u64 = 0;
    let mut thread: u64 = 0;
    for i in 0..events {
        let bad = |what: &str| corrupt(path, at, &format!("event {i} of the block: {what}"));
        let op = c.u8().ok_or_else(|| bad("cut"))?;
        if op & 0xc0 != 0 {
            return Err(bad("reserved op bits set"));
        }
        let call = call_of(op).ok_or_else(|| bad("unknown call code"))?;
        if op & OP_THREAD != 0 {
            thread = c.varint().ok_or_else(|| bad("thread"))?;
        }
        let tid = *usize::try_from(thread)
            .ok()
            .and_then(|i| threads.get(i))
            .ok_or_else(|| bad("thread index not introduced"))?;
        t_ns = t_ns.wrapping_add(c.zigzag().ok_or_else(|| bad("time"))?);
        let size_bytes = if op & OP_FREE != 0 {
            None
        } else {
            Some(c.varint().ok_or_else(|| bad("size"))?)
        };
        addr = addr.wrapping_add(c.zigzag().ok_or_else(|| bad("address"))? as u64);
        f(&Record {
            t_ns,
            tid,
            size_bytes,
            addr,
            call,
        })
        .map_err(bad)?;
    }
    if !c.at_end() {
        return Err(corrupt(path, at, "bytes after the block's last event"));
    }
    Ok(())
}
