//! heaptrack data files (`heaptrack.APP.PID.gz` or `.zst`, as `heaptrack_interpret` writes
//! them and `heaptrack_print` and `heaptrack_gui` read them): one record a line, a mode letter
//! and hexadecimal fields.
//!
//! | line | meaning |
//! |---|---|
//! | `v <heaptrack version> <file version>` | e.g. `v 10400 3`: heaptrack 1.4.0, format 3 |
//! | `X <command line>`, `I <page size> <pages>` | the program, the machine |
//! | `s [<length>] <string>` | string table (1-based; the length from format 3 on) |
//! | `i <ip> <module> [<function> <file> <line> [<inlined function> <file> <line>]...]` | an instruction pointer and its frames |
//! | `t <ip> <parent>` | a node of the call tree |
//! | `a <size> <trace>` | an allocation info: a (size, stack) class |
//! | `+ <info>`, `- <info>` | an allocation, a free, of that class (format 0: `+ <size> <trace> <pointer>`, `- <pointer>`) |
//! | `c <ms>`, `R <pages>` | the time since start, the resident set |
//! | `A`, `S <suppression>`, `# ...` | attached to a running process, an embedded leak suppression, a comment |
//!
//! From format 1 on a free names an allocation *class*, not a block: heaptrack_interpret
//! keeps the pointers to itself. Each allocation gets a synthetic address of its own, and a
//! free ends the latest live allocation of its class (LIFO). Any order within a class gives
//! the same heap curve, total and per site, since the class fixes both the size and the stack:
//! peak heap, leaks and the per-site figures are exact. Lifetimes are not. LIFO is the order
//! in which heaptrack_print counts a *temporary* allocation (freed before any other
//! allocation), and the order of scoped buffers; FIFO would turn each of those into a long
//! life. The load says so in a note ([`crate::LoadSummary::notes`]).

mod parse;
mod symbols;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::error::{LineError, LoadError};
use crate::events::{LoadOptions, MAX_REPORTED_BAD_LINES, MallocTrace, Strictness};
use crate::foreign::into_trace;
use crate::input::{StreamEnd, TextStream};

use parse::{Fault, Reader};

/// Tells a heaptrack data file (or raw stream) by its first line: `v <hex> <hex>`, or in a
/// file older than the version line, `X <command line>` followed by an `I` or `s` line.
#[must_use]
pub fn is_heaptrack(first_lines: &[&str]) -> bool {
    let hex = |s: &str| !s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let mut lines = first_lines.iter().filter(|l| !l.is_empty());
    match lines
        .next()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .as_deref()
    {
        Some(["v", a, b]) => hex(a) && hex(b),
        Some(["X", ..]) => lines
            .next()
            .is_some_and(|l| l.starts_with("I ") || l.starts_with("s ")),
        _ => false,
    }
}

