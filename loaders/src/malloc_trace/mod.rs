//! The libtracemalloc text format, into an event DataFrame.
//!
//! One call a line, tab-separated:
//!
//! ```text
//! <sec>.<frac>\t<thread id>\t<size>\t<pointer>[\t<call>]
//! ```
//!
//! `size` is `-1` for a free; `pointer` is `0x...` (or bare hex) or `(nil)`; the optional fifth
//! column names the call (`malloc`, `calloc`, `realloc`, `free`, `memalign`, ...). Fractions of a
//! second may have up to nine digits (six in practice).
//!
//! Semantics (each has a test on a real trace):
//! - `free(NULL)` becomes a `free_null` event;
//! - a free of a pointer that is not live (allocated by an untraced call) becomes `free_unknown`:
//!   counted and kept, never fatal;
//! - an address reused after its free starts a new allocation with a new id;
//! - allocations never freed stay live at the end;
//! - a malloc that returns a pointer that is still live means the trace missed its free (e.g. an
//!   untraced realloc in place); it is counted in `mallocs_of_live_ptr` and reported, and a
//!   synthetic `free` row (same time and thread) ends the older allocation just before it, so
//!   live bytes stay right (such a trace has that many more rows than lines);
//! - timestamps that go backwards are clamped to the previous time, counted and reported.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use allocview_sim::trace::{EventKind, NO_ALLOC_ID, size_class};
use polars::prelude::*;
use polars_arrow::bitmap::MutableBitmap;

use crate::error::{LineError, LoadError};
use crate::input::{Compression, TextStream};

mod builder;
mod text;

use text::read_text;

pub(crate) use builder::{Builder, Pairing, ThreadIds};

/// Names of the `call` column's codes, in code order.
pub const CALL_NAMES: [&str; 11] = [
    "malloc",
    "calloc",
    "realloc",
    "free",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "reallocarray",
    "other",
];

pub(crate) const CALL_MALLOC: u8 = 0;
pub(crate) const CALL_FREE: u8 = 3;

/// The code of a call name in the `call` column.
#[must_use]
pub fn call_code(name: &[u8]) -> Option<u8> {
    CALL_NAMES
        .iter()
        .position(|n| n.as_bytes() == name)
        .and_then(|i| u8::try_from(i).ok())
}

/// How strictly to treat malformed lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strictness {
    /// The first malformed line is an error.
    #[default]
    Strict,
    /// Malformed lines are skipped, counted and the first few reported.
    Lenient,
}

/// Options for [`load_malloc_trace`].
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    pub strictness: Strictness,
    /// Receives the number of file bytes read so far (for a progress bar).
    pub progress: Option<Arc<AtomicU64>>,
}

/// The most threads a trace may have: thread indices are 16 bits in the event table. The
/// binary writer refuses more, so that it never writes what cannot be loaded.
pub const MAX_THREADS: usize = 1 << 16;

/// How many skipped lines are kept verbatim in the summary.
pub const MAX_REPORTED_BAD_LINES: usize = 5;

/// What the loader counted while reading. Every record it did not turn into a plain event is
/// counted here, so nothing is lost silently.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadSummary {
    pub compression: Option<Compression>,
    /// Events (rows), one per parsed line.
    pub events: u64,
    /// Lines with a size >= 0 (calls that allocate), including failed ones.
    pub mallocs: u64,
    /// Lines with size -1, including `free(NULL)` and frees of unknown pointers.
    pub frees: u64,
    pub frees_null: u64,
    pub frees_unknown: u64,
    /// Allocations that returned NULL with a size > 0.
    pub mallocs_failed: u64,
    /// Allocations whose pointer was still live (a missed free).
    pub mallocs_of_live_ptr: u64,
    pub mallocs_size_zero: u64,
    /// Lines skipped in lenient mode.
    pub bad_lines: u64,
    /// The first [`MAX_REPORTED_BAD_LINES`] skipped lines' errors.
    pub first_bad_lines: Vec<LineError>,
    /// Timestamps that were earlier than the previous line's (clamped).
    pub timestamps_non_monotonic: u64,
    /// Set when the compressed stream ended early: what was there was loaded.
    pub truncated: Option<String>,
    /// A last line without its newline in a truncated stream, dropped because it may be cut.
    pub dropped_partial_last_line: bool,
    /// Damaged stretches of a binary trace, repaired or skipped (lenient mode).
    pub damaged: Vec<crate::binary::Damage>,
    /// Events lost to that damage, when the file says how many it held.
    pub events_lost: Option<u64>,
    /// True when lines carried the fifth (call name) column.
    pub has_call_column: bool,
    /// Decompressed bytes parsed.
    pub text_bytes: u64,
}

