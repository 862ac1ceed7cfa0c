//! The desktop explorer's heap maps: the selected policy's, or every policy's side by side,
//! over the zoomed part of the held space; a block's story on hover, its birth or death a
//! click away, and the wheel to zoom.

use allocview_sim::heap::{Block, BlockState};
use eframe::egui::{self, Color32, ColorImage, TextureHandle, TextureOptions};

use super::{GuiApp, cell_color};
use crate::format;
use crate::model::heapmap::HeapMap;
use crate::model::state::{AppState, Mode};
use crate::model::update::Msg;
use crate::model::view::ViewModel;

/// Points a heap cell takes on screen, across and down.
const CELL_PX: f32 = 4.0;

/// A heap panel's width and the cells of its map.
#[derive(Clone, Copy)]
struct Grid {
    panel_w: f32,
    cols: usize,
    rows: usize,
}

/// One policy's map: the policy's index, the map, and the held byte it starts at.
type ShownMap = (usize, HeapMap, u64);

/// What the user did to a heap panel: go to an event (a block's birth or death), or zoom the
/// heap window by a factor around a fraction of the map.
#[derive(Default)]
struct PanelInput {
    jump: Option<usize>,
    zoom_by: Option<(f64, f64)>,
}

impl PanelInput {
    /// This input, with what `later` (a panel to the right) asks for in its place.
    fn then(self, later: Self) -> Self {
        Self {
            jump: later.jump.or(self.jump),
            zoom_by: later.zoom_by.or(self.zoom_by),
        }
    }
}

impl GuiApp {
    /// The heap maps of the policies shown, side by side over the room there is.
    pub(super) fn heap_ui(&mut self, ui: &mut egui::Ui, vm: &ViewModel) {
        let Some(state) = self.runs.first().map(|r| &r.state) else {
            return;
        };
        let shown: Vec<usize> = match state.mode {
            Mode::Single => vec![state.selected],
            Mode::Compare => (0..state.policies.len()).collect(),
        };
        super::dump::legend(ui);
        let avail = ui.available_size();
        let panel_w = (avail.x / shown.len().max(1) as f32 - 8.0).max(60.0);
        let map_h = (avail.y - 60.0).max(40.0);
        let grid = Grid {
            panel_w,
            cols: (panel_w / CELL_PX).floor().max(1.0) as usize,
            rows: (map_h / CELL_PX).floor().max(1.0) as usize,
        };
        let maps = heap_maps(state, &shown, self.heap_window, grid.cols * grid.rows);
        self.textures.truncate(0);
        let mut input = PanelInput::default();
        ui.horizontal_top(|ui| {
            for &i in &shown {
                let Some(slot) = state.policies.get(i) else {
                    continue;
                };
                ui.vertical(|ui| {
                    ui.set_width(grid.panel_w);
                    ui.strong(format!("heap: {}", slot.name));
                    let Some(shown_map) = maps.iter().find(|m| m.0 == i) else {
                        let note = vm
                            .heaps
                            .iter()
                            .find(|h| h.policy == slot.name)
                            .and_then(|h| h.note.clone())
                            .unwrap_or_default();
                        ui.label(note);
                        return;
                    };
                    let (tex, panel) = heap_panel(ui, state, shown_map, grid);
                    self.textures.push(tex);
                    input = std::mem::take(&mut input).then(panel);
                    let caption = vm
                        .heaps
                        .iter()
                        .find(|h| h.policy == slot.name)
                        .map(|h| h.caption.clone())
                        .unwrap_or_default();
                    ui.small(caption);
                    ui.small(format!(
                        "1 cell = {}; scroll to zoom, click a block: its birth, right-click: its death",
                        format::bytes(shown_map.1.bytes_per_cell)
                    ));
                });
            }
        });
        if let Some((factor, at)) = input.zoom_by {
            self.zoom_heap(factor, at);
        }
        if let Some(e) = input.jump {
            self.send(Msg::GotoEvent(e));
        }
    }

    /// Scales the heap window by `factor`, keeping the byte at fraction `at` of it in place.
    fn zoom_heap(&mut self, factor: f64, at: f64) {
        let (lo, hi) = self.heap_window;
        let width = ((hi - lo) * factor).clamp(1e-6, 1.0);
        let centre = lo + at * (hi - lo);
        let lo = (centre - width * at).clamp(0.0, 1.0 - width);
        self.heap_window = (lo, lo + width);
    }
}

