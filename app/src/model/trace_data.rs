//! What the explorers know of their input ([`TraceData`]): the event table, and what a BFC
//! dump, a PyTorch snapshot or a memory plan adds, loaded once and shared with the worker
//! threads; read whole, or a window of a trace too big to load, block by block.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use allocview_loaders::Loaded;
use allocview_sim::heap::Block;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::stream::window::WindowSpec;
use allocview_sim::trace::{EventKind, TraceView};
use polars::prelude::*;

use crate::session::input::{self, Opened, StreamedWindow};
use crate::session::source::ResumePoint;

/// A loaded trace, immutable and shared with the worker threads.
pub struct TraceData {
    pub path: PathBuf,
    /// `malloc-trace`, `tf-memory-log` or `tf-bfc-dump` (shown in the status line).
    pub format: &'static str,
    /// The event table (empty for a BFC dump, which is one moment, not a history), without the
    /// columns kept compact beside it ([`slim_events`]).
    pub events: DataFrame,
    /// The `address` and `stack_id` columns, compact (see [`super::compact`]).
    compact: CompactColumns,
    /// The threads table (thread index -> id in the file).
    #[allow(dead_code)]
    pub threads: DataFrame,
    pub load_seconds: f64,
    pub num_allocs: u32,
    /// Load warnings, shown once in the status line.
    pub warnings: Vec<String>,
    /// A TensorFlow BFC dump: the file itself, or the one a memory log ends in.
    pub dump: Option<DumpData>,
    /// A memory plan: its buffers and the plans the explorers can show.
    pub plan: Option<PlanData>,
    /// A PyTorch snapshot: settings, rebuilt start state, frames and phases.
    pub snapshot: Option<SnapshotData>,
    /// The input's call stacks (a snapshot's frames, a recorded trace's stacks), if any.
    site_stacks: Option<allocview_loaders::sites::StackTable>,
    /// Every event's allocation site (call stacks, operations or size classes), built on
    /// first use: only the sites panel needs it (4 bytes an event).
    sites: std::sync::OnceLock<allocview_loaders::analysis::site_stats::EventSites>,
    /// Birth and death event of every allocation id, built on first use (8 bytes per
    /// allocation; only the desktop app's hover needs it).
    lifetimes: std::sync::OnceLock<Vec<(u32, u32)>>,
    /// The part of the trace shown, when it is a window (`--from/--to/--events`, or the first
    /// events of a trace too big to load).
    pub part: Option<Part>,
    /// The background read of the whole of a trace too big to load (its overview, and where
    /// other parts resume from).
    pub scan: Option<Arc<super::scan::Scan>>,
    /// The recorded program's resident memory over time (a trace made by `record`).
    pub memory: Vec<allocview_loaders::binary::MemorySample>,
    /// The run's marks (a trace made by `record`), in time order.
    pub marks: Vec<allocview_loaders::binary::Mark>,
}

/// A window of a trace, as its events `start..end` of `trace_events`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub start: u64,
    pub end: u64,
    pub trace_events: u64,
}

/// What the explorers show of a BFC dump: its heap, its bins and what it says about the OOM.
pub struct DumpData {
    pub allocator: String,
    pub blocks: Vec<Block>,
    pub bins: Option<Vec<allocview_sim::policy::bfc::BinInfo>>,
    /// The OOM request, the figures and the diagnosis, one line each.
    pub lines: Vec<String>,
}