impl LoadSummary {
    /// Human-readable warnings (empty when the load was clean).
    #[must_use]
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(why) = &self.truncated {
            out.push(format!(
                "the compressed stream is truncated ({why}); loaded the {} events before the cut{}",
                self.events,
                if self.dropped_partial_last_line {
                    ", and dropped the incomplete last line"
                } else {
                    ""
                }
            ));
        }
        if !self.damaged.is_empty() {
            let lost = match self.events_lost {
                Some(0) => "no events lost".to_owned(),
                Some(n) => format!(
                    "{n} events lost (the file's end frame counts {}, {} were read)",
                    n + self.events,
                    self.events
                ),
                None => "an unknown number of events lost (the file has no end frame to count \
                         them)"
                    .to_owned(),
            };
            let mut msg = format!(
                "the binary trace is damaged (not cut) in {} place{}; {lost}",
                self.damaged.len(),
                if self.damaged.len() == 1 { "" } else { "s" }
            );
            for d in &self.damaged {
                msg.push_str(&format!("\n  {d}"));
            }
            out.push(msg);
        }
        if self.bad_lines > 0 {
            let mut msg = format!("skipped {} malformed lines", self.bad_lines);
            for e in &self.first_bad_lines {
                msg.push_str(&format!("\n  {e}"));
            }
            if self.bad_lines > self.first_bad_lines.len() as u64 {
                msg.push_str("\n  ...");
            }
            out.push(msg);
        }
        if self.frees_unknown > 0 {
            out.push(format!(
                "{} frees of pointers that were never allocated in the trace (kept as free_unknown \
                 events; typical of tracers that do not trace calloc/realloc)",
                self.frees_unknown
            ));
        }
        if self.mallocs_of_live_ptr > 0 {
            out.push(format!(
                "{} allocations returned a pointer that was still live; the trace missed their \
                 frees, so the older allocations were ended there",
                self.mallocs_of_live_ptr
            ));
        }
        if self.timestamps_non_monotonic > 0 {
            out.push(format!(
                "{} timestamps went backwards and were clamped to the previous time",
                self.timestamps_non_monotonic
            ));
        }
        out
    }
}

/// A loaded malloc trace.
#[derive(Clone, Debug)]
pub struct MallocTrace {
    /// One row per event; see the crate docs for the schema.
    pub events: DataFrame,
    /// The threads table: `thread` (index used in `events`) and `tid` (the id in the file).
    pub threads: DataFrame,
    pub summary: LoadSummary,
    pub load_seconds: f64,
    /// The allocations' call stacks, for a recorded trace with stacks (`events` then has a
    /// `stack_id` column: an id in this table, null where none was captured).
    pub stacks: Option<crate::sites::StackTable>,
}

/// Multiplicative hashing for pointer keys: pointers are already well spread in their middle
/// bits, and SipHash would dominate the parse time.
#[derive(Default)]
pub(crate) struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        // hashbrown takes the bucket from the low bits and a tag from the top 7: a product's
        // low bits depend only on the factor's low bits, which are zero in aligned pointers
        // (every key of a 16-byte-aligned heap fell into one sixteenth of the buckets), so
        // the product's high half is folded into them.
        let x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 32);
    }
}

pub(crate) type PtrMap<V> = HashMap<u64, V, BuildHasherDefault<PtrHasher>>;
/// A set of pointers, hashed like [`PtrMap`]'s keys.
pub(crate) type PtrSet = std::collections::HashSet<u64, BuildHasherDefault<PtrHasher>>;

