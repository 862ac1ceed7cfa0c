//! allocview's binary trace format: reading it into the event DataFrame, and writing it.
//!
//! A compact, lossless form of the libtracemalloc records (time, thread, size or free,
//! pointer, call name), written by `allocview record` and `allocview convert`. Both files the
//! format covers start the same way; all integers are little-endian:
//!
//! ```text
//! magic    8 bytes   89 41 56 54 0d 0a 1a 0a   ("\x89AVT\r\n\x1a\n")
//! version  u8        1
//! kind     u8        0 = trace, 1 = spool (the tracer's raw output)
//! frames   ...       each: tag u8, length u32 (bytes of payload), payload
//! ```
//!
//! Frames of a **trace** (kind 0), in file order:
//!
//! - `0x01` META: UTF-8 `key=value` lines (`pid`, `ppid`, `arg` once per argument of the
//!   traced command, `tracer`, `source`...); informative, never needed to read events.
//! - `0x02` THREADS: varint `n`, then `n` varint thread ids; appends them to the threads table
//!   (the first thread introduced is index 0). A thread is introduced before its first event.
//! - `0x03` EVENTS: codec u8 (0 = stored, 1 = zstd), varint `events`, varint `raw_bytes`,
//!   then the (compressed) bytes. Decoded, a block holds `events` events, each:
//!   an op byte (bits 0-3: call code, an index into [`CALL_NAMES`], or 15 for a record
//!   without a call name; bit 4: a free, size -1 in the text form; bit 5: the thread changes;
//!   bits 6-7: zero), then the thread index as a varint if bit 5 is set, the time as a zigzag
//!   varint of its difference from the previous event's, the size as a varint unless the
//!   event is a free, and the address as a zigzag varint of its difference from the previous
//!   event's. Every block starts from time 0, address 0 and thread 0, so blocks decode on
//!   their own. Times are nanoseconds.
//! - `0x04` END: varint total events. A file without it was cut short (the loader loads what
//!   is there and says so).
//!
//! A **spool** (kind 1) is what the LD_PRELOAD tracer writes while the program runs: a META
//! frame (as above, plus `tick0`, `mono_ns0`, `realtime_ns0`, `clock`, and in the current
//! tracer's spools `clock_resolution_ns` and `events`), then `0x10` SEGMENT frames, one per
//! buffer flush of one thread: stream u32, thread id u64, tick u64 and `CLOCK_MONOTONIC` ns i64
//! read together at the flush, then events. A segment continues the deltas of the previous
//! segment of its stream; a stream is one thread's buffer from when it took the buffer, and
//! streams are numbered in the order threads took their buffers.
//!
//! Spool events come in two encodings, named by the META key `events`:
//!
//! - absent or `1` (`clock=tsc` or `monotonic_ns`): encoded as in a trace block but with no
//!   thread field (op bits 5-7 zero) and times in ticks.
//! - `2` (`clock=monotonic_coarse_ns`): times are `CLOCK_MONOTONIC` nanoseconds as of the
//!   tracer's clock thread's latest tick (every `clock_resolution_ns`), so most events share
//!   their time with the previous one and a time change is a record of its own: op byte
//!   `0x0f`, then the time's difference as a zigzag varint. An event is: op byte (bits 0-3
//!   call code, below 15; bit 4 free; bits 5-7 the address delta's length code `c`: `c` bytes
//!   for `c` below 7, 8 bytes for 7), the size unless a free as a *prefix varint* (the first
//!   byte's trailing zero bits plus one give the length `n`, 1 to 8 bytes holding
//!   `size << n | 1 << (n - 1)` little-endian; a zero first byte is followed by 8 bytes of
//!   size), then the zigzag address delta as `c` little-endian bytes (none when the address
//!   repeats). These cost the tracer no loop and no branch on lengths.
//! - `3`: as `2`, and a stream may hold the op byte `0x0e` (once): every event after it ends
//!   with its *order key* (the TSC, comparable across the process's threads) as a zigzag
//!   prefix varint of its difference from the stream's previous key (0 at the stream's
//!   start). The tracer switches every stream to keys once a second thread records.
//!
//! Reading a spool converts ticks to nanoseconds with the line through (`tick0`, `mono_ns0`)
//! and the segment calibration point with the largest tick (slope 1 unless `clock=tsc`), then
//! merges the streams by time into one ordered sequence (a free reads the clock before the
//! real call and an allocation after it, so a free never has a later time than the
//! allocation that reuses its address in another thread). With a coarse clock, many events of
//! several threads share a time. Events with order keys are merged by key, each thread in its
//! own order (`Merge::merge_by_key`): exact. Events without keys (spools of encoding 2, the
//! period in which a second thread started, machines without usable keys) are ordered by
//! causality: each thread's own order, no allocation before the free of its address, no free
//! before its allocation (see `Merge::interleave`), a search that can give up under heavy
//! hand-over of blocks between threads.
//!
//! Varints are LEB128 (7 bits a byte, low first); zigzag maps 0, -1, 1, -2... to 0, 1, 2, 3...

use std::collections::{BinaryHeap, HashMap};
use std::io::{self, Read, Write};
use std::path::Path;
use std::time::Instant;

use crate::error::LoadError;
use crate::malloc_trace::{
    Builder, CALL_NAMES, Line, LoadOptions, MallocTrace, PtrHasher, PtrMap, PtrSet, Record,
    Strictness,
};

/// The first eight bytes of every allocview binary file.
pub const MAGIC: [u8; 8] = [0x89, b'A', b'V', b'T', b'\r', b'\n', 0x1a, b'\n'];
/// The format version this code reads and writes.
pub const VERSION: u8 = 1;

const KIND_TRACE: u8 = 0;
const KIND_SPOOL: u8 = 1;
const FRAME_META: u8 = 0x01;
const FRAME_THREADS: u8 = 0x02;
const FRAME_EVENTS: u8 = 0x03;
const FRAME_END: u8 = 0x04;
const FRAME_SEGMENT: u8 = 0x10;
const CODEC_STORED: u8 = 0;
const CODEC_ZSTD: u8 = 1;
const OP_CALL_MASK: u8 = 0x0f;
const OP_NO_CALL: u8 = 0x0f;
const OP_FREE: u8 = 0x10;
const OP_THREAD: u8 = 0x20;
/// Events per EVENTS block written.
const BLOCK_EVENTS: u32 = 1 << 16;
/// zstd level for blocks: fast to write, and decoding speed barely depends on it.
const ZSTD_LEVEL: i32 = 3;
/// Largest frame a reader accepts (a guard against reading garbage lengths).
const MAX_FRAME_BYTES: usize = 1 << 30;

/// True when `head` starts with the binary format's magic.
#[must_use]
pub fn is_binary(head: &[u8]) -> bool {
    head.starts_with(&MAGIC)
}

/// Which of the two files of the format was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Trace,
    Spool,
}

/// What reading a binary file found besides the records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BinaryInfo {
    pub kind: FileKind,
    /// The META lines, in order (`arg` repeats).
    pub meta: Vec<(String, String)>,
    pub records: u64,
    /// Set when the file ends early (no END frame, or a cut frame): what was there was read.
    pub truncated: Option<String>,
}

impl BinaryInfo {
    /// The first value of a META key.
    #[must_use]
    pub fn meta_value(&self, key: &str) -> Option<&str> {
        self.meta
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// How spool times become trace times.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeBase {
    /// Wall-clock nanoseconds (since the Unix epoch) that become time 0; `None` puts time 0
    /// at the traced process's start.
    pub realtime_ns: Option<i64>,
}

fn corrupt(path: &Path, offset: u64, what: &str) -> LoadError {
    LoadError::format(
        path,
        format!("corrupt allocview binary file at byte {offset}: {what}"),
    )
}

/// A cursor over decoded bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    fn at_end(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    fn u8(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    #[inline]
    fn varint(&mut self) -> Option<u64> {
        let mut v: u64 = 0;
        let mut shift = 0u32;
        loop {
            let b = *self.bytes.get(self.pos)?;
            self.pos += 1;
            if shift == 63 && b > 1 {
                return None;
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(v);
            }
            shift += 7;
            if shift > 63 {
                return None;
            }
        }
    }