impl DumpData {
    pub(crate) fn of(d: &allocview_loaders::tf::dump::BfcDump) -> Self {
        use crate::format::{bytes, count};
        let f = &d.figures;
        let mut lines = Vec::new();
        if let Some(o) = &d.oom {
            lines.push(format!(
                "OOM: {} requested{}{}",
                o.text,
                o.rounded_bytes
                    .map_or_else(String::new, |r| format!(" (rounded to {r})")),
                o.op.as_ref()
                    .map_or_else(String::new, |op| format!(" by op {op}"))
            ));
        }
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), bytes);
        let optn = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), count);
        lines.push(format!(
            "in use {} in {} chunks; free {} in {} chunks (largest {}); {} regions of {}",
            opt(f.in_use_bytes),
            optn(f.in_use_chunks),
            opt(f.free_bytes),
            optn(f.free_chunks),
            opt(f.largest_free_chunk_bytes),
            optn(f.regions),
            opt(f.region_bytes)
        ));
        if let Some(diag) = d.diagnosis() {
            lines.push(diag);
        }
        if !d.missing.is_empty() {
            lines.push(format!("not in this dump: {}", d.missing.join(", ")));
        }
        Self {
            allocator: d.allocator.clone().unwrap_or_else(|| "BFC".to_owned()),
            blocks: d.blocks(),
            bins: d.to_bfc().ok().map(|b| b.bins()),
            lines,
        }
    }
}

/// What the explorers show of a PyTorch snapshot beyond its events.
pub struct SnapshotData {
    /// The allocator settings the snapshot recorded (the `pytorch` policy's defaults).
    pub settings: allocview_sim::policy::pytorch::PytorchSettings,
    /// The rebuilt start state and recorded addresses the `pytorch` policy replays from.
    pub script: Arc<allocview_sim::policy::pytorch::PytorchScript>,
    /// Phase markers: `(t_ns, stage, name)`.
    pub annotations: Vec<(i64, String, String)>,
    /// Settings and the state at the snapshot's moment, one line each.
    pub lines: Vec<String>,
}

impl SnapshotData {
    pub(crate) fn of(s: &allocview_loaders::pytorch::PytorchSnapshot) -> Self {
        use crate::format::{bytes, count};
        let reserved: u64 = s.raw_segments.iter().map(|g| g.total_bytes).sum();
        let allocated: u64 = s.raw_segments.iter().map(|g| g.allocated_bytes).sum();
        let requested: u64 = s.raw_segments.iter().map(|g| g.requested_bytes).sum();
        let mut lines = vec![format!(
            "device {}: {} segments, {} reserved, {} allocated, {} requested at the snapshot; \
             {} allocations carried in from before the trace",
            s.device,
            count(s.raw_segments.len() as u64),
            bytes(reserved),
            bytes(allocated),
            bytes(requested),
            count(u64::from(s.carried_in))
        )];
        if s.settings.present {
            let kv: Vec<String> = s
                .settings
                .raw
                .iter()
                .filter(|(k, _)| k != "roundup_power2_divisions")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            lines.push(format!("settings: {}", kv.join(", ")));
        }
        Self {
            settings: s.settings.policy.clone(),
            script: Arc::new(s.script.clone()),
            annotations: s
                .raw_annotations
                .iter()
                .map(|a| {
                    (
                        a.time_us
                            .saturating_sub(s.time_origin_us)
                            .saturating_mul(1000),
                        a.stage.clone(),
                        a.name.clone(),
                    )
                })
                .collect(),
            lines,
        }
    }
}

/// A memory plan file in the explorers: its buffers and a few plans of them.
pub struct PlanData {
    pub buffers: Vec<allocview_sim::plan::Buffer>,
    /// `(planner name, plan)`: the file's own offsets first when it has them, then planners
    /// fast enough to run at load (greedy-by-size, pushdown).
    pub plans: Vec<(String, allocview_sim::plan::Plan)>,
    pub lower_bound_bytes: u64,
    pub naive_bytes: u64,
    /// What one unit of time is ("operator", "event").
    pub time_unit: &'static str,
}

