//! The plan picture: every buffer of a static plan as a rectangle, time across and address up,
//! with the lower-bound line, rasterised into a grid of cells for the frontends.
//!
//! The picture spans the buffers' time range (those that hold memory) and addresses 0 up to
//! the larger of the plan's total and the bound (and a capacity, when given), so the lines are
//! always on it. Row 0 is the top (highest addresses). A cell shows the buffer covering most of
//! its area, unless empty space covers more; overwrite children sit inside their parents, so
//! the innermost live buffer wins where they overlap. Live bytes per column (the maximum over
//! the column's time span) go with it, for a profile under the picture. Rasterising costs the
//! cells the rectangles cover plus O(n log n) for the live profile.

use allocview_sim::plan::{Buffer, Plan};
use allocview_sim::trace::size_class;

/// One buffer's rectangle, in plan coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanRect {
    /// Index of the buffer.
    pub buffer: usize,
    /// Half-open lifetime.
    pub lower: u64,
    pub upper: u64,
    /// Half-open address range.
    pub offset_bytes: u64,
    pub end_bytes: u64,
}

/// What a cell of the plan grid shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlanCell {
    Empty,
    /// A buffer, with the size class of its size (for colouring as the heap map does).
    Buffer {
        index: usize,
        class: u8,
    },
}

/// A rasterised plan picture.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanGrid {
    pub width: usize,
    pub height: usize,
    /// Row-major, `height` rows of `width` cells; row 0 is the top (highest addresses).
    pub cells: Vec<PlanCell>,
    /// Time at the left edge and just past the right edge.
    pub time_start: u64,
    pub time_end: u64,
    /// Address at the top edge (the bottom is 0).
    pub top_bytes: u64,
    /// The plan's size, the bound, and the capacity if one was given.
    pub total_bytes: u64,
    pub lower_bound_bytes: u64,
    pub capacity_bytes: Option<u64>,
    /// Row whose address band holds the bound / the plan's top / the capacity (the line is
    /// drawn along that row's top edge when the value is that band's upper end).
    pub lower_bound_row: usize,
    pub total_row: usize,
    pub capacity_row: Option<usize>,
    /// Per column, the most bytes live at any time in its span.
    pub live_bytes: Vec<u64>,
}

impl PlanGrid {
    /// The cell at `(col, row)`.
    #[must_use]
    pub fn cell(&self, col: usize, row: usize) -> Option<PlanCell> {
        if col >= self.width {
            return None;
        }
        self.cells
            .get(row.checked_mul(self.width)?.checked_add(col)?)
            .copied()
    }

    /// The time range `[start, end)` a column stands for.
    #[must_use]
    pub fn column_time(&self, col: usize) -> (f64, f64) {
        let span = (self.time_end - self.time_start) as f64 / self.width.max(1) as f64;
        let t0 = self.time_start as f64 + span * col as f64;
        (t0, t0 + span)
    }

    /// The address range `[low, high)` a row stands for.
    #[must_use]
    pub fn row_bytes(&self, row: usize) -> (f64, f64) {
        let band = self.top_bytes as f64 / self.height.max(1) as f64;
        let high = self.top_bytes as f64 - band * row as f64;
        (high - band, high)
    }
}

/// The rectangles of the buffers that hold memory, in buffer order.
#[must_use]
pub fn rects(buffers: &[Buffer], plan: &Plan) -> Vec<PlanRect> {
    buffers
        .iter()
        .zip(&plan.offsets)
        .enumerate()
        .filter(|(_, (b, _))| b.needs_memory())
        .map(|(i, (b, &o))| PlanRect {
            buffer: i,
            lower: b.lower,
            upper: b.upper,
            offset_bytes: o,
            end_bytes: o.saturating_add(b.size_bytes),
        })
        .collect()
}

/// The buffer at `(time, address)` in plan coordinates (the innermost one when overwrite
/// children nest), for hover details. O(n).
#[must_use]
pub fn buffer_at(buffers: &[Buffer], plan: &Plan, time: u64, address: u64) -> Option<usize> {
    rects(buffers, plan)
        .into_iter()
        .filter(|r| {
            r.lower <= time && time < r.upper && r.offset_bytes <= address && address < r.end_bytes
        })
        .min_by_key(|r| r.end_bytes - r.offset_bytes)
        .map(|r| r.buffer)
}

