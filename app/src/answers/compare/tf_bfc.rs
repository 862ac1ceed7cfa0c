//! `compare`'s `bfc` row for a TensorFlow memory log: the replay at TensorFlow's own addresses
//! ([`allocview_loaders::tf::fidelity`]), from the checkpoint rebuilt from the log.

use allocview_loaders::analysis::tf_fidelity::{
    self as fidelity, Fidelity, FidelityOptions, FirstOom,
};
use allocview_loaders::tf::memlog::TfMemoryLog;
use allocview_sim::policy::config::PolicyConfig;
use anyhow::Result;
use serde::Serialize;
use serde_json::{Map, Value};

use super::Row;
use crate::format;

/// The row's name: not plain `bfc`, which names the simulated policy that `report`, the
/// explorers, `--parquet` and the Python series run from process start at its own addresses.
/// This row is the replay at TensorFlow's addresses, and says from where it started (the
/// values of its `replay` key).
fn row_name(start: fidelity::ReplayStart) -> &'static str {
    match start {
        fidelity::ReplayStart::Checkpoint => "bfc@checkpoint",
        fidelity::ReplayStart::FromStart => "bfc@process-start",
    }
}

/// `bfc` on a TensorFlow memory log: the replay at TensorFlow's own addresses.
pub(super) fn tf_bfc_row(
    log: &TfMemoryLog,
    config: &PolicyConfig,
    from_start: bool,
    no_guidance: bool,
) -> Result<Row> {
    let opts = FidelityOptions {
        limit_bytes: config.limit_bytes,
        allow_growth: None,
        no_guidance,
        ..FidelityOptions::default()
    };
    let f = if from_start {
        fidelity::replay_from_start(log, &opts)
    } else {
        fidelity::replay_checkpointed(log, &opts)
    }
    .map_err(|e| anyhow::anyhow!("replaying bfc against the log: {e}"))?;
    let m = &f.metrics;
    let first_oom = f.first_oom.as_ref().map(first_oom_json).transpose()?;
    let first_oom_text = f.first_oom.as_ref().map(first_oom_text);
    let extra = replay_json(&f)?;
    Ok(Row {
        name: row_name(f.start).to_owned(),
        peak_footprint_bytes: m.peak_footprint_bytes,
        peak_footprint_event: None,
        final_footprint_bytes: m.final_footprint_bytes,
        peak_live_bytes: m.peak_live_bytes,
        peak_allocated_bytes: m.peak_allocated_bytes,
        fragmentation_at_peak: m.fragmentation_at_peak,
        mean_fragmentation: m.mean_fragmentation,
        ooms: f.ooms,
        events_per_second: if m.replay_seconds > 0.0 {
            m.events as f64 / m.replay_seconds
        } else {
            0.0
        },
        first_oom,
        first_oom_text,
        extra,
        notes: f.describe(),
    })
}

/// The row's `first_oom` object: the request, the heap at the failure, and how the replay's
/// chunk map compares with the dump TensorFlow logged there.
#[derive(Serialize)]
struct FirstOomAnswer {
    event: usize,
    line: u64,
    logged: bool,
    request_bytes: u64,
    rounded_bytes: u64,
    in_use_chunks: u64,
    in_use_bytes: u64,
    free_chunks: u64,
    free_bytes: u64,
    regions: u64,
    region_bytes: u64,
    largest_free_chunk_bytes: u64,
    dump_comparison: Option<DumpComparisonAnswer>,
}

#[derive(Serialize)]
struct DumpComparisonAnswer {
    dump_chunks: u64,
    replay_chunks: u64,
    identical: u64,
    all_identical: bool,
    first_difference: Option<String>,
}

fn first_oom_json(o: &FirstOom) -> Result<Value> {
    Ok(serde_json::to_value(FirstOomAnswer {
        event: o.event,
        line: o.line,
        logged: o.logged,
        request_bytes: o.request_bytes,
        rounded_bytes: o.rounded_bytes,
        in_use_chunks: o.in_use_chunks,
        in_use_bytes: o.in_use_bytes,
        free_chunks: o.free_chunks,
        free_bytes: o.free_bytes,
        regions: o.regions,
        region_bytes: o.region_bytes,
        largest_free_chunk_bytes: o.largest_free_chunk_bytes,
        dump_comparison: o.dump_comparison.as_ref().map(|d| DumpComparisonAnswer {
            dump_chunks: d.dump_chunks,
            replay_chunks: d.replay_chunks,
            identical: d.identical,
            all_identical: d.all_identical(),
            first_difference: d.first_difference.clone(),
        }),
    })?)
}

/// The first OOM in words, for the table.
fn first_oom_text(o: &FirstOom) -> String {
    format!(
        "first OOM at event {} (log line {}) requesting {} (rounded to {}): {} in use in {} \
         chunks, {} free in {} chunks (largest {}), {} regions of {}{}",
        format::count(o.event as u64),
        o.line,
        format::bytes(o.request_bytes),
        o.rounded_bytes,
        format::bytes(o.in_use_bytes),
        format::count(o.in_use_chunks),
        format::bytes(o.free_bytes),
        format::count(o.free_chunks),
        format::bytes(o.largest_free_chunk_bytes),
        o.regions,
        format::bytes(o.region_bytes),
        o.dump_comparison
            .as_ref()
            .map_or_else(String::new, |d| format!(
                "; chunk map vs the log's dump: {} of {} identical",
                d.identical, d.dump_chunks
            ))
    )
}

