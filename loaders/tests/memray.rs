//! memray captures: real format-12 files (memray 1.18/1.19) from two projects, and captures of
//! `sample-traces/memray/prog.py` made here with memray 1.19.3 (format 12) and 1.20.0 (format
//! 13). Every expected figure is memray's own, not ours: `memray stats --json` (its
//! `metadata.peak_memory`, `total_num_allocations`, `total_bytes_allocated`,
//! `top_allocations_by_size`) and `memray.FileReader(path).get_allocation_records()` (thread
//! ids, records by allocator), run with the memray release that wrote the file:
//!
//! ```text
//! python -m memray run -q -o threads13.bin prog.py                            # 1.20.0
//! python -m memray run -q --native -o threads13_native.bin prog.py            # 1.20.0
//! python -m memray run -q --trace-python-allocators -o pyalloc13.bin prog.py  # 1.20.0
//! python -m memray run -q -o threads12.bin prog.py                            # 1.19.3
//! python -m memray run -q --native -o threads12_native.bin prog.py            # 1.19.3
//! python -m memray stats --json -o FILE.json FILE.bin
//! ```
//!
//! memray's peak (`metadata.peak_memory`, "Peak memory usage" of `memray stats`) is the
//! highest sum of live bytes after any allocation record: every allocation adds its size,
//! a free subtracts the size of the live allocation at its address, a `munmap` the bytes of
//! the mapped ranges it overlaps. allocview's `peak_live_bytes` is the same running sum over
//! the same records, paired by address.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

use allocview_loaders::analysis::stats::{TraceStats, events_per_thread};
use allocview_loaders::memray::load_memray;
use allocview_loaders::{InputKind, LoadOptions, MallocTrace, detect, trace_view};

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces/memray")
        .join(name)
}

fn load(name: &str) -> (TraceStats, MallocTrace) {
    let path = sample(name);
    assert_eq!(detect(&path).unwrap(), InputKind::Memray, "{name}");
    let trace = load_memray(&path, &LoadOptions::default()).unwrap();
    let view = trace_view(&trace.events, &path).unwrap();
    let per_thread = events_per_thread(&trace.events, trace.threads.height()).unwrap();
    let stats = TraceStats::compute(&view, per_thread, &trace.summary);
    (stats, trace)
}

/// memray's figures for one file.
struct Memray {
    peak_bytes: u64,
    allocations: u64,
    allocated_bytes: u64,
    threads: usize,
    /// `function:file:line` of memray's largest allocating location, and its bytes.
    top_site: (&'static str, &'static str, i64, u64),
}

fn check(name: &str, want: &Memray) {
    let (stats, trace) = load(name);
    assert_eq!(stats.peak_live_bytes, want.peak_bytes, "{name}: peak");
    assert_eq!(
        trace.summary.mallocs, want.allocations,
        "{name}: allocations"
    );
    assert_eq!(
        stats.malloc_bytes_total, want.allocated_bytes,
        "{name}: bytes"
    );
    assert_eq!(trace.threads.height(), want.threads, "{name}: threads");
    // The bytes allocated at the top site, by the innermost Python frame of each stack, as
    // memray attributes a location.
    let stacks = trace.stacks.as_ref().unwrap();
    let ids = trace.events["stack_id"].u32().unwrap();
    let sizes = trace.events["size_bytes"].u64().unwrap();
    let kinds = trace.events["kind"].u8().unwrap();
    let (function, file, line, bytes) = want.top_site;
    let mut at_site = 0u64;
    for ((id, size), kind) in ids.iter().zip(sizes.iter()).zip(kinds.iter()) {
        let (Some(id), Some(size), Some(0)) = (id, size, kind) else {
            continue;
        };
        let top = stacks.frames_of(id).find(|f| f.is_python());
        if top.is_some_and(|f| f.function == function && f.file == file && f.line == line) {
            at_site += size;
        }
    }
    assert_eq!(at_site, bytes, "{name}: bytes at {function}:{file}:{line}");
}

#[test]
fn format_12_pathology_manifest_builder_matches_memray() {
    check(
        "pathology_manifest_builder_linux.memray.bin",
        &Memray {
            peak_bytes: 101_872_638,
            allocations: 1_015_213,
            allocated_bytes: 545_700_984,
            threads: 1,
            top_site: (
                "_mean",
                "/root/miniconda3/lib/python3.12/site-packages/numpy/_core/_methods.py",
                135,
                322_126_848,
            ),
        },
    );
}

#[test]
fn format_12_async_analysis_matches_memray() {
    check(
        "async_analysis_linux.memray.bin",
        &Memray {
            peak_bytes: 7_112_051,
            allocations: 161_580,
            allocated_bytes: 33_450_787,
            threads: 5,
            top_site: ("read", "/usr/lib/python3.12/ssl.py", 859, 7_027_493),
        },
    );
}

const PROG: &str = "prog.py";

#[test]
fn format_12_threads_match_memray_1_19() {
    for name in ["threads12.bin", "threads12_native.bin"] {
        check(
            name,
            &Memray {
                peak_bytes: 6_307_295,
                allocations: 1309,
                allocated_bytes: 6_645_243,
                threads: 4,
                top_site: ("main", PROG, 20, 5_000_001),
            },
        );
    }
}

#[test]
fn format_13_threads_match_memray_1_20() {
    for name in ["threads13.bin", "threads13_native.bin"] {
        check(
            name,
            &Memray {
                peak_bytes: 6_307_390,
                allocations: 1306,
                allocated_bytes: 6_645_148,
                threads: 4,
                top_site: ("make_table", PROG, 6, 1_304_510),
            },
        );
    }
}

#[test]
fn format_13_python_allocators_match_memray_1_20() {
    let (_, trace) = load("pyalloc13.bin");
    // memray.FileReader: 1377 + 374 + 6235 + 7469 records through pymalloc.
    assert_eq!(trace.summary.python_allocator_events, 15_455);
    check(
        "pyalloc13.bin",
        &Memray {
            peak_bytes: 6_439_236,
            allocations: 7990,
            allocated_bytes: 7_117_940,
            threads: 4,
            top_site: ("main", PROG, 20, 5_000_057),
        },
    );
}
