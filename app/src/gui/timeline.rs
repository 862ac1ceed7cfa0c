//! The desktop explorer's timeline: every run's series, the cursor, phase boundaries, the
//! run's marks and OOMs, with a hover that gives each series' value at the pointer's time.

use eframe::egui;
use egui_plot::{Legend, Line, Plot, PlotPoint, PlotPoints, Text, VLine};

use super::{GuiApp, col};
use crate::format;
use crate::model::update::Msg;
use crate::model::view::ViewModel;
use crate::theme;

impl GuiApp {
    pub(super) fn timeline_ui(&mut self, ui: &mut egui::Ui, vms: &[ViewModel]) {
        if let Some(o) = vms.first().and_then(|vm| vm.overview.as_ref())
            && let Some(f) = overview_strip(ui, o)
        {
            self.send(Msg::GotoTraceFraction(f));
        }
        let mut lines = Vec::new();
        // Each series' points, for the hover: the value of every series at the pointer's time.
        let mut hover_series: Vec<(String, Vec<[f64; 2]>)> = Vec::new();
        let mut verticals = Verticals::default();
        for (k, (run, vm)) in self.runs.iter().zip(vms).enumerate() {
            let Some(t) = &vm.timeline else { continue };
            let span_s = run
                .state
                .bucketing()
                .map_or(1.0, |b| b.span_ns as f64 / 1e9);
            let file = run
                .state
                .path
                .file_name()
                .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
            for l in &t.byte_lines {
                let pts: Vec<[f64; 2]> = l.points.iter().map(|&(x, y)| [x * span_s, y]).collect();
                let label = if self.runs.len() > 1 {
                    format!("{file}: {}", l.label)
                } else {
                    l.label.clone()
                };
                let mut c = col(theme::series(l.palette));
                if k > 0 {
                    c = c.gamma_multiply(0.55);
                }
                hover_series.push((label.clone(), pts.clone()));
                lines.push(
                    Line::new(label, PlotPoints::from(pts))
                        .color(c)
                        .width(if k == 0 { 1.8 } else { 1.2 }),
                );
            }
            if k == 0 {
                if t.phases.is_empty() && t.phases_in_view > 0 {
                    ui.small(format!(
                        "{} annotated phases in view, too many to mark: zoom in (Ctrl+wheel)",
                        t.phases_in_view
                    ));
                }
                verticals = Verticals::of(t, span_s);
            }
        }
        let resp = Plot::new("timeline")
            .height(ui.available_height())
            .legend(Legend::default())
            .allow_drag(false)
            .allow_boxed_zoom(false)
            .allow_zoom(true)
            .allow_scroll(true)
            .include_y(0.0)
            .x_axis_formatter(|m, _| format!("{:.3} s", m.value))
            .y_axis_formatter(|m, _| format::bytes(m.value.max(0.0) as u64))
            .label_formatter(|pos| {
                let (egui_plot::HoverPosition::NearDataPoint { position, .. }
                | egui_plot::HoverPosition::Elsewhere { position }) = pos;
                Some(timeline_hover(position.x, &hover_series))
            })
            .show(ui, |p| {
                for l in lines {
                    p.line(l);
                }
                verticals.draw(p);
            });
        let b = resp.transform.bounds();
        self.visible_s = (b.min()[0].max(0.0), b.max()[0].max(0.0));
        let r = &resp.response;
        if (r.clicked() || r.dragged_by(egui::PointerButton::Primary))
            && let Some(pos) = r.interact_pointer_pos()
        {
            let x_s = resp.transform.value_from_position(pos).x;
            self.send(Msg::GotoTime(x_s * 1e9));
        }
    }
}

/// What the timeline marks across its height, in seconds: the first run's cursor, phase
/// boundaries and marks (named at the top, `y_top_bytes`).
#[derive(Default)]
struct Verticals {
    cursor_s: Option<f64>,
    phases_s: Vec<f64>,
    marks_s: Vec<(f64, String)>,
    y_top_bytes: f64,
}

