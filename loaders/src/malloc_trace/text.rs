//! Reading a text trace on two threads: a parser thread splits the decompressed blocks into
//! lines and parses them, while the calling thread pairs and stores the parsed lines in file
//! order. Parsing is about half of a load, so the two halves (and the decompression thread
//! before them) run side by side. A line's errors are reported by the calling thread, in file
//! order, exactly as a single-threaded read would: the parser only records them.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use super::{FieldError, LineSink, parse_line, shorten};
use crate::error::{LineError, LoadError};
use crate::events::{Line, LoadOptions, MAX_REPORTED_BAD_LINES, Strictness};
use crate::input::{StreamEnd, TextStream};

/// Parsed batches on their way to the calling thread (each is one decompressed block).
const BATCHES_IN_FLIGHT: usize = 4;

/// One non-empty line of a batch: where its text is, and what parsing it gave.
struct Item {
    line_no: u64,
    /// In the batch's `carry` (the line that began in an earlier block) or its `block`.
    carried: bool,
    start: usize,
    end: usize,
    parsed: Result<Line, FieldError>,
}

/// The parsed lines of one block, with the text they were parsed from (for error messages).
struct Batch {
    block: Vec<u8>,
    carry: Vec<u8>,
    items: Vec<Item>,
}

impl Batch {
    /// Parses the line that began in an earlier block, now whole in `carry`.
    fn push_carried(&mut self, line_no: u64) {
        push_item(
            &mut self.items,
            &self.carry,
            0,
            self.carry.len(),
            true,
            line_no,
        );
    }

    fn text(&self, item: &Item) -> &[u8] {
        let text = if item.carried {
            &self.carry
        } else {
            &self.block
        };
        text.get(item.start..item.end).unwrap_or(&[])
    }
}

enum Msg {
    Batch(Batch),
    Done {
        end: StreamEnd,
        text_bytes: u64,
        dropped_partial_last_line: bool,
    },
    Failed(LoadError),
}

/// Reads every line of `stream` into `b`, in file order.
pub(super) fn read_text<S: LineSink>(
    stream: TextStream,
    path: &Path,
    opts: &LoadOptions,
    b: &mut S,
) -> Result<(), LoadError> {
    b.summary_mut().compression = Some(stream.compression());
    let mirror = opts.progress.clone();
    std::thread::scope(|scope| {
        let (tx, rx) = sync_channel::<Msg>(BATCHES_IN_FLIGHT);
        let (give_back, returned) = sync_channel::<Vec<u8>>(BATCHES_IN_FLIGHT + 1);
        std::thread::Builder::new()
            .name("allocview-parse".into())
            .spawn_scoped(scope, move || parse_blocks(stream, &tx, &returned, mirror))
            .map_err(|e| LoadError::io(path, e))?;
        // `rx` is dropped on the way out (an error included), which stops the parser.
        consume(rx, &give_back, path, opts.strictness, b)
    })
}

/// The calling thread's half: hands every parsed line to `b` and reports errors in order.
fn consume<S: LineSink>(
    rx: Receiver<Msg>,
    give_back: &SyncSender<Vec<u8>>,
    path: &Path,
    strictness: Strictness,
    b: &mut S,
) -> Result<(), LoadError> {
    for msg in rx {
        match msg {
            Msg::Batch(batch) => {
                for item in &batch.items {
                    handle_parsed(b, item, batch.text(item), path, strictness)?;
                }
                // A full queue only means the parser has buffers enough.
                give_back.try_send(batch.block).ok();
            }
            Msg::Done {
                end,
                text_bytes,
                dropped_partial_last_line,
            } => {
                let summary = b.summary_mut();
                summary.dropped_partial_last_line |= dropped_partial_last_line;
                if let StreamEnd::Truncated(why) = end {
                    summary.truncated = Some(why);
                }
                summary.text_bytes = text_bytes;
                return Ok(());
            }
            Msg::Failed(e) => return Err(e),
        }
    }
    Err(LoadError::io(
        path,
        std::io::Error::other("the parsing thread stopped unexpectedly"),
    ))
}