impl PlanData {
    fn of(p: &allocview_loaders::plan::MemoryPlan) -> Result<Self, String> {
        use allocview_sim::plan::{Plan, PlanOptions, run_planner};
        let pb = p.to_buffers().map_err(|e| e.to_string())?;
        let lower_bound_bytes =
            allocview_sim::plan::max_live_bytes(&pb.buffers).map_err(|e| e.to_string())?;
        let naive_bytes = pb.buffers.iter().map(|b| b.size_bytes).sum();
        let mut plans = Vec::new();
        if let Some(offsets) = &pb.planned_offsets {
            let total_bytes = pb
                .buffers
                .iter()
                .zip(offsets)
                .map(|(b, &o)| o + b.size_bytes)
                .max()
                .unwrap_or(0);
            let plan = Plan {
                offsets: offsets.clone(),
                total_bytes,
            };
            if allocview_sim::plan::validate(&pb.buffers, &plan).is_ok() {
                plans.push(("the file's offsets".to_owned(), plan));
            }
        }
        for name in ["greedy-by-size", "pushdown"] {
            let r = run_planner(name, &pb.buffers, &PlanOptions::default())
                .map_err(|e| e.to_string())?;
            plans.push((name.to_owned(), r.plan));
        }
        Ok(Self {
            buffers: pb.buffers,
            plans,
            lower_bound_bytes,
            naive_bytes,
            time_unit: p.time_unit,
        })
    }
}

/// What an input loaded in memory holds for the explorers, by kind, its event table not yet
/// slimmed ([`slim_events`]).
struct Contents {
    format: &'static str,
    events: DataFrame,
    threads: DataFrame,
    load_seconds: f64,
    dump: Option<DumpData>,
    plan: Option<PlanData>,
    snapshot: Option<SnapshotData>,
    site_stacks: Option<allocview_loaders::sites::StackTable>,
    memory: Vec<allocview_loaders::binary::MemorySample>,
    marks: Vec<allocview_loaders::binary::Mark>,
}

impl Contents {
    /// What `loaded` holds: its tables, and what a dump, a snapshot or a plan adds.
    ///
    /// # Errors
    /// A memory plan whose buffers or planners fail.
    fn of(loaded: Loaded) -> Result<Self, String> {
        let site_stacks = match &loaded {
            Loaded::MallocTrace(t) => t.stacks.clone(),
            Loaded::PytorchSnapshot(s) => Some(s.stacks.clone()),
            Loaded::TfMemoryLog(_) | Loaded::TfBfcDump(_) | Loaded::Plan(_) => None,
            Loaded::HeapProfile(p) => {
                return Err(format!(
                    "a {} heap profile is a moment by call stack, with no events to draw over \
                     time: `allocview sites`, `flamegraph`, `diff` and `export` read it",
                    p.format.name()
                ));
            }
        };
        // What a kind below does not set stays empty.
        let none = Self {
            format: "",
            events: DataFrame::empty(),
            threads: DataFrame::empty(),
            load_seconds: 0.0,
            dump: None,
            plan: None,
            snapshot: None,
            site_stacks,
            memory: Vec::new(),
            marks: Vec::new(),
        };
        Ok(match loaded {
            Loaded::MallocTrace(t) => Self {
                format: crate::session::input::trace_format(&t),
                events: t.events,
                threads: t.threads,
                load_seconds: t.load_seconds,
                memory: t.memory,
                marks: t.marks,
                ..none
            },
            Loaded::PytorchSnapshot(s) => {
                let snapshot = Some(SnapshotData::of(&s));
                let s = *s;
                Self {
                    format: "pytorch-snapshot",
                    events: s.events,
                    threads: s.threads,
                    load_seconds: s.load_seconds,
                    snapshot,
                    ..none
                }
            }
            Loaded::TfMemoryLog(log) => {
                let log = *log;
                Self {
                    format: "tf-memory-log",
                    dump: log.dumps.first().map(DumpData::of),
                    events: log.events,
                    threads: log.threads,
                    load_seconds: log.load_seconds,
                    ..none
                }
            }
            Loaded::TfBfcDump(d) => Self {
                format: "tf-bfc-dump",
                dump: Some(DumpData::of(&d)),
                ..none
            },
            Loaded::Plan(p) => Self {
                format: "memory-plan",
                plan: Some(PlanData::of(&p)?),
                load_seconds: p.load_seconds,
                ..none
            },
            Loaded::HeapProfile(_) => none,
        })
    }
}

