//! TensorFlow memory logs (`__LOG_MEMORY__` lines, `TF_CPP_VMODULE=log_memory=2`), into the
//! event DataFrame of malloc traces.
//!
//! Each record is `__LOG_MEMORY__ <Message> { <protobuf short debug string> }`
//! (`reference/allocators.md` section 2). Newer protobuf puts a random marker
//! (`goo.gle/debugproto`, `goo.gle/debugonly`) right after the `{`; proto3 omits zero and false
//! fields, which default here. Allocations (`MemoryLogTensorAllocation`,
//! `MemoryLogRawAllocation`) pair with deallocations (`MemoryLogTensorDeallocation`,
//! `MemoryLogRawDeallocation` that is not `deferred`) by (allocator name, allocation id), since
//! BFC's allocation ids are its allocation counter. Lines of several threads interleave, and
//! timestamps of different threads are not monotonic: they are clamped and counted, as for
//! malloc traces. `MemoryLogTensorOutput` repeats an existing allocation; when it names one the
//! log never showed allocated (a model variable), it is kept in [`TfMemoryLog::outputs`].
//!
//! Beside the records the loader collects the BFC's own `bfc_allocator=1` lines (`Extending
//! allocation by ...`, `Allocated memory at 0x... to 0x...`: the regions, in order), the
//! `MEMINFO <tag> {"current": N, "peak": N}` lines printed from
//! `tf.config.experimental.get_memory_info`, and any BFC dump in the log: a log that ends in an
//! OOM dump yields both the trace and the dump, and the failed request becomes an
//! `alloc_failed` event at the dump's place.
//!
//! One allocator's records make the events (by default the BFC allocator named in `Creating new
//! BFCAllocator named: ...`, else the one with the most records); the others are counted.
//!
//! # Extra event columns (after the malloc-trace columns)
//!
//! | column | dtype | meaning |
//! |---|---|---|
//! | `record` | UInt8 | [`RecordKind`] code: 0 tensor allocation, 1 tensor deallocation, 2 raw allocation, 3 raw deallocation, 4 OOM request of a dump |
//! | `line` | UInt64 | 1-based line in the file |
//! | `allocator` | String | allocator name |
//! | `step` | Int64, nullable | step id (deallocations of tensors carry none) |
//! | `kernel` | String, nullable | kernel name (tensors) or operation (raw records) |
//! | `requested_bytes` | UInt64 | bytes the client asked for (for a free: of the allocation it ends) |
//! | `allocated_bytes` | UInt64, nullable | BFC's chunk size as TF logged it (raw records do not say) |
//! | `tf_alloc_id` | Int64, nullable | TensorFlow's own allocation id |
//!
//! `address` is TensorFlow's real pointer (for a free: that of the allocation it ends; 0 when
//! the log never said).
//!
//! The code follows the loader's seams: `lines` (what each line holds), `builder` (the pairing
//! into events, and the DataFrames).

use std::path::Path;
use std::time::Instant;

use allocview_sim::trace::EventKind;
use polars::prelude::*;

use super::dump::{BfcDump, parse_bfc_dumps};
use super::human::ByteCount;
use crate::error::LoadError;
use crate::input::{StreamEnd, read_all};

mod builder;
mod lines;

use builder::Builder;
use lines::{Item, Scan, scan_lines};

/// The marker every memory-log record starts with.
pub const LOG_MEMORY_LABEL: &str = "__LOG_MEMORY__";

/// What a row of the event DataFrame came from (the `record` column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordKind {
    TensorAllocation = 0,
    TensorDeallocation = 1,
    RawAllocation = 2,
    RawDeallocation = 3,
    /// The failed request of a BFC dump in the log (an `alloc_failed` event).
    OomRequest = 4,
}

impl RecordKind {
    /// The code in the `record` column.
    #[must_use]
    pub fn code(self) -> u8 {
        self as u8
    }

    /// True for allocations (tensor or raw).
    #[must_use]
    pub fn is_allocation(self) -> bool {
        matches!(self, Self::TensorAllocation | Self::RawAllocation)
    }
}

