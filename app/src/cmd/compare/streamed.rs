//! `compare --stream`: each policy streams the file on its own (`--jobs` at a time), through
//! the session's streamed replay ([`crate::session::runs::replay_one`]).

use std::path::Path;

use crate::answers::compare::against_recorded;
use crate::answers::recorded_memory::{RecordedMemory, first_event_t_ns, samples_in_file};

use allocview_sim::policy::spec::PolicySpec;
use anyhow::{Result, bail};
use serde_json::json;

use super::table::print_table;
use crate::answers::compare::{Row, note_unsupported, pytorch_fidelity};
use crate::session::PolicyArgs;
use allocview_loaders::Requests;

use crate::session::WindowArgs;
use crate::session::runs::{OraclePlans, per_spec, replay_one, stream_specs};
use crate::session::source::StreamInput;

/// Runs `compare --stream`.
pub(super) fn compare(
    file: &Path,
    policies: &PolicyArgs,
    window: &WindowArgs,
    requests: Requests,
    heap: u32,
    json: bool,
    specs: &[PolicySpec],
) -> Result<()> {
    let config = policies.config()?;
    let explicit = !policies.policy.is_empty();
    let jobs = policies.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let online = stream_specs(specs)?;
    let input = StreamInput::new(file, window, requests, heap)?;
    let plans = OraclePlans::new(jobs);
    let runs = per_spec(&online, jobs, |spec| {
        replay_one(&input, spec, &config, &plans, usize::MAX).map_err(|e| format!("{e:#}"))
    });
    let mut rows = Vec::new();
    let mut max_live = 0;
    let mut events = 0;
    for (label, result) in &runs {
        match result {
            Ok((rep, peak_live)) => {
                max_live = *peak_live;
                events = rep.summary.events;
                let mut row = Row::from_replay(label, rep);
                note_unsupported(&mut row, rep);
                pytorch_fidelity(&mut row, rep, config.limit_bytes);
                rows.push(row);
            }
            Err(e) if explicit => bail!("policy {label}: {e}"),
            Err(e) => eprintln!("note: skipping {label}: {e}"),
        }
    }
    // The program's memory samples cover the whole recording: a window has none.
    let recorded_memory = if window.is_set() {
        None
    } else {
        let (samples, mappings) = samples_in_file(file);
        RecordedMemory::of((&samples, &mappings), first_event_t_ns(file), None)
    };
    if let Some(m) = &recorded_memory {
        against_recorded(&mut rows, m);
    }
    if json {
        let out = json!({
            "trace": file.display().to_string(),
            "format": "malloc-trace",
            "events": events,
            "max_live_bytes": max_live,
            "limit_bytes": config.limit_bytes,
            "streamed": true,
            "policies": rows.iter().map(|r| r.json(max_live)).collect::<Vec<_>>(),
            // Real-allocator rows need the trace loaded: a streamed compare has no advice.
            "advice": [],
            "recorded_memory": recorded_memory,
        });
        outln!("{out}");
    } else {
        print_table(&file.display().to_string(), events, max_live, &rows)?;
        super::table::print_recorded(recorded_memory.as_ref())?;
    }
    Ok(())
}
