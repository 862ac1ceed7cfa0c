//! `compare`'s tables: a row per policy, and with `--min-limit`, each policy's smallest
//! `--limit` without an OOM ([`crate::answers::compare::for_specs`]) beside the peak live bytes.

use allocview_sim::min_limit::MinLimit;
use anyhow::Result;

use crate::answers::compare::Row;
use crate::format;

/// The table of the rows.
pub(super) fn print_table(file: &str, events: usize, max_live: u64, rows: &[Row]) -> Result<()> {
    use format::{bytes, count};
    outln!(
        "{file}: {} events, max live {}",
        count(events as u64),
        bytes(max_live)
    );
    outln!();
    // Variants' labels (`pytorch:max_split_size_mb=128`) widen the first column.
    let w = rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(10);
    outln!(
        "  {:<w$} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>9} {:>6} {:>12}",
        "policy",
        "peak foot",
        "final foot",
        "peak live",
        "peak alloc",
        "frag@peak",
        "mean frag",
        "foot/live",
        "OOMs",
        "events/s"
    );
    for r in rows {
        outln!(
            "  {:<w$} {:>11} {:>11} {:>11} {:>11} {:>8.1}% {:>8.1}% {:>9.3} {:>6} {:>12}",
            r.name,
            bytes(r.peak_footprint_bytes),
            bytes(r.final_footprint_bytes),
            bytes(r.peak_live_bytes),
            bytes(r.peak_allocated_bytes),
            100.0 * r.fragmentation_at_peak,
            100.0 * r.mean_fragmentation,
            r.footprint_over(max_live),
            count(r.ooms),
            format::rate(r.events_per_second)
        );
    }
    for r in rows {
        if !r.notes.is_empty() {
            outln!();
            for n in &r.notes {
                outln!("  {}: {n}", r.name);
            }
        }
        if let Some(t) = &r.first_oom_text {
            outln!("\n  {}: {t}", r.name);
        }
    }
    Ok(())
}

/// The table's section: each policy's minimum against the peak live bytes.
pub(super) fn print_minima(rows: &[(String, MinLimit)], max_live_bytes: u64) -> Result<()> {
    use format::{bytes, count};
    outln!();
    outln!(
        "  smallest limit without OOM (peak live {}):",
        bytes(max_live_bytes)
    );
    let w = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0).max(10);
    outln!(
        "  {:<w$} {:>15} {:>11} {:>9} {:>14} {:>8}",
        "policy",
        "min limit (B)",
        "min limit",
        "/ live",
        "method",
        "replays"
    );
    for (name, m) in rows {
        let (exact, human, ratio) = match m.min_limit_bytes {
            Some(b) => (
                b.to_string(),
                bytes(b),
                if max_live_bytes == 0 {
                    "-".to_owned()
                } else {
                    format!("{:.3}", b as f64 / max_live_bytes as f64)
                },
            ),
            None => ("none".to_owned(), "-".to_owned(), "-".to_owned()),
        };
        outln!(
            "  {:<w$} {:>15} {:>11} {:>9} {:>14} {:>8}",
            name,
            exact,
            human,
            ratio,
            m.method.name(),
            count(u64::from(m.replays))
        );
    }
    for (name, m) in rows {
        if let Some(l) = m.larger_limit_failing {
            outln!(
                "  {name}: not monotone: a larger limit, {} ({}), fails again",
                bytes(l),
                l
            );
        }
        if m.min_limit_bytes.is_none() {
            outln!("  {name}: fails even without a limit (requests it cannot serve)");
        }
    }
    Ok(())
}

/// The advice lines: each real allocator that beats the C library's on this trace.
pub(super) fn print_advice(advice: &[crate::answers::compare::Advice]) -> Result<()> {
    if advice.is_empty() {
        return Ok(());
    }
    outln!();
    for a in advice {
        outln!("  {}", a.text);
    }
    Ok(())
}

/// The recorded program's own memory, under the table (a trace made by `record`).
pub(super) fn print_recorded(
    m: Option<&crate::answers::recorded_memory::RecordedMemory>,
) -> Result<()> {
    let Some(m) = m else {
        return Ok(());
    };
    outln!();
    if m.is_reserved() {
        outln!(
            "  recorded: PyTorch's caching allocator reserved at most {} on the device (Total \
             Reserved in the profiler trace, {} samples), {} at the end",
            format::bytes(m.peak_rss_bytes),
            format::count(m.samples as u64),
            format::bytes(m.final_rss_bytes)
        );
        return Ok(());
    }
    if m.is_resident_only() {
        outln!(
            "  recorded: the program's peak RSS was {} ({} samples; its anonymous part and its \
             mappings outside the allocator were not recorded), {} at the end",
            format::bytes(m.peak_rss_bytes),
            format::count(m.samples as u64),
            format::bytes(m.final_rss_bytes)
        );
        return Ok(());
    }
    outln!(
        "  recorded: the program's peak RSS was {} (anonymous {} at most, {} at the start: it \
         grew by {}), measured while it ran; it mapped up to {} of anonymous memory outside \
         the allocator ({} calls)",
        format::bytes(m.peak_rss_bytes),
        format::bytes(m.peak_anon_bytes),
        format::bytes(m.first_anon_bytes),
        format::bytes(m.anon_growth_bytes()),
        format::bytes(m.mapped_outside_allocator_peak_bytes),
        format::count(m.mapping_calls as u64)
    );
    Ok(())
}