/// The row (0 = top) whose band holds address `bytes`, a value at a band's upper end counting
/// for that band, so a line at `bytes` is drawn along the row's top edge.
fn row_of(bytes: u64, top: u64, height: usize) -> usize {
    if height == 0 || top == 0 {
        return 0;
    }
    let scaled = (u128::from(bytes) * height as u128).div_ceil(u128::from(top));
    let from_bottom = usize::try_from(scaled.saturating_sub(1))
        .unwrap_or(usize::MAX)
        .min(height - 1);
    height - 1 - from_bottom
}

/// The part of `r` inside the time range `[t0, t1)`, or `None` when they do not meet.
fn clip_time(r: &PlanRect, t0: u64, t1: u64) -> Option<PlanRect> {
    let lower = r.lower.max(t0);
    let upper = r.upper.min(t1);
    (lower < upper).then_some(PlanRect { lower, upper, ..*r })
}

/// The grid's geometry: calls `f(cell index, area)` for every cell `r` covers.
struct Geometry {
    width: usize,
    height: usize,
    time_start: u64,
    col_span: f64,
    row_band: f64,
}

impl Geometry {
    fn cover(&self, r: &PlanRect, mut f: impl FnMut(usize, f64)) {
        let t0 = (r.lower - self.time_start) as f64;
        let t1 = (r.upper - self.time_start) as f64;
        let (a0, a1) = (r.offset_bytes as f64, r.end_bytes as f64);
        let c0 = (t0 / self.col_span).floor() as usize;
        let c1 = ((t1 / self.col_span).ceil() as usize).min(self.width);
        // Bands counted from the bottom.
        let b0 = (a0 / self.row_band).floor() as usize;
        let b1 = ((a1 / self.row_band).ceil() as usize).min(self.height);
        for c in c0..c1 {
            let ct0 = c as f64 * self.col_span;
            let dt = t1.min(ct0 + self.col_span) - t0.max(ct0);
            if dt <= 0.0 {
                continue;
            }
            for b in b0..b1 {
                let ba0 = b as f64 * self.row_band;
                let da = a1.min(ba0 + self.row_band) - a0.max(ba0);
                if da > 0.0 {
                    f((self.height - 1 - b) * self.width + c, dt * da);
                }
            }
        }
    }
}

/// Rasterises `plan` of `buffers` into `width` x `height` cells (see the module docs).
#[must_use]
pub fn rasterise(
    buffers: &[Buffer],
    plan: &Plan,
    lower_bound_bytes: u64,
    capacity_bytes: Option<u64>,
    width: usize,
    height: usize,
) -> PlanGrid {
    let (width, height) = (width.max(1), height.max(1));
    let rs = rects(buffers, plan);
    let time_start = rs.iter().map(|r| r.lower).min().unwrap_or(0);
    let time_end = rs
        .iter()
        .map(|r| r.upper)
        .max()
        .unwrap_or(1)
        .max(time_start + 1);
    let top_bytes = plan
        .total_bytes
        .max(lower_bound_bytes)
        .max(capacity_bytes.unwrap_or(0))
        .max(1);
    let geo = Geometry {
        width,
        height,
        time_start,
        col_span: (time_end - time_start) as f64 / width as f64,
        row_band: top_bytes as f64 / height as f64,
    };
    let cell_area = geo.col_span * geo.row_band;
    let cells = visible_areas(buffers, &rs, &geo)
        .iter()
        .map(|list| shown_cell(buffers, list, cell_area))
        .collect();

    PlanGrid {
        width,
        height,
        cells,
        time_start,
        time_end,
        top_bytes,
        total_bytes: plan.total_bytes,
        lower_bound_bytes,
        capacity_bytes,
        lower_bound_row: row_of(lower_bound_bytes, top_bytes, height),
        total_row: row_of(plan.total_bytes, top_bytes, height),
        capacity_row: capacity_bytes.map(|c| row_of(c, top_bytes, height)),
        live_bytes: live_profile(buffers, time_start, geo.col_span, width),
    }
}

