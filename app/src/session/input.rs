//! Opening an input: the loader with a progress bar, lenient or strict, its warnings on
//! stderr, cut to a window (read block by block when the whole would not fit); what an
//! explorer opens of it ([`open_for_explorer`]); and the events or the allocation sites of
//! what was loaded.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use allocview_loaders::analysis::site_stats::EventSites;
use allocview_loaders::window::WindowInfo;
use allocview_loaders::{LoadOptions, LoadSummary, Loaded, Requests, Strictness};
use allocview_sim::stream::window::WindowSpec;
use anyhow::{Context as _, Result, bail};
use polars::prelude::*;

use super::options::{InputArgs, WindowArgs};
use super::source::{ResumePoint, WindowTables};
use crate::progress::ByteProgress;

/// The id of the heap named `name` in `path` (0, malloc's, for `None`): see
/// [`allocview_loaders::binary::resolve_heap`].
///
/// # Errors
/// When the file has no heap of that name (the error lists those it has).
pub fn heap_id(path: &Path, name: Option<&str>) -> Result<u32> {
    match name {
        None => Ok(0),
        Some(name) => {
            allocview_loaders::binary::resolve_heap(path, name).map_err(|e| anyhow::anyhow!("{e}"))
        }
    }
}

/// Loads `path`, showing a progress bar on a terminal and printing load warnings to stderr,
/// and cuts it to the window `args` ask for.
pub fn load_input(path: &Path, args: &InputArgs) -> Result<Loaded> {
    if args.window.is_set() && super::mode::refuse_if_too_big(path).is_err() {
        if args.heap_id(path)? != 0 {
            bail!(
                "{}: a window of a trace too big to load is read for malloc's heap only; \
                 --heap needs the trace loaded whole",
                path.display()
            );
        }
        return load_streamed_window(path, args);
    }
    let mut loaded = load_whole(path, args, args.requests_or(Requests::Objects))?;
    if let Some(w) = crate::session::window::apply(&mut loaded, &args.window, path)? {
        eprintln!(
            "window: events {}..{} of {} ({} allocations live at its start carried in)",
            crate::format::count(w.start as u64),
            crate::format::count(w.end as u64),
            path.display(),
            crate::format::count(u64::from(w.carried_in)),
        );
    }
    Ok(loaded)
}

/// The window `args` asks for of a binary trace too big to load whole, read block by block
/// with only the window kept (`stream_source::window_tables`): the loaded window's tables but
/// for the call and stack columns, so every command that loads works on a window of it.
fn load_streamed_window(path: &Path, args: &InputArgs) -> Result<Loaded> {
    if args.lenient {
        bail!(
            "{}: a window of a trace too big to load is read strictly; --lenient repairs damage \
             in a trace loaded whole",
            path.display()
        );
    }
    let started = std::time::Instant::now();
    let counter = Arc::new(AtomicU64::new(0));
    let file_bytes = std::fs::metadata(path)
        .with_context(|| format!("cannot open {}", path.display()))?
        .len();
    let bar = ByteProgress::start("reading", file_bytes, Arc::clone(&counter));
    let t = crate::session::source::window_tables(path, &args.window, Some(&counter), true, None)?;
    drop(bar);
    for w in t.summary.warnings() {
        eprintln!("warning: {w}");
    }
    Ok(Loaded::MallocTrace(allocview_loaders::MallocTrace {
        events: t.events,
        threads: t.threads,
        summary: t.summary,
        load_seconds: started.elapsed().as_secs_f64(),
        stacks: None,
        // A window's tables are read block by block; its memory samples are not read.
        memory: Vec::new(),
        memory_series: allocview_loaders::RecordedSeries::ProcessResident,
        mappings: Vec::new(),
        // A few bytes at the end of the file: a window is shown with the run's marks.
        marks: allocview_loaders::binary::read_marks(path).unwrap_or_else(|e| {
            eprintln!("warning: {e}: the run's marks are left out");
            Vec::new()
        }),
    }))
}