/// Where a read of window `spec` of the trace at `path` can start from: the latest resume
/// point before it that the background read of the trace has found, if any.
fn resume_point(path: &Path, spec: &WindowSpec) -> Option<ResumePoint> {
    super::scan::existing(path).and_then(|scan| scan.point_for(spec))
}

/// Lines of a stack the explorers show (the site, then the program's own frames outward).
const MAX_FRAME_LINES: usize = 24;

/// `lifetimes` value for an allocation never freed.
const NEVER: u32 = u32::MAX;

/// How an explorer opens its input, besides the window.
#[derive(Clone, Copy, Debug, Default)]
pub struct Opening {
    /// Skip malformed lines (`--lenient`).
    pub lenient: bool,
    /// `--device`: which device's events of a PyTorch profiler trace.
    pub device: Option<allocview_loaders::kineto::DeviceChoice>,
    /// `--heap`: which heap's events of a binary trace (0: malloc's).
    pub heap: u32,
    /// Keep the events' `call` column (the real-allocator rows replay a `realloc` as one).
    pub keep_calls: bool,
}

impl TraceData {
    /// Loads and validates a trace, a TensorFlow memory log, a BFC dump, a PyTorch snapshot or
    /// a memory plan, as the session opens it for an explorer
    /// ([`crate::session::input::open_for_explorer`]): whole, the window asked for, or the
    /// first part of a trace too big to load.
    ///
    /// # Errors
    /// A readable message naming the file.
    pub fn load(
        path: &Path,
        lenient: bool,
        window: &crate::session::WindowArgs,
        progress: Arc<AtomicU64>,
    ) -> Result<Self, String> {
        let opening = Opening {
            lenient,
            device: None,
            heap: 0,
            keep_calls: false,
        };
        Self::load_with(path, &opening, window, progress)
    }

    /// [`Self::load`], keeping the events' `call` column when `keep_calls` (the real-allocator
    /// rows replay a `realloc` as one; the explorers drop the column otherwise).
    ///
    /// # Errors
    /// As [`Self::load`].
    pub fn load_with(
        path: &Path,
        opening: &Opening,
        window: &crate::session::WindowArgs,
        progress: Arc<AtomicU64>,
    ) -> Result<Self, String> {
        let keep_calls = opening.keep_calls;
        let started = std::time::Instant::now();
        let how = input::ExplorerLoad {
            lenient: opening.lenient,
            device: opening.device,
            heap: opening.heap,
        };
        match input::open_for_explorer(path, &how, window, &progress, |spec| {
            resume_point(path, spec)
        })? {
            Opened::Loaded {
                loaded,
                window,
                trace_events,
                warnings,
            } => {
                let part = window.map(|w| Part {
                    start: w.start as u64,
                    end: w.end as u64,
                    trace_events,
                });
                Self::of_loaded(path, *loaded, part, warnings, keep_calls)
            }
            Opened::Streamed(streamed) => Self::of_streamed(path, *streamed, started, keep_calls),
        }
    }

    /// The window `window` of the binary trace `path`, read block by block (see
    /// [`crate::session::input::read_window_for_explorer`]): memory holds the window, whatever
    /// the trace's length. The explorers open a trace too big to load this way.
    ///
    /// # Errors
    /// A readable message naming the file.
    pub fn load_streamed_window(
        path: &Path,
        window: &crate::session::WindowArgs,
        progress: &AtomicU64,
    ) -> Result<Self, String> {
        let started = std::time::Instant::now();
        let streamed = input::read_window_for_explorer(path, window, progress, |spec| {
            resume_point(path, spec)
        })?;
        Self::of_streamed(path, streamed, started, false)
    }

