//! What the streaming commands read: a binary trace block by block, whole or a window of it
//! (`--from/--to/--events`). A window is found first, in one read up to its end
//! ([`allocview_sim::stream::window::resolve`]), then each pass reads the trace from its start,
//! keeping the allocations live before the window and handing out the window's events after
//! them, as a loaded trace's window is cut (`allocview_loaders::window`).

use std::path::{Path, PathBuf};

use allocview_loaders::binary::{BinaryEventStream, StreamPoint};
use allocview_loaders::events::LoadSummary;
use allocview_sim::stream::window::{
    Before, EmptyWindow, ResolvedWindow, WindowSource, WindowSpec, resolve,
};
use allocview_sim::stream::{EventBatch, EventSource};
use allocview_sim::trace::EventKind;
use anyhow::{Context as _, Result, bail};

use allocview_loaders::Requests;

use super::options::WindowArgs;

/// A binary trace to stream, and the window of it, if any.
#[derive(Clone, Debug)]
pub struct StreamInput {
    pub file: PathBuf,
    window: Option<ResolvedWindow>,
    /// Which requests of a trace recorded in a CPython interpreter are read.
    pub requests: Requests,
    /// Which heap's events are read (0: malloc's).
    pub heap: u32,
}

impl StreamInput {
    /// The `requests` of heap `heap` of `file`, with the window `args` asks for found in
    /// them, said on stderr as a loaded window is.
    pub fn new(file: &Path, args: &WindowArgs, requests: Requests, heap: u32) -> Result<Self> {
        let window = match args.spec()? {
            None => None,
            Some(spec) => {
                let w = find(file, &spec, requests, heap)
                    .with_context(|| format!("window of {}", file.display()))?;
                announce_window(file, &w);
                Some(w)
            }
        };
        Ok(Self {
            file: file.to_owned(),
            window,
            requests,
            heap,
        })
    }

    /// How many events `source` (a read of this input) hands out: the file's, or the
    /// window's with the allocations carried into it.
    pub fn events_hint(&self, source: &Source) -> u64 {
        match self.window {
            Some(w) => w.carried_in + (w.end - w.start) as u64,
            None => source.stream().index().records(),
        }
    }

    /// A new read of the trace from its start.
    pub fn open(&self) -> Result<Source> {
        let stream = BinaryEventStream::open(&self.file)
            .with_context(|| format!("while opening {}", self.file.display()))?
            .with_requests(self.requests)
            .with_heap(self.heap);
        Ok(match self.window {
            None => Source::Whole(stream),
            Some(w) => Source::Window(WindowSource::new(stream, w)),
        })
    }
}

