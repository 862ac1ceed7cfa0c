//! The heap of each policy at the cursor ([`HeapAt`]), kept up to date as the cursor moves:
//! found by the replay's layout index where it has one, else by a checkpoint replay.

use super::heap_at::{Blocks, HeapAt};
use super::state::{AppState, Mode};

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
    use std::collections::HashSet;
    use std::path::Path;
    use std::sync::Arc;

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
    use std::sync::Arc;

    use allocview_sim::policy::config::PolicyConfig;
    use allocview_sim::policy::spec::PolicySpec;

    use super::*;
    use crate::model::heapmap;
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