    /// An input loaded in memory, `part` of it when a window was cut.
    fn of_loaded(
        path: &Path,
        loaded: Loaded,
        part: Option<Part>,
        warnings: Vec<String>,
        keep_calls: bool,
    ) -> Result<Self, String> {
        let Contents {
            format,
            mut events,
            threads,
            load_seconds,
            dump,
            plan,
            snapshot,
            site_stacks,
            memory,
            marks,
        } = Contents::of(loaded)?;
        let num_allocs = if events.height() == 0 {
            0
        } else {
            allocview_loaders::trace_view(&events, path)
                .map_err(|e| e.to_string())?
                .num_allocs
        };
        let compact = slim_events(&mut events, keep_calls);
        Ok(Self {
            path: path.to_path_buf(),
            format,
            events,
            compact,
            threads,
            load_seconds,
            num_allocs,
            warnings,
            dump,
            plan,
            snapshot,
            site_stacks,
            sites: std::sync::OnceLock::new(),
            lifetimes: std::sync::OnceLock::new(),
            scan: None,
            part,
            memory,
            marks,
        })
    }

    /// A window of a trace too big to load, read since `started`; the background read of the
    /// whole trace starts with it.
    fn of_streamed(
        path: &Path,
        streamed: StreamedWindow,
        started: std::time::Instant,
        keep_calls: bool,
    ) -> Result<Self, String> {
        let StreamedWindow {
            tables: t,
            mut warnings,
        } = streamed;
        // The program's memory samples cover the whole recording; the timeline draws those in
        // the part's time span.
        let memory = allocview_loaders::binary::read_memory(path).unwrap_or_else(|e| {
            warnings.push(format!("{e}: the program's memory samples are left out"));
            Vec::new()
        });
        let marks = allocview_loaders::binary::read_marks(path).unwrap_or_else(|e| {
            warnings.push(format!("{e}: the run's marks are left out"));
            Vec::new()
        });
        // The whole trace is read once in the background (resume points and an overview),
        // started with the first part; a later part reads from the nearest point found so
        // far before it.
        let scan = super::scan::scan_of(path, t.trace_events);
        let num_allocs = allocview_loaders::trace_view(&t.events, path)
            .map_err(|e| e.to_string())?
            .num_allocs;
        let mut events = t.events;
        let compact = slim_events(&mut events, keep_calls);
        Ok(Self {
            path: path.to_path_buf(),
            format: "malloc-trace",
            events,
            compact,
            threads: t.threads,
            load_seconds: started.elapsed().as_secs_f64(),
            num_allocs,
            warnings,
            part: Some(Part {
                start: t.part.0,
                end: t.part.1,
                trace_events: t.trace_events,
            }),
            dump: None,
            plan: None,
            snapshot: None,
            site_stacks: None,
            sites: std::sync::OnceLock::new(),
            lifetimes: std::sync::OnceLock::new(),
            scan: Some(scan),
            memory,
            marks,
        })
    }

    /// The configuration replays of this input start from: a PyTorch snapshot's recorded
    /// settings and rebuilt start state go to the `pytorch` policy.
    #[must_use]
    pub fn policy_config(&self, mut config: PolicyConfig) -> PolicyConfig {
        if let Some(s) = &self.snapshot {
            config.pytorch = s.settings.clone();
            config.pytorch_script = Some(Arc::clone(&s.script));
        }
        config
    }

    /// `config` with the features `compare` gives `predictive`: each thread's recent calls and
    /// the allocation sites where the input has them (a malloc trace without stacks has none:
    /// its size-class stand-ins are not built). Without a readable thread column, unchanged:
    /// `predictive` then sees one thread.
    #[must_use]
    pub fn with_predictive_features(&self, mut config: PolicyConfig) -> PolicyConfig {
        let Ok(threads) = allocview_loaders::analysis::stats::thread_indices(&self.events) else {
            return config;
        };
        let sites = if self.format == "malloc-trace" && self.site_stacks.is_none() {
            None
        } else {
            self.sites()
        };
        let view = self.view();
        config.alloc_features = Some(Arc::new(crate::session::policies::features_with(
            &view, &threads, sites,
        )));
        config
    }

