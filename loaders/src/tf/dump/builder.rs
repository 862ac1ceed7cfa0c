//! A dump being collected: its parts as they are read, the cross-checks, and the figures.

use super::lines::{Part, Section};
use super::{
    BfcDump, DumpBin, DumpChunk, DumpError, DumpFigures, DumpFormat, DumpRegion, DumpStat,
    DumpWarning, MAX_WARNINGS_PER_KIND, NO_NEXT_HANDLE, OomRequest, PoolLine, SummaryRow,
};
use crate::tf::human::ByteCount;

/// A dump being collected.
pub(super) struct Builder {
    pub(super) first_line: u64,
    pub(super) last_line: u64,
    pub(super) section: Section,
    pub(super) allocator: Option<String>,
    pub(super) oom: Option<OomRequest>,
    pub(super) bins: Vec<DumpBin>,
    pub(super) regions: Vec<DumpRegion>,
    pub(super) chunks: Vec<DumpChunk>,
    pub(super) old_format: bool,
    pub(super) summary_head: bool,
    pub(super) summary: Vec<SummaryRow>,
    pub(super) summary_total: Option<(Option<ByteCount>, u64)>,
    pub(super) pool: Option<PoolLine>,
    pub(super) stats_seen: bool,
    pub(super) stats: Vec<DumpStat>,
    pub(super) occupancy: Option<String>,
    pub(super) warnings: Vec<DumpWarning>,
    pub(super) unreadable_lines: u64,
    pub(super) overlapping_chunks: u64,
    /// The first sum that did not fit in 64 bits: the dump is refused with it.
    pub(super) overflow: Option<(u64, String)>,
}

/// Adds `values` (each with the line it came from), or notes the first line whose value takes
/// the sum past 2^64 - 1 and returns a saturated sum.
fn checked_sum(
    overflow: &mut Option<(u64, String)>,
    what: &str,
    values: impl IntoIterator<Item = (u64, u64)>,
) -> u64 {
    let mut sum = 0u64;
    for (value, line) in values {
        match sum.checked_add(value) {
            Some(s) => sum = s,
            None => {
                overflow.get_or_insert_with(|| {
                    (
                        line,
                        format!(
                            "{what} add up past 2^64 - 1 bytes (16 EiB), which no allocator holds"
                        ),
                    )
                });
                return u64::MAX;
            }
        }
    }
    sum
}

/// The byte totals of a dump's parts, which the checks hold against one another.
struct Totals {
    chunk_in_use_bytes: u64,
    summary_bytes: u64,
    region_bytes: u64,
}

