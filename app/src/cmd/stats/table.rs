//! `stats`'s tables for people: a trace's summary, a TensorFlow memory log's allocators, a BFC
//! dump's regions and bins.

use allocview_loaders::analysis::stats::TraceStats;
use allocview_loaders::tf::dump::BfcDump;
use allocview_loaders::tf::memlog::TfMemoryLog;
use anyhow::Result;

use crate::answers::recorded_memory::RecordedMemory;
use crate::format;

pub(super) fn print_memlog(log: &TfMemoryLog) -> Result<()> {
    outln!();
    outln!(
        "  TensorFlow memory log of allocator {} ({} tensor and {} raw allocations, {} steps)",
        format::trace_text(&log.allocator),
        format::count(log.summary.tensor_allocations),
        format::count(log.summary.raw_allocations),
        log.summary.steps
    );
    if log.allocator_counts.len() > 1 {
        let others: Vec<String> = log
            .allocator_counts
            .iter()
            .map(|(n, c)| format!("{} ({})", format::trace_text(n), format::count(*c)))
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
            format::trace_text(&m.tag),
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

fn opt_bytes(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), format::bytes)
}

pub(super) fn print_dump(file: &str, d: &BfcDump) -> Result<()> {
    outln!(
        "{file}: TensorFlow BFC dump ({} format) of allocator {}",
        d.format.name(),
        format::trace_text(d.allocator.as_deref().unwrap_or("?"))
    );
    print_dump_body(d)
}

fn print_dump_body(d: &BfcDump) -> Result<()> {
    let f = &d.figures;
    if let Some(o) = &d.oom {
        outln!(
            "  OOM request       {:>14}   rounded to {} by op {}",
            format::trace_text(&o.text),
            opt_bytes(o.rounded_bytes),
            format::trace_text(o.op.as_deref().unwrap_or("?"))
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

pub(super) fn print_table(
    file: &str,
    s: &TraceStats,
    load_seconds: f64,
    memory: Option<&RecordedMemory>,
) -> Result<()> {
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
    if s.frees_before_recording > 0 {
        outln!(
            "  started mid-run   {:>14}   frees of blocks allocated before recording started \
             (expected, not errors)",
            count(s.frees_before_recording)
        );
    }
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
    print_memory(memory)?;
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

/// The run's marks, one line each (nothing when it has none).
pub(super) fn print_marks(marks: &[crate::answers::marks::MarkAnswer]) -> Result<()> {
    if marks.is_empty() {
        return Ok(());
    }
    outln!(
        "  marks             {:>14}",
        format::count(marks.len() as u64)
    );
    for m in marks {
        if m.name.is_empty() {
            outln!("    t = {:<12} {}", format::seconds(m.t_s), m.kind);
        } else {
            outln!(
                "    t = {:<12} {} \"{}\"",
                format::seconds(m.t_s),
                m.kind,
                m.name
            );
        }
    }
    Ok(())
}

/// The recorded program's own memory, under the peak of live bytes (a trace made by `record`).
fn print_memory(memory: Option<&RecordedMemory>) -> Result<()> {
    use format::{bytes, count};
    let Some(m) = memory else {
        return Ok(());
    };
    if m.is_reserved() {
        outln!(
            "  peak reserved     {:>14}   at t = {} (PyTorch's caching allocator, Total Reserved \
             as the profiler recorded it, {} samples); {} at the end",
            bytes(m.peak_rss_bytes),
            format::seconds(m.peak_rss_t_s),
            count(m.samples as u64),
            bytes(m.final_rss_bytes)
        );
        return Ok(());
    }
    if m.is_resident_only() {
        outln!(
            "  peak RSS          {:>14}   at t = {} (as the recording sampled it, {} samples; \
             no anonymous part or mappings recorded); {} at the end",
            bytes(m.peak_rss_bytes),
            format::seconds(m.peak_rss_t_s),
            count(m.samples as u64),
            bytes(m.final_rss_bytes)
        );
        return Ok(());
    }
    outln!(
        "  peak RSS          {:>14}   at t = {} (recorded by the tracer, {} samples); \
         anonymous {} at most, {} at the start{}",
        bytes(m.peak_rss_bytes),
        format::seconds(m.peak_rss_t_s),
        count(m.samples as u64),
        bytes(m.peak_anon_bytes),
        bytes(m.first_anon_bytes),
        m.anon_at_peak_live_bytes
            .map(|b| format!(", {} near the peak of live bytes", bytes(b)))
            .unwrap_or_default()
    );
    outln!(
        "  mapped outside    {:>14}   anonymous at most (mmap and the break, outside the \
         allocator: {} calls), {} at the end; files mapped {} at most",
        bytes(m.mapped_outside_allocator_peak_bytes),
        count(m.mapping_calls as u64),
        bytes(m.mapped_outside_allocator_final_bytes),
        bytes(m.mapped_files_peak_bytes)
    );
    Ok(())
}

/// The heaps of a binary trace whose program reported heaps of its own (nothing otherwise),
/// `selected` marked: the names `--heap` takes.
pub(super) fn print_heaps(path: &std::path::Path, selected: Option<&str>) -> Result<()> {
    let Some(heaps) = crate::answers::stats::heaps::heaps_of(path)? else {
        return Ok(());
    };
    let selected = selected.unwrap_or(allocview_loaders::binary::MALLOC_HEAP);
    outln!();
    outln!("  heaps (--heap NAME reads one)     events      peak live     live at end");
    for h in &heaps {
        let mark = if h.name == selected { "*" } else { " " };
        outln!(
            "  {mark} {:<30} {:>8} {:>14} {:>15}",
            h.name,
            format::count(h.events),
            format::bytes(h.peak_live_bytes),
            format::bytes(h.final_live_bytes)
        );
    }
    Ok(())
}
