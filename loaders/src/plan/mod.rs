//! Memory plans: buffers whose lifetimes are known in advance, for the static planners of
//! [`allocview_sim::plan`].
//!
//! Every source becomes one DataFrame of buffers (schema below), and [`MemoryPlan::to_buffers`]
//! turns it into the simulator's [`Buffer`]s. Sources:
//!
//! - minimalloc's CSV ([`minimalloc`]): `id,lower,upper,size[,alignment][,offset]`, columns in any
//!   order, or the old `start,end` header whose `end` is inclusive;
//! - allocview's JSON graph plan ([`graph`]): operators in execution order with the tensors they
//!   produce and read and MegEngine-style overwrite specs;
//! - a TensorFlow memory log ([`from_tf`]): one step's tensor allocations, in log order;
//! - a malloc trace of any kind ([`from_trace`]): each allocation's lifetime in event order, as
//!   the `oracle` policy plans it.
//!
//! The first two are recognised by content ([`detect_plan`]); [`load_any`] also accepts traces
//! and memory logs and converts them.
//!
//! # The buffer DataFrame
//!
//! One row per buffer. Lifetimes are half-open: the buffer is live from `lower` up to, not
//! including, `upper`, in the source's time unit ([`MemoryPlan::time_unit`]).
//!
//! | column | dtype | meaning |
//! |---|---|---|
//! | `id` | String | the buffer's name in the source (unique) |
//! | `size_bytes` | UInt64 | bytes the buffer needs |
//! | `lower` | UInt64 | first time unit it is live |
//! | `upper` | UInt64 | first time unit it is dead again |
//! | `align_bytes` | UInt64, optional | the offset must be a multiple of it (a power of two) |
//! | `parent` | String, nullable, optional | id of the buffer this one overwrites (lives inside) |
//! | `offset_bytes` | UInt64, nullable, optional | where it starts inside `parent` |
//! | `planned_offset_bytes` | UInt64, optional | an offset the file already gives (a minimalloc solution) |
//!
//! Optional columns are present only when the source has them.

pub mod from_tf;
pub mod from_trace;
pub mod graph;
pub mod minimalloc;

use std::collections::HashMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use allocview_sim::plan::Buffer;
use polars::prelude::*;

use crate::error::LoadError;
use crate::events::LoadOptions;

/// Where a plan came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanFormat {
    /// minimalloc's CSV.
    MinimallocCsv,
    /// allocview's JSON graph plan.
    GraphJson,
    /// A TensorFlow memory log, one step of it.
    TfMemoryLog,
    /// A malloc trace (text or binary).
    MallocTrace,
}

impl PlanFormat {
    /// Name used in reports and JSON.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::MinimallocCsv => "minimalloc-csv",
            Self::GraphJson => "graph-json",
            Self::TfMemoryLog => "tf-memory-log",
            Self::MallocTrace => "malloc-trace",
        }
    }
}

/// A loaded plan: the buffer DataFrame and what it came from.
#[derive(Clone, Debug)]
pub struct MemoryPlan {
    pub path: PathBuf,
    pub format: PlanFormat,
    /// One row per buffer; see the module docs.
    pub buffers: DataFrame,
    /// What one unit of `lower` and `upper` is, in the singular ("operator", "event", ...).
    pub time_unit: &'static str,
    /// What the conversion chose or skipped, for the user (e.g. which step of a memory log).
    pub notes: Vec<String>,
    pub load_seconds: f64,
}

/// A plan's buffers in the simulator's terms, with their ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanBuffers {
    /// The id of each buffer (same order as `buffers`).
    pub ids: Vec<String>,
    pub buffers: Vec<Buffer>,
    /// Offsets the file gave (a minimalloc solution), when it has them.
    pub planned_offsets: Option<Vec<u64>>,
}

/// One buffer, as the sources build it before it becomes a DataFrame row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanRow {
    pub id: String,
    pub size_bytes: u64,
    pub lower: u64,
    pub upper: u64,
    pub align_bytes: u64,
    /// `(parent id, offset inside it)` for an overwrite.
    pub overwrite: Option<(String, u64)>,
    pub planned_offset_bytes: Option<u64>,
}

impl PlanRow {
    /// A plain buffer: no alignment, no overwrite, no given offset.
    #[must_use]
    pub fn new(id: String, size_bytes: u64, lower: u64, upper: u64) -> Self {
        Self {
            id,
            size_bytes,
            lower,
            upper,
            align_bytes: 1,
            overwrite: None,
            planned_offset_bytes: None,
        }
    }
}

/// Which optional columns [`rows_frame`] writes even when every row has the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameColumns {
    /// Write `align_bytes` (the source declares alignments).
    pub align: bool,
}

