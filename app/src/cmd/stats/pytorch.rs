//! The PyTorch part of `allocview stats`: settings, segments at the snapshot, reserved vs
//! allocated vs requested, peaks over the trace, phases, the largest allocations and the
//! stacks that allocated the most.

use allocview_loaders::pytorch::PytorchSnapshot;
use allocview_loaders::sites::StackTable;
use anyhow::Result;

use crate::answers::stats::pytorch::{FRAMES_SHOWN, digest};

use crate::format::{bytes, count, trace_text};

/// A stack for the table (see [`StackTable::site_lines`]).
fn frames_text(stacks: &StackTable, id: u32) -> Vec<String> {
    let lines = stacks.site_lines(id, FRAMES_SHOWN, false);
    if lines.is_empty() {
        vec!["(no frames recorded)".to_owned()]
    } else {
        lines.iter().map(|l| trace_text(l).into_owned()).collect()
    }
}

/// The PyTorch part of the `stats` table.
pub fn print_snapshot(s: &PytorchSnapshot) -> Result<()> {
    let d = digest(s)?;
    let seg = &s.raw_segments;
    outln!();
    outln!(
        "  PyTorch memory snapshot, device {} (pickle protocol {}): {} trace entries ({})",
        s.device,
        s.protocol,
        count(s.entries_by_action.iter().map(|(_, n)| n).sum()),
        s.entries_by_action
            .iter()
            .map(|(a, n)| format!("{} {}", count(*n), a.name()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if s.settings.present {
        for (k, v) in &s.settings.raw {
            outln!("  setting {:<34} {}", trace_text(k), trace_text(v));
        }
    }
    let total = |f: fn(&allocview_loaders::pytorch::model::RawSegment) -> u64| -> u64 {
        seg.iter().map(f).sum()
    };
    outln!(
        "  at the snapshot: {} segments ({} small-pool), {} blocks",
        count(seg.len() as u64),
        count(seg.iter().filter(|g| g.small_pool).count() as u64),
        count(seg.iter().map(|g| g.blocks.len() as u64).sum())
    );
    for (what, value) in [
        ("reserved", total(|g| g.total_bytes)),
        ("allocated", total(|g| g.allocated_bytes)),
        ("active", total(|g| g.active_bytes)),
        ("requested", total(|g| g.requested_bytes)),
    ] {
        outln!("    {what:<19} {:>14}", bytes(value));
    }
    outln!(
        "  over the trace: peak reserved {}, peak allocated {}, peak requested {}",
        bytes(s.peaks.reserved_bytes),
        bytes(s.peaks.allocated_bytes),
        bytes(s.peaks.requested_bytes)
    );
    outln!(
        "  the trace starts after the process did: {} allocations carried in, {} segments \
         ({}) existed at its start",
        count(u64::from(s.carried_in)),
        count(s.start_segments as u64),
        bytes(s.start_reserved_bytes)
    );
    if !s.raw_annotations.is_empty() {
        let mut names: Vec<&str> = s.raw_annotations.iter().map(|a| a.name.as_str()).collect();
        names.dedup();
        names.sort_unstable();
        names.dedup();
        outln!(
            "  phases ({} annotations): {}",
            count(s.raw_annotations.len() as u64),
            trace_text(&names.join(", "))
        );
    }
    outln!();
    outln!("  largest allocations:");
    for a in &d.largest {
        outln!(
            "    {:>12} at {:#x}, allocation {} at {:.3} ms",
            bytes(a.size_bytes),
            a.address,
            a.alloc_id,
            a.t_ns as f64 / 1e6
        );
        if let Some(f) = frames_text(&s.stacks, a.stack_id).first() {
            outln!("        {f}");
        }
    }
    outln!();
    outln!("  top stacks by bytes allocated over the trace:");
    for t in &d.stacks {
        outln!(
            "    {:>12} in {} allocations ({} live at the end)",
            bytes(t.alloc_bytes),
            count(t.allocs),
            bytes(t.live_bytes_at_end)
        );
        for f in frames_text(&s.stacks, t.stack_id) {
            outln!("        {f}");
        }
    }
    for n in &s.notes {
        outln!("  note: {n}");
    }
    Ok(())
}
