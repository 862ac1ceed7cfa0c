//! PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot`).
//!
//! [`pickle`] decodes the file without importing or calling anything; [`model`] reads its
//! segments, trace, annotations and settings with every key optional; [`rebuild`] turns one
//! device's trace into allocview's event table and rebuilds the allocator's state at the start
//! of the trace (snapshots are ring buffers), which the `pytorch` policy replays from.
//!
//! # The event DataFrame
//!
//! The common schema of the crate docs (`t_ns`, `thread`, `kind`, `size_bytes`, `address`,
//! `alloc_id`, `size_class`), where:
//! - `t_ns` is nanoseconds since the first trace entry ([`PytorchSnapshot::time_origin_us`] is
//!   its Unix-epoch time); files without `time_us` use one microsecond per entry;
//! - `thread` is the stream (index into `threads`, whose `tid` is the stream value);
//! - an `alloc` entry is an `alloc` event, its `free_completed` the `free` event, and
//!   `free_requested` is kind 5 (`free_requested`, no `alloc_id`);
//! - the first [`PytorchSnapshot::carried_in`] events are allocations live when the trace
//!   began (rebuilt, at time 0);
//!
//! plus `rounded_bytes` (UInt64: the caching allocator's block size for the request),
//! `pool` (UInt8: 0 small, 1 large, by the rounded size), `stack_id` (UInt32, null without
//! frames; see [`crate::sites`]) and `entry` (UInt32, null for carried-in rows: the index of
//! the trace entry).
//!
//! # Other tables
//!
//! - `segments` (at the snapshot's moment): `address`, `total_bytes`, `allocated_bytes`,
//!   `active_bytes`, `requested_bytes` (UInt64), `stream` (UInt64), `pool` (String: `small` or
//!   `large`), `expandable` (Boolean), `stack_id` (UInt32, nullable).
//! - `blocks`: `segment` (UInt32, row of `segments`), `address`, `size_bytes`,
//!   `requested_bytes` (UInt64), `state` (String), `stack_id` (UInt32, nullable).
//! - `segment_events`: `action` (String: `segment_alloc`, `segment_free`, `segment_map`,
//!   `segment_unmap`, `oom`, `snapshot`, ...), `address`, `size_bytes`, `stream` (UInt64),
//!   `t_ns` (Int64), `before_event` (UInt32: rows of the event table before it),
//!   `device_free_bytes` (UInt64, nullable; `oom` only), `stack_id` (UInt32, nullable).
//! - `annotations`: `stage`, `name` (String), `t_ns` (Int64; may be negative when a phase began
//!   before the trace).
//! - `frames` and `stacks`: see [`crate::sites`].

pub mod model;
pub mod pickle;
pub mod rebuild;

use std::path::Path;
use std::time::Instant;

use allocview_sim::policy::pytorch::PytorchScript;
use allocview_sim::trace::{NO_ALLOC_ID, size_class};
use polars::prelude::*;

use crate::error::LoadError;
use crate::events::{LoadOptions, LoadSummary};
use crate::sites::{StackTable, stack_id_column};
use model::{Action, Annotation, RawSegment, Settings};
use rebuild::Rebuilt;

/// A loaded snapshot.
#[derive(Clone, Debug)]
pub struct PytorchSnapshot {
    /// The device whose trace the events are (the one with the most entries).
    pub device: i64,
    /// Devices with a trace, and entries of each.
    pub device_entries: Vec<(i64, usize)>,
    pub protocol: u8,
    pub events: DataFrame,
    /// Streams: `thread` (UInt16) and `tid` (UInt64, the stream value).
    pub threads: DataFrame,
    pub segments: DataFrame,
    pub blocks: DataFrame,
    pub segment_events: DataFrame,
    pub annotations: DataFrame,
    pub frames: DataFrame,
    pub stacks_table: DataFrame,
    /// The interned stacks, for frontends that show frames.
    pub stacks: StackTable,
    /// The device's final segments, typed; their blocks are in `raw_blocks`.
    pub raw_segments: Vec<RawSegment>,
    pub raw_blocks: Vec<model::RawBlock>,
    pub raw_annotations: Vec<Annotation>,
    pub settings: Settings,
    /// What the `pytorch` policy replays from.
    pub script: PytorchScript,
    pub time_origin_us: i64,
    /// Allocations live when the trace began (the first rows of `events`).
    pub carried_in: u32,
    pub start_reserved_bytes: u64,
    pub start_segments: usize,
    /// Trace entries by action.
    pub entries_by_action: Vec<(Action, u64)>,
    /// Peaks over the trace (reserved from the segment events, allocated and requested from
    /// the allocations), carried-in allocations included.
    pub peaks: rebuild::Peaks,
    /// Counts in the malloc-trace summary's terms.
    pub summary: LoadSummary,
    /// Format notes (missing keys and what was assumed) and rebuild notes.
    pub notes: Vec<String>,
    /// Items skipped (counted and described), unknown actions, clamped times.
    pub warnings: Vec<String>,
    pub load_seconds: f64,
}

