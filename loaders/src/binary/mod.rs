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
//!   One key changes what the stacks mean: `stack_sample_bytes=R` (a spool's and a trace's,
//!   from `record --stack-sample`) says that only the allocations sampled by bytes, a mean of
//!   one every R bytes, carry a stack (the others stack id 0); figures by site weigh them
//!   (`analysis/sampling.rs`). The events are all there either way.
//!   Another changes how events are counted: `started_mid_run=1` (a recording that began after
//!   the program started: `allocview attach`, `record --paused`) says that frees of blocks the
//!   trace never saw allocated are expected; they are counted as frees of blocks allocated
//!   before recording started, not as unknown frees ([`META_STARTED_MID_RUN`]). A spool's
//!   META may carry it too; converting a spool keeps it.
//! - `0x02` THREADS: varint `n`, then `n` varint thread ids; appends them to the threads table
//!   (the first thread introduced is index 0). A thread is introduced before its first event.
//! - `0x03` EVENTS: codec u8 (0 = stored, 1 = zstd), varint `events`, varint `raw_bytes`,
//!   then the (compressed) bytes. Decoded, a block holds `events` events, each:
//!   an op byte (bits 0-3: call code, an index into [`CALL_NAMES`](crate::events::CALL_NAMES), or 15 for a record
//!   without a call name; bit 4: a free, size -1 in the text form; bit 5: the thread changes;
//!   bit 6: a stack id follows; bit 7: a heap id follows), then the thread index as a varint if bit 5 is
//!   set, the time as a zigzag varint of its difference from the previous event's, the size as
//!   a varint unless the event is a free, the address as a zigzag varint of its difference
//!   from the previous event's, the stack id as a varint if bit 6 is set, and the heap id as
//!   a varint (never 0) if bit 7 is set. An event without bit 7 belongs to heap 0, the malloc
//!   family's; other heaps are the program's own (`allocview.h`, see `heaps.rs`), and every
//!   address delta runs across all heaps. Every block starts from time 0, address 0 and thread 0, so blocks decode on
//!   their own. Times are nanoseconds.
//! - `0x04` END: varint total events. A file without it was cut short (the loader loads what
//!   is there and says so).
//! - `0x05` MODULES, `0x06` LOCATIONS, `0x07` STACKS, `0x08` SYMBOLS: the call stacks of a
//!   trace recorded with stacks, anywhere before END: after the last EVENTS frame, and in a
//!   trace written while its program ran, between blocks too (see `stacks/`).
//! - `0x0a` MEMORY and `0x0b` MAPPINGS, the recorded program's own memory (`memory.rs`), and
//!   `0x0c` MARKS, the run's marks (`marks.rs`), after the last EVENTS frame; a trace written
//!   while its program ran (`record`, for a reader following it) also has MEMORY and MARKS
//!   frames between its blocks, each with what came since the last: the frames of a kind add
//!   up, in file order. A spool has one frame per sample, call or mark instead (`0x14`,
//!   `0x15`, `0x16`).
//! - `0x09` INDEX, just before END: the threads table and, per EVENTS block, its file
//!   offset, event count and time span, ending in the index frame's own offset so it is found
//!   from the end of the file (see `index.rs`). Files written before it existed have none and
//!   are indexed by reading their frames once; readers that predate it skip it.
//! - `0x0E` HEAPS: the names of the heaps other than malloc's that the events use (see
//!   `heaps.rs`): varint `n`, then `n` entries of varint heap id, varint name length, UTF-8
//!   name. Anywhere after META, any number of them; a later entry for an id renames it. A
//!   trace whose events are all malloc's has none (and is byte for byte what it was before
//!   heaps existed); a heap used by events and named by no entry is `heap-N`.
//!
//! A **spool** (kind 1) is what the LD_PRELOAD tracer writes while the program runs: a META
//! frame (as above, plus `tick0`, `mono_ns0`, `realtime_ns0`, `clock`, and in the current
//! tracer's spools `clock_resolution_ns` and `events`), then `0x10` SEGMENT frames, one per
//! buffer flush of one thread: stream u32, thread id u64, tick u64 and `CLOCK_MONOTONIC` ns i64
//! read together at the flush, then events. A segment continues the deltas of the previous
//! segment of its stream; a stream is one thread's buffer from when it took the buffer, and
//! streams are numbered in the order threads took their buffers. Current tracers also write a
//! `0x12` FLUSHED frame (a flush mark: tick u64) after each periodic flush of every buffer:
//! a thread's events of an earlier time are in the file before it, unless the thread read the
//! time and was held up before writing its event (`spool/live.rs` reads a spool while it is
//! written up to the next-to-last mark, and notices such a late event).
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
//! - In encodings `3` and later, the op byte `0x1b` is a heap prefix: a prefix varint heap
//!   id (not 0) follows, and the stream's next event belongs to that heap instead of the
//!   malloc family's (heap 0); time changes and key switches may come between the prefix and
//!   its event. `0x18` HEAPS frames (varint heap id, then the UTF-8 name to the frame's end)
//!   name the heaps, anywhere in the spool; a later frame for an id renames it. A spool whose
//!   program reports no heap of its own has neither.
//! - `4` (call stacks): as `3`, and every allocation carries a stack id after its address
//!   (prefix varint, 0 = none), streams hold stack definitions (op byte `0x0d`), and `0x11`
//!   MODULE frames give the module map (see `stacks.rs`).
//! - `5` and `6`: as `3` and `4`, and a stream may switch back to events without keys (op byte
//!   `0x0c`) and to keys again (`0x0e`), any number of times: once several threads record,
//!   the first thread to record in a clock period owns it and records without keys until
//!   another thread records in the period; from then on every event of the period has a key.
//!   Within a time, each stream's events without a key come before its keyed ones. With the
//!   META line `order_keys=tsc` (the machine's keys order every thread's events, so keys
//!   start as soon as a second thread records), no time after that start has events without
//!   a key from two threads: a reading while the tracer writes then keeps no live pointers
//!   past it, even when no period is ever shared.
//!
//! Reading a spool converts ticks to nanoseconds with the line through (`tick0`, `mono_ns0`)
//! and the segment calibration point with the largest tick (slope 1 unless `clock=tsc`), then
//! merges the streams by time into one ordered sequence (a free reads the clock before the
//! real call and an allocation after it, so a free never has a later time than the
//! allocation that reuses its address in another thread). With a coarse clock, many events of
//! several threads share a time. Events with order keys are merged by key, each thread in its
//! own order (`Merge::merge_by_key`), after the owner's events of that time that have none:
//! exact. Events without keys of several threads (spools of encoding 2, the period in which
//! a second thread started, machines without usable keys) are ordered by
//! causality: each thread's own order, no allocation before the free of its address, no free
//! before its allocation (see `Merge::interleave`), a search that can give up under heavy
//! hand-over of blocks between threads.
//!
//! Varints are LEB128 (7 bits a byte, low first); zigzag maps 0, -1, 1, -2... to 0, 1, 2, 3...
//!
//! The code follows the format's seams: `codec` (byte cursor, varints, zigzag), `frames`
//! (the header and the frames of either kind, read and written), `trace` (reading a trace's
//! frames and decoding its event blocks), `write` ([`BinaryWriter`]), and `spool` (a spool's
//! streams and their merge into one ordered sequence, in `spool/merge.rs`).