impl Builder {
    pub(super) fn new(first_line: u64) -> Self {
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
            unreadable_lines: 0,
            overlapping_chunks: 0,
            overflow: None,
        }
    }

    /// Counts a line that looks like the dump's but cannot be read (`what` it looked like).
    pub(super) fn unreadable(&mut self, line: u64, what: &str) {
        self.unreadable_lines += 1;
        if self.unreadable_lines <= MAX_WARNINGS_PER_KIND {
            self.warn(line, format!("unreadable line: expected {what}"));
        }
    }

    pub(super) fn has_body(&self) -> bool {
        self.section > Section::Header
    }

    /// Adds a part; returns true when the Stats block starts.
    pub(super) fn add(&mut self, part: Part, line: u64) -> bool {
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
            // Handled by the caller, which counts it.
            Part::Unreadable(what) => self.unreadable(line, what),
        }
        false
    }

    fn warn(&mut self, line: u64, message: String) {
        self.warnings.push(DumpWarning { line, message });
    }

    /// Keeps the dump if it holds more than an OOM header.
    pub(super) fn finish_into(self, out: &mut Vec<BfcDump>) -> Result<(), DumpError> {
        if !self.has_body() && self.stats.is_empty() {
            return Ok(());
        }
        out.push(self.finish()?);
        Ok(())
    }

    fn finish(mut self) -> Result<BfcDump, DumpError> {
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
        self.check_overlaps();
        self.check_totals();
        let figures = self.figures();
        if let Some((line, message)) = self.overflow.take() {
            return Err(DumpError::Unrepresentable { line, message });
        }
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
            unreadable_lines: self.unreadable_lines,
            overlapping_chunks: self.overlapping_chunks,
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
                // A region of contiguous chunks ends below 2^64, so its size fits: a sum that
                // does not is an overlap, which check_overlaps reports.
                r.size_bytes = r.size_bytes.saturating_add(c.size_bytes);
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
            let sum = checked_sum(
                &mut self.overflow,
                "the chunk sizes of a region",
                members.iter().map(|c| (c.size_bytes, c.line)),
            );
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

    /// Chunks in address order must not overlap: a repeated address or a chunk that starts
    /// inside the previous one is counted and warned about (TF never prints such a dump; the
    /// chunks are kept as printed).
    fn check_overlaps(&mut self) {
        let mut order: Vec<usize> = (0..self.chunks.len()).collect();
        order.sort_by_key(|&i| self.chunks.get(i).map_or(0, |c| c.address));
        let mut problems = Vec::new();
        let mut prev: Option<&DumpChunk> = None;
        for c in order.iter().filter_map(|&i| self.chunks.get(i)) {
            if let Some(p) = prev {
                let p_end = u128::from(p.address) + u128::from(p.size_bytes);
                if u128::from(c.address) < p_end {
                    problems.push((
                        c.line,
                        if c.address == p.address {
                            format!("chunk at {:#x} repeats the address of line {}", c.address, p.line)
                        } else {
                            format!(
                                "chunk at {:#x} starts inside the chunk of line {} ({:#x}, {} bytes)",
                                c.address, p.line, p.address, p.size_bytes
                            )
                        },
                    ));
                }
            }
            let ends_later = prev.is_none_or(|p| {
                u128::from(c.address) + u128::from(c.size_bytes)
                    > u128::from(p.address) + u128::from(p.size_bytes)
            });
            if ends_later {
                prev = Some(c);
            }
        }
        self.overlapping_chunks = problems.len() as u64;
        for (line, message) in problems
            .into_iter()
            .take(usize::try_from(MAX_WARNINGS_PER_KIND).unwrap_or(usize::MAX))
        {
            self.warn(line, message);
        }
    }

    /// In-use chunk bytes = summary total = InUse; bins and summary agree with the chunks.
    fn check_totals(&mut self) {
        let totals = self.sum_totals();
        let mut problems: Vec<(u64, String)> = Vec::new();
        self.check_summary(&totals, &mut problems);
        self.check_sum_total(&totals, &mut problems);
        self.check_in_use_stat(&totals, &mut problems);
        if !self.chunks.is_empty() {
            self.check_bins(&mut problems);
        }
        self.check_region_bytes(&totals, &mut problems);
        for (line, message) in problems {
            self.warn(line, message);
        }
    }

    /// Adds up the in-use chunks, the summary's rows and the regions, noting the first sum
    /// (in that order) that does not fit in 64 bits: the dump is refused with it, so the
    /// order decides which line the refusal names.
    fn sum_totals(&mut self) -> Totals {
        let chunk_in_use_bytes = checked_sum(
            &mut self.overflow,
            "the sizes of the in-use chunks",
            self.chunks
                .iter()
                .filter(|c| c.in_use)
                .map(|c| (c.size_bytes, c.line)),
        );
        for r in &self.summary {
            if r.total_bytes().is_none() {
                self.overflow.get_or_insert_with(|| {
                    (
                        r.line,
                        format!(
                            "{} chunks of {} bytes total more than 2^64 - 1 bytes (16 EiB)",
                            r.count, r.size_bytes
                        ),
                    )
                });
            }
        }
        let summary_bytes = checked_sum(
            &mut self.overflow,
            "the in-use summary's rows",
            self.summary
                .iter()
                .map(|r| (r.total_bytes().unwrap_or(u64::MAX), r.line)),
        );
        let region_bytes = checked_sum(
            &mut self.overflow,
            "the region sizes",
            self.regions
                .iter()
                .map(|r| (r.size_bytes, r.line.unwrap_or(self.first_line))),
        );
        Totals {
            chunk_in_use_bytes,
            summary_bytes,
            region_bytes,
        }
    }

    /// The in-use summary against the chunk lines: its total, each row's printed total, and
    /// each row's count of chunks of its size. TF prints all three from the same chunks, so a
    /// disagreement means a damaged or hand-edited dump.
    fn check_summary(&self, totals: &Totals, problems: &mut Vec<(u64, String)>) {
        let have_chunks = !self.chunks.is_empty();
        let Totals {
            chunk_in_use_bytes,
            summary_bytes,
            ..
        } = *totals;
        let summary_line = self.summary.first().map_or(0, |r| r.line);
        if have_chunks && !self.summary.is_empty() && chunk_in_use_bytes != summary_bytes {
            problems.push((
                summary_line,
                format!(
                    "in-use chunks hold {chunk_in_use_bytes} bytes, the summary adds up to {summary_bytes}"
                ),
            ));
        }
        for row in &self.summary {
            if let Some(t) = row.printed_total
                && let Some(total) = row.total_bytes()
                && !t.contains(total)
            {
                problems.push((
                    row.line,
                    format!(
                        "{} x {} bytes is {total}, not the printed total",
                        row.count, row.size_bytes
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
    }

    /// The summary's `Sum Total` line against its rows (it is printed rounded, so it only has
    /// to contain their sum).
    fn check_sum_total(&self, totals: &Totals, problems: &mut Vec<(u64, String)>) {
        let summary_bytes = totals.summary_bytes;
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
    }

    /// The Stats block's InUse against the best figure the dump has for it: the in-use
    /// chunks, or without chunk lines the summary's rows.
    fn check_in_use_stat(&self, totals: &Totals, problems: &mut Vec<(u64, String)>) {
        let have_chunks = !self.chunks.is_empty();
        let reference = if have_chunks {
            Some(totals.chunk_in_use_bytes)
        } else if !self.summary.is_empty() {
            Some(totals.summary_bytes)
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
    }

    /// Each bin's printed counts, then (only when the counts agree, so a bin is reported
    /// once) its printed bytes, against the chunk lines that name the bin.
    fn check_bins(&self, problems: &mut Vec<(u64, String)>) {
        for b in &self.bins {
            let members = self.chunks.iter().filter(|c| c.bin == b.bin);
            let (mut total, mut in_use, mut bytes, mut in_use_bytes) = (0u64, 0u64, 0u64, 0u64);
            // Saturating: the chunk sizes' sum was checked above.
            for c in members {
                total += 1;
                bytes = bytes.saturating_add(c.size_bytes);
                if c.in_use {
                    in_use += 1;
                    in_use_bytes = in_use_bytes.saturating_add(c.size_bytes);
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

    /// The regions' bytes against the Stats block's Limit (the allocator never reserves past
    /// it) and the pool line's total.
    fn check_region_bytes(&self, totals: &Totals, problems: &mut Vec<(u64, String)>) {
        let region_bytes = totals.region_bytes;
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
                Some(self.summary.iter().fold(0u64, |s, r| {
                    s.saturating_add(r.total_bytes().unwrap_or(u64::MAX))
                }))
            };
            let in_use_chunks = (!self.summary.is_empty()).then(|| {
                self.summary
                    .iter()
                    .fold(0u64, |s, r| s.saturating_add(r.count))
            });
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
            region_bytes: Some(
                self.regions
                    .iter()
                    .fold(0u64, |s, r| s.saturating_add(r.size_bytes)),
            ),
            largest_free_chunk_bytes: Some(0),
            request_rounded_bytes,
            fragmentation_oom: None,
        };
        let (mut iu_n, mut iu_b, mut fr_n, mut fr_b, mut largest) = (0, 0, 0, 0, 0);
        for c in &self.chunks {
            // Saturating: a sum past 2^64 was noted by the checks, and the dump is refused.
            if c.in_use {
                iu_n += 1;
                iu_b = c.size_bytes.saturating_add(iu_b);
            } else {
                fr_n += 1;
                fr_b = c.size_bytes.saturating_add(fr_b);
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
}