/// True when `head` (the first bytes of a file) is a pickle that looks like a memory snapshot:
/// protocol 2 to 5 and, near the start, the `segments` key or a PyTorch 1.13 segment list.
#[must_use]
pub fn is_snapshot(head: &[u8]) -> bool {
    let [0x80, proto, ..] = head else {
        return false;
    };
    if !(2..=5).contains(proto) {
        return false;
    }
    let has = |needle: &[u8]| head.windows(needle.len()).any(|w| w == needle);
    has(b"segments") || has(b"device_traces") || (has(b"total_size") && has(b"blocks"))
}

/// Loads a snapshot file.
///
/// # Errors
/// When the file cannot be read, is not a valid pickle (the error names the byte offset), or
/// is not a memory snapshot.
pub fn load_snapshot(path: &Path, opts: &LoadOptions) -> Result<PytorchSnapshot, LoadError> {
    let started = Instant::now();
    let decoded = pickle::decode_file(path, opts.progress.as_deref())
        .map_err(|e| LoadError::format(path, e.to_string()))?;
    let raw = model::read_snapshot(&decoded).map_err(|m| LoadError::format(path, m))?;
    let protocol = decoded.protocol();
    drop(decoded);
    let mut snap = from_raw(raw, protocol)?;
    snap.load_seconds = started.elapsed().as_secs_f64();
    Ok(snap)
}

/// Builds the snapshot's tables from its typed objects.
///
/// # Errors
/// Only when polars fails to assemble the columns.
pub fn from_raw(raw: model::RawSnapshot, protocol: u8) -> Result<PytorchSnapshot, LoadError> {
    let model::RawSnapshot {
        segments,
        blocks,
        device_traces,
        streams,
        annotations,
        settings,
        stacks,
        missing,
        unknown_actions,
        skipped,
    } = raw;
    let device_entries: Vec<(i64, usize)> =
        (0i64..).zip(device_traces.iter().map(Vec::len)).collect();
    let device = device_entries
        .iter()
        .max_by_key(|&&(d, n)| (n, std::cmp::Reverse(d)))
        .map_or_else(|| segments.first().map_or(0, |s| s.device), |&(d, _)| d);
    let empty = Vec::new();
    let trace = usize::try_from(device)
        .ok()
        .and_then(|d| device_traces.get(d))
        .unwrap_or(&empty);
    let dev_segments: Vec<RawSegment> = segments
        .into_iter()
        .filter(|s| s.device == device)
        .collect();
    let mut rebuilt = rebuild::rebuild(&dev_segments, &blocks, trace, &streams, &settings.policy);
    let mut entries_by_action: Vec<(Action, u64)> = Action::ALL.iter().map(|&a| (a, 0)).collect();
    for e in trace {
        if let Some(slot) = entries_by_action.iter_mut().find(|(a, _)| *a == e.action) {
            slot.1 += 1;
        }
    }
    entries_by_action.retain(|&(_, n)| n > 0);
    // The raw entries are done with: free them before the columns are built (a 1 GB
    // snapshot's entries take about 700 MB).
    drop(device_traces);
    let mut notes = missing;
    notes.extend(rebuilt.notes.iter().cloned());
    if device_entries.iter().filter(|&&(_, n)| n > 0).count() > 1 {
        notes.push(format!(
            "traces of {} devices; showing device {device}, which has the most entries",
            device_entries.len()
        ));
    }
    let mut warnings = skipped;
    let mut unknown: Vec<_> = unknown_actions.into_iter().collect();
    unknown.sort();
    for (name, n) in unknown {
        warnings.push(format!(
            "{n} trace entries with unknown action {name:?} skipped"
        ));
    }
    if rebuilt.times_clamped > 0 {
        warnings.push(format!(
            "{} trace entries earlier than the one before them (times clamped)",
            rebuilt.times_clamped
        ));
    }
    if rebuilt.unknown_frees > 0 {
        warnings.push(format!(
            "{} frees of addresses that were not live (kept as free_unknown)",
            rebuilt.unknown_frees
        ));
    }
    let summary = summary_of(&rebuilt.events.kind);
    let peaks = rebuilt.peaks();
    let t0 = rebuilt.time_origin_us;
    let events = events_frame(std::mem::take(&mut rebuilt.events))?;
    Ok(PytorchSnapshot {
        device,
        device_entries,
        protocol,
        events,
        threads: DataFrame::new_infer_height(vec![
            UInt16Chunked::from_vec("thread".into(), (0..rebuilt.streams.len() as u16).collect())
                .into_column(),
            UInt64Chunked::from_vec("tid".into(), rebuilt.streams.clone()).into_column(),
        ])?,
        segments: segments_frame(&dev_segments)?,
        blocks: blocks_frame(&dev_segments, &blocks)?,
        segment_events: segment_events_frame(&rebuilt)?,
        annotations: annotations_frame(&annotations, device, t0)?,
        frames: stacks.frames_frame()?,
        stacks_table: stacks.stacks_frame()?,
        stacks,
        raw_segments: dev_segments,
        raw_blocks: blocks,
        raw_annotations: annotations
            .into_iter()
            .filter(|a| a.device == device)
            .collect(),
        settings,
        script: rebuilt.script,
        time_origin_us: t0,
        carried_in: rebuilt.carried_in,
        start_reserved_bytes: rebuilt.start_reserved_bytes,
        start_segments: rebuilt.start_segments,
        entries_by_action,
        peaks,
        summary,
        notes,
        warnings,
        load_seconds: 0.0,
    })
}