/// Builds the buffer DataFrame from rows. `align_bytes` is written when `columns.align` is set or
/// any row is aligned; `parent`/`offset_bytes` when any row overwrites; `planned_offset_bytes`
/// when every row has one.
///
/// # Errors
/// A polars error (none expected for well-formed rows).
pub fn rows_frame(rows: &[PlanRow], columns: FrameColumns) -> PolarsResult<DataFrame> {
    let n = rows.len();
    let mut cols: Vec<Column> = vec![
        Column::new(
            "id".into(),
            rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ),
        Column::new(
            "size_bytes".into(),
            rows.iter().map(|r| r.size_bytes).collect::<Vec<_>>(),
        ),
        Column::new(
            "lower".into(),
            rows.iter().map(|r| r.lower).collect::<Vec<_>>(),
        ),
        Column::new(
            "upper".into(),
            rows.iter().map(|r| r.upper).collect::<Vec<_>>(),
        ),
    ];
    if columns.align || rows.iter().any(|r| r.align_bytes != 1) {
        cols.push(Column::new(
            "align_bytes".into(),
            rows.iter().map(|r| r.align_bytes).collect::<Vec<_>>(),
        ));
    }
    if rows.iter().any(|r| r.overwrite.is_some()) {
        cols.push(Column::new(
            "parent".into(),
            rows.iter()
                .map(|r| r.overwrite.as_ref().map(|(p, _)| p.as_str()))
                .collect::<Vec<_>>(),
        ));
        cols.push(Column::new(
            "offset_bytes".into(),
            rows.iter()
                .map(|r| r.overwrite.as_ref().map(|&(_, o)| o))
                .collect::<Vec<_>>(),
        ));
    }
    if n > 0 && rows.iter().all(|r| r.planned_offset_bytes.is_some()) {
        cols.push(Column::new(
            "planned_offset_bytes".into(),
            rows.iter()
                .map(|r| r.planned_offset_bytes.unwrap_or(0))
                .collect::<Vec<_>>(),
        ));
    }
    DataFrame::new(n, cols)
}

impl MemoryPlan {
    /// Number of buffers.
    #[must_use]
    pub fn len(&self) -> usize {
        self.buffers.height()
    }

    /// True when the plan has no buffer.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.buffers.height() == 0
    }

    /// The buffers in the simulator's terms. Overwrite parents are resolved by id.
    ///
    /// # Errors
    /// A missing or mistyped column, a null in a required column, a duplicate id when parents
    /// are named, or a parent id that names no buffer.
    pub fn to_buffers(&self) -> Result<PlanBuffers, LoadError> {
        frame_buffers(&self.buffers, &self.path)
    }
}

/// [`MemoryPlan::to_buffers`] for any buffer DataFrame (`path` names it in errors).
///
/// # Errors
/// See [`MemoryPlan::to_buffers`].
pub fn frame_buffers(df: &DataFrame, path: &Path) -> Result<PlanBuffers, LoadError> {
    let bad = |what: String| LoadError::format(path, what);
    let u64_col = |name: &str| -> Result<Vec<u64>, LoadError> {
        let col = df.column(name)?.cast(&DataType::UInt64)?;
        let ca = col.u64()?;
        if ca.null_count() > 0 {
            return Err(bad(format!("column {name} has nulls")));
        }
        Ok(ca.into_no_null_iter().collect())
    };
    let ids: Vec<String> = {
        let ca = df.column("id")?.str()?;
        if ca.null_count() > 0 {
            return Err(bad("column id has nulls".to_owned()));
        }
        ca.iter()
            .map(|s| s.unwrap_or_default().to_owned())
            .collect()
    };
    let size = u64_col("size_bytes")?;
    let lower = u64_col("lower")?;
    let upper = u64_col("upper")?;
    let align = if df.column("align_bytes").is_ok() {
        Some(u64_col("align_bytes")?)
    } else {
        None
    };
    let mut buffers: Vec<Buffer> = size
        .iter()
        .zip(&lower)
        .zip(&upper)
        .enumerate()
        .map(|(i, ((&s, &l), &u))| {
            let a = align.as_ref().and_then(|a| a.get(i)).copied().unwrap_or(1);
            Buffer::new(s, l, u).with_align(a)
        })
        .collect();
    if let Ok(parent) = df.column("parent") {
        let parent = parent.str()?;
        let offsets = df.column("offset_bytes")?.cast(&DataType::UInt64)?;
        let offsets = offsets.u64()?;
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            if index.insert(id.as_str(), i).is_some() {
                return Err(bad(format!(
                    "buffer id {id:?} appears twice, so a parent naming it is ambiguous"
                )));
            }
        }
        for (i, (p, off)) in parent.iter().zip(offsets.iter()).enumerate() {
            let Some(p) = p else { continue };
            let &pi = index.get(p).ok_or_else(|| {
                bad(format!(
                    "buffer {:?} overwrites {p:?}, which is no buffer of the plan",
                    ids.get(i).map_or("", String::as_str)
                ))
            })?;
            if let Some(b) = buffers.get_mut(i) {
                *b = b.overwriting(pi, off.unwrap_or(0));
            }
        }
    }
    let planned_offsets = if df.column("planned_offset_bytes").is_ok() {
        Some(u64_col("planned_offset_bytes")?)
    } else {
        None
    };
    Ok(PlanBuffers {
        ids,
        buffers,
        planned_offsets,
    })
}

