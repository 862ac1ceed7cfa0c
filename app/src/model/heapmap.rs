//! The heap map: a policy's address space at one event, rasterised into cells.
//!
//! Blocks are laid end to end in address order and gaps between them (address space the policy
//! does not hold, e.g. between glibc's heap and its mmapped chunks) are skipped, so the map's
//! length is what the policy holds. Each cell shows what covers most of its bytes.

use allocview_sim::policy::{Block, BlockState};
use allocview_sim::trace::size_class;

/// What a cell of the heap map shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CellKind {
    /// Past the end of the held space (the map is longer than the footprint).
    Empty,
    /// Free and reusable.
    Free,
    /// Held but neither live nor reusable (a bump pool's dead bytes).
    Dead,
    /// Reserved for a live allocation beyond what it asked for.
    Waste,
    /// Requested bytes of a live allocation, by the size class of its request.
    Used { class: u8 },
    /// A live allocation of the site selected in the sites panel.
    Selected,
}

/// A rasterised heap map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapMap {
    pub cells: Vec<CellKind>,
    /// Bytes each cell stands for.
    pub bytes_per_cell: u64,
    /// Sum of the block lengths (the held address space).
    pub held_bytes: u64,
}

/// Rasterises `blocks` (address order) into `n_cells` cells.
#[must_use]
pub fn rasterise(blocks: &[Block], n_cells: usize) -> HeapMap {
    let held: u64 = blocks.iter().map(|b| b.len_bytes).sum();
    rasterise_window(blocks, 0, held, n_cells)
}

/// Marks the cells of `map` (rasterised from `blocks`, window starting at `start`) that hold
/// a block of one of the allocations `ids` as [`CellKind::Selected`].
pub fn mark_selected(
    map: &mut HeapMap,
    blocks: &[Block],
    start: u64,
    ids: &std::collections::HashSet<u32>,
) {
    if ids.is_empty() {
        return;
    }
    let per = map.bytes_per_cell.max(1);
    let mut pos = 0u64;
    for b in blocks {
        if let BlockState::Used { id, .. } = b.state
            && ids.contains(&id)
            && pos + b.len_bytes > start
        {
            let first = pos.saturating_sub(start) / per;
            let last = (pos + b.len_bytes - 1).saturating_sub(start) / per;
            for c in first..=last {
                match usize::try_from(c).ok().and_then(|c| map.cells.get_mut(c)) {
                    Some(cell) => *cell = CellKind::Selected,
                    None => break,
                }
            }
        }
        pos += b.len_bytes;
    }
}

/// Where byte `offset` of the held space (blocks end to end) falls: the block's index.
#[must_use]
pub fn block_at_offset(blocks: &[Block], offset: u64) -> Option<usize> {
    let mut pos = 0u64;
    for (i, b) in blocks.iter().enumerate() {
        if offset < pos + b.len_bytes {
            return Some(i);
        }
        pos += b.len_bytes;
    }
    None
}

