//! TensorFlow BFC out-of-memory dumps, as the allocator prints them into an ordinary log.
//!
//! A complete dump (tsl / TF 2.x, `reference/allocators.md` section 1.10) has, in order: the
//! OOM header (`Allocator (NAME) ran out of memory trying to allocate 98.00MiB (rounded to
//! 102760448)requested by op OP`), `BFCAllocator dump for NAME`, 21 `Bin (N): ...` lines, the
//! free chunks of the request's bin (`Bin for ... Chunk State:`), one `Next region of size N`
//! per region followed by its chunks in address order (`InUse at <hex> of size N next H`,
//! `Free  at ...`), the in-use summary (`N Chunks of size S totalling X`), `Sum Total of in-use
//! chunks: X`, the pool line and the `Stats:` block, printed raw (`InUse: 208404480`) or
//! human-readable (`InUse: 509.99MiB`). Older dumps print `Chunk at 0x... of size N` and
//! `Free at ...` without regions (regions are then inferred from contiguous runs of chunks), and
//! partial dumps carry only the summary and the Stats block: whatever is there is loaded and
//! [`BfcDump::missing`] says what is not.
//!
//! While loading, the dump is cross-checked (each mismatch is a [`DumpWarning`] with its line):
//! in-use chunk bytes = summary total = `InUse` (within the printed rounding when `InUse` is
//! human-readable), per-bin and per-size counts agree with the chunk lines, chunks tile their
//! regions and only a region's last chunk has `next 18446744073709551615`. Lines that look
//! like a dump's but cannot be read (a chunk line with a bad address, a Stats value past 2^64)
//! are counted in [`BfcDump::unreadable_lines`] and warned about, and chunks whose address
//! ranges overlap (or repeat) in [`BfcDump::overlapping_chunks`]: nothing is dropped silently.
//! Sums that do not fit in 64 bits (chunk sizes, `size x count` of a summary row) are an error
//! naming the line ([`DumpError::Unrepresentable`]).
//!
//! The code follows the dump's seams: `lines` (what each line is), `builder` (a dump being
//! collected and its cross-checks), `frames` (the DataFrames).

use std::path::Path;

use allocview_sim::heap::{Block, BlockState};
use allocview_sim::policy::bfc::{
    Bfc, BfcOptions, BfcStateError, BfcStats, LiveChunk, RegionInfo, rounded_bytes,
};
use allocview_sim::trace::NO_ALLOC_ID;
use polars::prelude::*;

use super::human::ByteCount;
use super::split_log_line;
use crate::error::LoadError;
use crate::input::read_all;

mod builder;
mod frames;
mod lines;

use builder::Builder;
pub(crate) use frames::{col_u64, df_from};
use lines::{Part, StatLine, classify, parse_stat};

/// Most warnings of one kind (unreadable lines, overlapping chunks) kept verbatim per dump; the
/// rest are counted.
const MAX_WARNINGS_PER_KIND: u64 = 20;

/// Why a log's dumps could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// A sum of figures read from the file does not fit in 64 bits.
    #[error("line {line}: {message}")]
    Unrepresentable { line: u64, message: String },
    #[error("DataFrame error: {0}")]
    Polars(#[from] PolarsError),
}

/// TF prints a missing `next` handle (`kInvalidChunkHandle`, -1 as `size_t`) as this.
pub const NO_NEXT_HANDLE: u64 = u64::MAX;

/// Which generation of the dump format the chunk lines come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpFormat {
    /// `InUse at <hex> of size N next H` / `Free  at ...`, grouped under `Next region` lines.
    Current,
    /// `Chunk at 0x<hex> of size N` then `Free at 0x<hex> of size N` (TF 1.x); no regions.
    Old,
    /// No chunk lines (e.g. TF 0.8 printed only the summary and the Stats block).
    Partial,
}

impl DumpFormat {
    /// Stable name for reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Current => "current",
            Self::Old => "old",
            Self::Partial => "partial",
        }
    }
}

