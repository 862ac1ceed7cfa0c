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

use std::path::Path;
use std::time::Instant;

use crate::error::LoadError;
use crate::events::{
    Builder, Line, LoadOptions, LoadSummary, MallocTrace, Record, Requests, call_code,
};
use crate::input::{Compression, TextStream};

mod text;

use text::read_text;

/// Where parsed lines go: the DataFrame [`Builder`], or a callback over raw [`Record`]s.
pub(crate) trait LineSink {
    fn push_line(&mut self, line: &Line) -> Result<(), &'static str>;
    fn summary_mut(&mut self) -> &mut LoadSummary;
}

/// The [`Builder`] taking one view of the requests of a trace recorded in a CPython
/// interpreter (`record --text` writes the recorded addresses, tags included: see
/// [`Requests`]).
struct ViewSink<'a> {
    b: &'a mut Builder,
    requests: Requests,
}

impl LineSink for ViewSink<'_> {
    fn push_line(&mut self, line: &Line) -> Result<(), &'static str> {
        match line.viewed(self.requests, &mut self.b.summary) {
            Some(line) => self.b.push(&line),
            None => Ok(()),
        }
    }
    fn summary_mut(&mut self) -> &mut LoadSummary {
        &mut self.b.summary
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
            heap: 0,
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
        python: false,
    })
}

pub(crate) fn shorten(bytes: &[u8]) -> String {
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
    let mut sink = ViewSink {
        b: &mut b,
        requests: opts.requests,
    };
    read_text(stream, path, opts, &mut sink)?;
    let (events, threads, summary) = b.finish()?;
    Ok(MallocTrace {
        memory: Vec::new(),
        memory_series: crate::events::RecordedSeries::ProcessResident,
        mappings: Vec::new(),
        marks: Vec::new(),
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
        // A zstd frame may state its content size, but nothing here trusts it: a typical ratio.
        Compression::Zstd => file_bytes.saturating_mul(5),
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
    use crate::events::{CALL_NAMES, Strictness};

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
