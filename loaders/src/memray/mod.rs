//! memray capture files (`memray run -o FILE.bin`), read natively for the format versions
//! in [`VERSIONS_READ`] (memray 1.18 to 1.20), into the event table of every malloc trace.
//!
//! A capture is one LZ4 frame (raw with `--no-compress`) holding a header and a stream of
//! records: each allocator call (malloc, calloc, realloc, the aligned ones, `mmap` and
//! `munmap`, and with `--trace-python-allocators` pymalloc's), the Python frames pushed and
//! popped on each thread, the code objects that name them, native return addresses and the
//! loaded modules (`--native`), and the resident memory sampled over time. The format is not
//! documented and changes between releases: a version not read is refused with its number.
//!
//! Calls have no time of their own in the capture: each takes the time of the memory sample
//! before it (millisecond steps). Object lifetimes (`--track-object-lifetimes`) and thread
//! names are read past.

mod header;
mod linetable;
mod records;
mod stacks;
mod stream;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::time::Instant;

pub use header::{Header, VERSIONS_READ};

use crate::error::LoadError;
use crate::events::{LoadOptions, MallocTrace, Strictness};
use crate::foreign;
use records::Records;
use stream::{LZ4_MAGIC, Stream};

/// Whether `head` (a file's first bytes) is a memray capture: the raw magic, or an LZ4 frame
/// whose first literal bytes are it.
#[must_use]
pub fn is_capture(head: &[u8]) -> bool {
    head.starts_with(header::MAGIC)
        || lz4_first_literals(head).is_some_and(|lit| lit.starts_with(header::MAGIC))
}

/// The literal bytes that open an LZ4 frame's first block. A file's first block is often
/// larger than the bytes detection reads, so it is not decoded whole: a stream's first bytes
/// can only be literals, which sit in the block as they are.
fn lz4_first_literals(head: &[u8]) -> Option<&[u8]> {
    let rest = head.strip_prefix(&LZ4_MAGIC)?;
    let flags = *rest.first()?;
    // FLG, BD, the header checksum, then an 8-byte content size and a 4-byte dictionary id
    // when their flags are set.
    let descriptor =
        3 + if flags & 0x08 != 0 { 8 } else { 0 } + if flags & 0x01 != 0 { 4 } else { 0 };
    let rest = rest.get(descriptor..)?;
    let size_word = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?);
    let block = rest.get(4..)?;
    if size_word & 0x8000_0000 != 0 {
        // An uncompressed block: the data itself.
        return Some(block);
    }
    let token = *block.first()?;
    let mut literals = usize::from(token >> 4);
    let mut at = 1;
    if literals == 15 {
        loop {
            let b = *block.get(at)?;
            at += 1;
            literals += usize::from(b);
            if b != 255 {
                break;
            }
        }
    }
    let end = at.checked_add(literals)?.min(block.len());
    block.get(at..end)
}

/// Loads a memray capture.
///
/// # Errors
/// When the file cannot be read, is no capture, is of a format version not read or
/// aggregated, or (strict mode) a record is damaged: the error names the byte of the
/// decompressed stream (and of the file, for an LZ4 error). In lenient mode a damaged record
/// ends the load there, marked truncated, and records that break the stream's rules but
/// read (a pop past a stack's bottom, a call before any thread) are skipped and counted.
pub fn load_memray(path: &Path, opts: &LoadOptions) -> Result<MallocTrace, LoadError> {
    let started = Instant::now();
    let mut s = Stream::open(path, opts.progress.clone())?;
    let header = header::read_header(&mut s)
        .map_err(|e| LoadError::format(path, format!("memray capture: {}", e.describe())))?;
    let lenient = opts.strictness == Strictness::Lenient;
    let mut records = Records::new(&header, lenient);
    let result = records.read_all(&mut s);
    let mut outcome = records.finish();
    let mut cut = None;
    if let Err(e) = result {
        if !lenient {
            return Err(LoadError::format(
                path,
                format!(
                    "memray capture: {} (use --lenient to load what precedes it)",
                    e.describe()
                ),
            ));
        }
        let file_len = std::fs::metadata(path).map_or(0, |m| m.len());
        let unread = file_len.saturating_sub(s.file_bytes_read());
        cut = Some(format!(
            "{}; the records after byte {} of the decompressed stream were not read (at least \
             {unread} file bytes after what was decoded)",
            e.describe(),
            e.offset()
        ));
    }
    outcome.events.notes.extend(notes(&header));
    // memray's memory snapshots are the process's whole resident set, nothing more.
    outcome.events.memory_series = crate::events::RecordedSeries::ResidentOnly;
    let mut trace = foreign::into_trace(path, outcome.events, opts.strictness, started)?;
    let summary = &mut trace.summary;
    summary.bad_lines += outcome.skipped;
    summary.first_bad_lines.extend(outcome.first_skipped);
    summary.python_allocator_events = outcome.python_allocator_events;
    summary.text_bytes = s.offset;
    if cut.is_none() && outcome.no_trailer {
        cut = Some(
            "the capture ends without memray's trailer record, where a run that was cut short \
             stops"
                .to_owned(),
        );
    }
    if cut.is_some() {
        summary.truncated = cut;
    }
    Ok(trace)
}

/// Reads the header only (for `allocview` to describe a capture).
///
/// # Errors
/// As [`load_memray`] for the header.
pub fn read_header(path: &Path) -> Result<Header, LoadError> {
    let mut s = Stream::open(path, None)?;
    header::read_header(&mut s)
        .map_err(|e| LoadError::format(path, format!("memray capture: {}", e.describe())))
}

/// What every load of a capture says of its fidelity.
fn notes(header: &Header) -> Vec<String> {
    let mut out = vec![format!(
        "memray capture format {} ({}): calls carry the time of the memory sample before them \
         (millisecond steps); memray samples the resident set only (no anonymous-memory figure)",
        header.version,
        VERSIONS_READ
            .iter()
            .find(|(v, _)| *v == header.version)
            .map_or("", |(_, who)| who),
    )];
    if header.native_traces {
        out.push(
            "native frames are named by module and offset: memray keeps no symbols in the \
             capture"
                .to_owned(),
        );
    }
    if header.trace_python_allocators {
        out.push(
            "recorded with --trace-python-allocators: pymalloc's calls are the program's \
             object requests (as `--requests objects`); what pymalloc asked of the C library \
             is not in the capture"
                .to_owned(),
        );
    }
    out
}
