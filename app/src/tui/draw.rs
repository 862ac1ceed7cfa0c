//! Drawing a [`ViewModel`] with ratatui. Pure: the same view-model draws the same screen.
//! Where each part goes is [`super::layout`]'s.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Clear, Gauge, Paragraph, Row, Table};

use super::draw_timeline::draw_timeline;
use super::layout::{Areas, BINS_WIDTH, plan_rects};
use super::style::{c, cell_style};
use crate::model::view::{HeapVm, PlanVm, SitesVm, ViewModel};
use crate::theme;

/// Draws the whole screen.
pub fn draw(f: &mut Frame<'_>, vm: &ViewModel, a: &Areas) {
    let area = f.area();
    if draw_notice(f, vm, area) {
        return;
    }
    if let Some(p) = &vm.plan {
        draw_plan(f, p, a);
        draw_status(f, vm, a.status);
        if let Some(help) = &vm.help {
            draw_help(f, help, area);
        }
        return;
    }
    if vm.timeline.is_some() {
        draw_timeline(f, vm, a.timeline);
    } else {
        draw_dump_text(f, vm, a.timeline);
    }
    draw_heaps(f, vm, a.heap);
    draw_side(f, vm, a.side);
    if a.events.height > 0 {
        draw_events(f, vm, a.events);
        if vm.frames_title.is_empty() {
            draw_heatmap(f, vm, a.heat);
        } else {
            draw_frames(f, vm, a.heat);
        }
    }
    draw_status(f, vm, a.status);
    if let Some(help) = &vm.help {
        draw_help(f, help, area);
    }
}

/// Draws what takes the whole screen in place of the explorer, if anything does: a terminal
/// too small, the load's error, or the load's progress. True when it drew one.
fn draw_notice(f: &mut Frame<'_>, vm: &ViewModel, area: Rect) -> bool {
    if area.width < 20 || area.height < 6 {
        f.render_widget(
            Paragraph::new("allocview: terminal too small").style(Style::new().fg(c(theme::DIM))),
            area,
        );
        return true;
    }
    if let Some(err) = &vm.error {
        let p = Paragraph::new(vec![
            Line::from(Span::styled(
                "could not load the trace",
                Style::new().fg(c(theme::OOM)),
            )),
            Line::from(err.as_str()),
            Line::from(""),
            Line::from("press q to quit"),
        ])
        .wrap(ratatui::widgets::Wrap { trim: false })
        .block(Block::bordered().title(" allocview "));
        f.render_widget(p, area);
        return true;
    }
    if let Some((label, frac)) = &vm.loading {
        let [_, mid, _] = Layout::vertical([
            Constraint::Percentage(45),
            Constraint::Length(3),
            Constraint::Min(0),
        ])
        .areas(area);
        f.render_widget(
            Gauge::default()
                .block(Block::bordered().title(" allocview "))
                .gauge_style(Style::new().fg(c(theme::series(1))))
                .ratio(frac.clamp(0.0, 1.0))
                .label(label.as_str()),
            mid,
        );
        return true;
    }
    false
}

/// A BFC dump's text in the timeline's place (a dump has no history): the OOM first, in bold.
fn draw_dump_text(f: &mut Frame<'_>, vm: &ViewModel, area: Rect) {
    let lines: Vec<Line<'_>> = vm
        .dump_lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let style = if i == 0 {
                Style::new().fg(c(theme::OOM)).add_modifier(Modifier::BOLD)
            } else {
                Style::new()
            };
            Line::from(Span::styled(l.as_str(), style))
        })
        .collect();
    f.render_widget(
        Paragraph::new(lines)
            .wrap(ratatui::widgets::Wrap { trim: true })
            .block(Block::bordered().title(" TensorFlow BFC dump ")),
        area,
    );
}

/// The side of the heap map: the sites panel when open, else the bins and the size-class
/// histogram (the bins alone for a dump); nothing in compare mode.
fn draw_side(f: &mut Frame<'_>, vm: &ViewModel, side: Rect) {
    if let Some(sites) = &vm.sites {
        draw_sites(f, sites, side);
    } else if !vm.compare {
        if vm.bins.is_some() && vm.classes.is_empty() {
            // A dump: no allocation sizes to class, the bins take the side.
            draw_bins(f, vm, side);
        } else if vm.bins.is_some() {
            let [bins, hist] =
                Layout::horizontal([Constraint::Length(BINS_WIDTH - 2), Constraint::Min(0)])
                    .areas(side);
            draw_bins(f, vm, bins);
            draw_histogram(f, vm, hist);
        } else {
            draw_histogram(f, vm, side);
        }
    }
}