/// One parsed line (or one record of a binary trace).
#[derive(Clone, Copy)]
pub(crate) struct Line {
    pub(crate) t_ns: i64,
    pub(crate) tid: u64,
    /// `None` for a free.
    pub(crate) size_bytes: Option<u64>,
    pub(crate) addr: u64,
    /// The call's code (an index into [`CALL_NAMES`]), when the line names one.
    pub(crate) call: Option<u8>,
    /// The stack id the file gives the event (binary traces with stacks).
    pub(crate) stack: Option<u32>,
}

impl Line {
    /// The loader's line for a binary record: times before 0 are clamped to 0.
    pub(crate) fn of_record(r: &Record) -> Self {
        Self {
            t_ns: r.t_ns.max(0),
            tid: r.tid,
            size_bytes: r.size_bytes,
            addr: r.addr,
            call: r.call,
            stack: r.stack,
        }
    }
}

/// One call as written in a trace file, before any pairing or clamping: what `allocview
/// convert` copies between the text and binary forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub t_ns: i64,
    pub tid: u64,
    /// `None` for a free (size `-1` in the text form).
    pub size_bytes: Option<u64>,
    /// The pointer (0 for NULL).
    pub addr: u64,
    /// Index into [`CALL_NAMES`]; `None` when the line has no fifth column.
    pub call: Option<u8>,
    /// The allocation's call stack, as an id into the file's stack table (binary traces and
    /// spools recorded with stacks; never in the text form).
    pub stack: Option<u32>,
}

/// Where parsed lines go: the DataFrame [`Builder`], or a callback over raw [`Record`]s.
pub(crate) trait LineSink {
    fn push_line(&mut self, line: &Line) -> Result<(), &'static str>;
    fn summary_mut(&mut self) -> &mut LoadSummary;
}

impl LineSink for Builder {
    fn push_line(&mut self, line: &Line) -> Result<(), &'static str> {
        self.push(line)
    }
    fn summary_mut(&mut self) -> &mut LoadSummary {
        &mut self.summary
    }
}

struct RecordSink<F> {
    f: F,
    summary: LoadSummary,
}

impl<F: FnMut(&Record) -> Result<(), &'static str>> LineSink for RecordSink<F> {
    fn push_line(&mut self, line: &Line) -> Result<(), &'static str> {
        (self.f)(&Record {
            t_ns: line.t_ns,
            tid: line.tid,
            size_bytes: line.size_bytes,
            addr: line.addr,
            call: line.call,
            stack: line.stack,
        })?;
        self.summary.events += 1;
        Ok(())
    }
    fn summary_mut(&mut self) -> &mut LoadSummary {
        &mut self.summary
    }
}

/// A field-level parse failure: byte offset of the field in the line, its name, what was
/// expected.
#[derive(Clone, Copy, Debug)]
struct FieldError {
    offset: usize,
    field: &'static str,
    expected: &'static str,
}

fn field_err(offset: usize, field: &'static str, expected: &'static str) -> FieldError {
    FieldError {
        offset,
        field,
        expected,
    }
}

const EXPECT_TIME: &str = "a time <seconds>.<fraction> (e.g. 0.000123)";
const EXPECT_TID: &str = "a decimal thread id";
const EXPECT_SIZE: &str = "a size in bytes (decimal, or -1 for a free)";
const EXPECT_PTR: &str = "a pointer (0x<hex> or (nil))";
const EXPECT_CALL: &str = "a call name (malloc, calloc, realloc, free, memalign, ...)";
const EXPECT_END: &str = "the end of the line after at most 5 tab-separated fields";

fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in s {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d))?;
    }
    Some(v)
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in s {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | u64::from(d);
    }
    Some(v)
}

fn parse_time(s: &[u8]) -> Option<i64> {
    let (sec, frac) = match s.iter().position(|&b| b == b'.') {
        Some(dot) => (&s[..dot], &s[dot + 1..]),
        None => (s, &s[s.len()..]),
    };
    if frac.len() > 9 {
        return None;
    }
    let sec = parse_decimal(sec)?;
    let mut frac_ns = if frac.is_empty() {
        0
    } else {
        parse_decimal(frac)?
    };
    for _ in frac.len()..9 {
        frac_ns *= 10;
    }
    let ns = sec.checked_mul(1_000_000_000)?.checked_add(frac_ns)?;
    i64::try_from(ns).ok()
}

