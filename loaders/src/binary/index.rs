//! The block index of a trace (kind 0): where every EVENTS block is, how many events it holds
//! and the times it spans, so that any event is reached by reading one block, and a replay
//! knows the trace's extent before reading it.
//!
//! Written by [`super::BinaryWriter`] as an `0x09` INDEX frame just before END:
//!
//! ```text
//! varint threads, then that many varint thread ids   (the whole threads table)
//! varint blocks, then per block:
//!   varint  file offset of its EVENTS frame, minus the previous block's (0 before the first)
//!   varint  events
//!   zigzag  its first event's time minus the previous block's first time
//!   zigzag  its largest time minus its first time
//! u64 LE    file offset of this INDEX frame
//! ```
//!
//! The last eight bytes lead from the END frame (the file's last) to the index without
//! reading anything else. A file without an index (written before it existed, or cut short)
//! is indexed by reading its frames once ([`scan_index`]).

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

use super::codec::{Cursor, put_varint, zigzag};
use super::frames::read_header;
use super::{
    FRAME_END, FRAME_EVENTS, FRAME_INDEX, FRAME_THREADS, FileKind, MAX_FRAME_BYTES, corrupt,
};
use crate::error::LoadError;
use crate::events::Record;

/// Bytes of the file header before the first frame.
const HEADER_BYTES: u64 = 10;
/// Bytes of a frame header: tag u8, length u32.
const FRAME_HEADER_BYTES: u64 = 5;

/// One EVENTS block of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockEntry {
    /// File offset of the block's EVENTS frame (its tag byte).
    pub offset: u64,
    /// Number of events before the block (the index of its first event, as stored).
    pub first_record: u64,
    pub records: u64,
    /// Time of its first record, as stored (before the loader clamps times that go back).
    pub first_t_ns: i64,
    /// Largest time of its records, as stored.
    pub max_t_ns: i64,
}

/// Where every block of a trace is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockIndex {
    /// Thread ids in the order the file introduces them (the thread indices of its events).
    pub threads: Vec<u64>,
    pub blocks: Vec<BlockEntry>,
    /// True when read from the file's INDEX frame, false when built by scanning its frames.
    pub from_frame: bool,
    /// Why a scan stopped before the file's END frame (a cut file: the blocks before the cut
    /// are indexed), for the stream to say so as the loader does.
    pub cut: Option<String>,
}

impl BlockIndex {
    /// Records in the trace.
    #[must_use]
    pub fn records(&self) -> u64 {
        self.blocks.last().map_or(0, |b| b.first_record + b.records)
    }

    /// The block holding record `record`, if any.
    #[must_use]
    pub fn block_of(&self, record: u64) -> Option<usize> {
        let k = self
            .blocks
            .partition_point(|b| b.first_record + b.records <= record);
        (k < self.blocks.len()).then_some(k)
    }

    /// The first record's time and the largest time, as stored; `None` for an empty trace.
    #[must_use]
    pub fn time_span(&self) -> Option<(i64, i64)> {
        let first = self.blocks.first()?.first_t_ns;
        let last = self.blocks.iter().map(|b| b.max_t_ns).max()?;
        Some((first, last))
    }

