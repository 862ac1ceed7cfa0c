//! The heap of one policy at one event ([`HeapAt`]): its blocks, listed or laid out by the
//! replay's layout index, and its last rasterisation, cached so idle frames cost nothing.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use allocview_sim::heap::{Block, Counters};
use allocview_sim::replay::Replay;

use super::heapmap::{self, HeapMap, SelectedCells};

/// The heap of one policy at the cursor, cached so idle frames cost nothing.
pub struct HeapAt {
    pub event: usize,
    pub counters: Counters,
    pub bins: Option<Vec<allocview_sim::policy::bfc::BinInfo>>,
    /// Sum of the block lengths.
    pub held_bytes: u64,
    pub(super) blocks: Blocks,
    /// The last rasterisation and its (start, len, cells): a heap of a million blocks takes
    /// milliseconds to rasterise, too long to repeat every frame.
    raster: Mutex<Option<(RasterKey, HeapMap)>>,
}

/// Where a heap's blocks come from.
#[derive(Clone)]
pub(super) enum Blocks {
    /// Listed, from a checkpoint replay.
    Listed(Vec<Block>),
    /// Laid out by the replay's layout index whenever they are needed, never listed: a
    /// PyTorch snapshot's heap can hold millions of blocks, and listing them took most of a
    /// seek.
    Indexed(Arc<Replay>),
}

/// A rasterisation's window start, window length (bytes) and number of cells.
type RasterKey = (u64, u64, usize);

impl Clone for HeapAt {
    fn clone(&self) -> Self {
        Self {
            event: self.event,
            counters: self.counters,
            bins: self.bins.clone(),
            held_bytes: self.held_bytes,
            blocks: self.blocks.clone(),
            raster: Mutex::new(self.cached_raster()),
        }
    }
}

impl HeapAt {
    /// A listed heap; `held_bytes`: the sum of the block lengths, when the caller knows it.
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
            counters,
            bins,
            held_bytes,
            blocks: Blocks::Listed(blocks),
            raster: Mutex::new(None),
        }
    }

    /// The heap of `replay` after `event` from its layout index, rasterised for `key` in the
    /// same pass when given (the window and size of the previous heap: a seek then walks the
    /// heap once); `None` when the replay has no index.
    #[must_use]
    pub fn indexed(replay: &Arc<Replay>, event: usize, key: Option<RasterKey>) -> Option<Self> {
        let (counters, raster) = match key {
            Some(key @ (start, len, n_cells)) => {
                let (map, counters) =
                    heapmap::rasterise_indexed(replay, event, start, len, n_cells)?;
                (counters, Some((key, map)))
            }
            None => (replay.fold_blocks_at(event, &mut (), |_| ())?.1, None),
        };
        Some(Self {
            event,
            counters,
            bins: None,
            // The blocks tile the held ranges, whose sum is the footprint.
            held_bytes: counters.footprint_bytes,
            blocks: Blocks::Indexed(Arc::clone(replay)),
            raster: Mutex::new(raster),
        })
    }

    pub(super) fn cached_raster(&self) -> Option<(RasterKey, HeapMap)> {
        match self.raster.lock() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
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
        let map = match &self.blocks {
            Blocks::Listed(blocks) => {
                heapmap::rasterise_held(blocks, self.held_bytes, start, len, n_cells)
            }
            Blocks::Indexed(replay) => {
                match heapmap::rasterise_indexed(replay, self.event, start, len, n_cells) {
                    Some((map, _)) => map,
                    // The index answered for this event when the heap was made.
                    None => heapmap::rasterise_held(&[], 0, start, len, n_cells),
                }
            }
        };
        *cache = Some((key, map.clone()));
        map
    }

    /// The window to rasterise the heap after `event` for, in the seek's own pass: this heap's
    /// last one or, when that showed the whole heap (the explorers' default), the whole of the
    /// next one, whose held bytes (the footprint) differ from event to event.
    pub(super) fn next_key(&self, replay: &Replay, event: usize) -> Option<RasterKey> {
        let (start, len, n_cells) = self.cached_raster()?.0;
        if start == 0 && len == self.held_bytes {
            return Some((0, replay.held_bytes_at(event)?, n_cells));
        }
        Some((start, len, n_cells))
    }

    /// [`heapmap::mark_selected`]: the cells of `map` (window from `start`) holding a block of
    /// the allocations `ids`.
    pub fn mark_selected(&self, map: &mut HeapMap, start: u64, ids: &HashSet<u32>) {
        if ids.is_empty() {
            return;
        }
        match &self.blocks {
            Blocks::Listed(blocks) => heapmap::mark_selected(map, blocks, start, ids),
            Blocks::Indexed(replay) => {
                let per = map.bytes_per_cell;
                let mut first = SelectedCells::new(0, start, per, ids);
                let made = replay.fold_blocks_at(self.event, &mut first, |from| {
                    SelectedCells::new(from, start, per, ids)
                });
                first.mark(map);
                if let Some((Some(second), _)) = made {
                    second.mark(map);
                }
            }
        }
    }

    /// The block holding byte `offset` of the held space (blocks laid end to end).
    #[must_use]
    pub fn block_at_offset(&self, offset: u64) -> Option<Block> {
        match &self.blocks {
            Blocks::Listed(blocks) => {
                heapmap::block_at_offset(blocks, offset).and_then(|i| blocks.get(i).copied())
            }
            Blocks::Indexed(replay) => replay.block_at_offset(self.event, offset),
        }
    }
}