    #[inline]
    fn zigzag(&mut self) -> Option<i64> {
        Some(unzigzag(self.varint()?))
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn parse_meta(bytes: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The frames of a file held in memory.
struct Frames<'a> {
    bytes: &'a [u8],
    pos: usize,
}

enum Next<'a> {
    Frame(u8, &'a [u8], usize),
    End,
    Cut(String),
}

impl<'a> Frames<'a> {
    fn next(&mut self) -> Next<'a> {
        let rest = self.bytes.get(self.pos..).unwrap_or(&[]);
        if rest.is_empty() {
            return Next::End;
        }
        let mut c = Cursor::new(rest);
        let (Some(tag), Some(len)) = (c.u8(), c.u32()) else {
            return Next::Cut(format!("a frame header is cut at byte {}", self.pos));
        };
        let len = len as usize;
        if len > MAX_FRAME_BYTES {
            return Next::Cut(format!(
                "a frame length of {len} bytes at byte {}",
                self.pos
            ));
        }
        let Some(payload) = c.take(len) else {
            return Next::Cut(format!("the frame at byte {} is cut", self.pos));
        };
        let at = self.pos;
        self.pos += 5 + len;
        Next::Frame(tag, payload, at)
    }
}

/// Reads the file's header; returns the kind and the offset of the first frame.
fn read_header(path: &Path, bytes: &[u8]) -> Result<FileKind, LoadError> {
    if !is_binary(bytes) {
        return Err(LoadError::format(
            path,
            "not an allocview binary file (bad magic)",
        ));
    }
    let version = bytes.get(8).copied();
    if version != Some(VERSION) {
        return Err(LoadError::format(
            path,
            format!(
                "unsupported allocview binary version {version:?} (this build reads {VERSION})"
            ),
        ));
    }
    match bytes.get(9).copied() {
        Some(KIND_TRACE) => Ok(FileKind::Trace),
        Some(KIND_SPOOL) => Ok(FileKind::Spool),
        other => Err(LoadError::format(
            path,
            format!("unknown allocview file kind {other:?}"),
        )),
    }
}

/// Calls `f` on every record of a binary trace or spool, in order (a spool's threads merged by
/// time). `f`'s error stops the read and is reported with the record's position.
///
/// # Errors
/// When the file cannot be read, is not in this format, or is corrupt (a cut last frame is not
/// an error: see [`BinaryInfo::truncated`]).
pub fn read_records(
    path: &Path,
    base: TimeBase,
    mut f: impl FnMut(&Record) -> Result<(), &'static str>,
) -> Result<BinaryInfo, LoadError> {
    let bytes = std::fs::read(path).map_err(|e| LoadError::io(path, e))?;
    let kind = read_header(path, &bytes)?;
    let frames = Frames {
        bytes: bytes.get(10..).unwrap_or(&[]),
        pos: 0,
    };
    match kind {
        FileKind::Trace => read_trace(path, frames, &mut f),
        FileKind::Spool => read_spool(path, frames, base, &mut f),
    }
}

fn call_of(op: u8) -> Option<Option<u8>> {
    match op & OP_CALL_MASK {
        OP_NO_CALL => Some(None),
        c if usize::from(c) < CALL_NAMES.len() => Some(Some(c)),
        _ => None,
    }
}

fn read_trace(
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

/// How a spool encodes its events (its META's `events`; absent in the first tracer's).
#[derive(Clone, Copy, PartialEq, Eq)]
enum SpoolEncoding {
    /// As in a trace block, with no thread field: op, time, size and address as varints.
    Varints,
    /// Time changes as separate records, prefix-varint sizes, short addresses (see the module
    /// documentation).
    Compact,
    /// As `Compact`, and a stream may switch to keyed events: each then ends with its order key.
    Keyed,
}

/// Spool op (encoding 2): a time change; a zigzag varint of the time's difference follows.
const OP_TIME: u8 = 0x0f;
/// Spool op bits 5-7 (encoding 2): the address delta's length code.
const OP_ADDR_SHIFT: u8 = 5;
/// Spool op (encoding 3): the stream's events from here on carry order keys.
const OP_KEYED: u8 = 0x0e;

/// One stream (a thread's buffer) of a spool while merging.
struct Stream<'a> {
    /// The tracer's number for the stream: buffers taken earlier have lower numbers.
    id: u32,
    tid: u64,
    segments: Vec<&'a [u8]>,
    next_segment: usize,
    cur: Cursor<'a>,
    tick: u64,
    addr: u64,
    /// The stream's events carry order keys (since its [`OP_KEYED`]).
    keyed: bool,
    /// The order key of the stream's previous keyed event.
    key: u64,
    /// The next event, decoded ahead (the merge compares heads).
    head: Option<SpoolEvent>,
}

#[derive(Clone, Copy)]
struct SpoolEvent {
    tick: u64,
    op: u8,
    size: u64,
    addr: u64,
    /// The order key (encoding 3, events recorded while several threads did): TSC ticks,
    /// comparable across the process's threads.
    key: Option<u64>,
}

impl Cursor<'_> {
    /// A prefix varint: the first byte's trailing zeros, plus one, give the length in bytes
    /// (1 to 8, the value above those bits); a zero byte is followed by 8 bytes of value.
    fn prefix_varint(&mut self) -> Option<u64> {
        let first = *self.bytes.get(self.pos)?;
        if first == 0 {
            self.pos += 1;
            return self.u64();
        }
        let n = first.trailing_zeros() as usize + 1;
        let raw = self.take(n)?;
        let mut word = [0u8; 8];
        word.get_mut(..n)?.copy_from_slice(raw);
        Some(u64::from_le_bytes(word) >> n)
    }

    /// `n` little-endian bytes (0 to 8).
    fn short_u64(&mut self, n: usize) -> Option<u64> {
        let raw = self.take(n)?;
        let mut word = [0u8; 8];
        word.get_mut(..n)?.copy_from_slice(raw);
        Some(u64::from_le_bytes(word))
    }
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

impl Stream<'_> {
    /// Decodes the stream's next event into `head`, moving to its next segment as needed.
    fn advance(&mut self, encoding: SpoolEncoding) -> Result<(), &'static str> {
        self.head = None;
        loop {
            while self.cur.at_end() {
                let Some(seg) = self.segments.get(self.next_segment) else {
                    return Ok(());
                };
                self.next_segment += 1;
                self.cur = Cursor::new(seg);
            }
            let c = &mut self.cur;
            let op = c.u8().ok_or("a cut event")?;
            let (size, delta) = match encoding {
                SpoolEncoding::Varints => {
                    if op & 0xe0 != 0 {
                        return Err("reserved op bits set");
                    }
                    self.tick = self
                        .tick
                        .wrapping_add(c.zigzag().ok_or("a cut time")? as u64);
                    let size = if op & OP_FREE != 0 {
                        0
                    } else {
                        c.varint().ok_or("a cut size")?
                    };
                    (size, c.zigzag().ok_or("a cut address")?)
                }
                SpoolEncoding::Compact | SpoolEncoding::Keyed => {
                    if encoding == SpoolEncoding::Keyed && op & OP_CALL_MASK == OP_KEYED {
                        if op != OP_KEYED {
                            return Err("reserved bits set in a switch to keyed events");
                        }
                        self.keyed = true;
                        continue;
                    }
                    if op & OP_CALL_MASK == OP_TIME {
                        if op != OP_TIME {
                            return Err("reserved bits set in a time change");
                        }
                        self.tick = self
                            .tick
                            .wrapping_add(c.zigzag().ok_or("a cut time")? as u64);
                        continue;
                    }
                    let size = if op & OP_FREE != 0 {
                        0
                    } else {
                        c.prefix_varint().ok_or("a cut size")?
                    };
                    let code = usize::from(op >> OP_ADDR_SHIFT);
                    let len = if code == 7 { 8 } else { code };
                    (size, unzigzag(c.short_u64(len).ok_or("a cut address")?))
                }
            };
            self.addr = self.addr.wrapping_add(delta as u64);
            let key = if self.keyed {
                let dk = unzigzag(self.cur.prefix_varint().ok_or("a cut order key")?);
                self.key = self.key.wrapping_add(dk as u64);
                Some(self.key)
            } else {
                None
            };
            self.head = Some(SpoolEvent {
                tick: self.tick,
                op: op & (OP_CALL_MASK | OP_FREE),
                size,
                addr: self.addr,
                key,
            });
            return Ok(());
        }
    }
}