/// Says on stderr which requests of a trace recorded in a CPython interpreter were read
/// (nothing for any other input).
pub fn note_requests(path: &Path, loaded: &Loaded, requests: Requests) {
    let Loaded::MallocTrace(t) = loaded else {
        return;
    };
    if t.summary.python_allocator_events + t.summary.other_view_events == 0 {
        return;
    }
    let other = match requests {
        Requests::Objects => Requests::Libc,
        Requests::Libc => Requests::Objects,
    };
    eprintln!(
        "note: {} was recorded in a CPython interpreter: read {}; --requests {} reads {}",
        path.display(),
        requests.describe(),
        other.name(),
        other.describe()
    );
}

/// Loads `path` whole (see [`load_input`]).
pub fn load_whole(path: &Path, args: &InputArgs, requests: Requests) -> Result<Loaded> {
    crate::session::mode::refuse_if_too_big(path)?;
    let counter = Arc::new(AtomicU64::new(0));
    let file_bytes = std::fs::metadata(path)
        .with_context(|| format!("cannot open {}", path.display()))?
        .len();
    let bar = ByteProgress::start("loading", file_bytes, Arc::clone(&counter));
    let mut opts = load_options(args.lenient, requests, counter);
    opts.device = args.device;
    opts.heap = args.heap_id(path)?;
    let loaded = allocview_loaders::load(path, &opts)
        .with_context(|| format!("while loading {}", path.display()))?;
    drop(bar);
    for w in warnings(&loaded) {
        eprintln!("warning: {w}");
    }
    Ok(loaded)
}

/// Loads `path` whole, setting `counter` to the bytes read so far as it goes, quietly (the
/// caller shows the progress and the [`warnings`] its own way).
pub fn load_counted(
    path: &Path,
    lenient: bool,
    requests: Requests,
    counter: Arc<AtomicU64>,
) -> Result<Loaded> {
    allocview_loaders::load(path, &load_options(lenient, requests, counter))
        .with_context(|| format!("while loading {}", path.display()))
}

/// The loader's options: lenient or strict, setting `counter` to the bytes read so far.
fn load_options(lenient: bool, requests: Requests, counter: Arc<AtomicU64>) -> LoadOptions {
    LoadOptions {
        strictness: if lenient {
            Strictness::Lenient
        } else {
            Strictness::Strict
        },
        progress: Some(counter),
        requests,
        device: None,
        heap: 0,
    }
}

/// How an explorer loads its input ([`open_for_explorer`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct ExplorerLoad {
    /// Skip malformed lines.
    pub lenient: bool,
    /// Which device's events of a PyTorch profiler trace.
    pub device: Option<allocview_loaders::kineto::DeviceChoice>,
    /// Which heap's events of a binary trace (0: malloc's; [`heap_id`] resolves a name).
    pub heap: u32,
}

/// What an explorer opens of its input ([`open_for_explorer`]).
pub enum Opened {
    /// Loaded in memory, whole or cut to the window asked for.
    Loaded {
        loaded: Box<Loaded>,
        /// The window cut from it, when one was asked for.
        window: Option<WindowInfo>,
        /// Events of the input before the cut (0 for an input without events).
        trace_events: u64,
        /// What the loader noticed ([`warnings`]).
        warnings: Vec<String>,
    },
    /// A window of a binary trace too big to load, read block by block (boxed, as the
    /// loaded input is: both are large).
    Streamed(Box<StreamedWindow>),
}

/// A window of a binary trace read block by block for an explorer
/// ([`read_window_for_explorer`]).
pub struct StreamedWindow {
    pub tables: WindowTables,
    /// What the read noticed; first, when the window is the trace's first part shown in
    /// place of a trace too big to load, a note that says so.
    pub warnings: Vec<String>,
}

