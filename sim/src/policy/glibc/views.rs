//! What the glibc model shows of itself: its counters, its block list, and the size of a
//! copy of it.

use super::*;

impl Glibc {
    pub(super) fn largest_free(&self) -> u64 {
        let binned = self
            .free_by_size
            .last_key_value()
            .map_or(0, |(&k, _)| (k >> 64) as u64);
        let tcached = match self.tcache_mask {
            0 => 0,
            m => MIN_CHUNK_BYTES + u64::from(63 - m.leading_zeros()) * ALIGN_BYTES,
        };
        let fast = match self.fast_mask {
            0 => 0,
            m => MIN_CHUNK_BYTES + u64::from(7 - m.leading_zeros()) * ALIGN_BYTES,
        };
        binned.max(self.top_bytes).max(tcached).max(fast)
    }

    pub(super) fn counters_impl(&self) -> Counters {
        let footprint = self.heap_bytes + self.mmapped_bytes;
        let free_blocks =
            self.free_by_size.len() as u64 + self.cached_chunks + u64::from(self.top_bytes > 0);
        let free_bytes: u64 = self.heap_bytes - self.heap_used_bytes();
        Counters {
            live_allocs: self.live_heap.len() as u64 + self.mapped.len() as u64,
            live_bytes: self.live_bytes,
            allocated_bytes: self.allocated_bytes,
            footprint_bytes: footprint,
            free_bytes,
            free_blocks,
            largest_free_bytes: self.largest_free(),
        }
    }

    /// Heap bytes held by live chunks and the tcache struct.
    pub(super) fn heap_used_bytes(&self) -> u64 {
        let meta = if self.tcache_ready {
            chunk_size(TCACHE_STRUCT_BYTES)
        } else {
            0
        };
        self.allocated_bytes - self.mmapped_bytes + meta
    }

    pub(super) fn blocks_impl(&self, out: &mut Vec<Block>) {
        let mut h = self.first_handle();
        while let Some(c) = self.chunks.get(h as usize) {
            let state = match c.state {
                State::Used => BlockState::Used {
                    id: c.request_id,
                    requested_bytes: c.requested_bytes,
                },
                State::Meta => BlockState::Dead,
                State::Free | State::Tcache | State::Fast => BlockState::Free,
            };
            out.push(Block {
                addr: c.addr,
                len_bytes: c.size_bytes,
                state,
            });
            h = c.next;
        }
        if self.top_bytes > 0 {
            out.push(Block {
                addr: self.top_addr,
                len_bytes: self.top_bytes,
                state: BlockState::Free,
            });
        }
        for (&addr, m) in &self.mapped {
            out.push(Block {
                addr,
                len_bytes: m.size_bytes,
                state: BlockState::Used {
                    id: m.request_id,
                    requested_bytes: m.requested_bytes,
                },
            });
        }
    }

    /// The heap's lowest chunk: walk back from the one below the top.
    pub(super) fn first_handle(&self) -> u32 {
        let mut h = self.last;
        while let Some(c) = self.chunks.get(h as usize) {
            if c.prev == NONE {
                return h;
            }
            h = c.prev;
        }
        NONE
    }

    /// What `clone_box` copies, for [`Policy::state_bytes`].
    pub(super) fn state_bytes_impl(&self) -> u64 {
        // What `clone_box` copies: the chunk table (with the slots of merged chunks, which it
        // keeps for reuse), the cache lists, the free set, the address map shrunk to its
        // entries and the mmapped chunks. The default (64 bytes a block) left out the table's
        // unused slots, which stay after the heap's busiest moment.
        use std::mem::size_of;
        let listed: usize = self.tcache.iter().chain(&self.fastbins).map(Vec::len).sum();
        let bytes = self.chunks.len() * size_of::<Chunk>()
            + (self.tcache.len() + self.fastbins.len()) * size_of::<Vec<u32>>()
            + listed * size_of::<u32>()
            + self.free_by_size.len()
                * (size_of::<(u128, u32)>() + crate::policy::BTREE_ENTRY_OVERHEAD_BYTES)
            + self.live_heap.shrunk_bytes()
            + self.mapped.len()
                * (size_of::<(Addr, Mapped)>() + crate::policy::BTREE_ENTRY_OVERHEAD_BYTES)
            + size_of::<Self>();
        bytes as u64
    }
}
