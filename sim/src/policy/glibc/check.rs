//! The glibc model's full self-check ([`Policy::check_invariants`]): the heap walk, the
//! caches, the unused handles and the mappings against each other and the counters; slow, for
//! tests.

use super::*;

/// What the walk of the heap's chunks found.
#[derive(Default)]
struct Walk {
    /// Handles reached (by the walk, then by the unused list).
    seen: Vec<bool>,
    used_bytes: u64,
    requested_bytes: u64,
    cached: u64,
}

impl Glibc {
    pub(super) fn check(&self) -> Result<(), String> {
        let mut walk = self.check_heap()?;
        let listed = self.check_bins()?;
        if listed != walk.cached || walk.cached != self.cached_chunks {
            return Err(format!(
                "{} cached chunks in the heap, {listed} in bins, counter {}",
                walk.cached, self.cached_chunks
            ));
        }
        self.check_unused(&mut walk.seen)?;
        let (mapped, mreq) = self.check_mapped()?;
        if mapped != self.mmapped_bytes
            || walk.used_bytes + mapped != self.allocated_bytes
            || walk.requested_bytes + mreq != self.live_bytes
        {
            return Err(format!(
                "totals: mapped {mapped}/{}, allocated {}/{}, live {}/{}",
                self.mmapped_bytes,
                walk.used_bytes + mapped,
                self.allocated_bytes,
                walk.requested_bytes + mreq,
                self.live_bytes
            ));
        }
        let mut blocks = Vec::new();
        self.blocks_impl(&mut blocks);
        let expect = Counters::from_blocks(&blocks, self.heap_bytes + self.mmapped_bytes);
        if expect != self.counters_impl() {
            return Err(format!(
                "counters {:?} disagree with blocks {expect:?}",
                self.counters_impl()
            ));
        }
        Ok(())
    }

    /// Walks the chunks from the heap's base: they tile it up to the top, free ones are
    /// coalesced and binned, live ones mapped.
    fn check_heap(&self) -> Result<Walk, String> {
        let base = self.opts.heap_base;
        if !self.heap_bytes.is_multiple_of(PAGE_BYTES) {
            return Err(format!("heap of {} B is not whole pages", self.heap_bytes));
        }
        let mut walk = Walk {
            seen: vec![false; self.chunks.len()],
            ..Walk::default()
        };
        let mut cursor = base;
        let mut prev = NONE;
        let mut h = self.first_handle();
        let (mut free, mut live, mut meta) = (0usize, 0usize, 0usize);
        let mut prev_free = false;
        while h != NONE {
            let c = self
                .chunks
                .get(h as usize)
                .ok_or_else(|| format!("dangling handle {h}"))?;
            match walk.seen.get_mut(h as usize) {
                Some(s) if !*s => *s = true,
                _ => return Err(format!("handle {h} reached twice")),
            }
            if c.addr != cursor || c.prev != prev {
                return Err(format!("chunk {h} at {:#x}: heap not tiled", c.addr));
            }
            if c.size_bytes < MIN_CHUNK_BYTES || !c.size_bytes.is_multiple_of(ALIGN_BYTES) {
                return Err(format!("chunk {h} has size {}", c.size_bytes));
            }
            let is_free = c.state == State::Free;
            if is_free && (prev_free || c.next == NONE) {
                return Err(format!("free chunk at {:#x} not coalesced", c.addr));
            }
            match c.state {
                State::Used => {
                    if self.live_heap.get(&c.addr) != Some(&h) {
                        return Err(format!("live chunk at {:#x} not in the map", c.addr));
                    }
                    if chunk_size(c.requested_bytes) > c.size_bytes {
                        return Err(format!("chunk at {:#x} smaller than its request", c.addr));
                    }
                    walk.used_bytes += c.size_bytes;
                    walk.requested_bytes += c.requested_bytes;
                    live += 1;
                }
                State::Tcache | State::Fast => walk.cached += 1,
                State::Free => {
                    if self.free_by_size.get(&free_key(c.size_bytes, c.addr)) != Some(&h) {
                        return Err(format!("free chunk at {:#x} not binned", c.addr));
                    }
                    free += 1;
                }
                State::Meta => meta += 1,
            }
            prev_free = is_free;
            cursor += c.size_bytes;
            prev = h;
            h = c.next;
        }
        if prev != self.last {
            return Err("`last` is not the chunk below the top".into());
        }
        if cursor != self.top_addr || self.top_addr + self.top_bytes != base + self.heap_bytes {
            return Err(format!(
                "chunks end at {cursor:#x}, top {:#x} + {} B, heap end {:#x}",
                self.top_addr,
                self.top_bytes,
                base + self.heap_bytes
            ));
        }
        if meta != usize::from(self.tcache_ready) {
            return Err(format!("{meta} tcache structs in the heap"));
        }
        if free != self.free_by_size.len() || live != self.live_heap.len() {
            return Err("free set or live map holds chunks not in the heap".into());
        }
        Ok(walk)
    }

