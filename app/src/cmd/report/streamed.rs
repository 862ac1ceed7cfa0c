//! `report` on a binary trace streamed block by block ([`crate::session::mode`]): one pass for the
//! size-class series and the peak of live bytes, one replay per policy for its summary and
//! series, and one replay per policy up to the peak for its heap map. Memory is bounded as for
//! `compare --stream`; time is up to three passes over the file.

use std::path::Path;

use allocview_sim::classes::ClassSeriesBuilder;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::series::Bucketing;
use allocview_sim::stream::{EventBatch, EventSource as _, Prefetched};
use anyhow::{Context as _, Result};

use super::write::{BUCKETS, Destination, Gathered, write_report};
use crate::answers::report::replayed;
use crate::session::PolicyArgs;
use allocview_loaders::Requests;

use crate::session::WindowArgs;
use crate::session::runs::{OraclePlans, PolicyRun, per_spec, replay_one, stream_specs};
use crate::session::source::StreamInput;

/// What a streamed report writes: the folder of CSVs and charts, the HTML page, or both.
pub(super) struct Outputs<'a> {
    pub(super) dest: Option<&'a Destination<'a>>,
    pub(super) html: Option<&'a Path>,
    pub(super) size: (u32, u32),
}

/// Runs `report` streamed.
pub(super) fn run(
    file: &Path,
    policies: &PolicyArgs,
    window: &WindowArgs,
    requests: Requests,
    heap: u32,
    outputs: &Outputs<'_>,
    specs: &[PolicySpec],
) -> Result<()> {
    let config = policies.config()?;
    let online = stream_specs(specs)?;
    let jobs = policies.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    // The size classes (policy-independent) and where the peak of live bytes is.
    let input = StreamInput::new(file, window, requests, heap)?;
    let mut source = Prefetched::start(input.open()?);
    let (t0, t_last) = source.time_span();
    // One snapshot: the report draws the series, it never seeks in it.
    let mut classes = ClassSeriesBuilder::new(Bucketing::for_span(t0, t_last, BUCKETS), usize::MAX);
    let mut batch = EventBatch::default();
    while source
        .next_batch(&mut batch)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("while reading {}", file.display()))?
    {
        for ((&code, &size), &t) in batch.kind.iter().zip(&batch.size_bytes).zip(&batch.t_ns) {
            classes.push(code, size, t);
        }
    }
    let stream = source
        .finish()
        .context("the thread reading the trace failed")?;
    let events = stream.summary().events;
    let peak_event = usize::try_from(stream.peak_live_event()).unwrap_or(usize::MAX);
    let max_live = stream.peak_live_bytes();

    let plans = OraclePlans::new(jobs);
    let replays = per_spec(&online, jobs, |spec| {
        replay_one(&input, spec, &config, &plans, usize::MAX)
            .map(|(r, _)| r)
            .map_err(|e| format!("{e:#}"))
    });
    let runs: Vec<PolicyRun> = replays
        .into_iter()
        .map(|(name, result)| PolicyRun { name, result })
        .collect();
    let done = replayed(&runs, false)?;
    let mut heaps = Vec::new();
    if events == 0 {
        eprintln!("note: the trace has no events: no heap maps");
    } else {
        // Each heap at the peak: the policy replayed again, up to that event only.
        let at_peak: Vec<&PolicySpec> = online
            .iter()
            .filter(|s| done.iter().any(|(name, _)| *name == s.label()))
            .collect();
        for spec in at_peak {
            let (r, _) = replay_one(&input, spec, &config, &plans, peak_event)?;
            let counters = r.final_state.counters();
            heaps.push((r.final_state, counters));
        }
    }
    let g = Gathered {
        done,
        real: Vec::new(),
        classes: classes.finish(),
        max_live,
        peak_event,
        heaps,
    };
    if let Some(dest) = outputs.dest {
        write_report(dest, outputs.size, &g)?;
    }
    if let Some(html) = outputs.html {
        let run = crate::html::build_streamed_run(&crate::html::StreamedInput {
            path: file,
            events,
            t0_ns: t0,
            t_last_ns: t_last,
            peak_live_bytes: max_live,
            peak_event,
            replays: &g.done,
            classes: &g.classes,
            peak_heaps: &g.heaps,
        });
        super::write_html(html, file, run)?;
    }
    Ok(())
}
