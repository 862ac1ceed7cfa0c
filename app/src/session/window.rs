//! `--from TIME --to TIME` and `--events A..B`: every command that reads a trace loads and
//! replays only a window of it, with the allocations live at the window's start carried in
//! (see `allocview_loaders::window` for what is exact).

use std::path::Path;

use allocview_loaders::LoadSummary;
use allocview_loaders::Loaded;
use allocview_loaders::window::WindowInfo;
use anyhow::{Context as _, Result, bail};
use polars::prelude::*;

use super::options::WindowArgs;

impl WindowArgs {
    /// Whether any window flag was given.
    #[must_use]
    pub fn is_set(&self) -> bool {
        self.from.is_some() || self.to.is_some() || self.events.is_some()
    }

    /// The events `start..end` the flags select among events at times `t_ns`, or `None` when
    /// no flag was given.
    ///
    /// # Errors
    /// A flag that does not parse, an inverted range, or a window with no events.
    pub fn range(&self, t_ns: &[i64]) -> Result<Option<(usize, usize)>> {
        if !self.is_set() {
            return Ok(None);
        }
        let n = t_ns.len();
        let (mut start, mut end) = (0, n);
        if let Some(spec) = &self.events {
            let (a, b) = parse_event_range(spec)?;
            if let Some(b) = b
                && a >= b
            {
                bail!("--events {spec}: the range is empty or inverted (write A..B with A < B)");
            }
            start = a;
            end = b.unwrap_or(n).min(n);
        }
        let from = self.from.as_deref().map(parse_time_ns).transpose()?;
        let to = self.to.as_deref().map(parse_time_ns).transpose()?;
        if let (Some(f), Some(t)) = (from, to)
            && f >= t
        {
            bail!(
                "--from {} is not before --to {}: the window would be empty",
                self.from.as_deref().unwrap_or_default(),
                self.to.as_deref().unwrap_or_default()
            );
        }
        if let Some(f) = from {
            start = start.max(t_ns.partition_point(|&t| t < f));
        }
        if let Some(t) = to {
            end = end.min(t_ns.partition_point(|&x| x < t));
        }
        if start >= end {
            let span = match (t_ns.first(), t_ns.last()) {
                (Some(a), Some(b)) => format!(
                    "the trace has {} events, at times {} to {}",
                    crate::format::count(n as u64),
                    show_ns(*a),
                    show_ns(*b)
                ),
                _ => "the trace has no events".to_owned(),
            };
            bail!("the window selects no events ({span})");
        }
        Ok(Some((start, end)))
    }
}

impl WindowArgs {
    /// The window as a streamed trace finds it (see [`Self::range`] for a loaded one): the
    /// same bounds, the same refusals of an empty or inverted request.
    ///
    /// # Errors
    /// As [`Self::range`] for what can be told before reading the trace.
    pub fn spec(&self) -> Result<Option<allocview_sim::stream::window::WindowSpec>> {
        if !self.is_set() {
            return Ok(None);
        }
        let mut spec = allocview_sim::stream::window::WindowSpec::default();
        if let Some(text) = &self.events {
            let (a, b) = parse_event_range(text)?;
            if let Some(b) = b
                && a >= b
            {
                bail!("--events {text}: the range is empty or inverted (write A..B with A < B)");
            }
            spec.first_event = a;
            spec.end_event = b;
        }
        spec.from_ns = self.from.as_deref().map(parse_time_ns).transpose()?;
        spec.to_ns = self.to.as_deref().map(parse_time_ns).transpose()?;
        if let (Some(f), Some(t)) = (spec.from_ns, spec.to_ns)
            && f >= t
        {
            bail!(
                "--from {} is not before --to {}: the window would be empty",
                self.from.as_deref().unwrap_or_default(),
                self.to.as_deref().unwrap_or_default()
            );
        }
        Ok(Some(spec))
    }
}

/// A time on the trace's clock, in nanoseconds (see [`WindowArgs::from`]).
pub fn parse_time_ns(text: &str) -> Result<i64> {
    let t = text.trim();
    let ns = if let Ok(secs) = t.parse::<f64>() {
        secs * 1e9
    } else {
        allocview_sim::units::parse_duration_ns(t)
            .map_err(|e| anyhow::anyhow!("{e}; a plain number is in seconds"))?
    };
    if !ns.is_finite() || ns.abs() > 9.2e18 {
        bail!("time {t:?} is out of range");
    }
    // Rounded to the nanosecond: `0.000001` means exactly 1000 ns.
    Ok(ns.round() as i64)
}