use std::io::Read as _;
use std::path::Path;
use std::time::Instant;

use crate::analysis::sampling::StackSampling;
use crate::error::LoadError;
use crate::events::{Builder, Damage, Line, LoadOptions, MallocTrace, Record, Strictness};
use crate::sites::{NO_STACK, stack_id_column};

mod block;
pub mod codec;
pub mod crafted;
mod frames;
mod heaps;
mod index;
pub mod marks;
pub mod memory;
mod spool;
mod stacks;
mod stream;
#[cfg(test)]
mod tests;
mod trace;
mod verify;
mod write;

use frames::{Frames, read_header};
pub use heaps::{
    HeapFigures, HeapName, MALLOC_HEAP, MAX_HEAP_NAME_BYTES, heap_figures, heap_names, resolve_heap,
};
pub use index::{
    BlockEntry, BlockIndex, read_index, read_index_frame, read_mappings, read_marks, read_memory,
};
pub use marks::{Mark, MarkKind};
pub use memory::{MapCall, Mapping, MemorySample};
use spool::read_spool;
pub use spool::{LivePoll, LiveSpool};
pub use stacks::{
    Location, NativeModule, NativeStack, NativeStacks, PYTHON_FRAMES_MODULE, SourceFrame, StackEnd,
    StacksWritten,
};
pub use stream::{BinaryEventStream, PackedStreamPoint, StreamPoint};
use trace::{read_trace, read_trace_staged};
pub use verify::block_events;
pub use write::BinaryWriter;

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
/// Tag of the INDEX frame.
const FRAME_INDEX: u8 = 0x09;
const CODEC_STORED: u8 = 0;
const CODEC_ZSTD: u8 = 1;
const OP_CALL_MASK: u8 = 0x0f;
const OP_NO_CALL: u8 = 0x0f;
const OP_FREE: u8 = 0x10;
const OP_THREAD: u8 = 0x20;
/// Op bit 6 of a trace event: a stack id follows the address.
const OP_STACK: u8 = 0x40;
/// Op bit 7 of a trace event: a heap id follows the stack id (see `heaps.rs`).
const OP_HEAP: u8 = 0x80;
/// Events per EVENTS block written: also the most a reader accepts in one block (the format
/// has never been written with more), so a block's decoded size is bounded however its header
/// or its zstd frame lies.
const BLOCK_EVENTS: u32 = 1 << 16;
/// Longest encoding of one event the writer produces: the op byte, the thread index (below
/// [`MAX_THREADS`](crate::events::MAX_THREADS) = 2^16: three varint bytes), the time and
/// address deltas and the size (ten varint bytes each at most), the stack id and the heap id
/// (u32s: five each).
const MAX_EVENT_BYTES: usize = 1 + 3 + 10 + 10 + 10 + 5 + 5;
/// Most decoded bytes of one EVENTS block a reader accepts: what the writer can produce.
const MAX_BLOCK_RAW_BYTES: usize = BLOCK_EVENTS as usize * MAX_EVENT_BYTES;
/// zstd level for blocks: fast to write (`record` converts while the program runs and must
/// keep pace; level 3 took about twice the compression time for files 3 to 16% smaller), and
/// decoding speed barely depends on it.
const ZSTD_LEVEL: i32 = 1;
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
    /// Damaged stretches of a trace that were repaired or skipped (lenient reads only: a
    /// strict read stops at the first with an error).
    pub damaged: Vec<Damage>,
    /// Events lost to the damage, as the END frame's count minus the events read; `None` when
    /// nothing was damaged or the file has no END frame to count with.
    pub events_lost: Option<u64>,
    /// The call stacks, for a file recorded with stacks (see `stacks.rs`).
    pub stacks: Option<NativeStacks>,
    /// The recorded program's resident memory over time ([`memory`]), in time order.
    pub memory: Vec<MemorySample>,
    /// The mapping calls the recorded program made outside the allocator, in time order.
    pub mappings: Vec<Mapping>,
    /// The run's marks ([`marks`]), in time order.
    pub marks: Vec<Mark>,
    /// The names of the program's own heaps (HEAPS frames), by id, the latest for an id.
    pub heaps: Vec<HeapName>,
}

