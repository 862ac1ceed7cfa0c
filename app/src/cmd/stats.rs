//! `allocview stats FILE [--json]`: a summary of a trace.

use std::path::{Path, PathBuf};

use allocview_loaders::Loaded;
use allocview_loaders::analysis::stats::{TraceStats, events_per_thread};
use allocview_loaders::tf::dump::BfcDump;
use allocview_loaders::tf::memlog::TfMemoryLog;
use anyhow::Result;
use serde_json::{Map, Value, json};

use super::load::{InputArgs, events_of, load_input};
use crate::format;

/// Arguments of `allocview stats`.
#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// The file to summarise: a malloc trace (text or binary), a TensorFlow memory log or BFC
    /// dump, a PyTorch memory snapshot, or a memory plan.
    pub file: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub stream: super::stream::StreamArgs,
}

/// Runs `allocview stats`.
pub fn run(args: &StatsArgs) -> Result<()> {
    if args.stream.applies_to_stats(&args.file, &args.input)? {
        return super::stream::stats(args);
    }
    let loaded = load_input(&args.file, &args.input)?;
    if args.json {
        outln!("{}", json(&loaded, &args.file)?);
        return Ok(());
    }
    let file = args.file.display().to_string();
    if let Some(ev) = events_of(&loaded) {
        let view = allocview_loaders::trace_view(ev.events, &args.file)?;
        let per_thread = events_per_thread(ev.events, ev.threads.height())?;
        let stats = TraceStats::compute(&view, per_thread, &ev.summary);
        print_table(&file, &stats, ev.load_seconds)?;
        if let Loaded::TfMemoryLog(log) = &loaded {
            print_memlog(log)?;
        }
        if let Loaded::PytorchSnapshot(s) = &loaded {
            super::stats_pytorch::print_snapshot(s)?;
        }
        return Ok(());
    }
    match &loaded {
        Loaded::TfBfcDump(dump) => print_dump(&file, dump)?,
        Loaded::Plan(plan) => {
            let buffers = plan.to_buffers()?;
            let bufs = &buffers.buffers;
            let naive: u64 = bufs.iter().map(|b| b.size_bytes).sum();
            let bound = allocview_sim::plan::max_live_bytes(bufs)?;
            outln!(
                "{file}: a memory plan of {} buffers",
                format::count(bufs.len() as u64)
            );
            outln!("  sum of sizes        {:>14}", format::bytes(naive));
            outln!("  max live (bound)    {:>14}", format::bytes(bound));
            outln!("  run the planners:   allocview plan {file}");
        }
        Loaded::MallocTrace(_) | Loaded::TfMemoryLog(_) | Loaded::PytorchSnapshot(_) => {}
    }
    Ok(())
}

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
            obj.insert("pytorch".into(), super::stats_pytorch::snapshot_json(s)?);
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

fn print_memlog(log: &TfMemoryLog) -> Result<()> {
    outln!();
    outln!(
        "  TensorFlow memory log of allocator {} ({} tensor and {} raw allocations, {} steps)",
        log.allocator,
        format::count(log.summary.tensor_allocations),
        format::count(log.summary.raw_allocations),
        log.summary.steps
    );
    if log.allocator_counts.len() > 1 {
        let others: Vec<String> = log
            .allocator_counts
            .iter()
            .map(|(n, c)| format!("{n} ({})", format::count(*c)))
            .collect();
        outln!("  allocators in the log: {}", others.join(", "));
    }
    if !log.regions.is_empty() {
        outln!(
            "  regions: {} totalling {}",
            log.regions.len(),
            format::bytes(log.regions.iter().map(|r| r.size_bytes).sum())
        );
    }
    // Each reading is TensorFlow's figure at that moment, not the run's peak: say when.
    let events = log.events.height();
    for m in &log.meminfo {
        outln!(
            "  get_memory_info {} at line {}, after {} of {} events: current {}, peak so far {}",
            m.tag,
            format::count(m.line),
            format::count(m.events_before as u64),
            format::count(events as u64),
            format::bytes(m.current_bytes),
            format::bytes(m.peak_bytes)
        );
    }
    if let Some(d) = log.dumps.first() {
        outln!("  the log ends in a BFC dump:");
        print_dump_body(d)?;
    }
    Ok(())
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

fn opt_bytes(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), format::bytes)
}

fn print_dump(file: &str, d: &BfcDump) -> Result<()> {
    outln!(
        "{file}: TensorFlow BFC dump ({} format) of allocator {}",
        d.format.name(),
        d.allocator.as_deref().unwrap_or("?")
    );
    print_dump_body(d)
}