impl Verticals {
    /// Those of timeline `t`, whose window spans `span_s` seconds.
    fn of(t: &crate::model::view::TimelineVm, span_s: f64) -> Self {
        Self {
            cursor_s: t.cursor_x.map(|x| x * span_s),
            phases_s: t
                .phases
                .iter()
                .flat_map(|&(a, b, _)| [a * span_s, b * span_s])
                .collect(),
            marks_s: t
                .marks
                .iter()
                .map(|(x, n)| (x * span_s, n.clone()))
                .collect(),
            y_top_bytes: t.y_max_bytes,
        }
    }

    fn draw(&self, p: &mut egui_plot::PlotUi<'_>) {
        for &x in &self.phases_s {
            p.vline(
                VLine::new("phase boundaries", x)
                    .color(col(theme::PHASE))
                    .style(egui_plot::LineStyle::dashed_loose()),
            );
        }
        for (x, name) in &self.marks_s {
            p.vline(VLine::new("marks", *x).color(col(theme::MARK)).width(1.2));
            p.text(
                Text::new("marks", PlotPoint::new(*x, self.y_top_bytes), name.as_str())
                    .color(col(theme::MARK))
                    .anchor(egui::Align2::LEFT_TOP),
            );
        }
        if let Some(x) = self.cursor_s {
            p.vline(VLine::new("cursor", x).color(col(theme::CURSOR)).width(1.5));
        }
    }
}

/// The hover over the timeline at `t_s` seconds: the time, and each series' value there (its
/// last point at or before `t_s`; series are bucket maxima, so that is the bucket's value).
fn timeline_hover(t_s: f64, series: &[(String, Vec<[f64; 2]>)]) -> String {
    let mut text = format!("t = {}", format::seconds_fixed(t_s.max(0.0)));
    for (name, pts) in series {
        let i = pts.partition_point(|p| p[0] <= t_s);
        if let Some(p) = i.checked_sub(1).and_then(|i| pts.get(i)) {
            text.push_str(&format!(
                "\n{name}: {}",
                format::bytes(p[1].max(0.0) as u64)
            ));
        }
    }
    text
}

/// Cells of the strip above the desktop timeline.
const STRIP_CELLS: usize = 128;

/// The whole trace's strip above the timeline (the part shown highlighted), then what it is;
/// returns where in the trace a click on the strip asks to go (a fraction of it, the middle of
/// the clicked cell's stretch).
fn overview_strip(ui: &mut egui::Ui, o: &crate::model::overview::OverviewVm) -> Option<f64> {
    ui.horizontal(|ui| {
        let cells = o.cells(STRIP_CELLS);
        let mut job = egui::text::LayoutJob::default();
        let font = egui::FontId::monospace(11.0);
        for cell in cells {
            let (fg, bg) = if cell.in_part {
                (egui::Color32::BLACK, col(theme::CURSOR))
            } else {
                (col(theme::DIM), egui::Color32::TRANSPARENT)
            };
            job.append(
                &cell.glyph.to_string(),
                0.0,
                egui::TextFormat {
                    font_id: font.clone(),
                    color: fg,
                    background: bg,
                    ..Default::default()
                },
            );
        }
        let strip = ui
            .add(egui::Label::new(job).sense(egui::Sense::click()))
            .on_hover_text("click: go to that part of the whole trace");
        ui.small(&o.label);
        let at = strip.interact_pointer_pos().filter(|_| strip.clicked())?;
        let width = strip.rect.width().max(1.0);
        let cell = ((at.x - strip.rect.left()) / width * STRIP_CELLS as f32).floor();
        Some((f64::from(cell.clamp(0.0, (STRIP_CELLS - 1) as f32)) + 0.5) / STRIP_CELLS as f64)
    })
    .inner
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_hover_gives_every_series_value_at_the_time() {
        let series = vec![
            (
                "live".to_owned(),
                vec![[0.1, 100.0], [0.3, 2048.0], [0.5, 10.0]],
            ),
            (
                "bfc footprint".to_owned(),
                vec![[0.1, 4096.0], [0.3, 8192.0]],
            ),
        ];
        let text = timeline_hover(0.35, &series);
        assert_eq!(
            text,
            format!(
                "t = {}\nlive: 2.00 KiB\nbfc footprint: 8.00 KiB",
                format::seconds_fixed(0.35)
            )
        );
        // Before a series' first point it says nothing of it.
        assert_eq!(
            timeline_hover(0.05, &series),
            format!("t = {}", format::seconds_fixed(0.05))
        );
    }
}