fn meta_i64(meta: &[(String, String)], key: &str) -> Option<i64> {
    meta.iter().find(|(k, _)| k == key)?.1.parse().ok()
}

fn read_spool(
    path: &Path,
    mut frames: Frames<'_>,
    base: TimeBase,
    f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
) -> Result<BinaryInfo, LoadError> {
    let mut info = BinaryInfo {
        kind: FileKind::Spool,
        meta: Vec::new(),
        records: 0,
        truncated: None,
    };
    let mut streams: Vec<Stream<'_>> = Vec::new();
    let mut by_id: HashMap<u32, usize> = HashMap::new();
    let mut calib_last: Option<(u64, i64)> = None;
    loop {
        let (tag, payload, at) = match frames.next() {
            Next::Frame(tag, payload, at) => (tag, payload, (at + 10) as u64),
            Next::End => break,
            Next::Cut(why) => {
                // The tracer's last write may be cut when the process was killed mid-write.
                info.truncated = Some(why);
                break;
            }
        };
        match tag {
            FRAME_META => info.meta.extend(parse_meta(payload)),
            FRAME_SEGMENT => {
                let mut c = Cursor::new(payload);
                let (Some(stream), Some(tid), Some(tick), Some(ns)) =
                    (c.u32(), c.u64(), c.u64(), c.u64())
                else {
                    return Err(corrupt(path, at, "segment header"));
                };
                if calib_last.is_none_or(|(t, _)| tick > t) {
                    calib_last = Some((tick, ns as i64));
                }
                let events = c.take(payload.len() - c.pos).unwrap_or(&[]);
                let idx = *by_id.entry(stream).or_insert_with(|| {
                    streams.push(Stream {
                        id: stream,
                        tid,
                        segments: Vec::new(),
                        next_segment: 0,
                        cur: Cursor::new(&[]),
                        tick: 0,
                        addr: 0,
                        keyed: false,
                        key: 0,
                        head: None,
                    });
                    streams.len() - 1
                });
                if let Some(s) = streams.get_mut(idx) {
                    s.segments.push(events);
                }
            }
            _ => {}
        }
    }
    let tick0 = meta_i64(&info.meta, "tick0")
        .ok_or_else(|| corrupt(path, 10, "no tick0 in the spool header"))?;
    let mono0 = meta_i64(&info.meta, "mono_ns0").ok_or_else(|| corrupt(path, 10, "no mono_ns0"))?;
    let wall0 =
        meta_i64(&info.meta, "realtime_ns0").ok_or_else(|| corrupt(path, 10, "no realtime_ns0"))?;
    let tsc = info.meta.iter().any(|(k, v)| k == "clock" && v == "tsc");
    let encoding = match meta_i64(&info.meta, "events") {
        None | Some(1) => SpoolEncoding::Varints,
        Some(2) => SpoolEncoding::Compact,
        Some(3) => SpoolEncoding::Keyed,
        Some(_) => {
            return Err(LoadError::format(
                path,
                "a spool event encoding this build does not know (written by a newer tracer)",
            ));
        }
    };
    let tick0 = tick0 as u64;
    // Nanoseconds per tick: exactly 1 for a nanosecond clock; for the TSC, the slope from the
    // start to the latest calibration point (short runs fall back to 1 GHz until a point exists).
    let ns_per_tick = match calib_last {
        Some((t, ns)) if tsc && t > tick0 => (ns - mono0) as f64 / (t - tick0) as f64,
        _ => 1.0,
    };
    let offset = wall0 - base.realtime_ns.unwrap_or(wall0);
    let to_ns = |tick: u64| -> i64 {
        let dt = tick.wrapping_sub(tick0) as i64;
        (dt as f64 * ns_per_tick).round() as i64 + offset
    };
    // Segments are in the order they were written; the merge wants the streams' own order.
    streams.sort_by_key(|s| s.id);
    let mut merge = Merge {
        path,
        encoding,
        truncated: info.truncated.is_some(),
        // One thread alone needs no ordering by causality, so no live set either.
        live: (streams.len() > 1).then(PtrSet::default),
        records: 0,
        to_ns: &to_ns,
        f,
    };
    merge.run(&mut streams)?;
    info.records = merge.records;
    Ok(info)
}

/// Merges the streams of a spool into one sequence: by time, and among events of one time
/// (the clock thread's period, so there are many) in an order consistent with the pointers'
/// lives, which the times alone cannot give.
struct Merge<'p, 'f> {
    path: &'p Path,
    encoding: SpoolEncoding,
    /// The file was cut: a cut last event ends its stream instead of being an error.
    truncated: bool,
    /// The pointers allocated and not yet freed, when there are several streams.
    live: Option<PtrSet>,
    records: u64,
    to_ns: &'f dyn Fn(u64) -> i64,
    f: &'f mut dyn FnMut(&Record) -> Result<(), &'static str>,
}

/// How an event fits the live pointers, in the order the merge prefers.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fit {
    /// A free of a live pointer, or an event on NULL: nothing else can come first.
    Safe,
    /// An allocation of a pointer that is not live.
    Alloc,
    /// A free of a pointer that is not live (allocated before tracing, or by an event still
    /// to come).
    FreeUnknown,
    /// An allocation of a live pointer: its free must come first.
    Blocked,
}

impl Merge<'_, '_> {
    fn advance(&self, s: &mut Stream<'_>) -> Result<(), LoadError> {
        match s.advance(self.encoding) {
            Ok(()) => Ok(()),
            // A cut last event (the tracer was killed mid-write) ends the stream.
            Err(_) if self.truncated => {
                s.head = None;
                s.segments.clear();
                s.cur = Cursor::new(&[]);
                Ok(())
            }
            Err(e) => Err(corrupt(self.path, 0, e)),
        }
    }

    /// Emits an event and updates the live pointers.
    fn emit(&mut self, tid: u64, ev: &SpoolEvent) -> Result<(), LoadError> {
        if let Some(live) = &mut self.live {
            apply(live, ev);
        }
        self.emit_record(tid, ev)
    }

    /// Emits an event whose effect on the live pointers is already applied.
    fn emit_record(&mut self, tid: u64, ev: &SpoolEvent) -> Result<(), LoadError> {
        let call = call_of(ev.op).ok_or_else(|| corrupt(self.path, 0, "unknown call code"))?;
        let is_free = ev.op & OP_FREE != 0;
        (self.f)(&Record {
            t_ns: (self.to_ns)(ev.tick),
            tid,
            size_bytes: (!is_free).then_some(ev.size),
            addr: ev.addr,
            call,
        })
        .map_err(|e| corrupt(self.path, 0, e))?;
        self.records += 1;
        Ok(())
    }

