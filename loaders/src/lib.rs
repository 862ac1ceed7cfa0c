//! allocview's loaders: input files into polars DataFrames with documented schemas.
//!
//! Entry points: [`load`] (any supported file, kind detected from content),
//! [`malloc_trace::load_malloc_trace`], and [`trace_view`] to hand an event DataFrame to the
//! simulator without copying. [`events`] holds what the formats share: the [`MallocTrace`]
//! event table and its builder, the load options and the summary. The formats: [`malloc_trace`] (libtracemalloc
//! text), [`binary`] (allocview's own traces and the tracer's spools), [`tf`] (TensorFlow BFC
//! dumps, and memory logs in this event schema), [`pytorch`] (CUDA memory snapshots), [`plan`]
//! (memory plans), [`memray`] (memray captures). What is worked out from a loaded input (statistics, sites, the BFC replay
//! against a TensorFlow log) is in [`analysis`].
//!
//! # The event DataFrame
//!
//! One row per event, in file order. Columns are single-chunk and contiguous, so the simulator
//! replays straight from them.
//!
//! | column | dtype | meaning |
//! |---|---|---|
//! | `t_ns` | Int64 | time in nanoseconds, as written in the file (never decreasing; see the summary) |
//! | `thread` | UInt8, or UInt16 past 256 threads | index into the threads table (first appearance order) |
//! | `kind` | UInt8 | 0 `alloc`, 1 `free`, 2 `free_null`, 3 `free_unknown`, 4 `alloc_failed` ([`allocview_sim::trace::EventKind`]) |
//! | `size_bytes` | UInt64 | requested bytes; for a `free`, the size of the allocation it ends; 0 when unknown |
//! | `address` | UInt64 | the pointer (0 for NULL) |
//! | `alloc_id` | UInt32, nullable | dense 0-based id of the allocation, in allocation order; a `free` carries the id it ends; null when the event belongs to no allocation |
//! | `size_class` | UInt8 | bit length of `size_bytes` (1 -> 1, 2..3 -> 2, 4..7 -> 3, ...) |
//! | `call` | UInt8, optional | only for traces with the fifth column: index into [`events::CALL_NAMES`] |
//!
//! That is 31 bytes per event (32 with `call`).
//!
//! # The threads table
//!
//! `thread` (UInt16, the index used in the events) and `tid` (UInt64, the id in the file).

pub mod analysis;
pub mod binary;
pub mod error;
pub mod events;
pub mod export;
pub mod foreign;
#[doc(hidden)]
pub mod fuzzing;
pub mod heaptrack;
pub mod input;
pub mod kineto;
pub mod malloc_trace;
pub mod memray;
pub mod plan;
pub mod profile;
pub mod pytorch;
pub mod sites;
pub mod tf;
pub mod window;

use std::path::Path;

use allocview_sim::trace::{NO_ALLOC_ID, TraceView};
use polars::prelude::*;

pub use error::{LineError, LoadError};
pub use events::{LoadOptions, LoadSummary, MallocTrace, RecordedSeries, Requests, Strictness};

/// The kinds of input allocview reads, told apart by content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// libtracemalloc text (plain or gzip).
    MallocTrace,
    /// allocview's binary trace (or a tracer spool): loads into the same DataFrame.
    BinaryTrace,
    /// A TensorFlow log with `__LOG_MEMORY__` records (possibly ending in a BFC dump).
    TfMemoryLog,
    /// A TensorFlow log with a BFC allocator dump and no memory-log records.
    TfBfcDump,
    /// A memory plan: a minimalloc CSV or a JSON graph plan ([`plan`]).
    Plan(plan::PlanFormat),
    /// A PyTorch CUDA memory snapshot pickle ([`pytorch`]).
    PytorchSnapshot,
    /// A heap profile: pprof's `profile.proto` or DHAT's JSON ([`profile`]).
    HeapProfile(profile::ProfileFormat),
    /// A PyTorch profiler (Kineto) trace with `[memory]` events ([`kineto`]): loads into the
    /// malloc-trace DataFrame.
    KinetoTrace,
    /// A heaptrack data file (plain, gzip or zstd; [`heaptrack`]): loads into the same
    /// DataFrame as a malloc trace.
    Heaptrack,
    /// A memray capture file (`memray run -o`, [`memray`]): loads into the event DataFrame.
    Memray,
}