/// The row's extra keys: how the replay started (`replay`, `checkpoint`) and how closely it
/// followed TensorFlow's addresses (`fidelity`).
#[derive(Serialize)]
struct ReplayKeys<'a> {
    replay: &'static str,
    checkpoint: Option<CheckpointAnswer<'a>>,
    fidelity: FidelityAnswer<'a>,
}

#[derive(Serialize)]
struct CheckpointAnswer<'a> {
    event: usize,
    line: u64,
    reason: &'a str,
    live_chunks: u64,
    bytes_in_use: u64,
    regions: u64,
    region_bytes: u64,
}

#[derive(Serialize)]
struct FidelityAnswer<'a> {
    checked: u64,
    address_matches: u64,
    size_matches: u64,
    sizes_checked: u64,
    first_divergence: Option<DivergenceAnswer>,
    held_back_frees: u64,
    guidance: bool,
    guided_decisions: GuidedDecisionsAnswer,
    variables_replayed: u64,
    logged_oom_reproduced: Option<bool>,
    logged_oom_reproduced_with_guidance: bool,
    logged_oom_held_back_frees: Option<u64>,
    peak_bytes_in_use: u64,
    meminfo: Vec<MeminfoAnswer<'a>>,
    regions_match: bool,
    regions_logged: usize,
    regions_replayed: usize,
}

#[derive(Serialize)]
struct DivergenceAnswer {
    event: usize,
    line: u64,
    tf_alloc_id: i64,
    requested_bytes: u64,
    expected_addr: u64,
    expected_bytes: Option<u64>,
    got_addr: Option<u64>,
    got_bytes: Option<u64>,
}

#[derive(Serialize)]
struct GuidedDecisionsAnswer {
    total: u64,
    placements_retried: u64,
    held_back_frees: u64,
    variables_placed_by_address: u64,
    raw_chunk_sizes_chosen: u64,
}

#[derive(Serialize)]
struct MeminfoAnswer<'a> {
    tag: &'a str,
    line: u64,
    tf_current_bytes: u64,
    tf_peak_bytes: u64,
    replay_current_bytes: u64,
    replay_peak_bytes: u64,
}

fn replay_json(f: &Fidelity) -> Result<Map<String, Value>> {
    let keys = ReplayKeys {
        replay: match f.start {
            fidelity::ReplayStart::Checkpoint => "checkpoint",
            fidelity::ReplayStart::FromStart => "process-start",
        },
        checkpoint: f.checkpoint.as_ref().map(|c| CheckpointAnswer {
            event: c.event,
            line: c.line,
            reason: &c.reason,
            live_chunks: c.live_logged + c.live_variables + c.live_raw,
            bytes_in_use: c.bytes_in_use,
            regions: c.regions,
            region_bytes: c.region_bytes,
        }),
        fidelity: FidelityAnswer {
            checked: f.checked,
            address_matches: f.address_matches,
            size_matches: f.size_matches,
            sizes_checked: f.sizes_checked,
            first_divergence: f.first_divergence.as_ref().map(|d| DivergenceAnswer {
                event: d.event,
                line: d.line,
                tf_alloc_id: d.tf_alloc_id,
                requested_bytes: d.requested_bytes,
                expected_addr: d.expected_addr,
                expected_bytes: d.expected_bytes,
                got_addr: d.got_addr,
                got_bytes: d.got_bytes,
            }),
            held_back_frees: f.held_back,
            guidance: f.guided,
            guided_decisions: GuidedDecisionsAnswer {
                total: f.guided_decisions.total(),
                placements_retried: f.guided_decisions.placements_retried,
                held_back_frees: f.guided_decisions.held_back_frees,
                variables_placed_by_address: f.guided_decisions.variables_placed_by_address,
                raw_chunk_sizes_chosen: f.guided_decisions.raw_chunk_sizes_chosen,
            },
            variables_replayed: f.variables_replayed,
            logged_oom_reproduced: f.logged_oom_reproduced,
            logged_oom_reproduced_with_guidance: f.logged_oom_reproduced_with_guidance(),
            logged_oom_held_back_frees: f.logged_oom_held_back_frees,
            peak_bytes_in_use: f.peak_bytes_in_use,
            meminfo: f
                .meminfo
                .iter()
                .map(|mi| MeminfoAnswer {
                    tag: &mi.tag,
                    line: mi.line,
                    tf_current_bytes: mi.tf_current_bytes,
                    tf_peak_bytes: mi.tf_peak_bytes,
                    replay_current_bytes: mi.replay_current_bytes,
                    replay_peak_bytes: mi.replay_peak_bytes,
                })
                .collect(),
            regions_match: f.regions_match(),
            regions_logged: f.regions_logged.len(),
            regions_replayed: f.regions_replayed.len(),
        },
    };
    match serde_json::to_value(keys)? {
        Value::Object(m) => Ok(m),
        other => anyhow::bail!("the replay's keys are not an object: {other}"),
    }
}
