//! The desktop explorer's side and bottom panels: the size-class histogram or the sites
//! panel, the BFC bins, the event list and the live bytes by request size over time.

use eframe::egui::{self, Color32, ColorImage, TextureHandle, TextureOptions};
use egui_plot::{Bar, BarChart, Plot};

use super::{GuiApp, col};
use crate::format;
use crate::model::update::Msg;
use crate::model::view::{HeatmapVm, ViewModel};
use crate::theme;

impl GuiApp {
    pub(super) fn side_ui(&mut self, ui: &mut egui::Ui, vm: &ViewModel) {
        if let Some(s) = &vm.sites {
            let mut picked = None;
            ui.strong(&s.title);
            egui::ScrollArea::vertical()
                .id_salt("sites")
                .max_height(ui.available_height() * 0.6)
                .show(ui, |ui| {
                    egui::Grid::new("sites").striped(true).show(ui, |ui| {
                        for h in ["live", "blocks", "allocs", "site"] {
                            ui.strong(h);
                        }
                        ui.end_row();
                        for r in &s.rows {
                            ui.label(&r.live_label);
                            ui.label(format::count(r.blocks));
                            ui.label(format::count(r.allocs));
                            if ui.selectable_label(r.selected, &r.name).clicked() {
                                picked = Some(r.index);
                            }
                            ui.end_row();
                        }
                    });
                });
            ui.separator();
            for f in &s.frames {
                ui.monospace(f);
            }
            if let Some(i) = picked {
                self.send(Msg::SelectSite(i));
            }
            return;
        }
        if vm.classes.is_empty() {
            // A dump has no allocation sizes to class, only its bins.
            self.bins_ui(ui, vm);
            return;
        }
        ui.strong("live by size class at the cursor");
        let bars: Vec<Bar> = vm
            .classes
            .iter()
            .map(|r| {
                Bar::new(f64::from(r.class), r.bytes as f64)
                    .name(format!(
                        "class {} ({}): {} live, {}",
                        r.class, r.range, r.count, r.bytes_label
                    ))
                    .fill(col(theme::class(r.class)))
            })
            .collect();
        Plot::new("classes")
            .height(ui.available_height() * if vm.bins.is_some() { 0.45 } else { 1.0 })
            .allow_drag(false)
            .allow_zoom(false)
            .allow_scroll(false)
            .x_axis_formatter(|m, _| {
                if m.value.fract() == 0.0 {
                    format!("class {}", m.value as i64)
                } else {
                    String::new()
                }
            })
            .y_axis_formatter(|m, _| format::bytes(m.value.max(0.0) as u64))
            .include_y(0.0)
            .show(ui, |p| {
                p.bar_chart(BarChart::new("live bytes by class", bars))
            });
        self.bins_ui(ui, vm);
    }

    fn bins_ui(&mut self, ui: &mut egui::Ui, vm: &ViewModel) {
        if let Some(bins) = &vm.bins {
            ui.separator();
            ui.strong("BFC bins");
            egui::ScrollArea::vertical().id_salt("bins").show(ui, |ui| {
                egui::Grid::new("bins").striped(true).show(ui, |ui| {
                    for h in ["bin", "size", "free", "free bytes", "largest", "in use"] {
                        ui.strong(h);
                    }
                    ui.end_row();
                    for b in bins {
                        ui.label(b.bin.to_string()).on_hover_text(format!(
                            "bin {}: free chunks of at least {} (the next bin starts at twice \
                             that); {} free, {} in all, the largest {}; {} chunks of this size \
                             class in use",
                            b.bin,
                            b.size_label,
                            b.free_chunks,
                            b.free_bytes_label,
                            b.largest_label,
                            b.in_use_chunks
                        ));
                        ui.label(&b.size_label);
                        ui.label(b.free_chunks.to_string());
                        ui.label(&b.free_bytes_label);
                        ui.label(&b.largest_label);
                        ui.label(b.in_use_chunks.to_string());
                        ui.end_row();
                    }
                });
            });
        }
    }

    /// Under the heap map: the event list, and beside it the size classes over time, or a
    /// snapshot's state and the frames of the cursor's allocation.
    pub(super) fn bottom_ui(&mut self, ui: &mut egui::Ui, vm: &ViewModel) {
        ui.columns(2, |cols| {
            if let Some(c) = cols.get_mut(0) {
                events_ui(c, vm);
            }
            // A snapshot: its state and the frames of the cursor's allocation take the place
            // of the class heatmap (the histogram beside the heap map keeps the classes).
            if let Some(c) = cols.get_mut(1)
                && !vm.frames_title.is_empty()
            {
                frames_ui(c, vm);
                return;
            }
            if let Some(c) = cols.get_mut(1) {
                c.strong("live bytes by request size over time (brighter = more, log scale)");
                if let Some(h) = &vm.heatmap {
                    self.heat_texture = Some(heatmap_ui(c, h));
                }
            }
        });
    }
}