/// Opens `path` for an explorer: loaded whole, or cut to `window` when one is asked for; a
/// binary trace too big to load is read block by block instead, the window asked for or else
/// its first part ([`super::mode::explorer_default_window`]), with a note that says so.
/// `progress` is set to the bytes read so far; `resume` gives where a read of a window may
/// start from other than the trace's start (the explorers' background read of the trace).
///
/// # Errors
/// A readable message naming the file.
pub fn open_for_explorer(
    path: &Path,
    how: &ExplorerLoad,
    window: &WindowArgs,
    progress: &Arc<AtomicU64>,
    resume: impl FnOnce(&WindowSpec) -> Option<ResumePoint>,
) -> Result<Opened, String> {
    if let Some((events, first)) = super::mode::explorer_default_window(path) {
        if how.heap != 0 {
            return Err(format!(
                "{} holds {} events, too many to load whole: a part of it is read for \
                 malloc's heap only (--heap needs the trace loaded whole)",
                path.display(),
                crate::format::count(events)
            ));
        }
        if window.is_set() {
            // A window of a trace too big to load: read block by block, only the window
            // kept.
            return read_window_for_explorer(path, window, progress, resume)
                .map(|w| Opened::Streamed(Box::new(w)));
        }
        // Too big to load whole and no window asked for: the first events that fit.
        let first_part = WindowArgs {
            events: Some(format!("0..{first}")),
            ..WindowArgs::default()
        };
        let mut streamed = read_window_for_explorer(path, &first_part, progress, resume)?;
        streamed.warnings.insert(
            0,
            format!(
                "{} holds {} events, too many to load whole: showing its first {}; {{ and }} \
                 open the other parts, g #N the part of any event N",
                path.display(),
                crate::format::count(events),
                crate::format::count(first)
            ),
        );
        return Ok(Opened::Streamed(Box::new(streamed)));
    }
    let opts = LoadOptions {
        device: how.device,
        heap: how.heap,
        ..load_options(how.lenient, Requests::Objects, Arc::clone(progress))
    };
    let mut loaded = allocview_loaders::load(path, &opts).map_err(|e| e.to_string())?;
    let trace_events = match &loaded {
        Loaded::MallocTrace(t) => t.events.height() as u64,
        Loaded::TfMemoryLog(log) => log.events.height() as u64,
        _ => 0,
    };
    let window = super::window::apply(&mut loaded, window, path).map_err(|e| format!("{e:#}"))?;
    let warnings = warnings(&loaded);
    Ok(Opened::Loaded {
        loaded: Box::new(loaded),
        window,
        trace_events,
        warnings,
    })
}

/// The window `window` of the binary trace `path`, read block by block
/// ([`super::source::window_tables`]), quietly: memory holds the window, whatever the trace's
/// length. `progress` and `resume` as [`open_for_explorer`]'s.
///
/// # Errors
/// A readable message naming the file.
pub fn read_window_for_explorer(
    path: &Path,
    window: &WindowArgs,
    progress: &AtomicU64,
    resume: impl FnOnce(&WindowSpec) -> Option<ResumePoint>,
) -> Result<StreamedWindow, String> {
    let spec = window.spec().map_err(|e| format!("{e:#}"))?;
    let point = spec.as_ref().and_then(resume);
    let tables = super::source::window_tables(path, window, Some(progress), false, point)
        .map_err(|e| format!("{e:#}"))?;
    let warnings = tables.summary.warnings();
    Ok(StreamedWindow { tables, warnings })
}

/// What the loader noticed and kept going: skipped lines, unknown frees, cross-check
/// mismatches, conversions chosen.
#[must_use]
pub fn warnings(loaded: &Loaded) -> Vec<String> {
    match loaded {
        Loaded::MallocTrace(t) => t.summary.warnings(),
        Loaded::TfMemoryLog(log) => {
            let mut w = log.summary.warnings();
            for d in &log.dumps {
                w.extend(d.warnings.iter().map(ToString::to_string));
            }
            w
        }
        Loaded::TfBfcDump(d) => {
            let mut w: Vec<String> = d.warnings.iter().map(ToString::to_string).collect();
            if !d.missing.is_empty() {
                w.push(format!(
                    "this {} dump lacks: {}",
                    d.format.name(),
                    d.missing.join(", ")
                ));
            }
            w
        }
        Loaded::Plan(p) => p.notes.clone(),
        Loaded::HeapProfile(p) => p.notes.clone(),
        Loaded::PytorchSnapshot(s) => {
            let mut w = s.warnings.clone();
            w.extend(s.notes.iter().map(|n| format!("snapshot format: {n}")));
            w
        }
    }
}