/// Per cell of `geo`, each buffer's visible area. An overwrite child lies inside its parent's
/// addresses, so where both live the child's area is taken from the parent's: the sum of a
/// cell's entries is then the area covered, and the innermost buffer shows.
fn visible_areas(buffers: &[Buffer], rs: &[PlanRect], geo: &Geometry) -> Vec<Vec<(usize, f64)>> {
    let mut areas: Vec<Vec<(usize, f64)>> = vec![Vec::new(); geo.width * geo.height];
    let mut rect_of: Vec<Option<PlanRect>> = vec![None; buffers.len()];
    for r in rs {
        if let Some(slot) = rect_of.get_mut(r.buffer) {
            *slot = Some(*r);
        }
        geo.cover(r, |idx, area| {
            if let Some(list) = areas.get_mut(idx) {
                list.push((r.buffer, area));
            }
        });
    }
    for r in rs {
        let Some(ow) = buffers.get(r.buffer).and_then(|b| b.overwrite) else {
            continue;
        };
        let Some(parent) = rect_of.get(ow.parent).copied().flatten() else {
            continue;
        };
        let Some(shared) = clip_time(r, parent.lower, parent.upper) else {
            continue;
        };
        geo.cover(&shared, |idx, area| {
            if let Some(list) = areas.get_mut(idx)
                && let Some(entry) = list.iter_mut().find(|(b, _)| *b == ow.parent)
            {
                entry.1 -= area;
            }
        });
    }
    areas
}

/// What a cell of `cell_area` whose buffers show `list` (see [`visible_areas`]) draws: the
/// buffer with the most area, when it has at least the empty part's.
fn shown_cell(buffers: &[Buffer], list: &[(usize, f64)], cell_area: f64) -> PlanCell {
    let covered: f64 = list.iter().map(|&(_, a)| a.max(0.0)).sum();
    let empty = (cell_area - covered).max(0.0);
    // Most area wins; on a tie the later (inner, for a chain) entry.
    let best = list
        .iter()
        .copied()
        .reduce(|best, x| if x.1 >= best.1 { x } else { best });
    match best {
        Some((index, area)) if area > 0.0 && area >= empty => PlanCell::Buffer {
            index,
            class: buffers.get(index).map_or(0, |b| size_class(b.size_bytes)),
        },
        _ => PlanCell::Empty,
    }
}

/// The memory held over time as `(lower, upper, bytes)` pieces: a buffer alone holds its size
/// over its lifetime; an overwrite chain holds, at each moment, the size of its shallowest live
/// member (the members nest, so that range contains the others), as the planners' bound counts
/// it. O(n) plus O(m^2) per chain of m members.
fn held_pieces(buffers: &[Buffer]) -> Vec<(u64, u64, u64)> {
    let n = buffers.len();
    // Root and depth of every buffer, by walking up (bounded by n against cycles).
    let mut chains: std::collections::HashMap<usize, Vec<(usize, usize)>> =
        std::collections::HashMap::new();
    let mut pieces = Vec::with_capacity(n);
    let any_overwrite = buffers.iter().any(|x| x.overwrite.is_some());
    for (i, b) in buffers.iter().enumerate() {
        if !b.needs_memory() {
            continue;
        }
        let (mut root, mut depth) = (i, 0usize);
        while let Some(ow) = buffers.get(root).and_then(|x| x.overwrite) {
            if depth > n {
                break;
            }
            root = ow.parent;
            depth += 1;
        }
        if !any_overwrite {
            pieces.push((b.lower, b.upper, b.size_bytes));
        } else {
            chains.entry(root).or_default().push((depth, i));
        }
    }
    for members in chains.values_mut() {
        members.sort_unstable();
        let mut times: Vec<u64> = members
            .iter()
            .filter_map(|&(_, i)| buffers.get(i))
            .flat_map(|b| [b.lower, b.upper])
            .collect();
        times.sort_unstable();
        times.dedup();
        for w in times.windows(2) {
            let &[t0, t1] = w else { continue };
            let shallowest = members
                .iter()
                .filter_map(|&(_, i)| buffers.get(i))
                .find(|b| b.lower <= t0 && t0 < b.upper);
            if let Some(b) = shallowest {
                pieces.push((t0, t1, b.size_bytes));
            }
        }
    }
    pieces
}

