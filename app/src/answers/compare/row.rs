//! One policy's row of `compare`: its figures from a replay, and the notes only some replays
//! have (requests a policy cannot serve; a PyTorch replay's fidelity to the snapshot).

use allocview_sim::policy::pytorch::{Pytorch, SegmentOpKind};
use allocview_sim::replay::Replay;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::format;

/// Requests the policy cannot serve at all (an alignment it does not support, a size past
/// what it can model) count among its OOMs; say how many and why, in the table and the JSON
/// (`unsupported`, `unsupported_reason`), so they are not read as memory running out.
pub fn note_unsupported(row: &mut Row, rep: &Replay) {
    use allocview_sim::heap::AllocError;
    let mut reasons = rep.ooms.iter().filter_map(|o| match &o.error {
        AllocError::Unsupported(why) => Some(why),
        AllocError::OutOfMemory { .. } => None,
    });
    let Some(first) = reasons.next() else {
        row.extra.insert("unsupported".into(), json!(0));
        return;
    };
    let count = 1 + reasons.count() as u64;
    row.extra.insert("unsupported".into(), json!(count));
    row.extra
        .insert("unsupported_reason".into(), json!(first.to_string()));
    row.notes.push(format!(
        "{} of its {} OOMs are requests it cannot serve at all, not memory running out: {first}",
        format::count(count),
        format::count(row.ooms)
    ));
}

/// For `pytorch` replaying a snapshot from its rebuilt start: the addresses it chose against
/// the recorded ones (`fidelity`), its cudaMalloc/cudaFree counts, and what of its figures the
/// recording decides (`limit_bytes` is the `--limit` asked for, which this replay ignores).
pub fn pytorch_fidelity(row: &mut Row, rep: &Replay, limit_bytes: Option<u64>) {
    let Some(p) = rep.final_state.as_any().downcast_ref::<Pytorch>() else {
        return;
    };
    let segs = p.segment_events();
    let count = |k: SegmentOpKind| segs.iter().filter(|e| e.op.kind == k).count();
    row.extra.insert(
        "segments".into(),
        json!({
            "segment_alloc": count(SegmentOpKind::Alloc),
            "segment_free": count(SegmentOpKind::Free),
            "segment_map": count(SegmentOpKind::Map),
            "segment_unmap": count(SegmentOpKind::Unmap),
        }),
    );
    let Some(f) = p.fidelity() else {
        return;
    };
    row.extra.insert(
        "fidelity".into(),
        json!({
            "checked": f.checked,
            "address_matches": f.address_matches,
            "segment_allocs_checked": f.segment_allocs_checked,
            "segment_alloc_matches": f.segment_alloc_matches,
            "first_divergence": f.first_divergence.as_ref().map(|d| json!({
                "alloc_id": d.alloc_id,
                "requested_bytes": d.requested_bytes,
                "recorded_addr": d.recorded_addr,
                "policy_addr": d.policy_addr,
                "what": d.what,
            })),
            "divergences": f.divergences,
        }),
    );
    row.notes.push(format!(
        "replayed from the snapshot's rebuilt start state: {} of {} allocations at their \
         recorded address, {} of {} new segments where and as large as the trace has them, \
         {} divergences",
        format::count(f.address_matches),
        format::count(f.checked),
        format::count(f.segment_alloc_matches),
        format::count(f.segment_allocs_checked),
        format::count(f.divergences)
    ));
    recorded_figures(row, f, limit_bytes);
    if let Some(d) = &f.first_divergence {
        row.notes.push(format!(
            "first divergence at allocation {} ({}): recorded {:#x}, policy {}: {}",
            d.alloc_id,
            format::bytes(d.requested_bytes),
            d.recorded_addr,
            d.policy_addr
                .map_or_else(|| "none".to_owned(), |a| format!("{a:#x}")),
            d.what
        ));
    }
}