    /// The INDEX frame's payload, for a frame written at `frame_offset`.
    pub(super) fn encode(&self, frame_offset: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + 8 * self.blocks.len());
        put_varint(&mut out, self.threads.len() as u64);
        for &tid in &self.threads {
            put_varint(&mut out, tid);
        }
        put_varint(&mut out, self.blocks.len() as u64);
        let (mut prev_offset, mut prev_t) = (0u64, 0i64);
        for b in &self.blocks {
            put_varint(&mut out, b.offset - prev_offset);
            put_varint(&mut out, b.records);
            put_varint(&mut out, zigzag(b.first_t_ns.wrapping_sub(prev_t)));
            put_varint(&mut out, zigzag(b.max_t_ns.wrapping_sub(b.first_t_ns)));
            prev_offset = b.offset;
            prev_t = b.first_t_ns;
        }
        out.extend_from_slice(&frame_offset.to_le_bytes());
        out
    }

    pub(super) fn decode(payload: &[u8]) -> Result<Self, String> {
        let body = payload
            .len()
            .checked_sub(8)
            .and_then(|n| payload.get(..n))
            .ok_or("an index shorter than its trailer")?;
        let mut c = Cursor::new(body);
        let n_threads = c.varint().ok_or("a cut thread count")?;
        if n_threads > body.len() as u64 {
            return Err(format!(
                "{n_threads} threads in a {}-byte index",
                body.len()
            ));
        }
        let mut threads = Vec::with_capacity(n_threads as usize);
        for _ in 0..n_threads {
            threads.push(c.varint().ok_or("a cut thread id")?);
        }
        let n_blocks = c.varint().ok_or("a cut block count")?;
        // Each entry takes at least four bytes.
        if n_blocks > body.len() as u64 / 4 {
            return Err(format!("{n_blocks} blocks in a {}-byte index", body.len()));
        }
        let mut blocks = Vec::with_capacity(n_blocks as usize);
        let (mut offset, mut first_record, mut prev_t) = (0u64, 0u64, 0i64);
        for k in 0..n_blocks {
            let bad = || format!("block {k} of the index is cut");
            offset = offset
                .checked_add(c.varint().ok_or_else(bad)?)
                .ok_or_else(bad)?;
            let records = c.varint().ok_or_else(bad)?;
            let first_t_ns = prev_t.wrapping_add(c.zigzag().ok_or_else(bad)?);
            let max_t_ns = first_t_ns.wrapping_add(c.zigzag().ok_or_else(bad)?);
            blocks.push(BlockEntry {
                offset,
                first_record,
                records,
                first_t_ns,
                max_t_ns,
            });
            first_record = first_record.checked_add(records).ok_or_else(bad)?;
            prev_t = first_t_ns;
        }
        if !c.at_end() {
            return Err("bytes after the index's last block".into());
        }
        Ok(Self {
            threads,
            blocks,
            from_frame: true,
            cut: None,
        })
    }
}

/// Reads `len` bytes at `offset`.
pub(super) fn read_at(
    file: &File,
    path: &Path,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>, LoadError> {
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset)
        .map_err(|e| LoadError::io(path, e))?;
    Ok(buf)
}

/// The payload of the frame at `offset`, with its tag.
pub(super) fn frame_payload_at(
    file: &File,
    path: &Path,
    offset: u64,
    file_bytes: u64,
) -> Result<(u8, Vec<u8>), LoadError> {
    if offset + FRAME_HEADER_BYTES > file_bytes {
        return Err(corrupt(
            path,
            offset,
            "a frame header past the end of the file",
        ));
    }
    let head = read_at(file, path, offset, FRAME_HEADER_BYTES as usize)?;
    let tag = head.first().copied().unwrap_or(0);
    let len = head
        .get(1..5)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes) as usize;
    if len > MAX_FRAME_BYTES || offset + FRAME_HEADER_BYTES + len as u64 > file_bytes {
        return Err(corrupt(
            path,
            offset,
            &format!("a frame of {len} bytes runs past the end of the file"),
        ));
    }
    Ok((tag, read_at(file, path, offset + FRAME_HEADER_BYTES, len)?))
}

/// The INDEX frame reached from the end of the file, if the file ends with END after one.
fn index_from_tail(
    file: &File,
    path: &Path,
    file_bytes: u64,
) -> Result<Option<BlockIndex>, LoadError> {
    // END is tag, length u32 and a varint of 1 to 10 bytes; it is preceded by the index's
    // trailer (8 bytes).
    let tail_len = (FRAME_HEADER_BYTES + 10 + 8).min(file_bytes.saturating_sub(HEADER_BYTES));
    let tail = read_at(file, path, file_bytes - tail_len, tail_len as usize)?;
    for varint_len in 1..=10usize {
        let Some(end_at) = tail
            .len()
            .checked_sub(FRAME_HEADER_BYTES as usize + varint_len)
        else {
            break;
        };
        let Some(trailer_at) = end_at.checked_sub(8) else {
            break;
        };
        let header_ok = tail.get(end_at) == Some(&FRAME_END)
            && tail
                .get(end_at + 1..end_at + 5)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
                == Some(varint_len as u32);
        let varint_ok = tail.get(end_at + 5..).is_some_and(|v| {
            Cursor::new(v).varint().is_some() && v.last().is_some_and(|&b| b < 0x80)
        });
        if !(header_ok && varint_ok) {
            continue;
        }
        let Some(index_at) = tail
            .get(trailer_at..end_at)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
        else {
            continue;
        };
        let end_offset = file_bytes - tail_len + end_at as u64;
        if index_at < HEADER_BYTES || index_at >= end_offset {
            return Ok(None);
        }
        let (tag, payload) = frame_payload_at(file, path, index_at, file_bytes)?;
        if tag != FRAME_INDEX || index_at + FRAME_HEADER_BYTES + payload.len() as u64 != end_offset
        {
            return Ok(None);
        }
        let index = BlockIndex::decode(&payload)
            .map_err(|what| corrupt(path, index_at, &format!("the INDEX frame: {what}")))?;
        super::verify::verify(&index, file, path, file_bytes)?;
        return Ok(Some(index));
    }
    Ok(None)
}

