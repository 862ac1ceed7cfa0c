//! A heap map for the page: the explorers' cells ([`crate::model::heapmap::rasterise`]) and,
//! for the hover readout, the block under each cell, so its size is bounded by the cells
//! whatever the number of blocks.

use allocview_sim::heap::{Block, BlockState, Counters};
use allocview_sim::policy::Policy;
use serde::Serialize;

use crate::model::heapmap::{self, CellKind};

/// Columns and rows of a heap map (the page draws it 8 pixels a cell).
pub const HEAP_COLS: usize = 160;
const HEAP_ROWS: usize = 40;

/// A policy's heap at one moment.
#[derive(Debug, Serialize)]
pub struct HeapMoment {
    pub policy: String,
    /// `peak of live bytes`, `first OOM`, `end`.
    pub moment: String,
    pub event: u64,
    pub t_s: f64,
    pub live_bytes: u64,
    pub allocated_bytes: u64,
    pub footprint_bytes: u64,
    pub free_bytes: u64,
    pub free_blocks: u64,
    pub fragmentation: f64,
    pub cols: usize,
    pub bytes_per_cell: u64,
    pub held_bytes: u64,
    /// Each cell: 0 empty, 1 free, 2 dead, 3 internal waste, 4 selected, 10 + size class for
    /// the requested bytes of a live allocation.
    pub cells: Vec<u8>,
    /// Each cell's block: an index into `blocks`.
    pub cell_block: Vec<u32>,
    /// The blocks under cells: `[offset in the held space, length, requested bytes, state]`,
    /// state 0 free, 1 live, 2 dead.
    pub blocks: Vec<[u64; 4]>,
}

impl HeapMoment {
    /// `policy`'s heap as `counters` describe it, just after `event` (`at` = event and
    /// seconds since the first event).
    #[must_use]
    pub fn of(
        name: &str,
        moment: &str,
        at: (usize, f64),
        policy: &dyn Policy,
        counters: &Counters,
    ) -> Self {
        let mut blocks = Vec::new();
        policy.blocks(&mut blocks);
        let mut m = Self::of_blocks(&blocks, HEAP_COLS * HEAP_ROWS);
        m.policy = name.to_owned();
        m.moment = moment.to_owned();
        m.event = at.0 as u64;
        m.t_s = at.1;
        m.live_bytes = counters.live_bytes;
        m.allocated_bytes = counters.allocated_bytes;
        m.footprint_bytes = counters.footprint_bytes;
        m.free_bytes = counters.free_bytes;
        m.free_blocks = counters.free_blocks;
        m.fragmentation = allocview_sim::metrics::fragmentation(counters);
        m
    }

    /// The map of `blocks` (address order) in `n_cells` cells, without figures.
    #[must_use]
    pub fn of_blocks(blocks: &[Block], n_cells: usize) -> Self {
        let map = heapmap::rasterise(blocks, n_cells);
        let cells: Vec<u8> = map
            .cells
            .iter()
            .map(|k| match *k {
                CellKind::Empty => 0,
                CellKind::Free => 1,
                CellKind::Dead => 2,
                CellKind::Waste => 3,
                CellKind::Selected => 4,
                CellKind::Used { class } => class.saturating_add(10),
            })
            .collect();
        let (cell_block, table) = blocks_under_cells(blocks, map.bytes_per_cell, cells.len());
        Self {
            policy: String::new(),
            moment: String::new(),
            event: 0,
            t_s: 0.0,
            live_bytes: 0,
            allocated_bytes: 0,
            footprint_bytes: 0,
            free_bytes: 0,
            free_blocks: 0,
            fragmentation: 0.0,
            cols: HEAP_COLS,
            bytes_per_cell: map.bytes_per_cell,
            held_bytes: map.held_bytes,
            cells,
            cell_block,
            blocks: table,
        }
    }
}

/// For each of `n_cells` cells of `bytes_per_cell`, the block under its middle byte (blocks
/// laid end to end), as an index into a table of those blocks.
fn blocks_under_cells(
    blocks: &[Block],
    bytes_per_cell: u64,
    n_cells: usize,
) -> (Vec<u32>, Vec<[u64; 4]>) {
    let mut cell_block = Vec::with_capacity(n_cells);
    let mut table: Vec<[u64; 4]> = Vec::new();
    let mut iter = blocks.iter();
    let mut current = iter.next();
    let mut start = 0u64;
    let mut added_for: Option<u64> = None;
    for c in 0..n_cells as u64 {
        let middle = c * bytes_per_cell + bytes_per_cell / 2;
        while let Some(b) = current
            && start + b.len_bytes <= middle
        {
            start += b.len_bytes;
            current = iter.next();
        }
        let Some(b) = current else {
            // Past the held space: the cell is empty, and shows no block.
            cell_block.push(0);
            continue;
        };
        if added_for != Some(start) {
            let (requested, state) = match b.state {
                BlockState::Free => (0, 0),
                BlockState::Used {
                    requested_bytes, ..
                } => (requested_bytes, 1),
                BlockState::Dead => (0, 2),
            };
            table.push([start, b.len_bytes, requested, state]);
            added_for = Some(start);
        }
        cell_block.push(u32::try_from(table.len() - 1).unwrap_or(u32::MAX));
    }
    (cell_block, table)
}