fn draw_plan(f: &mut Frame<'_>, p: &PlanVm, a: &Areas) {
    use crate::model::plan_view::PlanCell;
    let g = &p.grid;
    let mut lines: Vec<Line<'_>> = Vec::with_capacity(g.height + 1);
    for row in 0..g.height {
        let on_bound = row == g.lower_bound_row;
        let spans: Vec<Span<'_>> = (0..g.width)
            .map(|col| match g.cell(col, row) {
                Some(PlanCell::Buffer { class, index }) => {
                    // Alternate shades tell neighbouring buffers of one size class apart.
                    let bg = if index % 2 == 1 {
                        theme::shade(theme::class(class))
                    } else {
                        theme::class(class)
                    };
                    Span::styled(
                        if on_bound { "─" } else { " " },
                        Style::new().fg(c(theme::CURSOR)).bg(c(bg)),
                    )
                }
                _ if on_bound => Span::styled("─", Style::new().fg(c(theme::CURSOR))),
                _ => Span::raw(" "),
            })
            .collect();
        lines.push(Line::from(spans));
    }
    lines.push(Line::from(Span::styled(
        format!(
            "─ lower bound {}   top {}   time {}..{}",
            crate::format::bytes(g.lower_bound_bytes),
            crate::format::bytes(g.top_bytes),
            g.time_start,
            g.time_end
        ),
        Style::new().fg(c(theme::CURSOR)),
    )));
    let (text, area) = plan_rects(a);
    f.render_widget(
        Paragraph::new(
            p.lines
                .iter()
                .map(|l| Line::from(l.as_str()))
                .collect::<Vec<_>>(),
        )
        .block(Block::bordered().title(" memory plan ")),
        text,
    );
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(format!(" {} ", p.title))),
        area,
    );
}

fn heap_lines(h: &HeapVm, width: u16, height: u16) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    if let Some(note) = &h.note {
        lines.push(Line::from(Span::styled(
            note.clone(),
            Style::new().fg(c(theme::DIM)),
        )));
        return lines;
    }
    let Some(map) = &h.map else { return lines };
    let w = usize::from(width.max(1));
    for row in map
        .cells
        .chunks(w)
        .take(usize::from(height.saturating_sub(2)))
    {
        let spans: Vec<Span<'static>> = row
            .iter()
            .map(|&k| {
                let (ch, st) = cell_style(k);
                Span::styled(ch.to_string(), st)
            })
            .collect();
        lines.push(Line::from(spans));
    }
    lines.push(Line::from(Span::styled(
        h.caption.clone(),
        Style::new().fg(c(theme::DIM)),
    )));
    lines.push(Line::from(vec![
        Span::styled(" · ", Style::new().bg(c(theme::FREE))),
        Span::raw(" free "),
        Span::styled(" ~ ", Style::new().fg(Color::Black).bg(c(theme::WASTE))),
        Span::raw(" waste "),
        Span::styled(" 5 ", Style::new().fg(Color::Black).bg(c(theme::class(5)))),
        Span::styled(" a ", Style::new().fg(Color::Black).bg(c(theme::class(10)))),
        Span::styled(" k ", Style::new().fg(Color::Black).bg(c(theme::class(20)))),
        Span::raw(format!(
            " live by size class (digit/letter = class)  1 cell = {}",
            crate::format::bytes(map.bytes_per_cell)
        )),
    ]));
    lines
}

fn draw_heaps(f: &mut Frame<'_>, vm: &ViewModel, area: Rect) {
    if vm.heaps.is_empty() {
        return;
    }
    let constraints: Vec<Constraint> = vm
        .heaps
        .iter()
        .map(|_| Constraint::Ratio(1, vm.heaps.len() as u32))
        .collect();
    let parts = Layout::horizontal(constraints).split(area);
    for (h, part) in vm.heaps.iter().zip(parts.iter()) {
        let block = Block::bordered().title(format!(" heap: {} ", h.policy));
        let inner = block.inner(*part);
        let mut lines = heap_lines(h, inner.width, inner.height);
        if vm.compare {
            // In the side-by-side view the legend would not fit each panel.
            lines.truncate(usize::from(inner.height));
        }
        f.render_widget(Paragraph::new(lines).block(block), *part);
    }
}