fn summary_of(kinds: &[allocview_sim::trace::EventKind]) -> LoadSummary {
    use allocview_sim::trace::EventKind;
    let mut s = LoadSummary::default();
    for kind in kinds {
        s.events += 1;
        match kind {
            EventKind::Alloc | EventKind::AllocFailed => s.mallocs += 1,
            EventKind::Free | EventKind::FreeNull => s.frees += 1,
            EventKind::FreeUnknown => {
                s.frees += 1;
                s.frees_unknown += 1;
            }
            EventKind::FreeRequested => {}
        }
    }
    s
}

/// Moves the columns into the event table; derived columns are computed before their source
/// moves.
fn events_frame(ev: rebuild::EventColumns) -> PolarsResult<DataFrame> {
    let rebuild::EventColumns {
        t_ns,
        stream_index,
        kind,
        size_bytes,
        rounded_bytes,
        address,
        alloc_id,
        stack_id,
        entry,
    } = ev;
    let alloc_id = if alloc_id.contains(&NO_ALLOC_ID) {
        let validity: Vec<bool> = alloc_id.iter().map(|&a| a != NO_ALLOC_ID).collect();
        UInt32Chunked::from_vec_validity("alloc_id".into(), alloc_id, Some(validity.into()))
    } else {
        UInt32Chunked::from_vec("alloc_id".into(), alloc_id)
    };
    let thread = if stream_index.iter().all(|&t| t < 256) {
        UInt8Chunked::from_vec(
            "thread".into(),
            stream_index.iter().map(|&t| t as u8).collect(),
        )
        .into_column()
    } else {
        UInt16Chunked::from_vec("thread".into(), stream_index).into_column()
    };
    let kind: Vec<u8> = kind.iter().map(|k| k.code()).collect();
    let size_class: Vec<u8> = size_bytes.iter().map(|&s| size_class(s)).collect();
    let pool: Vec<u8> = rounded_bytes
        .iter()
        .map(|&r| u8::from(r > SMALL_SIZE_BYTES))
        .collect();
    let entry = if entry.contains(&rebuild::NO_ENTRY) {
        let validity: Vec<bool> = entry.iter().map(|&e| e != rebuild::NO_ENTRY).collect();
        UInt32Chunked::from_vec_validity("entry".into(), entry, Some(validity.into()))
    } else {
        UInt32Chunked::from_vec("entry".into(), entry)
    };
    DataFrame::new_infer_height(vec![
        Int64Chunked::from_vec("t_ns".into(), t_ns).into_column(),
        thread,
        UInt8Chunked::from_vec("kind".into(), kind).into_column(),
        UInt64Chunked::from_vec("size_bytes".into(), size_bytes).into_column(),
        UInt64Chunked::from_vec("address".into(), address).into_column(),
        alloc_id.into_column(),
        UInt8Chunked::from_vec("size_class".into(), size_class).into_column(),
        UInt64Chunked::from_vec("rounded_bytes".into(), rounded_bytes).into_column(),
        UInt8Chunked::from_vec("pool".into(), pool).into_column(),
        stack_id_column("stack_id", stack_id),
        entry.into_column(),
    ])
}

