//! BFC's full self-check ([`Policy::check_invariants`]): every chunk list, bin and counter
//! against the others; slow, for tests.

use super::*;

impl Bfc {
    pub(super) fn check(&self) -> Result<(), String> {
        let mut seen = vec![false; self.chunks.len()];
        let mut region_total: u64 = 0;
        let mut free_list = Vec::new();
        let mut in_use_count = 0usize;
        let mut in_use_bytes: u64 = 0;
        let mut requested: u64 = 0;
        let mut prev_end: Option<Addr> = None;
        for (i, r) in self.regions.iter().enumerate() {
            if prev_end.is_some_and(|e| e > r.base) {
                return Err(format!(
                    "region {i} at {:#x} overlaps its predecessor",
                    r.base
                ));
            }
            prev_end = Some(r.base + r.size_bytes);
            region_total += r.size_bytes;
            let mut h = r.first;
            let mut prev = NONE;
            let mut cursor = r.base;
            let mut prev_free = false;
            while h != NONE {
                let c = self
                    .chunks
                    .get(h as usize)
                    .ok_or_else(|| format!("region {i}: dangling handle {h}"))?;
                match seen.get_mut(h as usize) {
                    Some(s) if !*s => *s = true,
                    _ => return Err(format!("chunk handle {h} reached twice")),
                }
                if c.prev != prev {
                    return Err(format!("chunk {h} at {:#x}: bad prev link", c.addr));
                }
                if c.addr != cursor {
                    return Err(format!(
                        "chunk {h} at {:#x}, expected {cursor:#x}: region {i} not tiled",
                        c.addr
                    ));
                }
                if c.size_bytes == 0 || !c.size_bytes.is_multiple_of(MIN_ALLOCATION_BYTES) {
                    return Err(format!("chunk {h} has size {}", c.size_bytes));
                }
                if c.in_use() {
                    if self.in_use_by_addr.get(&c.addr) != Some(&h) {
                        return Err(format!("in-use chunk {h} missing from the address map"));
                    }
                    if c.requested_bytes > c.size_bytes {
                        return Err(format!("chunk {h}: request larger than chunk"));
                    }
                    in_use_count += 1;
                    in_use_bytes += c.size_bytes;
                    requested += c.requested_bytes;
                    prev_free = false;
                } else {
                    if prev_free {
                        return Err(format!("two adjacent free chunks at {:#x}", c.addr));
                    }
                    free_list.push((h, c.size_bytes, c.addr));
                    prev_free = true;
                }
                cursor += c.size_bytes;
                prev = h;
                h = c.next;
            }
            if cursor != r.base + r.size_bytes {
                return Err(format!("region {i}: chunks end at {cursor:#x}"));
            }
        }
        self.free.check(&self.chunks, &free_list)?;
        if in_use_count != self.in_use_by_addr.len() {
            return Err("address map holds chunks not in any region".into());
        }
        let mut h = self.unused_head;
        while h != NONE {
            match seen.get_mut(h as usize) {
                Some(s) if !*s => *s = true,
                _ => return Err(format!("unused handle {h} is bad or reached twice")),
            }
            h = self.chunks.get(h as usize).map_or(NONE, |c| c.next);
        }
        if seen.iter().any(|s| !s) {
            return Err("a chunk handle is neither in a region nor unused".into());
        }
        let s = &self.stats;
        if region_total != self.total_region_allocated_bytes {
            return Err(format!(
                "regions hold {region_total} B, total_region_allocated_bytes {}",
                self.total_region_allocated_bytes
            ));
        }
        if region_total > self.opts.limit_bytes {
            return Err("regions exceed the memory limit".into());
        }
        if in_use_bytes != s.bytes_in_use || requested != self.live_bytes {
            return Err(format!(
                "in use {in_use_bytes} B / requested {requested} B, counters say {} / {}",
                s.bytes_in_use, self.live_bytes
            ));
        }
        if s.peak_bytes_in_use < s.bytes_in_use {
            return Err("peak_bytes_in_use below bytes_in_use".into());
        }
        let mut blocks = Vec::new();
        self.blocks_impl(&mut blocks);
        let expect = Counters::from_blocks(&blocks, self.total_region_allocated_bytes);
        if expect != self.counters_impl() {
            return Err(format!(
                "counters {:?} disagree with blocks {expect:?}",
                self.counters_impl()
            ));
        }
        Ok(())
    }
}
