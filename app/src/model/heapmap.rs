//! The heap map: a policy's address space at one event, rasterised into cells.
//!
//! Blocks are laid end to end in address order and gaps between them (address space the policy
//! does not hold, e.g. between glibc's heap and its mmapped chunks) are skipped, so the map's
//! length is what the policy holds. Each cell shows what covers most of its bytes.

use std::collections::HashSet;

use allocview_sim::heap::{Block, BlockState, Counters};
use allocview_sim::layout::BlockSink;
use allocview_sim::replay::Replay;
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
    rasterise_held(blocks, held, 0, held, n_cells)
}

/// Marks the cells of `map` (rasterised from `blocks`, window starting at `start`) that hold
/// a block of one of the allocations `ids` as [`CellKind::Selected`].
pub fn mark_selected(map: &mut HeapMap, blocks: &[Block], start: u64, ids: &HashSet<u32>) {
    if ids.is_empty() {
        return;
    }
    let mut sel = SelectedCells::new(0, start, map.bytes_per_cell, ids);
    for b in blocks {
        sel.add(b);
    }
    sel.mark(map);
}

/// The cell spans of the blocks of a set of allocations, blocks laid end to end from held
/// offset `pos`: a [`BlockSink`], so a heap that is never listed can be marked too.
pub struct SelectedCells<'a> {
    pos: u64,
    start: u64,
    bytes_per_cell: u64,
    ids: &'a HashSet<u32>,
    /// First and last cell of each selected block.
    spans: Vec<(u64, u64)>,
}

impl<'a> SelectedCells<'a> {
    #[must_use]
    pub fn new(pos: u64, start: u64, bytes_per_cell: u64, ids: &'a HashSet<u32>) -> Self {
        Self {
            pos,
            start,
            bytes_per_cell: bytes_per_cell.max(1),
            ids,
            spans: Vec::new(),
        }
    }

    #[inline]
    fn add(&mut self, b: &Block) {
        if let BlockState::Used { id, .. } = b.state
            && self.pos + b.len_bytes > self.start
            && self.ids.contains(&id)
        {
            let first = self.pos.saturating_sub(self.start) / self.bytes_per_cell;
            let last =
                (self.pos + b.len_bytes - 1).saturating_sub(self.start) / self.bytes_per_cell;
            self.spans.push((first, last));
        }
        self.pos += b.len_bytes;
    }

    /// Marks the spans' cells in `map`.
    pub fn mark(&self, map: &mut HeapMap) {
        for &(first, last) in &self.spans {
            for c in first..=last {
                match usize::try_from(c).ok().and_then(|c| map.cells.get_mut(c)) {
                    Some(cell) => *cell = CellKind::Selected,
                    None => break,
                }
            }
        }
    }
}