/// Most bytes [`detect`] reads to recognise a libtracemalloc trace.
const DETECT_TEXT_BYTES: u64 = 1 << 20;

/// Tells what kind of input a file holds, from its first bytes (decompressed).
///
/// # Errors
/// When the file cannot be read or is of no known kind.
pub fn detect(path: &Path) -> Result<InputKind, LoadError> {
    use std::io::{BufRead as _, Read as _};
    let (_, head) = input::sniff(path)?;
    if binary::is_binary(&head) {
        return Ok(InputKind::BinaryTrace);
    }
    if pytorch::is_snapshot(&head) {
        return Ok(InputKind::PytorchSnapshot);
    }
    if memray::is_capture(&head) {
        return Ok(InputKind::Memray);
    }
    let mut json_head = Vec::new();
    input::open_text(path)?
        .take(kineto::DETECT_HEAD_BYTES)
        .read_to_end(&mut json_head)
        .ok();
    if kineto::is_kineto(&json_head) {
        return Ok(InputKind::KinetoTrace);
    }
    if let Some(format) = profile::detect(&json_head) {
        return Ok(InputKind::HeapProfile(format));
    }
    if let Some(format) = plan::detect_plan(path)? {
        return Ok(InputKind::Plan(format));
    }
    // The first 20 lines decide; a file whose first line is gigabytes long is not read whole.
    let mut reader = input::open_text(path)?.take(DETECT_TEXT_BYTES);
    let mut head_lines = Vec::new();
    let mut line = String::new();
    // A file that fails to decompress here is reported by the full load with its details.
    while head_lines.len() < 20 {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => head_lines.push(line.trim_end().to_owned()),
        }
    }
    let head_lines: Vec<&str> = head_lines.iter().map(String::as_str).collect();
    if heaptrack::is_heaptrack(&head_lines) {
        return Ok(InputKind::Heaptrack);
    }
    if let Some(line) = head_lines.iter().find(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split('\t').collect();
        if (4..=5).contains(&fields.len())
            && fields
                .first()
                .is_some_and(|t| t.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
        {
            return Ok(InputKind::MallocTrace);
        }
    }
    match tf::detect_kind(path)? {
        Some(tf::TfKind::MemoryLog) => return Ok(InputKind::TfMemoryLog),
        Some(tf::TfKind::BfcDump) => return Ok(InputKind::TfBfcDump),
        None => {}
    }
    // A CSV header with a misspelled column says so rather than "unrecognised".
    let mut text = String::new();
    let mut head = input::open_text(path)?.take(plan::DETECT_HEAD_BYTES);
    if head.read_line(&mut text).is_ok()
        && let Some(problem) = plan::minimalloc::header_problem(text.trim())
    {
        return Err(LoadError::format(
            path,
            format!("{problem} ({UNRECOGNISED})"),
        ));
    }
    Err(LoadError::format(path, UNRECOGNISED))
}

/// What [`detect`] says of a file of no known kind.
const UNRECOGNISED: &str = "unrecognised input: expected a libtracemalloc trace (lines of \
         `<sec>.<usec>\\t<thread>\\t<size>\\t<pointer>`, plain or gzip), an allocview binary \
         trace, a heaptrack data file, a memray capture, a TensorFlow memory log or BFC dump, \
         a PyTorch memory snapshot (a pickle holding `segments`), a PyTorch profiler trace \
         (JSON with `traceEvents`), a pprof heap profile, DHAT's JSON, a minimalloc CSV or a \
         JSON graph plan";

/// Borrows the simulator's view of an event DataFrame (no copy) and validates it.
///
/// # Errors
/// When a column is missing, has the wrong dtype or is not contiguous, or the events break a
/// [`TraceView`] invariant.
pub fn trace_view<'a>(events: &'a DataFrame, path: &Path) -> Result<TraceView<'a>, LoadError> {
    let t_ns = contiguous(events.column("t_ns")?.i64()?, path, "t_ns")?;
    let kind = contiguous(events.column("kind")?.u8()?, path, "kind")?;
    let size_bytes = contiguous(events.column("size_bytes")?.u64()?, path, "size_bytes")?;
    let alloc_id = raw_values(events.column("alloc_id")?.u32()?, path, "alloc_id")?;
    TraceView::new(t_ns, kind, size_bytes, alloc_id).map_err(|source| LoadError::Trace {
        path: path.to_path_buf(),
        source,
    })
}

