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

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use allocview_sim::trace::{EventKind, NO_ALLOC_ID, size_class};
use polars::prelude::*;
use polars_arrow::bitmap::MutableBitmap;

use super::dump::{BfcDump, col_u64, df_from, parse_bfc_dumps};
use super::human::{ByteCount, parse_bytes};
use super::split_log_line;
use crate::error::LoadError;
use crate::input::{StreamEnd, read_all};

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
    /// Dense trace id ([`NO_ALLOC_ID`] for events of no known allocation).
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

/// A record read from a line, before pairing.
#[derive(Clone, Debug)]
enum Item {
    Record {
        record: RecordKind,
        allocator: usize,
        tf_id: i64,
        ptr: u64,
        requested: u64,
        allocated: Option<u64>,
        step: Option<i64>,
        kernel: Option<String>,
    },
    Output {
        allocator: usize,
        tf_id: i64,
        ptr: u64,
        requested: u64,
        allocated: Option<u64>,
        step: Option<i64>,
        kernel: Option<String>,
    },
    Extend {
        by: Option<ByteCount>,
        allocator: String,
    },
    Region {
        base: u64,
        end: u64,
    },
    MemInfo {
        tag: String,
        current: u64,
        peak: u64,
    },
    Oom {
        rounded: u64,
        allocator: Option<String>,
        op: Option<String>,
    },
}