impl BlockSink for SelectedCells<'_> {
    #[inline]
    fn block(&mut self, b: Block) {
        self.add(&b);
    }

    fn free_ranges(&mut self, ranges: &[(u64, u64)]) {
        self.pos += ranges.iter().map(|&(_, l)| l).sum::<u64>();
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
/// `held` is the sum of the block lengths, known to the caller: a pass fewer over millions
/// of blocks.
pub fn rasterise_held(
    blocks: &[Block],
    held: u64,
    start: u64,
    len: u64,
    n_cells: usize,
) -> HeapMap {
    let bytes_per_cell = cell_bytes(len, n_cells);
    let grid = Grid::new(start, start.saturating_add(len), bytes_per_cell);
    // A heap of a million blocks is split in two halves rasterised side by side (the cell
    // sums merge exactly); smaller ones are not worth a thread.
    let acc = if blocks.len() >= PARALLEL_BLOCKS {
        let (a, b) = blocks.split_at(blocks.len() / 2);
        let b_from: u64 = a.iter().map(|x| x.len_bytes).sum();
        std::thread::scope(|scope| {
            let second = scope.spawn(|| Sums::of(b, b_from, grid, n_cells));
            let mut first = Sums::of(a, 0, grid, n_cells);
            match second.join() {
                Ok(s) => first.merge(&s),
                Err(_) => first.merge(&Sums::of(b, b_from, grid, n_cells)),
            }
            first
        })
    } else {
        Sums::of(blocks, 0, grid, n_cells)
    };
    HeapMap {
        cells: acc.cells(),
        bytes_per_cell,
        held_bytes: held,
    }
}

/// [`rasterise_held`] of the heap of `replay` just after `event`, from its layout index: the
/// blocks are summed as the index lays them out, never listed. Also the heap's counters;
/// `None` when the replay has no index.
#[must_use]
pub fn rasterise_indexed(
    replay: &Replay,
    event: usize,
    start: u64,
    len: u64,
    n_cells: usize,
) -> Option<(HeapMap, Counters)> {
    let bytes_per_cell = cell_bytes(len, n_cells);
    let grid = Grid::new(start, start.saturating_add(len), bytes_per_cell);
    let mut first = CellSums::new(0, grid, n_cells);
    let (second, counters) =
        replay.fold_blocks_at(event, &mut first, |from| CellSums::new(from, grid, n_cells))?;
    if let Some(second) = second {
        first.sums.merge(&second.sums);
    }
    let map = HeapMap {
        cells: first.sums.cells(),
        bytes_per_cell,
        held_bytes: counters.footprint_bytes,
    };
    Some((map, counters))
}

/// Bytes a cell stands for when `len` bytes are shown in `n_cells` cells.
fn cell_bytes(len: u64, n_cells: usize) -> u64 {
    len.div_ceil(n_cells.max(1) as u64).max(1)
}

/// Heaps with at least this many blocks are rasterised on two threads.
const PARALLEL_BLOCKS: usize = 200_000;

/// Per cell, bytes of each kind; a cell ends up as the kind with the most bytes. Used bytes
/// also keep the class with the largest single share.
struct Sums {
    cells: Vec<CellSum>,
}

/// One cell's sums, together: a block touches one cache line, not five.
#[derive(Clone, Copy, Default)]
struct CellSum {
    free: u64,
    dead: u64,
    waste: u64,
    used: u64,
    /// The largest single share of used bytes, and its class.
    class_bytes: u64,
    class: u8,
}

impl CellSum {
    #[inline]
    fn offer_class(&mut self, class: u8, bytes: u64) {
        if bytes > self.class_bytes {
            self.class = class;
            self.class_bytes = bytes;
        }
    }

    fn kind(&self) -> CellKind {
        let (f, d, w, u) = (self.free, self.dead, self.waste, self.used);
        let best = f.max(d).max(w).max(u);
        if best == 0 {
            CellKind::Empty
        } else if u == best {
            CellKind::Used { class: self.class }
        } else if w == best {
            CellKind::Waste
        } else if f == best {
            CellKind::Free
        } else {
            CellKind::Dead
        }
    }
}

impl Sums {
    fn new(n_cells: usize) -> Self {
        Self {
            cells: vec![CellSum::default(); n_cells.max(1)],
        }
    }

    /// Sums `blocks`, laid end to end from offset `from` of the held space.
    fn of(blocks: &[Block], from: u64, grid: Grid, n_cells: usize) -> Self {
        let mut acc = CellSums::new(from, grid, n_cells);
        for b in blocks {
            if acc.pos >= grid.end {
                break;
            }
            acc.add(b);
        }
        acc.sums
    }

    /// Each cell's kind: the one with the most bytes.
    fn cells(&self) -> Vec<CellKind> {
        self.cells.iter().map(CellSum::kind).collect()
    }

    /// Adds the sums of the blocks after these; a class share wins only when strictly larger,
    /// as in one pass.
    fn merge(&mut self, later: &Self) {
        for (a, b) in self.cells.iter_mut().zip(&later.cells) {
            a.free += b.free;
            a.dead += b.dead;
            a.waste += b.waste;
            a.used += b.used;
            a.offer_class(b.class, b.class_bytes);
        }
    }

    #[inline]
    fn at(&mut self, cell: usize) -> Option<&mut CellSum> {
        self.cells.get_mut(cell)
    }
}

/// [`Sums`] of blocks passed one by one, laid end to end from a held offset.
pub struct CellSums {
    sums: Sums,
    grid: Grid,
    /// Held offset of the next block.
    pos: u64,
}

impl CellSums {
    fn new(from: u64, grid: Grid, n_cells: usize) -> Self {
        Self {
            sums: Sums::new(n_cells),
            grid,
            pos: from,
        }
    }

    #[inline]
    fn add(&mut self, b: &Block) {
        let pos = self.pos;
        // Block lengths come from the trace (a hostile one's add up past 2^64): the offset
        // saturates, and blocks past the held space's end are not drawn.
        self.pos = self.pos.saturating_add(b.len_bytes);
        let g = &self.grid;
        // Most blocks of a big heap fall inside the cell of the block before.
        if pos >= g.start
            && self.pos <= g.cell_end
            && self.pos <= g.end
            && pos.saturating_add(g.bytes_per_cell) >= g.cell_end
            && let Some(c) = usize::try_from(g.cell).ok().and_then(|c| self.sums.at(c))
        {
            match b.state {
                BlockState::Free => c.free += b.len_bytes,
                BlockState::Dead => c.dead += b.len_bytes,
                BlockState::Used {
                    requested_bytes, ..
                } => {
                    let req = requested_bytes.min(b.len_bytes);
                    c.used += req;
                    c.waste += b.len_bytes - req;
                    c.offer_class(size_class(requested_bytes), req);
                }
            }
            return;
        }
        if pos >= self.grid.end || self.pos <= self.grid.start {
            return;
        }
        let s = &mut self.sums;
        match b.state {
            BlockState::Free => self.grid.spread(pos, b.len_bytes, |c, n| {
                if let Some(c) = s.at(c) {
                    c.free += n;
                }
            }),
            BlockState::Dead => self.grid.spread(pos, b.len_bytes, |c, n| {
                if let Some(c) = s.at(c) {
                    c.dead += n;
                }
            }),
            BlockState::Used {
                requested_bytes, ..
            } => {
                let req = requested_bytes.min(b.len_bytes);
                let class = size_class(requested_bytes);
                self.grid.spread(pos, req, |c, n| {
                    if let Some(c) = s.at(c) {
                        c.used += n;
                        c.offer_class(class, n);
                    }
                });
                self.grid
                    .spread(pos.saturating_add(req), b.len_bytes - req, |c, n| {
                        if let Some(c) = s.at(c) {
                            c.waste += n;
                        }
                    });
            }
        }
    }
}

impl BlockSink for CellSums {
    #[inline]
    fn block(&mut self, b: Block) {
        self.add(&b);
    }

    /// Free ranges back to back are one free span of the held space.
    fn free_ranges(&mut self, ranges: &[(u64, u64)]) {
        let len_bytes = ranges.iter().map(|&(_, l)| l).fold(0, u64::saturating_add);
        if let Some(&(addr, _)) = ranges.first() {
            self.add(&Block {
                addr,
                len_bytes,
                state: BlockState::Free,
            });
        }
    }
}

/// Cells of `bytes_per_cell` bytes over the window `[start, end)` of the held space, walked
/// in increasing offsets: the cell under the walk is carried along, so a block inside one cell
/// costs no division (a heap map can take millions of blocks).
#[derive(Clone, Copy)]
struct Grid {
    start: u64,
    end: u64,
    bytes_per_cell: u64,
    /// The cell holding the last offset spread, and where it ends.
    cell: u64,
    cell_end: u64,
}

impl Grid {
    fn new(start: u64, end: u64, bytes_per_cell: u64) -> Self {
        Self {
            start,
            end,
            bytes_per_cell,
            cell: 0,
            cell_end: start.saturating_add(bytes_per_cell),
        }
    }

    /// The cell holding window offset `s` (not below the last one located) and where it ends.
    #[inline]
    fn locate(&mut self, s: u64) -> (u64, u64) {
        if s >= self.cell_end {
            if s - self.cell_end < self.bytes_per_cell {
                self.cell += 1;
                self.cell_end += self.bytes_per_cell;
            } else {
                self.cell = (s - self.start) / self.bytes_per_cell;
                self.cell_end = self.start + (self.cell + 1) * self.bytes_per_cell;
            }
        }
        (self.cell, self.cell_end)
    }

    /// Calls `f(cell, bytes)` for each cell that `[from, from + len)` covers, clipped to the
    /// window. `from` never decreases between calls.
    #[inline]
    fn spread(&mut self, from: u64, len: u64, mut f: impl FnMut(usize, u64)) {
        let mut s = from.max(self.start);
        let end = from.saturating_add(len).min(self.end);
        if s >= end {
            return;
        }
        self.locate(s);
        loop {
            let take = end.min(self.cell_end) - s;
            if let Ok(c) = usize::try_from(self.cell) {
                f(c, take);
            }
            s += take;
            if s < end {
                self.cell += 1;
                self.cell_end += self.bytes_per_cell;
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(blocks: &[Block]) -> u64 {
        blocks.iter().map(|b| b.len_bytes).sum()
    }

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
        let m = rasterise_held(&blocks, held(&blocks), 256, 256, 4);
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

    /// The walked grid gives every cell the bytes a direct intersection of each block with
    /// each cell gives (blocks inside one cell, across many, windows cutting blocks).
    #[test]
    fn spreading_matches_direct_intersection() {
        let mut x = 7u64;
        let mut blocks = Vec::new();
        let mut addr = 0;
        for _ in 0..300 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let len = 1 + (x >> 33) % if x.is_multiple_of(7) { 5000 } else { 90 };
            blocks.push(if x.is_multiple_of(3) {
                free(addr, len)
            } else {
                used(addr, len, 1 + (x >> 20) % len)
            });
            addr += len;
        }
        let held = addr;
        for (start, len, n) in [(0, held, 37), (0, held, 1000), (1234, 5000, 64), (17, 3, 5)] {
            let map = rasterise_held(&blocks, held, start, len, n);
            let per = map.bytes_per_cell;
            for (c, cell) in map.cells.iter().enumerate() {
                let (lo, hi) = (start + c as u64 * per, start + (c as u64 + 1) * per);
                let hi = hi.min(start + len);
                let (mut f, mut u, mut w) = (0, 0, 0);
                for b in &blocks {
                    let overlap = |a: u64, e: u64| e.min(hi).saturating_sub(a.max(lo));
                    match b.state {
                        BlockState::Free => f += overlap(b.addr, b.end()),
                        BlockState::Used {
                            requested_bytes, ..
                        } => {
                            u += overlap(b.addr, b.addr + requested_bytes);
                            w += overlap(b.addr + requested_bytes, b.end());
                        }
                        BlockState::Dead => {}
                    }
                }
                let best = f.max(u).max(w);
                let want = if best == 0 {
                    "empty"
                } else if u == best {
                    "used"
                } else if w == best {
                    "waste"
                } else {
                    "free"
                };
                let got = match cell {
                    CellKind::Empty => "empty",
                    CellKind::Used { .. } => "used",
                    CellKind::Waste => "waste",
                    CellKind::Free => "free",
                    _ => "other",
                };
                assert_eq!(got, want, "window ({start}, {len}, {n}), cell {c}");
            }
        }
    }

    /// A heap big enough for two threads gives the cells of one pass, class shares included
    /// (ties across the split keep the earlier block, as one pass does).
    #[test]
    fn two_threads_give_the_cells_of_one_pass() {
        let mut x = 11u64;
        let mut blocks = Vec::new();
        let mut addr = 0;
        for _ in 0..PARALLEL_BLOCKS + 1001 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let len = 1 + (x >> 33) % 300;
            blocks.push(if x.is_multiple_of(3) {
                free(addr, len)
            } else {
                used(addr, len, 1 + (x >> 20) % len)
            });
            addr += len;
        }
        for (start, len, n) in [(0, addr, 997), (0, addr, 20_000), (addr / 3, addr / 2, 500)] {
            let grid = Grid::new(start, start + len, len.div_ceil(n as u64).max(1));
            let one_pass = Sums::of(&blocks, 0, grid, n);
            let map = rasterise_held(&blocks, addr, start, len, n);
            assert_eq!(map.cells, one_pass.cells(), "window ({start}, {len}, {n})");
            assert_eq!(map.cells.len(), n);
        }
    }
}
