//! What a TensorFlow BFC dump and a PyTorch snapshot show beyond a trace's views, as the
//! explorers show them ([`crate::model::trace_data`]): a dump's chunks and bins, a
//! snapshot's segments, settings and phases.

use std::path::Path;

use allocview_loaders::Loaded;
use allocview_loaders::tf::dump::BfcDump;
use serde::Serialize;

use super::heap::{HEAP_COLS, HeapMoment};
use super::{Run, file_label};
use crate::model::trace_data::{DumpData, SnapshotData};

/// Segments listed (the largest first); the rest are counted.
const TOP_SEGMENTS: usize = 200;

/// A BFC bin: its size and what its chunks hold.
#[derive(Debug, Serialize)]
pub struct Bin {
    pub bin_size_bytes: u64,
    pub total_chunks: u64,
    pub chunks_in_use: u64,
    pub total_bytes: u64,
    pub bytes_in_use: u64,
    pub requested_bytes_in_use: u64,
    pub free_chunks: usize,
    pub largest_free_bytes: u64,
}

/// The page of a BFC dump (a heap at one moment, with no events): its figures and diagnosis,
/// its chunks as a heap map and its bins.
#[must_use]
pub fn dump_run(path: &Path, dump: &BfcDump) -> Run {
    let data = DumpData::of(dump);
    let mut heap = HeapMoment::of_blocks(&data.blocks, HEAP_COLS * 40);
    heap.policy = data.allocator.clone();
    heap.moment = "the dump".to_owned();
    for b in &data.blocks {
        heap.footprint_bytes += b.len_bytes;
        match b.state {
            allocview_sim::heap::BlockState::Used {
                requested_bytes, ..
            } => {
                heap.live_bytes += requested_bytes;
                heap.allocated_bytes += b.len_bytes;
            }
            allocview_sim::heap::BlockState::Free => {
                heap.free_bytes += b.len_bytes;
                heap.free_blocks += 1;
            }
            allocview_sim::heap::BlockState::Dead => {}
        }
    }
    heap.fragmentation = if heap.footprint_bytes == 0 {
        0.0
    } else {
        heap.free_bytes as f64 / heap.footprint_bytes as f64
    };
    let bins = data
        .bins
        .iter()
        .flatten()
        .filter(|b| b.total_chunks > 0 || !b.free_chunks.is_empty())
        .map(|b| Bin {
            bin_size_bytes: b.bin_size_bytes,
            total_chunks: b.total_chunks,
            chunks_in_use: b.chunks_in_use,
            total_bytes: b.total_bytes,
            bytes_in_use: b.bytes_in_use,
            requested_bytes_in_use: b.requested_bytes_in_use,
            free_chunks: b.free_chunks.len(),
            largest_free_bytes: b.free_chunks.iter().map(|&(_, s)| s).max().unwrap_or(0),
        })
        .collect();
    Run {
        file: file_label(path),
        format: "tf-bfc-dump".to_owned(),
        peak_live_bytes: heap.live_bytes,
        notes: data.lines,
        heaps: vec![heap],
        bins,
        ..Run::default()
    }
}

/// A PyTorch snapshot's settings, segments and phases, added to its run.
/// `t0_ns` is the first event's time, where the timeline starts.
pub fn snapshot_extras(loaded: &Loaded, t0_ns: i64, run: &mut Run) {
    let Loaded::PytorchSnapshot(s) = loaded else {
        return;
    };
    let data = SnapshotData::of(s);
    run.notes.extend(data.lines);
    run.phases = data
        .annotations
        .into_iter()
        .map(|(t_ns, stage, name)| ((t_ns - t0_ns) as f64 / 1e9, stage, name))
        .collect();
    let mut segments: Vec<[u64; 3]> = s
        .raw_segments
        .iter()
        .map(|g| [g.total_bytes, g.allocated_bytes, g.requested_bytes])
        .collect();
    segments.sort_by(|a, b| b.cmp(a));
    run.segments_left_out = segments.len().saturating_sub(TOP_SEGMENTS);
    segments.truncate(TOP_SEGMENTS);
    run.segments = segments;
}
