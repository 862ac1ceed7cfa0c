//! The terminal timeline: every run's series, fragmentation, OOMs, phases, marks and the cursor
//! in a chart, the legend in its title, and the whole trace's strip in its bottom border.

use ratatui::Frame;
use ratatui::layout::{Alignment, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType};

use super::layout::{FRAG_NOTE, Y_LABEL_WIDTH, overview_room, strip_width};
use super::style::c;
use crate::model::view::{TimelineVm, ViewModel};
use crate::theme;

/// The marks drawn over the lines, as points of the chart (its y scale tops at `y_max`):
/// the fragmentation on the byte scale, the cursor, the OOMs and the phases' boundaries.
struct Marks {
    y_max: f64,
    fragmentation: Vec<(f64, f64)>,
    cursor: Vec<(f64, f64)>,
    ooms: Vec<(f64, f64)>,
    phases: Vec<(f64, f64)>,
    /// The run's marks as verticals.
    marks: Vec<(f64, f64)>,
}

impl Marks {
    /// The marks of timeline `t`.
    fn of(t: &TimelineVm) -> Self {
        let y_max = t.y_max_bytes.max(1.0) * 1.05;
        let fragmentation = t
            .fragmentation
            .as_ref()
            .map(|l| l.points.iter().map(|&(x, y)| (x, y * y_max)).collect())
            .unwrap_or_default();
        let cursor = t
            .cursor_x
            .map(|x| (0..=40).map(|i| (x, y_max * f64::from(i) / 40.0)).collect())
            .unwrap_or_default();
        let ooms = t.oom_x.iter().map(|&x| (x, y_max * 0.98)).collect();
        // Phase boundaries as dotted verticals.
        let phases = t
            .phases
            .iter()
            .flat_map(|&(a, b, _)| [a, b])
            .filter(|x| (0.0..=1.0).contains(x))
            .flat_map(|x| (0..=20).map(move |i| (x, y_max * f64::from(i) / 20.0)))
            .collect();
        let marks = t
            .marks
            .iter()
            .flat_map(|&(x, _)| (0..=40).map(move |i| (x, y_max * f64::from(i) / 40.0)))
            .collect();
        Self {
            y_max,
            fragmentation,
            cursor,
            ooms,
            phases,
            marks,
        }
    }
}

/// Draws the timeline of `vm` in `area`.
pub(super) fn draw_timeline(f: &mut Frame<'_>, vm: &ViewModel, area: Rect) {
    let Some(t) = &vm.timeline else { return };
    let marks = Marks::of(t);
    let mut block = Block::bordered()
        .title(Line::from(legend(t)))
        .title_alignment(Alignment::Left)
        .title_bottom(Line::from(FRAG_NOTE).right_aligned());
    if let Some(o) = &vm.overview {
        block = block.title_bottom(overview_line(o, overview_room(area)));
    }
    let half = crate::format::bytes((t.y_max_bytes / 2.0) as u64);
    let chart = Chart::new(datasets(t, &marks))
        .block(block)
        .x_axis(
            Axis::default()
                .bounds([0.0, 1.0])
                .labels([t.t_start_label.clone(), t.t_end_label.clone()])
                .style(Style::new().fg(c(theme::DIM))),
        )
        .y_axis(
            Axis::default()
                .bounds([0.0, marks.y_max])
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
    f.render_widget(chart, area);
}

/// The chart's datasets, bottom to top: the phases, the fragmentation, the byte lines, the
/// OOMs and the cursor.
fn datasets<'a>(t: &'a TimelineVm, m: &'a Marks) -> Vec<Dataset<'a>> {
    let mut datasets = Vec::new();
    if !m.phases.is_empty() {
        datasets.push(
            Dataset::default()
                .marker(Marker::Dot)
                .graph_type(GraphType::Scatter)
                .style(Style::new().fg(c(theme::PHASE)))
                .data(&m.phases),
        );
    }
    if !m.fragmentation.is_empty() {
        datasets.push(
            Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::new().fg(c(theme::FRAGMENTATION)))
                .data(&m.fragmentation),
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
    if !m.marks.is_empty() {
        datasets.push(
            Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Scatter)
                .style(Style::new().fg(c(theme::MARK)))
                .data(&m.marks),
        );
    }
    if !m.ooms.is_empty() {
        datasets.push(
            Dataset::default()
                .marker(Marker::Dot)
                .graph_type(GraphType::Scatter)
                .style(Style::new().fg(c(theme::OOM)))
                .data(&m.ooms),
        );
    }
    datasets.push(
        Dataset::default()
            .marker(Marker::Braille)
            .graph_type(GraphType::Scatter)
            .style(Style::new().fg(c(theme::CURSOR)))
            .data(&m.cursor),
    );
    datasets
}

/// The title with the legend in it: ratatui's legend box would cover the plot.
fn legend(t: &TimelineVm) -> Vec<Span<'static>> {
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
    if !t.marks.is_empty() {
        title.push(Span::styled("│ ", Style::new().fg(c(theme::MARK))));
        title.push(Span::raw(format!("{} ", marks_label(&t.marks))));
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
    title
}

/// The marks in view, by name in time order (`recording stopped` and `started` too), at most
/// three named and the rest counted, so that the legend keeps its room for the lines.
fn marks_label(marks: &[(f64, String)]) -> String {
    let named: Vec<&str> = marks.iter().take(3).map(|(_, n)| n.as_str()).collect();
    let rest = marks.len().saturating_sub(named.len());
    let mut label = format!("marks: {}", named.join(", "));
    if rest > 0 {
        label.push_str(&format!(" and {rest} more"));
    }
    label
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
    use crate::tui::layout::overview_strip_area;
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