fn draw_bins(f: &mut Frame<'_>, vm: &ViewModel, area: Rect) {
    let Some(bins) = &vm.bins else { return };
    let rows = bins.iter().map(|b| {
        let style = if b.free_chunks > 0 {
            Style::new()
        } else {
            Style::new().fg(c(theme::DIM))
        };
        Row::new(vec![
            Cell::from(b.bin.to_string()),
            Cell::from(b.size_label.clone()),
            Cell::from(b.free_chunks.to_string()),
            Cell::from(b.free_bytes_label.clone()),
            Cell::from(b.largest_label.clone()),
            Cell::from(b.in_use_chunks.to_string()),
        ])
        .style(style)
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(3),
            Constraint::Length(5),
            Constraint::Length(4),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(5),
        ],
    )
    .header(
        Row::new(["bin", "size", "free", "free B", "largest", "used"])
            .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .block(Block::bordered().title(" BFC bins "));
    f.render_widget(table, area);
}

fn draw_histogram(f: &mut Frame<'_>, vm: &ViewModel, area: Rect) {
    let block = Block::bordered().title(" live by size class at the cursor ");
    let inner = block.inner(area);
    let bar_width = usize::from(inner.width.saturating_sub(38));
    let mut lines = vec![Line::from(Span::styled(
        format!("{:>3} {:>17} {:>8} {:>9}", "cls", "sizes", "live", "bytes"),
        Style::new().add_modifier(Modifier::BOLD),
    ))];
    for r in &vm.classes {
        let n = (r.bar * bar_width as f64).round() as usize;
        lines.push(Line::from(vec![
            Span::raw(format!(
                "{:>3} {:>17} {:>8} {:>9} ",
                r.class,
                r.range,
                crate::format::count(r.count),
                r.bytes_label
            )),
            Span::styled("█".repeat(n), Style::new().fg(c(theme::class(r.class)))),
        ]));
    }
    f.render_widget(Paragraph::new(lines).block(block), area);
}

/// The sites panel in place of the side panel: sites by live bytes, the selected one's stack.
fn draw_sites(f: &mut Frame<'_>, s: &SitesVm, area: Rect) {
    let mut lines: Vec<Line<'_>> = s
        .rows
        .iter()
        .map(|r| {
            let style = if r.selected {
                Style::new().fg(Color::Black).bg(c(theme::SELECTED))
            } else {
                Style::new()
            };
            Line::from(Span::styled(
                format!(
                    "{:>10} {:>6} {:>7}  {}",
                    r.live_label, r.blocks, r.allocs, r.name
                ),
                style,
            ))
        })
        .collect();
    lines.insert(
        0,
        Line::from(Span::styled(
            format!(
                "{:>10} {:>6} {:>7}  site  (< > select, s close)",
                "live", "blocks", "allocs"
            ),
            Style::new().add_modifier(Modifier::BOLD),
        )),
    );
    lines.extend(
        s.frames
            .iter()
            .map(|l| Line::from(Span::styled(l.as_str(), Style::new().fg(c(theme::DIM))))),
    );
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(format!(" {} ", s.title))),
        area,
    );
}

/// A PyTorch snapshot: what it says at its moment, then the frames of the cursor's
/// allocation.
fn draw_frames(f: &mut Frame<'_>, vm: &ViewModel, area: Rect) {
    let mut lines: Vec<Line<'_>> = vm
        .dump_lines
        .iter()
        .map(|l| Line::from(Span::styled(l.as_str(), Style::new().fg(c(theme::DIM)))))
        .collect();
    lines.extend(vm.frames.iter().map(|l| Line::from(l.as_str())));
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(format!(" {} ", vm.frames_title))),
        area,
    );
}

fn draw_heatmap(f: &mut Frame<'_>, vm: &ViewModel, area: Rect) {
    let block = Block::bordered().title(" size classes over time (live bytes) ");
    let inner = block.inner(area);
    let Some(h) = &vm.heatmap else {
        f.render_widget(block, area);
        return;
    };
    let rows = usize::from(inner.height);
    // Too many classes for the height: show the top ones (largest classes first).
    let lines: Vec<Line<'_>> = h
        .classes
        .iter()
        .zip(&h.cells)
        .take(rows)
        .map(|(class, cells)| {
            let mut spans = vec![Span::styled(
                format!("{class:>3} "),
                Style::new().fg(c(theme::DIM)),
            )];
            for (i, &v) in cells.iter().enumerate() {
                let ch = if Some(i) == h.cursor_col { "│" } else { " " };
                let mut st = Style::new().bg(c(theme::heat(v)));
                if Some(i) == h.cursor_col {
                    st = st.fg(c(theme::CURSOR));
                }
                spans.push(Span::styled(ch, st));
            }
            Line::from(spans)
        })
        .collect();
    f.render_widget(Paragraph::new(lines).block(block), area);
}