fn contiguous<'a, T: PolarsNumericType>(
    ca: &'a ChunkedArray<T>,
    path: &Path,
    name: &str,
) -> Result<&'a [T::Native], LoadError> {
    ca.cont_slice().map_err(|_| {
        LoadError::format(
            path,
            format!("column {name} is not one contiguous chunk without nulls"),
        )
    })
}

/// The value buffer of a single-chunk column, nulls included (their slots hold a sentinel).
fn raw_values<'a>(ca: &'a UInt32Chunked, path: &Path, name: &str) -> Result<&'a [u32], LoadError> {
    let mut chunks = ca.downcast_iter();
    match (chunks.next(), chunks.next()) {
        (Some(arr), None) => {
            let values = arr.values().as_slice();
            // Null slots must hold the sentinel, or the simulator would misread them.
            if let Some(validity) = arr.validity()
                && values
                    .iter()
                    .zip(validity.iter())
                    .any(|(&v, valid)| !valid && v != NO_ALLOC_ID)
            {
                return Err(LoadError::format(
                    path,
                    format!("column {name}: null slots must hold {NO_ALLOC_ID}"),
                ));
            }
            Ok(values)
        }
        (None, _) => Ok(&[]),
        _ => Err(LoadError::format(
            path,
            format!("column {name} is not one contiguous chunk"),
        )),
    }
}

/// A loaded input of any kind.
#[derive(Clone, Debug)]
// One value per loaded file: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Loaded {
    MallocTrace(MallocTrace),
    /// A TensorFlow memory log; a BFC dump it ends in is in its `dumps`.
    TfMemoryLog(Box<tf::memlog::TfMemoryLog>),
    /// The first BFC dump of a TensorFlow log.
    TfBfcDump(Box<tf::dump::BfcDump>),
    /// A memory plan's buffers.
    Plan(Box<plan::MemoryPlan>),
    /// A PyTorch memory snapshot.
    PytorchSnapshot(Box<pytorch::PytorchSnapshot>),
    /// A heap profile: a moment by call stack, without events.
    HeapProfile(Box<profile::HeapProfile>),
}

/// Loads any supported file, detecting its kind from content.
///
/// # Errors
/// See [`detect`] and the kind-specific loaders.
pub fn load(path: &Path, opts: &LoadOptions) -> Result<Loaded, LoadError> {
    match detect(path)? {
        InputKind::MallocTrace => Ok(Loaded::MallocTrace(malloc_trace::load_malloc_trace(
            path, opts,
        )?)),
        InputKind::BinaryTrace => Ok(Loaded::MallocTrace(binary::load_binary(path, opts)?)),
        InputKind::Heaptrack => Ok(Loaded::MallocTrace(heaptrack::load_heaptrack(path, opts)?)),
        InputKind::TfMemoryLog => Ok(Loaded::TfMemoryLog(Box::new(tf::memlog::load_memory_log(
            path,
        )?))),
        InputKind::TfBfcDump => Ok(Loaded::TfBfcDump(Box::new(tf::dump::load_bfc_dump(path)?))),
        InputKind::Plan(_) => Ok(Loaded::Plan(Box::new(plan::load_plan_file(path, opts)?))),
        InputKind::PytorchSnapshot => Ok(Loaded::PytorchSnapshot(Box::new(
            pytorch::load_snapshot(path, opts)?,
        ))),
        InputKind::HeapProfile(format) => Ok(Loaded::HeapProfile(Box::new(profile::load_profile(
            path,
            format,
            opts.strictness,
        )?))),
        InputKind::KinetoTrace => Ok(Loaded::MallocTrace(kineto::load_kineto(path, opts)?)),
        InputKind::Memray => Ok(Loaded::MallocTrace(memray::load_memray(path, opts)?)),
    }
}