/// Rasterises the window `[start, start + len)` of the held space (blocks laid end to end)
/// into `n_cells` cells: zooming into a heap map shows more detail, not bigger cells.
#[must_use]
pub fn rasterise_window(blocks: &[Block], start: u64, len: u64, n_cells: usize) -> HeapMap {
    let held: u64 = blocks.iter().map(|b| b.len_bytes).sum();
    let n = n_cells.max(1) as u64;
    let bytes_per_cell = len.div_ceil(n).max(1);
    let window_end = start.saturating_add(len);
    // Per cell, bytes of each kind; a cell ends up as the kind with the most bytes.
    // Kinds tracked: free, dead, waste, and used per class (the largest class share wins).
    let mut free = vec![0u64; n_cells.max(1)];
    let mut dead = vec![0u64; n_cells.max(1)];
    let mut waste = vec![0u64; n_cells.max(1)];
    let mut used = vec![0u64; n_cells.max(1)];
    let mut used_class = vec![(0u8, 0u64); n_cells.max(1)];
    let mut pos: u64 = 0;
    let add = |from: u64, len: u64, f: &mut dyn FnMut(usize, u64)| {
        // Clip to the window, then work in window coordinates.
        let mut s = from.max(start);
        let end = (from + len).min(window_end);
        while s < end {
            let cell = (s - start) / bytes_per_cell;
            let cell_end = start + (cell + 1) * bytes_per_cell;
            let take = end.min(cell_end) - s;
            if let Ok(c) = usize::try_from(cell) {
                f(c, take);
            }
            s += take;
        }
    };
    for b in blocks {
        if pos >= window_end {
            break;
        }
        if pos + b.len_bytes <= start {
            pos += b.len_bytes;
            continue;
        }
        match b.state {
            BlockState::Free => add(pos, b.len_bytes, &mut |c, n| {
                if let Some(v) = free.get_mut(c) {
                    *v += n;
                }
            }),
            BlockState::Dead => add(pos, b.len_bytes, &mut |c, n| {
                if let Some(v) = dead.get_mut(c) {
                    *v += n;
                }
            }),
            BlockState::Used {
                requested_bytes, ..
            } => {
                let req = requested_bytes.min(b.len_bytes);
                let class = size_class(requested_bytes);
                add(pos, req, &mut |c, n| {
                    if let Some(v) = used.get_mut(c) {
                        *v += n;
                    }
                    if let Some(slot) = used_class.get_mut(c)
                        && n > slot.1
                    {
                        *slot = (class, n);
                    }
                });
                add(pos + req, b.len_bytes - req, &mut |c, n| {
                    if let Some(v) = waste.get_mut(c) {
                        *v += n;
                    }
                });
            }
        }
        pos += b.len_bytes;
    }
    let cells = (0..n_cells.max(1))
        .map(|c| {
            let f = free.get(c).copied().unwrap_or(0);
            let d = dead.get(c).copied().unwrap_or(0);
            let w = waste.get(c).copied().unwrap_or(0);
            let u = used.get(c).copied().unwrap_or(0);
            let best = f.max(d).max(w).max(u);
            if best == 0 {
                CellKind::Empty
            } else if u == best {
                CellKind::Used {
                    class: used_class.get(c).map_or(0, |s| s.0),
                }
            } else if w == best {
                CellKind::Waste
            } else if f == best {
                CellKind::Free
            } else {
                CellKind::Dead
            }
        })
        .collect();
    HeapMap {
        cells,
        bytes_per_cell,
        held_bytes: held,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(addr: u64, len: u64, req: u64) -> Block {
        Block {
            addr,
            len_bytes: len,
            state: BlockState::Used {
                id: 0,
                requested_bytes: req,
            },
        }
    }

    fn free(addr: u64, len: u64) -> Block {
        Block {
            addr,
            len_bytes: len,
            state: BlockState::Free,
        }
    }

    #[test]
    fn cells_show_the_majority_kind() {
        // 1024 bytes over 4 cells of 256: used(class 9) 300 of 512, waste 212, free 512.
        let blocks = [used(0, 512, 300), free(512, 512)];
        let m = rasterise(&blocks, 4);
        assert_eq!(m.bytes_per_cell, 256);
        assert_eq!(m.held_bytes, 1024);
        assert_eq!(
            m.cells,
            [
                CellKind::Used { class: 9 },
                CellKind::Waste,
                CellKind::Free,
                CellKind::Free
            ]
        );
    }

    #[test]
    fn a_window_shows_detail_and_offsets_find_blocks() {
        let blocks = [used(0, 512, 300), free(512, 512)];
        // The second quarter of the space, in 4 cells: used up to 300, waste to 512.
        let m = rasterise_window(&blocks, 256, 256, 4);
        assert_eq!(m.bytes_per_cell, 64);
        assert_eq!(
            m.cells,
            [
                CellKind::Used { class: 9 },
                CellKind::Waste,
                CellKind::Waste,
                CellKind::Waste
            ]
        );
        assert_eq!(block_at_offset(&blocks, 0), Some(0));
        assert_eq!(block_at_offset(&blocks, 511), Some(0));
        assert_eq!(block_at_offset(&blocks, 512), Some(1));
        assert_eq!(block_at_offset(&blocks, 1024), None);
    }

    #[test]
    fn gaps_between_blocks_are_skipped_and_tail_is_empty() {
        let blocks = [used(0, 100, 100), used(1 << 40, 100, 100)];
        let m = rasterise(&blocks, 8);
        assert_eq!(m.held_bytes, 200);
        assert_eq!(m.bytes_per_cell, 25);
        assert!(
            m.cells
                .iter()
                .all(|c| matches!(c, CellKind::Used { class: 7 }))
        );
        let m = rasterise(&[free(0, 10)], 4);
        assert_eq!(
            m.cells,
            [
                CellKind::Free,
                CellKind::Free,
                CellKind::Free,
                CellKind::Free
            ]
        );
        let m = rasterise(&[], 3);
        assert_eq!(m.cells, [CellKind::Empty; 3]);
    }
}
