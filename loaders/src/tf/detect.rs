//! Telling a TensorFlow memory log or BFC dump by its content, fast on any input (issue 43:
//! a 1 MB gzip of blank lines, a gigabyte decompressed, took 20 s to be called unrecognised
//! when every line was read and parsed).
//!
//! The decompressed text is read in large chunks and searched for [`MARKERS`] (a substring
//! search over the chunk, not a parse of each line); only the lines holding one are parsed. A
//! file whose head is blank is no log: the search stops there. (The search is the standard
//! library's, compiled with this crate's optimisation: the `memchr` crate is built unoptimised
//! in a debug build, and was slower than the per-line parse.)

use std::io::Read;

use super::{TfKind, dump, memlog, split_log_line};

/// How many decompressed bytes [`detect_kind`] reads at most: a BFC dump at the end of a long
/// log is still recognised.
pub const DETECT_LIMIT_BYTES: u64 = 256 << 20;

/// Decompressed bytes searched at a time.
const CHUNK_BYTES: usize = 1 << 20;

/// A file whose first this many decompressed bytes are all whitespace is no log.
const BLANK_HEAD_BYTES: u64 = 1 << 20;

/// Substrings one of which every recognised line holds: the memory log's label, and a part of
/// each dump line [`dump::is_dump_line`] takes (`dump/lines.rs`, `classify`: the chunk, region
/// and in-use summary lines all hold " of size "; "of in-use " is in both summary heads).
const MARKERS: &[&str] = &[
    memlog::LOG_MEMORY_LABEL,
    "Allocator (",
    "Ran out of memory",
    "BFCAllocator dump for ",
    "Bin ",
    "Requested Size: ",
    " of size ",
    "of in-use ",
    "total_region_allocated_bytes_:",
    " in pool:",
];

/// Tells whether a (possibly gzipped) text file is a TensorFlow memory log or BFC dump, from the
/// first memory-log record or dump line in its first [`DETECT_LIMIT_BYTES`]. A memory log's
/// records start long before any dump it ends in.
///
/// # Errors
/// When the file cannot be opened.
pub fn detect_kind(path: &std::path::Path) -> Result<Option<TfKind>, crate::error::LoadError> {
    Ok(detect_kind_in(crate::input::open_text(path)?))
}

/// [`detect_kind`] on decompressed text: reads at most [`DETECT_LIMIT_BYTES`] of it, and stops
/// after [`BLANK_HEAD_BYTES`] when they are all whitespace. A read error (a truncated gzip
/// stream, say) ends the search; the load reports it.
pub fn detect_kind_in(reader: impl Read) -> Option<TfKind> {
    let mut reader = reader.take(DETECT_LIMIT_BYTES);
    // The text read and not yet searched: a line cut by the end of the last chunk.
    let mut buf: Vec<u8> = Vec::with_capacity(2 * CHUNK_BYTES);
    let mut read_bytes = 0u64;
    let mut seen_text = false;
    loop {
        let kept = buf.len();
        buf.resize(kept + CHUNK_BYTES, 0);
        let n = fill(&mut reader, buf.get_mut(kept..).unwrap_or_default());
        buf.truncate(kept + n);
        read_bytes += n as u64;
        let at_end = n < CHUNK_BYTES;
        // Whole lines only, unless none ended in a chunk (a line over a megabyte is no log
        // line: it is searched as it is).
        let whole = match buf.iter().rposition(|&b| b == b'\n') {
            Some(i) if !at_end => i + 1,
            _ => buf.len(),
        };
        let text = buf.get(..whole).unwrap_or_default();
        if let Some(kind) = first_kind(&String::from_utf8_lossy(text)) {
            return Some(kind);
        }
        seen_text = seen_text || text.iter().any(|b| !b.is_ascii_whitespace());
        if at_end || (!seen_text && read_bytes >= BLANK_HEAD_BYTES) {
            return None;
        }
        buf.drain(..whole);
    }
}

