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
//! regions and only a region's last chunk has `next 18446744073709551615`.

use std::path::Path;

use allocview_sim::policy::bfc::{
    Bfc, BfcOptions, BfcStateError, BfcStats, LiveChunk, RegionInfo, bin_num_for_size,
    rounded_bytes,
};
use allocview_sim::policy::{Block, BlockState};
use allocview_sim::trace::NO_ALLOC_ID;
use polars::prelude::*;

use super::human::{ByteCount, parse_bytes};
use super::split_log_line;
use crate::error::LoadError;
use crate::input::read_all;

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
        let region_bytes: u64 = self.regions.iter().map(|r| r.size_bytes).sum();
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
        let bytes_in_use = live.iter().map(|c| c.size_bytes).sum();
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
/// When the file cannot be read or a DataFrame cannot be built.
pub fn load_bfc_dumps(path: &Path) -> Result<Vec<BfcDump>, LoadError> {
    let (bytes, _) = read_all(path)?;
    let text = String::from_utf8_lossy(&bytes);
    Ok(parse_bfc_dumps(&text)?)
}

/// True when `message` (a log line without its prefix) is a line only a BFC dump prints (the
/// bare `Stats:` line is too common to count).
#[must_use]
pub fn is_dump_line(message: &str) -> bool {
    classify(message).is_some_and(|p| !matches!(p, Part::Stats))
}

