//! What the streaming commands read: a binary trace block by block, whole or a window of it
//! (`--from/--to/--events`). A window is found first, in one read up to its end
//! ([`allocview_sim::stream::window::resolve`]), then each pass reads the trace from its start,
//! keeping the allocations live before the window and handing out the window's events after
//! them, as a loaded trace's window is cut (`allocview_loaders::window`).

use std::path::{Path, PathBuf};

use allocview_loaders::binary::BinaryEventStream;
use allocview_loaders::events::LoadSummary;
use allocview_sim::stream::window::{
    EmptyWindow, ResolvedWindow, WindowSource, WindowSpec, resolve,
};
use allocview_sim::stream::{EventBatch, EventSource};
use allocview_sim::trace::EventKind;
use anyhow::{Context as _, Result, bail};

use super::window::WindowArgs;

/// A binary trace to stream, and the window of it, if any.
#[derive(Clone, Debug)]
pub(super) struct StreamInput {
    pub(super) file: PathBuf,
    window: Option<ResolvedWindow>,
}

impl StreamInput {
    /// `file`, with the window `args` asks for found in it, said on stderr as a loaded
    /// window is.
    pub(super) fn new(file: &Path, args: &WindowArgs) -> Result<Self> {
        let window = match args.spec()? {
            None => None,
            Some(spec) => {
                let w =
                    find(file, &spec).with_context(|| format!("window of {}", file.display()))?;
                announce_window(file, &w);
                Some(w)
            }
        };
        Ok(Self {
            file: file.to_owned(),
            window,
        })
    }

    /// How many events `source` (a read of this input) hands out: the file's, or the
    /// window's with the allocations carried into it.
    pub(super) fn events_hint(&self, source: &Source) -> u64 {
        match self.window {
            Some(w) => w.carried_in + (w.end - w.start) as u64,
            None => source.stream().index().records(),
        }
    }

    /// A new read of the trace from its start.
    pub(super) fn open(&self) -> Result<Source> {
        let stream = BinaryEventStream::open(&self.file)
            .with_context(|| format!("while opening {}", self.file.display()))?;
        Ok(match self.window {
            None => Source::Whole(stream),
            Some(w) => Source::Window(WindowSource::new(stream, w)),
        })
    }
}

fn find(file: &Path, spec: &WindowSpec) -> Result<ResolvedWindow> {
    let mut stream = BinaryEventStream::open(file)
        .with_context(|| format!("while opening {}", file.display()))?;
    resolve(&mut stream, spec)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("while reading {}", file.display()))?
        .map_err(|empty| no_events(&empty))
}

/// The error for a window that selects no events, with what was read.
fn no_events(empty: &EmptyWindow) -> anyhow::Error {
    let span = match (empty.t_first_ns, empty.t_last_ns) {
        (Some(a), Some(b)) => format!(
            "the trace has {} events, at times {:.6}s to {:.6}s",
            crate::format::count(empty.events as u64),
            a as f64 / 1e9,
            b as f64 / 1e9
        ),
        _ => "no event was read before where the window would end".to_owned(),
    };
    anyhow::anyhow!("the window selects no events ({span})")
}

/// Says on stderr which window was cut, as a loaded window is.
fn announce_window(file: &Path, w: &ResolvedWindow) {
    eprintln!(
        "window: events {}..{} of {} ({} allocations live at its start carried in)",
        crate::format::count(w.start as u64),
        crate::format::count(w.end as u64),
        file.display(),
        crate::format::count(w.carried_in),
    );
}

/// One read of a streamed trace (one per pass: the size of either hardly matters).
#[allow(clippy::large_enum_variant)]
pub(super) enum Source {
    Whole(BinaryEventStream),
    Window(WindowSource<BinaryEventStream>),
}

impl EventSource for Source {
    fn time_span(&self) -> (i64, i64) {
        match self {
            Self::Whole(s) => s.time_span(),
            Self::Window(w) => w.time_span(),
        }
    }