/// Parses a memory log's text. See [`load_memory_log`].
///
/// # Errors
/// When there is no record, the allocator is absent, or a DataFrame cannot be built.
pub fn parse_memory_log(text: &str, opts: &MemlogOptions) -> Result<TfMemoryLog, ParseError> {
    let mut summary = MemlogSummary::default();
    let mut names: Vec<String> = Vec::new();
    let mut name_index: HashMap<String, usize> = HashMap::new();
    let mut bfc_allocators: Vec<String> = Vec::new();
    // (line, t_ns, tid, item)
    let mut items: Vec<(u64, Option<i64>, Option<u64>, Item)> = Vec::new();
    let dumps = parse_bfc_dumps(text)?;
    let mut oom_lines: HashMap<u64, &BfcDump> = HashMap::new();
    for d in &dumps {
        if let Some(o) = &d.oom {
            oom_lines.insert(o.line, d);
        }
    }
    for (i, raw) in text.lines().enumerate() {
        let line = i as u64 + 1;
        summary.lines = line;
        let l = split_log_line(raw);
        let m = l.message;
        if let Some(rest) = m.strip_prefix(LOG_MEMORY_LABEL) {
            summary.records += 1;
            match parse_record(rest.trim_start(), &mut names, &mut name_index, &mut summary) {
                Some(Some(item)) => items.push((line, l.t_ns, l.tid, item)),
                Some(None) => {}
                None => {
                    summary.unreadable_records += 1;
                    if summary.first_unreadable_lines.len() < 5 {
                        summary.first_unreadable_lines.push(line);
                    }
                }
            }
            continue;
        }
        if let Some(d) = oom_lines.get(&line) {
            if let Some(rounded) = d.oom.as_ref().and_then(|o| o.rounded_or_estimate()) {
                items.push((
                    line,
                    l.t_ns,
                    l.tid,
                    Item::Oom {
                        rounded,
                        allocator: d.allocator.clone(),
                        op: d.oom.as_ref().and_then(|o| o.op.clone()),
                    },
                ));
            }
            continue;
        }
        if let Some(name) = m.strip_prefix("Creating new BFCAllocator named: ") {
            bfc_allocators.push(name.trim().to_owned());
        } else if let Some(rest) = m.strip_prefix("Extending allocation by ") {
            let (by, rest) = rest.split_once(" bytes for ").unwrap_or((rest, ""));
            items.push((
                line,
                l.t_ns,
                l.tid,
                Item::Extend {
                    by: parse_bytes(by),
                    allocator: rest.trim().trim_end_matches('.').to_owned(),
                },
            ));
        } else if let Some(rest) = m.strip_prefix("Allocated memory at ") {
            if let Some((a, b)) = rest.split_once(" to ")
                && let (Some(base), Some(end)) = (parse_hex(a), parse_hex(b))
                && end > base
            {
                items.push((line, l.t_ns, l.tid, Item::Region { base, end }));
            }
        } else if let Some(rest) = m.strip_prefix("MEMINFO ")
            && let Some((tag, json)) = rest.split_once(' ')
            && let (Some(current), Some(peak)) = (json_u64(json, "current"), json_u64(json, "peak"))
        {
            items.push((
                line,
                l.t_ns,
                l.tid,
                Item::MemInfo {
                    tag: tag.to_owned(),
                    current,
                    peak,
                },
            ));
        }
    }
    if summary.records == 0 {
        return Err(ParseError::Format(
            "no __LOG_MEMORY__ records (TF_CPP_VMODULE=log_memory=2 was not set?)".into(),
        ));
    }
    // Counts per allocator, and the default choice.
    let mut counts = vec![0u64; names.len()];
    for (_, _, _, item) in &items {
        if let Item::Record { allocator, .. } = item
            && let Some(c) = counts.get_mut(*allocator)
        {
            *c += 1;
        }
    }
    let chosen = match &opts.allocator {
        Some(name) => name_index.get(name).copied().ok_or_else(|| {
            ParseError::Format(format!(
                "allocator {name:?} has no records; the log has {}",
                names.join(", ")
            ))
        })?,
        None => {
            let best = |pred: &dyn Fn(&str) -> bool| {
                (0..names.len())
                    .filter(|&i| names.get(i).is_some_and(|n| pred(n)))
                    .filter(|&i| counts.get(i).is_some_and(|&c| c > 0))
                    .max_by_key(|&i| counts.get(i).copied().unwrap_or(0))
            };
            best(&|n| bfc_allocators.iter().any(|b| b == n))
                .or_else(|| best(&|n| n.to_ascii_lowercase().contains("bfc")))
                .or_else(|| best(&|_| true))
                .ok_or_else(|| ParseError::Format("no allocation or deallocation records".into()))?
        }
    };
    let allocator = names.get(chosen).cloned().unwrap_or_default();
    let allocator_counts = names.iter().cloned().zip(counts).collect();
    let mut b = Builder::new(allocator.clone(), summary);
    for (line, t_ns, tid, item) in items {
        b.push(line, t_ns, tid, item, chosen, &allocator)?;
    }
    let (events, threads) = b.frames()?;
    Ok(TfMemoryLog {
        allocator,
        allocator_counts,
        bfc_allocators,
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

fn parse_hex(s: &str) -> Option<u64> {
    let s = s.trim();
    let h = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    u64::from_str_radix(h, 16).ok()
}

/// `"key": 123` inside a one-line JSON object.
fn json_u64(json: &str, key: &str) -> Option<u64> {
    let (_, rest) = json.split_once(&format!("\"{key}\":"))?;
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Flattened fields of a short debug string: (dotted path, value), strings unescaped.
fn proto_fields(body: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut path: Vec<String> = Vec::new();
    let b = body.as_bytes();
    let mut i = 0;
    let word_end = |mut j: usize| {
        while j < b.len() && !b[j].is_ascii_whitespace() && !matches!(b[j], b':' | b'{' | b'}') {
            j += 1;
        }
        j
    };
    let skip_ws = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        j
    };
    loop {
        i = skip_ws(i);
        let Some(&c) = b.get(i) else { break };
        if c == b'}' {
            path.pop()?;
            i += 1;
            continue;
        }
        let start = i;
        i = word_end(i);
        if i == start {
            return None;
        }
        let name = body.get(start..i)?;
        i = skip_ws(i);
        match b.get(i) {
            Some(b'{') => {
                path.push(name.to_owned());
                i += 1;
            }
            Some(b':') => {
                i = skip_ws(i + 1);
                let (value, next) = if b.get(i) == Some(&b'"') {
                    read_quoted(body, i)?
                } else {
                    let e = word_end(i);
                    (body.get(i..e)?.to_owned(), e)
                };
                i = next;
                let key = if path.is_empty() {
                    name.to_owned()
                } else {
                    format!("{}.{name}", path.join("."))
                };
                out.push((key, value));
            }
            // A bare word: the debug-string marker (`goo.gle/debugproto`).
            _ => {}
        }
    }
    path.is_empty().then_some(out)
}

/// A C-escaped, double-quoted string starting at `start`; returns it and the index after it.
fn read_quoted(body: &str, start: usize) -> Option<(String, usize)> {
    let b = body.as_bytes();
    let mut out: Vec<u8> = Vec::new();
    let mut i = start + 1;
    while let Some(&c) = b.get(i) {
        match c {
            b'"' => return Some((String::from_utf8_lossy(&out).into_owned(), i + 1)),
            b'\\' => {
                let e = *b.get(i + 1)?;
                i += 2;
                match e {
                    b'n' => out.push(b'\n'),
                    b't' => out.push(b'\t'),
                    b'r' => out.push(b'\r'),
                    b'0'..=b'7' => {
                        let mut v = u32::from(e - b'0');
                        let mut k = 0;
                        while k < 2
                            && let Some(&d) = b.get(i)
                            && (b'0'..=b'7').contains(&d)
                        {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                            k += 1;
                        }
                        out.push(u8::try_from(v & 0xff).unwrap_or(0));
                    }
                    other => out.push(other),
                }
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    None
}

/// One `__LOG_MEMORY__` record (the text after the label). `None` when unreadable,
/// `Some(None)` for records that make no event (steps, empty tensors, deferred frees).
fn parse_record(
    rest: &str,
    names: &mut Vec<String>,
    name_index: &mut HashMap<String, usize>,
    summary: &mut MemlogSummary,
) -> Option<Option<Item>> {
    let (message, body) = rest.split_once(' ')?;
    let body = body.trim().strip_prefix('{')?.strip_suffix('}')?;
    let fields = proto_fields(body)?;
    let get = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let int = |key: &str| -> Option<i64> { get(key).map_or(Some(0), |v| v.parse().ok()) };
    let uint = |key: &str| -> Option<u64> { get(key).map_or(Some(0), |v| v.parse().ok()) };
    let mut intern = |name: &str| -> usize {
        if let Some(&i) = name_index.get(name) {
            return i;
        }
        names.push(name.to_owned());
        name_index.insert(name.to_owned(), names.len() - 1);
        names.len() - 1
    };
    let step = get("step_id").map_or(Some(0), |v| v.parse().ok())?;
    const AD: &str = "tensor.allocation_description";
    let item = match message {
        "MemoryLogStep" => {
            summary.steps += 1;
            None
        }
        "MemoryLogTensorAllocation" | "MemoryLogTensorOutput" => {
            let output = message == "MemoryLogTensorOutput";
            if output {
                summary.tensor_outputs += 1;
            } else {
                summary.tensor_allocations += 1;
            }
            let Some(allocator) = get(&format!("{AD}.allocator_name")) else {
                if !output {
                    summary.tensors_without_buffer += 1;
                }
                return Some(None);
            };
            let allocator = intern(allocator);
            let tf_id = int(&format!("{AD}.allocation_id"))?;
            let ptr = uint(&format!("{AD}.ptr"))?;
            let requested = uint(&format!("{AD}.requested_bytes"))?;
            let allocated = get(&format!("{AD}.allocated_bytes"))
                .map_or(Some(0), |v| v.parse().ok())
                .map(Some)?;
            let kernel = get("kernel_name").map(str::to_owned);
            if output {
                Some(Item::Output {
                    allocator,
                    tf_id,
                    ptr,
                    requested,
                    allocated,
                    step: Some(step),
                    kernel,
                })
            } else {
                Some(Item::Record {
                    record: RecordKind::TensorAllocation,
                    allocator,
                    tf_id,
                    ptr,
                    requested,
                    allocated,
                    step: Some(step),
                    kernel,
                })
            }
        }
        "MemoryLogTensorDeallocation" => {
            summary.tensor_deallocations += 1;
            Some(Item::Record {
                record: RecordKind::TensorDeallocation,
                allocator: intern(get("allocator_name").unwrap_or("")),
                tf_id: int("allocation_id")?,
                ptr: 0,
                requested: 0,
                allocated: None,
                step: None,
                kernel: None,
            })
        }
        "MemoryLogRawAllocation" => {
            summary.raw_allocations += 1;
            Some(Item::Record {
                record: RecordKind::RawAllocation,
                allocator: intern(get("allocator_name").unwrap_or("")),
                tf_id: int("allocation_id")?,
                ptr: uint("ptr")?,
                requested: uint("num_bytes")?,
                allocated: None,
                step: Some(step),
                kernel: get("operation").map(str::to_owned),
            })
        }
        "MemoryLogRawDeallocation" => {
            summary.raw_deallocations += 1;
            if get("deferred") == Some("true") {
                summary.raw_deallocations_deferred += 1;
                return Some(None);
            }
            Some(Item::Record {
                record: RecordKind::RawDeallocation,
                allocator: intern(get("allocator_name").unwrap_or("")),
                tf_id: int("allocation_id")?,
                ptr: 0,
                requested: 0,
                allocated: None,
                step: Some(step),
                kernel: get("operation").map(str::to_owned),
            })
        }
        _ => return None,
    };
    Some(item)
}

/// A live allocation while pairing.
#[derive(Clone, Copy)]
struct Live {
    alloc_id: u32,
    ptr: u64,
    requested: u64,
    allocated: Option<u64>,
}

struct Builder {
    allocator: String,
    summary: MemlogSummary,
    records: Vec<LogRecord>,
    outputs: Vec<TensorOutput>,
    regions: Vec<RegionGrowth>,
    meminfo: Vec<MemInfo>,
    live: HashMap<i64, Live>,
    ever_allocated: HashMap<i64, ()>,
    revealed: HashMap<i64, (u64, u64)>,
    tids: HashMap<u64, u16>,
    tid_order: Vec<u64>,
    next_alloc_id: u32,
    prev_t_ns: i64,
    pending_extend: Option<(Option<ByteCount>, String)>,
}

impl Builder {
    fn new(allocator: String, summary: MemlogSummary) -> Self {
        Self {
            allocator,
            summary,
            records: Vec::new(),
            outputs: Vec::new(),
            regions: Vec::new(),
            meminfo: Vec::new(),
            live: HashMap::new(),
            ever_allocated: HashMap::new(),
            revealed: HashMap::new(),
            tids: HashMap::new(),
            tid_order: Vec::new(),
            next_alloc_id: 0,
            prev_t_ns: i64::MIN,
            pending_extend: None,
        }
    }

    fn thread(&mut self, tid: Option<u64>) -> Result<u16, ParseError> {
        let tid = tid.unwrap_or(0);
        if let Some(&t) = self.tids.get(&tid) {
            return Ok(t);
        }
        let t = u16::try_from(self.tid_order.len())
            .map_err(|_| ParseError::Format("more than 65536 threads".into()))?;
        self.tids.insert(tid, t);
        self.tid_order.push(tid);
        Ok(t)
    }

    fn time(&mut self, t_ns: Option<i64>, line: u64) -> i64 {
        // Without a timestamp the line index orders the events.
        let t = t_ns.unwrap_or(i64::try_from(line).unwrap_or(i64::MAX));
        if t < self.prev_t_ns {
            self.summary.timestamps_non_monotonic += 1;
            return self.prev_t_ns;
        }
        self.prev_t_ns = t;
        t
    }

    fn push(
        &mut self,
        line: u64,
        t_ns: Option<i64>,
        tid: Option<u64>,
        item: Item,
        chosen: usize,
        chosen_name: &str,
    ) -> Result<(), ParseError> {
        let events_before = self.records.len();
        match item {
            Item::Record {
                record,
                allocator,
                tf_id,
                ptr,
                requested,
                allocated,
                step,
                kernel,
            } => {
                if allocator != chosen {
                    return Ok(());
                }
                let thread = self.thread(tid)?;
                let t = self.time(t_ns, line);
                let mut rec = LogRecord {
                    record,
                    kind: EventKind::Alloc,
                    line,
                    t_ns: t,
                    thread,
                    tf_alloc_id: tf_id,
                    alloc_id: NO_ALLOC_ID,
                    ptr,
                    requested_bytes: requested,
                    allocated_bytes: allocated,
                    step,
                    kernel,
                };
                if record.is_allocation() {
                    if let Some(old) = self.live.remove(&tf_id) {
                        self.summary.duplicate_allocation_ids += 1;
                        self.records.push(LogRecord {
                            record: RecordKind::TensorDeallocation,
                            kind: EventKind::Free,
                            alloc_id: old.alloc_id,
                            ptr: old.ptr,
                            requested_bytes: old.requested,
                            allocated_bytes: old.allocated,
                            step: None,
                            kernel: None,
                            ..rec.clone()
                        });
                    }
                    let id = self.next_alloc_id;
                    if id == NO_ALLOC_ID - 1 {
                        return Err(ParseError::Format("too many allocations".into()));
                    }
                    self.next_alloc_id += 1;
                    self.live.insert(
                        tf_id,
                        Live {
                            alloc_id: id,
                            ptr,
                            requested,
                            allocated,
                        },
                    );
                    self.ever_allocated.insert(tf_id, ());
                    rec.alloc_id = id;
                } else if let Some(l) = self.live.remove(&tf_id) {
                    rec.kind = EventKind::Free;
                    rec.alloc_id = l.alloc_id;
                    rec.ptr = l.ptr;
                    rec.requested_bytes = l.requested;
                    rec.allocated_bytes = l.allocated;
                } else {
                    self.summary.frees_unknown += 1;
                    rec.kind = EventKind::FreeUnknown;
                    if let Some(&(p, r)) = self.revealed.get(&tf_id) {
                        rec.ptr = p;
                        rec.requested_bytes = r;
                    }
                }
                self.records.push(rec);
            }
            Item::Output {
                allocator,
                tf_id,
                ptr,
                requested,
                allocated,
                step,
                kernel,
            } => {
                if allocator != chosen || self.ever_allocated.contains_key(&tf_id) {
                    return Ok(());
                }
                if self.revealed.insert(tf_id, (ptr, requested)).is_none() {
                    self.outputs.push(TensorOutput {
                        line,
                        tf_alloc_id: tf_id,
                        ptr,
                        requested_bytes: requested,
                        allocated_bytes: allocated,
                        kernel,
                        step,
                        thread: self.tids.get(&tid.unwrap_or(0)).copied(),
                        events_before,
                    });
                }
            }
            Item::Extend { by, allocator } => self.pending_extend = Some((by, allocator)),
            Item::Region { base, end } => {
                let (extend_by, allocator) = match self.pending_extend.take() {
                    Some((by, a)) => (by, Some(a)),
                    None => (None, None),
                };
                if allocator.as_deref().is_none_or(|a| a == chosen_name) {
                    self.regions.push(RegionGrowth {
                        line,
                        base,
                        size_bytes: end - base,
                        extend_by,
                        allocator,
                        events_before,
                    });
                }
            }
            Item::MemInfo { tag, current, peak } => {
                let dup = self.meminfo.last().is_some_and(|m| {
                    m.tag == tag
                        && m.current_bytes == current
                        && m.peak_bytes == peak
                        && m.events_before == events_before
                });
                if !dup {
                    self.meminfo.push(MemInfo {
                        line,
                        tag,
                        current_bytes: current,
                        peak_bytes: peak,
                        events_before,
                    });
                }
            }
            Item::Oom {
                rounded,
                allocator,
                op,
            } => {
                if allocator.as_deref().is_some_and(|a| a != chosen_name) {
                    return Ok(());
                }
                let thread = self.thread(tid)?;
                let t = self.time(t_ns, line);
                self.records.push(LogRecord {
                    record: RecordKind::OomRequest,
                    kind: EventKind::AllocFailed,
                    line,
                    t_ns: t,
                    thread,
                    tf_alloc_id: 0,
                    alloc_id: NO_ALLOC_ID,
                    ptr: 0,
                    requested_bytes: rounded,
                    allocated_bytes: None,
                    step: None,
                    kernel: op,
                });
            }
        }
        Ok(())
    }

    fn frames(&self) -> Result<(DataFrame, DataFrame), ParseError> {
        let r = &self.records;
        let n = r.len();
        let alloc_ids: Vec<u32> = r.iter().map(|x| x.alloc_id).collect();
        let alloc_id = if alloc_ids.contains(&NO_ALLOC_ID) {
            let mut validity = MutableBitmap::with_capacity(n);
            for &id in &alloc_ids {
                validity.push(id != NO_ALLOC_ID);
            }
            UInt32Chunked::from_vec_validity("alloc_id".into(), alloc_ids, Some(validity.into()))
        } else {
            UInt32Chunked::from_vec("alloc_id".into(), alloc_ids)
        };
        let size: Vec<u64> = r
            .iter()
            .map(|x| match x.kind {
                EventKind::Alloc | EventKind::Free | EventKind::AllocFailed => x.requested_bytes,
                _ => 0,
            })
            .collect();
        let thread = if self.tid_order.len() <= 256 {
            UInt8Chunked::from_vec(
                "thread".into(),
                r.iter()
                    .map(|x| u8::try_from(x.thread).unwrap_or(u8::MAX))
                    .collect(),
            )
            .into_column()
        } else {
            UInt16Chunked::from_vec("thread".into(), r.iter().map(|x| x.thread).collect())
                .into_column()
        };
        let events = df_from(vec![
            Int64Chunked::from_vec("t_ns".into(), r.iter().map(|x| x.t_ns).collect()).into_column(),
            thread,
            UInt8Chunked::from_vec("kind".into(), r.iter().map(|x| x.kind.code()).collect())
                .into_column(),
            UInt64Chunked::from_vec("size_bytes".into(), size.clone()).into_column(),
            UInt64Chunked::from_vec("address".into(), r.iter().map(|x| x.ptr).collect())
                .into_column(),
            alloc_id.into_column(),
            UInt8Chunked::from_vec(
                "size_class".into(),
                size.iter().map(|&s| size_class(s)).collect(),
            )
            .into_column(),
            UInt8Chunked::from_vec("record".into(), r.iter().map(|x| x.record.code()).collect())
                .into_column(),
            UInt64Chunked::from_vec("line".into(), r.iter().map(|x| x.line).collect())
                .into_column(),
            Column::new("allocator".into(), vec![self.allocator.as_str(); n]),
            Int64Chunked::from_iter_options("step".into(), r.iter().map(|x| x.step)).into_column(),
            StringChunked::from_iter_options(
                "kernel".into(),
                r.iter().map(|x| x.kernel.as_deref()),
            )
            .into_column(),
            UInt64Chunked::from_vec(
                "requested_bytes".into(),
                r.iter().map(|x| x.requested_bytes).collect(),
            )
            .into_column(),
            col_u64(
                "allocated_bytes",
                r.iter().map(|x| x.allocated_bytes).collect(),
            ),
            Int64Chunked::from_iter_options(
                "tf_alloc_id".into(),
                r.iter()
                    .map(|x| (x.record != RecordKind::OomRequest).then_some(x.tf_alloc_id)),
            )
            .into_column(),
        ])?;
        let threads = df_from(vec![
            UInt16Chunked::from_vec(
                "thread".into(),
                (0..self.tid_order.len())
                    .map(|i| u16::try_from(i).unwrap_or(u16::MAX))
                    .collect(),
            )
            .into_column(),
            UInt64Chunked::from_vec("tid".into(), self.tid_order.clone()).into_column(),
        ])?;
        Ok((events, threads))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_short_debug_strings_with_the_marker() {
        let body = r#" goo.gle/debugproto   step_id: -6 kernel_name: "a\"b" tensor { dtype: DT_INT32 shape { dim { size: 2 } } allocation_description { requested_bytes: 8 allocated_bytes: 256 allocator_name: "bfc" allocation_id: 1 has_single_reference: true ptr: 139893623996480 } } "#;
        let f = proto_fields(body).unwrap();
        let get = |k: &str| f.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str());
        assert_eq!(get("step_id"), Some("-6"));
        assert_eq!(get("kernel_name"), Some("a\"b"));
        assert_eq!(get("tensor.shape.dim.size"), Some("2"));
        assert_eq!(
            get("tensor.allocation_description.ptr"),
            Some("139893623996480")
        );
        assert!(proto_fields("a { b: 1").is_none());
        assert!(proto_fields("a: \"open").is_none());
    }

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
