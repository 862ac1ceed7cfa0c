//! The tables an input exports: what `convert OUT.parquet` writes and the Python package's
//! `Trace.tables()` returns (the events in the exported schema, or a plan's buffers, then the
//! threads, stacks, frames and a PyTorch snapshot's own tables).

use std::path::Path;

use allocview_loaders::Loaded;
use allocview_loaders::export::export_events;
use anyhow::{Result, bail};
use polars::prelude::*;

/// An input's tables as `convert` writes them (and the Python package's `load` returns them):
/// the main one (the exported events, or a plan's buffers) and the others by name.
///
/// # Errors
/// For a TensorFlow BFC dump, which has no event table, or when a table cannot be built.
pub fn tables_of(
    loaded: &Loaded,
    input: &Path,
) -> Result<(DataFrame, Vec<(&'static str, DataFrame)>)> {
    Ok(match loaded {
        Loaded::MallocTrace(t) => {
            let mut others = vec![("threads", t.threads.clone())];
            if let Some(stacks) = &t.stacks {
                others.push(("stacks", stacks.stacks_frame()?));
                others.push(("frames", stacks.frames_frame()?));
            }
            (export_events(&t.events)?, others)
        }
        Loaded::TfMemoryLog(log) => (
            export_events(&log.events)?,
            vec![("threads", log.threads.clone())],
        ),
        Loaded::PytorchSnapshot(s) => (
            export_events(&s.events)?,
            vec![
                ("threads", s.threads.clone()),
                ("stacks", s.stacks_table.clone()),
                ("frames", s.frames.clone()),
                ("segments", s.segments.clone()),
                ("blocks", s.blocks.clone()),
                ("segment_events", s.segment_events.clone()),
                ("annotations", s.annotations.clone()),
            ],
        ),
        // A plan's one table is its buffers.
        Loaded::Plan(p) => (p.buffers.clone(), vec![]),
        Loaded::HeapProfile(p) => (
            profile_samples(p)?,
            vec![
                ("stacks", p.stacks.stacks_frame()?),
                ("frames", p.stacks.frames_frame()?),
            ],
        ),
        Loaded::TfBfcDump(_) => bail!(
            "{} is a TensorFlow BFC dump: a heap at one moment, with no event table to write; \
             `allocview stats --json` gives its figures",
            input.display()
        ),
    })
}

/// A heap profile's samples: one row per stack, with the figures the profile holds.
fn profile_samples(p: &allocview_loaders::profile::HeapProfile) -> Result<DataFrame> {
    let col = |name: &str, f: fn(&allocview_loaders::profile::ProfileSample) -> u64| {
        Column::new(name.into(), p.samples.iter().map(f).collect::<Vec<u64>>())
    };
    Ok(DataFrame::new(
        p.samples.len(),
        vec![
            Column::new(
                "stack_id".into(),
                p.samples.iter().map(|s| s.stack).collect::<Vec<u32>>(),
            ),
            col("live_bytes", |s| s.live_bytes),
            col("live_objects", |s| s.live_objects),
            col("alloc_bytes", |s| s.alloc_bytes),
            col("alloc_objects", |s| s.alloc_objects),
            col("peak_bytes", |s| s.peak_bytes),
            col("peak_objects", |s| s.peak_objects),
        ],
    )?)
}