/// How many decompressed bytes [`detect_plan`] looks at.
pub const DETECT_HEAD_BYTES: u64 = 64 * 1024;

/// Tells whether a (possibly gzipped) file is a plan file, from its first
/// [`DETECT_HEAD_BYTES`]: a CSV whose first non-empty line is a minimalloc header, or a JSON
/// object with an `"operators"` key.
///
/// # Errors
/// When the file cannot be opened.
pub fn detect_plan(path: &Path) -> Result<Option<PlanFormat>, LoadError> {
    let reader = crate::input::open_text(path)?;
    let mut head = Vec::new();
    // A read error (a truncated gzip stream) only shortens what is sniffed.
    reader.take(DETECT_HEAD_BYTES).read_to_end(&mut head).ok();
    let text = String::from_utf8_lossy(&head);
    let text = text.trim_start_matches('\u{feff}');
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') && trimmed.contains("\"operators\"") {
        return Ok(Some(PlanFormat::GraphJson));
    }
    let first = text.lines().map(str::trim).find(|l| !l.is_empty());
    if first.is_some_and(minimalloc::is_header) {
        return Ok(Some(PlanFormat::MinimallocCsv));
    }
    Ok(None)
}

/// Options for [`load_any`].
#[derive(Clone, Debug, Default)]
pub struct PlanLoadOptions {
    /// For traces and CSVs: strict or lenient parsing; progress.
    pub load: LoadOptions,
    /// For memory logs: the step to plan (default: the one with the most allocations).
    pub step: Option<i64>,
}

/// Loads a plan file (minimalloc CSV or JSON graph plan, detected by content).
///
/// # Errors
/// When the file is neither, or does not parse.
pub fn load_plan_file(path: &Path, opts: &LoadOptions) -> Result<MemoryPlan, LoadError> {
    match detect_plan(path)? {
        Some(PlanFormat::GraphJson) => graph::load_graph_json(path),
        Some(PlanFormat::MinimallocCsv) => minimalloc::load_minimalloc_csv(path, opts.strictness),
        _ => Err(LoadError::format(
            path,
            "unrecognised plan: expected a minimalloc CSV (header `id,lower,upper,size`) or a \
             JSON graph plan (an object with an \"operators\" array)",
        )),
    }
}

/// Loads anything allocview can plan: a plan file, a malloc trace (text or binary), or a
/// TensorFlow memory log.
///
/// # Errors
/// When the file is none of these or fails to load or convert.
pub fn load_any(path: &Path, opts: &PlanLoadOptions) -> Result<MemoryPlan, LoadError> {
    let start = Instant::now();
    let loaded = crate::load(path, &opts.load)?;
    let warnings = match &loaded {
        crate::Loaded::MallocTrace(t) => t.summary.warnings(),
        crate::Loaded::TfMemoryLog(log) => log.summary.warnings(),
        crate::Loaded::PytorchSnapshot(s) => s.warnings.clone(),
        crate::Loaded::HeapProfile(p) => p.notes.clone(),
        crate::Loaded::Plan(_) | crate::Loaded::TfBfcDump(_) => Vec::new(),
    };
    let mut plan = from_loaded(loaded, path, opts.step)?;
    plan.notes.extend(warnings);
    plan.load_seconds = start.elapsed().as_secs_f64();
    Ok(plan)
}

/// The plan of any loaded input: a plan as it is, a trace or a memory log converted
/// ([`from_trace`], [`from_tf`] with `step`). The conversions' `load_seconds` are 0, and their
/// notes say what was converted, not what the loader warned about ([`load_any`] adds that).
///
/// # Errors
/// A BFC dump (no lifetimes), or a conversion error.
pub fn from_loaded(
    loaded: crate::Loaded,
    path: &Path,
    step: Option<i64>,
) -> Result<MemoryPlan, LoadError> {
    match loaded {
        crate::Loaded::Plan(plan) => Ok(*plan),
        crate::Loaded::MallocTrace(trace) => {
            let view = crate::trace_view(&trace.events, path)?;
            from_trace::plan_from_trace(&view, path)
        }
        crate::Loaded::TfMemoryLog(log) => from_tf::plan_from_memory_log(&log, step, path),
        // A snapshot's allocations as its trace shows them (requested sizes).
        crate::Loaded::PytorchSnapshot(s) => {
            let view = crate::trace_view(&s.events, path)?;
            from_trace::plan_from_trace(&view, path)
        }
        crate::Loaded::HeapProfile(_) => Err(LoadError::format(
            path,
            "a heap profile is one moment by call stack and holds no lifetimes, so there is \
             nothing to plan",
        )),
        crate::Loaded::TfBfcDump(_) => Err(LoadError::format(
            path,
            "a BFC dump is one moment of a heap and holds no lifetimes, so there is nothing to \
             plan (a TensorFlow memory log of the same run has them)",
        )),
    }
}
