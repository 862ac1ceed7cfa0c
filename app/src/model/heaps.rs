//! The heap of each policy at the cursor: found by the replay's layout index where it has one,
//! else by a checkpoint replay, and rasterised once per window and size.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use allocview_sim::heap::{Block, Counters};
use allocview_sim::replay::Replay;

use super::heapmap::{self, HeapMap, SelectedCells};
use super::state::{AppState, Mode};

/// The heap of one policy at the cursor, cached so idle frames cost nothing.
pub struct HeapAt {
    pub event: usize,
    pub counters: Counters,
    pub bins: Option<Vec<allocview_sim::policy::bfc::BinInfo>>,
    /// Sum of the block lengths.
    pub held_bytes: u64,
    blocks: Blocks,
    /// The last rasterisation and its (start, len, cells): a heap of a million blocks takes
    /// milliseconds to rasterise, too long to repeat every frame.
    raster: Mutex<Option<(RasterKey, HeapMap)>>,
}

/// Where a heap's blocks come from.
#[derive(Clone)]
enum Blocks {
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

    fn cached_raster(&self) -> Option<(RasterKey, HeapMap)> {
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
    fn next_key(&self, replay: &Replay, event: usize) -> Option<RasterKey> {
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
            // blocks would take seconds from a checkpoint), rasterised in the same pass for
            // the window the previous heap was drawn in.
            let old = self.heaps.get_mut(i).and_then(Option::take);
            let key = old.as_ref().and_then(|h| h.next_key(replay, self.cursor));
            if let Some(mut h) = HeapAt::indexed(replay, self.cursor, key) {
                if slot.spec.name == "bfc" {
                    // The bins view: from the chunks the index lays out, never listed.
                    use allocview_sim::policy::bfc::BinsSink;
                    let mut first = BinsSink::default();
                    h.bins = replay
                        .fold_blocks_at(self.cursor, &mut first, |_| BinsSink::default())
                        .map(|(second, _)| match second {
                            Some(second) => first.merge(second).finish(),
                            None => first.finish(),
                        });
                }
                if let Some(cell) = self.heaps.get_mut(i) {
                    *cell = Some(h);
                }
                continue;
            }
            // The old list's buffer is reused: it can hold millions of blocks.
            let mut blocks = match old.map(|h| h.blocks) {
                Some(Blocks::Listed(b)) => b,
                _ => Vec::new(),
            };
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use allocview_sim::heap::BlockState;
    use allocview_sim::policy::config::PolicyConfig;
    use allocview_sim::policy::spec::PolicySpec;

    use super::*;
    use crate::model::workers::load_blocking;

    /// A heap laid out by the index, never listed, rasterises, marks and answers hover exactly
    /// as the list the index gives, at events over a real snapshot, whole and zoomed.
    #[test]
    fn an_indexed_heap_draws_as_its_block_list() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../sample-traces/pytorch/lm_train_step_b.pickle");
        let mut s = AppState::new(
            &path,
            &[PolicySpec::plain("pytorch")],
            PolicyConfig::default(),
        );
        load_blocking(&mut s, false, 1).unwrap();
        let replay = Arc::clone(s.policies[0].replay().unwrap());
        let n = s.events();
        for event in [0, n / 7, n / 2, n - 1] {
            let mut blocks = Vec::new();
            let counters = replay.blocks_at(event, &mut blocks).unwrap();
            let listed = HeapAt::new(event, blocks.clone(), counters, None, None);
            let indexed = HeapAt::indexed(&replay, event, None).unwrap();
            assert_eq!(indexed.counters, counters);
            assert_eq!(indexed.held_bytes, listed.held_bytes);
            let held = listed.held_bytes;
            // Every third live allocation selected.
            let ids: HashSet<u32> = blocks
                .iter()
                .filter_map(|b| match b.state {
                    BlockState::Used { id, .. } => Some(id),
                    _ => None,
                })
                .step_by(3)
                .collect();
            for (start, len, cells) in [
                (0, held, 4000),
                (held / 3, held / 50, 1000),
                (held - 7, 7, 3),
            ] {
                let mut want = listed.raster(start, len, cells);
                let mut got = indexed.raster(start, len, cells);
                assert_eq!(got, want, "event {event}, window ({start}, {len}, {cells})");
                // Made in the seek's pass, for the previous heap's window.
                let again = HeapAt::indexed(&replay, event, Some((start, len, cells))).unwrap();
                assert_eq!(again.cached_raster().unwrap().1, want);
                listed.mark_selected(&mut want, start, &ids);
                indexed.mark_selected(&mut got, start, &ids);
                assert_eq!(got, want, "marks at event {event}");
            }
            for offset in [0, held / 5, held / 2, held - 1, held] {
                assert_eq!(
                    indexed.block_at_offset(offset),
                    listed.block_at_offset(offset),
                    "event {event}, offset {offset}"
                );
            }
            assert!(listed.block_at_offset(held / 2).is_some());
        }
    }
}

#[cfg(test)]
mod next_window_tests {
    use std::path::Path;

    use allocview_sim::policy::config::PolicyConfig;
    use allocview_sim::policy::spec::PolicySpec;

    use super::*;
    use crate::model::workers::load_blocking;

    /// A whole-heap picture is followed by the whole of the next heap, drawn in the seek's own
    /// pass, though the footprint changed between the two events (`pytorch` on a malloc trace
    /// grows its segments; a snapshot's are all there from the start).
    #[test]
    fn the_whole_heap_stays_whole_across_a_footprint_change() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/python_json.avt");
        let mut s = AppState::new(
            &path,
            &[PolicySpec::plain("pytorch")],
            PolicyConfig::default(),
        );
        load_blocking(&mut s, false, 1).unwrap();
        let replay = Arc::clone(s.policies[0].replay().unwrap());
        let n = s.events();
        let first = HeapAt::indexed(&replay, 0, None).unwrap();
        let later = (1..n)
            .step_by(97)
            .find(|&e| replay.held_bytes_at(e) != Some(first.held_bytes))
            .expect("an event with another footprint");
        let _ = first.raster(0, first.held_bytes, 3000);
        let key = first.next_key(&replay, later);
        let next = HeapAt::indexed(&replay, later, key).unwrap();
        let (k, map) = next.cached_raster().unwrap();
        assert_eq!(k, (0, next.held_bytes, 3000));
        assert_eq!(map, next.raster(0, next.held_bytes, 3000));
        let mut blocks = Vec::new();
        replay.blocks_at(later, &mut blocks).unwrap();
        assert_eq!(map, heapmap::rasterise(&blocks, 3000));
    }
}
