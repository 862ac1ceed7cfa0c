//! The plan picture of the desktop explorer: every buffer a rectangle (time across, address
//! up) in colours that tell neighbours apart, axes in the plan's own units, the lower bound as a
//! line, and a hover that names the buffer under the pointer.

use eframe::egui::{self, Color32, ColorImage, TextureOptions};

use super::col;
use crate::format;
use crate::model::plan_view::PlanCell;
use crate::model::state::AppState;
use crate::model::view::{PlanVm, plan_hover};
use crate::theme;

/// Room for the address labels on the left and the time labels below.
const LEFT_PX: f32 = 72.0;
const BOTTOM_PX: f32 = 34.0;
/// Room above the picture for the address axis's title.
const TOP_PX: f32 = 14.0;
/// Ticks on each axis.
const TICKS: usize = 6;

pub(super) fn plan_ui(ui: &mut egui::Ui, p: &PlanVm, state: Option<&AppState>) {
    let g = &p.grid;
    ui.strong(&p.title);
    let px: Vec<Color32> = g
        .cells
        .iter()
        .map(|c| match c {
            PlanCell::Buffer { index, .. } => col(theme::distinct(*index)),
            PlanCell::Empty => col(theme::FREE),
        })
        .collect();
    let tex = ui.ctx().load_texture(
        "plan",
        ColorImage::new([g.width, g.height], px),
        TextureOptions::NEAREST,
    );
    let avail = ui.available_size() - egui::vec2(LEFT_PX, BOTTOM_PX + TOP_PX + 20.0);
    let (id, frame) = ui.allocate_space(avail + egui::vec2(LEFT_PX, BOTTOM_PX + TOP_PX));
    let rect = egui::Rect::from_min_size(frame.min + egui::vec2(LEFT_PX, TOP_PX), avail);
    let uv = egui::Rect::from_min_max(egui::pos2(0.0, 0.0), egui::pos2(1.0, 1.0));
    ui.painter().image(tex.id(), rect, uv, Color32::WHITE);
    let resp = ui.interact(rect, id, egui::Sense::hover());
    axes(ui, p, rect);
    let y = rect.top() + rect.height() * (g.lower_bound_row as f32 + 0.5) / g.height.max(1) as f32;
    ui.painter().hline(
        rect.x_range(),
        y,
        egui::Stroke::new(2.0, col(theme::CURSOR)),
    );
    if let (Some(pos), Some(state)) = (resp.hover_pos(), state) {
        let rel = pos - rect.min;
        let c = (rel.x / rect.width() * g.width as f32) as usize;
        let r = (rel.y / rect.height() * g.height as f32) as usize;
        if let Some(text) = plan_hover(state, p, c.min(g.width - 1), r.min(g.height - 1)) {
            resp.on_hover_text(text);
        }
    }
    ui.small(format!(
        "yellow line: the lower bound (most bytes live at once) {}; one colour per buffer; hover \
         a buffer for its size, lifetime and offset",
        format::bytes(g.lower_bound_bytes),
    ));
}

/// Address ticks on the left, time ticks below, and the axis titles.
fn axes(ui: &egui::Ui, p: &PlanVm, rect: egui::Rect) {
    let g = &p.grid;
    let painter = ui.painter();
    let font = egui::FontId::proportional(11.0);
    let text = ui.visuals().text_color();
    let tick = egui::Stroke::new(1.0, col(theme::DIM));
    for i in 0..=TICKS {
        let f = i as f32 / TICKS as f32;
        // Addresses: 0 at the bottom, the picture's top address at the top.
        let y = rect.bottom() - f * rect.height();
        let bytes = (g.top_bytes as f64 * f64::from(f)) as u64;
        painter.hline(rect.left() - 4.0..=rect.left(), y, tick);
        painter.text(
            egui::pos2(rect.left() - 6.0, y),
            egui::Align2::RIGHT_CENTER,
            format::bytes(bytes),
            font.clone(),
            text,
        );
        let x = rect.left() + f * rect.width();
        let t = g.time_start as f64 + (g.time_end - g.time_start) as f64 * f64::from(f);
        painter.vline(x, rect.bottom()..=rect.bottom() + 4.0, tick);
        let align = match i {
            0 => egui::Align2::LEFT_TOP,
            i if i == TICKS => egui::Align2::RIGHT_TOP,
            _ => egui::Align2::CENTER_TOP,
        };
        painter.text(
            egui::pos2(x, rect.bottom() + 5.0),
            align,
            format!("{t:.0}"),
            font.clone(),
            text,
        );
    }
    painter.text(
        egui::pos2(rect.center().x, rect.bottom() + 19.0),
        egui::Align2::CENTER_TOP,
        format!("time ({}s)", p.time_unit),
        font.clone(),
        text,
    );
    painter.text(
        egui::pos2(rect.left() - LEFT_PX, rect.top() - TOP_PX),
        egui::Align2::LEFT_TOP,
        "offset (address in the pool)",
        font,
        text,
    );
}