impl BinaryInfo {
    /// What reading a file of `kind` found before its first frame.
    pub(crate) fn empty(kind: FileKind) -> Self {
        Self {
            kind,
            meta: Vec::new(),
            records: 0,
            truncated: None,
            damaged: Vec::new(),
            events_lost: None,
            stacks: None,
            memory: Vec::new(),
            mappings: Vec::new(),
            marks: Vec::new(),
            heaps: Vec::new(),
        }
    }

    /// The META lines say the recording began in the middle of the run
    /// ([`META_STARTED_MID_RUN`]).
    #[must_use]
    pub fn started_mid_run(&self) -> bool {
        started_mid_run(&self.meta)
    }

    /// The first value of a META key.
    #[must_use]
    pub fn meta_value(&self, key: &str) -> Option<&str> {
        self.meta
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The META key of a recording that began after the program started (value `1`): frees of
/// blocks the trace never saw allocated are expected
/// ([`LoadSummary::mark_started_mid_run`](crate::events::LoadSummary::mark_started_mid_run)).
pub const META_STARTED_MID_RUN: &str = "started_mid_run";

/// True when META lines say the recording began in the middle of the run.
#[must_use]
pub fn started_mid_run(meta: &[(String, String)]) -> bool {
    meta.iter()
        .any(|(k, v)| k == META_STARTED_MID_RUN && v.trim() == "1")
}

/// The META lines of a binary trace or spool (its first frame; none when it has no META
/// frame), read without reading the rest of the file.
///
/// # Errors
/// When the file cannot be read or is not in this format.
pub fn read_meta(path: &Path) -> Result<Vec<(String, String)>, LoadError> {
    let mut file = std::fs::File::open(path).map_err(|e| LoadError::io(path, e))?;
    let mut head = [0u8; 15];
    let mut got = 0;
    while got < head.len() {
        match file.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(LoadError::io(path, e)),
        }
    }
    read_header(path, &head[..got])?;
    let (Some(&FRAME_META), Some(len)) = (head.get(10), head.get(11..15)) else {
        return Ok(Vec::new());
    };
    let len = <[u8; 4]>::try_from(len).map_or(0, u32::from_le_bytes);
    // The frame's own length, bounded: the text read is only as long as the file holds.
    let len = u64::from(len).min(MAX_FRAME_BYTES as u64);
    let mut text = Vec::new();
    file.take(len)
        .read_to_end(&mut text)
        .map_err(|e| LoadError::io(path, e))?;
    Ok(frames::parse_meta(&text))
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

/// Calls `f` on every record of a binary trace or spool, in order (a spool's threads merged by
/// time), reading strictly: see [`read_records_with`].
///
/// # Errors
/// As [`read_records_with`] in strict mode.
pub fn read_records(
    path: &Path,
    base: TimeBase,
    f: impl FnMut(&Record) -> Result<(), &'static str>,
) -> Result<BinaryInfo, LoadError> {
    read_records_with(path, base, Strictness::Strict, f)
}

/// Calls `f` on every record of a binary trace or spool, in order (a spool's threads merged by
/// time). `f`'s error stops the read and is reported with the record's position. Damage in
/// the middle of a trace is an error in strict mode; in lenient mode it is repaired or
/// skipped, and reported in [`BinaryInfo::damaged`] and [`BinaryInfo::events_lost`].
///
/// # Errors
/// When the file cannot be read, is not in this format, or is corrupt (a cut last frame is not
/// an error: see [`BinaryInfo::truncated`]).
pub fn read_records_with(
    path: &Path,
    base: TimeBase,
    strictness: Strictness,
    mut f: impl FnMut(&Record) -> Result<(), &'static str>,
) -> Result<BinaryInfo, LoadError> {
    let (bytes, kind) = read_file(path)?;
    read_frames_of(path, &bytes, kind, base, strictness, &mut f)
}

/// The whole file and its kind (its header checked).
fn read_file(path: &Path) -> Result<(Vec<u8>, FileKind), LoadError> {
    let bytes = std::fs::read(path).map_err(|e| LoadError::io(path, e))?;
    let kind = read_header(path, &bytes)?;
    Ok((bytes, kind))
}

/// [`read_records_with`] on the file's bytes, read already.
fn read_frames_of(
    path: &Path,
    bytes: &[u8],
    kind: FileKind,
    base: TimeBase,
    strictness: Strictness,
    f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
) -> Result<BinaryInfo, LoadError> {
    let frames = bytes.get(10..).unwrap_or(&[]);
    match kind {
        FileKind::Trace => read_trace(path, frames, strictness, f),
        FileKind::Spool => read_spool(
            path,
            Frames {
                bytes: frames,
                pos: 0,
            },
            base,
            f,
        ),
    }
}

/// Reads every record of `path` into `b`. A trace's records are paired on the thread that
/// decodes its blocks while `b`'s columns are filled here (see [`read_trace_staged`]); a
/// spool's streams are merged first, so its records go through [`Builder::push`].
fn read_into(path: &Path, opts: &LoadOptions, b: &mut Builder) -> Result<BinaryInfo, LoadError> {
    let (strictness, requests, heap) = (opts.strictness, opts.requests, opts.heap);
    let (bytes, kind) = read_file(path)?;
    if kind == FileKind::Spool {
        let base = TimeBase::default();
        let push = &mut |r: &Record| match Line::of_record(r, requests, heap, &mut b.summary) {
            Some(line) => b.push(&line),
            None => Ok(()),
        };
        return read_frames_of(path, &bytes, kind, base, strictness, push);
    }
    let (mut maker, mut summary) = b.split();
    let read = read_trace_staged(
        path,
        bytes.get(10..).unwrap_or(&[]),
        strictness,
        |r: &Record, out: &mut Vec<_>| match Line::of_record(r, requests, heap, &mut summary) {
            Some(line) => maker.make(&mut summary, &line, |row| out.push(row)),
            None => Ok(()),
        },
        &mut |row| b.push_row(row),
    );
    b.rejoin(maker, summary);
    read
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
    let info = read_into(path, opts, &mut b);
    let info = match (info, opts.strictness) {
        (Ok(info), _) => info,
        (Err(e), Strictness::Strict) => return Err(e),
        (Err(e), Strictness::Lenient) => {
            // Keep what came before the damage.
            b.summary.truncated = Some(e.to_string());
            BinaryInfo {
                records: b.summary.events,
                ..BinaryInfo::empty(FileKind::Trace)
            }
        }
    };
    if let Some(p) = &opts.progress {
        p.store(file_bytes, std::sync::atomic::Ordering::Relaxed);
    }
    let sampling = StackSampling::from_meta(info.meta_value("stack_sample_bytes"));
    if info.truncated.is_some() {
        b.summary.truncated = info.truncated;
    }
    b.summary.damaged = info.damaged;
    b.summary.events_lost = info.events_lost;
    if info.meta.is_empty() {
        // A damaged file read leniently may have lost its META with the error: read it alone.
        if read_meta(path).is_ok_and(|m| started_mid_run(&m)) {
            b.summary.mark_started_mid_run();
        }
    } else if started_mid_run(&info.meta) {
        b.summary.mark_started_mid_run();
    }
    if marks::recording_stopped(&info.marks) {
        // Blocks allocated while recording was stopped are freed unseen, as before a start.
        b.summary.mark_started_mid_run();
    }
    let file_stacks = b.take_stacks();
    let (mut events, threads, summary) = b.finish()?;
    let stacks = match (info.stacks, file_stacks) {
        (Some(native), ids) => {
            let (table, map) = native.to_table();
            let ids = ids.unwrap_or_else(|| vec![NO_STACK; events.height()]);
            let ids = ids
                .into_iter()
                .map(|id| map.get(&id).copied().unwrap_or(NO_STACK))
                .collect();
            events.with_column(stack_id_column("stack_id", ids))?;
            let mut table = table;
            table.set_sampling(sampling);
            Some(table)
        }
        (None, _) => None,
    };
    Ok(MallocTrace {
        events,
        threads,
        summary,
        load_seconds: started.elapsed().as_secs_f64(),
        stacks,
        memory: info.memory,
        memory_series: crate::events::RecordedSeries::ProcessResident,
        mappings: info.mappings,
        marks: info.marks,
    })
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
