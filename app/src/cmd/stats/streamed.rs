//! `stats --stream`: the summary of a binary trace read block by block, in one pass.

use std::path::Path;

use allocview_loaders::analysis::stats::StatsAccumulator;
use allocview_sim::stream::{EventBatch, EventSource as _, Prefetched};
use anyhow::{Context as _, Result};

use super::table::{print_marks, print_table};
use crate::answers::recorded_memory::{RecordedMemory, first_event_t_ns, samples_in_file};
use crate::answers::stats::TraceAnswer;
use allocview_loaders::Requests;

use crate::session::WindowArgs;
use crate::session::source::StreamInput;

/// Runs `stats --stream` on `file`, whole or the window.
pub(super) fn stats(
    file: &Path,
    window: &WindowArgs,
    requests: Requests,
    (heap, heap_name): (u32, Option<&str>),
    json: bool,
) -> Result<()> {
    let started = std::time::Instant::now();
    let input = StreamInput::new(file, window, requests, heap)?;
    let mut prefetched = Prefetched::start(input.open()?);
    let mut acc = StatsAccumulator::default();
    let mut batch = EventBatch::default();
    while prefetched
        .next_batch(&mut batch)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("while reading {}", file.display()))?
    {
        acc.push_all(&batch.t_ns, &batch.kind, &batch.size_bytes);
    }
    let stream = prefetched
        .finish()
        .context("the thread reading the trace failed")?;
    let summary = stream.summary();
    for w in summary.warnings() {
        eprintln!("warning: {w}");
    }
    let stats = acc.finish(stream.events_per_thread(), &summary);
    // The program's memory samples cover the whole recording: a window has none.
    let memory = if window.is_set() {
        None
    } else {
        let (samples, mappings) = samples_in_file(file);
        // `peak_live_time_s` counts from the first event; the samples from the recording's
        // own origin.
        let t0 = first_event_t_ns(file);
        RecordedMemory::of(
            (&samples, &mappings),
            t0,
            (stats.events > 0).then(|| t0 + (stats.peak_live_time_s * 1e9).round() as i64),
        )
    };
    let marks = crate::answers::marks::answers(
        &crate::answers::marks::marks_in_file(file),
        first_event_t_ns(file),
    );
    let path = file;
    let file = file.display().to_string();
    let seconds = started.elapsed().as_secs_f64();
    if json {
        let answer = TraceAnswer {
            stats: &stats,
            file,
            format: "malloc-trace",
            load_seconds: seconds,
            truncated: summary.truncated.is_some(),
            streamed: Some(true),
            tf: None,
            pytorch: None,
            recorded_memory: memory,
            marks,
            heap: heap_name
                .filter(|h| *h != allocview_loaders::binary::MALLOC_HEAP)
                .map(str::to_owned),
            heaps: crate::answers::stats::heaps::heaps_of(path)?,
        };
        outln!("{}", serde_json::to_value(answer)?);
    } else {
        print_table(&file, &stats, seconds, memory.as_ref())?;
        print_marks(&marks)?;
        super::table::print_heaps(path, heap_name)?;
    }
    Ok(())
}
