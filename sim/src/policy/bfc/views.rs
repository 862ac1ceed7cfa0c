//! What a BFC allocator shows of itself: its regions, chunks and bins, as the explorers and
//! `stats` draw them.

use super::*;

impl Bfc {
    /// Regions in address order.
    #[must_use]
    pub fn regions(&self) -> Vec<RegionInfo> {
        self.regions
            .iter()
            .map(|r| RegionInfo {
                base: r.base,
                size_bytes: r.size_bytes,
            })
            .collect()
    }

    /// Every chunk in address order.
    #[must_use]
    pub fn chunks(&self) -> Vec<ChunkInfo> {
        let mut out = Vec::with_capacity(self.chunks.len());
        for (region, r) in self.regions.iter().enumerate() {
            let mut h = r.first;
            while let Some(c) = self.chunks.get(h as usize) {
                out.push(ChunkInfo {
                    addr: c.addr,
                    size_bytes: c.size_bytes,
                    in_use: c.in_use(),
                    requested_bytes: c.requested_bytes,
                    allocation_id: c.in_use().then_some(c.allocation_id),
                    request_id: c.request_id,
                    bin: bin_num_for_size(c.size_bytes),
                    region,
                    handle: h,
                    next_handle: (c.next != NONE).then_some(c.next),
                });
                h = c.next;
            }
        }
        out
    }

    /// The 21 bins with their free chunks and TF's per-bin debug counters.
    #[must_use]
    pub fn bins(&self) -> Vec<BinInfo> {
        let mut blocks = Vec::new();
        self.blocks_impl(&mut blocks);
        bins_of(&blocks)
    }

    /// Size of the largest free chunk (TF's `LargestFreeChunk`).
    #[must_use]
    pub fn largest_free_chunk_bytes(&self) -> u64 {
        self.free.largest()
    }

    /// The in-use chunk that starts at `addr`.
    #[must_use]
    pub fn chunk_at(&self, addr: Addr) -> Option<ChunkInfo> {
        let h = *self.in_use_by_addr.get(&addr)?;
        let c = self.chunks.get(h as usize)?;
        let region = self
            .regions
            .partition_point(|r| r.base <= addr)
            .checked_sub(1)?;
        Some(ChunkInfo {
            addr: c.addr,
            size_bytes: c.size_bytes,
            in_use: true,
            requested_bytes: c.requested_bytes,
            allocation_id: Some(c.allocation_id),
            request_id: c.request_id,
            bin: bin_num_for_size(c.size_bytes),
            region,
            handle: h,
            next_handle: (c.next != NONE).then_some(c.next),
        })
    }

    pub(super) fn blocks_impl(&self, out: &mut Vec<Block>) {
        for r in &self.regions {
            let mut h = r.first;
            while let Some(c) = self.chunks.get(h as usize) {
                let state = if c.in_use() {
                    BlockState::Used {
                        id: c.request_id,
                        requested_bytes: c.requested_bytes,
                    }
                } else {
                    BlockState::Free
                };
                out.push(Block {
                    addr: c.addr,
                    len_bytes: c.size_bytes,
                    state,
                });
                h = c.next;
            }
        }
    }
}

/// The 21 bins of a BFC chunk list (its blocks, as [`Policy::blocks`] lists them): every chunk
/// counted in the bin of its size, in use or free, and each bin's free chunks in search order.
/// A chunk list rebuilt by the layout index gives the same bins as the policy.
#[must_use]
pub fn bins_of(blocks: &[Block]) -> Vec<BinInfo> {
    let mut sink = BinsSink::default();
    for b in blocks {
        sink.add(b);
    }
    sink.finish()
}

/// [`bins_of`] block by block: a layout index passes its chunk list to it without listing it
/// ([`crate::layout::BlockSink`]); the halves of a two-thread pass are [`Self::merge`]d.
#[derive(Default)]
pub struct BinsSink {
    /// `(total_chunks, total_bytes, chunks_in_use, bytes_in_use, requested_bytes_in_use)` by
    /// bin.
    counts: [(u64, u64, u64, u64, u64); NUM_BINS],
    /// The free chunks, `(size, addr)`.
    free: Vec<(u64, Addr)>,
}

impl BinsSink {
    pub(super) fn add(&mut self, b: &Block) {
        let Some(c) = self.counts.get_mut(bin_num_for_size(b.len_bytes)) else {
            return;
        };
        c.0 += 1;
        c.1 += b.len_bytes;
        match b.state {
            BlockState::Used {
                requested_bytes, ..
            } => {
                c.2 += 1;
                c.3 += b.len_bytes;
                c.4 += requested_bytes;
            }
            BlockState::Free => self.free.push((b.len_bytes, b.addr)),
            // BFC lists none: every chunk is in use or free.
            BlockState::Dead => {}
        }
    }

    /// Adds the blocks `other` saw.
    #[must_use]
    pub fn merge(mut self, other: Self) -> Self {
        for (c, o) in self.counts.iter_mut().zip(other.counts) {
            *c = (c.0 + o.0, c.1 + o.1, c.2 + o.2, c.3 + o.3, c.4 + o.4);
        }
        self.free.extend(other.free);
        self
    }

    /// The bins, each bin's free chunks in search order (size, then address).
    #[must_use]
    pub fn finish(mut self) -> Vec<BinInfo> {
        let mut bins: Vec<BinInfo> = self
            .counts
            .iter()
            .enumerate()
            .map(|(b, c)| BinInfo {
                bin_size_bytes: bin_size_bytes(b),
                total_chunks: c.0,
                total_bytes: c.1,
                chunks_in_use: c.2,
                bytes_in_use: c.3,
                requested_bytes_in_use: c.4,
                ..BinInfo::default()
            })
            .collect();
        self.free.sort_unstable();
        for (size, addr) in self.free {
            if let Some(bin) = bins.get_mut(bin_num_for_size(size)) {
                bin.free_chunks.push((addr, size));
            }
        }
        bins
    }
}

impl crate::layout::BlockSink for BinsSink {
    #[inline]
    fn block(&mut self, b: Block) {
        self.add(&b);
    }
}