/// Splits off the next tab-separated field; returns it and the offset after its tab.
fn next_field(line: &[u8], start: usize) -> (&[u8], usize) {
    let rest = &line[start.min(line.len())..];
    match rest.iter().position(|&b| b == b'\t') {
        Some(i) => (&rest[..i], start + i + 1),
        None => (rest, line.len() + 1),
    }
}

fn parse_line(line: &[u8]) -> Result<Line, FieldError> {
    let (time, p1) = next_field(line, 0);
    let t_ns = parse_time(time).ok_or_else(|| field_err(0, "time", EXPECT_TIME))?;
    if p1 > line.len() {
        return Err(field_err(line.len(), "thread", EXPECT_TID));
    }
    let (tid, p2) = next_field(line, p1);
    let tid = parse_decimal(tid).ok_or_else(|| field_err(p1, "thread", EXPECT_TID))?;
    if p2 > line.len() {
        return Err(field_err(line.len(), "size", EXPECT_SIZE));
    }
    let (size, p3) = next_field(line, p2);
    let size_bytes = if size == b"-1" {
        None
    } else {
        Some(parse_decimal(size).ok_or_else(|| field_err(p2, "size", EXPECT_SIZE))?)
    };
    if p3 > line.len() {
        return Err(field_err(line.len(), "pointer", EXPECT_PTR));
    }
    let (ptr, p4) = next_field(line, p3);
    let addr = if ptr == b"(nil)" {
        0
    } else {
        let hex = ptr
            .strip_prefix(b"0x")
            .or_else(|| ptr.strip_prefix(b"0X"))
            .unwrap_or(ptr);
        parse_hex(hex).ok_or_else(|| field_err(p3, "pointer", EXPECT_PTR))?
    };
    let call = if p4 <= line.len() {
        let (call, p5) = next_field(line, p4);
        if p5 <= line.len() {
            return Err(field_err(p5 - 1, "end of line", EXPECT_END));
        }
        Some(call_code(call).ok_or_else(|| field_err(p4, "call", EXPECT_CALL))?)
    } else {
        None
    };
    Ok(Line {
        t_ns,
        tid,
        size_bytes,
        addr,
        call,
        stack: None,
    })
}

fn shorten(bytes: &[u8]) -> String {
    const MAX: usize = 60;
    let s = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX)]).into_owned();
    if bytes.len() > MAX { s + "..." } else { s }
}

/// Loads a libtracemalloc text trace (plain or gzip).
///
/// # Errors
/// On I/O errors, and in strict mode on the first malformed line (with its line number, column
/// and what was expected).
pub fn load_malloc_trace(path: &Path, opts: &LoadOptions) -> Result<MallocTrace, LoadError> {
    let started = Instant::now();
    let stream = TextStream::open(path)?;
    // Reserve for the expected number of events: untouched capacity costs address space, not
    // memory, and large vectors grow by mremap anyway.
    let expected_events = estimate_events(path, stream.compression(), stream.file_bytes());
    let mut b = Builder::with_capacity(expected_events);
    read_text(stream, path, opts, &mut b)?;
    let (events, threads, summary) = b.finish()?;
    Ok(MallocTrace {
        events,
        threads,
        summary,
        load_seconds: started.elapsed().as_secs_f64(),
        stacks: None,
    })
}

/// Calls `f` on every record of a libtracemalloc text trace, in file order, as written (no
/// pairing, no clamping). Returns the summary of what was read (`events` counts the records;
/// `bad_lines` and `truncated` as for [`load_malloc_trace`]).
///
/// # Errors
/// As [`load_malloc_trace`]; an error returned by `f` stops the read as a malformed line.
pub fn read_text_records(
    path: &Path,
    opts: &LoadOptions,
    f: impl FnMut(&Record) -> Result<(), &'static str>,
) -> Result<LoadSummary, LoadError> {
    let stream = TextStream::open(path)?;
    let mut sink = RecordSink {
        f,
        summary: LoadSummary::default(),
    };
    read_text(stream, path, opts, &mut sink)?;
    Ok(sink.summary)
}

