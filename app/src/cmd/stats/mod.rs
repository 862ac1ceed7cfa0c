//! `allocview stats FILE [--json]`: a summary of a trace.

mod pytorch;
mod streamed;
mod table;

use std::path::PathBuf;

use allocview_loaders::analysis::stats::{TraceStats, events_per_thread};
use allocview_loaders::{Loaded, Requests};
use anyhow::Result;

use crate::format;
use crate::session::InputArgs;
use crate::session::StreamArgs;
use crate::session::input::{events_of, load_input};
use table::{print_dump, print_heaps, print_marks, print_memlog, print_table};

use crate::answers::recorded_memory::RecordedMemory;

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
    pub stream: StreamArgs,
}

/// Runs `allocview stats`.
pub fn run(args: &StatsArgs) -> Result<()> {
    if args.stream.applies_to_stats(&args.file, &args.input)? {
        return streamed::stats(
            &args.file,
            &args.input.window,
            args.input.requests_or(Requests::Objects),
            (args.input.heap_id(&args.file)?, args.input.heap.as_deref()),
            args.json,
        );
    }
    let loaded = load_input(&args.file, &args.input)?;
    if args.json {
        outln!(
            "{}",
            crate::answers::stats::json(&loaded, &args.file, args.input.heap.as_deref())?
        );
        return Ok(());
    }
    let file = args.file.display().to_string();
    if let Some(ev) = events_of(&loaded) {
        let view = allocview_loaders::trace_view(ev.events, &args.file)?;
        let per_thread = events_per_thread(ev.events, ev.threads.height())?;
        let stats = TraceStats::compute(&view, per_thread, &ev.summary);
        let memory = RecordedMemory::of_loaded(
            &loaded,
            view.t_ns.first().copied().unwrap_or(0),
            view.t_ns
                .get(usize::try_from(stats.peak_live_event).unwrap_or(usize::MAX))
                .copied(),
        );
        print_table(&file, &stats, ev.load_seconds, memory.as_ref())?;
        print_marks(&crate::answers::marks::answers(
            crate::answers::marks::marks_of(&loaded),
            view.t_ns.first().copied().unwrap_or(0),
        ))?;
        print_heaps(&args.file, args.input.heap.as_deref())?;
        if let Loaded::TfMemoryLog(log) = &loaded {
            print_memlog(log)?;
        }
        if let Loaded::PytorchSnapshot(s) = &loaded {
            pytorch::print_snapshot(s)?;
        }
        return Ok(());
    }
    match &loaded {
        Loaded::HeapProfile(p) => print_profile(&file, p)?,
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

/// A heap profile's figures (`stats --json`'s), and what reads it.
fn print_profile(file: &str, p: &allocview_loaders::profile::HeapProfile) -> Result<()> {
    let a = crate::answers::stats::profile_answer(p, file.to_owned());
    outln!(
        "{file}: a {} heap profile (a moment, not a timeline) of {} stacks",
        a.profile_format,
        format::count(a.stacks as u64)
    );
    let live = if p.format == allocview_loaders::profile::ProfileFormat::Dhat {
        "live at the end"
    } else {
        "in use"
    };
    let lines = [
        (live, a.live_bytes, a.live_objects),
        ("allocated", a.alloc_bytes, a.alloc_objects),
        ("live at the peak", a.peak_bytes, a.peak_objects),
    ];
    for (label, bytes, objects) in lines {
        let Some(bytes) = bytes else { continue };
        // A profile without object counts (jemalloc's has bytes only) says none.
        let objects = match objects {
            Some(o) if o > 0 || bytes == 0 => format!(" in {} objects", format::count(o)),
            _ => String::new(),
        };
        outln!("  {label:<20}{:>14}{objects}", format::bytes(bytes));
    }
    outln!("  read it with: allocview sites|flamegraph|diff|export {file}");
    Ok(())
}
