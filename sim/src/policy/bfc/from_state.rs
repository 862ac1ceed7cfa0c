//! [`Bfc::from_state`]: an allocator rebuilt from observed state (a TensorFlow log at a
//! checkpoint, an OOM dump).

use super::*;

impl Bfc {
    /// Rebuilds an allocator from observed state (e.g. a TensorFlow log at a checkpoint):
    /// the regions, the live chunks, the region size target and the stats. Free chunks are the
    /// gaps between live chunks inside each region (BFC never leaves two free chunks side by
    /// side). The next allocation id is one past `max(stats.num_allocs, largest live id)`.
    /// Chunk handles are assigned in address order, so they will not match TF's.
    ///
    /// # Errors
    /// When regions overlap or are not 256-byte multiples, a chunk is malformed, lies outside
    /// the regions or overlaps another, the regions exceed the limit, or `stats.bytes_in_use`
    /// differs from the live chunks' total.
    pub fn from_state(
        opts: BfcOptions,
        regions: &[RegionInfo],
        live_chunks: &[LiveChunk],
        curr_region_allocation_bytes: u64,
        stats: BfcStats,
    ) -> Result<Self, BfcStateError> {
        let mut bfc = Self::new(opts);
        let mut regs: Vec<RegionInfo> = regions.to_vec();
        regs.sort_by_key(|r| r.base);
        let mut region_bytes: u64 = 0;
        for (index, r) in regs.iter().enumerate() {
            let end = r.base.checked_add(r.size_bytes);
            if r.size_bytes == 0
                || !r.size_bytes.is_multiple_of(MIN_ALLOCATION_BYTES)
                || end.is_none()
            {
                return Err(BfcStateError::BadRegion {
                    index,
                    base: r.base,
                    size_bytes: r.size_bytes,
                });
            }
            region_bytes = region_bytes.saturating_add(r.size_bytes);
        }
        for w in regs.windows(2) {
            if let [a, b] = w
                && a.base + a.size_bytes > b.base
            {
                return Err(BfcStateError::RegionsOverlap {
                    first: a.base,
                    second: b.base,
                });
            }
        }
        if region_bytes > opts.limit_bytes {
            return Err(BfcStateError::OverLimit {
                region_bytes,
                limit_bytes: opts.limit_bytes,
            });
        }
        let mut live: Vec<LiveChunk> = live_chunks.to_vec();
        live.sort_by_key(|c| c.addr);
        let mut chunk_bytes: u64 = 0;
        for c in &live {
            if c.size_bytes == 0
                || !c.size_bytes.is_multiple_of(MIN_ALLOCATION_BYTES)
                || c.requested_bytes > c.size_bytes
            {
                return Err(BfcStateError::BadChunk {
                    addr: c.addr,
                    size_bytes: c.size_bytes,
                    requested_bytes: c.requested_bytes,
                });
            }
            chunk_bytes = chunk_bytes.saturating_add(c.size_bytes);
        }
        for w in live.windows(2) {
            if let [a, b] = w
                && a.addr.saturating_add(a.size_bytes) > b.addr
            {
                return Err(BfcStateError::ChunksOverlap {
                    first: a.addr,
                    second: b.addr,
                });
            }
        }
        if stats.bytes_in_use != chunk_bytes {
            return Err(BfcStateError::BytesInUseMismatch {
                stats_bytes: stats.bytes_in_use,
                chunk_bytes,
            });
        }

        let mut max_id = 0;
        let mut next_live = live.iter().peekable();
        for r in &regs {
            let end = r.base + r.size_bytes;
            let mut cursor = r.base;
            let mut prev = NONE;
            let mut first = NONE;
            while let Some(c) = next_live.next_if(|c| c.addr < end) {
                let c_end = c.addr.saturating_add(c.size_bytes);
                if c.addr < cursor
                    || c_end > end
                    || !(c.addr - r.base).is_multiple_of(MIN_ALLOCATION_BYTES)
                {
                    return Err(BfcStateError::ChunkOutsideRegions {
                        addr: c.addr,
                        size_bytes: c.size_bytes,
                    });
                }
                if c.addr > cursor {
                    let gap = free_chunk(cursor, c.addr - cursor, prev);
                    let h = bfc.append_chunk(gap, &mut prev, &mut first);
                    bfc.free.insert(&bfc.chunks, gap.size_bytes, gap.addr, h);
                }
                let chunk = Chunk {
                    addr: c.addr,
                    size_bytes: c.size_bytes,
                    requested_bytes: c.requested_bytes,
                    // 0 marks free chunks here; TF's ids start at 1 anyway.
                    allocation_id: c.allocation_id.max(1),
                    request_id: c.request_id,
                    prev,
                    next: NONE,
                };
                let h = bfc.append_chunk(chunk, &mut prev, &mut first);
                bfc.in_use_by_addr.insert(c.addr, h);
                bfc.live_bytes += c.requested_bytes;
                max_id = max_id.max(c.allocation_id);
                cursor = c_end;
            }
            if cursor < end {
                let gap = free_chunk(cursor, end - cursor, prev);
                let h = bfc.append_chunk(gap, &mut prev, &mut first);
                bfc.free.insert(&bfc.chunks, gap.size_bytes, gap.addr, h);
            }
            bfc.regions.push(Region {
                base: r.base,
                size_bytes: r.size_bytes,
                first,
            });
            bfc.note_base(r.base);
            bfc.next_default_base = bfc.next_default_base.max(end);
        }
        if let Some(c) = next_live.next() {
            return Err(BfcStateError::ChunkOutsideRegions {
                addr: c.addr,
                size_bytes: c.size_bytes,
            });
        }
        bfc.total_region_allocated_bytes = region_bytes;
        bfc.curr_region_allocation_bytes = curr_region_allocation_bytes;
        bfc.next_allocation_id = stats.num_allocs.max(max_id).saturating_add(1);
        bfc.stats = BfcStats {
            bytes_limit: opts.limit_bytes,
            ..stats
        };
        Ok(bfc)
    }
}