fn print_dump_body(d: &BfcDump) -> Result<()> {
    let f = &d.figures;
    if let Some(o) = &d.oom {
        outln!(
            "  OOM request       {:>14}   rounded to {} by op {}",
            o.text,
            opt_bytes(o.rounded_bytes),
            o.op.as_deref().unwrap_or("?")
        );
    }
    outln!(
        "  in use            {:>14}   in {} chunks",
        opt_bytes(f.in_use_bytes),
        f.in_use_chunks
            .map_or_else(|| "-".to_owned(), format::count)
    );
    outln!(
        "  free              {:>14}   in {} chunks, largest {}",
        opt_bytes(f.free_bytes),
        f.free_chunks.map_or_else(|| "-".to_owned(), format::count),
        opt_bytes(f.largest_free_chunk_bytes)
    );
    outln!(
        "  regions           {:>14}   in {} regions",
        opt_bytes(f.region_bytes),
        f.regions.map_or_else(|| "-".to_owned(), format::count)
    );
    for (k, v) in d.stats_bytes() {
        // Every Stats field is a byte count except the allocation counter.
        let shown = if k == "num_allocs" {
            format::count(v)
        } else {
            format::bytes(v)
        };
        outln!("  stats.{k:<26} {shown:>12}");
    }
    if let Some(diag) = d.diagnosis() {
        outln!("  diagnosis: {diag}");
    }
    if !d.missing.is_empty() {
        outln!("  not in this dump: {}", d.missing.join(", "));
    }
    Ok(())
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

pub(super) fn print_table(file: &str, s: &TraceStats, load_seconds: f64) -> Result<()> {
    use format::{bytes, count};
    outln!("{file}");
    outln!(
        "  events            {:>14}   ({} allocations, {} frees; {} of NULL, {} of unknown pointers)",
        count(s.events),
        count(s.mallocs),
        count(s.frees),
        count(s.frees_null),
        count(s.frees_unknown)
    );
    if s.mallocs_failed + s.mallocs_of_live_ptr + s.bad_lines > 0 {
        outln!(
            "  anomalies         failed allocations {}, allocations of a live pointer {}, skipped lines {}",
            count(s.mallocs_failed),
            count(s.mallocs_of_live_ptr),
            count(s.bad_lines)
        );
    }
    let per_thread: Vec<String> = s.events_per_thread.iter().map(|&n| count(n)).collect();
    outln!(
        "  threads           {:>14}   (events per thread: {})",
        s.threads,
        per_thread.join(", ")
    );
    outln!("  duration          {:>14}", format::seconds(s.duration_s));
    outln!(
        "  requested         {:>14}   (sizes {} to {}, mean {:.1} B)",
        bytes(s.malloc_bytes_total),
        bytes(s.malloc_size_min),
        bytes(s.malloc_size_max),
        s.malloc_size_mean
    );
    outln!(
        "  peak live         {:>14}   at event {} (t = {}), {} blocks live",
        bytes(s.peak_live_bytes),
        count(s.peak_live_event),
        format::seconds(s.peak_live_time_s),
        count(s.peak_live_blocks_at_peak_bytes)
    );
    outln!("  max live blocks   {:>14}", count(s.max_live_blocks));
    outln!(
        "  live at the end   {:>14}   in {} blocks",
        bytes(s.final_live_bytes),
        count(s.final_live_blocks)
    );
    outln!("  loaded in         {:>14}", format::seconds(load_seconds));
    outln!();
    outln!(
        "  {:>5}  {:>21}  {:>12}  {:>7}  {:>12}  {:>12}  {:>12}",
        "class",
        "sizes",
        "allocations",
        "share",
        "requested",
        "live at end",
        "live bytes"
    );
    let total_allocs = s.size_classes.values().sum::<u64>().max(1);
    for (&class, &n) in &s.size_classes {
        let b = s.bytes_by_class.get(&class).copied().unwrap_or(0);
        let (live_n, live_b) = s.final_live_by_class.get(&class).copied().unwrap_or((0, 0));
        outln!(
            "  {:>5}  {:>21}  {:>12}  {:>6.2}%  {:>12}  {:>12}  {:>12}",
            class,
            format::class_range(class),
            count(n),
            100.0 * n as f64 / total_allocs as f64,
            bytes(b),
            count(live_n),
            bytes(live_b)
        );
    }
    Ok(())
}
