//! The event table every loader builds, and its load options and summary.
//!
//! The libtracemalloc text ([`crate::malloc_trace`]) and allocview's binary traces and spools
//! ([`crate::binary`]) hand their calls over as `Line`s or [`Record`]s; the `Builder` pairs
//! frees with allocations and builds the event DataFrame and threads table of the crate docs, a
//! [`MallocTrace`] (or, in batches, the export schema of [`crate::export`]). The other formats
//! build the same schema their own way, and share the rest: the [`LoadOptions`] ([`Strictness`])
//! that [`crate::load`] passes on, the [`LoadSummary`] of a trace's load (with the [`Damage`] a
//! binary file may show), the `call` column's codes ([`CALL_NAMES`]) and the pointer-keyed maps
//! (`PtrMap`, `PtrSet`) of the pairing and the formats.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use polars::prelude::*;

use crate::error::LineError;
use crate::input::Compression;
use crate::sites::StackTable;

mod builder;
mod requests;

pub use builder::alloc_id_column;
pub(crate) use builder::{Builder, Pairing, ThreadIds};
pub use requests::Requests;

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

/// Options of a load, whatever the format ([`crate::load`] and each format's own loader).
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    pub strictness: Strictness,
    /// Receives the number of file bytes read so far (for a progress bar).
    pub progress: Option<Arc<AtomicU64>>,
    /// Which requests of a trace recorded in a CPython interpreter to read.
    pub requests: Requests,
    /// Of a PyTorch profiler trace, which device's events to read (default: the GPU with the
    /// most events, else the CPU).
    pub device: Option<crate::kineto::DeviceChoice>,
    /// Of a binary trace, which heap's events to read: 0 (the default) for the malloc
    /// family's, another id for a heap the program reported itself (resolve a name with
    /// [`crate::binary::resolve_heap`]). Other formats have heap 0 only.
    pub heap: u32,
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
    /// Frees (and reallocs) of pointers never allocated in the trace, where none was expected:
    /// of a trace recorded from the middle of a run, they are in `frees_before_recording`.
    pub frees_unknown: u64,
    /// The recording began after the program started (META `started_mid_run=1`, written by
    /// `allocview attach`): frees of blocks it never saw allocated are expected.
    pub started_mid_run: bool,
    /// Of a trace started mid-run, the frees (and reallocs) of blocks allocated before the
    /// recording started: not unknown frees, not errors. Kept as `free_unknown` events.
    pub frees_before_recording: u64,
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
    pub damaged: Vec<Damage>,
    /// Events lost to that damage, when the file says how many it held.
    pub events_lost: Option<u64>,
    /// True when lines carried the fifth (call name) column.
    pub has_call_column: bool,
    /// Events of a trace recorded in a CPython interpreter that came through Python's
    /// allocator and are in the view read ([`Requests`]), and events left out as belonging
    /// to the other view only.
    pub python_allocator_events: u64,
    pub other_view_events: u64,
    /// Events of a binary trace left out as belonging to another heap than the one read (the
    /// malloc family's by default; see [`LoadOptions::heap`]).
    pub other_heap_events: u64,
    /// Of `frees_unknown`, frees of Python objects allocated before the trace began (during
    /// the interpreter's start-up, or in the parent of a forked process).
    pub frees_unknown_python: u64,
    /// Decompressed bytes parsed.
    pub text_bytes: u64,
    /// What the reader of another tool's format says of what that format keeps (lifetimes
    /// it could only approximate, fields it could not read): said on every load.
    pub notes: Vec<String>,
    /// Of a PyTorch profiler trace read for a GPU (`cuda:0`, `hip:0`): the device. Its
    /// events are PyTorch's caching allocator's, replayed like a snapshot's.
    pub gpu_device: Option<String>,
}

impl LoadSummary {
    /// Counts `n` frees of pointers never allocated in the trace, `python` of them Python
    /// objects: unknown frees, or, in a trace started mid-run, frees of blocks allocated
    /// before the recording started. Every count of such frees goes through here (the
    /// pairing's, and a window's recount from the event kinds), so that the two are told
    /// apart in one place.
    pub fn add_frees_unknown(&mut self, n: u64, python: u64) {
        if self.started_mid_run {
            self.frees_before_recording += n;
        } else {
            self.frees_unknown += n;
            self.frees_unknown_python += python;
        }
    }

    /// Marks the trace as recorded from the middle of a run: the unknown frees counted so far
    /// (the META line may be read after the events) and those to come are frees of blocks
    /// allocated before the recording started.
    pub fn mark_started_mid_run(&mut self) {
        if !self.started_mid_run {
            self.started_mid_run = true;
            self.frees_before_recording += self.frees_unknown;
            self.frees_unknown = 0;
            self.frees_unknown_python = 0;
        }
    }

    /// Sets the unknown frees to `n` (a recount of a window's event kinds), split as
    /// [`Self::add_frees_unknown`] does.
    pub fn set_frees_unknown(&mut self, n: u64) {
        self.frees_unknown = 0;
        self.frees_before_recording = 0;
        self.add_frees_unknown(n, 0);
    }

