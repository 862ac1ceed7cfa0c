//! `stats`'s answer: the object `stats --json` prints for every kind of input (a trace's
//! summary, a TensorFlow memory log's allocators, a BFC dump's regions and bins, a PyTorch
//! snapshot's segments and stacks, a plan's sizes).

pub mod heaps;
pub mod pytorch;

use std::path::Path;

use allocview_loaders::Loaded;
use allocview_loaders::analysis::stats::{TraceStats, events_per_thread};
use allocview_loaders::tf::dump::BfcDump;
use allocview_loaders::tf::memlog::TfMemoryLog;
use anyhow::Result;
use serde::Serialize;
use serde_json::Value;

use crate::session::input::events_of;

/// What `stats --json` prints for an input with events: the trace's figures, then where they
/// came from, then what only a memory log or a snapshot has.
#[derive(Serialize)]
pub struct TraceAnswer<'a> {
    #[serde(flatten)]
    pub stats: &'a TraceStats,
    pub file: String,
    pub format: &'a str,
    pub load_seconds: f64,
    pub truncated: bool,
    /// Set by `stats --stream`, which reads a binary trace block by block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub streamed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tf: Option<MemlogAnswer<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pytorch: Option<Value>,
    /// The recorded program's own resident memory (a trace made by `record`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_memory: Option<crate::answers::recorded_memory::RecordedMemory>,
    /// The run's marks: named moments, and where recording stopped and started.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<crate::answers::marks::MarkAnswer>,
    /// The heap read, when `--heap` chose another than malloc's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heap: Option<String>,
    /// The trace's heaps (a binary trace whose program reported heaps of its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heaps: Option<Vec<heaps::HeapAnswer>>,
}

/// The `tf` object of `stats --json` for a memory log.
#[derive(Serialize)]
pub struct MemlogAnswer<'a> {
    allocator: &'a str,
    allocators: Vec<AllocatorRecords<'a>>,
    tensor_allocations: u64,
    raw_allocations: u64,
    steps: u64,
    regions: usize,
    region_bytes: u64,
    meminfo_peak_bytes: Option<u64>,
    meminfo: Vec<MeminfoAnswer<'a>>,
    dump: Option<DumpAnswer<'a>>,
}

#[derive(Serialize)]
struct AllocatorRecords<'a> {
    name: &'a str,
    records: u64,
}

#[derive(Serialize)]
struct MeminfoAnswer<'a> {
    line: u64,
    tag: &'a str,
    current_bytes: u64,
    peak_bytes: u64,
    events_before: usize,
}

/// The `stats --json` object of a BFC dump: the keys, then TF's Stats block in bytes.
#[derive(Serialize)]
pub struct DumpAnswer<'a> {
    format: &'static str,
    dump_format: &'static str,
    allocator: Option<&'a str>,
    in_use_chunks: Option<u64>,
    in_use_bytes: Option<u64>,
    free_chunks: Option<u64>,
    free_bytes: Option<u64>,
    regions: Option<u64>,
    region_bytes: Option<u64>,
    largest_free_chunk_bytes: Option<u64>,
    oom_request_bytes: Option<u64>,
    oom_rounded_bytes: Option<u64>,
    oom_op: Option<&'a str>,
    fragmentation_oom: Option<bool>,
    diagnosis: Option<String>,
    /// TF's Stats block, its keys in the dump's order.
    stats: KeyedBytes,
    missing: &'a [String],
    warnings: Vec<String>,
    /// Only for a dump read on its own (a memory log's dump is inside its `tf` object).
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
}

/// Counts keyed by names the input chose, as a JSON object in the input's order.
struct KeyedBytes(Vec<(String, u64)>);

impl Serialize for KeyedBytes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// What `stats --json` prints for a memory plan.
#[derive(Serialize)]
struct PlanAnswer {
    file: String,
    format: &'static str,
    buffers: usize,
    naive_bytes: u64,
    lower_bound_bytes: u64,
    time_unit: &'static str,
    load_seconds: f64,
}

/// The object `stats --json` prints for `loaded` (read from `path`).
///
/// # Errors
/// When a table of the input lacks a column the summary needs.
pub fn json(loaded: &Loaded, path: &Path, heap: Option<&str>) -> Result<Value> {
    let file = path.display().to_string();
    if let Some(ev) = events_of(loaded) {
        let view = allocview_loaders::trace_view(ev.events, path)?;
        let per_thread = events_per_thread(ev.events, ev.threads.height())?;
        let stats = TraceStats::compute(&view, per_thread, &ev.summary);
        let answer = TraceAnswer {
            stats: &stats,
            file,
            format: ev.format,
            load_seconds: ev.load_seconds,
            truncated: ev.summary.truncated.is_some(),
            streamed: None,
            tf: match loaded {
                Loaded::TfMemoryLog(log) => Some(memlog_answer(log)),
                _ => None,
            },
            pytorch: match loaded {
                Loaded::PytorchSnapshot(s) => Some(pytorch::snapshot_json(s)?),
                _ => None,
            },
            recorded_memory: crate::answers::recorded_memory::RecordedMemory::of_loaded(
                loaded,
                view.t_ns.first().copied().unwrap_or(0),
                view.t_ns
                    .get(usize::try_from(stats.peak_live_event).unwrap_or(usize::MAX))
                    .copied(),
            ),
            marks: crate::answers::marks::answers(
                crate::answers::marks::marks_of(loaded),
                view.t_ns.first().copied().unwrap_or(0),
            ),
            heap: heap.filter(|h| *h != binary_malloc()).map(str::to_owned),
            heaps: heaps::heaps_of(path)?,
        };
        return Ok(serde_json::to_value(answer)?);
    }
    Ok(match loaded {
        Loaded::HeapProfile(p) => serde_json::to_value(profile_answer(p, file))?,
        Loaded::TfBfcDump(dump) => serde_json::to_value(DumpAnswer {
            file: Some(file),
            ..dump_answer(dump)
        })?,
        Loaded::Plan(plan) => {
            let buffers = plan.to_buffers()?;
            let bufs = &buffers.buffers;
            serde_json::to_value(PlanAnswer {
                file,
                format: "memory-plan",
                buffers: bufs.len(),
                naive_bytes: bufs.iter().map(|b| b.size_bytes).sum::<u64>(),
                lower_bound_bytes: allocview_sim::plan::max_live_bytes(bufs)?,
                time_unit: plan.time_unit,
                load_seconds: plan.load_seconds,
            })?
        }
        Loaded::MallocTrace(_) | Loaded::TfMemoryLog(_) | Loaded::PytorchSnapshot(_) => Value::Null,
    })
}