/// The event list around the cursor, the cursor's row and the OOMs coloured.
fn events_ui(c: &mut egui::Ui, vm: &ViewModel) {
    c.strong(&vm.events_title);
    // A wide row (a TensorFlow op name) scrolls instead of running into the heatmap.
    egui::ScrollArea::horizontal()
        .id_salt("events")
        .show(c, |c| {
            egui::Grid::new("events").striped(true).show(c, |ui| {
                for h in [
                    "event", "time", "thread", "kind", "size", "address", "alloc id",
                ] {
                    ui.strong(h);
                }
                if vm.has_ops {
                    ui.strong("op");
                }
                ui.end_row();
                for e in &vm.events {
                    let color = if e.is_cursor {
                        col(theme::CURSOR)
                    } else if e.is_oom {
                        col(theme::OOM)
                    } else {
                        ui.visuals().text_color()
                    };
                    for text in [
                        format::count(e.index as u64),
                        e.time.clone(),
                        e.thread.to_string(),
                        e.kind.to_owned(),
                        e.size.clone(),
                        e.address.clone(),
                        e.alloc_id.clone(),
                    ] {
                        ui.colored_label(color, text);
                    }
                    if vm.has_ops {
                        ui.colored_label(color, e.op.clone().unwrap_or_default());
                    }
                    ui.end_row();
                }
            });
        });
}

/// A snapshot's state, then the frames of the cursor's allocation.
fn frames_ui(c: &mut egui::Ui, vm: &ViewModel) {
    for l in &vm.dump_lines {
        c.small(l);
    }
    c.strong(&vm.frames_title);
    egui::ScrollArea::vertical()
        .id_salt("frames")
        .show(c, |ui| {
            for f in &vm.frames {
                ui.monospace(f);
            }
        });
}

/// The size classes over time as a picture, the cursor's column marked, with the classes
/// beside it and the times below; returns its texture, for the app to keep alive.
fn heatmap_ui(c: &mut egui::Ui, h: &HeatmapVm) -> TextureHandle {
    let w = h.cells.first().map_or(0, Vec::len).max(1);
    let rows = h.classes.len().max(1);
    let mut px = Vec::with_capacity(w * rows);
    for r in 0..rows {
        for x in 0..w {
            let v = h
                .cells
                .get(r)
                .and_then(|row| row.get(x))
                .copied()
                .unwrap_or(0.0);
            px.push(if Some(x) == h.cursor_col {
                col(theme::CURSOR)
            } else {
                col(theme::heat(v))
            });
        }
    }
    let tex = c.ctx().load_texture(
        "heat",
        ColorImage::new([w, rows], px),
        TextureOptions::NEAREST,
    );
    let size = c.available_size();
    // Room for the time axis below and the class labels beside.
    let (label_w, axis_h) = (52.0, 18.0);
    let img_h = (size.y - 8.0 - axis_h).max(8.0);
    let (_, area) = c.allocate_space(egui::vec2(size.x, img_h));
    let img = egui::Rect::from_min_size(
        area.min + egui::vec2(label_w, 0.0),
        egui::vec2((size.x - label_w - 12.0).max(8.0), img_h),
    );
    let uv = egui::Rect::from_min_max(egui::pos2(0.0, 0.0), egui::pos2(1.0, 1.0));
    c.painter().image(tex.id(), img, uv, Color32::WHITE);
    // Labels painted, not laid out (they must not grow the panel), every
    // k-th row when the rows are too thin for all of them.
    let row_h = img_h / rows as f32;
    let every = (12.0 / row_h).ceil().max(1.0) as usize;
    let text = c.visuals().text_color();
    for (r, &class) in h.classes.iter().enumerate().step_by(every) {
        c.painter().text(
            egui::pos2(img.left() - 4.0, img.top() + row_h * (r as f32 + 0.5)),
            egui::Align2::RIGHT_CENTER,
            class_label(class),
            egui::FontId::proportional(10.0),
            text,
        );
    }
    c.horizontal(|ui| {
        ui.add_space(label_w + 8.0);
        ui.small(&h.time_from);
        ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
            ui.small(&h.time_to);
            ui.small("time since the start");
        });
    });
    tex
}

/// A size class as the smallest request it holds (class `c`: `2^(c-1)` to `2^c - 1` bytes).
fn class_label(class: u8) -> String {
    match class {
        0 => "0 B".to_owned(),
        c => format!("≥{}", format::bytes_compact(1u64 << (c - 1).min(63))),
    }
}
