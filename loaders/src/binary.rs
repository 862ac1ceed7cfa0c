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
//! frame (as above, plus `tick0`, `mono_ns0`, `realtime_ns0` and `clock`, `tsc` or
//! `monotonic_ns`), then `0x10` SEGMENT frames, one per buffer flush of one thread: stream
//! u32, thread id u64, tick u64 and `CLOCK_MONOTONIC` ns i64 read together at the flush, then
//! events encoded as in a trace block but with no thread field (op bit 5 unused) and times in
//! ticks. A segment continues the deltas of the previous segment of its stream; a stream is one
//! thread's buffer from when it took the buffer. Reading a spool converts ticks to nanoseconds
//! with the line through (`tick0`, `mono_ns0`) and the segment calibration point with the
//! largest tick, then merges the streams by time into one ordered sequence.
//!
//! Varints are LEB128 (7 bits a byte, low first); zigzag maps 0, -1, 1, -2... to 0, 1, 2, 3...

use std::collections::{BinaryHeap, HashMap};
use std::io::{self, Read, Write};
use std::path::Path;
use std::time::Instant;

use crate::error::LoadError;
use crate::malloc_trace::{
    Builder, CALL_NAMES, Line, LoadOptions, MallocTrace, Record, Strictness,
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
        let v = self.varint()?;
        Some(((v >> 1) as i64) ^ -((v & 1) as i64))
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

/// One stream (a thread's buffer) of a spool while merging.
struct Stream<'a> {
    tid: u64,
    segments: Vec<&'a [u8]>,
    next_segment: usize,
    cur: Cursor<'a>,
    tick: u64,
    addr: u64,
}

/// A decoded spool event waiting in the merge.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Head {
    /// Negated so the max-heap pops the earliest; ties go to the lower stream (then its order).
    key: std::cmp::Reverse<(u64, usize)>,
}

struct SpoolEvent {
    tick: u64,
    op: u8,
    size: u64,
    addr: u64,
}

impl<'a> Stream<'a> {
    /// The stream's next event, moving to its next segment as needed.
    fn next(&mut self) -> Result<Option<SpoolEvent>, &'static str> {
        while self.cur.at_end() {
            let Some(seg) = self.segments.get(self.next_segment) else {
                return Ok(None);
            };
            self.next_segment += 1;
            self.cur = Cursor::new(seg);
        }
        let c = &mut self.cur;
        let op = c.u8().ok_or("a cut event")?;
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
        self.addr = self
            .addr
            .wrapping_add(c.zigzag().ok_or("a cut address")? as u64);
        Ok(Some(SpoolEvent {
            tick: self.tick,
            op,
            size,
            addr: self.addr,
        }))
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
                        tid,
                        segments: Vec::new(),
                        next_segment: 0,
                        cur: Cursor::new(&[]),
                        tick: 0,
                        addr: 0,
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
    let mut heap: BinaryHeap<Head> = BinaryHeap::with_capacity(streams.len());
    let mut pending: Vec<Option<SpoolEvent>> = Vec::with_capacity(streams.len());
    for (i, s) in streams.iter_mut().enumerate() {
        let ev = s.next().map_err(|e| corrupt(path, 0, e))?;
        if let Some(ev) = &ev {
            heap.push(Head {
                key: std::cmp::Reverse((ev.tick, i)),
            });
        }
        pending.push(ev);
    }
    while let Some(Head {
        key: std::cmp::Reverse((_, i)),
    }) = heap.pop()
    {
        let (Some(slot), Some(stream)) = (pending.get_mut(i), streams.get_mut(i)) else {
            break;
        };
        let Some(ev) = slot.take() else { continue };
        let call = call_of(ev.op).ok_or_else(|| corrupt(path, 0, "unknown call code"))?;
        f(&Record {
            t_ns: to_ns(ev.tick),
            tid: stream.tid,
            size_bytes: (ev.op & OP_FREE == 0).then_some(ev.size),
            addr: ev.addr,
            call,
        })
        .map_err(|e| corrupt(path, 0, e))?;
        info.records += 1;
        let next = match stream.next() {
            Ok(n) => n,
            // A cut last event (the tracer was killed mid-write) ends the stream.
            Err(_) if info.truncated.is_some() => None,
            Err(e) => return Err(corrupt(path, 0, e)),
        };
        if let Some(n) = &next {
            heap.push(Head {
                key: std::cmp::Reverse((n.tick, i)),
            });
        }
        *slot = next;
    }
    Ok(info)
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
        type Row = (i64, u64, Option<u64>, u64, Option<u8>);
        let got: Vec<Row> = back
            .iter()
            .map(|r| (r.t_ns, r.tid, r.size_bytes, r.addr, r.call))
            .collect();
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