/// The failed request from the OOM header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomRequest {
    /// The request as printed (`98.00MiB`).
    pub text: String,
    /// The printed request in bytes, with its rounding range.
    pub bytes: Option<ByteCount>,
    /// `(rounded to N)`: exact, when printed (TF >= 1.5).
    pub rounded_bytes: Option<u64>,
    /// `requested by op OP` (absent in older dumps; empty names are `None`).
    pub op: Option<String>,
    pub line: u64,
}

impl OomRequest {
    /// The printed rounded size, or the smallest 256-byte multiple the printed request allows.
    #[must_use]
    pub fn rounded_or_estimate(&self) -> Option<u64> {
        self.rounded_bytes
            .or_else(|| self.bytes.map(|b| rounded_bytes(b.min_bytes)))
    }
}

/// A `Next region of size N` line, or a region inferred from a contiguous run of chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DumpRegion {
    /// Address of its first chunk (`None` when the dump lists no chunk for it).
    pub address: Option<u64>,
    pub size_bytes: u64,
    /// `None` for inferred regions.
    pub line: Option<u64>,
}

/// One chunk line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DumpChunk {
    pub address: u64,
    pub size_bytes: u64,
    pub in_use: bool,
    /// The client's request, when the dump prints it (only debug builds do).
    pub requested_bytes: Option<u64>,
    /// `BinNumForSize(size)`: the bin TF's per-bin lines count the chunk under.
    pub bin: u8,
    /// The `next` handle as printed ([`NO_NEXT_HANDLE`] for a region's last chunk).
    pub next_handle: Option<u64>,
    /// Index into [`BfcDump::regions`].
    pub region: Option<u32>,
    pub line: u64,
}

/// One `Bin (N): ...` line; byte figures are the printed ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DumpBin {
    pub bin: u8,
    pub bin_size_bytes: u64,
    pub total_chunks: u64,
    pub chunks_in_use: u64,
    pub allocated: ByteCount,
    pub in_use: ByteCount,
    pub requested_in_use: ByteCount,
    pub line: u64,
}

/// One `N Chunks of size S totalling X` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SummaryRow {
    pub size_bytes: u64,
    pub count: u64,
    pub printed_total: Option<ByteCount>,
    pub line: u64,
}

impl SummaryRow {
    /// `size x count`; `None` past 2^64 - 1 (the loader refuses such a dump).
    #[must_use]
    pub fn total_bytes(&self) -> Option<u64> {
        self.size_bytes.checked_mul(self.count)
    }
}

/// One line of the `Stats:` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpStat {
    /// As printed: `Limit`, `InUse`, `MaxInUse`, `NumAllocs`, `MaxAllocSize`, `Reserved`,
    /// `PeakReserved`, `LargestFreeBlock`, ...
    pub label: String,
    /// TF's `AllocatorStats` field name (`bytes_limit`, `bytes_in_use`, ...), or the label
    /// when unknown.
    pub key: String,
    pub text: String,
    pub value: ByteCount,
    pub line: u64,
}

/// The pool line (`total_region_allocated_bytes_: ...` / `Total size in pool: ...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolLine {
    pub region_bytes: Option<ByteCount>,
    pub memory_limit: Option<ByteCount>,
    pub available: Option<ByteCount>,
    pub curr_region_allocation: Option<ByteCount>,
    pub line: u64,
}

/// A cross-check that failed, or a line that could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpWarning {
    /// 1-based line in the file.
    pub line: u64,
    pub message: String,
}

impl std::fmt::Display for DumpWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// Figures derived from the dump: from the chunk lines when there are any, else from the
/// summary and the Stats block. `None` when the dump does not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DumpFigures {
    pub in_use_chunks: Option<u64>,
    pub in_use_bytes: Option<u64>,
    pub free_chunks: Option<u64>,
    pub free_bytes: Option<u64>,
    pub regions: Option<u64>,
    pub region_bytes: Option<u64>,
    pub largest_free_chunk_bytes: Option<u64>,
    /// The OOM's rounded request (printed, or estimated from the printed request).
    pub request_rounded_bytes: Option<u64>,
    /// The diagnosis: true when the free bytes would have held the rounded request but no
    /// single free chunk was large enough (a fragmentation OOM).
    pub fragmentation_oom: Option<bool>,
}

