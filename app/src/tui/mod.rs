//! The terminal explorer: `allocview FILE`. It turns terminal input into messages, applies them
//! to the shared model and draws the view-model; it holds no domain logic.

pub mod draw;
mod draw_timeline;
pub mod keys;
pub mod layout;
mod style;
#[cfg(test)]
mod tests;

use std::io;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::spec::PolicySpec;
use anyhow::{Context as _, Result};
use crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use crossterm::execute;
use ratatui::Terminal;
use ratatui::backend::Backend;

use crate::model::state::AppState;

use crate::model::update::{Msg, update};
use crate::model::view::view_model;
use crate::model::workers::start_workers;

/// Draws one frame of `state` on `terminal` and returns the screen areas (for the mouse).
///
/// # Errors
/// When the terminal cannot be drawn to.
pub fn render<B: Backend>(terminal: &mut Terminal<B>, state: &mut AppState) -> Result<layout::Areas>
where
    B::Error: Send + Sync + 'static,
{
    let size = terminal.size().context("reading the terminal size")?;
    let area = ratatui::layout::Rect::new(0, 0, size.width, size.height);
    let compare = state.mode == crate::model::state::Mode::Compare;
    // Rows the dump's text takes once wrapped to the box's width.
    let text_width = usize::from(size.width.saturating_sub(2)).max(1);
    let dump_lines = state
        .data
        .as_ref()
        .filter(|d| d.is_empty())
        .and_then(|d| d.dump.as_ref())
        .map(|d| {
            d.lines
                .iter()
                .map(|l| l.chars().count().div_ceil(text_width).max(1))
                .sum()
        });
    let mut areas = layout::layout(area, compare, dump_lines);
    let panels = if compare { state.policies.len() } else { 1 };
    let vp = layout::viewport(&areas, compare, panels);
    if state.page_rows != vp.event_rows.max(1) {
        update(state, Msg::PageRows(vp.event_rows));
    }
    let vm = view_model(state, &vp);
    terminal
        .draw(|f| draw::draw(f, &vm, &areas))
        .context("drawing the terminal")?;
    if vm.overview.is_none() {
        // No strip is drawn (a trace shown whole, or a window of a loaded one): no clicks.
        areas.overview_strip = ratatui::layout::Rect::default();
    }
    Ok(areas)
}

/// Runs the explorer until the user quits.
///
/// # Errors
/// When the terminal cannot be set up or drawn to. Load and replay errors are shown on screen.
pub fn run(
    path: &Path,
    policies: &[PolicySpec],
    real: &[crate::real::RealSpec],
    config: PolicyConfig,
    input: &crate::session::InputArgs,
    jobs: usize,
    launch: crate::model::state::Launch,
) -> Result<()> {
    use std::io::IsTerminal as _;
    // ratatui's own check panics: say what is wrong before anything starts.
    if !io::stdout().is_terminal() || !io::stdin().is_terminal() {
        anyhow::bail!(
            "the terminal explorer needs a terminal (its input or output is not one): run it \
             in a terminal, or use `allocview gui`, `allocview stats` or `allocview report`"
        );
    }
    let lenient = input.lenient;
    if launch.follow.is_some() {
        crate::model::live::yield_to_the_program();
    }
    let mut state = AppState::new(path, policies, config.clone())
        .with_real(real)
        .launched(launch);
    state.window = input.window.clone();
    state.device = input.device;
    state.heap = input.heap.clone();
    let (mut tx, rx) = mpsc::channel();
    start_workers(&state, lenient, jobs, &tx);
    let mut terminal = ratatui::try_init().context("cannot set up the terminal")?;
    execute!(io::stdout(), EnableMouseCapture).ok();
    let mut rx = rx;
    let result = loop {
        match event_loop(&mut terminal, &mut state, &rx, &Tuning { tx: &tx, jobs }) {
            // Another part of the trace: a new model on it, and new workers (the old ones stop
            // at their next report, their channel gone).
            Ok(()) if !state.quit => {
                let Some(window) = state.reopen.take() else {
                    break Ok(());
                };
                state
                    .cancel
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                let mut next = AppState::new(path, policies, config.clone()).with_real(real);
                next.window = window;
                next.device = state.device;
                next.heap = state.heap.clone();
                next.initial_goto = state.reopen_goto.take();
                state = next;
                let (next_tx, next_rx) = mpsc::channel();
                start_workers(&state, lenient, jobs, &next_tx);
                (tx, rx) = (next_tx, next_rx);
            }
            other => break other,
        }
    };
    execute!(io::stdout(), DisableMouseCapture).ok();
    ratatui::restore();
    result
}

/// What the event loop needs to start `tune` when it is asked for: where its result goes,
/// and how many replays it runs at once.
struct Tuning<'a> {
    tx: &'a mpsc::Sender<Msg>,
    jobs: usize,
}

fn event_loop<B: Backend>(
    terminal: &mut Terminal<B>,
    state: &mut AppState,
    rx: &mpsc::Receiver<Msg>,
    tuning: &Tuning<'_>,
) -> Result<()>
where
    B::Error: Send + Sync + 'static,
{
    let mut areas = render(terminal, state)?;
    let mut was_scanning = state.scanning();
    while !state.quit && state.reopen.is_none() {
        let mut dirty = false;
        // Redraw at least every 100 ms while loading, for the progress bar.
        if crossterm::event::poll(Duration::from_millis(100)).context("polling the terminal")? {
            let ev = crossterm::event::read().context("reading the terminal")?;
            if let Some(msg) = keys::to_msg(
                &ev,
                state.prompt.is_some(),
                Some(areas.timeline_plot),
                Some(areas.overview_strip),
            ) {
                apply(state, msg);
            }
            // Coalesce a burst (key repeat, mouse drag) into one redraw.
            while crossterm::event::poll(Duration::ZERO).unwrap_or(false) {
                let Ok(ev) = crossterm::event::read() else {
                    break;
                };
                if let Some(msg) = keys::to_msg(
                    &ev,
                    state.prompt.is_some(),
                    Some(areas.timeline_plot),
                    Some(areas.overview_strip),
                ) {
                    apply(state, msg);
                }
            }
            dirty = true;
        }
        while let Ok(msg) = rx.try_recv() {
            apply(state, msg);
            dirty = true;
        }
        if state.tune_requested && state.data.is_some() {
            state.tune_requested = false;
            crate::model::workers::start_tune(state, tuning.jobs, tuning.tx);
            dirty = true;
        }
        // While anything is still loading, replaying or reading the whole trace, redraw for
        // its progress (and once more when the read ends).
        let scanning = state.scanning();
        let busy = state.data.is_none()
            || scanning
            || was_scanning
            || state
                .policies
                .iter()
                .any(|p| matches!(p.status, crate::model::state::RunStatus::Pending));
        was_scanning = scanning;
        if dirty || busy {
            areas = render(terminal, state)?;
        }
    }
    Ok(())
}

fn apply(state: &mut AppState, msg: Msg) {
    // Any key clears a one-shot status message.
    if !matches!(
        msg,
        Msg::Replayed(..) | Msg::Classes(_) | Msg::Loaded(_) | Msg::PageRows(_)
    ) {
        state.message = None;
    }
    let mut next = Some(msg);
    while let Some(m) = next.take() {
        next = update(state, m);
    }
}