/// An input with an event table the simulator can replay: a malloc trace (text or binary) or
/// a TensorFlow memory log. Both use the same event columns.
pub struct Events<'a> {
    /// `malloc-trace` or `tf-memory-log`.
    pub format: &'static str,
    pub events: &'a DataFrame,
    pub threads: &'a DataFrame,
    pub load_seconds: f64,
    /// The loader's counts (for a memory log, derived from its events).
    pub summary: LoadSummary,
}

/// The format name of a malloc trace: `pytorch-profiler` for a profiler trace's GPU stream
/// (PyTorch's caching allocator, replayed like a snapshot's), else `malloc-trace`.
#[must_use]
pub fn trace_format(t: &allocview_loaders::MallocTrace) -> &'static str {
    if t.summary.gpu_device.is_some() {
        "pytorch-profiler"
    } else {
        "malloc-trace"
    }
}

/// The event table of `loaded`, if it has one.
#[must_use]
pub fn events_of(loaded: &Loaded) -> Option<Events<'_>> {
    match loaded {
        Loaded::MallocTrace(t) => Some(Events {
            format: trace_format(t),
            events: &t.events,
            threads: &t.threads,
            load_seconds: t.load_seconds,
            summary: t.summary.clone(),
        }),
        Loaded::TfMemoryLog(log) => Some(Events {
            format: "tf-memory-log",
            events: &log.events,
            threads: &log.threads,
            load_seconds: log.load_seconds,
            summary: super::window::summary_from_kinds(&log.events),
        }),
        Loaded::PytorchSnapshot(s) => Some(Events {
            format: "pytorch-snapshot",
            events: &s.events,
            threads: &s.threads,
            load_seconds: s.load_seconds,
            summary: s.summary.clone(),
        }),
        Loaded::TfBfcDump(_) | Loaded::Plan(_) | Loaded::HeapProfile(_) => None,
    }
}

/// The event table, or an error that says what the file is and which command reads it.
pub fn require_events<'a>(loaded: &'a Loaded, path: &Path, command: &str) -> Result<Events<'a>> {
    events_of(loaded).ok_or_else(|| {
        let what = match loaded {
            Loaded::TfBfcDump(_) => {
                "a TensorFlow BFC dump (a heap at one moment, with no events to replay); \
                 `allocview stats` summarises it and the explorers draw it"
            }
            Loaded::Plan(_) => "a memory plan; `allocview plan` runs the planners on it",
            Loaded::HeapProfile(_) => {
                "a heap profile (a moment by call stack, with no events to replay); \
                 `allocview sites`, `flamegraph`, `diff` and `export` read it"
            }
            _ => "not an event trace",
        };
        anyhow::anyhow!(
            "`allocview {command}` needs allocation events, but {} is {what}",
            path.display()
        )
    })
}

/// The sites of a loaded input (see [`EventSites`]).
#[must_use]
pub fn sites_of(loaded: &Loaded) -> Option<EventSites> {
    match loaded {
        Loaded::PytorchSnapshot(s) => Some(EventSites::from_events(&s.events, Some(&s.stacks))),
        Loaded::TfMemoryLog(log) => Some(EventSites::from_events(&log.events, None)),
        Loaded::MallocTrace(t) => Some(EventSites::from_events(&t.events, t.stacks.as_ref())),
        Loaded::TfBfcDump(_) | Loaded::Plan(_) | Loaded::HeapProfile(_) => None,
    }
}