/// Options for [`load_memory_log_with`].
#[derive(Clone, Debug, Default)]
pub struct MemlogOptions {
    /// Keep this allocator's records (default: the BFC allocator).
    pub allocator: Option<String>,
}

/// One row of the event DataFrame, typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    pub record: RecordKind,
    pub kind: EventKind,
    /// 1-based line in the file.
    pub line: u64,
    /// Time after clamping (the `t_ns` column).
    pub t_ns: i64,
    /// Index into the threads table.
    pub thread: u16,
    /// TensorFlow's allocation id (0 for an OOM request).
    pub tf_alloc_id: i64,
    /// Dense trace id ([`NO_ALLOC_ID`](allocview_sim::trace::NO_ALLOC_ID) for events of no known
    /// allocation).
    pub alloc_id: u32,
    /// TF's pointer (for a free: of the allocation it ends; 0 when unknown).
    pub ptr: u64,
    pub requested_bytes: u64,
    /// Chunk size as TF logged it (tensor records only).
    pub allocated_bytes: Option<u64>,
    pub step: Option<i64>,
    pub kernel: Option<String>,
}

/// A `MemoryLogTensorOutput` of the selected allocator whose allocation the log never showed
/// (a model variable): the only trace of a chunk that is live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorOutput {
    pub line: u64,
    pub tf_alloc_id: i64,
    pub ptr: u64,
    pub requested_bytes: u64,
    pub allocated_bytes: Option<u64>,
    pub kernel: Option<String>,
    pub step: Option<i64>,
    /// Index of the logging thread in the threads table (`None` for a thread with no event).
    pub thread: Option<u16>,
    /// Events before it.
    pub events_before: usize,
}

/// One region the BFC added (`Allocated memory at 0x... to 0x...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionGrowth {
    pub line: u64,
    pub base: u64,
    pub size_bytes: u64,
    /// The `Extending allocation by X bytes for NAME.` figure before it.
    pub extend_by: Option<ByteCount>,
    pub allocator: Option<String>,
    /// Events before it.
    pub events_before: usize,
}

/// A `MEMINFO <tag> {"current": N, "peak": N}` line (consecutive duplicates dropped: the
/// workload prints each to stdout and stderr).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemInfo {
    pub line: u64,
    pub tag: String,
    pub current_bytes: u64,
    pub peak_bytes: u64,
    /// Events before it.
    pub events_before: usize,
}

/// What the loader counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemlogSummary {
    pub lines: u64,
    /// `__LOG_MEMORY__` records of all allocators (Step records included).
    pub records: u64,
    pub tensor_allocations: u64,
    pub tensor_deallocations: u64,
    pub raw_allocations: u64,
    pub raw_deallocations: u64,
    /// Raw deallocations marked `deferred` (always followed by a real one; skipped).
    pub raw_deallocations_deferred: u64,
    pub tensor_outputs: u64,
    pub steps: u64,
    /// Tensor allocations without a buffer (empty tensors: no allocation description).
    pub tensors_without_buffer: u64,
    /// Frees of allocations the log never showed allocated (`free_unknown` events).
    pub frees_unknown: u64,
    /// Allocations whose id was already live (the older one is ended first).
    pub duplicate_allocation_ids: u64,
    pub timestamps_non_monotonic: u64,
    /// Records that could not be read (first lines kept).
    pub unreadable_records: u64,
    pub first_unreadable_lines: Vec<u64>,
    /// Set when a gzip stream ended early.
    pub truncated: Option<String>,
}

impl MemlogSummary {
    /// Human-readable warnings (empty when the load was clean).
    #[must_use]
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(why) = &self.truncated {
            out.push(format!("the compressed stream is truncated ({why})"));
        }
        if self.unreadable_records > 0 {
            out.push(format!(
                "{} memory-log records could not be read (first at lines {:?})",
                self.unreadable_records, self.first_unreadable_lines
            ));
        }
        if self.frees_unknown > 0 {
            out.push(format!(
                "{} deallocations of allocations the log never showed (kept as free_unknown)",
                self.frees_unknown
            ));
        }
        if self.duplicate_allocation_ids > 0 {
            out.push(format!(
                "{} allocations reused an allocation id that was still live",
                self.duplicate_allocation_ids
            ));
        }
        out
    }
}