/// The recorded replay applies no limit (the recording's own releases stand in for it) and,
/// after a divergence, goes on from the recorded placement: say both, in the table's notes and
/// in the JSON (`limit_applied`, `limit_note`, `figures_follow_recording`, `figures_note`), as
/// a figure that comes from the recording rather than the model must.
fn recorded_figures(
    row: &mut Row,
    f: &allocview_sim::policy::pytorch::Fidelity,
    limit_bytes: Option<u64>,
) {
    let limit_note = match limit_bytes {
        Some(l) => format!(
            "--limit {} is not applied: the replay of the recorded run follows its recorded \
             settings and releases, so it has no OOM at any limit (pytorch:start=empty applies it)",
            format::bytes(l)
        ),
        None => "no limit is applied to the replay of the recorded run: its recorded releases \
                 stand in for one (pytorch:start=empty applies --limit)"
            .to_owned(),
    };
    let follows = f.divergences > 0;
    let figures_note = match &f.first_divergence {
        Some(d) if follows => format!(
            "start state and new segments' addresses from the recording; from allocation {} \
             (the first divergence) on, each diverging allocation takes its recorded place, so \
             footprint and fragmentation follow the recorded layout, not the model's",
            d.alloc_id
        ),
        _ => "start state and new segments' addresses from the recording; every placement the \
              model's, matching the recorded one"
            .to_owned(),
    };
    row.extra.insert("limit_applied".into(), json!(false));
    row.extra.insert("limit_note".into(), json!(limit_note));
    row.extra
        .insert("figures_follow_recording".into(), json!(follows));
    row.extra.insert("figures_note".into(), json!(figures_note));
    if limit_bytes.is_some() {
        row.notes.push(limit_note);
    }
    if follows {
        row.notes.push(figures_note);
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// One policy's line of the comparison, from the simulator's replay or from the checkpointed
/// TensorFlow replay.
pub struct Row {
    pub name: String,
    pub peak_footprint_bytes: u64,
    pub peak_footprint_event: Option<usize>,
    pub final_footprint_bytes: u64,
    pub peak_live_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub fragmentation_at_peak: f64,
    pub mean_fragmentation: f64,
    pub ooms: u64,
    pub events_per_second: f64,
    pub first_oom: Option<Value>,
    /// The first OOM in words, for the table.
    pub first_oom_text: Option<String>,
    /// Extra keys (`fidelity`, `replay`) and lines for the table.
    pub extra: Map<String, Value>,
    pub notes: Vec<String>,
}

impl Row {
    #[must_use]
    pub fn from_replay(name: &str, r: &Replay) -> Self {
        let s = &r.summary;
        let first_oom = r.ooms.first().map(|oom| {
            let c = &oom.counters_at_failure;
            let bfc = r.first_oom_state.as_ref().and_then(|st| {
                st.as_any()
                    .downcast_ref::<allocview_sim::policy::bfc::Bfc>()
            });
            json!(FirstOomAnswer {
                event: oom.event,
                t_ns: oom.t_ns,
                request_bytes: oom.request.size_bytes,
                live_bytes: c.live_bytes,
                in_use_chunks: c.live_allocs,
                in_use_bytes: c.allocated_bytes,
                free_chunks: c.free_blocks,
                free_bytes: c.free_bytes,
                largest_free_bytes: c.largest_free_bytes,
                footprint_bytes: c.footprint_bytes,
                error: oom.error.to_string(),
                bfc: bfc.map(|b| BfcAtOom {
                    rounded_bytes: allocview_sim::policy::bfc::rounded_bytes(
                        oom.request.size_bytes,
                    ),
                    regions: b.regions().len(),
                    region_bytes: b.total_region_allocated_bytes(),
                }),
            })
        });
        let first_oom_text = r.ooms.first().map(|oom| {
            let c = &oom.counters_at_failure;
            format!(
                "first OOM at event {} requesting {}: {} live in {} blocks, {} free in {} blocks \
                 (largest {}), footprint {}",
                format::count(oom.event as u64),
                format::bytes(oom.request.size_bytes),
                format::bytes(c.live_bytes),
                format::count(c.live_allocs),
                format::bytes(c.free_bytes),
                format::count(c.free_blocks),
                format::bytes(c.largest_free_bytes),
                format::bytes(c.footprint_bytes)
            )
        });
        Self {
            name: name.to_owned(),
            peak_footprint_bytes: s.peak_footprint_bytes,
            peak_footprint_event: s.peak_footprint_event,
            final_footprint_bytes: s.final_footprint_bytes,
            peak_live_bytes: s.peak_live_bytes,
            peak_allocated_bytes: s.peak_allocated_bytes,
            fragmentation_at_peak: s.fragmentation_at_peak,
            mean_fragmentation: s.mean_fragmentation,
            ooms: s.oom_count,
            events_per_second: s.events_per_second,
            first_oom,
            first_oom_text,
            extra: Map::new(),
            notes: Vec::new(),
        }
    }

    /// The peak footprint over `max_live` bytes (0 when nothing was live).
    #[must_use]
    pub fn footprint_over(&self, max_live: u64) -> f64 {
        ratio(self.peak_footprint_bytes, max_live)
    }

    /// The `compare --json` object of this policy.
    #[must_use]
    pub fn json(&self, max_live: u64) -> RowAnswer<'_> {
        RowAnswer {
            name: &self.name,
            peak_footprint_bytes: self.peak_footprint_bytes,
            peak_footprint_event: self.peak_footprint_event,
            final_footprint_bytes: self.final_footprint_bytes,
            peak_live_bytes: self.peak_live_bytes,
            peak_allocated_bytes: self.peak_allocated_bytes,
            fragmentation_at_peak: self.fragmentation_at_peak,
            mean_fragmentation: self.mean_fragmentation,
            footprint_over_max_live: ratio(self.peak_footprint_bytes, max_live),
            ooms: self.ooms,
            first_oom: self.first_oom.as_ref(),
            events_per_second: self.events_per_second,
            extra: &self.extra,
        }
    }
}

/// What `compare --json` prints for one policy: its figures, then the keys only some replays
/// have (`extra`, none of which repeats a figure's name).
#[derive(Serialize)]
pub struct RowAnswer<'a> {
    name: &'a str,
    peak_footprint_bytes: u64,
    peak_footprint_event: Option<usize>,
    final_footprint_bytes: u64,
    peak_live_bytes: u64,
    peak_allocated_bytes: u64,
    fragmentation_at_peak: f64,
    mean_fragmentation: f64,
    footprint_over_max_live: f64,
    ooms: u64,
    first_oom: Option<&'a Value>,
    events_per_second: f64,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

/// A simulated policy's first OOM: the request and its heap at the failure (for `bfc`, also
/// the rounded request and its regions).
#[derive(Serialize)]
struct FirstOomAnswer {
    event: usize,
    t_ns: i64,
    request_bytes: u64,
    live_bytes: u64,
    in_use_chunks: u64,
    in_use_bytes: u64,
    free_chunks: u64,
    free_bytes: u64,
    largest_free_bytes: u64,
    footprint_bytes: u64,
    error: String,
    #[serde(flatten)]
    bfc: Option<BfcAtOom>,
}

#[derive(Serialize)]
struct BfcAtOom {
    rounded_bytes: u64,
    regions: usize,
    region_bytes: u64,
}