    /// Checks the tcache and the fastbins against their masks and their chunks' states and
    /// sizes; returns how many chunks they list.
    fn check_bins(&self) -> Result<u64, String> {
        let mut listed = 0u64;
        for (i, bin) in self.tcache.iter().enumerate() {
            if bin.len() > self.opts.tcache_count {
                return Err(format!("tcache bin {i} holds {} chunks", bin.len()));
            }
            if (self.tcache_mask >> i & 1 == 1) == bin.is_empty() {
                return Err(format!("tcache mask wrong for bin {i}"));
            }
            for &t in bin {
                let ok = self.chunks.get(t as usize).is_some_and(|c| {
                    c.state == State::Tcache && tcache_index(c.size_bytes) == Some(i)
                });
                if !ok {
                    return Err(format!("tcache bin {i} holds a wrong chunk"));
                }
                listed += 1;
            }
        }
        for (i, bin) in self.fastbins.iter().enumerate() {
            if (self.fast_mask >> i & 1 == 1) == bin.is_empty() {
                return Err(format!("fastbin mask wrong for bin {i}"));
            }
            for &f in bin {
                let ok = self.chunks.get(f as usize).is_some_and(|c| {
                    c.state == State::Fast && fastbin_index(c.size_bytes) == Some(i)
                });
                if !ok {
                    return Err(format!("fastbin {i} holds a wrong chunk"));
                }
                listed += 1;
            }
        }
        Ok(listed)
    }

    /// Every handle the heap walk did not reach is on the unused list, once.
    fn check_unused(&self, seen: &mut [bool]) -> Result<(), String> {
        let mut u = self.unused_head;
        while u != NONE {
            match seen.get_mut(u as usize) {
                Some(s) if !*s => *s = true,
                _ => return Err(format!("unused handle {u} bad or reached twice")),
            }
            u = self.chunks.get(u as usize).map_or(NONE, |c| c.next);
        }
        if seen.iter().any(|s| !s) {
            return Err("a handle is neither in the heap nor unused".into());
        }
        Ok(())
    }

    /// The mappings are page-aligned, apart and clear of the heap; returns their bytes and
    /// their requests' bytes.
    fn check_mapped(&self) -> Result<(u64, u64), String> {
        let mut end = self.opts.mmap_base;
        let (mut mapped, mut mreq) = (0u64, 0u64);
        for (&a, m) in &self.mapped {
            if a < end || !a.is_multiple_of(PAGE_BYTES) || !m.size_bytes.is_multiple_of(PAGE_BYTES)
            {
                return Err(format!("mapping at {a:#x} overlaps or is unaligned"));
            }
            end = a + m.size_bytes;
            mapped += m.size_bytes;
            mreq += m.requested_bytes;
        }
        if end > self.opts.mmap_base && self.opts.heap_base + self.heap_bytes > self.opts.mmap_base
        {
            return Err("heap runs into the mmap area".into());
        }
        Ok((mapped, mreq))
    }
}
