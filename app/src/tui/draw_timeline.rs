//! The terminal timeline: every run's series, fragmentation, OOMs, phases and the cursor in
//! a chart, the legend in its title, and the whole trace's strip in its bottom border.

use ratatui::Frame;
use ratatui::layout::Alignment;
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
        // Room left of the right-hand note, inside the corners, with a gap of one.
        let room = usize::from(a.timeline.width).saturating_sub(FRAG_NOTE.chars().count() + 3);
        block = block.title_bottom(overview_line(o, room));
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

/// The whole trace's strip (the part shown in reverse) and its label, for the timeline's
/// bottom border, in `room` cells: the strip a third of them (8 to 64 cells), the label cut
/// to what is left.
fn overview_line(o: &crate::model::overview::OverviewVm, room: usize) -> Line<'static> {
    let strip_width = (room / 3).clamp(8, 64);
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
