//! The heap of each policy at the cursor: found by the replay's layout index where it has one,
//! else by a checkpoint replay, and rasterised once per window and size.

use std::sync::Mutex;

use allocview_sim::policy::{Block, Counters};

use super::heapmap::{self, HeapMap};
use super::state::{AppState, Mode};

/// The heap of one policy at the cursor, cached so idle frames cost nothing.
pub struct HeapAt {
    pub event: usize,
    pub blocks: Vec<Block>,
    pub counters: Counters,
    pub bins: Option<Vec<allocview_sim::policy::bfc::BinInfo>>,
    /// Sum of the block lengths.
    pub held_bytes: u64,
    /// The last rasterisation and its (start, len, cells): a heap of a million blocks takes
    /// milliseconds to rasterise, too long to repeat every frame.
    raster: Mutex<Option<(RasterKey, HeapMap)>>,
}

/// A rasterisation's window start, window length (bytes) and number of cells.
type RasterKey = (u64, u64, usize);

impl Clone for HeapAt {
    fn clone(&self) -> Self {
        Self::new(
            self.event,
            self.blocks.clone(),
            self.counters,
            self.bins.clone(),
            Some(self.held_bytes),
        )
    }
}

impl HeapAt {
    /// `held_bytes`: the sum of the block lengths, when the caller knows it.
    #[must_use]
    pub fn new(
        event: usize,
        blocks: Vec<Block>,
        counters: Counters,
        bins: Option<Vec<allocview_sim::policy::bfc::BinInfo>>,
        held_bytes: Option<u64>,
    ) -> Self {
        let held_bytes = held_bytes.unwrap_or_else(|| blocks.iter().map(|b| b.len_bytes).sum());
        Self {
            event,
            blocks,
            counters,
            bins,
            held_bytes,
            raster: Mutex::new(None),
        }
    }

    /// [`heapmap::rasterise_held`] of the blocks, from the cache when the window and size
    /// are the last ones asked for.
    #[must_use]
    pub fn raster(&self, start: u64, len: u64, n_cells: usize) -> HeapMap {
        let key = (start, len, n_cells);
        let mut cache = match self.raster.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some((k, map)) = cache.as_ref()
            && *k == key
        {
            return map.clone();
        }
        let map = heapmap::rasterise_held(&self.blocks, self.held_bytes, start, len, n_cells);
        *cache = Some((key, map.clone()));
        map
    }
}

impl AppState {
    /// Recomputes the cached heaps that are stale (selected policy, or all in compare mode).
    pub fn refresh_heaps(&mut self) {
        let Some(data) = self.data.clone() else {
            return;
        };
        let view = data.view();
        for (i, slot) in self.policies.iter().enumerate() {
            let wanted = self.mode == Mode::Compare || i == self.selected;
            let Some(replay) = slot.replay() else {
                continue;
            };
            let fresh = self
                .heaps
                .get(i)
                .and_then(Option::as_ref)
                .is_some_and(|h| h.event == self.cursor);
            if !wanted || fresh {
                continue;
            }
            // The layout index answers without replaying (a PyTorch snapshot's million live
            // blocks would take seconds from a checkpoint). The old list's buffer is reused:
            // it can hold millions of blocks.
            let mut blocks = self
                .heaps
                .get_mut(i)
                .and_then(Option::take)
                .map(|h| h.blocks)
                .unwrap_or_default();
            if let Some(counters) = replay.blocks_at(self.cursor, &mut blocks) {
                if let Some(h) = self.heaps.get_mut(i) {
                    // The blocks tile the held ranges, whose sum is the footprint.
                    let held = Some(counters.footprint_bytes);
                    *h = Some(HeapAt::new(self.cursor, blocks, counters, None, held));
                }
                continue;
            }
            let heap = match replay.state_at(&view, self.cursor) {
                Ok((policy, counters)) => {
                    blocks.clear();
                    policy.blocks(&mut blocks);
                    let bins = policy
                        .as_any()
                        .downcast_ref::<allocview_sim::policy::bfc::Bfc>()
                        .map(allocview_sim::policy::bfc::Bfc::bins);
                    Some(HeapAt::new(self.cursor, blocks, counters, bins, None))
                }
                Err(e) => {
                    self.message = Some(format!("{}: {e}", slot.name));
                    None
                }
            };
            if let Some(h) = self.heaps.get_mut(i) {
                *h = heap;
            }
        }
    }
}