/// The INDEX frame of the binary trace at `path`, `None` when it has none (reads the end of
/// the file, and the frame headers to check the index against the blocks).
///
/// # Errors
/// When the file cannot be read, is not a binary trace, or its INDEX frame does not read or
/// does not describe the file's blocks (see `verify`).
pub fn read_index_frame(path: &Path) -> Result<Option<BlockIndex>, LoadError> {
    let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
    let file_bytes = file.metadata().map_err(|e| LoadError::io(path, e))?.len();
    let head = read_at(&file, path, 0, HEADER_BYTES.min(file_bytes) as usize)?;
    if read_header(path, &head)? != FileKind::Trace {
        return Ok(None);
    }
    index_from_tail(&file, path, file_bytes)
}

/// The block index of the binary trace at `path`: its INDEX frame, or, for a file without one,
/// built by reading every frame once (each block decoded for its times).
///
/// # Errors
/// When the file cannot be read, is not a binary trace, or a frame does not read.
pub fn read_index(path: &Path) -> Result<BlockIndex, LoadError> {
    let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
    let file_bytes = file.metadata().map_err(|e| LoadError::io(path, e))?.len();
    let head = read_at(&file, path, 0, HEADER_BYTES.min(file_bytes) as usize)?;
    if read_header(path, &head)? != FileKind::Trace {
        return Err(LoadError::format(
            path,
            "a tracer spool has no block index: convert it to a trace first (allocview convert)",
        ));
    }
    if let Some(index) = index_from_tail(&file, path, file_bytes)? {
        return Ok(index);
    }
    scan_index(&file, path, file_bytes)
}

/// The recorded program's memory samples of a trace ([`super::memory`]), read without its
/// events: none in a trace without them.
///
/// # Errors
/// When the file cannot be read, is not a trace, or its MEMORY frame is damaged.
pub fn read_memory(path: &Path) -> Result<Vec<super::MemorySample>, LoadError> {
    read_table(
        path,
        super::memory::FRAME_MEMORY,
        super::memory::decode_frame,
        "a MEMORY frame",
    )
}

/// The mapping calls the recorded program made outside the allocator, read without the
/// trace's events: none in a trace without them.
///
/// # Errors
/// When the file cannot be read, is not a trace, or its MAPPINGS frame is damaged.
pub fn read_mappings(path: &Path) -> Result<Vec<super::Mapping>, LoadError> {
    read_table(
        path,
        super::memory::FRAME_MAPPINGS,
        super::memory::decode_mappings,
        "a MAPPINGS frame",
    )
}

/// The marks of a trace ([`super::marks`]), read without its events: none in a trace without
/// them.
///
/// # Errors
/// When the file cannot be read, is not a trace, or its MARKS frame is damaged.
pub fn read_marks(path: &Path) -> Result<Vec<super::Mark>, LoadError> {
    read_table(
        path,
        super::marks::FRAME_MARKS,
        super::marks::decode_frame,
        "a MARKS frame",
    )
}

/// The rows of every frame tagged `tag` ([`tagged_frames`]), decoded by `decode`, in file
/// order; `what` names the frame in errors.
fn read_table<T>(
    path: &Path,
    tag: u8,
    decode: fn(&[u8]) -> Result<Vec<T>, String>,
    what: &str,
) -> Result<Vec<T>, LoadError> {
    let mut out = Vec::new();
    for (at, payload) in tagged_frames(path, tag)? {
        out.extend(decode(&payload).map_err(|why| corrupt(path, at, &format!("{what}: {why}")))?);
    }
    Ok(out)
}

/// Every frame tagged `tag` before INDEX and END, with its offset, in file order: frame
/// headers only are read on the way. A trace written after its program ended has one of each
/// table after its last EVENTS block; one written while the program ran (`record`, followed
/// live) also has some between its blocks, which add up.
fn tagged_frames(path: &Path, tag: u8) -> Result<Vec<(u64, Vec<u8>)>, LoadError> {
    // Checks the file is a trace, and its index against its blocks.
    read_index(path)?;
    let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
    let file_bytes = file.metadata().map_err(|e| LoadError::io(path, e))?.len();
    let mut found = Vec::new();
    let mut offset = HEADER_BYTES;
    while offset + FRAME_HEADER_BYTES <= file_bytes {
        let head = read_at(&file, path, offset, FRAME_HEADER_BYTES as usize)?;
        let this = head.first().copied().unwrap_or(0);
        let len = head
            .get(1..5)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_le_bytes);
        if this == tag {
            let (_, payload) = frame_payload_at(&file, path, offset, file_bytes)?;
            found.push((offset, payload));
        }
        if this == super::FRAME_INDEX || this == super::FRAME_END {
            break;
        }
        offset += FRAME_HEADER_BYTES + u64::from(len);
    }
    Ok(found)
}