    fn run(&mut self, streams: &mut [Stream<'_>]) -> Result<(), LoadError> {
        let mut heap: BinaryHeap<std::cmp::Reverse<(u64, usize)>> =
            BinaryHeap::with_capacity(streams.len());
        for (i, s) in streams.iter_mut().enumerate() {
            self.advance(s)?;
            if let Some(ev) = &s.head {
                heap.push(std::cmp::Reverse((ev.tick, i)));
            }
        }
        let mut group: Vec<usize> = Vec::new();
        let mut runs: Vec<Vec<SpoolEvent>> = Vec::new();
        let mut keyed: Vec<Vec<SpoolEvent>> = Vec::new();
        while let Some(std::cmp::Reverse((tick, first))) = heap.pop() {
            // Every stream whose next event has this time.
            group.clear();
            group.push(first);
            while let Some(&std::cmp::Reverse((t, i))) = heap.peek()
                && t == tick
            {
                heap.pop();
                group.push(i);
            }
            if let [i] = group[..] {
                let Some(s) = streams.get_mut(i) else {
                    continue;
                };
                while let Some(ev) = s.head.filter(|ev| ev.tick == tick) {
                    self.emit(s.tid, &ev)?;
                    self.advance(s)?;
                }
            } else {
                group.sort_unstable();
                runs.resize_with(group.len(), Vec::new);
                for (run, &i) in runs.iter_mut().zip(&group) {
                    run.clear();
                    let Some(s) = streams.get_mut(i) else {
                        continue;
                    };
                    while let Some(ev) = s.head.filter(|ev| ev.tick == tick) {
                        run.push(ev);
                        self.advance(s)?;
                    }
                }
                let tids: Vec<u64> = group
                    .iter()
                    .map(|&i| streams.get(i).map_or(0, |s| s.tid))
                    .collect();
                let runs = &mut runs[..group.len()];
                if runs.iter().flatten().all(|ev| ev.key.is_some()) {
                    self.merge_by_key(runs, &tids)?;
                } else if runs.iter().flatten().all(|ev| ev.key.is_none()) {
                    self.interleave(runs, &tids)?;
                } else {
                    // The period in which a second thread started recording: each thread's
                    // events without a key come first (the tracer read the flag that adds keys
                    // before the call of each of them, and found it unset, while every keyed
                    // event read it set, so none of the former can depend on one of the
                    // latter), ordered by causality; then the keyed ones, by key.
                    keyed.clear();
                    for run in runs.iter_mut() {
                        let first_keyed = run.iter().position(|ev| ev.key.is_some());
                        keyed.push(run.split_off(first_keyed.unwrap_or(run.len())));
                    }
                    self.interleave(runs, &tids)?;
                    self.merge_by_key(&keyed, &tids)?;
                }
            }
            for &i in &group {
                if let Some(ev) = streams.get(i).and_then(|s| s.head.as_ref()) {
                    heap.push(std::cmp::Reverse((ev.tick, i)));
                }
            }
        }
        Ok(())
    }

    /// Emits the runs of events of one time from several threads when every event has an
    /// order key: each run in its order, the runs merged by key (the tracer reads an
    /// allocation's key after its real call and a free's before, so an allocation that
    /// reuses an address has a larger key than the free that released it, and a free a larger
    /// key than the allocation whose block it was handed).
    fn merge_by_key(&mut self, runs: &[Vec<SpoolEvent>], tids: &[u64]) -> Result<(), LoadError> {
        let mut next = vec![0usize; runs.len()];
        loop {
            // Few runs (one per thread active in the period): a scan of the heads is enough.
            let best = runs
                .iter()
                .zip(&next)
                .enumerate()
                // An event without a key after keyed ones cannot come from the tracer (once
                // keyed, a stream stays keyed); it is kept, where its thread has reached.
                .filter_map(|(r, (run, &n))| Some((run.get(n)?.key.unwrap_or(0), r)))
                .min();
            let Some((_, r)) = best else {
                return Ok(());
            };
            let (Some(n), Some(run), Some(&tid)) = (next.get_mut(r), runs.get(r), tids.get(r))
            else {
                return Ok(());
            };
            if let Some(ev) = run.get(*n) {
                self.emit(tid, ev)?;
            }
            *n += 1;
        }
    }

    /// Emits the runs of events of one time from several threads, some without an order key
    /// (the period in which a second thread started recording, spools of earlier tracers,
    /// machines without usable keys): each run in its order, interleaved so that no allocation comes before the free of its address, nor a free
    /// before its allocation (see [`search`]; when its budget runs out, [`greedy`]).
    fn interleave(&mut self, runs: &[Vec<SpoolEvent>], tids: &[u64]) -> Result<(), LoadError> {
        let Some(live) = &mut self.live else {
            return Ok(());
        };
        let order = match search(runs, live) {
            Some(order) => order,
            None => greedy(runs, live),
        };
        let mut next = vec![0usize; runs.len()];
        for r in order {
            let r = r as usize;
            let (Some(n), Some(run), Some(&tid)) = (next.get_mut(r), runs.get(r), tids.get(r))
            else {
                continue;
            };
            if let Some(ev) = run.get(*n) {
                self.emit_record(tid, ev)?;
            }
            *n += 1;
        }
        Ok(())
    }
}

/// Applies an event to the live pointers; returns whether it changed them.
fn apply(live: &mut PtrSet, ev: &SpoolEvent) -> bool {
    if ev.addr == 0 {
        false
    } else if ev.op & OP_FREE != 0 {
        live.remove(&ev.addr)
    } else {
        live.insert(ev.addr)
    }
}

/// Undoes an [`apply`] that changed the live pointers.
fn unapply(live: &mut PtrSet, ev: &SpoolEvent) {
    if ev.op & OP_FREE != 0 {
        live.insert(ev.addr);
    } else {
        live.remove(&ev.addr);
    }
}

/// How an event fits the live pointers.
fn fit(live: &PtrSet, ev: &SpoolEvent) -> Fit {
    let is_live = live.contains(&ev.addr);
    match (ev.addr == 0, ev.op & OP_FREE != 0, is_live) {
        (true, _, _) | (false, true, true) => Fit::Safe,
        (false, true, false) => Fit::FreeUnknown,
        (false, false, false) => Fit::Alloc,
        (false, false, true) => Fit::Blocked,
    }
}

/// Search steps allowed per event of a period before [`search`] gives up.
const SEARCH_STEPS_PER_EVENT: usize = 8;
const SEARCH_STEPS_MIN: usize = 50_000;

/// Finds an order of the runs' events (as run indices) in which every event fits: a free
/// of a live pointer, an allocation of a pointer that is not live, an event on NULL, or a
/// free of a pointer not live that no run of this period allocates (allocated before
/// tracing). Depth-first, trying first the run least far through (threads are taken to
/// progress evenly through a period), and never twice from the same positions in the runs
/// (they determine the live pointers); `None` when the step budget runs out first. On
/// success `live` holds the pointers live after the period, else it is as it was.
///
/// The times alone cannot give this order: many events share each time, and a greedy choice
/// among those that fit can take an address for one thread that another thread, in
/// reality, freed and reused first, and then find nothing that fits further on.
fn search(runs: &[Vec<SpoolEvent>], live: &mut PtrSet) -> Option<Vec<u32>> {
    let total: usize = runs.iter().map(Vec::len).sum();
    let budget = total
        .saturating_mul(SEARCH_STEPS_PER_EVENT)
        .max(SEARCH_STEPS_MIN);
    // Allocations still to come, per address: a free of a pointer that is not live must wait
    // for one of them.
    let mut pending: PtrMap<u32> = PtrMap::default();
    for ev in runs.iter().flatten() {
        if ev.op & OP_FREE == 0 && ev.addr != 0 {
            *pending.entry(ev.addr).or_default() += 1;
        }
    }
    let mut pos = vec![0u32; runs.len()];
    let mut seen: std::collections::HashSet<u64, std::hash::BuildHasherDefault<PtrHasher>> =
        Default::default();
    // The path: the run of each step, and whether it changed the live pointers.
    let mut path: Vec<(u32, bool)> = Vec::with_capacity(total);
    // Per depth: the runs to try, and how many were tried.
    let mut frames: Vec<(Vec<u32>, usize)> = Vec::new();
    let choices = |pos: &[u32], live: &PtrSet, pending: &PtrMap<u32>| -> Vec<u32> {
        let mut c: Vec<(f64, u32)> = runs
            .iter()
            .zip(pos)
            .enumerate()
            .filter_map(|(r, (run, &p))| {
                let ev = run.get(p as usize)?;
                let ok = match fit(live, ev) {
                    Fit::Safe | Fit::Alloc => true,
                    Fit::FreeUnknown => pending.get(&ev.addr).is_none_or(|&n| n == 0),
                    Fit::Blocked => false,
                };
                ok.then_some((f64::from(p) / run.len() as f64, r as u32))
            })
            .collect();
        c.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        c.into_iter().map(|(_, r)| r).collect()
    };
    frames.push((choices(&pos, live, &pending), 0));
    let mut steps = 0usize;
    let undo =
        |r: u32, changed: bool, pos: &mut [u32], live: &mut PtrSet, pending: &mut PtrMap<u32>| {
            let Some(p) = pos.get_mut(r as usize) else {
                return;
            };
            *p -= 1;
            let Some(ev) = runs.get(r as usize).and_then(|run| run.get(*p as usize)) else {
                return;
            };
            if changed {
                unapply(live, ev);
            }
            if ev.op & OP_FREE == 0 && ev.addr != 0 {
                *pending.entry(ev.addr).or_default() += 1;
            }
        };
    while path.len() < total {
        steps += 1;
        let Some((frame_choices, tried)) = frames.last_mut() else {
            break;
        };
        if steps > budget {
            break;
        }
        let Some(&r) = frame_choices.get(*tried) else {
            // Nothing more to try here: back up one step.
            frames.pop();
            match path.pop() {
                Some((r, changed)) => undo(r, changed, &mut pos, live, &mut pending),
                None => break,
            }
            continue;
        };
        *tried += 1;
        let Some(ev) = runs
            .get(r as usize)
            .and_then(|run| run.get(pos[r as usize] as usize))
        else {
            continue;
        };
        let changed = apply(live, ev);
        if ev.op & OP_FREE == 0
            && ev.addr != 0
            && let Some(n) = pending.get_mut(&ev.addr)
        {
            *n = n.saturating_sub(1);
        }
        pos[r as usize] += 1;
        if !seen.insert(hash_positions(&pos)) {
            undo(r, changed, &mut pos, live, &mut pending);
            continue;
        }
        path.push((r, changed));
        frames.push((choices(&pos, live, &pending), 0));
    }
    if path.len() == total {
        return Some(path.into_iter().map(|(r, _)| r).collect());
    }
    while let Some((r, changed)) = path.pop() {
        undo(r, changed, &mut pos, live, &mut pending);
    }
    None
}

fn hash_positions(pos: &[u32]) -> u64 {
    let mut h: u64 = 0x243f_6a88_85a3_08d3;
    for &p in pos {
        h = (h.rotate_left(23) ^ u64::from(p)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    h
}

/// The fallback when [`search`] gives up (the recording itself may be inconsistent, e.g. a
/// free made in a signal handler during a record, which is not traced): always the least
/// advanced event that fits (see [`search`]); failing that, a free of a pointer not live; and
/// when nothing fits, the least advanced event anyway. Applies the events to `live`.
fn greedy(runs: &[Vec<SpoolEvent>], live: &mut PtrSet) -> Vec<u32> {
    let mut next = vec![0usize; runs.len()];
    let total: usize = runs.iter().map(Vec::len).sum();
    let mut order = Vec::with_capacity(total);
    while order.len() < total {
        let mut best: Option<(Fit, f64, usize)> = None;
        for (r, run) in runs.iter().enumerate() {
            let Some(ev) = next.get(r).and_then(|&n| run.get(n)) else {
                continue;
            };
            // Safe and Alloc fit equally; then FreeUnknown; then Blocked.
            let rank = match fit(live, ev) {
                Fit::Safe | Fit::Alloc => Fit::Safe,
                other => other,
            };
            let progress = next[r] as f64 / run.len() as f64;
            if best.is_none_or(|(b_rank, b_progress, _)| (rank, progress) < (b_rank, b_progress)) {
                best = Some((rank, progress, r));
            }
        }
        let Some((_, _, r)) = best else { break };
        if let Some(ev) = runs.get(r).and_then(|run| run.get(next[r])) {
            apply(live, ev);
        }
        next[r] += 1;
        order.push(r as u32);
    }
    order
}

/// Loads a binary trace or spool into the same event DataFrame as the text loader.
///
/// # Errors
/// See [`read_records`]; in strict mode also when a record breaks a loader limit.
pub fn load_binary(path: &Path, opts: &LoadOptions) -> Result<MallocTrace, LoadError> {
    let started = Instant::now();
    let file_bytes = std::fs::metadata(path)
        .map_err(|e| LoadError::io(path, e))?
        .len();
    // About 2.5 bytes an event compressed (5 in a spool); the builder's vectors grow if needed.
    let expected = usize::try_from(file_bytes / 2).unwrap_or(1 << 20) + 1024;
    let mut b = Builder::with_capacity(expected);
    let info = read_records(path, TimeBase::default(), |r| {
        let line = Line {
            t_ns: r.t_ns.max(0),
            tid: r.tid,
            size_bytes: r.size_bytes,
            addr: r.addr,
            call: r
                .call
                .and_then(|c| CALL_NAMES.get(usize::from(c)))
                .map(|n| n.as_bytes()),
        };
        b.push(&line)
    });
    let info = match (info, opts.strictness) {
        (Ok(info), _) => info,
        (Err(e), Strictness::Strict) => return Err(e),
        (Err(e), Strictness::Lenient) => {
            // Keep what came before the damage.
            b.summary.truncated = Some(e.to_string());
            BinaryInfo {
                kind: FileKind::Trace,
                meta: Vec::new(),
                records: b.summary.events,
                truncated: None,
            }
        }
    };
    if let Some(p) = &opts.progress {
        p.store(file_bytes, std::sync::atomic::Ordering::Relaxed);
    }
    if info.truncated.is_some() {
        b.summary.truncated = info.truncated;
    }
    let (events, threads, summary) = b.finish()?;
    Ok(MallocTrace {
        events,
        threads,
        summary,
        load_seconds: started.elapsed().as_secs_f64(),
    })
}

/// Writes records as a binary trace (kind 0): blocks of [`BLOCK_EVENTS`] events, zstd each.
pub struct BinaryWriter<W: Write> {
    out: W,
    threads: HashMap<u64, u64>,
    new_threads: Vec<u64>,
    block: Vec<u8>,
    block_events: u32,
    prev_t: i64,
    prev_addr: u64,
    prev_thread: u64,
    total: u64,
    compressor: zstd::bulk::Compressor<'static>,
    packed: Vec<u8>,
}

impl<W: Write> BinaryWriter<W> {
    /// Writes the header and a META frame of `meta` (keys and values without `=`/newlines in
    /// keys, without newlines in values).
    ///
    /// # Errors
    /// On write errors.
    pub fn new(mut out: W, meta: &[(String, String)]) -> io::Result<Self> {
        out.write_all(&MAGIC)?;
        out.write_all(&[VERSION, KIND_TRACE])?;
        let mut text = String::new();
        for (k, v) in meta {
            let v = v.replace('\n', " ");
            text.push_str(&format!("{k}={v}\n"));
        }
        write_frame(&mut out, FRAME_META, &[text.as_bytes()])?;
        Ok(Self {
            out,
            threads: HashMap::new(),
            new_threads: Vec::new(),
            block: Vec::with_capacity(1 << 20),
            block_events: 0,
            prev_t: 0,
            prev_addr: 0,
            prev_thread: 0,
            total: 0,
            compressor: zstd::bulk::Compressor::new(ZSTD_LEVEL)?,
            packed: Vec::new(),
        })
    }

    /// Appends one record.
    ///
    /// # Errors
    /// On write errors.
    pub fn push(&mut self, r: &Record) -> io::Result<()> {
        let next_index = self.threads.len() as u64;
        let thread = *self.threads.entry(r.tid).or_insert_with(|| {
            self.new_threads.push(r.tid);
            next_index
        });
        let mut op = r.call.map_or(OP_NO_CALL, |c| c & OP_CALL_MASK);
        if r.size_bytes.is_none() {
            op |= OP_FREE;
        }
        if thread != self.prev_thread {
            op |= OP_THREAD;
        }
        self.block.push(op);
        if thread != self.prev_thread {
            put_varint(&mut self.block, thread);
            self.prev_thread = thread;
        }
        put_varint(&mut self.block, zigzag(r.t_ns.wrapping_sub(self.prev_t)));
        self.prev_t = r.t_ns;
        if let Some(size) = r.size_bytes {
            put_varint(&mut self.block, size);
        }
        put_varint(
            &mut self.block,
            zigzag(r.addr.wrapping_sub(self.prev_addr) as i64),
        );
        self.prev_addr = r.addr;
        self.block_events += 1;
        self.total += 1;
        if self.block_events >= BLOCK_EVENTS {
            self.flush_block()?;
        }
        Ok(())
    }

    fn flush_block(&mut self) -> io::Result<()> {
        if !self.new_threads.is_empty() {
            let mut t = Vec::new();
            put_varint(&mut t, self.new_threads.len() as u64);
            for &tid in &self.new_threads {
                put_varint(&mut t, tid);
            }
            write_frame(&mut self.out, FRAME_THREADS, &[&t])?;
            self.new_threads.clear();
        }
        if self.block_events == 0 {
            return Ok(());
        }
        let bound = zstd::zstd_safe::compress_bound(self.block.len());
        self.packed.clear();
        self.packed.reserve(bound);
        self.compressor
            .compress_to_buffer(&self.block, &mut self.packed)?;
        let (codec, data) = if self.packed.len() < self.block.len() {
            (CODEC_ZSTD, &self.packed)
        } else {
            (CODEC_STORED, &self.block)
        };
        let mut head = vec![codec];
        put_varint(&mut head, u64::from(self.block_events));
        put_varint(&mut head, self.block.len() as u64);
        write_frame(&mut self.out, FRAME_EVENTS, &[&head, data])?;
        self.block.clear();
        self.block_events = 0;
        self.prev_t = 0;
        self.prev_addr = 0;
        self.prev_thread = 0;
        Ok(())
    }

    /// Writes the last block and the END frame, and returns the output.
    ///
    /// # Errors
    /// On write errors.
    pub fn finish(mut self) -> io::Result<W> {
        self.flush_block()?;
        let mut end = Vec::new();
        put_varint(&mut end, self.total);
        write_frame(&mut self.out, FRAME_END, &[&end])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

fn write_frame(out: &mut impl Write, tag: u8, parts: &[&[u8]]) -> io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(len).map_err(|_| io::Error::other("frame larger than 4 GiB"))?;
    out.write_all(&[tag])?;
    out.write_all(&len.to_le_bytes())?;
    for p in parts {
        out.write_all(p)?;
    }
    Ok(())
}

/// Reads the first bytes of a file (for kind detection without decompressing).
///
/// # Errors
/// When the file cannot be read.
pub fn file_head(path: &Path) -> Result<Vec<u8>, LoadError> {
    let mut head = Vec::with_capacity(16);
    std::fs::File::open(path)
        .and_then(|f| f.take(16).read_to_end(&mut head))
        .map_err(|e| LoadError::io(path, e))?;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records() -> Vec<Record> {
        vec![
            Record {
                t_ns: 1_000,
                tid: 7,
                size_bytes: Some(24),
                addr: 0x1000,
                call: Some(1),
            },
            Record {
                t_ns: 3_000,
                tid: 7,
                size_bytes: None,
                addr: 0x1000,
                call: Some(2),
            },
            Record {
                t_ns: 3_000,
                tid: 9,
                size_bytes: Some(96),
                addr: 0x3000,
                call: Some(2),
            },
            Record {
                t_ns: 2_500,
                tid: 7,
                size_bytes: None,
                addr: 0,
                call: None,
            },
            Record {
                t_ns: 4_000,
                tid: 9,
                size_bytes: Some(u64::MAX),
                addr: 0,
                call: Some(0),
            },
            Record {
                t_ns: 4_001,
                tid: u64::MAX,
                size_bytes: None,
                addr: u64::MAX,
                call: Some(3),
            },
        ]
    }

    fn write(records: &[Record]) -> Vec<u8> {
        let mut w = BinaryWriter::new(Vec::new(), &[("pid".into(), "1".into())]).unwrap();
        for r in records {
            w.push(r).unwrap();
        }
        w.finish().unwrap()
    }

    fn read(bytes: &[u8]) -> (Vec<Record>, BinaryInfo) {
        let dir =
            std::env::temp_dir().join(format!("allocview-binary-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.avt", bytes.len()));
        std::fs::write(&path, bytes).unwrap();
        let mut out = Vec::new();
        let info = read_records(&path, TimeBase::default(), |r| {
            out.push(*r);
            Ok(())
        })
        .unwrap();
        std::fs::remove_file(&path).ok();
        (out, info)
    }

    #[test]
    fn records_round_trip_exactly() {
        let recs = records();
        let (back, info) = read(&write(&recs));
        assert_eq!(back, recs);
        assert_eq!(info.records, recs.len() as u64);
        assert_eq!(info.truncated, None);
        assert_eq!(info.meta_value("pid"), Some("1"));
    }

    #[test]
    fn many_blocks_round_trip() {
        let recs: Vec<Record> = (0..(BLOCK_EVENTS as u64 * 2 + 17))
            .map(|i| Record {
                t_ns: i as i64 * 37,
                tid: i % 3,
                size_bytes: (i % 2 == 0).then_some(i * 8),
                addr: 0x5555_0000 + (i / 2) * 64,
                call: Some((i % 11) as u8),
            })
            .collect();
        let bytes = write(&recs);
        assert!(
            bytes.len() < recs.len() * 3,
            "{} bytes for {} records",
            bytes.len(),
            recs.len()
        );
        let (back, _) = read(&bytes);
        assert_eq!(back, recs);
    }

    #[test]
    fn a_cut_file_reads_what_is_there_and_says_so() {
        let recs = records();
        let bytes = write(&recs);
        // Drop the END frame (1 tag + 4 length + 1 varint).
        let (back, info) = read(&bytes[..bytes.len() - 6]);
        assert_eq!(back, recs);
        assert!(info.truncated.is_some());
        // Cut inside the events frame: nothing of it is read, and the cut is reported.
        let (back, info) = read(&bytes[..bytes.len() - 12]);
        assert!(back.is_empty());
        assert!(info.truncated.is_some());
    }

    #[test]
    fn corrupt_blocks_are_errors_not_panics() {
        let mut bytes = write(&records());
        let dir = std::env::temp_dir();
        let path = dir.join(format!(
            "allocview-binary-corrupt-{}.avt",
            std::process::id()
        ));
        // Flip every byte after the header in turn; reading must never panic.
        for i in 10..bytes.len() {
            bytes[i] ^= 0x5a;
            std::fs::write(&path, &bytes).unwrap();
            let _ = read_records(&path, TimeBase::default(), |_| Ok(()));
            bytes[i] ^= 0x5a;
        }
        std::fs::remove_file(&path).ok();
    }

    fn spool(segments: &[(u32, u64, u64, i64, Vec<u8>)], meta: &str) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend([VERSION, KIND_SPOOL]);
        write_frame(&mut out, FRAME_META, &[meta.as_bytes()]).unwrap();
        for (stream, tid, tick, ns, events) in segments {
            let mut head = Vec::new();
            head.extend(stream.to_le_bytes());
            head.extend(tid.to_le_bytes());
            head.extend(tick.to_le_bytes());
            head.extend(ns.to_le_bytes());
            write_frame(&mut out, FRAME_SEGMENT, &[&head, events]).unwrap();
        }
        out
    }

    fn spool_event(
        out: &mut Vec<u8>,
        prev: &mut (u64, u64),
        op: u8,
        tick: u64,
        size: u64,
        addr: u64,
    ) {
        out.push(op);
        put_varint(out, zigzag(tick.wrapping_sub(prev.0) as i64));
        if op & OP_FREE == 0 {
            put_varint(out, size);
        }
        put_varint(out, zigzag(addr.wrapping_sub(prev.1) as i64));
        *prev = (tick, addr);
    }

    /// An event in the tracer's compact encoding (META `events=2`), with a time change first
    /// when the time differs from the stream's previous event.
    fn compact_event(
        out: &mut Vec<u8>,
        prev: &mut (u64, u64),
        op: u8,
        tick: u64,
        size: u64,
        addr: u64,
    ) {
        if tick != prev.0 {
            out.push(OP_TIME);
            put_varint(out, zigzag(tick.wrapping_sub(prev.0) as i64));
        }
        let delta = zigzag(addr.wrapping_sub(prev.1) as i64);
        let len = (71 - delta.leading_zeros() as usize) / 8;
        let (code, len) = if len >= 7 { (7, 8) } else { (len, len) };
        out.push(op | ((code as u8) << OP_ADDR_SHIFT));
        if op & OP_FREE == 0 {
            assert!(size < 1 << 56);
            let bits = 64 - (size | 1).leading_zeros() as usize;
            let n = bits.div_ceil(7);
            let word = (size << n) | (1 << (n - 1));
            out.extend(&word.to_le_bytes()[..n]);
        }
        out.extend(&delta.to_le_bytes()[..len]);
        *prev = (tick, addr);
    }

    type Row = (i64, u64, Option<u64>, u64, Option<u8>);

    fn rows_of(records: &[Record]) -> Vec<Row> {
        records
            .iter()
            .map(|r| (r.t_ns, r.tid, r.size_bytes, r.addr, r.call))
            .collect()
    }

    const COMPACT_META: &str = "pid=5\ntick0=1000\nmono_ns0=1000\nrealtime_ns0=5000\n\
                                clock=monotonic_coarse_ns\nclock_resolution_ns=1000000\nevents=2\n";

    #[test]
    fn compact_spools_decode_sizes_addresses_and_time_changes() {
        let mut a = Vec::new();
        let mut pa = (0, 0);
        compact_event(&mut a, &mut pa, 0, 1000, 16, 0x5555_0000_1000);
        compact_event(&mut a, &mut pa, 3 | OP_FREE, 1000, 0, 0x5555_0000_1000);
        compact_event(&mut a, &mut pa, 1, 2_001_000, 300, 0x5555_0000_1000);
        compact_event(&mut a, &mut pa, 0, 2_001_000, (1 << 56) - 1, 0);
        compact_event(&mut a, &mut pa, 2, 2_001_000, 7, u64::MAX);
        let bytes = spool(&[(0, 10, 0, 0, a)], COMPACT_META);
        let (back, info) = read(&bytes);
        assert_eq!(info.truncated, None);
        assert_eq!(
            rows_of(&back),
            vec![
                (0, 10, Some(16), 0x5555_0000_1000, Some(0)),
                (0, 10, None, 0x5555_0000_1000, Some(3)),
                (2_000_000, 10, Some(300), 0x5555_0000_1000, Some(1)),
                (2_000_000, 10, Some((1 << 56) - 1), 0, Some(0)),
                (2_000_000, 10, Some(7), u64::MAX, Some(2)),
            ]
        );
    }

    #[test]
    fn events_of_one_time_are_ordered_by_causality_across_threads() {
        // One clock period: thread 10 (the lower stream) allocates x twice; thread 20 frees x
        // in between and then allocates y, which thread 10 frees. Merging by time and then
        // stream would give thread 10's second allocation of x while x is live.
        let (x, y) = (0x1000, 0x2000);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let (mut pa, mut pb) = ((0, 0), (0, 0));
        compact_event(&mut a, &mut pa, 0, 1000, 32, x);
        compact_event(&mut a, &mut pa, 0, 1000, 48, x);
        compact_event(&mut a, &mut pa, 3 | OP_FREE, 1000, 0, y);
        compact_event(&mut b, &mut pb, 3 | OP_FREE, 1000, 0, x);
        compact_event(&mut b, &mut pb, 0, 1000, 64, y);
        // A free of a pointer allocated before tracing started: it fits anywhere.
        compact_event(&mut b, &mut pb, 3 | OP_FREE, 1000, 0, 0x9000);
        let bytes = spool(&[(1, 20, 0, 0, b), (0, 10, 0, 0, a)], COMPACT_META);
        let (back, _) = read(&bytes);
        let got: Vec<(u64, Option<u64>, u64)> =
            back.iter().map(|r| (r.tid, r.size_bytes, r.addr)).collect();
        assert_eq!(got.len(), 6);
        let at = |row: (u64, Option<u64>, u64)| got.iter().position(|&g| g == row).unwrap();
        // x: allocated, freed by the other thread, allocated again.
        assert!(at((10, Some(32), x)) < at((20, None, x)));
        assert!(at((20, None, x)) < at((10, Some(48), x)));
        // y: allocated by thread 20 before thread 10 frees it.
        assert!(at((20, Some(64), y)) < at((10, None, y)));
        // Each thread's own order is kept.
        let order = |tid: u64| -> Vec<usize> {
            (0..got.len())
                .filter(|&i| got[i].0 == tid)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            order(10),
            vec![
                at((10, Some(32), x)),
                at((10, Some(48), x)),
                at((10, None, y))
            ]
        );
        assert_eq!(
            order(20),
            vec![
                at((20, None, x)),
                at((20, Some(64), y)),
                at((20, None, 0x9000))
            ]
        );
        // Loaded, the trace has no inconsistency.
        let dir = std::env::temp_dir().join(format!("allocview-causal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("handover.spool");
        std::fs::write(&path, &bytes).unwrap();
        let t = load_binary(&path, &LoadOptions::default()).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(t.summary.mallocs_of_live_ptr, 0);
        assert_eq!(
            t.summary.frees_unknown, 1,
            "only the pointer from before tracing"
        );
        assert_eq!(t.summary.timestamps_non_monotonic, 0);
    }

    /// A stream's encoder state for keyed spools (META `events=3`): time, address, key, and
    /// whether the stream has switched to keyed events.
    #[derive(Default)]
    struct KeyedStream {
        prev: (u64, u64),
        key: u64,
        keyed: bool,
    }

    /// An event as the tracer writes it once several threads record: the switch to keyed
    /// events when the stream has not made it yet, the compact event, then the key's
    /// difference from the stream's previous key (zigzag, prefix varint).
    fn keyed_event(
        out: &mut Vec<u8>,
        s: &mut KeyedStream,
        op: u8,
        tick: u64,
        size: u64,
        addr: u64,
        key: Option<u64>,
    ) {
        let Some(key) = key else {
            assert!(!s.keyed, "a keyed stream stays keyed");
            compact_event(out, &mut s.prev, op, tick, size, addr);
            return;
        };
        if tick != s.prev.0 {
            out.push(OP_TIME);
            put_varint(out, zigzag(tick.wrapping_sub(s.prev.0) as i64));
            s.prev.0 = tick;
        }
        if !s.keyed {
            out.push(OP_KEYED);
            s.keyed = true;
        }
        compact_event(out, &mut s.prev, op, tick, size, addr);
        let dk = zigzag(key.wrapping_sub(s.key) as i64);
        let bits = 64 - (dk | 1).leading_zeros() as usize;
        let n = bits.div_ceil(7);
        assert!(n <= 8);
        out.extend(&((dk << n) | (1 << (n - 1))).to_le_bytes()[..n]);
        s.key = key;
    }

    const KEYED_META: &str = "pid=5\ntick0=1000\nmono_ns0=1000\nrealtime_ns0=5000\n\
                              clock=monotonic_coarse_ns\nclock_resolution_ns=1000000\nevents=3\n";

    #[test]
    fn keys_order_the_events_of_one_time_exactly() {
        // One clock period, two threads. Several orders fit the pointers' lives (b's life on
        // thread 20 could go before or after a's allocation); the keys say which happened.
        // Thread 10 also hands x over: allocated at key 10, freed by thread 20 at 40, then
        // allocated again by thread 10 at 60. Thread 20's stream is split in two segments,
        // and its keys go down once (TSC reads of one thread may differ by a few cycles from
        // their program order): its own order is kept.
        let (a, b, x) = (0x1000, 0x2000, 0x3000);
        let (mut t10, mut t20a, mut t20b) = (Vec::new(), Vec::new(), Vec::new());
        let (mut s10, mut s20) = (KeyedStream::default(), KeyedStream::default());
        keyed_event(&mut t10, &mut s10, 0, 1000, 16, x, Some(10));
        keyed_event(&mut t10, &mut s10, 0, 1000, 32, a, Some(50));
        keyed_event(&mut t10, &mut s10, 0, 1000, 48, x, Some(60));
        keyed_event(&mut t10, &mut s10, 3 | OP_FREE, 1000, 0, a, Some(90));
        keyed_event(&mut t20a, &mut s20, 0, 1000, 64, b, Some(20));
        keyed_event(&mut t20a, &mut s20, 3 | OP_FREE, 1000, 0, x, Some(40));
        keyed_event(&mut t20b, &mut s20, 3 | OP_FREE, 1000, 0, b, Some(38));
        let bytes = spool(
            &[(0, 10, 0, 0, t10), (1, 20, 0, 0, t20a), (1, 20, 0, 0, t20b)],
            KEYED_META,
        );
        let (back, info) = read(&bytes);
        assert_eq!(info.truncated, None);
        let got: Vec<(u64, Option<u64>, u64)> =
            back.iter().map(|r| (r.tid, r.size_bytes, r.addr)).collect();
        assert_eq!(
            got,
            vec![
                (10, Some(16), x),
                (20, Some(64), b),
                (20, None, x),
                (20, None, b),
                (10, Some(32), a),
                (10, Some(48), x),
                (10, None, a),
            ]
        );
    }

    #[test]
    fn in_the_period_keys_start_events_without_one_come_first() {
        // Thread 10 recorded alone until thread 20 started, in the middle of this period:
        // thread 10's first two events have no key, the rest of the period has keys. Thread 20
        // (the lower stream here) allocates x after thread 10 freed it, then frees y, which
        // thread 10 allocated with a key. In stream order, the free of y would come before
        // its allocation, and the allocation of x while x is live.
        let (x, y) = (0x1000, 0x2000);
        let (mut t10, mut t20) = (Vec::new(), Vec::new());
        let (mut s10, mut s20) = (KeyedStream::default(), KeyedStream::default());
        keyed_event(&mut t10, &mut s10, 0, 1000, 16, x, None);
        keyed_event(&mut t10, &mut s10, 3 | OP_FREE, 1000, 0, x, None);
        keyed_event(&mut t10, &mut s10, 0, 1000, 32, y, Some(500));
        keyed_event(&mut t20, &mut s20, 0, 1000, 48, x, Some(400));
        keyed_event(&mut t20, &mut s20, 3 | OP_FREE, 1000, 0, y, Some(600));
        // A later period: keyed events of both threads, ordered by time first.
        keyed_event(&mut t20, &mut s20, 3 | OP_FREE, 1_001_000, 0, x, Some(700));
        let bytes = spool(&[(0, 20, 0, 0, t20), (1, 10, 0, 0, t10)], KEYED_META);
        let (back, _) = read(&bytes);
        assert_eq!(
            rows_of(&back),
            vec![
                (0, 10, Some(16), x, Some(0)),
                (0, 10, None, x, Some(3)),
                (0, 20, Some(48), x, Some(0)),
                (0, 10, Some(32), y, Some(0)),
                (0, 20, None, y, Some(3)),
                (1_000_000, 20, None, x, Some(3)),
            ]
        );
        // The same events in a spool of the previous encoding are refused: a reader that
        // does not know keys cannot skip them.
        let old_meta = KEYED_META.replace("events=3", "events=2");
        let old = spool(&[(0, 20, 0, 0, Vec::from([OP_KEYED]))], &old_meta);
        let dir = std::env::temp_dir().join(format!("allocview-keyed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("old.spool");
        std::fs::write(&path, &old).unwrap();
        let res = read_records(&path, TimeBase::default(), |_| Ok(()));
        std::fs::remove_dir_all(&dir).ok();
        assert!(res.is_err());
    }

    #[test]
    fn a_later_time_never_goes_before_an_earlier_one_whatever_the_pointers() {
        // Thread 20's free of x is a period later than thread 10's second allocation of x:
        // times win (that recording is inconsistent; the loader reports it).
        let x = 0x1000;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let (mut pa, mut pb) = ((0, 0), (0, 0));
        compact_event(&mut a, &mut pa, 0, 1000, 32, x);
        compact_event(&mut a, &mut pa, 0, 1000, 48, x);
        compact_event(&mut b, &mut pb, 3 | OP_FREE, 1_001_000, 0, x);
        let bytes = spool(&[(0, 10, 0, 0, a), (1, 20, 0, 0, b)], COMPACT_META);
        let (back, _) = read(&bytes);
        assert_eq!(
            rows_of(&back),
            vec![
                (0, 10, Some(32), x, Some(0)),
                (0, 10, Some(48), x, Some(0)),
                (1_000_000, 20, None, x, Some(3)),
            ]
        );
    }

    #[test]
    fn spool_streams_merge_by_time_across_segments() {
        // Thread 10 allocates at ticks 100 and 300; thread 20 frees the first block at 200.
        // Stream 0 is split over two segments written after stream 1's.
        let (mut a1, mut a2, mut b) = (Vec::new(), Vec::new(), Vec::new());
        let mut pa = (0, 0);
        spool_event(&mut a1, &mut pa, 0, 100, 32, 0x1000);
        spool_event(&mut a2, &mut pa, 1, 300, 64, 0x2000);
        let mut pb = (0, 0);
        spool_event(&mut b, &mut pb, 3 | OP_FREE, 200, 0, 0x1000);
        let meta = "pid=5\ntick0=0\nmono_ns0=1000\nrealtime_ns0=5000\nclock=tsc\n";
        // Calibration: 2 ns per tick.
        let bytes = spool(
            &[
                (1, 20, 400, 1800, b),
                (0, 10, 350, 1700, a1),
                (0, 10, 500, 2000, a2),
            ],
            meta,
        );
        let (back, info) = read(&bytes);
        assert_eq!(info.kind, FileKind::Spool);
        let got = rows_of(&back);
        assert_eq!(
            got,
            vec![
                (200, 10, Some(32), 0x1000, Some(0)),
                (400, 20, None, 0x1000, Some(3)),
                (600, 10, Some(64), 0x2000, Some(1)),
            ]
        );
    }
}
