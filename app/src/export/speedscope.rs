//! speedscope's JSON file format (`https://www.speedscope.app/file-format-schema.json`): one
//! sampled profile in bytes per metric of the moment, sharing one frames table. A sample is a
//! stack, outermost frame first, weighed by its bytes.

use std::collections::HashMap;

use allocview_loaders::sites::StackTable;
use serde_json::{Value, json};

use super::moment::{Moment, Totals};

/// A figure of a sample's totals.
type Metric = fn(&Totals) -> u64;

/// The file for `moment`, named `name` (the input and the moment).
#[must_use]
pub fn write(moment: &Moment, stacks: &StackTable, name: &str) -> Value {
    // Samples of one stack are merged: threads and size classes are pprof's labels only.
    let mut by_stack: Vec<(u32, Totals)> = Vec::new();
    let mut index: HashMap<u32, usize> = HashMap::new();
    for (key, t) in &moment.samples {
        let i = *index.entry(key.stack).or_insert_with(|| {
            by_stack.push((key.stack, Totals::default()));
            by_stack.len() - 1
        });
        if let Some((_, sum)) = by_stack.get_mut(i) {
            sum.alloc_bytes += t.alloc_bytes;
            sum.inuse_bytes += t.inuse_bytes;
            sum.allocated_bytes += t.allocated_bytes;
            sum.pinned_free_bytes += t.pinned_free_bytes;
        }
    }
    let mut frame_index: HashMap<u32, usize> = HashMap::new();
    let mut frames: Vec<Value> = Vec::new();
    let mut stack_of = |stack: u32| -> Vec<usize> {
        let mut out: Vec<usize> = stacks
            .stack(stack)
            .iter()
            .rev()
            .map(|&f| {
                *frame_index.entry(f).or_insert_with(|| {
                    frames.push(frame_json(stacks, f));
                    frames.len() - 1
                })
            })
            .collect();
        if out.is_empty() {
            // An allocation without a recorded stack still weighs: under one frame that says so.
            out.push(*frame_index.entry(u32::MAX).or_insert_with(|| {
                frames.push(json!({"name": "(no stack recorded)"}));
                frames.len() - 1
            }));
        }
        out
    };
    let stacks_of: Vec<Vec<usize>> = by_stack.iter().map(|(s, _)| stack_of(*s)).collect();
    let mut metrics: Vec<(&str, Metric)> = vec![
        ("inuse_space", |t| t.inuse_bytes),
        ("alloc_space", |t| t.alloc_bytes),
    ];
    if moment.policy.is_some() {
        metrics.push(("allocated_space", |t| t.allocated_bytes));
        metrics.push(("pinned_free_space", |t| t.pinned_free_bytes));
    }
    let profiles: Vec<Value> = metrics
        .iter()
        .map(|(metric, value)| {
            let (samples, weights): (Vec<&Vec<usize>>, Vec<u64>) = by_stack
                .iter()
                .zip(&stacks_of)
                .map(|((_, t), s)| (s, value(t)))
                .filter(|(_, w)| *w > 0)
                .unzip();
            let total: u64 = weights.iter().sum();
            json!({
                "type": "sampled",
                "name": format!("{metric} ({name})"),
                "unit": "bytes",
                "startValue": 0,
                "endValue": total,
                "samples": samples,
                "weights": weights,
            })
        })
        .collect();
    json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": frames},
        "profiles": profiles,
        "name": name,
        "activeProfileIndex": 0,
        "exporter": format!("allocview {}", env!("CARGO_PKG_VERSION")),
    })
}

/// A frame as speedscope names it: function, and file and line where known.
fn frame_json(stacks: &StackTable, id: u32) -> Value {
    let Some(f) = stacks.frame(id) else {
        return json!({"name": "??"});
    };
    let mut v = json!({"name": f.function});
    if !f.file.is_empty() && f.file != "??" {
        v["file"] = json!(f.file);
        if f.line > 0 {
            v["line"] = json!(f.line);
        }
    } else if !f.module.is_empty() {
        v["file"] = json!(f.module);
    }
    v
}