/// The parser thread: splits blocks into lines (a line may span blocks) and parses them.
fn parse_blocks(
    mut stream: TextStream,
    tx: &SyncSender<Msg>,
    returned: &Receiver<Vec<u8>>,
    mirror: Option<Arc<AtomicU64>>,
) {
    let progress = stream.progress_handle();
    let mut carry: Vec<u8> = Vec::new();
    let mut line_no: u64 = 0;
    let mut text_bytes: u64 = 0;
    loop {
        while let Ok(block) = returned.try_recv() {
            stream.recycle(block);
        }
        let block = match stream.next_block() {
            Ok(Some(block)) => block,
            Ok(None) => break,
            Err(e) => {
                tx.send(Msg::Failed(e)).ok();
                return;
            }
        };
        text_bytes += block.len() as u64;
        let mut batch = Batch {
            block,
            carry: Vec::new(),
            // Real traces have lines of about 30 to 40 bytes.
            items: Vec::new(),
        };
        batch.items.reserve(batch.block.len() / 32);
        let mut start = 0;
        if !carry.is_empty() {
            if let Some(nl) = batch.block.iter().position(|&c| c == b'\n') {
                carry.extend_from_slice(&batch.block[..nl]);
                line_no += 1;
                batch.carry = std::mem::take(&mut carry);
                batch.push_carried(line_no);
                start = nl + 1;
            } else {
                carry.extend_from_slice(&batch.block);
                stream.recycle(batch.block);
                continue;
            }
        }
        let body = &batch.block;
        let mut pos = start;
        while let Some(nl) = body
            .get(pos..)
            .and_then(|r| r.iter().position(|&c| c == b'\n'))
        {
            line_no += 1;
            push_item(&mut batch.items, body, pos, pos + nl, false, line_no);
            pos += nl + 1;
        }
        carry.extend_from_slice(body.get(pos..).unwrap_or(&[]));
        if let Some(m) = &mirror {
            m.store(progress.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        if tx.send(Msg::Batch(batch)).is_err() {
            return;
        }
    }
    let end = stream.end().cloned().unwrap_or(StreamEnd::Complete);
    let mut dropped_partial_last_line = false;
    if !carry.is_empty() {
        if let StreamEnd::Truncated(_) = end {
            dropped_partial_last_line = true;
        } else {
            line_no += 1;
            let mut batch = Batch {
                block: Vec::new(),
                carry,
                items: Vec::new(),
            };
            batch.push_carried(line_no);
            if tx.send(Msg::Batch(batch)).is_err() {
                return;
            }
        }
    }
    tx.send(Msg::Done {
        end,
        text_bytes,
        dropped_partial_last_line,
    })
    .ok();
}

/// Parses the line `text[start..end]` (without its `\r`; empty lines are skipped).
fn push_item(
    items: &mut Vec<Item>,
    text: &[u8],
    start: usize,
    end: usize,
    carried: bool,
    line_no: u64,
) {
    let raw = text.get(start..end).unwrap_or(&[]);
    let line = raw.strip_suffix(b"\r").unwrap_or(raw);
    if line.is_empty() {
        return;
    }
    items.push(Item {
        line_no,
        carried,
        start,
        end: start + line.len(),
        parsed: parse_line(line),
    });
}

/// Stores one parsed line, or reports (strict) or counts (lenient) why it could not be.
fn handle_parsed<S: LineSink>(
    b: &mut S,
    item: &Item,
    line: &[u8],
    path: &Path,
    strictness: Strictness,
) -> Result<(), LoadError> {
    let err = match &item.parsed {
        Ok(parsed) => match b.push_line(parsed) {
            Ok(()) => return Ok(()),
            Err(expected) => LineError {
                line: item.line_no,
                column: 1,
                field: "line",
                expected,
                found: shorten(line),
            },
        },
        Err(fe) => {
            let rest = line.get(fe.offset.min(line.len())..).unwrap_or(&[]);
            let end = rest.iter().position(|&c| c == b'\t').unwrap_or(rest.len());
            LineError {
                line: item.line_no,
                column: fe.offset + 1,
                field: fe.field,
                expected: fe.expected,
                found: shorten(rest.get(..end).unwrap_or(&[])),
            }
        }
    };
    match strictness {
        Strictness::Strict => Err(LoadError::Parse {
            path: path.to_path_buf(),
            detail: err,
        }),
        Strictness::Lenient => {
            let summary = b.summary_mut();
            summary.bad_lines += 1;
            if summary.first_bad_lines.len() < MAX_REPORTED_BAD_LINES {
                summary.first_bad_lines.push(err);
            }
            Ok(())
        }
    }
}