    /// The call stack of allocation `id` (the frames its `alloc` recorded), innermost first;
    /// empty when the input records none.
    #[must_use]
    pub fn frames_of_alloc(&self, id: u32) -> Vec<String> {
        let Some(stacks) = &self.site_stacks else {
            return Vec::new();
        };
        let Some((birth, _)) = self.lifetime(id) else {
            return Vec::new();
        };
        let stack = match &self.compact.stack_id {
            Some(ids) => ids.get(birth).and_then(|v| u32::try_from(v).ok()),
            None => self
                .events
                .column("stack_id")
                .ok()
                .and_then(|c| c.u32().ok())
                .and_then(|c| c.get(birth)),
        }
        .unwrap_or(allocview_loaders::sites::NO_STACK);
        stacks.site_lines(stack, MAX_FRAME_LINES, true)
    }

    /// Every event's site, built on first use; `None` for an input without events.
    #[must_use]
    pub fn sites(&self) -> Option<&allocview_loaders::analysis::site_stats::EventSites> {
        if self.events.height() == 0 {
            return None;
        }
        Some(self.sites.get_or_init(|| {
            use allocview_loaders::analysis::site_stats::{EventSites, SiteKind};
            match (&self.site_stacks, &self.compact.stack_id) {
                // What `from_events` makes of the column, from its compact form.
                (Some(stacks), Some(ids)) => {
                    let mut event_stack = Vec::with_capacity(ids.len());
                    ids.for_each(|v| {
                        event_stack
                            .push(u32::try_from(v).unwrap_or(allocview_loaders::sites::NO_STACK));
                    });
                    EventSites {
                        kind: SiteKind::Stacks,
                        stacks: stacks.clone(),
                        event_stack,
                    }
                }
                _ => EventSites::from_events(&self.events, self.site_stacks.as_ref()),
            }
        }))
    }

    /// The operation or kernel of event `i` (TensorFlow memory logs).
    #[must_use]
    pub fn op_at(&self, i: usize) -> Option<String> {
        let col = self.events.column("kernel").ok()?;
        col.str()
            .ok()?
            .get(i)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    }

    /// The event that allocated `id` and the event that freed it (`None` if it stays live).
    #[must_use]
    pub fn lifetime(&self, id: u32) -> Option<(usize, Option<usize>)> {
        let table = self.lifetimes.get_or_init(|| {
            let v = self.view();
            let mut t = vec![(NEVER, NEVER); v.num_allocs as usize];
            for (i, (&k, &a)) in v.kind.iter().zip(v.alloc_id).enumerate() {
                let i = u32::try_from(i).unwrap_or(NEVER);
                if let Some(slot) = t.get_mut(a as usize) {
                    if k == EventKind::Alloc.code() {
                        slot.0 = i;
                    } else if k == EventKind::Free.code() {
                        slot.1 = i;
                    }
                }
            }
            t
        });
        let &(birth, death) = table.get(id as usize)?;
        (birth != NEVER).then_some((birth as usize, (death != NEVER).then_some(death as usize)))
    }