    fn next_batch(&mut self, out: &mut EventBatch) -> Result<bool, String> {
        match self {
            Self::Whole(s) => s.next_batch(out),
            Self::Window(w) => w.next_batch(out),
        }
    }
}

impl Source {
    pub(super) fn stream(&self) -> &BinaryEventStream {
        match self {
            Self::Whole(s) => s,
            Self::Window(w) => w.inner(),
        }
    }

    /// What the loader counted of the file; of a window, the counts of its events' kinds
    /// (as a loaded trace's window gives them: `load::summary_from_kinds`).
    pub(super) fn summary(&self) -> LoadSummary {
        let mut s = self.stream().summary().clone();
        if let Self::Window(w) = self {
            let f = w.figures();
            let n = |k: EventKind| f.kinds.get(k as usize).copied().unwrap_or(0);
            s.events = f.events;
            s.mallocs = n(EventKind::Alloc) + n(EventKind::AllocFailed);
            s.mallocs_failed = n(EventKind::AllocFailed);
            s.frees = n(EventKind::Free) + n(EventKind::FreeNull) + n(EventKind::FreeUnknown);
            s.frees_null = n(EventKind::FreeNull);
            s.frees_unknown = n(EventKind::FreeUnknown);
        }
        s
    }

    pub(super) fn events_per_thread(&self) -> Vec<u64> {
        match self {
            Self::Whole(s) => s.events_per_thread().to_vec(),
            Self::Window(w) => {
                // A loaded window keeps the file's thread table: every thread, with or without
                // events in the window.
                let mut n = w.figures().events_per_thread.clone();
                let threads = w
                    .inner()
                    .index()
                    .threads
                    .len()
                    .max(w.inner().thread_ids().len());
                if n.len() < threads {
                    n.resize(threads, 0);
                }
                n
            }
        }
    }

    pub(super) fn peak_live_bytes(&self) -> u64 {
        match self {
            Self::Whole(s) => s.peak_live_bytes(),
            Self::Window(w) => w.figures().peak_live_bytes,
        }
    }

    pub(super) fn peak_live_event(&self) -> u64 {
        match self {
            Self::Whole(s) => s.peak_live_event(),
            Self::Window(w) => w.figures().peak_live_event,
        }
    }

    pub(super) fn thread_ids(&self) -> &[u64] {
        self.stream().thread_ids()
    }
}

