//! Checks of a trace's blocks made from their frame headers alone (nothing decompressed): the
//! events they declare, for deciding whether a trace fits in memory before loading it
//! ([`block_events`]), and whether an INDEX frame describes the blocks it indexes
//! ([`verify`], for the stream, which trusts the index; [`check_loaded`], for the loader,
//! which reads the blocks in order and so sees what they are).

use std::fs::File;
use std::path::Path;

use super::block::BlockHeader;
use super::codec::Cursor;
use super::frames::read_header;
use super::index::{BlockEntry, BlockIndex, read_at};
use super::{FRAME_END, FRAME_EVENTS, FileKind, MAX_FRAME_BYTES, corrupt};
use crate::error::LoadError;

/// Bytes of the file header before the first frame.
const HEADER_BYTES: u64 = 10;
/// Bytes of a frame header: tag u8, length u32.
const FRAME_HEADER_BYTES: u64 = 5;

/// What a trace's frame headers say of its blocks, nothing decompressed: each EVENTS frame's
/// offset and the events its header declares, and the END frame's count.
struct BlockWalk {
    /// (file offset, events declared) of every EVENTS frame, in file order.
    blocks: Vec<(u64, u64)>,
    /// The END frame's offset and count.
    end: Option<(u64, u64)>,
    /// Where and why the walk stopped before END (a frame that does not read).
    stopped: Option<(u64, String)>,
}

impl BlockWalk {
    fn events(&self) -> u64 {
        self.blocks
            .iter()
            .fold(0u64, |sum, &(_, n)| sum.saturating_add(n))
    }
}

/// Reads every frame header of the trace open as `file`, and each EVENTS frame's block header
/// (refused when it claims more than the format's writer produces).
fn walk_blocks(file: &File, path: &Path, file_bytes: u64) -> Result<BlockWalk, LoadError> {
    let mut walk = BlockWalk {
        blocks: Vec::new(),
        end: None,
        stopped: None,
    };
    let mut offset = HEADER_BYTES;
    while offset + FRAME_HEADER_BYTES <= file_bytes {
        let head = read_at(file, path, offset, FRAME_HEADER_BYTES as usize)?;
        let tag = head.first().copied().unwrap_or(0);
        let len = head
            .get(1..5)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_le_bytes) as u64;
        let next = offset + FRAME_HEADER_BYTES + len;
        if len > MAX_FRAME_BYTES as u64 || next > file_bytes {
            let why = format!("a frame of {len} bytes runs past the end of the file");
            walk.stopped = Some((offset, why));
            return Ok(walk);
        }
        let peek = (len as usize).min(BlockHeader::MAX_BYTES);
        match tag {
            FRAME_EVENTS => {
                let payload = read_at(file, path, offset + FRAME_HEADER_BYTES, peek)?;
                let header = BlockHeader::read(&payload)
                    .map_err(|what| corrupt(path, offset, &format!("an EVENTS frame: {what}")))?;
                walk.blocks.push((offset, header.events));
            }
            FRAME_END => {
                let payload = read_at(file, path, offset + FRAME_HEADER_BYTES, peek)?;
                let total = Cursor::new(&payload)
                    .varint()
                    .ok_or_else(|| corrupt(path, offset, "a cut END frame"))?;
                walk.end = Some((offset, total));
                return Ok(walk);
            }
            _ => {}
        }
        offset = next;
    }
    Ok(walk)
}

/// Events in the blocks of the binary trace at `path`, as their headers declare them (the
/// events a load of it holds, or fewer if a block does not decode), read from the frame
/// headers alone; `None` for a spool. A block claiming more than the format holds is an error.
///
/// # Errors
/// When the file cannot be read, is not a binary file, or a block header is refused.
pub fn block_events(path: &Path) -> Result<Option<u64>, LoadError> {
    let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
    let file_bytes = file.metadata().map_err(|e| LoadError::io(path, e))?.len();
    let head = read_at(&file, path, 0, HEADER_BYTES.min(file_bytes) as usize)?;
    if read_header(path, &head)? != FileKind::Trace {
        return Ok(None);
    }
    Ok(Some(walk_blocks(&file, path, file_bytes)?.events()))
}