/// The event list's columns, most important first: a narrow list drops from the end of this
/// order (address, then thread, then time) rather than squeezing every column to a stub.
const EVENT_COLUMNS: [(&str, u16); 7] = [
    ("event", 11),
    ("kind", 12),
    ("size", 12),
    ("alloc id", 9),
    ("time", 13),
    ("thr", 3),
    ("address", 16),
];

fn draw_events(f: &mut Frame<'_>, vm: &ViewModel, area: Rect) {
    // Columns that fit (a space between two, two border cells), most important first.
    let mut room = area.width.saturating_sub(2);
    let mut shown = [false; EVENT_COLUMNS.len()];
    for (i, &(_, w)) in EVENT_COLUMNS.iter().enumerate() {
        let cost = if i == 0 { w } else { w + 1 };
        if i >= 2 && room < cost {
            break;
        }
        shown[i] = true;
        room = room.saturating_sub(cost);
    }
    // Screen order: event, time, thr, kind, size, address, alloc id.
    let order = [0usize, 4, 5, 1, 2, 6, 3];
    let cols: Vec<usize> = order.into_iter().filter(|&i| shown[i]).collect();
    let rows = vm.events.iter().map(|e| {
        let mut style = Style::new();
        if e.is_oom {
            style = style.fg(c(theme::OOM));
        }
        if e.is_cursor {
            style = style.fg(Color::Black).bg(c(theme::CURSOR));
        }
        let cell = |i: usize| -> Cell<'_> {
            match i {
                0 => Cell::from(crate::format::count(e.index as u64)),
                1 => Cell::from(e.kind),
                2 => Cell::from(e.size.clone()),
                3 => Cell::from(e.alloc_id.clone()),
                4 => Cell::from(e.time.clone()),
                5 => Cell::from(e.thread.to_string()),
                _ => Cell::from(e.address.clone()),
            }
        };
        let mut cells: Vec<Cell<'_>> = cols.iter().map(|&i| cell(i)).collect();
        cells.push(Cell::from(e.op.clone().unwrap_or_default()));
        Row::new(cells).style(style)
    });
    let mut widths: Vec<Constraint> = cols
        .iter()
        .map(|&i| Constraint::Length(EVENT_COLUMNS[i].1))
        .collect();
    let mut header: Vec<&str> = cols.iter().map(|&i| EVENT_COLUMNS[i].0).collect();
    if vm.has_ops {
        widths.push(Constraint::Min(10));
        header.push("op");
    }
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(Style::new().add_modifier(Modifier::BOLD)))
        .block(Block::bordered().title(format!(" {} ", vm.events_title)));
    f.render_widget(table, area);
}

/// `text`, or its last `room - 1` characters after an ellipsis when it is longer than `room`.
fn keep_end(text: &str, room: usize) -> String {
    let n = text.chars().count();
    if n <= room {
        return text.to_owned();
    }
    let skip = n + 1 - room.max(1);
    std::iter::once('…')
        .chain(text.chars().skip(skip))
        .collect()
}

fn draw_status(f: &mut Frame<'_>, vm: &ViewModel, area: Rect) {
    let text = if let Some(p) = &vm.prompt {
        Line::from(vec![
            Span::styled(format!(" {p}"), Style::new().fg(c(theme::CURSOR))),
            Span::styled("█", Style::new().fg(c(theme::CURSOR))),
        ])
    } else {
        // The cursor's figures on the right matter most: on a narrow screen the left part
        // (file, events, policy; or a message) gives way, losing its start.
        let (left, bg, right) = match &vm.status.message {
            Some(m) => (m, theme::CURSOR, format!("  {}", vm.status.right)),
            None => (
                &vm.status.left,
                theme::series(1),
                format!("  {}   ? help", vm.status.right),
            ),
        };
        let room = usize::from(area.width)
            .saturating_sub(right.chars().count() + 2)
            .max(12);
        Line::from(vec![
            Span::styled(
                format!(" {} ", keep_end(left, room)),
                Style::new().fg(Color::Black).bg(c(bg)),
            ),
            Span::raw(right),
        ])
    };
    f.render_widget(Paragraph::new(text), area);
}

fn draw_help(f: &mut Frame<'_>, help: &[(&str, &str)], area: Rect) {
    let w = area.width.min(64);
    let h = area.height.min(help.len() as u16 + 2);
    let popup = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    let rows = help
        .iter()
        .map(|(k, d)| Row::new(vec![Cell::from(*k), Cell::from(*d)]));
    let table = Table::new(rows, [Constraint::Length(16), Constraint::Min(0)]).block(
        Block::default()
            .borders(Borders::ALL)
            .title(" keys (? to close) "),
    );
    f.render_widget(Clear, popup);
    f.render_widget(table, popup);
}
