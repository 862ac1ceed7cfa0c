//! `stats`'s answer: the object `stats --json` prints for every kind of input (a trace's
//! summary, a TensorFlow memory log's allocators, a BFC dump's regions and bins, a PyTorch
//! snapshot's segments and stacks, a plan's sizes).

pub mod pytorch;

use std::path::Path;

use allocview_loaders::Loaded;
use allocview_loaders::analysis::stats::{TraceStats, events_per_thread};
use allocview_loaders::tf::dump::BfcDump;
use allocview_loaders::tf::memlog::TfMemoryLog;
use anyhow::Result;
use serde_json::{Map, Value, json};

use crate::session::input::events_of;

/// The object `stats --json` prints for `loaded` (read from `path`).
///
/// # Errors
/// When a table of the input lacks a column the summary needs.
pub fn json(loaded: &Loaded, path: &Path) -> Result<Value> {
    let file = path.display().to_string();
    if let Some(ev) = events_of(loaded) {
        let view = allocview_loaders::trace_view(ev.events, path)?;
        let per_thread = events_per_thread(ev.events, ev.threads.height())?;
        let stats = TraceStats::compute(&view, per_thread, &ev.summary);
        let mut obj = stats_json(&stats);
        obj.insert("file".into(), json!(file));
        obj.insert("format".into(), json!(ev.format));
        obj.insert("load_seconds".into(), json!(ev.load_seconds));
        obj.insert("truncated".into(), json!(ev.summary.truncated.is_some()));
        if let Loaded::TfMemoryLog(log) = loaded {
            obj.insert("tf".into(), memlog_json(log));
        }
        if let Loaded::PytorchSnapshot(s) = loaded {
            obj.insert("pytorch".into(), pytorch::snapshot_json(s)?);
        }
        return Ok(Value::Object(obj));
    }
    Ok(match loaded {
        Loaded::TfBfcDump(dump) => {
            let mut obj = dump_json(dump);
            obj.insert("file".into(), json!(file));
            Value::Object(obj)
        }
        Loaded::Plan(plan) => {
            let buffers = plan.to_buffers()?;
            let bufs = &buffers.buffers;
            json!({
                "file": file,
                "format": "memory-plan",
                "buffers": bufs.len(),
                "naive_bytes": bufs.iter().map(|b| b.size_bytes).sum::<u64>(),
                "lower_bound_bytes": allocview_sim::plan::max_live_bytes(bufs)?,
                "time_unit": plan.time_unit,
                "load_seconds": plan.load_seconds,
            })
        }
        Loaded::MallocTrace(_) | Loaded::TfMemoryLog(_) | Loaded::PytorchSnapshot(_) => Value::Null,
    })
}

/// The `tf` object of `stats --json` for a memory log.
fn memlog_json(log: &TfMemoryLog) -> Value {
    let peak = log.meminfo.iter().map(|m| m.peak_bytes).max();
    json!({
        "allocator": log.allocator,
        "allocators": log.allocator_counts.iter().map(|(n, c)| json!({"name": n, "records": c})).collect::<Vec<_>>(),
        "tensor_allocations": log.summary.tensor_allocations,
        "raw_allocations": log.summary.raw_allocations,
        "steps": log.summary.steps,
        "regions": log.regions.len(),
        "region_bytes": log.regions.iter().map(|r| r.size_bytes).sum::<u64>(),
    "meminfo_peak_bytes": peak,
        "meminfo": log.meminfo.iter().map(|m| json!({
            "line": m.line,
            "tag": m.tag,
            "current_bytes": m.current_bytes,
            "peak_bytes": m.peak_bytes,
            "events_before": m.events_before,
        })).collect::<Vec<_>>(),
        "dump": log.dumps.first().map(|d| Value::Object(dump_json(d))),
    })
}

