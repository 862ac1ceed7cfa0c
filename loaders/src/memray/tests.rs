//! Hand-made captures, each byte written here from memray's encoding, for the rules the real
//! captures exercise without showing them one by one: a `munmap` of part of a mapping, an
//! address handed out again while live, the line tables.

use std::path::Path;

use super::linetable::line_of;
use super::load_memray;
use crate::analysis::stats::{TraceStats, events_per_thread};
use crate::events::{LoadOptions, MallocTrace};

const MALLOC: u8 = 6;
const MMAP: u8 = 14;
const MUNMAP: u8 = 15;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn signed(out: &mut Vec<u8>, v: i64) {
    varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// A format-13 capture of CPython 3.11 (no native frames) whose records follow.
struct Capture {
    bytes: Vec<u8>,
    last_units: u64,
}

impl Capture {
    fn new() -> Self {
        let mut b = b"memray\0".to_vec();
        b.extend_from_slice(&13i32.to_le_bytes());
        b.extend_from_slice(&0x030B_00F0i32.to_le_bytes());
        b.extend_from_slice(&[0, 0]); // no native frames, every allocation
        b.extend_from_slice(&[0; 32]); // stats
        b.extend_from_slice(b"prog\0");
        b.extend_from_slice(&7i32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&[1, 0, 0]);
        b.extend_from_slice(&[0, 0, 0]); // libdest, site-packages, sys.path: empty
        // Thread 1.
        b.push(12);
        b.extend_from_slice(&1u64.to_le_bytes());
        Self {
            bytes: b,
            last_units: 0,
        }
    }

    /// An allocation record with a cache miss (the address written), `size` unless a free.
    fn call(mut self, allocator: u8, addr: u64, size: Option<u64>) -> Self {
        let short = if allocator < 8 { allocator } else { 0 };
        self.bytes.push(0x80 | (15 << 3) | short);
        let units = addr >> 3;
        signed(&mut self.bytes, units.wrapping_sub(self.last_units) as i64);
        self.last_units = units;
        if short == 0 {
            self.bytes.push(allocator);
        }
        if let Some(size) = size {
            varint(&mut self.bytes, size);
        }
        self
    }

    fn load(mut self) -> (MallocTrace, TraceStats) {
        self.bytes.push(1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crafted.bin");
        std::fs::write(&path, &self.bytes).unwrap();
        let trace = load_memray(&path, &LoadOptions::default()).unwrap();
        let stats = stats(&trace, &path);
        (trace, stats)
    }
}

fn stats(trace: &MallocTrace, path: &Path) -> TraceStats {
    let view = crate::trace_view(&trace.events, path).unwrap();
    let per_thread = events_per_thread(&trace.events, trace.threads.height()).unwrap();
    TraceStats::compute(&view, per_thread, &trace.summary)
}

#[test]
fn a_munmap_of_part_of_a_mapping_leaves_the_rest_live() {
    // 16 KiB mapped, its second 4 KiB unmapped: 12 KiB stay, in two pieces.
    let (trace, s) = Capture::new()
        .call(MMAP, 0x10000, Some(0x4000))
        .call(MUNMAP, 0x11000, Some(0x1000))
        .load();
    assert_eq!(s.peak_live_bytes, 0x4000);
    assert_eq!(s.final_live_bytes, 0x3000);
    assert_eq!(s.final_live_blocks, 2);
    assert_eq!(trace.summary.frees_unknown, 0);
}

#[test]
fn a_munmap_over_two_mappings_ends_both() {
    let (_, s) = Capture::new()
        .call(MMAP, 0x10000, Some(0x1000))
        .call(MMAP, 0x11000, Some(0x1000))
        .call(MUNMAP, 0x10000, Some(0x2000))
        .load();
    assert_eq!(s.peak_live_bytes, 0x2000);
    assert_eq!(s.final_live_bytes, 0);
}

#[test]
fn an_address_handed_out_again_while_live_stays_counted_as_memray_counts_it() {
    // memray adds both sizes and never subtracts the first: its peak is 150.
    let (trace, s) = Capture::new()
        .call(MALLOC, 0x1000, Some(100))
        .call(MALLOC, 0x1000, Some(50))
        .call(5, 0x1000, None)
        .load();
    assert_eq!(s.peak_live_bytes, 150);
    assert_eq!(s.final_live_bytes, 100);
    assert_eq!(trace.summary.mallocs_of_live_ptr, 0);
    assert!(
        trace
            .summary
            .notes
            .iter()
            .any(|n| n.contains("still held live (a free it did not see): 1;"))
    );
}

#[test]
fn line_tables_of_each_python_version() {
    // 3.11: "no columns" entries (code 13): 1 unit at line +1, then 2 units at line +2 more.
    let table_311 = [0x80 | (13 << 3), 0x02, 0x80 | (13 << 3) | 1, 0x04];
    assert_eq!(line_of(0x030B_0000, &table_311, 0, 10), Some(11));
    assert_eq!(line_of(0x030B_0000, &table_311, 2, 10), Some(13));
    assert_eq!(line_of(0x030B_0000, &table_311, 4, 10), Some(13));
    assert_eq!(line_of(0x030B_0000, &table_311, 6, 10), None);
    // 3.10: (bytes, line delta) pairs, -128 for no line; offsets in 2-byte units.
    let table_310 = [4, 1, 6, 0x80, 2, 2];
    assert_eq!(line_of(0x030A_0000, &table_310, 3, 10), 11.into());
    assert_eq!(line_of(0x030A_0000, &table_310, 6, 10), 13.into());
    // 3.9: co_lnotab, offsets in bytes.
    let lnotab = [4, 1, 6, 2];
    assert_eq!(line_of(0x0309_0000, &lnotab, 3, 10), Some(10));
    assert_eq!(line_of(0x0309_0000, &lnotab, 4, 10), Some(11));
    assert_eq!(line_of(0x0309_0000, &lnotab, 10, 10), Some(13));
    // No table: the first line.
    assert_eq!(line_of(0x030C_0000, &[], 40, 10), Some(10));
}