/// One BFC dump, with its parts as DataFrames and as typed rows.
#[derive(Clone, Debug)]
pub struct BfcDump {
    pub allocator: Option<String>,
    pub format: DumpFormat,
    pub oom: Option<OomRequest>,
    pub regions: Vec<DumpRegion>,
    pub chunks: Vec<DumpChunk>,
    pub bins: Vec<DumpBin>,
    pub summary: Vec<SummaryRow>,
    /// `Sum Total of in-use chunks: X`.
    pub summary_total: Option<ByteCount>,
    pub pool: Option<PoolLine>,
    pub stats: Vec<DumpStat>,
    /// The 100-character occupancy picture (`*` requested, `x` waste, `_` free).
    pub occupancy: Option<String>,
    pub figures: DumpFigures,
    /// Parts of a complete dump that this one lacks.
    pub missing: Vec<String>,
    pub warnings: Vec<DumpWarning>,
    /// Lines inside the dump that look like its lines (chunk, region, bin, summary or Stats
    /// lines) but cannot be read; the first few are also in `warnings`.
    pub unreadable_lines: u64,
    /// Chunks whose address range overlaps (or repeats) an earlier chunk's, in address order;
    /// the first few are also in `warnings`.
    pub overlapping_chunks: u64,
    /// 1-based lines where the dump starts and ends in the file.
    pub first_line: u64,
    pub last_line: u64,
    pub frames: DumpFrames,
}

/// The dump as DataFrames.
///
/// | frame | columns |
/// |---|---|
/// | `regions` | `region` u32, `address` u64 (null: no chunk listed), `size_bytes` u64, `line` u64 (null: inferred) |
/// | `chunks` | `address` u64, `size_bytes` u64, `in_use` bool, `requested_bytes` u64 (nullable), `bin` u8, `next_handle` u64 (nullable; 18446744073709551615 = last in region), `region` u32 (nullable), `line` u64 |
/// | `bins` | `bin` u8, `bin_size_bytes`, `total_chunks`, `chunks_in_use`, `allocated_bytes`, `in_use_bytes`, `requested_in_use_bytes` (u64; byte figures as printed), `line` u64 |
/// | `in_use_summary` | `size_bytes` u64, `count` u64, `total_bytes` u64 (size x count), `line` u64 |
/// | `stats` | `label` str, `key` str, `text` str, `bytes` u64, `min_bytes` u64, `max_bytes` u64, `line` u64 |
#[derive(Clone, Debug, Default)]
pub struct DumpFrames {
    pub regions: DataFrame,
    pub chunks: DataFrame,
    pub bins: DataFrame,
    pub in_use_summary: DataFrame,
    pub stats: DataFrame,
}

impl BfcDump {
    /// A Stats value by TF field name (`bytes_in_use`) or printed label (`InUse`).
    #[must_use]
    pub fn stat(&self, name: &str) -> Option<&DumpStat> {
        self.stats.iter().find(|s| s.key == name || s.label == name)
    }

    /// The Stats block as (field name, bytes as printed) pairs, in printed order.
    #[must_use]
    pub fn stats_bytes(&self) -> Vec<(String, u64)> {
        self.stats
            .iter()
            .map(|s| (s.key.clone(), s.value.bytes))
            .collect()
    }