/// Typical bytes per line in real traces (`0.000123\t140642980739072\t472\t0x5605134312a0`).
const TYPICAL_LINE_BYTES: u64 = 40;

/// Largest compression ratio of a gzip trace that the estimate believes.
const MAX_GZIP_RATIO: u64 = 32;

fn estimate_events(path: &Path, compression: Compression, file_bytes: u64) -> usize {
    let text_bytes = match compression {
        Compression::Plain => file_bytes,
        // The gzip trailer holds the uncompressed size modulo 2^32: use it unless the ratio
        // says it wrapped or is beyond what real traces reach (8-19x; a forged trailer must
        // not size a reservation of gigabytes), in which case assume a typical 5x ratio. The
        // vectors grow past the estimate if they must.
        Compression::Gzip => gzip_isize(path)
            .filter(|&isize| {
                isize >= file_bytes && isize <= file_bytes.saturating_mul(MAX_GZIP_RATIO)
            })
            .unwrap_or(file_bytes.saturating_mul(5)),
    };
    usize::try_from(text_bytes / TYPICAL_LINE_BYTES + 1024).unwrap_or(1 << 20)
}

fn gzip_isize(path: &Path) -> Option<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    f.seek(SeekFrom::End(-4)).ok()?;
    let mut buf = [0u8; 4];
    f.read_exact(&mut buf).ok()?;
    Some(u64::from(u32::from_le_bytes(buf)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines are parsed on a thread of their own, a block at a time: a file of many blocks
    /// (plain and gzip, a line cut by every block boundary somewhere) loads every line, and its
    /// bad lines are reported with their exact numbers, in order, as they were one block.
    #[test]
    fn a_file_of_many_blocks_reports_its_bad_lines_by_number() {
        use std::io::Write as _;
        let dir = std::env::temp_dir().join(format!("allocview-blocks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut text = String::new();
        let bad = [77_777u64, 150_001, 299_999];
        for n in 1..=300_000u64 {
            if bad.contains(&n) {
                text.push_str(&format!("0.{n:06}\t1\tx{n}\t0x10\n"));
            } else if n % 2 == 1 {
                text.push_str(&format!("0.{n:06}\t1\t{}\t0x{:x}\n", n % 1000, 16 * n));
            } else {
                text.push_str(&format!("0.{n:06}\t1\t-1\t0x{:x}\n", 16 * (n - 1)));
            }
        }
        let plain = dir.join("many.trace");
        std::fs::write(&plain, &text).unwrap();
        let gz = dir.join("many.trace.gz");
        let mut enc = flate2::write::GzEncoder::new(
            std::fs::File::create(&gz).unwrap(),
            flate2::Compression::fast(),
        );
        enc.write_all(text.as_bytes()).unwrap();
        enc.finish().unwrap();
        for path in [&plain, &gz] {
            let err = load_malloc_trace(path, &LoadOptions::default())
                .err()
                .unwrap();
            assert!(err.to_string().contains("line 77777, column 12"), "{err}");
            let lenient = LoadOptions {
                strictness: Strictness::Lenient,
                ..LoadOptions::default()
            };
            let t = load_malloc_trace(path, &lenient).unwrap();
            assert_eq!(t.summary.bad_lines, 3);
            let lines: Vec<u64> = t.summary.first_bad_lines.iter().map(|e| e.line).collect();
            assert_eq!(lines, bad);
            // Every good line: the bad ones were odd (allocations), so their frees are unknown.
            assert_eq!(t.summary.mallocs, 150_000 - 3);
            assert_eq!(t.summary.frees, 150_000);
            assert_eq!(t.summary.frees_unknown, 3);
            assert_eq!(t.summary.text_bytes, text.len() as u64);
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A trailer claiming 4 GiB for a small file does not size the reservation; a plausible
    /// one does.
    #[test]
    fn a_forged_gzip_size_does_not_size_the_reservation() {
        use std::io::Write as _;
        let dir = std::env::temp_dir().join(format!("allocview-isize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, isize: u32| {
            let path = dir.join(name);
            let mut bytes = vec![0x1f, 0x8b];
            bytes.resize(10_000, 0);
            bytes.extend_from_slice(&isize.to_le_bytes());
            std::fs::File::create(&path)
                .unwrap()
                .write_all(&bytes)
                .unwrap();
            path
        };
        let forged = write("forged.gz", u32::MAX);
        let plain = write("plain.gz", 100_000);
        let n = estimate_events(&forged, Compression::Gzip, 10_004);
        assert_eq!(n, (10_004 * 5 / TYPICAL_LINE_BYTES + 1024) as usize);
        let n = estimate_events(&plain, Compression::Gzip, 10_004);
        assert_eq!(n, (100_000 / TYPICAL_LINE_BYTES + 1024) as usize);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Live bytes past 2^64 - 1 are refused at the line that gets there (strict), or that line
    /// is counted as bad (lenient), and the statistics then add up without wrapping.
    #[test]
    fn sizes_adding_up_past_64_bits_are_refused_at_their_line() {
        let dir = std::env::temp_dir().join(format!("allocview-wrap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("wrap.trace");
        std::fs::write(
            &path,
            "0.000001\t1\t18446744073709551600\t0x1000\n\
             0.000002\t1\t100\t0x2000\n\
             0.000003\t1\t-1\t0x1000\n\
             0.000004\t1\t100\t0x3000\n",
        )
        .unwrap();
        let strict = LoadOptions::default();
        let err = load_malloc_trace(&path, &strict).err().unwrap().to_string();
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("below 2^64"), "{err}");
        assert!(err.contains("wrap.trace"), "{err}");
        let lenient = LoadOptions {
            strictness: Strictness::Lenient,
            ..LoadOptions::default()
        };
        let t = load_malloc_trace(&path, &lenient).unwrap();
        // The total of allocations so far also has to fit: after the huge block is freed, the
        // 100-byte block of line 4 passes the live check but not the total.
        assert_eq!(t.summary.bad_lines, 2);
        assert_eq!(t.summary.first_bad_lines[1].line, 4);
        assert_eq!(t.summary.mallocs, 1);
        assert_eq!(t.events.height(), 2);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn parses_fields() {
        let l = parse_line(b"1.000002\t77\t-1\t(nil)").ok().unwrap();
        assert_eq!(l.t_ns, 1_000_002_000);
        assert_eq!(l.tid, 77);
        assert_eq!(l.size_bytes, None);
        assert_eq!(l.addr, 0);
        let l = parse_line(b"0.5\t1\t10\t0xABCdef\tcalloc").ok().unwrap();
        assert_eq!(l.t_ns, 500_000_000);
        assert_eq!(l.size_bytes, Some(10));
        assert_eq!(l.addr, 0xabcdef);
        assert_eq!(l.call, call_code(b"calloc"));
        assert_eq!(
            CALL_NAMES.get(usize::from(l.call.unwrap())),
            Some(&"calloc")
        );
    }

    #[test]
    fn field_errors_point_at_the_field() {
        let e = parse_line(b"0.1\t1\t-2\t0x10").err().unwrap();
        assert_eq!((e.offset, e.field), (6, "size"));
        let e = parse_line(b"0.1\t1\t5\t0xZZ").err().unwrap();
        assert_eq!((e.offset, e.field), (8, "pointer"));
        let e = parse_line(b"0.1\t1\t5").err().unwrap();
        assert_eq!(e.field, "pointer");
        let e = parse_line(b"x\t1\t5\t0x1").err().unwrap();
        assert_eq!((e.offset, e.field), (0, "time"));
        let e = parse_line(b"0.1\t1\t5\t0x1\tmalloc\textra").err().unwrap();
        assert_eq!(e.field, "end of line");
        let e = parse_line(b"0.1\t1\t5\t0x1\tmallocx").err().unwrap();
        assert_eq!((e.offset, e.field), (12, "call"));
        assert!(parse_line(b"0.1\t1\t99999999999999999999999\t0x1").is_err());
        assert!(parse_line(b"0.1234567890\t1\t5\t0x1").is_err());
    }
}
