//! `allocview stats FILE [--json]`: a summary of a trace.

use std::path::PathBuf;

use allocview_loaders::Loaded;
use allocview_loaders::stats::TraceStats;
use anyhow::Result;
use serde_json::{Map, Value, json};

use super::load::{InputArgs, load_input, thread_column};
use crate::format;

/// Arguments of `allocview stats`.
#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// The trace to summarise (libtracemalloc text, plain or gzip).
    pub file: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub input: InputArgs,
}

/// Runs `allocview stats`.
pub fn run(args: &StatsArgs) -> Result<()> {
    let loaded = load_input(&args.file, &args.input)?;
    let Loaded::MallocTrace(trace) = loaded;
    let view = allocview_loaders::trace_view(&trace.events, &args.file)?;
    let thread = thread_column(&trace.events)?;
    let stats = TraceStats::compute(&view, &thread, trace.threads.height(), &trace.summary);
    if args.json {
        let mut obj = stats_json(&stats);
        obj.insert("file".into(), json!(args.file.display().to_string()));
        obj.insert("format".into(), json!("malloc-trace"));
        obj.insert("load_seconds".into(), json!(trace.load_seconds));
        obj.insert("truncated".into(), json!(trace.summary.truncated.is_some()));
        outln!("{}", Value::Object(obj));
    } else {
        print_table(&args.file.display().to_string(), &stats, trace.load_seconds)?;
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

fn print_table(file: &str, s: &TraceStats, load_seconds: f64) -> Result<()> {
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