/// Per column, the most bytes held at any moment of its span.
fn live_profile(buffers: &[Buffer], time_start: u64, col_span: f64, width: usize) -> Vec<u64> {
    let mut events: Vec<(u64, bool, u64)> = Vec::new();
    for (lower, upper, size) in held_pieces(buffers) {
        events.push((lower, true, size));
        events.push((upper, false, size));
    }
    // `false < true`: ends before starts at equal times (half-open lifetimes).
    events.sort_unstable();
    let mut out = vec![0u64; width];
    let col_of = |t: u64| -> usize {
        let c = (t.saturating_sub(time_start) as f64 / col_span).floor() as usize;
        c.min(width.saturating_sub(1))
    };
    let mut live = 0u64;
    let mut i = 0;
    while let Some(&(t, _, _)) = events.get(i) {
        while let Some(&(et, is_start, size)) = events.get(i) {
            if et != t {
                break;
            }
            live = if is_start {
                live.saturating_add(size)
            } else {
                live.saturating_sub(size)
            };
            i += 1;
        }
        let next = events.get(i).map_or(t, |e| e.0);
        if live > 0 && next > t {
            for c in col_of(t)..=col_of(next - 1) {
                if let Some(v) = out.get_mut(c) {
                    *v = (*v).max(live);
                }
            }
        }
    }
    out
}