fn find(file: &Path, spec: &WindowSpec, requests: Requests, heap: u32) -> Result<ResolvedWindow> {
    let mut stream = BinaryEventStream::open(file)
        .with_context(|| format!("while opening {}", file.display()))?
        .with_requests(requests)
        .with_heap(heap);
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
pub enum Source {
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
    pub fn stream(&self) -> &BinaryEventStream {
        match self {
            Self::Whole(s) => s,
            Self::Window(w) => w.inner(),
        }
    }

    /// What the loader counted of the file; of a window, the counts of its events' kinds
    /// (as a loaded trace's window gives them: [`super::window::summary_from_kinds`]).
    pub fn summary(&self) -> LoadSummary {
        let mut s = self.stream().summary().clone();
        if let Self::Window(w) = self {
            let f = w.figures();
            let n = |k: EventKind| f.kinds.get(k as usize).copied().unwrap_or(0);
            s.events = f.events;
            s.mallocs = n(EventKind::Alloc) + n(EventKind::AllocFailed);
            s.mallocs_failed = n(EventKind::AllocFailed);
            s.frees = n(EventKind::Free) + n(EventKind::FreeNull) + n(EventKind::FreeUnknown);
            s.frees_null = n(EventKind::FreeNull);
            s.set_frees_unknown(n(EventKind::FreeUnknown));
        }
        s
    }

    pub fn events_per_thread(&self) -> Vec<u64> {
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

    pub fn peak_live_bytes(&self) -> u64 {
        match self {
            Self::Whole(s) => s.peak_live_bytes(),
            Self::Window(w) => w.figures().peak_live_bytes,
        }
    }

    pub fn peak_live_event(&self) -> u64 {
        match self {
            Self::Whole(s) => s.peak_live_event(),
            Self::Window(w) => w.figures().peak_live_event,
        }
    }

    pub fn thread_ids(&self) -> &[u64] {
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
    resume: Option<ResumePoint>,
) -> Result<WindowTables> {
    let Some(spec) = args.spec()? else {
        bail!("{}: no window asked for", file.display());
    };
    let window = open_window(file, spec, resume)?;
    let threads = window.inner().index().threads.clone();
    let read_from_event = window.inner().summary().events;
    let mut source = Source::Window(window);
    let mut batch = EventBatch::default();
    let mut columns = WindowColumns::default();
    while source
        .next_batch(&mut batch)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("while reading {}", file.display()))?
    {
        columns.push(&batch);
        if let Some(p) = progress {
            // In bytes of the file, as a loader reports its progress.
            p.store(
                source.stream().bytes_read(),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }
    // As the loader: a thread index in one byte while the file's threads fit.
    let narrow_threads = threads.len().max(source.thread_ids().len()) <= 256;
    let events = columns.into_frame(narrow_threads)?;
    let tids = if threads.is_empty() {
        source.thread_ids().to_vec()
    } else {
        threads
    };
    let thread_table = thread_table(tids)?;
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

/// The window's events as they come: one read of the file up to the window's end, from the
/// resume point given (taken from a read of this file) when the window starts after it, else
/// from the file's first event.
fn open_window(
    file: &Path,
    spec: WindowSpec,
    resume: Option<ResumePoint>,
) -> Result<WindowSource<BinaryEventStream>> {
    let resumed = match resume.filter(|r| r.before.precedes(&spec)) {
        Some(r) => {
            let stream = BinaryEventStream::open_at(file, &r.stream)
                .with_context(|| format!("while opening {}", file.display()))?;
            WindowSource::resume(stream, spec, r.before)
        }
        None => None,
    };
    match resumed {
        Some(w) => Ok(w),
        None => Ok(WindowSource::as_they_come(
            BinaryEventStream::open(file)
                .with_context(|| format!("while opening {}", file.display()))?,
            spec,
        )),
    }
}

/// The event table's columns of a window, gathered batch by batch.
#[derive(Default)]
struct WindowColumns {
    t_ns: Vec<i64>,
    thread: Vec<u16>,
    kind: Vec<u8>,
    size_bytes: Vec<u64>,
    address: Vec<u64>,
    alloc_id: Vec<u32>,
    size_class: Vec<u8>,
}

impl WindowColumns {
    fn push(&mut self, batch: &EventBatch) {
        self.t_ns.extend_from_slice(&batch.t_ns);
        self.kind.extend_from_slice(&batch.kind);
        self.size_bytes.extend_from_slice(&batch.size_bytes);
        self.address.extend_from_slice(&batch.addr);
        self.alloc_id.extend_from_slice(&batch.alloc_id);
        self.thread.extend_from_slice(&batch.thread);
        self.size_class.extend(
            batch
                .size_bytes
                .iter()
                .map(|&s| allocview_sim::trace::size_class(s)),
        );
    }

    /// The columns a loaded trace's window has, in its order and types: `alloc_id` null where
    /// an event has none, `thread` in one byte when `narrow_threads`.
    fn into_frame(self, narrow_threads: bool) -> Result<polars::prelude::DataFrame> {
        use polars::prelude::*;
        let height = self.t_ns.len();
        let id_col = allocview_loaders::events::alloc_id_column(self.alloc_id);
        let thread_col = if narrow_threads {
            let narrow: Vec<u8> = self
                .thread
                .iter()
                .map(|&t| u8::try_from(t).unwrap_or(u8::MAX))
                .collect();
            UInt8Chunked::from_vec("thread".into(), narrow).into_column()
        } else {
            UInt16Chunked::from_vec("thread".into(), self.thread).into_column()
        };
        Ok(DataFrame::new(
            height,
            vec![
                Int64Chunked::from_vec("t_ns".into(), self.t_ns).into_column(),
                thread_col,
                UInt8Chunked::from_vec("kind".into(), self.kind).into_column(),
                UInt64Chunked::from_vec("size_bytes".into(), self.size_bytes).into_column(),
                UInt64Chunked::from_vec("address".into(), self.address).into_column(),
                id_col.into_column(),
                UInt8Chunked::from_vec("size_class".into(), self.size_class).into_column(),
            ],
        )?)
    }
}

/// The threads table of a window: each thread index and the file's id of that thread.
fn thread_table(tids: Vec<u64>) -> Result<polars::prelude::DataFrame> {
    use polars::prelude::*;
    let n = tids.len();
    Ok(DataFrame::new(
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
    )?)
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

/// Where a read of the trace can go on from: the block stream's state and the allocations
/// live after the events before it.
#[derive(Clone)]
pub struct ResumePoint {
    pub stream: StreamPoint,
    pub before: Before,
}