    /// The dump's chunks as the simulator's blocks, in address order (for heap maps drawn like
    /// a replayed heap). In-use chunks carry no trace id; their requested size is the chunk
    /// size when the dump does not print it.
    #[must_use]
    pub fn blocks(&self) -> Vec<Block> {
        let mut out: Vec<Block> = self
            .chunks
            .iter()
            .map(|c| Block {
                addr: c.address,
                len_bytes: c.size_bytes,
                state: if c.in_use {
                    BlockState::Used {
                        id: NO_ALLOC_ID,
                        requested_bytes: c.requested_bytes.unwrap_or(c.size_bytes),
                    }
                } else {
                    BlockState::Free
                },
            })
            .collect();
        out.sort_by_key(|b| b.addr);
        out
    }

    /// The dump as a live BFC allocator: its regions and in-use chunks (free chunks are the
    /// gaps), its Limit (or the regions' total when it prints none) and its region size
    /// target. Lets a frontend show the bins, and a test ask BFC whether the request fits.
    ///
    /// # Errors
    /// When the dump has no chunk lines, or its chunks are not a valid BFC state.
    pub fn to_bfc(&self) -> Result<Bfc, BfcStateError> {
        // The loader refused dumps whose region or in-use sums overflow.
        let region_bytes = self
            .regions
            .iter()
            .fold(0u64, |s, r| s.saturating_add(r.size_bytes));
        let limit_bytes = self
            .stat("bytes_limit")
            .map(|s| s.value.bytes)
            .filter(|&l| l >= region_bytes)
            .unwrap_or(region_bytes);
        let regions: Vec<RegionInfo> = self
            .regions
            .iter()
            .filter_map(|r| {
                r.address.map(|base| RegionInfo {
                    base,
                    size_bytes: r.size_bytes,
                })
            })
            .collect();
        let live: Vec<LiveChunk> = self
            .chunks
            .iter()
            .filter(|c| c.in_use)
            .map(|c| LiveChunk {
                addr: c.address,
                size_bytes: c.size_bytes,
                requested_bytes: c.requested_bytes.unwrap_or(c.size_bytes).min(c.size_bytes),
                allocation_id: 1,
                request_id: NO_ALLOC_ID,
            })
            .collect();
        let bytes_in_use = live
            .iter()
            .fold(0u64, |s, c| s.saturating_add(c.size_bytes));
        let stat = |k: &str| self.stat(k).map_or(0, |s| s.value.bytes);
        let stats = BfcStats {
            num_allocs: stat("num_allocs"),
            bytes_in_use,
            peak_bytes_in_use: stat("peak_bytes_in_use").max(bytes_in_use),
            largest_alloc_size: stat("largest_alloc_size"),
            bytes_limit: limit_bytes,
        };
        let curr = self
            .pool
            .and_then(|p| p.curr_region_allocation)
            .map_or(region_bytes, |c| c.bytes);
        Bfc::from_state(
            BfcOptions {
                limit_bytes,
                ..BfcOptions::default()
            },
            &regions,
            &live,
            curr,
            stats,
        )
    }

    /// One line a person can read: why the request failed.
    #[must_use]
    pub fn diagnosis(&self) -> Option<String> {
        let f = &self.figures;
        let rounded = f.request_rounded_bytes?;
        let free = f.free_bytes?;
        let largest = f.largest_free_chunk_bytes.unwrap_or(0);
        Some(if f.fragmentation_oom == Some(true) {
            format!(
                "fragmentation: the {free} free bytes would hold the rounded request of \
                 {rounded} bytes, but they are split over {} chunks and the largest is {largest} \
                 bytes",
                f.free_chunks.unwrap_or(0)
            )
        } else if largest >= rounded {
            format!(
                "a free chunk of {largest} bytes would hold the rounded request of {rounded} \
                 bytes (the dump was taken after memory was freed?)"
            )
        } else {
            format!(
                "not enough memory: only {free} bytes are free in the regions, less than the \
                 rounded request of {rounded} bytes, and the limit allows no new region"
            )
        })
    }
}

/// Loads the first BFC dump of a log (plain or gzip). [`load_bfc_dumps`] returns all of them.
///
/// # Errors
/// When the file cannot be read or holds no dump.
pub fn load_bfc_dump(path: &Path) -> Result<BfcDump, LoadError> {
    load_bfc_dumps(path)?
        .into_iter()
        .next()
        .ok_or_else(|| LoadError::format(path, "no TensorFlow BFC allocator dump found"))
}