/// Loads a heaptrack data file (plain, gzip or zstd).
///
/// # Errors
/// On I/O errors; in strict mode on the first malformed line (its number, column and what was
/// expected), and when the compressed stream is cut or corrupt (the line and the file byte it
/// reached). A raw stream (`heaptrack --raw`, not yet interpreted) is refused with the command
/// that interprets it.
pub fn load_heaptrack(path: &Path, opts: &LoadOptions) -> Result<MallocTrace, LoadError> {
    let started = Instant::now();
    let mut stream = TextStream::open(path)?;
    let compression = stream.compression();
    let file_progress = stream.progress_handle();
    let mut reader = Reader::default();
    let mut lines = Lines::default();
    let mut stopped = None;
    loop {
        let block = match stream.next_block() {
            Ok(Some(block)) => block,
            Ok(None) => break,
            Err(LoadError::Io { error, .. }) => {
                stopped = Some(error.to_string());
                break;
            }
            Err(e) => return Err(e),
        };
        lines.text_bytes += block.len() as u64;
        lines.feed(&block, &mut reader, path, opts.strictness)?;
        stream.recycle(block);
        if let Some(p) = &opts.progress {
            p.store(file_progress.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
    let end = stream.end().cloned();
    let cut = match (stopped, end) {
        (Some(why), _) => Some(("corrupt", why)),
        (None, Some(StreamEnd::Truncated(why))) => Some(("cut short", why)),
        _ => None,
    };
    if let Some((what, why)) = cut {
        let at = format!(
            "the {} stream is {what} after line {}, with {} bytes of the file read ({why})",
            compression.name(),
            lines.line_no,
            file_progress.load(Ordering::Relaxed)
        );
        if opts.strictness == Strictness::Strict {
            return Err(LoadError::format(
                path,
                format!("{at} (use --lenient to load what is before it)"),
            ));
        }
        lines.summary_truncated = Some(at);
        lines.dropped_partial_last_line = !lines.carry.is_empty();
    } else if !lines.carry.is_empty() {
        let last = std::mem::take(&mut lines.carry);
        lines.line(&last, &mut reader, path, opts.strictness)?;
    }
    let notes = notes(&reader);
    let mut trace = into_trace(path, reader.into_events(notes), opts.strictness, started)?;
    let s = &mut trace.summary;
    s.compression = Some(compression);
    s.text_bytes = lines.text_bytes;
    s.bad_lines = lines.bad_lines;
    s.first_bad_lines = lines.first_bad_lines;
    if s.truncated.is_none() {
        s.truncated = lines.summary_truncated;
    }
    s.dropped_partial_last_line = lines.dropped_partial_last_line;
    Ok(trace)
}

/// What the user must know of a heaptrack file's fidelity, said on every load.
fn notes(reader: &Reader) -> Vec<String> {
    let v = reader.heaptrack_version;
    let mut notes = Vec::new();
    if reader.file_version >= 1 {
        notes.push(format!(
            "heaptrack file (heaptrack {}.{}.{}, file format {}): its frees name an \
             allocation's size and call stack, not its address, so each free ended the latest \
             live allocation of the same size and stack (LIFO), at a synthetic address; \
             lifetimes are approximate (peak heap, leaks and per-site totals are exact)",
            v >> 16,
            (v >> 8) & 0xff,
            v & 0xff,
            reader.file_version
        ));
    }
    if reader.symbols.stacks_cut > 0 {
        notes.push(format!(
            "{} call stacks were cut to their innermost frames (deeper than allocview keeps)",
            reader.symbols.stacks_cut
        ));
    }
    if reader.unmatched_frees > 0 {
        notes.push(format!(
            "{} heaptrack frees had no live allocation of their size and stack left",
            reader.unmatched_frees
        ));
    }
    if reader.attached {
        notes.push(
            "heaptrack attached to the program while it ran: what it allocated before is not \
             in the file"
                .to_owned(),
        );
    }
    if reader.suppressions > 0 {
        notes.push(format!(
            "the file embeds {} leak suppressions; allocview counts every byte not freed as \
             leaked (heaptrack_print leaves out the suppressed ones)",
            reader.suppressions
        ));
    }
    notes
}

/// Splits the decompressed text into lines (a line may span blocks), and reads them.
#[derive(Default)]
struct Lines {
    carry: Vec<u8>,
    line_no: u64,
    text_bytes: u64,
    bad_lines: u64,
    first_bad_lines: Vec<LineError>,
    summary_truncated: Option<String>,
    dropped_partial_last_line: bool,
}

impl Lines {
    fn feed(
        &mut self,
        block: &[u8],
        reader: &mut Reader,
        path: &Path,
        strictness: Strictness,
    ) -> Result<(), LoadError> {
        let mut rest = block;
        while let Some(nl) = rest.iter().position(|&c| c == b'\n') {
            let (line, after) = rest.split_at(nl);
            if self.carry.is_empty() {
                self.line(line, reader, path, strictness)?;
            } else {
                let mut whole = std::mem::take(&mut self.carry);
                whole.extend_from_slice(line);
                self.line(&whole, reader, path, strictness)?;
            }
            rest = after.get(1..).unwrap_or(&[]);
        }
        self.carry.extend_from_slice(rest);
        Ok(())
    }

    fn line(
        &mut self,
        line: &[u8],
        reader: &mut Reader,
        path: &Path,
        strictness: Strictness,
    ) -> Result<(), LoadError> {
        self.line_no += 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Err(fault) = reader.line(line) else {
            return Ok(());
        };
        if fault.expected == parse::RAW_STREAM {
            // Skipping lines would not make a raw stream a data file.
            return Err(LoadError::format(
                path,
                format!("line {}: expected {}", self.line_no, parse::RAW_STREAM),
            ));
        }
        let Fault {
            column,
            field,
            expected,
            found,
        } = fault;
        let detail = LineError {
            line: self.line_no,
            column,
            field,
            expected,
            found,
        };
        match strictness {
            Strictness::Strict => Err(LoadError::Parse {
                path: path.to_path_buf(),
                detail,
            }),
            Strictness::Lenient => {
                self.bad_lines += 1;
                if self.first_bad_lines.len() < MAX_REPORTED_BAD_LINES {
                    self.first_bad_lines.push(detail);
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
