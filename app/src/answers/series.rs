//! Every replayed policy's series as one table, a row per policy and time bucket: `report`'s
//! `timeline.csv`, `compare --parquet`'s file and the Python package's `compare` series.

use allocview_sim::series::Series;
use anyhow::Result;
use polars::prelude::*;

/// Every policy's series, one row per policy and time bucket (what `compare --parquet` writes
/// too): bytes as the bucket's maximum (peaks survive), fractions as the value after the
/// bucket's last event. The charts draw the same values. A real-allocator row's series is its
/// measured resident memory ([`crate::real::RealRun::series`]).
pub fn timeline_frame(done: &[(&str, &Series)]) -> Result<DataFrame> {
    let mut policy = Vec::new();
    let mut t_s = Vec::new();
    let mut live = Vec::new();
    let mut allocated = Vec::new();
    let mut footprint = Vec::new();
    let mut frag = Vec::new();
    let mut ext = Vec::new();
    for (name, s) in done {
        let t0 = s.bucketing.t0_ns;
        for b in 0..s.len() {
            policy.push(*name);
            t_s.push((s.bucketing.start_ns(b) - t0) as f64 / 1e9);
            let g = |v: &Vec<u64>| v.get(b).copied().unwrap_or(0);
            let f = |v: &Vec<f64>| v.get(b).copied().unwrap_or(0.0);
            live.push(g(&s.live_bytes.max));
            allocated.push(g(&s.allocated_bytes.max));
            footprint.push(g(&s.footprint_bytes.max));
            frag.push(f(&s.fragmentation.last));
            ext.push(f(&s.external_fragmentation.last));
        }
    }
    let n = policy.len();
    Ok(DataFrame::new(
        n,
        vec![
            Column::new("policy".into(), policy),
            Column::new("t_s".into(), t_s),
            Column::new("live_bytes".into(), live),
            Column::new("allocated_bytes".into(), allocated),
            Column::new("footprint_bytes".into(), footprint),
            Column::new("fragmentation".into(), frag),
            Column::new("external_fragmentation".into(), ext),
        ],
    )?)
}