/// PyTorch's `kSmallSize`: rounded requests up to 1 MiB use the small pool.
const SMALL_SIZE_BYTES: u64 = 1 << 20;

fn segments_frame(segments: &[RawSegment]) -> PolarsResult<DataFrame> {
    let u = |name: &str, f: &dyn Fn(&RawSegment) -> u64| {
        UInt64Chunked::from_vec(name.into(), segments.iter().map(f).collect()).into_column()
    };
    DataFrame::new_infer_height(vec![
        u("address", &|s| s.address),
        u("total_bytes", &|s| s.total_bytes),
        u("allocated_bytes", &|s| s.allocated_bytes),
        u("active_bytes", &|s| s.active_bytes),
        u("requested_bytes", &|s| s.requested_bytes),
        u("stream", &|s| s.stream),
        Column::new(
            "pool".into(),
            segments
                .iter()
                .map(|s| if s.small_pool { "small" } else { "large" })
                .collect::<Vec<_>>(),
        ),
        Column::new(
            "expandable".into(),
            segments.iter().map(|s| s.expandable).collect::<Vec<_>>(),
        ),
        stack_id_column("stack_id", segments.iter().map(|s| s.stack_id).collect()),
    ])
}

fn blocks_frame(segments: &[RawSegment], blocks: &[model::RawBlock]) -> PolarsResult<DataFrame> {
    let mut seg = Vec::new();
    let mut address = Vec::new();
    let mut size = Vec::new();
    let mut requested = Vec::new();
    let mut state = Vec::new();
    let mut stack = Vec::new();
    for (i, s) in (0u32..).zip(segments) {
        for b in blocks.get(s.blocks.clone()).unwrap_or_default() {
            seg.push(i);
            address.push(b.address);
            size.push(b.size_bytes);
            requested.push(b.requested_bytes);
            state.push(b.state.name());
            stack.push(b.stack_id);
        }
    }
    DataFrame::new_infer_height(vec![
        UInt32Chunked::from_vec("segment".into(), seg).into_column(),
        UInt64Chunked::from_vec("address".into(), address).into_column(),
        UInt64Chunked::from_vec("size_bytes".into(), size).into_column(),
        UInt64Chunked::from_vec("requested_bytes".into(), requested).into_column(),
        Column::new("state".into(), state),
        stack_id_column("stack_id", stack),
    ])
}

fn segment_events_frame(r: &Rebuilt) -> PolarsResult<DataFrame> {
    let ev = &r.segment_events;
    DataFrame::new_infer_height(vec![
        Column::new(
            "action".into(),
            ev.iter().map(|e| e.action.name()).collect::<Vec<_>>(),
        ),
        UInt64Chunked::from_vec("address".into(), ev.iter().map(|e| e.address).collect())
            .into_column(),
        UInt64Chunked::from_vec(
            "size_bytes".into(),
            ev.iter().map(|e| e.size_bytes).collect(),
        )
        .into_column(),
        UInt64Chunked::from_vec("stream".into(), ev.iter().map(|e| e.stream).collect())
            .into_column(),
        Int64Chunked::from_vec("t_ns".into(), ev.iter().map(|e| e.t_ns).collect()).into_column(),
        UInt32Chunked::from_vec(
            "before_event".into(),
            ev.iter().map(|e| e.before_event).collect(),
        )
        .into_column(),
        UInt64Chunked::from_iter_options(
            "device_free_bytes".into(),
            ev.iter().map(|e| e.device_free_bytes),
        )
        .into_column(),
        stack_id_column("stack_id", ev.iter().map(|e| e.stack_id).collect()),
    ])
}

fn annotations_frame(
    annotations: &[Annotation],
    device: i64,
    t0_us: i64,
) -> PolarsResult<DataFrame> {
    let a: Vec<&Annotation> = annotations.iter().filter(|a| a.device == device).collect();
    DataFrame::new_infer_height(vec![
        Column::new(
            "stage".into(),
            a.iter().map(|a| a.stage.as_str()).collect::<Vec<_>>(),
        ),
        Column::new(
            "name".into(),
            a.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
        ),
        Int64Chunked::from_vec(
            "t_ns".into(),
            a.iter()
                .map(|a| a.time_us.saturating_sub(t0_us).saturating_mul(1000))
                .collect(),
        )
        .into_column(),
    ])
}
