//! `allocview bench hops`: the terminal explorer on a trace too big to load, going to events
//! spread over the whole trace (`g #N`) once its background read is done, each timed from the
//! key to the part that holds the event read, replayed and drawn with the cursor on it.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::spec::PolicySpec;

use super::args::{BenchArgs, explorer_policies};
use super::measure::{peak_rss_bytes, percentile, rss_bytes, screen_size};
use crate::model::state::AppState;
use crate::model::workers::load_blocking;
use crate::session::WindowArgs;
use crate::tui;

/// What opens a part as the terminal explorer does, for the benchmark.
struct Opener<'a> {
    args: &'a BenchArgs,
    names: Vec<PolicySpec>,
    config: PolicyConfig,
}

impl Opener<'_> {
    /// The explorer's state on `window`, loaded and every policy replayed (`--jobs` at a
    /// time, one by default), the cursor sent to `goto`.
    fn open(&self, window: WindowArgs, goto: Option<String>) -> Result<AppState> {
        let mut state = self.blank();
        state.window = window;
        state.initial_goto = goto;
        load_blocking(&mut state, false, self.args.policies.jobs.unwrap_or(1))
            .map_err(anyhow::Error::msg)?;
        Ok(state)
    }

    fn blank(&self) -> AppState {
        AppState::new(&self.args.file, &self.names, self.config.clone())
    }
}

/// Runs `allocview bench hops`.
pub fn hops(args: &BenchArgs) -> Result<()> {
    let (w, h) = screen_size(&args.size)?;
    let opener = Opener {
        args,
        names: explorer_policies(args)?,
        config: args.policies.config()?,
    };
    let mut terminal = Terminal::new(TestBackend::new(w, h))?;
    let started = Instant::now();
    let mut state = opener.open(WindowArgs::default(), None)?;
    tui::render(&mut terminal, &mut state)?;
    let first_s = started.elapsed().as_secs_f64();
    let Some(data) = state.data.clone() else {
        bail!("{} did not load", args.file.display());
    };
    let (Some(part), Some(scan)) = (data.part, data.scan.clone()) else {
        bail!(
            "{} fits in memory, so the explorer shows it whole and has no parts to go between \
             (ALLOCVIEW_AVAILABLE_MEMORY=BYTES makes a small trace too big, to try this)",
            args.file.display()
        );
    };
    outln!(
        "{}: {} events; first part {}..{} read, replayed and drawn in {:.2} s",
        args.file.display(),
        crate::format::count(part.trace_events),
        crate::format::count(part.start),
        crate::format::count(part.end),
        first_s
    );
    while scan.running() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = scan.overview();
    if let Some(e) = &o.error {
        bail!("the background read stopped: {e}");
    }
    outln!(
        "  background read of the whole trace: {:.1} s, {} resume points {} events apart, {} \
         resident ({} at the peak)",
        started.elapsed().as_secs_f64(),
        crate::format::count(o.points as u64),
        crate::format::count(o.spacing_events),
        crate::format::bytes(rss_bytes().unwrap_or(0)),
        crate::format::bytes(peak_rss_bytes().unwrap_or(0))
    );
    let (mut times_ms, opened) =
        go_to_events(&opener, &mut state, &mut terminal, part.trace_events)?;
    times_ms.sort_by(f64::total_cmp);
    outln!(
        "  go to an event ({} of them, {} in another part): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        times_ms.len(),
        opened,
        percentile(&times_ms, 0.5),
        percentile(&times_ms, 0.99),
        times_ms.last().copied().unwrap_or(0.0)
    );
    outln!(
        "  resident memory after: {} ({} at the peak)",
        crate::format::bytes(rss_bytes().unwrap_or(0)),
        crate::format::bytes(peak_rss_bytes().unwrap_or(0))
    );
    Ok(())
}

/// Goes to `--seeks` events spread over the trace's `trace_events` (a fixed pseudo-random
/// sequence) as `g #N` does: the time of each in milliseconds, and how many opened another
/// part.
///
/// # Errors
/// A part that does not open, or a cursor that is not on the event asked for.
fn go_to_events(
    opener: &Opener<'_>,
    state: &mut AppState,
    terminal: &mut Terminal<TestBackend>,
    trace_events: u64,
) -> Result<(Vec<f64>, usize)> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let (mut times_ms, mut opened) = (Vec::new(), 0usize);
    for _ in 0..opener.args.seeks {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let target = x % trace_events.max(1);
        let t = Instant::now();
        crate::model::parts::goto_trace_event(state, target).map_err(anyhow::Error::msg)?;
        if let Some(window) = state.reopen.take() {
            let goto = state.reopen_goto.take();
            state
                .cancel
                .store(true, std::sync::atomic::Ordering::Relaxed);
            // The old part is dropped first, as the frontends drop it.
            drop(std::mem::replace(state, opener.blank()));
            *state = opener.open(window, goto)?;
            opened += 1;
        }
        tui::render(terminal, state)?;
        times_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let at = trace_event_at_cursor(state).context("no part shown")?;
        if at != target {
            bail!("went to event {target} but the cursor is on event {at}");
        }
    }
    Ok((times_ms, opened))
}

/// The event of the whole trace the cursor is on (past the part's carried-in allocations).
fn trace_event_at_cursor(state: &AppState) -> Option<u64> {
    let part = state.data.as_ref()?.part?;
    let carried = (state.events() as u64).checked_sub(part.end - part.start)?;
    Some(part.start + (state.cursor as u64).checked_sub(carried)?)
}