/// Builds the index of a file without an INDEX frame, reading its frames in order up to END,
/// the end of the file, or a frame cut short (a cut file: what is before it is indexed).
fn scan_index(file: &File, path: &Path, file_bytes: u64) -> Result<BlockIndex, LoadError> {
    let mut index = BlockIndex::default();
    let mut decoder = super::block::BlockDecoder::new(path)?;
    let mut records: Vec<Record> = Vec::new();
    let mut offset = HEADER_BYTES;
    let mut first_record = 0u64;
    let mut ended = false;
    while offset + FRAME_HEADER_BYTES <= file_bytes {
        let (tag, payload) = match frame_payload_at(file, path, offset, file_bytes) {
            Ok(frame) => frame,
            Err(e) => {
                index.cut = Some(e.to_string());
                break;
            }
        };
        match tag {
            FRAME_THREADS => {
                let mut c = Cursor::new(&payload);
                let n = c
                    .varint()
                    .ok_or_else(|| corrupt(path, offset, "a cut thread count"))?;
                for _ in 0..n.min(payload.len() as u64) {
                    let tid = c
                        .varint()
                        .ok_or_else(|| corrupt(path, offset, "a cut thread id"))?;
                    index.threads.push(tid);
                }
            }
            FRAME_EVENTS => {
                decoder
                    .decode(&payload, &index.threads, &mut records)
                    .map_err(|what| corrupt(path, offset, &format!("an EVENTS frame: {what}")))?;
                if let Some(first) = records.first() {
                    index.blocks.push(BlockEntry {
                        offset,
                        first_record,
                        records: records.len() as u64,
                        first_t_ns: first.t_ns,
                        max_t_ns: records.iter().map(|r| r.t_ns).max().unwrap_or(first.t_ns),
                    });
                    first_record += records.len() as u64;
                }
            }
            FRAME_END => {
                ended = true;
                break;
            }
            _ => {}
        }
        offset += FRAME_HEADER_BYTES + payload.len() as u64;
    }
    if !ended && index.cut.is_none() {
        index.cut = Some(format!(
            "the file ends at byte {offset} without its END frame"
        ));
    }
    Ok(index)
}

/// Decodes `block` (an entry of `index`) of the trace open as `file` into `out`.
///
/// # Errors
/// When the frame does not read or is not the EVENTS block the index says.
pub(super) fn read_block(
    file: &File,
    path: &Path,
    file_bytes: u64,
    index: &BlockIndex,
    block: &BlockEntry,
    decoder: &mut super::block::BlockDecoder,
    out: &mut Vec<Record>,
) -> Result<(), LoadError> {
    let (tag, payload) = frame_payload_at(file, path, block.offset, file_bytes)?;
    if tag != FRAME_EVENTS {
        return Err(corrupt(
            path,
            block.offset,
            &format!("the index names an EVENTS frame here, the file has tag 0x{tag:02x}"),
        ));
    }
    decoder
        .decode(&payload, &index.threads, out)
        .map_err(|what| corrupt(path, block.offset, &format!("an EVENTS frame: {what}")))?;
    if out.len() as u64 != block.records {
        return Err(corrupt(
            path,
            block.offset,
            &format!(
                "the index says {} events, the block holds {}",
                block.records,
                out.len()
            ),
        ));
    }
    // A stream lays out its timeline by the index's times before it reads the blocks: a lie
    // there (a block said to run to the far future) is found here, when the block is read.
    let first_t_ns = out.first().map_or(block.first_t_ns, |r| r.t_ns);
    let max_t_ns = out.iter().map(|r| r.t_ns).max().unwrap_or(block.max_t_ns);
    if (first_t_ns, max_t_ns) != (block.first_t_ns, block.max_t_ns) {
        return Err(corrupt(
            path,
            block.offset,
            &format!(
                "the index says the block's events run from {} ns to {} ns, they run from \
                 {first_t_ns} ns to {max_t_ns} ns",
                block.first_t_ns, block.max_t_ns
            ),
        ));
    }
    Ok(())
}
