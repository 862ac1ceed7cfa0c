//! The theme's colours on a terminal, and the heap map's cells as characters and styles.

use ratatui::style::{Color, Style};

use crate::model::export::cell_char;
use crate::model::heapmap::CellKind;
use crate::theme::{self, Rgb};

/// A theme colour as the terminal's.
pub(super) fn c(rgb: Rgb) -> Color {
    Color::Rgb(rgb.0, rgb.1, rgb.2)
}

/// A heap map cell: the character drawn and its colours.
pub(super) fn cell_style(k: CellKind) -> (char, Style) {
    match k {
        CellKind::Empty => (' ', Style::new()),
        CellKind::Selected => ('#', Style::new().fg(Color::Black).bg(c(theme::SELECTED))),
        CellKind::Free => ('·', Style::new().fg(c(theme::DIM)).bg(c(theme::FREE))),
        CellKind::Dead => ('x', Style::new().fg(c(theme::DIM)).bg(c(theme::DEAD))),
        CellKind::Waste => ('~', Style::new().fg(Color::Black).bg(c(theme::WASTE))),
        CellKind::Used { class } => (
            cell_char(k),
            Style::new().fg(Color::Black).bg(c(theme::class(class))),
        ),
    }
}