/// A loaded memory log.
#[derive(Clone, Debug)]
pub struct TfMemoryLog {
    /// The allocator whose records make the events.
    pub allocator: String,
    /// Allocation and deallocation records per allocator name (all allocators).
    pub allocator_counts: Vec<(String, u64)>,
    /// Names from `Creating new BFCAllocator named: ...`.
    pub bfc_allocators: Vec<String>,
    /// One row per event: the malloc-trace schema plus the extra columns in the module docs.
    pub events: DataFrame,
    /// `thread` (UInt16) and `tid` (UInt64, the id in the log prefix; 0 when absent).
    pub threads: DataFrame,
    /// The events, typed (same order as the rows).
    pub records: Vec<LogRecord>,
    pub outputs: Vec<TensorOutput>,
    pub regions: Vec<RegionGrowth>,
    pub meminfo: Vec<MemInfo>,
    /// BFC dumps found in the log (usually the one at its end).
    pub dumps: Vec<BfcDump>,
    pub summary: MemlogSummary,
    pub load_seconds: f64,
}

/// Loads a memory log (plain or gzip) with the default options.
///
/// # Errors
/// When the file cannot be read, holds no `__LOG_MEMORY__` record, or the allocator is absent.
pub fn load_memory_log(path: &Path) -> Result<TfMemoryLog, LoadError> {
    load_memory_log_with(path, &MemlogOptions::default())
}

/// Loads a memory log, keeping the allocator `opts.allocator` names.
///
/// # Errors
/// See [`load_memory_log`].
pub fn load_memory_log_with(path: &Path, opts: &MemlogOptions) -> Result<TfMemoryLog, LoadError> {
    let started = Instant::now();
    let (bytes, end) = read_all(path)?;
    let text = String::from_utf8_lossy(&bytes);
    let mut log = parse_memory_log(&text, opts).map_err(|e| match e {
        ParseError::Polars(p) => LoadError::Polars(p),
        ParseError::Format(m) => LoadError::format(path, m),
    })?;
    if let StreamEnd::Truncated(why) = end {
        log.summary.truncated = Some(why);
    }
    log.load_seconds = started.elapsed().as_secs_f64();
    Ok(log)
}

/// Why [`parse_memory_log`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("{0}")]
    Format(String),
    #[error("DataFrame error: {0}")]
    Polars(#[from] PolarsError),
}

impl From<super::dump::DumpError> for ParseError {
    fn from(e: super::dump::DumpError) -> Self {
        match e {
            super::dump::DumpError::Polars(p) => Self::Polars(p),
            e @ super::dump::DumpError::Unrepresentable { .. } => Self::Format(e.to_string()),
        }
    }
}

/// Parses a memory log's text. See [`load_memory_log`].
///
/// # Errors
/// When there is no record, the allocator is absent, or a DataFrame cannot be built.
pub fn parse_memory_log(text: &str, opts: &MemlogOptions) -> Result<TfMemoryLog, ParseError> {
    let dumps = parse_bfc_dumps(text)?;
    let scan = scan_lines(text, &dumps);
    if scan.summary.records == 0 {
        return Err(ParseError::Format(
            "no __LOG_MEMORY__ records (TF_CPP_VMODULE=log_memory=2 was not set?)".into(),
        ));
    }
    let counts = records_per_allocator(&scan);
    let chosen = choose_allocator(&scan, &counts, opts)?;
    let names = &scan.allocators.names;
    let allocator = names.get(chosen).cloned().unwrap_or_default();
    let allocator_counts = names.iter().cloned().zip(counts).collect();
    let mut b = Builder::new(allocator.clone(), scan.summary);
    for (line, t_ns, tid, item) in scan.items {
        b.push(line, t_ns, tid, item, chosen, &allocator)?;
    }
    let (events, threads) = b.frames()?;
    Ok(TfMemoryLog {
        allocator,
        allocator_counts,
        bfc_allocators: scan.bfc_allocators,
        events,
        threads,
        records: b.records,
        outputs: b.outputs,
        regions: b.regions,
        meminfo: b.meminfo,
        dumps,
        summary: b.summary,
        load_seconds: 0.0,
    })
}

