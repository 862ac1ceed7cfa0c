//! Where each part of the terminal explorer goes on the screen, and the geometry the
//! view-model is computed for; the drawing follows it ([`super::draw`]).

use ratatui::layout::{Constraint, Layout, Rect};

use crate::model::view::Viewport;

/// Where each part goes on a screen of `area`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Areas {
    pub timeline: Rect,
    /// The plot inside the timeline's border and axes, for mouse scrubbing.
    pub timeline_plot: Rect,
    /// The whole trace's strip in the timeline's bottom border (drawn for a trace shown in
    /// parts), for a click to go there.
    pub overview_strip: Rect,
    pub heap: Rect,
    pub side: Rect,
    pub events: Rect,
    pub heat: Rect,
    pub status: Rect,
}

/// Width of the BFC bins table with its border.
pub(super) const BINS_WIDTH: u16 = 42;

/// Width of the timeline's y-axis labels (the plot starts after it).
pub(super) const Y_LABEL_WIDTH: u16 = 10;

/// Splits the screen. Degrades on small terminals: below a minimum the parts shrink to nothing
/// rather than overlap. `dump_lines`: the screen is a BFC dump with this many rows of text,
/// which has no history: its text box fits the text, and its heap and bins take the rest (no
/// empty event list or class history).
#[must_use]
pub fn layout(area: Rect, compare: bool, dump_lines: Option<usize>) -> Areas {
    let [main, status] = Layout::vertical([Constraint::Min(0), Constraint::Length(1)]).areas(area);
    let [timeline, middle, bottom] = match dump_lines {
        Some(n) => {
            // Borders and a line for wrapping, at most a third of the screen.
            let text = u16::try_from(n + 3)
                .unwrap_or(u16::MAX)
                .min(main.height / 3);
            Layout::vertical([
                Constraint::Length(text),
                Constraint::Min(0),
                Constraint::Length(0),
            ])
            .areas(main)
        }
        None => Layout::vertical([
            Constraint::Percentage(34),
            Constraint::Percentage(36),
            Constraint::Min(0),
        ])
        .areas(main),
    };
    let (heap, side) = if compare {
        (middle, Rect::default())
    } else {
        // A dump's side holds only its bins table.
        let side = match dump_lines {
            Some(_) => Constraint::Length(BINS_WIDTH),
            None => Constraint::Percentage(45),
        };
        let [h, s] = Layout::horizontal([Constraint::Min(0), side]).areas(middle);
        (h, s)
    };
    let [events, heat] =
        Layout::horizontal([Constraint::Percentage(60), Constraint::Min(0)]).areas(bottom);
    let inner = timeline.inner(ratatui::layout::Margin::new(1, 1));
    let timeline_plot = Rect {
        x: inner.x.saturating_add(Y_LABEL_WIDTH + 1).min(inner.right()),
        y: inner.y,
        width: inner.width.saturating_sub(Y_LABEL_WIDTH + 1),
        height: inner.height.saturating_sub(2),
    };
    Areas {
        timeline,
        timeline_plot,
        overview_strip: overview_strip_area(timeline),
        heap,
        side,
        events,
        heat,
        status,
    }
}

/// The geometry the view-model is computed for.
#[must_use]
pub fn viewport(a: &Areas, compare: bool, panels: usize) -> Viewport {
    let heap_inner = a.heap.inner(ratatui::layout::Margin::new(1, 1));
    let per_panel_width = if compare && panels > 0 {
        (heap_inner.width / panels as u16).saturating_sub(1)
    } else {
        heap_inner.width
    };
    Viewport {
        // Braille gives two points per cell.
        timeline_points: usize::from(a.timeline_plot.width) * 2,
        heap_cells: usize::from(per_panel_width) * usize::from(heap_inner.height.saturating_sub(2)),
        event_rows: usize::from(a.events.height.saturating_sub(3)),
        heat_columns: usize::from(a.heat.width.saturating_sub(6)),
        plan_size: {
            let r = plan_rects(a).1;
            (
                usize::from(r.width.saturating_sub(2)),
                usize::from(r.height.saturating_sub(3)),
            )
        },
    }
}

/// For a plan: a short text box on top, the picture below it over the rest of the screen.
pub(super) fn plan_rects(a: &Areas) -> (Rect, Rect) {
    let top = a.timeline.y;
    let bottom = a.status.y;
    let text_h = 7.min(bottom.saturating_sub(top));
    let text = Rect {
        height: text_h,
        ..a.timeline
    };
    let picture = Rect {
        x: a.timeline.x,
        y: top + text_h,
        width: a.timeline.width,
        height: bottom.saturating_sub(top + text_h),
    };
    (text, picture)
}

/// What the timeline's bottom border says on its right.
pub(super) const FRAG_NOTE: &str = " fragmentation: 100% at top ";

/// Room for the whole trace's strip and its label in the bottom border of `timeline`: left of
/// the right-hand note, inside the corners, with a gap of one.
pub(super) fn overview_room(timeline: Rect) -> usize {
    usize::from(timeline.width).saturating_sub(FRAG_NOTE.chars().count() + 3)
}

/// Cells of the strip in `room`: a third of it, 8 to 64.
pub(super) fn strip_width(room: usize) -> usize {
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