/// The name of heap 0.
fn binary_malloc() -> &'static str {
    allocview_loaders::binary::MALLOC_HEAP
}

fn memlog_answer(log: &TfMemoryLog) -> MemlogAnswer<'_> {
    MemlogAnswer {
        allocator: &log.allocator,
        allocators: log
            .allocator_counts
            .iter()
            .map(|(name, records)| AllocatorRecords {
                name,
                records: *records,
            })
            .collect(),
        tensor_allocations: log.summary.tensor_allocations,
        raw_allocations: log.summary.raw_allocations,
        steps: log.summary.steps,
        regions: log.regions.len(),
        region_bytes: log.regions.iter().map(|r| r.size_bytes).sum::<u64>(),
        meminfo_peak_bytes: log.meminfo.iter().map(|m| m.peak_bytes).max(),
        meminfo: log
            .meminfo
            .iter()
            .map(|m| MeminfoAnswer {
                line: m.line,
                tag: &m.tag,
                current_bytes: m.current_bytes,
                peak_bytes: m.peak_bytes,
                events_before: m.events_before,
            })
            .collect(),
        dump: log.dumps.first().map(dump_answer),
    }
}

/// The `stats --json` object of a BFC dump.
pub fn dump_answer(d: &BfcDump) -> DumpAnswer<'_> {
    let f = &d.figures;
    DumpAnswer {
        format: "tf-bfc-dump",
        dump_format: d.format.name(),
        allocator: d.allocator.as_deref(),
        in_use_chunks: f.in_use_chunks,
        in_use_bytes: f.in_use_bytes,
        free_chunks: f.free_chunks,
        free_bytes: f.free_bytes,
        regions: f.regions,
        region_bytes: f.region_bytes,
        largest_free_chunk_bytes: f.largest_free_chunk_bytes,
        oom_request_bytes: d
            .oom
            .as_ref()
            .and_then(|o| o.bytes.as_ref())
            .map(|b| b.bytes),
        oom_rounded_bytes: d.oom.as_ref().and_then(|o| o.rounded_bytes),
        oom_op: d.oom.as_ref().and_then(|o| o.op.as_deref()),
        fragmentation_oom: f.fragmentation_oom,
        diagnosis: d.diagnosis(),
        stats: KeyedBytes(d.stats_bytes()),
        missing: &d.missing,
        warnings: d.warnings.iter().map(ToString::to_string).collect(),
        file: None,
    }
}

/// The `stats --json` object of a heap profile: its figures in all, and which it holds.
#[derive(Serialize)]
pub struct ProfileAnswer {
    pub file: String,
    pub format: &'static str,
    pub profile_format: &'static str,
    pub stacks: usize,
    pub frames: usize,
    pub live_bytes: Option<u64>,
    pub live_objects: Option<u64>,
    pub alloc_bytes: Option<u64>,
    pub alloc_objects: Option<u64>,
    pub peak_bytes: Option<u64>,
    pub peak_objects: Option<u64>,
    pub duration_ns: Option<u64>,
}

/// The figures of a heap profile (a figure it does not hold is `None`).
#[must_use]
pub fn profile_answer(p: &allocview_loaders::profile::HeapProfile, file: String) -> ProfileAnswer {
    let sum = |f: fn(&allocview_loaders::profile::ProfileSample) -> u64| {
        p.samples.iter().map(f).sum::<u64>()
    };
    ProfileAnswer {
        file,
        format: "heap-profile",
        profile_format: p.format.name(),
        stacks: p.samples.len(),
        frames: p.stacks.num_frames(),
        live_bytes: p.has.live.then(|| sum(|s| s.live_bytes)),
        live_objects: p.has.live.then(|| sum(|s| s.live_objects)),
        alloc_bytes: p.has.alloc.then(|| sum(|s| s.alloc_bytes)),
        alloc_objects: p.has.alloc.then(|| sum(|s| s.alloc_objects)),
        peak_bytes: p.has.peak.then(|| sum(|s| s.peak_bytes)),
        peak_objects: p.has.peak.then(|| sum(|s| s.peak_objects)),
        duration_ns: p.duration_ns,
    }
}