/// The event and thread tables of the window `args` asks for of a binary trace, read block by
/// block (for the explorers and the commands that load, on a trace too big to load whole),
/// said on stderr when `announce`: the columns a loaded
/// trace's window has (`t_ns`, `thread`, `kind`, `size_bytes`, `address`, `alloc_id`,
/// `size_class`), without the call and stack columns (a stream does not carry them), and
/// the loader's summary of what was read.
///
/// # Errors
/// When the file does not read or the window selects no events.
pub fn window_tables(
    file: &Path,
    args: &WindowArgs,
    progress: Option<&std::sync::atomic::AtomicU64>,
    announce: bool,
    resume: Option<crate::model::scan::ResumePoint>,
) -> Result<WindowTables> {
    use polars::prelude::*;
    let Some(spec) = args.spec()? else {
        bail!("{}: no window asked for", file.display());
    };
    // Found as the events come: one read of the file up to the window's end, from the
    // resume point given (taken from a read of this file) when the window starts after it.
    let window = match resume.filter(|r| r.before.precedes(&spec)) {
        Some(r) => {
            let stream = BinaryEventStream::open_at(file, &r.stream)
                .with_context(|| format!("while opening {}", file.display()))?;
            WindowSource::resume(stream, spec, r.before)
        }
        None => None,
    };
    let window = match window {
        Some(w) => w,
        None => WindowSource::as_they_come(
            BinaryEventStream::open(file)
                .with_context(|| format!("while opening {}", file.display()))?,
            spec,
        ),
    };
    let threads = window.inner().index().threads.clone();
    let read_from_event = window.inner().summary().events;
    let mut source = Source::Window(window);
    let mut batch = EventBatch::default();
    let (mut t_ns, mut kind, mut size, mut addr, mut ids, mut classes) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let mut thread: Vec<u16> = Vec::new();
    while source
        .next_batch(&mut batch)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("while reading {}", file.display()))?
    {
        t_ns.extend_from_slice(&batch.t_ns);
        kind.extend_from_slice(&batch.kind);
        size.extend_from_slice(&batch.size_bytes);
        addr.extend_from_slice(&batch.addr);
        ids.extend_from_slice(&batch.alloc_id);
        thread.extend_from_slice(&batch.thread);
        classes.extend(
            batch
                .size_bytes
                .iter()
                .map(|&s| allocview_sim::trace::size_class(s)),
        );
        if let Some(p) = progress {
            // In bytes of the file, as a loader reports its progress.
            p.store(
                source.stream().bytes_read(),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }
    let height = t_ns.len();
    let id_col = if ids.contains(&allocview_sim::trace::NO_ALLOC_ID) {
        let validity: Vec<bool> = ids
            .iter()
            .map(|&id| id != allocview_sim::trace::NO_ALLOC_ID)
            .collect();
        let mut c = UInt32Chunked::from_vec("alloc_id".into(), ids);
        c = c.with_validity(Some(validity.into_iter().collect()));
        c
    } else {
        UInt32Chunked::from_vec("alloc_id".into(), ids)
    };
    // As the loader: a thread index in one byte while the file's threads fit.
    let thread_col = if threads.len().max(source.thread_ids().len()) <= 256 {
        let narrow: Vec<u8> = thread
            .iter()
            .map(|&t| u8::try_from(t).unwrap_or(u8::MAX))
            .collect();
        UInt8Chunked::from_vec("thread".into(), narrow).into_column()
    } else {
        UInt16Chunked::from_vec("thread".into(), thread).into_column()
    };
    let events = DataFrame::new(
        height,
        vec![
            Int64Chunked::from_vec("t_ns".into(), t_ns).into_column(),
            thread_col,
            UInt8Chunked::from_vec("kind".into(), kind).into_column(),
            UInt64Chunked::from_vec("size_bytes".into(), size).into_column(),
            UInt64Chunked::from_vec("address".into(), addr).into_column(),
            id_col.into_column(),
            UInt8Chunked::from_vec("size_class".into(), classes).into_column(),
        ],
    )?;
    let tids = if threads.is_empty() {
        source.thread_ids().to_vec()
    } else {
        threads
    };
    let n = tids.len();
    let thread_table = DataFrame::new(
        n,
        vec![
            UInt16Chunked::from_vec(
                "thread".into(),
                (0..n)
                    .map(|i| u16::try_from(i).unwrap_or(u16::MAX))
                    .collect(),
            )
            .into_column(),
            UInt64Chunked::from_vec("tid".into(), tids).into_column(),
        ],
    )?;
    let found = match &source {
        Source::Window(w) => w.found(),
        Source::Whole(_) => Err(EmptyWindow {
            events: 0,
            t_first_ns: None,
            t_last_ns: None,
        }),
    }
    .map_err(|empty| no_events(&empty).context(format!("window of {}", file.display())))?;
    if announce {
        announce_window(file, &found);
    }
    let part = (found.start as u64, found.end as u64);
    Ok(WindowTables {
        events,
        threads: thread_table,
        summary: source.summary(),
        part,
        trace_events: source.stream().index().records(),
        read_from_event,
    })
}

/// What [`window_tables`] reads.
pub struct WindowTables {
    pub events: polars::prelude::DataFrame,
    pub threads: polars::prelude::DataFrame,
    pub summary: LoadSummary,
    /// The window, as events `start..end` of the trace.
    pub part: (u64, u64),
    /// Events in the whole trace.
    pub trace_events: u64,
    /// The event the read started from: 0, or the resume point's.
    pub read_from_event: u64,
}