/// Allocation and deallocation records per allocator, indexed as `scan.allocators.names`.
fn records_per_allocator(scan: &Scan) -> Vec<u64> {
    let mut counts = vec![0u64; scan.allocators.names.len()];
    for (_, _, _, item) in &scan.items {
        if let Item::Record(_, d) = item
            && let Some(c) = counts.get_mut(d.allocator)
        {
            *c += 1;
        }
    }
    counts
}

/// The index of the allocator whose records make the events: `opts.allocator`, else the BFC
/// allocator the log created, else a name with `bfc` in it, else any; among several, the one
/// with the most records.
fn choose_allocator(
    scan: &Scan,
    counts: &[u64],
    opts: &MemlogOptions,
) -> Result<usize, ParseError> {
    let names = &scan.allocators.names;
    if let Some(name) = &opts.allocator {
        return scan.allocators.index.get(name).copied().ok_or_else(|| {
            ParseError::Format(format!(
                "allocator {name:?} has no records; the log has {}",
                names.join(", ")
            ))
        });
    }
    let best = |pred: &dyn Fn(&str) -> bool| {
        (0..names.len())
            .filter(|&i| names.get(i).is_some_and(|n| pred(n)))
            .filter(|&i| counts.get(i).is_some_and(|&c| c > 0))
            .max_by_key(|&i| counts.get(i).copied().unwrap_or(0))
    };
    best(&|n| scan.bfc_allocators.iter().any(|b| b == n))
        .or_else(|| best(&|n| n.to_ascii_lowercase().contains("bfc")))
        .or_else(|| best(&|_| true))
        .ok_or_else(|| ParseError::Format("no allocation or deallocation records".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_by_allocator_and_id_and_defaults_omitted_fields() {
        let text = "\
I0000 00:00:10.000001 7 log_memory.cc:34] __LOG_MEMORY__ MemoryLogTensorAllocation { goo.gle/debugonly    kernel_name: \"k\" tensor { dtype: DT_FLOAT shape { } allocation_description { requested_bytes: 8 allocated_bytes: 256 allocator_name: \"A_bfc\" allocation_id: 1 ptr: 4096 } } }
I0000 00:00:10.000002 8 log_memory.cc:34] __LOG_MEMORY__ MemoryLogTensorAllocation { step_id: 3 kernel_name: \"k\" tensor { dtype: DT_FLOAT shape { } allocation_description { requested_bytes: 8 allocated_bytes: 256 allocator_name: \"other\" allocation_id: 1 ptr: 8192 } } }
I0000 00:00:10.000000 8 log_memory.cc:34] __LOG_MEMORY__ MemoryLogTensorDeallocation { allocation_id: 1 allocator_name: \"A_bfc\" }
I0000 00:00:10.000003 7 log_memory.cc:34] __LOG_MEMORY__ MemoryLogTensorDeallocation { allocation_id: 9 allocator_name: \"A_bfc\" }
I0000 00:00:10.000004 7 log_memory.cc:34] __LOG_MEMORY__ MemoryLogRawDeallocation { step_id: -3 operation: \"x\" allocation_id: 9 allocator_name: \"A_bfc\" deferred: true }
";
        let log = parse_memory_log(text, &MemlogOptions::default()).unwrap();
        assert_eq!(log.allocator, "A_bfc");
        assert_eq!(log.records.len(), 3);
        let r = &log.records;
        assert_eq!(r[0].step, Some(0));
        assert_eq!(
            (r[1].kind, r[1].ptr, r[1].alloc_id),
            (EventKind::Free, 4096, 0)
        );
        // The free's time went backwards across threads: clamped.
        assert_eq!(r[1].t_ns, r[0].t_ns);
        assert_eq!(log.summary.timestamps_non_monotonic, 1);
        assert_eq!(r[2].kind, EventKind::FreeUnknown);
        assert_eq!(log.summary.raw_deallocations_deferred, 1);
        assert_eq!(log.threads.height(), 2);
        let other = parse_memory_log(
            text,
            &MemlogOptions {
                allocator: Some("other".into()),
            },
        )
        .unwrap();
        assert_eq!(other.records.len(), 1);
        assert_eq!(other.records[0].step, Some(3));
    }
}