/// The maps of the policies `shown` that have a heap at the cursor, over `window` (fractions
/// of the held space) in `cells` cells, the selected site's blocks marked.
fn heap_maps(state: &AppState, shown: &[usize], window: (f64, f64), cells: usize) -> Vec<ShownMap> {
    let highlighted = state.sites.highlighted();
    let mut maps = Vec::new();
    for &i in shown {
        if let Some(h) = state.heaps.get(i).and_then(Option::as_ref) {
            let held = h.held_bytes;
            let start = (window.0 * held as f64) as u64;
            let len = (((window.1 - window.0) * held as f64) as u64).max(1);
            let mut map = h.raster(start, len, cells);
            h.mark_selected(&mut map, start, &highlighted);
            maps.push((i, map, start));
        }
    }
    maps
}

/// Draws one policy's map as a texture (returned: the app keeps it alive), and answers the
/// pointer over it.
fn heap_panel(
    ui: &mut egui::Ui,
    state: &AppState,
    (i, map, start): &ShownMap,
    grid: Grid,
) -> (TextureHandle, PanelInput) {
    let pixels: Vec<Color32> = map.cells.iter().map(|&c| cell_color(c)).collect();
    let img = ColorImage::new([grid.cols, grid.rows], pixels);
    let tex = ui
        .ctx()
        .load_texture(format!("heap-{i}"), img, TextureOptions::NEAREST);
    let size = egui::vec2(grid.cols as f32 * CELL_PX, grid.rows as f32 * CELL_PX);
    let resp = ui.add(
        egui::Image::new(&tex)
            .maintain_aspect_ratio(false)
            .fit_to_exact_size(size)
            .sense(egui::Sense::click()),
    );
    let input = match (
        resp.hover_pos(),
        state.heaps.get(*i).and_then(Option::as_ref),
    ) {
        (Some(pos), Some(h)) => {
            let rel = pos - resp.rect.min;
            let cx = (rel.x / CELL_PX) as usize;
            let cy = (rel.y / CELL_PX) as usize;
            let cell = cy * grid.cols + cx;
            let offset = start + cell as u64 * map.bytes_per_cell;
            let jump = h
                .block_at_offset(offset)
                .and_then(|b| hover_block(&resp, state, &b));
            let scroll = ui.input(|inp| inp.smooth_scroll_delta.y);
            let zoom_by = (scroll.abs() > 0.0).then(|| {
                let frac = f64::from(cell as u32) / (grid.cols * grid.rows) as f64;
                (if scroll > 0.0 { 0.8 } else { 1.25 }, frac)
            });
            PanelInput { jump, zoom_by }
        }
        _ => PanelInput::default(),
    };
    (tex, input)
}

/// Shows block `b`'s story over the map; returns the event a click on it goes to: its birth,
/// or with the right button its death.
fn hover_block(resp: &egui::Response, state: &AppState, b: &Block) -> Option<usize> {
    resp.clone().on_hover_text(describe_block(state, b));
    let BlockState::Used { id, .. } = b.state else {
        return None;
    };
    let (birth, death) = state.data.as_ref()?.lifetime(id)?;
    if resp.clicked() {
        Some(birth)
    } else if resp.secondary_clicked() {
        death.or(Some(birth))
    } else {
        None
    }
}

/// What a block is: free, dead, or an allocation with its sizes, birth, death and stack.
fn describe_block(state: &AppState, b: &Block) -> String {
    match b.state {
        BlockState::Free => format!(
            "free block at {:#x}: {}",
            b.addr,
            format::bytes(b.len_bytes)
        ),
        BlockState::Dead => format!(
            "dead (not reusable) at {:#x}: {}",
            b.addr,
            format::bytes(b.len_bytes)
        ),
        BlockState::Used {
            id,
            requested_bytes,
        } => {
            let mut s = format!(
                "allocation {id} at {:#x}\nrequested {} ({} B), allocated {} ({} B)",
                b.addr,
                format::bytes(requested_bytes),
                requested_bytes,
                format::bytes(b.len_bytes),
                b.len_bytes
            );
            if let Some(data) = &state.data {
                let v = data.view();
                let t0 = v.t_ns.first().copied().unwrap_or(0);
                let when = |e: usize| {
                    format!(
                        "event {} at {}",
                        format::count(e as u64),
                        format::seconds_fixed(
                            (v.t_ns.get(e).copied().unwrap_or(t0) - t0) as f64 / 1e9
                        )
                    )
                };
                if let Some((birth, death)) = data.lifetime(id) {
                    s.push_str(&format!(
                        "\nborn: {}, thread {}",
                        when(birth),
                        data.thread_at(birth)
                    ));
                    s.push_str(&format!(
                        "\ndies: {}",
                        death.map_or_else(|| "never (live at the end)".to_owned(), when)
                    ));
                }
                // A snapshot's allocations carry their stack: the innermost frames.
                let frames = data.frames_of_alloc(id);
                for f in frames.iter().take(12) {
                    s.push_str(&format!("\n  {f}"));
                }
                if frames.len() > 12 {
                    s.push_str(&format!("\n  ... {} more frames", frames.len() - 12));
                }
            }
            s
        }
    }
}
