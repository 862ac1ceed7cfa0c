//! The terminal timeline: every run's series, fragmentation, OOMs, phases and the cursor in
//! a chart, the legend in its title, and the whole trace's strip in its bottom border.

use ratatui::Frame;
use ratatui::layout::{Alignment, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType};

use super::draw::{Areas, Y_LABEL_WIDTH, c};
use crate::model::view::ViewModel;
use crate::theme;

pub(super) fn draw_timeline(f: &mut Frame<'_>, vm: &ViewModel, a: &Areas) {
    let Some(t) = &vm.timeline else { return };
    let y_max = t.y_max_bytes.max(1.0) * 1.05;
    let frag_scaled: Vec<(f64, f64)> = t
        .fragmentation
        .as_ref()
        .map(|l| l.points.iter().map(|&(x, y)| (x, y * y_max)).collect())
        .unwrap_or_default();
    let cursor: Vec<(f64, f64)> = t
        .cursor_x
        .map(|x| (0..=40).map(|i| (x, y_max * f64::from(i) / 40.0)).collect())
        .unwrap_or_default();
    let ooms: Vec<(f64, f64)> = t.oom_x.iter().map(|&x| (x, y_max * 0.98)).collect();
    // Phase boundaries as dotted verticals.
    let phase_marks: Vec<(f64, f64)> = t
        .phases
        .iter()
        .flat_map(|&(a, b, _)| [a, b])
        .filter(|x| (0.0..=1.0).contains(x))
        .flat_map(|x| (0..=20).map(move |i| (x, y_max * f64::from(i) / 20.0)))
        .collect();
    let mut datasets = Vec::new();
    if !phase_marks.is_empty() {
        datasets.push(
            Dataset::default()
                .marker(Marker::Dot)
                .graph_type(GraphType::Scatter)
                .style(Style::new().fg(c(theme::PHASE)))
                .data(&phase_marks),
        );
    }
    if !frag_scaled.is_empty() {
        datasets.push(
            Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::new().fg(c(theme::FRAGMENTATION)))
                .data(&frag_scaled),
        );
    }
    for line in &t.byte_lines {
        datasets.push(
            Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::new().fg(c(theme::series(line.palette))))
                .data(&line.points),
        );
    }
    if !ooms.is_empty() {
        datasets.push(
            Dataset::default()
                .marker(Marker::Dot)
                .graph_type(GraphType::Scatter)
                .style(Style::new().fg(c(theme::OOM)))
                .data(&ooms),
        );
    }
    datasets.push(
        Dataset::default()
            .marker(Marker::Braille)
            .graph_type(GraphType::Scatter)
            .style(Style::new().fg(c(theme::CURSOR)))
            .data(&cursor),
    );
    let half = crate::format::bytes((t.y_max_bytes / 2.0) as u64);
    // The legend goes in the title: ratatui's legend box would cover the plot.
    let mut title = vec![Span::raw(format!(" {} ", t.title))];
    for line in &t.byte_lines {
        title.push(Span::styled(
            "━ ",
            Style::new().fg(c(theme::series(line.palette))),
        ));
        title.push(Span::raw(format!("{}  ", line.label)));
    }
    if t.fragmentation.is_some() {
        title.push(Span::styled("━ ", Style::new().fg(c(theme::FRAGMENTATION))));
        title.push(Span::raw("fragmentation (right scale, 0-100%)  "));
    }
    if !t.oom_x.is_empty() {
        title.push(Span::styled("• ", Style::new().fg(c(theme::OOM))));
        title.push(Span::raw("OOM "));
    }
    if let Some((_, _, name)) = t.phases.first() {
        title.push(Span::styled("┆ ", Style::new().fg(c(theme::PHASE))));
        title.push(Span::raw(format!(
            "phases: {} ({} in view) ",
            name,
            t.phases.len()
        )));
    } else if t.phases_in_view > 0 {
        title.push(Span::styled("┆ ", Style::new().fg(c(theme::PHASE))));
        title.push(Span::raw(format!(
            "{} phases in view, too many to mark: zoom in ",
            t.phases_in_view
        )));
    }
    let mut block = Block::bordered()
        .title(Line::from(title))
        .title_alignment(Alignment::Left)
        .title_bottom(Line::from(FRAG_NOTE).right_aligned());
    if let Some(o) = &vm.overview {
        block = block.title_bottom(overview_line(o, overview_room(a.timeline)));
    }
    let chart = Chart::new(datasets)
        .block(block)
        .x_axis(
            Axis::default()
                .bounds([0.0, 1.0])
                .labels([t.t_start_label.clone(), t.t_end_label.clone()])
                .style(Style::new().fg(c(theme::DIM))),
        )
        .y_axis(
            Axis::default()
                .bounds([0.0, y_max])
                .labels([
                    format!("{:>width$}", "0 B", width = usize::from(Y_LABEL_WIDTH)),
                    format!("{half:>width$}", width = usize::from(Y_LABEL_WIDTH)),
                    format!(
                        "{:>width$}",
                        t.y_max_label,
                        width = usize::from(Y_LABEL_WIDTH)
                    ),
                ])
                .style(Style::new().fg(c(theme::DIM))),
        )
        .legend_position(None);
    f.render_widget(chart, a.timeline);
}