/// Reads into `out` until it is full, the input ends or a read fails; the bytes read.
fn fill(reader: &mut impl Read, out: &mut [u8]) -> usize {
    let mut n = 0;
    while n < out.len() {
        match reader.read(out.get_mut(n..).unwrap_or_default()) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    n
}

/// The kind the first recognised line of `text` (whole lines) says.
fn first_kind(text: &str) -> Option<TfKind> {
    let mut first: Option<(usize, TfKind)> = None;
    for marker in MARKERS {
        let mut pos = 0;
        while let Some(i) = text.get(pos..).and_then(|t| t.find(marker)) {
            let hit = pos + i;
            let start = text
                .get(..hit)
                .and_then(|t| t.rfind('\n'))
                .map_or(0, |i| i + 1);
            // A line after one already recognised cannot come first.
            if first.is_some_and(|(at, _)| at <= start) {
                break;
            }
            let after = text.get(hit..).and_then(|t| t.find('\n'));
            let end = after.map_or(text.len(), |i| hit + i);
            if let Some(kind) = line_kind(text.get(start..end).unwrap_or_default()) {
                first = Some((start, kind));
                break;
            }
            // The line's other hits say nothing more.
            pos = end + 1;
        }
    }
    first.map(|(_, kind)| kind)
}

/// What one line says, as the line-by-line detection read it.
fn line_kind(line: &str) -> Option<TfKind> {
    let message = split_log_line(line.trim_end()).message;
    if message.starts_with(memlog::LOG_MEMORY_LABEL) {
        return Some(TfKind::MemoryLog);
    }
    dump::is_dump_line(message).then_some(TfKind::BfcDump)
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// Counts the bytes read through it.
    struct Counting<R> {
        inner: R,
        read_bytes: u64,
    }

    impl<R: Read> Read for Counting<R> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(out)?;
            self.read_bytes += n as u64;
            Ok(n)
        }
    }

    fn counted(text: impl Read) -> (Option<TfKind>, u64) {
        let mut c = Counting {
            inner: text,
            read_bytes: 0,
        };
        let kind = detect_kind_in(&mut c);
        (kind, c.read_bytes)
    }

    /// A gigabyte of blank lines (what a 1 MB gzip of them holds) is no log, told from its
    /// first megabytes: every line up to the 256 MiB limit was read and parsed (20 s).
    #[test]
    fn a_gigabyte_of_blank_lines_is_no_log_after_its_head() {
        let blank = std::io::repeat(b'\n').take(1 << 30);
        let (kind, read_bytes) = counted(blank);
        assert_eq!(kind, None);
        assert!(
            read_bytes <= 2 * BLANK_HEAD_BYTES,
            "{read_bytes} bytes read"
        );
        // Whitespace of every kind is blank too.
        let (kind, read_bytes) = counted(std::io::repeat(b' ').take(1 << 30));
        assert_eq!(kind, None);
        assert!(
            read_bytes <= 2 * BLANK_HEAD_BYTES,
            "{read_bytes} bytes read"
        );
    }

    /// A long log whose dump comes after 20 MB of other log lines is still a dump, a memory
    /// record before the dump makes a memory log, and a marker cut by a chunk's end is found.
    #[test]
    fn a_dump_after_a_long_log_and_markers_across_chunks_are_found() {
        let line = "I0000 00:00:1.0 1 some_op.cc:12] step 5 done, loss 0.25\n";
        let mut text = line.repeat((20 << 20) / line.len());
        let dump = "I0000 00:00:1.0 1 bfc_allocator.cc:1049] BFCAllocator dump for GPU_0_bfc\n";
        let mut with_dump = text.clone();
        with_dump.push_str(dump);
        assert_eq!(detect_kind_in(with_dump.as_bytes()), Some(TfKind::BfcDump));
        // A memory-log record first.
        text.push_str(
            "I0000 00:00:1.0 1 log_memory.cc:18] __LOG_MEMORY__ MemoryLogStep { step_id: 1 }\n",
        );
        text.push_str(dump);
        assert_eq!(detect_kind_in(text.as_bytes()), Some(TfKind::MemoryLog));
        // The dump line cut at each place by the first chunk's end.
        for cut in 0..dump.len() {
            let mut t = "x".repeat(CHUNK_BYTES - cut - 1);
            t.push('\n');
            t.push_str(dump);
            assert_eq!(detect_kind_in(t.as_bytes()), Some(TfKind::BfcDump), "{cut}");
        }
        // A marker in a line that is no dump line does not count.
        let no = "Size: 3\nInUse at x of size y\nBin (\n".repeat(1000);
        assert_eq!(detect_kind_in(no.as_bytes()), None);
    }
}