/// Checks an INDEX frame against the blocks it indexes: the same EVENTS frames at the same
/// offsets (so strictly increasing and not overlapping, none duplicated or left out), the same
/// event counts, END's count their sum, and each block's times in order. The stream trusts
/// the index for all of these.
pub(super) fn verify(
    index: &BlockIndex,
    file: &File,
    path: &Path,
    file_bytes: u64,
) -> Result<(), LoadError> {
    let walk = walk_blocks(file, path, file_bytes)?;
    let mismatch = |offset: u64, what: String| {
        corrupt(
            path,
            offset,
            &format!("{what}; the INDEX frame does not describe the file's blocks"),
        )
    };
    for (k, entry) in index.blocks.iter().enumerate() {
        let Some(&(offset, events)) = walk.blocks.get(k) else {
            let why = walk.stopped.as_ref().map_or_else(
                || "the file has no EVENTS frame there".to_owned(),
                |(at, why)| format!("the frames stop reading at byte {at}: {why}"),
            );
            return Err(mismatch(
                entry.offset,
                format!(
                    "the INDEX lists an EVENTS block at byte {}, {why}",
                    entry.offset
                ),
            ));
        };
        if offset != entry.offset {
            let what = if offset < entry.offset {
                format!(
                    "the EVENTS block at byte {offset} is not in the INDEX (which lists the one \
                     at byte {} next): a block duplicated or left out",
                    entry.offset
                )
            } else {
                format!(
                    "the INDEX lists an EVENTS block at byte {}, the next block is at byte \
                     {offset}",
                    entry.offset
                )
            };
            return Err(mismatch(offset.min(entry.offset), what));
        }
        if events != entry.records {
            return Err(mismatch(
                offset,
                format!(
                    "the INDEX says {} events for the block at byte {offset}, its header {events}",
                    entry.records
                ),
            ));
        }
        if entry.max_t_ns < entry.first_t_ns {
            return Err(mismatch(
                offset,
                format!(
                    "the INDEX says the block at byte {offset} runs from {} ns back to {} ns",
                    entry.first_t_ns, entry.max_t_ns
                ),
            ));
        }
    }
    if let Some(&(offset, _)) = walk.blocks.get(index.blocks.len()) {
        return Err(mismatch(
            offset,
            format!("the EVENTS block at byte {offset} is not in the INDEX (after its last block)"),
        ));
    }
    match walk.end {
        Some((at, total)) if total != index.records() => Err(corrupt(
            path,
            at,
            &format!(
                "the END frame counts {total} events, the blocks hold {}",
                index.records()
            ),
        )),
        Some(_) => Ok(()),
        None => Err(corrupt(
            path,
            file_bytes,
            "the file has an INDEX frame but no END frame after its blocks",
        )),
    }
}

/// Checks the INDEX frame a load read against the blocks it read in order (`seen`: each
/// block's file offset, events and times): the error's offset and what disagrees, if any. A
/// stream reads the same file by the index, so a disagreement means a stream and a load would
/// give different events.
pub(super) fn check_loaded(index: &BlockIndex, seen: &[BlockEntry]) -> Result<(), (u64, String)> {
    let listed = |b: &BlockEntry| {
        format!(
            "{} events at {} to {} ns",
            b.records, b.first_t_ns, b.max_t_ns
        )
    };
    for (k, entry) in index.blocks.iter().enumerate() {
        let Some(block) = seen.get(k) else {
            return Err((
                entry.offset,
                format!(
                    "the INDEX lists an EVENTS block at byte {}, which the file does not have",
                    entry.offset
                ),
            ));
        };
        if block.offset != entry.offset {
            return Err((
                block.offset.min(entry.offset),
                format!(
                    "the INDEX lists its block {k} at byte {}, the file has it at byte {}: a \
                     block duplicated or left out of the INDEX",
                    entry.offset, block.offset
                ),
            ));
        }
        let said = (entry.records, entry.first_t_ns, entry.max_t_ns);
        if said != (block.records, block.first_t_ns, block.max_t_ns) {
            return Err((
                block.offset,
                format!(
                    "the INDEX says the block at byte {} holds {}, it holds {}",
                    block.offset,
                    listed(entry),
                    listed(block)
                ),
            ));
        }
    }
    if let Some(block) = seen.get(index.blocks.len()) {
        return Err((
            block.offset,
            format!(
                "the EVENTS block at byte {} is not in the INDEX (after its last block)",
                block.offset
            ),
        ));
    }
    Ok(())
}

/// Events declared by the EVENTS frames in `stretch` (frames from its start, the first of
/// which may have a wrong length: its block header is read where it stands): what a lenient
/// read loses when it skips the stretch, whatever the END frame says.
pub(super) fn declared_events(stretch: &[u8]) -> u64 {
    let header = FRAME_HEADER_BYTES as usize;
    let mut total = 0u64;
    let mut pos = 0usize;
    while let Some(&tag) = stretch.get(pos) {
        let len = stretch
            .get(pos + 1..pos + header)
            .and_then(|b| b.try_into().ok())
            .map_or(usize::MAX, |b| u32::from_le_bytes(b) as usize);
        let payload = stretch.get(pos + header..).unwrap_or(&[]);
        if tag == FRAME_EVENTS
            && let Ok(block) = BlockHeader::read(payload)
        {
            total = total.saturating_add(block.events);
        }
        match (pos + header).checked_add(len) {
            Some(next) if next <= stretch.len() => pos = next,
            _ => break,
        }
    }
    total
}