/// Loads every BFC dump of a log, in file order (TF prints up to ten per process).
///
/// # Errors
/// When the file cannot be read, a sum of its figures does not fit in 64 bits, or a DataFrame
/// cannot be built.
pub fn load_bfc_dumps(path: &Path) -> Result<Vec<BfcDump>, LoadError> {
    let (bytes, _) = read_all(path)?;
    let text = String::from_utf8_lossy(&bytes);
    parse_bfc_dumps(&text).map_err(|e| match e {
        DumpError::Polars(p) => LoadError::Polars(p),
        e @ DumpError::Unrepresentable { .. } => LoadError::format(path, e.to_string()),
    })
}

/// True when `message` (a log line without its prefix) is a line only a BFC dump prints (the
/// bare `Stats:` line is too common to count).
#[must_use]
pub fn is_dump_line(message: &str) -> bool {
    classify(message).is_some_and(|p| !matches!(p, Part::Stats | Part::Unreadable(_)))
}

/// Parses every dump in a log's text.
///
/// # Errors
/// When a sum of a dump's figures does not fit in 64 bits, or a DataFrame cannot be built.
pub fn parse_bfc_dumps(text: &str) -> Result<Vec<BfcDump>, DumpError> {
    let mut dumps = Vec::new();
    let mut current: Option<Builder> = None;
    let mut in_stats = false;
    for (i, raw) in text.lines().enumerate() {
        let line_no = i as u64 + 1;
        let message = split_log_line(raw).message;
        if in_stats && let Some(b) = current.as_mut() {
            match parse_stat(message, line_no) {
                StatLine::Stat(stat) => {
                    b.stats.push(stat);
                    b.last_line = line_no;
                    continue;
                }
                // A value that cannot be read (past 2^64, say) does not end the block.
                StatLine::Unreadable => {
                    b.unreadable(
                        line_no,
                        "a Stats line whose value is a byte count below 2^64",
                    );
                    b.last_line = line_no;
                    continue;
                }
                StatLine::Other => {}
            }
        }
        in_stats = false;
        let Some(part) = classify(message) else {
            if let Some(b) = current.as_mut()
                && b.section == lines::Section::Stats
                && b.occupancy.is_none()
                && is_occupancy(message)
            {
                b.occupancy = Some(message.trim().to_owned());
                b.last_line = line_no;
            }
            continue;
        };
        // A line that looks like a dump's but cannot be read belongs to the dump being
        // collected (outside one it is an ordinary log line).
        if let Part::Unreadable(what) = part {
            if let Some(b) = current.as_mut() {
                b.unreadable(line_no, what);
                b.last_line = line_no;
            }
            continue;
        }
        let section = part.section();
        // A late TF 0.8 request line belongs to the dump just printed.
        if let Part::LateOom(req) = &part
            && let Some(b) = current.as_mut()
            && b.oom.is_none()
        {
            b.oom = Some(req.clone().with_line(line_no));
            b.last_line = line_no;
            continue;
        }
        let starts_new = current.as_ref().is_none_or(|b| {
            section < b.section || (section == lines::Section::Header && b.has_body())
        });
        if starts_new {
            if let Some(done) = current.take() {
                done.finish_into(&mut dumps)?;
            }
            current = Some(Builder::new(line_no));
        }
        let Some(b) = current.as_mut() else {
            continue;
        };
        b.section = b.section.max(section);
        b.last_line = line_no;
        in_stats = b.add(part, line_no);
    }
    if let Some(done) = current.take() {
        done.finish_into(&mut dumps)?;
    }
    Ok(dumps)
}

fn is_occupancy(message: &str) -> bool {
    let m = message.trim();
    m.len() >= 50 && m.bytes().all(|b| matches!(b, b'*' | b'x' | b'_'))
}
