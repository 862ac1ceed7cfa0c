//! What the desktop explorer shows of a TensorFlow BFC dump, which is one moment of a heap with
//! no history: the dump's own chunks as a heap map filling the window (hover says what a chunk
//! is), and the legend that every heap map carries.

use allocview_sim::heap::{Block, BlockState};
use eframe::egui::{self, ColorImage, TextureHandle, TextureOptions};

use super::{cell_color, col};
use crate::format;
use crate::model::heapmap::{self, CellKind};
use crate::model::trace_data::DumpData;
use crate::model::view::ViewModel;
use crate::theme;

/// Pixels a heap map cell takes.
const CELL_PX: f32 = 4.0;

/// What the heap map's colours mean, on one line.
pub(super) fn legend(ui: &mut egui::Ui) {
    ui.horizontal_wrapped(|ui| {
        let swatch = |ui: &mut egui::Ui, c: egui::Color32, label: &str| {
            let (rect, _) = ui.allocate_exact_size(egui::vec2(10.0, 10.0), egui::Sense::hover());
            ui.painter().rect_filled(rect, 1.0, c);
            ui.small(label);
        };
        swatch(ui, cell_color(CellKind::Free), "free");
        swatch(
            ui,
            cell_color(CellKind::Waste),
            "reserved beyond the request",
        );
        swatch(ui, cell_color(CellKind::Dead), "dead (not reusable)");
        swatch(ui, cell_color(CellKind::Selected), "selected site");
        ui.small("live, by request size:");
        for (class, label) in [(6, "64 B"), (12, "4 KiB"), (20, "1 MiB"), (27, "128 MiB")] {
            swatch(ui, col(theme::class(class)), label);
        }
    });
}

/// The dump's heap map in the space left by the panels, with the legend and a hover that names
/// the chunk under the pointer. `texture` keeps the picture alive while egui draws it.
pub(super) fn dump_heap_ui(
    ui: &mut egui::Ui,
    vm: &ViewModel,
    dump: &DumpData,
    texture: &mut Option<TextureHandle>,
) {
    let title = vm.heaps.first().map_or("heap", |h| h.policy.as_str());
    ui.strong(format!("{title}: its chunks in address order"));
    legend(ui);
    let avail = ui.available_size();
    let cols = (avail.x / CELL_PX).floor().max(1.0) as usize;
    let rows = ((avail.y - 40.0) / CELL_PX).floor().max(1.0) as usize;
    let map = heapmap::rasterise(&dump.blocks, cols * rows);
    let pixels = map.cells.iter().map(|&c| cell_color(c)).collect();
    let tex = ui.ctx().load_texture(
        "dump-heap",
        ColorImage::new([cols, rows], pixels),
        TextureOptions::NEAREST,
    );
    let size = egui::vec2(cols as f32 * CELL_PX, rows as f32 * CELL_PX);
    let resp = ui.add(
        egui::Image::new(&tex)
            .maintain_aspect_ratio(false)
            .fit_to_exact_size(size)
            .sense(egui::Sense::hover()),
    );
    *texture = Some(tex);
    if let Some(pos) = resp.hover_pos() {
        let rel = pos - resp.rect.min;
        let cell = (rel.y / CELL_PX) as usize * cols + (rel.x / CELL_PX) as usize;
        let offset = cell as u64 * map.bytes_per_cell;
        if let Some(b) =
            heapmap::block_at_offset(&dump.blocks, offset).and_then(|i| dump.blocks.get(i))
        {
            resp.on_hover_text(describe_chunk(b));
        }
    }
    if let Some(caption) = vm.heaps.first().map(|h| h.caption.as_str()) {
        ui.small(caption);
    }
    ui.small(format!(
        "{} chunks, {} held; 1 cell = {}",
        format::count(dump.blocks.len() as u64),
        format::bytes(map.held_bytes),
        format::bytes(map.bytes_per_cell)
    ));
}

/// A chunk of the dump, for the hover.
fn describe_chunk(b: &Block) -> String {
    match b.state {
        BlockState::Used {
            requested_bytes, ..
        } => format!(
            "chunk in use at {:#x}: {} ({} B), requested {} ({} B)",
            b.addr,
            format::bytes(b.len_bytes),
            b.len_bytes,
            format::bytes(requested_bytes),
            requested_bytes
        ),
        BlockState::Free => format!(
            "free chunk at {:#x}: {} ({} B)",
            b.addr,
            format::bytes(b.len_bytes),
            b.len_bytes
        ),
        BlockState::Dead => format!("{:#x}: {} not reusable", b.addr, format::bytes(b.len_bytes)),
    }
}
