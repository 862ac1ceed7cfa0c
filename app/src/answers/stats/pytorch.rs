//! The PyTorch part of `stats`: settings, segments at the snapshot, reserved vs allocated vs
//! requested, peaks over the trace, phases, the largest allocations and the stacks that
//! allocated the most.

use std::collections::HashMap;

use allocview_loaders::pytorch::PytorchSnapshot;
use allocview_loaders::sites::{NO_STACK, StackTable};
use allocview_sim::trace::{EventKind, NO_ALLOC_ID};
use anyhow::Result;
use serde_json::{Value, json};

/// How many of the largest allocations and top stacks are listed.
pub(crate) const TOP: usize = 10;

/// Frames shown per stack in the table (the JSON has them all).
pub(crate) const FRAMES_SHOWN: usize = 4;

/// One allocation of the trace, with its stack.
pub(crate) struct Alloc {
    pub(crate) alloc_id: u32,
    pub(crate) size_bytes: u64,
    pub(crate) rounded_bytes: u64,
    pub(crate) address: u64,
    pub(crate) t_ns: i64,
    pub(crate) stack_id: u32,
}

/// Bytes and allocations by stack.
pub(crate) struct StackTotal {
    pub(crate) stack_id: u32,
    pub(crate) alloc_bytes: u64,
    pub(crate) allocs: u64,
    pub(crate) live_bytes_at_end: u64,
}

/// The largest allocations and the top stacks of a snapshot.
pub(crate) struct Digest {
    pub(crate) largest: Vec<Alloc>,
    pub(crate) stacks: Vec<StackTotal>,
}

pub(crate) fn digest(s: &PytorchSnapshot) -> Result<Digest> {
    let ev = &s.events;
    let kind = ev.column("kind")?.u8()?;
    let size = ev.column("size_bytes")?.u64()?;
    let rounded = ev.column("rounded_bytes")?.u64()?;
    let addr = ev.column("address")?.u64()?;
    let id = ev.column("alloc_id")?.u32()?;
    let t = ev.column("t_ns")?.i64()?;
    let stack = ev.column("stack_id")?.u32()?;
    let mut allocs: Vec<Alloc> = Vec::new();
    let mut by_stack: HashMap<u32, StackTotal> = HashMap::new();
    let mut live: HashMap<u32, (u32, u64)> = HashMap::new();
    for i in 0..ev.height() {
        let k = kind.get(i).and_then(EventKind::from_code);
        let a = id.get(i).unwrap_or(NO_ALLOC_ID);
        match k {
            Some(EventKind::Alloc) => {
                let st = stack.get(i).unwrap_or(NO_STACK);
                let sz = size.get(i).unwrap_or(0);
                allocs.push(Alloc {
                    alloc_id: a,
                    size_bytes: sz,
                    rounded_bytes: rounded.get(i).unwrap_or(0),
                    address: addr.get(i).unwrap_or(0),
                    t_ns: t.get(i).unwrap_or(0),
                    stack_id: st,
                });
                let e = by_stack.entry(st).or_insert(StackTotal {
                    stack_id: st,
                    alloc_bytes: 0,
                    allocs: 0,
                    live_bytes_at_end: 0,
                });
                e.alloc_bytes += sz;
                e.allocs += 1;
                live.insert(a, (st, sz));
            }
            Some(EventKind::Free) => {
                live.remove(&a);
            }
            _ => {}
        }
    }
    for (st, sz) in live.into_values() {
        if let Some(e) = by_stack.get_mut(&st) {
            e.live_bytes_at_end += sz;
        }
    }
    allocs.sort_by_key(|a| (std::cmp::Reverse(a.size_bytes), a.alloc_id));
    allocs.truncate(TOP);
    let mut stacks: Vec<StackTotal> = by_stack.into_values().collect();
    stacks.sort_by_key(|s| (std::cmp::Reverse(s.alloc_bytes), s.stack_id));
    stacks.truncate(TOP);
    Ok(Digest {
        largest: allocs,
        stacks,
    })
}

fn frames_json(stacks: &StackTable, id: u32) -> Value {
    json!(
        stacks
            .frames_of(id)
            .map(|f| json!({"function": f.function, "file": f.file, "line": f.line}))
            .collect::<Vec<_>>()
    )
}

/// The `pytorch` object of `stats --json`.
pub fn snapshot_json(s: &PytorchSnapshot) -> Result<Value> {
    let d = digest(s)?;
    let seg = &s.raw_segments;
    let sum = |f: fn(&allocview_loaders::pytorch::model::RawSegment) -> u64| -> u64 {
        seg.iter().map(f).sum()
    };
    let pool = |small: bool| {
        let v: Vec<_> = seg.iter().filter(|g| g.small_pool == small).collect();
        json!({"segments": v.len(), "reserved_bytes": v.iter().map(|g| g.total_bytes).sum::<u64>()})
    };
    Ok(json!({
        "device": s.device,
        "pickle_protocol": s.protocol,
        "allocator_settings": s.settings.raw.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "settings_recorded": s.settings.present,
        "entries": s.entries_by_action.iter().map(|(a, n)| (a.name().to_owned(), json!(n))).collect::<serde_json::Map<_, _>>(),
        "carried_in_allocations": s.carried_in,
        "start_segments": s.start_segments,
        "start_reserved_bytes": s.start_reserved_bytes,
        "at_snapshot": {
            "segments": seg.len(),
            "blocks": seg.iter().map(|g| g.blocks.len()).sum::<usize>(),
            "reserved_bytes": sum(|g| g.total_bytes),
            "allocated_bytes": sum(|g| g.allocated_bytes),
            "active_bytes": sum(|g| g.active_bytes),
            "requested_bytes": sum(|g| g.requested_bytes),
            "small_pool": pool(true),
            "large_pool": pool(false),
        },
        "peaks": {
            "reserved_bytes": s.peaks.reserved_bytes,
            "allocated_bytes": s.peaks.allocated_bytes,
            "requested_bytes": s.peaks.requested_bytes,
            "reserved_event": s.peaks.reserved_event,
            "allocated_event": s.peaks.allocated_event,
            "requested_event": s.peaks.requested_event,
        },
        "annotations": s.raw_annotations.iter().map(|a| json!({
            "stage": a.stage,
            "name": a.name,
            "t_ns": a.time_us.saturating_sub(s.time_origin_us).saturating_mul(1000),
        })).collect::<Vec<_>>(),
        "time_origin_us": s.time_origin_us,
        "frames": s.stacks.num_frames(),
        "stacks": s.stacks.num_stacks(),
        "largest_allocations": d.largest.iter().map(|a| json!({
            "alloc_id": a.alloc_id,
            "size_bytes": a.size_bytes,
            "rounded_bytes": a.rounded_bytes,
            "address": a.address,
            "t_ns": a.t_ns,
            "frames": frames_json(&s.stacks, a.stack_id),
        })).collect::<Vec<_>>(),
        "top_stacks": d.stacks.iter().map(|t| json!({
            "stack_id": (t.stack_id != NO_STACK).then_some(t.stack_id),
            "alloc_bytes": t.alloc_bytes,
            "allocs": t.allocs,
            "live_bytes_at_end": t.live_bytes_at_end,
            "frames": frames_json(&s.stacks, t.stack_id),
        })).collect::<Vec<_>>(),
        "notes": s.notes,
    }))
}
