//! BFC's regions: `Extend`, the region growth rule (a target that starts at 2 MiB and doubles,
//! or doubles until the request fits and then does not double again), and
//! `DeallocateFreeRegions`, the garbage collection of wholly free regions.

use super::*;

impl Bfc {
    /// `Extend`: adds one region if the limit allows `rounded` more bytes.
    pub(super) fn extend(&mut self, rounded: u64) -> Result<bool, AllocError> {
        let available = self
            .opts
            .limit_bytes
            .saturating_sub(self.total_region_allocated_bytes)
            / MIN_ALLOCATION_BYTES
            * MIN_ALLOCATION_BYTES;
        if rounded > available {
            return Ok(false);
        }
        let mut curr = self.curr_region_allocation_bytes;
        let increased = rounded > curr;
        while rounded > curr {
            curr = curr.max(MIN_ALLOCATION_BYTES).saturating_mul(2);
        }
        let bytes = curr.min(available);
        let base = self
            .pending_region_bases
            .pop_front()
            .unwrap_or(self.next_default_base);
        let idx = self.regions.partition_point(|r| r.base < base);
        let end = base.checked_add(bytes);
        let clash_prev = idx
            .checked_sub(1)
            .and_then(|i| self.regions.get(i))
            .is_some_and(|p| p.base + p.size_bytes > base);
        let clash_next = self
            .regions
            .get(idx)
            .is_some_and(|n| end.is_none_or(|e| e > n.base));
        let Some(end) = end.filter(|_| !clash_prev && !clash_next) else {
            return Err(AllocError::Unsupported(format!(
                "bfc: a region of {bytes} B at {base:#x} overlaps an existing region"
            )));
        };
        self.curr_region_allocation_bytes = if increased {
            curr
        } else {
            curr.saturating_mul(2)
        };
        self.total_region_allocated_bytes += bytes;
        let h = self.new_handle(free_chunk(base, bytes, NONE));
        self.free.insert(&self.chunks, bytes, base, h);
        self.regions.insert(
            idx,
            Region {
                base,
                size_bytes: bytes,
                first: h,
            },
        );
        self.note_base(base);
        self.next_default_base = self.next_default_base.max(end);
        self.region_changes += 1;
        Ok(true)
    }

    /// `DeallocateFreeRegions`: with garbage collection on, releases every region that holds no
    /// in-use chunk, if that makes room for `rounded` under the limit.
    pub(super) fn deallocate_free_regions(&mut self, rounded: u64) -> Result<bool, Broken> {
        if !self.opts.garbage_collection {
            return Ok(false);
        }
        // No two free chunks are adjacent and chunks never span regions, so a region without
        // in-use chunks is exactly one free chunk.
        let is_free = |bfc: &Self, r: &Region| {
            bfc.chunks
                .get(r.first as usize)
                .is_some_and(|c| !c.in_use() && c.size_bytes == r.size_bytes)
        };
        let total_free: u64 = self
            .regions
            .iter()
            .filter(|r| is_free(self, r))
            .map(|r| r.size_bytes)
            .sum();
        if total_free == 0 {
            return Ok(false);
        }
        let available = self
            .opts
            .limit_bytes
            .saturating_sub(self.total_region_allocated_bytes)
            + total_free;
        if rounded > available {
            return Ok(false);
        }
        let regions = std::mem::take(&mut self.regions);
        let mut kept = Vec::with_capacity(regions.len());
        for r in regions {
            if is_free(self, &r) {
                self.free.remove(r.size_bytes, r.base);
                self.delete_handle(r.first);
                self.total_region_allocated_bytes -= r.size_bytes;
                self.region_changes += 1;
            } else {
                kept.push(r);
            }
        }
        self.regions = kept;
        Ok(true)
    }
}