/// What the hover over cell `(col, row)` of `grid` (a picture of `plan`) says: the buffer
/// there, its size, lifetime and offset; `None` over empty space.
#[must_use]
pub fn describe_cell(
    buffers: &[Buffer],
    plan: &Plan,
    grid: &PlanGrid,
    col: usize,
    row: usize,
    time_unit: &str,
) -> Option<String> {
    let (t0, t1) = grid.column_time(col);
    let (a0, a1) = grid.row_bytes(row);
    let time = ((t0 + t1) / 2.0).floor().max(0.0) as u64;
    let address = ((a0 + a1) / 2.0).max(0.0) as u64;
    let i = buffer_at(buffers, plan, time, address)?;
    let b = buffers.get(i)?;
    let offset = plan.offsets.get(i).copied()?;
    Some(format!(
        "buffer {i}: {} ({} B)\nlive over {time_unit}s {}..{} ({} {time_unit}s)\noffset {}..{} ({} to {})",
        crate::format::bytes(b.size_bytes),
        b.size_bytes,
        b.lower,
        b.upper,
        b.upper.saturating_sub(b.lower),
        offset,
        offset.saturating_add(b.size_bytes),
        crate::format::bytes(offset),
        crate::format::bytes(offset.saturating_add(b.size_bytes)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// minimalloc's README example and its published solution (height 12).
    fn example() -> (Vec<Buffer>, Plan) {
        let buffers = vec![
            Buffer::new(4, 0, 3),
            Buffer::new(4, 3, 9),
            Buffer::new(4, 0, 9),
            Buffer::new(4, 9, 21),
            Buffer::new(4, 0, 21),
        ];
        let plan = Plan {
            offsets: vec![8, 8, 4, 4, 0],
            total_bytes: 12,
        };
        (buffers, plan)
    }

    fn glyphs(g: &PlanGrid) -> Vec<String> {
        (0..g.height)
            .map(|r| {
                (0..g.width)
                    .map(|c| match g.cell(c, r) {
                        Some(PlanCell::Buffer { index, .. }) => {
                            char::from(b'1' + u8::try_from(index).unwrap_or(0))
                        }
                        _ => '.',
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn one_cell_per_time_unit_and_byte_reproduces_the_solution() {
        let (buffers, plan) = example();
        let g = rasterise(&buffers, &plan, 12, None, 21, 12);
        let rows = glyphs(&g);
        let mut want = Vec::new();
        for _ in 0..4 {
            // b1 [0,3) then b2 [3,9) at 8..12; nothing above b2 after 9.
            want.push(format!(
                "{}{}{}",
                "1".repeat(3),
                "2".repeat(6),
                ".".repeat(12)
            ));
        }
        for _ in 0..4 {
            want.push(format!("{}{}", "3".repeat(9), "4".repeat(12)));
        }
        for _ in 0..4 {
            want.push("5".repeat(21));
        }
        assert_eq!(rows, want);
        assert_eq!(g.lower_bound_row, 0);
        assert_eq!(g.total_row, 0);
        assert_eq!(g.live_bytes, [vec![12u64; 9], vec![8u64; 12]].concat());
        let c = g.cell(0, 11);
        assert_eq!(c, Some(PlanCell::Buffer { index: 4, class: 3 }));
    }

    #[test]
    fn coarse_grid_keeps_the_majority_and_places_the_lines() {
        let (buffers, plan) = example();
        // 3 columns of 7 time units, 3 rows of 8 bytes, a 24-byte capacity above the plan.
        let g = rasterise(&buffers, &plan, 12, Some(24), 3, 3);
        assert_eq!(g.top_bytes, 24);
        // Top row [16, 24): empty. Middle [8, 16): b2 covers 4x4 of column 0's 7x8 area
        // (b1 3x4), empty covers the rest, so it is empty; column 1 likewise, column 2 empty.
        // Bottom [0, 8): b5 below b3/b4, each half the band.
        let rows = glyphs(&g);
        assert_eq!(rows[0], "...");
        assert_eq!(rows[1], "...");
        assert_eq!(rows[2].len(), 3);
        assert!(rows[2].chars().all(|ch| ch != '.'), "{rows:?}");
        // The bound 12 lies in the middle band [8, 16); capacity 24 is the top edge.
        assert_eq!(g.lower_bound_row, 1);
        assert_eq!(g.total_row, 1);
        assert_eq!(g.capacity_row, Some(0));
        assert_eq!(g.live_bytes, [12, 12, 8]);
    }

    #[test]
    fn hover_finds_the_innermost_buffer() {
        let buffers = vec![
            Buffer::new(100, 0, 3),
            Buffer::new(50, 2, 5).overwriting(0, 50),
        ];
        let plan = Plan {
            offsets: vec![0, 50],
            total_bytes: 100,
        };
        assert_eq!(buffer_at(&buffers, &plan, 2, 60), Some(1));
        assert_eq!(buffer_at(&buffers, &plan, 2, 10), Some(0));
        assert_eq!(buffer_at(&buffers, &plan, 4, 10), None);
        // The chain holds the parent's 100 bytes while it lives, then the child's 50, as the
        // simulator's bound counts it.
        let g = rasterise(&buffers, &plan, 100, None, 5, 2);
        assert_eq!(g.live_bytes, [100, 100, 100, 50, 50]);
        assert_eq!(
            g.live_bytes.iter().max().copied(),
            allocview_sim::plan::max_live_bytes(&buffers).ok()
        );
        assert_eq!(g.cell(3, 1), Some(PlanCell::Empty));
        assert_eq!(g.cell(3, 0), Some(PlanCell::Buffer { index: 1, class: 6 }));
        // Top band [50, 100) at time 2: the child; at time 0: the parent.
        assert_eq!(g.cell(2, 0), Some(PlanCell::Buffer { index: 1, class: 6 }));
        assert_eq!(g.cell(0, 0), Some(PlanCell::Buffer { index: 0, class: 7 }));
    }

    /// The hover names the buffer under a cell, with its size, lifetime and offset, and says
    /// nothing over empty space.
    #[test]
    fn hover_describes_the_buffer_under_a_cell() {
        let (buffers, plan) = example();
        // 21 columns of one time unit, 12 rows of 1 byte (row 0 holds addresses 11..12).
        let g = rasterise(&buffers, &plan, 12, None, 21, 12);
        let at = |c, r| describe_cell(&buffers, &plan, &g, c, r, "step");
        // Buffer 3 (index 3): offset 4..8, live 9..21: column 10, address 5 is row 6.
        let text = at(10, 6).unwrap();
        assert!(text.starts_with("buffer 3: 4 B (4 B)"), "{text}");
        assert!(text.contains("live over steps 9..21 (12 steps)"), "{text}");
        assert!(text.contains("offset 4..8"), "{text}");
        // Buffer 0 at time 1, address 9 (row 2); nothing at time 10, address 9 (row 2).
        assert!(at(1, 2).unwrap().starts_with("buffer 0:"));
        assert_eq!(at(10, 2), None);
    }
}