/// Parses every dump in a log's text.
///
/// # Errors
/// When a DataFrame cannot be built.
pub fn parse_bfc_dumps(text: &str) -> PolarsResult<Vec<BfcDump>> {
    let mut dumps = Vec::new();
    let mut current: Option<Builder> = None;
    let mut in_stats = false;
    for (i, raw) in text.lines().enumerate() {
        let line_no = i as u64 + 1;
        let message = split_log_line(raw).message;
        if in_stats {
            if let Some(b) = current.as_mut()
                && let Some(stat) = parse_stat(message, line_no)
            {
                b.stats.push(stat);
                b.last_line = line_no;
                continue;
            }
            in_stats = false;
        }
        let Some(part) = classify(message) else {
            if let Some(b) = current.as_mut()
                && b.section == Section::Stats
                && b.occupancy.is_none()
                && is_occupancy(message)
            {
                b.occupancy = Some(message.trim().to_owned());
                b.last_line = line_no;
            }
            continue;
        };
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
        let starts_new = current
            .as_ref()
            .is_none_or(|b| section < b.section || (section == Section::Header && b.has_body()));
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Section {
    Header,
    DumpFor,
    Bins,
    BinFor,
    Chunks,
    Summary,
    SumTotal,
    Pool,
    Stats,
}

#[derive(Clone, Debug)]
enum Part {
    Header(Option<String>, OomRequest),
    LateOom(OomRequest),
    DumpFor(String),
    Bin(DumpBin),
    BinFor,
    ChunkState,
    Region(u64),
    Chunk(DumpChunk, bool),
    SummaryHead,
    Summary(SummaryRow),
    SumTotal(Option<ByteCount>),
    Pool(PoolLine),
    Stats,
}

impl Part {
    fn section(&self) -> Section {
        match self {
            Self::Header(..) | Self::LateOom(_) => Section::Header,
            Self::DumpFor(_) => Section::DumpFor,
            Self::Bin(_) => Section::Bins,
            Self::BinFor | Self::ChunkState => Section::BinFor,
            Self::Region(_) | Self::Chunk(..) => Section::Chunks,
            Self::SummaryHead | Self::Summary(_) => Section::Summary,
            Self::SumTotal(_) => Section::SumTotal,
            Self::Pool(_) => Section::Pool,
            Self::Stats => Section::Stats,
        }
    }
}

impl OomRequest {
    fn with_line(mut self, line: u64) -> Self {
        self.line = line;
        self
    }
}

/// What kind of dump line `message` is (line numbers are filled in by the caller).
fn classify(message: &str) -> Option<Part> {
    let m = message.trim();
    if let Some(rest) = m.strip_prefix("Allocator (") {
        if m.contains("with freed_by_count") {
            // The non-retry warning: no dump follows it.
            return None;
        }
        let (name, rest) = rest.split_once(") ran out of memory trying to allocate ")?;
        return Some(Part::Header(Some(name.to_owned()), parse_request(rest)));
    }
    if let Some(rest) = m.strip_prefix("Ran out of memory trying to allocate ") {
        return Some(Part::LateOom(parse_request(rest)));
    }
    if let Some(name) = m.strip_prefix("BFCAllocator dump for ") {
        return Some(Part::DumpFor(name.trim().to_owned()));
    }
    if m.starts_with("Bin (") {
        return parse_bin(m).map(Part::Bin);
    }
    if m.starts_with("Bin for ") && m.contains("Chunk State") {
        return Some(Part::BinFor);
    }
    if m.starts_with("Size: ") && m.contains("| Requested Size: ") {
        return Some(Part::ChunkState);
    }
    if let Some(size) = m.strip_prefix("Next region of size ") {
        return size.trim().parse().ok().map(Part::Region);
    }
    if let Some(c) = parse_chunk(m) {
        return Some(c);
    }
    if m.starts_with("Summary of in-use Chunks by size") {
        return Some(Part::SummaryHead);
    }
    if let Some(row) = parse_summary_row(m) {
        return Some(Part::Summary(row));
    }
    if let Some(total) = m.strip_prefix("Sum Total of in-use chunks: ") {
        return Some(Part::SumTotal(parse_bytes(total)));
    }
    if m.starts_with("total_region_allocated_bytes_:")
        || m.starts_with("Total size in pool:")
        || m.starts_with("Total bytes in pool:")
    {
        return Some(Part::Pool(parse_pool(m)));
    }
    if m == "Stats:" {
        return Some(Part::Stats);
    }
    None
}

/// `98.00MiB (rounded to 102760448)requested by op OP` and its older and newer variants.
fn parse_request(rest: &str) -> OomRequest {
    let rest = rest.trim();
    let text_end = rest.find([' ', '(']).unwrap_or(rest.len());
    let text = rest[..text_end].trim_end_matches('.').to_owned();
    let rounded_bytes = rest
        .split_once("(rounded to ")
        .and_then(|(_, r)| r.split_once(')'))
        .and_then(|(n, _)| n.trim().parse().ok());
    let op = rest
        .split_once("requested by op ")
        .map(|(_, op)| op.trim().to_owned())
        .filter(|op| !op.is_empty());
    OomRequest {
        bytes: parse_bytes(&text),
        text,
        rounded_bytes,
        op,
        line: 0,
    }
}

/// `Bin (256): \tTotal Chunks: 3, Chunks in use: 2. 1.0KiB allocated for chunks. 768B in use
/// in bin. 520B client-requested in use in bin.`
fn parse_bin(m: &str) -> Option<DumpBin> {
    let rest = m.strip_prefix("Bin (")?;
    let (size, rest) = rest.split_once("):")?;
    let bin_size_bytes: u64 = size.trim().parse().ok()?;
    let rest = rest.trim().strip_prefix("Total Chunks: ")?;
    let (total, rest) = rest.split_once(", Chunks in use: ")?;
    let (in_use, rest) = rest.split_once(". ")?;
    let (allocated, rest) = rest.split_once(" allocated for chunks. ")?;
    let (in_use_bytes, rest) = rest.split_once(" in use in bin. ")?;
    let (requested, _) = rest.split_once(" client-requested in use in bin")?;
    let bin = u8::try_from(bin_num_for_size(bin_size_bytes)).ok()?;
    Some(DumpBin {
        bin,
        bin_size_bytes,
        total_chunks: total.trim().parse().ok()?,
        chunks_in_use: in_use.trim().parse().ok()?,
        allocated: parse_bytes(allocated)?,
        in_use: parse_bytes(in_use_bytes)?,
        requested_in_use: parse_bytes(requested)?,
        line: 0,
    })
}

/// `InUse at 7fac77072040 of size 106463232 next 3995`, `Free  at ...`, `Chunk at 0x... of
/// size N`, `Free at 0x... of size N`. The bool is true for the old format.
fn parse_chunk(m: &str) -> Option<Part> {
    let (in_use, old, rest) = if let Some(r) = m.strip_prefix("InUse at ") {
        (true, false, r)
    } else if let Some(r) = m.strip_prefix("Chunk at ") {
        (true, true, r)
    } else if let Some(r) = m.strip_prefix("Free") {
        (false, false, r.trim_start().strip_prefix("at ")?)
    } else {
        return None;
    };
    let (addr, rest) = rest.split_once(" of size ")?;
    let addr = addr.trim();
    let hex = addr
        .strip_prefix("0x")
        .or_else(|| addr.strip_prefix("0X"))
        .unwrap_or(addr);
    let address = u64::from_str_radix(hex, 16).ok()?;
    let mut words = rest.split_whitespace();
    let size_bytes: u64 = words.next()?.parse().ok()?;
    let mut next_handle = None;
    let mut requested_bytes = None;
    while let Some(w) = words.next() {
        match w {
            "next" => next_handle = words.next().and_then(|n| n.parse().ok()),
            "requested" | "requested_size" => {
                requested_bytes = words.next().and_then(|n| n.parse().ok());
            }
            _ => {}
        }
    }
    // An old-format free chunk says `Free at 0x...`; the current one `Free  at <hex>`.
    let old = old || (!in_use && next_handle.is_none() && addr.starts_with("0x"));
    Some(Part::Chunk(
        DumpChunk {
            address,
            size_bytes,
            in_use,
            requested_bytes,
            bin: u8::try_from(bin_num_for_size(size_bytes)).unwrap_or(u8::MAX),
            next_handle,
            region: None,
            line: 0,
        },
        old,
    ))
}

/// `2234 Chunks of size 256 totalling 558.5KiB`.
fn parse_summary_row(m: &str) -> Option<SummaryRow> {
    let (count, rest) = m.split_once(" Chunks of size ")?;
    let (size, total) = rest.split_once(" totalling ")?;
    Some(SummaryRow {
        size_bytes: size.trim().parse().ok()?,
        count: count.trim().parse().ok()?,
        printed_total: parse_bytes(total),
        line: 0,
    })
}

fn parse_pool(m: &str) -> PoolLine {
    let value_after = |labels: &[&str]| {
        labels.iter().find_map(|label| {
            m.split_once(label)
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .and_then(parse_bytes)
        })
    };
    PoolLine {
        region_bytes: value_after(&[
            "total_region_allocated_bytes_:",
            "Total size in pool:",
            "Total bytes in pool:",
        ]),
        memory_limit: value_after(&["memory_limit_:"]),
        available: value_after(&["available bytes:", "available size:"]),
        curr_region_allocation: value_after(&["curr_region_allocation_bytes_:"]),
        line: 0,
    }
}

/// `InUse:                       509.99MiB` (one line of the Stats block).
fn parse_stat(message: &str, line: u64) -> Option<DumpStat> {
    let (label, value) = message.trim().split_once(':')?;
    let label = label.trim();
    if label.is_empty()
        || !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return None;
    }
    let text = value.trim();
    let parsed = parse_bytes(text)?;
    let key = match label {
        "Limit" => "bytes_limit",
        "InUse" => "bytes_in_use",
        "MaxInUse" => "peak_bytes_in_use",
        "NumAllocs" => "num_allocs",
        "MaxAllocSize" => "largest_alloc_size",
        "Reserved" => "bytes_reserved",
        "PeakReserved" => "peak_bytes_reserved",
        "LargestFreeBlock" => "largest_free_block_bytes",
        other => other,
    };
    Some(DumpStat {
        label: label.to_owned(),
        key: key.to_owned(),
        text: text.to_owned(),
        value: parsed,
        line,
    })
}

fn is_occupancy(message: &str) -> bool {
    let m = message.trim();
    m.len() >= 50 && m.bytes().all(|b| matches!(b, b'*' | b'x' | b'_'))
}

/// A dump being collected.
struct Builder {
    first_line: u64,
    last_line: u64,
    section: Section,
    allocator: Option<String>,
    oom: Option<OomRequest>,
    bins: Vec<DumpBin>,
    regions: Vec<DumpRegion>,
    chunks: Vec<DumpChunk>,
    old_format: bool,
    summary_head: bool,
    summary: Vec<SummaryRow>,
    summary_total: Option<(Option<ByteCount>, u64)>,
    pool: Option<PoolLine>,
    stats_seen: bool,
    stats: Vec<DumpStat>,
    occupancy: Option<String>,
    warnings: Vec<DumpWarning>,
}

impl Builder {
    fn new(first_line: u64) -> Self {
        Self {
            first_line,
            last_line: first_line,
            section: Section::Header,
            allocator: None,
            oom: None,
            bins: Vec::new(),
            regions: Vec::new(),
            chunks: Vec::new(),
            old_format: false,
            summary_head: false,
            summary: Vec::new(),
            summary_total: None,
            pool: None,
            stats_seen: false,
            stats: Vec::new(),
            occupancy: None,
            warnings: Vec::new(),
        }
    }

    fn has_body(&self) -> bool {
        self.section > Section::Header
    }

    /// Adds a part; returns true when the Stats block starts.
    fn add(&mut self, part: Part, line: u64) -> bool {
        match part {
            Part::Header(name, req) => {
                if let Some(n) = name {
                    self.allocator.get_or_insert(n);
                }
                self.oom = Some(req.with_line(line));
            }
            Part::LateOom(req) => self.oom = Some(req.with_line(line)),
            Part::DumpFor(name) => {
                if let Some(a) = &self.allocator
                    && *a != name
                {
                    self.warn(
                        line,
                        format!("dump is for allocator {name}, the OOM header named {a}"),
                    );
                }
                self.allocator = Some(name);
            }
            Part::Bin(b) => self.bins.push(DumpBin { line, ..b }),
            Part::BinFor | Part::ChunkState | Part::SummaryHead => {
                self.summary_head |= matches!(part, Part::SummaryHead);
            }
            Part::Region(size_bytes) => self.regions.push(DumpRegion {
                address: None,
                size_bytes,
                line: Some(line),
            }),
            Part::Chunk(c, old) => {
                self.old_format |= old;
                let region = if old {
                    None
                } else {
                    u32::try_from(self.regions.len())
                        .ok()
                        .and_then(|n| n.checked_sub(1))
                };
                if let Some(r) = region.and_then(|r| self.regions.get_mut(r as usize))
                    && r.address.is_none()
                {
                    r.address = Some(c.address);
                }
                if !old && region.is_none() {
                    self.warn(line, "chunk line before any `Next region` line".into());
                }
                self.chunks.push(DumpChunk { line, region, ..c });
            }
            Part::Summary(row) => self.summary.push(SummaryRow { line, ..row }),
            Part::SumTotal(total) => self.summary_total = Some((total, line)),
            Part::Pool(p) => self.pool = Some(PoolLine { line, ..p }),
            Part::Stats => {
                self.stats_seen = true;
                return true;
            }
        }
        false
    }

    fn warn(&mut self, line: u64, message: String) {
        self.warnings.push(DumpWarning { line, message });
    }

    /// Keeps the dump if it holds more than an OOM header.
    fn finish_into(self, out: &mut Vec<BfcDump>) -> PolarsResult<()> {
        if !self.has_body() && self.stats.is_empty() {
            return Ok(());
        }
        out.push(self.finish()?);
        Ok(())
    }

    fn finish(mut self) -> PolarsResult<BfcDump> {
        let format = if self.chunks.is_empty() {
            DumpFormat::Partial
        } else if self.old_format {
            DumpFormat::Old
        } else {
            DumpFormat::Current
        };
        if format == DumpFormat::Old {
            self.infer_regions();
        } else {
            self.check_regions();
        }
        self.check_totals();
        let figures = self.figures();
        let missing = self.missing(format);
        let frames = self.frames()?;
        Ok(BfcDump {
            allocator: self.allocator,
            format,
            oom: self.oom,
            regions: self.regions,
            chunks: self.chunks,
            bins: self.bins,
            summary: self.summary,
            summary_total: self.summary_total.and_then(|(t, _)| t),
            pool: self.pool,
            stats: self.stats,
            occupancy: self.occupancy,
            figures,
            missing,
            warnings: self.warnings,
            first_line: self.first_line,
            last_line: self.last_line,
            frames,
        })
    }

    /// Old dumps list in-use chunks, then free ones, with no regions: sort by address and
    /// take each contiguous run as a region.
    fn infer_regions(&mut self) {
        self.chunks.sort_by_key(|c| c.address);
        self.regions.clear();
        let mut end: Option<u64> = None;
        for c in &mut self.chunks {
            if end != Some(c.address) {
                self.regions.push(DumpRegion {
                    address: Some(c.address),
                    size_bytes: 0,
                    line: None,
                });
            }
            if let Some(r) = self.regions.last_mut() {
                r.size_bytes += c.size_bytes;
            }
            c.region = u32::try_from(self.regions.len())
                .ok()
                .and_then(|n| n.checked_sub(1));
            end = c.address.checked_add(c.size_bytes);
        }
    }

    /// Chunks must tile each region, and only its last chunk may have no `next`.
    fn check_regions(&mut self) {
        let mut problems = Vec::new();
        for (i, r) in self.regions.iter().enumerate() {
            let line = r.line.unwrap_or(0);
            let members: Vec<&DumpChunk> = self
                .chunks
                .iter()
                .filter(|c| c.region.is_some_and(|x| x as usize == i))
                .collect();
            let Some(first) = members.first() else {
                problems.push((
                    line,
                    format!("region of size {} lists no chunk", r.size_bytes),
                ));
                continue;
            };
            let mut cursor = first.address;
            for (k, c) in members.iter().enumerate() {
                if c.address != cursor {
                    problems.push((
                        c.line,
                        format!(
                            "chunk at {:#x} does not follow the previous chunk (expected {cursor:#x})",
                            c.address
                        ),
                    ));
                }
                cursor = c.address.saturating_add(c.size_bytes);
                let last = k + 1 == members.len();
                if let Some(next) = c.next_handle
                    && (next == NO_NEXT_HANDLE) != last
                {
                    problems.push((
                        c.line,
                        if last {
                            format!("the region's last chunk has next {next}, expected -1")
                        } else {
                            "a chunk inside the region has no next chunk".to_owned()
                        },
                    ));
                }
            }
            let sum: u64 = members.iter().map(|c| c.size_bytes).sum();
            if sum != r.size_bytes {
                problems.push((
                    line,
                    format!(
                        "the region's {} chunks hold {sum} bytes, the region has {}",
                        members.len(),
                        r.size_bytes
                    ),
                ));
            }
        }
        for (line, message) in problems {
            self.warn(line, message);
        }
    }

    /// In-use chunk bytes = summary total = InUse; bins and summary agree with the chunks.
    fn check_totals(&mut self) {
        let mut problems: Vec<(u64, String)> = Vec::new();
        let have_chunks = !self.chunks.is_empty();
        let chunk_in_use: u64 = self
            .chunks
            .iter()
            .filter(|c| c.in_use)
            .map(|c| c.size_bytes)
            .sum();
        let summary_bytes: u64 = self.summary.iter().map(|r| r.size_bytes * r.count).sum();
        let summary_line = self.summary.first().map_or(0, |r| r.line);
        if have_chunks && !self.summary.is_empty() && chunk_in_use != summary_bytes {
            problems.push((
                summary_line,
                format!(
                    "in-use chunks hold {chunk_in_use} bytes, the summary adds up to {summary_bytes}"
                ),
            ));
        }
        for row in &self.summary {
            if let Some(t) = row.printed_total
                && !t.contains(row.size_bytes * row.count)
            {
                problems.push((
                    row.line,
                    format!(
                        "{} x {} bytes is {}, not the printed total",
                        row.count,
                        row.size_bytes,
                        row.size_bytes * row.count
                    ),
                ));
            }
            if have_chunks {
                let n = self
                    .chunks
                    .iter()
                    .filter(|c| c.in_use && c.size_bytes == row.size_bytes)
                    .count() as u64;
                if n != row.count {
                    problems.push((
                        row.line,
                        format!(
                            "the summary counts {} in-use chunks of {} bytes, the chunk lines {n}",
                            row.count, row.size_bytes
                        ),
                    ));
                }
            }
        }
        if let Some((total, line)) = self.summary_total {
            match total {
                Some(t) if !self.summary.is_empty() && !t.contains(summary_bytes) => {
                    problems.push((
                        line,
                        format!("Sum Total does not print the summary's {summary_bytes} bytes"),
                    ));
                }
                None => problems.push((line, "unreadable Sum Total".into())),
                _ => {}
            }
        }
        let reference = if have_chunks {
            Some(chunk_in_use)
        } else if !self.summary.is_empty() {
            Some(summary_bytes)
        } else {
            None
        };
        if let (Some(stat), Some(bytes)) = (
            self.stats.iter().find(|s| s.key == "bytes_in_use"),
            reference,
        ) && !stat.value.contains(bytes)
        {
            problems.push((
                stat.line,
                format!(
                    "InUse is {} but the {} hold {bytes} bytes",
                    stat.text,
                    if have_chunks {
                        "in-use chunks"
                    } else {
                        "summary rows"
                    }
                ),
            ));
        }
        if have_chunks {
            for b in &self.bins {
                let members = self.chunks.iter().filter(|c| c.bin == b.bin);
                let (mut total, mut in_use, mut bytes, mut in_use_bytes) = (0u64, 0u64, 0u64, 0u64);
                for c in members {
                    total += 1;
                    bytes += c.size_bytes;
                    if c.in_use {
                        in_use += 1;
                        in_use_bytes += c.size_bytes;
                    }
                }
                if total != b.total_chunks || in_use != b.chunks_in_use {
                    problems.push((
                        b.line,
                        format!(
                            "bin {} says {} chunks ({} in use), the chunk lines have {total} ({in_use})",
                            b.bin_size_bytes, b.total_chunks, b.chunks_in_use
                        ),
                    ));
                } else if !b.allocated.contains(bytes) || !b.in_use.contains(in_use_bytes) {
                    problems.push((
                        b.line,
                        format!(
                            "bin {}: its chunks hold {bytes} bytes ({in_use_bytes} in use), not the printed figures",
                            b.bin_size_bytes
                        ),
                    ));
                }
            }
        }
        let region_bytes: u64 = self.regions.iter().map(|r| r.size_bytes).sum();
        if let Some(limit) = self.stats.iter().find(|s| s.key == "bytes_limit")
            && limit.value.max_bytes > 0
            && region_bytes > limit.value.max_bytes
        {
            problems.push((
                limit.line,
                format!("regions hold {region_bytes} bytes, more than the Limit"),
            ));
        }
        if let Some(p) = self.pool
            && let Some(pool) = p.region_bytes
            && !self.regions.is_empty()
            && !pool.contains(region_bytes)
        {
            problems.push((
                p.line,
                format!("the pool line's total does not match the regions' {region_bytes} bytes"),
            ));
        }
        for (line, message) in problems {
            self.warn(line, message);
        }
    }

    fn figures(&self) -> DumpFigures {
        let request_rounded_bytes = self.oom.as_ref().and_then(OomRequest::rounded_or_estimate);
        if self.chunks.is_empty() {
            let in_use_bytes = if self.summary.is_empty() {
                self.stats
                    .iter()
                    .find(|s| s.key == "bytes_in_use")
                    .map(|s| s.value.bytes)
            } else {
                Some(self.summary.iter().map(|r| r.size_bytes * r.count).sum())
            };
            let in_use_chunks =
                (!self.summary.is_empty()).then(|| self.summary.iter().map(|r| r.count).sum());
            return DumpFigures {
                in_use_chunks,
                in_use_bytes,
                request_rounded_bytes,
                ..DumpFigures::default()
            };
        }
        let mut f = DumpFigures {
            in_use_chunks: Some(0),
            in_use_bytes: Some(0),
            free_chunks: Some(0),
            free_bytes: Some(0),
            regions: Some(self.regions.len() as u64),
            region_bytes: Some(self.regions.iter().map(|r| r.size_bytes).sum()),
            largest_free_chunk_bytes: Some(0),
            request_rounded_bytes,
            fragmentation_oom: None,
        };
        let (mut iu_n, mut iu_b, mut fr_n, mut fr_b, mut largest) = (0, 0, 0, 0, 0);
        for c in &self.chunks {
            if c.in_use {
                iu_n += 1;
                iu_b += c.size_bytes;
            } else {
                fr_n += 1;
                fr_b += c.size_bytes;
                largest = largest.max(c.size_bytes);
            }
        }
        f.in_use_chunks = Some(iu_n);
        f.in_use_bytes = Some(iu_b);
        f.free_chunks = Some(fr_n);
        f.free_bytes = Some(fr_b);
        f.largest_free_chunk_bytes = Some(largest);
        f.fragmentation_oom = request_rounded_bytes.map(|r| fr_b >= r && largest < r);
        f
    }

    fn missing(&self, format: DumpFormat) -> Vec<String> {
        let mut m = Vec::new();
        let mut need = |ok: bool, what: &str| {
            if !ok {
                m.push(what.to_owned());
            }
        };
        need(self.allocator.is_some(), "allocator name");
        need(self.oom.is_some(), "OOM request");
        need(
            self.oom.as_ref().is_some_and(|o| o.rounded_bytes.is_some()),
            "rounded request",
        );
        need(
            self.oom.as_ref().is_some_and(|o| o.op.is_some()),
            "requesting op",
        );
        need(!self.bins.is_empty(), "bins");
        need(
            format == DumpFormat::Current && !self.regions.is_empty(),
            "region lines",
        );
        need(!self.chunks.is_empty(), "chunks");
        need(
            self.chunks.iter().any(|c| c.next_handle.is_some()),
            "next handles",
        );
        need(!self.summary.is_empty(), "in-use summary");
        need(self.stats_seen && !self.stats.is_empty(), "Stats block");
        m
    }

    fn frames(&self) -> PolarsResult<DumpFrames> {
        let regions = df_from(vec![
            col_u32(
                "region",
                (0..self.regions.len())
                    .map(|i| u32::try_from(i).ok())
                    .collect(),
            ),
            col_u64("address", self.regions.iter().map(|r| r.address).collect()),
            col_u64(
                "size_bytes",
                self.regions.iter().map(|r| Some(r.size_bytes)).collect(),
            ),
            col_u64("line", self.regions.iter().map(|r| r.line).collect()),
        ])?;
        let c = &self.chunks;
        let chunks = df_from(vec![
            col_u64("address", c.iter().map(|c| Some(c.address)).collect()),
            col_u64("size_bytes", c.iter().map(|c| Some(c.size_bytes)).collect()),
            Column::new(
                "in_use".into(),
                c.iter().map(|c| c.in_use).collect::<Vec<_>>(),
            ),
            col_u64(
                "requested_bytes",
                c.iter().map(|c| c.requested_bytes).collect(),
            ),
            UInt8Chunked::from_vec("bin".into(), c.iter().map(|c| c.bin).collect()).into_column(),
            col_u64("next_handle", c.iter().map(|c| c.next_handle).collect()),
            col_u32("region", c.iter().map(|c| c.region).collect()),
            col_u64("line", c.iter().map(|c| Some(c.line)).collect()),
        ])?;
        let b = &self.bins;
        let bins = df_from(vec![
            UInt8Chunked::from_vec("bin".into(), b.iter().map(|b| b.bin).collect()).into_column(),
            col_u64(
                "bin_size_bytes",
                b.iter().map(|b| Some(b.bin_size_bytes)).collect(),
            ),
            col_u64(
                "total_chunks",
                b.iter().map(|b| Some(b.total_chunks)).collect(),
            ),
            col_u64(
                "chunks_in_use",
                b.iter().map(|b| Some(b.chunks_in_use)).collect(),
            ),
            col_u64(
                "allocated_bytes",
                b.iter().map(|b| Some(b.allocated.bytes)).collect(),
            ),
            col_u64(
                "in_use_bytes",
                b.iter().map(|b| Some(b.in_use.bytes)).collect(),
            ),
            col_u64(
                "requested_in_use_bytes",
                b.iter().map(|b| Some(b.requested_in_use.bytes)).collect(),
            ),
            col_u64("line", b.iter().map(|b| Some(b.line)).collect()),
        ])?;
        let s = &self.summary;
        let in_use_summary = df_from(vec![
            col_u64("size_bytes", s.iter().map(|r| Some(r.size_bytes)).collect()),
            col_u64("count", s.iter().map(|r| Some(r.count)).collect()),
            col_u64(
                "total_bytes",
                s.iter().map(|r| Some(r.size_bytes * r.count)).collect(),
            ),
            col_u64("line", s.iter().map(|r| Some(r.line)).collect()),
        ])?;
        let st = &self.stats;
        let stats = df_from(vec![
            Column::new(
                "label".into(),
                st.iter().map(|s| s.label.as_str()).collect::<Vec<_>>(),
            ),
            Column::new(
                "key".into(),
                st.iter().map(|s| s.key.as_str()).collect::<Vec<_>>(),
            ),
            Column::new(
                "text".into(),
                st.iter().map(|s| s.text.as_str()).collect::<Vec<_>>(),
            ),
            col_u64("bytes", st.iter().map(|s| Some(s.value.bytes)).collect()),
            col_u64(
                "min_bytes",
                st.iter().map(|s| Some(s.value.min_bytes)).collect(),
            ),
            col_u64(
                "max_bytes",
                st.iter().map(|s| Some(s.value.max_bytes)).collect(),
            ),
            col_u64("line", st.iter().map(|s| Some(s.line)).collect()),
        ])?;
        Ok(DumpFrames {
            regions,
            chunks,
            bins,
            in_use_summary,
            stats,
        })
    }
}

pub(crate) fn col_u64(name: &str, values: Vec<Option<u64>>) -> Column {
    UInt64Chunked::from_iter_options(name.into(), values.into_iter()).into_column()
}

pub(crate) fn col_u32(name: &str, values: Vec<Option<u32>>) -> Column {
    UInt32Chunked::from_iter_options(name.into(), values.into_iter()).into_column()
}

pub(crate) fn df_from(columns: Vec<Column>) -> PolarsResult<DataFrame> {
    let height = columns.first().map_or(0, Column::len);
    DataFrame::new(height, columns)
}