    /// The simulator's view of the events, without revalidating them (done once in `load`).
    #[must_use]
    pub fn view(&self) -> TraceView<'_> {
        let df = &self.events;
        let slice_i64 = |name: &str| {
            df.column(name)
                .ok()
                .and_then(|c| c.i64().ok())
                .and_then(|c| c.cont_slice().ok())
                .unwrap_or(&[])
        };
        let slice_u8 = |name: &str| {
            df.column(name)
                .ok()
                .and_then(|c| c.u8().ok())
                .and_then(|c| c.cont_slice().ok())
                .unwrap_or(&[])
        };
        let sizes = df
            .column("size_bytes")
            .ok()
            .and_then(|c| c.u64().ok())
            .and_then(|c| c.cont_slice().ok())
            .unwrap_or(&[]);
        let ids = df
            .column("alloc_id")
            .ok()
            .and_then(|c| c.u32().ok())
            .and_then(|c| c.downcast_iter().next())
            .map_or(&[][..], |a| a.values().as_slice());
        TraceView::revalidated(
            slice_i64("t_ns"),
            slice_u8("kind"),
            sizes,
            ids,
            self.num_allocs,
        )
    }

    /// Number of events.
    #[must_use]
    pub fn len(&self) -> usize {
        self.events.height()
    }

    /// True for an input without events (a BFC dump).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.events.height() == 0
    }

    /// Thread index of event `i`.
    #[must_use]
    pub fn thread_at(&self, i: usize) -> u16 {
        let col = self.events.column("thread").ok();
        col.and_then(|c| match c.dtype() {
            DataType::UInt8 => c.u8().ok().and_then(|a| a.get(i)).map(u16::from),
            _ => c.u16().ok().and_then(|a| a.get(i)),
        })
        .unwrap_or(0)
    }

    /// Address of event `i`.
    #[must_use]
    pub fn address_at(&self, i: usize) -> u64 {
        if let Some(a) = &self.compact.address {
            return a.get(i).unwrap_or(0);
        }
        self.events
            .column("address")
            .ok()
            .and_then(|c| c.u64().ok())
            .and_then(|a| a.get(i))
            .unwrap_or(0)
    }
}

/// The event columns [`TraceData`] keeps compact; `None` for one left in the table.
#[derive(Debug, Default)]
struct CompactColumns {
    address: Option<super::compact::Compact>,
    stack_id: Option<super::compact::Compact>,
}

/// Slims the explorers' copy of the event table: drops the columns nothing of theirs reads
/// (`size_class` follows from the size; `call` is shown nowhere, and kept only when
/// `keep_calls`, for the real-allocator rows) and moves `address` and
/// `stack_id` into compact form ([`super::compact`]); an address column with nulls, or a column
/// of another type, stays in the table. On a 27-million-event trace this took 14 of the
/// table's 36 bytes an event.
fn slim_events(events: &mut DataFrame, keep_calls: bool) -> CompactColumns {
    let unread: &[&str] = if keep_calls {
        &["size_class"]
    } else {
        &["size_class", "call"]
    };
    for unread in unread {
        // Absent in inputs that do not have them: nothing to drop.
        let _ = events.drop_in_place(unread);
    }
    use super::compact::Compact;
    use allocview_loaders::sites::NO_STACK;
    let addresses = events
        .column("address")
        .ok()
        .and_then(|c| c.u64().ok())
        .filter(|c| c.null_count() == 0);
    let stack_ids = events.column("stack_id").ok().and_then(|c| c.u32().ok());
    // This runs before the replays can start: the two columns on two threads, their chunks
    // read as arrays. On the 27- and 30-million-event recordings that took 0.18 and 0.23 s,
    // against 0.26 and 0.47 s on one thread through the table's iterators.
    let (address, stack_id) = std::thread::scope(|scope| {
        let address = scope.spawn(|| {
            addresses.map(|c| {
                Compact::addresses(c.downcast_iter().flat_map(|a| a.values().iter().copied()))
            })
        });
        // A null stack id is "no stack", as everywhere else.
        let stack_id = stack_ids.map(|c| {
            Compact::ids(
                c.downcast_iter()
                    .flat_map(|a| a.iter().map(|v| v.copied().unwrap_or(NO_STACK))),
            )
        });
        (address.join().ok().flatten(), stack_id)
    });
    // Dropped only once encoded: a column that was not stays in the table.
    if address.is_some() {
        let _ = events.drop_in_place("address");
    }
    if stack_id.is_some() {
        let _ = events.drop_in_place("stack_id");
    }
    CompactColumns { address, stack_id }
}

#[cfg(test)]
#[path = "trace_data_tests.rs"]
mod tests;