/// What the timeline's bottom border says on its right.
const FRAG_NOTE: &str = " fragmentation: 100% at top ";

/// Room for the whole trace's strip and its label in the bottom border of `timeline`: left of
/// the right-hand note, inside the corners, with a gap of one.
fn overview_room(timeline: Rect) -> usize {
    usize::from(timeline.width).saturating_sub(FRAG_NOTE.chars().count() + 3)
}

/// Cells of the strip in `room`: a third of it, 8 to 64.
fn strip_width(room: usize) -> usize {
    (room / 3).clamp(8, 64)
}

/// Where the strip is drawn on screen, for a click on it: the bottom border of `timeline`,
/// after its corner and a space; nothing when the border cuts the strip short (a timeline
/// under 11 columns), as a click could not tell which stretch a cell stands for.
#[must_use]
pub(super) fn overview_strip_area(timeline: Rect) -> Rect {
    let width = u16::try_from(strip_width(overview_room(timeline))).unwrap_or(u16::MAX);
    if timeline.height == 0 || width > timeline.width.saturating_sub(3) {
        return Rect::default();
    }
    Rect {
        x: timeline.x.saturating_add(2),
        y: timeline.bottom().saturating_sub(1),
        width,
        height: 1,
    }
}

/// The whole trace's strip (the part shown in reverse) and its label, for the timeline's
/// bottom border, in `room` cells: the strip a third of them (8 to 64 cells), the label cut
/// to what is left.
fn overview_line(o: &crate::model::overview::OverviewVm, room: usize) -> Line<'static> {
    let strip_width = strip_width(room);
    let mut spans = vec![Span::raw(" ")];
    for cell in o.cells(strip_width) {
        let style = if cell.in_part {
            Style::new()
                .fg(c(theme::CURSOR))
                .add_modifier(Modifier::REVERSED)
        } else {
            Style::new().fg(c(theme::DIM))
        };
        spans.push(Span::styled(cell.glyph.to_string(), style));
    }
    let label_room = room.saturating_sub(strip_width + 3);
    let label: String = if o.label.chars().count() > label_room {
        let mut cut: String = o.label.chars().take(label_room.saturating_sub(1)).collect();
        cut.push('…');
        cut
    } else {
        o.label.clone()
    };
    spans.push(Span::raw(format!(" {label} ")));
    Line::from(spans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::overview::OverviewVm;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    /// The strip a click is looked for in is where the bottom border draws it: its cells,
    /// with the border's corner and a space before them and the label's space after.
    #[test]
    fn the_strip_area_is_where_the_strip_is_drawn() {
        for width in [40u16, 120, 300] {
            let vm = OverviewVm {
                max_live_bytes: vec![Some(7); crate::model::scan::OVERVIEW_BUCKETS],
                part: (0.0, 0.0),
                label: "label".to_owned(),
            };
            let area = Rect::new(3, 1, width, 6);
            let mut t = Terminal::new(TestBackend::new(width + 5, 8)).unwrap();
            t.draw(|f| {
                let block = Block::bordered().title_bottom(overview_line(&vm, overview_room(area)));
                f.render_widget(block, area);
            })
            .unwrap();
            let strip = overview_strip_area(area);
            let buf = t.backend().buffer();
            let symbol = |x: u16| buf[(x, strip.y)].symbol().to_owned();
            assert_eq!(strip.y, area.bottom() - 1);
            assert_eq!(symbol(strip.x - 1), " ", "width {width}");
            for x in strip.x..strip.x + strip.width {
                assert_eq!(symbol(x), "█", "width {width}, column {x}");
            }
            assert_eq!(symbol(strip.x + strip.width), " ", "width {width}");
        }
    }
}
