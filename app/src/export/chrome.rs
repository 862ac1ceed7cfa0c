//! Chrome's Trace Event JSON, as Perfetto's UI and `chrome://tracing` open it: per policy a
//! process of its own with two counter tracks (`bytes`: live, allocated, footprint;
//! `fragmentation`: of the footprint, and external), instants at its peak footprint and first
//! OOM; the recorded program's resident memory where the trace has it, and the run's marks
//! (`allocview ctl PID mark NAME`, where recording stopped and started) as global instants; a
//! PyTorch snapshot's annotations as slices. Built from the bucketed series `compare` draws (a few thousand
//! points a policy whatever the input's length), never an event per allocation. Times are
//! microseconds from the input's first event.

use allocview_loaders::Loaded;
use allocview_loaders::binary::MemorySample;
use allocview_sim::trace::TraceView;
use anyhow::Result;
use polars::prelude::*;
use serde_json::{Value, json};

use crate::answers::compare::Compared;

/// The process id of the recorded memory and the annotations (policies count from 1).
const RECORDED_PID: usize = 0;

/// The trace of `compared` (replayed from `loaded`, whose events are `view`), named `name`.
///
/// # Errors
/// When the series table lacks a column `compare` writes.
pub fn write(
    compared: &Compared,
    loaded: &Loaded,
    view: &TraceView<'_>,
    memory: &[MemorySample],
    name: &str,
) -> Result<Value> {
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    let us = |t_ns: i64| (t_ns - t0) as f64 / 1e3;
    let mut events: Vec<Value> = vec![meta(RECORDED_PID, &format!("{name}: recorded"), 0)];
    for (k, row) in compared.rows.iter().enumerate() {
        let pid = k + 1;
        events.push(meta(pid, &row.name, pid));
        if let Some(e) = row.peak_footprint_event
            && let Some(&t) = view.t_ns.get(e)
        {
            events.push(instant(
                pid,
                us(t),
                &format!(
                    "peak footprint {}",
                    crate::format::bytes(row.peak_footprint_bytes)
                ),
            ));
        }
        if let Some(oom) = &row.first_oom
            && let Some(t) = oom.get("t_ns").and_then(Value::as_i64)
        {
            let text = row.first_oom_text.as_deref().unwrap_or("first OOM");
            events.push(instant(pid, us(t), &format!("OOM: {text}")));
        }
    }
    if let Some(series) = &compared.series {
        counters(series, &compared.rows, &mut events)?;
    }
    for s in memory {
        events.push(json!({
            "name": "recorded resident memory", "ph": "C", "ts": us(s.t_ns),
            "pid": RECORDED_PID, "tid": 0,
            "args": {"resident": s.resident_bytes, "anonymous": s.anon_bytes},
        }));
    }
    for m in crate::answers::marks::marks_of(loaded) {
        // Global scope: Perfetto draws a line across every track at the mark.
        events.push(
            json!({"name": m.label(), "ph": "i", "s": "g", "ts": us(m.t_ns),
                           "pid": RECORDED_PID, "tid": 0, "cat": "mark"}),
        );
    }
    if let Loaded::PytorchSnapshot(s) = loaded {
        annotations(&s.annotations, &mut events)?;
    }
    Ok(json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"source": name, "exporter": format!("allocview {}", env!("CARGO_PKG_VERSION"))},
    }))
}

fn meta(pid: usize, name: &str, sort: usize) -> Value {
    json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name},
           "sort_index": sort})
}

fn instant(pid: usize, ts_us: f64, name: &str) -> Value {
    json!({"name": name, "ph": "i", "s": "p", "ts": ts_us, "pid": pid, "tid": 0})
}

/// The counter events of every row's series (`compare`'s table: seconds since the first
/// event, the bucket's maximum bytes and its last fractions).
fn counters(
    series: &DataFrame,
    rows: &[crate::answers::compare::Row],
    out: &mut Vec<Value>,
) -> Result<()> {
    let col = |n: &str| {
        anyhow::Context::with_context(series.column(n), || format!("the series lack {n}"))
    };
    let policy = col("policy")?.str()?.clone();
    let t_s = col("t_s")?.f64()?.clone();
    let live = col("live_bytes")?.u64()?.clone();
    let allocated = col("allocated_bytes")?.u64()?.clone();
    let footprint = col("footprint_bytes")?.u64()?.clone();
    let frag = col("fragmentation")?.f64()?.clone();
    let ext = col("external_fragmentation")?.f64()?.clone();
    for i in 0..series.height() {
        let Some(name) = policy.get(i) else { continue };
        let Some(pid) = rows.iter().position(|r| r.name == name).map(|k| k + 1) else {
            continue;
        };
        let ts = t_s.get(i).unwrap_or(0.0) * 1e6;
        out.push(json!({
            "name": "bytes", "ph": "C", "ts": ts, "pid": pid, "tid": 0,
            "args": {"live": live.get(i), "allocated": allocated.get(i),
                     "footprint": footprint.get(i)},
        }));
        out.push(json!({
            "name": "fragmentation", "ph": "C", "ts": ts, "pid": pid, "tid": 0,
            "args": {"fragmentation": frag.get(i), "external": ext.get(i)},
        }));
    }
    Ok(())
}

/// A snapshot's annotations: a `START` and the next `END` of one name make a slice; an
/// unmatched one is an instant.
fn annotations(frame: &DataFrame, out: &mut Vec<Value>) -> Result<()> {
    if frame.height() == 0 {
        return Ok(());
    }
    let stage = frame.column("stage")?.str()?.clone();
    let name = frame.column("name")?.str()?.clone();
    let t_ns = frame.column("t_ns")?.i64()?.clone();
    let mut open: std::collections::HashMap<String, f64> = Default::default();
    for i in 0..frame.height() {
        let (Some(s), Some(n), Some(t)) = (stage.get(i), name.get(i), t_ns.get(i)) else {
            continue;
        };
        let ts = t as f64 / 1e3;
        match s {
            "START" => {
                open.insert(n.to_owned(), ts);
            }
            "END" => match open.remove(n) {
                Some(start) => out.push(json!({
                    "name": n, "ph": "X", "ts": start, "dur": (ts - start).max(0.0),
                    "pid": RECORDED_PID, "tid": 1, "cat": "annotation",
                })),
                None => out.push(instant(RECORDED_PID, ts, n)),
            },
            _ => out.push(instant(RECORDED_PID, ts, n)),
        }
    }
    for (n, ts) in open {
        out.push(instant(RECORDED_PID, ts, &format!("{n} (no END)")));
    }
    Ok(())
}
