//! What each line of a BFC dump is: [`classify`] and the parsers of the line kinds.

use allocview_sim::policy::bfc::bin_num_for_size;

use super::{DumpBin, DumpChunk, DumpStat, OomRequest, PoolLine, SummaryRow};
use crate::tf::human::{ByteCount, parse_bytes};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Section {
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
pub(super) enum Part {
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
    /// A line that starts like one of the above but cannot be read: what it looked like.
    Unreadable(&'static str),
}

impl Part {
    pub(super) fn section(&self) -> Section {
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
            Self::Unreadable(_) => Section::Header,
        }
    }
}

impl OomRequest {
    pub(super) fn with_line(mut self, line: u64) -> Self {
        self.line = line;
        self
    }
}

/// What kind of dump line `message` is (line numbers are filled in by the caller).
pub(super) fn classify(message: &str) -> Option<Part> {
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
        return Some(parse_bin(m).map_or(Part::Unreadable("a bin line"), Part::Bin));
    }
    if m.starts_with("Bin for ") && m.contains("Chunk State") {
        return Some(Part::BinFor);
    }
    if m.starts_with("Size: ") && m.contains("| Requested Size: ") {
        return Some(Part::ChunkState);
    }
    if let Some(size) = m.strip_prefix("Next region of size ") {
        return Some(
            size.trim()
                .parse()
                .map_or(Part::Unreadable("a region line"), Part::Region),
        );
    }
    if let Some(c) = parse_chunk(m) {
        return Some(c);
    }
    if m.starts_with("InUse at ")
        || m.starts_with("Chunk at ")
        || m.strip_prefix("Free")
            .is_some_and(|r| r.trim_start().starts_with("at "))
    {
        return Some(Part::Unreadable("a chunk line"));
    }
    if m.starts_with("Summary of in-use Chunks by size") {
        return Some(Part::SummaryHead);
    }
    if let Some(row) = parse_summary_row(m) {
        return Some(Part::Summary(row));
    }
    if m.contains(" Chunks of size ") && m.contains(" totalling ") {
        return Some(Part::Unreadable("an in-use summary line"));
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

/// One line read inside the Stats block.
pub(super) enum StatLine {
    Stat(DumpStat),
    /// `Label: <digits...>` whose value is not a byte count that fits in 64 bits.
    Unreadable,
    /// Not a Stats line: the block has ended.
    Other,
}

/// `InUse:                       509.99MiB` (one line of the Stats block).
pub(super) fn parse_stat(message: &str, line: u64) -> StatLine {
    let Some((label, value)) = message.trim().split_once(':') else {
        return StatLine::Other;
    };
    let label = label.trim();
    if label.is_empty()
        || !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return StatLine::Other;
    }
    let text = value.trim();
    let Some(parsed) = parse_bytes(text) else {
        return if text.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
            StatLine::Unreadable
        } else {
            StatLine::Other
        };
    };
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
    StatLine::Stat(DumpStat {
        label: label.to_owned(),
        key: key.to_owned(),
        text: text.to_owned(),
        value: parsed,
        line,
    })
}