/// `A..B`, `A..` or `..B` (underscores and commas allowed in the numbers).
fn parse_event_range(spec: &str) -> Result<(usize, Option<usize>)> {
    let (a, b) = spec
        .split_once("..")
        .with_context(|| format!("--events {spec}: expected A..B, A.. or ..B"))?;
    let num = |s: &str| -> Result<Option<usize>> {
        let s = s.trim().replace(['_', ','], "");
        if s.is_empty() {
            return Ok(None);
        }
        s.parse::<usize>()
            .map(Some)
            .with_context(|| format!("--events {spec}: {s:?} is not an event number"))
    };
    Ok((num(a)?.unwrap_or(0), num(b)?))
}

fn show_ns(t: i64) -> String {
    format!("{:.6}s", t as f64 / 1e9)
}

/// Cuts `loaded`'s event table to the window the flags select, carrying in the allocations
/// live at its start; `None` when no window was asked for.
///
/// # Errors
/// As [`WindowArgs::range`]; inputs that have no event table, or whose replay needs more than
/// the events (a PyTorch snapshot's `pytorch` policy replays its own script), are refused.
pub fn apply(loaded: &mut Loaded, args: &WindowArgs, path: &Path) -> Result<Option<WindowInfo>> {
    if !args.is_set() {
        return Ok(None);
    }
    let events = match loaded {
        Loaded::MallocTrace(t) => &mut t.events,
        Loaded::TfMemoryLog(log) => &mut log.events,
        Loaded::PytorchSnapshot(_) => bail!(
            "{}: windows (--from/--to/--events) are not supported on PyTorch snapshots yet: \
             the snapshot's own replay (the `pytorch` policy) follows its recorded script",
            path.display()
        ),
        Loaded::TfBfcDump(_) | Loaded::Plan(_) | Loaded::HeapProfile(_) => bail!(
            "{}: windows (--from/--to/--events) need an event trace; this input has no events",
            path.display()
        ),
    };
    let t_ns: Vec<i64> = events.column("t_ns")?.i64()?.into_no_null_iter().collect();
    let Some((start, end)) = args
        .range(&t_ns)
        .with_context(|| format!("window of {}", path.display()))?
    else {
        return Ok(None);
    };
    drop(t_ns);
    let (cut, info) = allocview_loaders::window::window(events, start, end)
        .with_context(|| format!("window of {}", path.display()))?;
    *events = cut;
    if let Loaded::MallocTrace(t) = loaded {
        let events = summary_from_kinds(&t.events);
        t.summary.events = events.events;
        t.summary.mallocs = events.mallocs;
        t.summary.mallocs_failed = events.mallocs_failed;
        t.summary.frees = events.frees;
        t.summary.frees_null = events.frees_null;
        t.summary.set_frees_unknown(events.frees_unknown);
    }
    Ok(Some(info))
}

/// Counts like the malloc-trace loader's, from an event table's `kind` column.
pub fn summary_from_kinds(events: &DataFrame) -> LoadSummary {
    use allocview_sim::trace::EventKind;
    let mut s = LoadSummary::default();
    let kinds = events
        .column("kind")
        .ok()
        .and_then(|c| c.u8().ok().cloned());
    for k in kinds.iter().flat_map(|c| c.into_no_null_iter()) {
        s.events += 1;
        match EventKind::from_code(k) {
            Some(EventKind::Alloc) => s.mallocs += 1,
            Some(EventKind::AllocFailed) => {
                s.mallocs += 1;
                s.mallocs_failed += 1;
            }
            Some(EventKind::Free) => s.frees += 1,
            Some(EventKind::FreeNull) => {
                s.frees += 1;
                s.frees_null += 1;
            }
            Some(EventKind::FreeUnknown) => {
                s.frees += 1;
                s.frees_unknown += 1;
            }
            Some(EventKind::FreeRequested) | None => {}
        }
    }
    s
}