    /// Human-readable warnings (empty when the load was clean).
    #[must_use]
    pub fn warnings(&self) -> Vec<String> {
        let mut out = self.notes.clone();
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
                    "{n} events lost (the file counts {}, {} were read)",
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
        let python = self.frees_unknown_python.min(self.frees_unknown);
        if self.frees_unknown > python {
            out.push(format!(
                "{} frees of pointers that were never allocated in the trace (kept as free_unknown \
                 events; typical of tracers that do not trace calloc/realloc)",
                self.frees_unknown - python
            ));
        }
        if python > 0 {
            out.push(format!(
                "{python} frees of Python objects allocated before the trace began (during the \
                 interpreter's start-up, before the tracer joined it, or in the parent of a \
                 forked process; kept as free_unknown events)"
            ));
        }
        if self.frees_before_recording > 0 {
            out.push(format!(
                "{} frees of blocks allocated before recording started (the recording began in \
                 the middle of the run, or was stopped for a while; expected, not errors)",
                self.frees_before_recording
            ));
        }
        if self.mallocs_of_live_ptr > 0 {
            out.push(format!(
                "{} allocations returned a pointer that was still live; the trace missed their \
                 frees, so the older allocations were ended there{}",
                self.mallocs_of_live_ptr,
                if self.started_mid_run {
                    " (expected where recording was stopped for a while: the frees were made \
                     then)"
                } else {
                    ""
                }
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

/// A damaged stretch of a binary trace: a frame that did not read, followed by frames that do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// File offset of the frame that did not read.
    pub offset: u64,
    /// Bytes skipped from there to the next frame that reads (0 when repaired).
    pub skipped_bytes: u64,
    /// What was wrong with the frame.
    pub what: String,
    /// Only the frame's length was wrong: its contents, up to where the next frame starts,
    /// read in full, so nothing was lost.
    pub repaired: bool,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.repaired {
            write!(
                f,
                "byte {}: {}; repaired (the frame ends where the next one starts), nothing lost",
                self.offset, self.what
            )
        } else {
            write!(
                f,
                "byte {}: {}; skipped {} bytes",
                self.offset, self.what, self.skipped_bytes
            )
        }
    }
}

/// What a trace's recorded memory series ([`MallocTrace::memory`]) measures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecordedSeries {
    /// The program's resident set, sampled by `record` (resident and anonymous bytes).
    #[default]
    ProcessResident,
    /// The bytes a caching allocator held reserved from the device, as it reported them with
    /// each of its events (a PyTorch profiler trace's `Total Reserved`); both fields of a
    /// sample hold it.
    AllocatorReserved,
    /// The program's whole resident set as another tool sampled it (heaptrack's `R` lines):
    /// no anonymous part and no mapping calls were recorded; both fields of a sample hold it.
    ResidentOnly,
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
    pub stacks: Option<StackTable>,
    /// The recorded program's resident memory over time (a trace made by `record`; empty
    /// for other inputs): a measurement, on the events' time axis.
    pub memory: Vec<crate::binary::MemorySample>,
    /// What `memory` measures.
    pub memory_series: RecordedSeries,
    /// The mapping calls the recorded program made outside the allocator (a trace made by
    /// `record`).
    pub mappings: Vec<crate::binary::Mapping>,
    /// The run's marks: named moments, and where recording stopped and started (a trace
    /// made by `record`, see [`crate::binary::marks`]).
    pub marks: Vec<crate::binary::Mark>,
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

/// One parsed line (or one record of a binary trace): what the [`Builder`] pairs into events.
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
    /// The event came through Python's allocator (a recording in a CPython interpreter).
    pub(crate) python: bool,
}

impl Line {
    /// The loader's line for a binary record, in the view `requests` of heap `heap` (`None`
    /// for a record of the other view only or of another heap, counted in `summary`): times
    /// before 0 are clamped to 0.
    #[inline(always)]
    pub(crate) fn of_record(
        r: &Record,
        requests: Requests,
        heap: u32,
        summary: &mut LoadSummary,
    ) -> Option<Self> {
        if r.heap != heap {
            summary.other_heap_events += 1;
            return None;
        }
        Self {
            t_ns: r.t_ns.max(0),
            tid: r.tid,
            size_bytes: r.size_bytes,
            addr: r.addr,
            call: r.call,
            stack: r.stack,
            python: false,
        }
        .viewed(requests, summary)
    }

    /// This line in the view `requests` (its address's allocator tag cleared and noted in
    /// `python`), or `None` for a line of the other view only; both counted in `summary`.
    #[inline(always)]
    pub(crate) fn viewed(self, requests: Requests, summary: &mut LoadSummary) -> Option<Self> {
        let Some(addr) = requests.view(self.addr) else {
            summary.other_view_events += 1;
            return None;
        };
        let python = Requests::is_python(self.addr);
        summary.python_allocator_events += u64::from(python);
        Some(Self {
            addr,
            python,
            ..self
        })
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
    /// The heap the event belongs to: 0 for the malloc family, another number for a heap the
    /// program reported itself (`allocview.h`, see `binary/heaps.rs`; binary traces only).
    pub heap: u32,
}