/// The `stats --json` object of a BFC dump: the keys, then TF's Stats block in bytes.
pub fn dump_json(d: &BfcDump) -> Map<String, Value> {
    let f = &d.figures;
    let mut m = Map::new();
    m.insert("format".into(), json!("tf-bfc-dump"));
    m.insert("dump_format".into(), json!(d.format.name()));
    m.insert("allocator".into(), json!(d.allocator));
    m.insert("in_use_chunks".into(), json!(f.in_use_chunks));
    m.insert("in_use_bytes".into(), json!(f.in_use_bytes));
    m.insert("free_chunks".into(), json!(f.free_chunks));
    m.insert("free_bytes".into(), json!(f.free_bytes));
    m.insert("regions".into(), json!(f.regions));
    m.insert("region_bytes".into(), json!(f.region_bytes));
    m.insert(
        "largest_free_chunk_bytes".into(),
        json!(f.largest_free_chunk_bytes),
    );
    m.insert(
        "oom_request_bytes".into(),
        json!(
            d.oom
                .as_ref()
                .and_then(|o| o.bytes.as_ref())
                .map(|b| b.bytes)
        ),
    );
    m.insert(
        "oom_rounded_bytes".into(),
        json!(d.oom.as_ref().and_then(|o| o.rounded_bytes)),
    );
    m.insert(
        "oom_op".into(),
        json!(d.oom.as_ref().and_then(|o| o.op.clone())),
    );
    m.insert("fragmentation_oom".into(), json!(f.fragmentation_oom));
    m.insert("diagnosis".into(), json!(d.diagnosis()));
    let stats: Map<String, Value> = d
        .stats_bytes()
        .into_iter()
        .map(|(k, v)| (k, json!(v)))
        .collect();
    m.insert("stats".into(), Value::Object(stats));
    m.insert("missing".into(), json!(d.missing));
    m.insert(
        "warnings".into(),
        json!(
            d.warnings
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        ),
    );
    m
}

fn class_map(m: &std::collections::BTreeMap<u8, u64>) -> Value {
    Value::Object(m.iter().map(|(c, v)| (c.to_string(), json!(v))).collect())
}

/// The JSON keys, in the order of the reference `.stats.json` files.
pub fn stats_json(s: &TraceStats) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("events".into(), json!(s.events));
    m.insert("mallocs".into(), json!(s.mallocs));
    m.insert("frees".into(), json!(s.frees));
    m.insert("frees_null".into(), json!(s.frees_null));
    m.insert("frees_unknown".into(), json!(s.frees_unknown));
    m.insert("mallocs_failed".into(), json!(s.mallocs_failed));
    m.insert("mallocs_of_live_ptr".into(), json!(s.mallocs_of_live_ptr));
    m.insert("mallocs_size_zero".into(), json!(s.mallocs_size_zero));
    m.insert("bad_lines".into(), json!(s.bad_lines));
    m.insert("threads".into(), json!(s.threads));
    m.insert("events_per_thread".into(), json!(s.events_per_thread));
    m.insert("duration_s".into(), json!(s.duration_s));
    m.insert(
        "timestamps_non_monotonic".into(),
        json!(s.timestamps_non_monotonic),
    );
    m.insert("malloc_bytes_total".into(), json!(s.malloc_bytes_total));
    m.insert("malloc_size_min".into(), json!(s.malloc_size_min));
    m.insert("malloc_size_max".into(), json!(s.malloc_size_max));
    m.insert("malloc_size_mean".into(), json!(s.malloc_size_mean));
    m.insert("peak_live_bytes".into(), json!(s.peak_live_bytes));
    m.insert("peak_live_event".into(), json!(s.peak_live_event));
    m.insert("peak_live_time_s".into(), json!(s.peak_live_time_s));
    m.insert(
        "peak_live_blocks_at_peak_bytes".into(),
        json!(s.peak_live_blocks_at_peak_bytes),
    );
    m.insert("max_live_blocks".into(), json!(s.max_live_blocks));
    m.insert("final_live_bytes".into(), json!(s.final_live_bytes));
    m.insert("final_live_blocks".into(), json!(s.final_live_blocks));
    m.insert("size_classes".into(), class_map(&s.size_classes));
    m.insert("bytes_by_class".into(), class_map(&s.bytes_by_class));
    m
}
