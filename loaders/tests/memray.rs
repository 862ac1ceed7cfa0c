//! memray captures: real format-12 files (memray 1.18/1.19) from two projects, and captures of
//! `sample-traces/memray/prog.py` made here with memray 1.19.3 (format 12) and 1.20.0 (format
//! 13). Every expected figure is memray's own, not ours: `memray stats --json` (its
//! `metadata.peak_memory`, `total_num_allocations`, `total_bytes_allocated`,
//! `top_allocations_by_size`) and `memray.FileReader(path).get_allocation_records()` (thread
//! ids, records by allocator, `get_memory_snapshots()`' count and largest `rss`), run with the
//! memray release that wrote the file:
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
use allocview_loaders::{InputKind, LoadOptions, MallocTrace, Strictness, detect, trace_view};

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
    /// `FileReader.get_memory_snapshots()`: how many, and the largest `rss`.
    rss_samples: (usize, u64),
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
    let rss_max = trace.memory.iter().map(|m| m.resident_bytes).max();
    assert_eq!(
        (trace.memory.len(), rss_max),
        (want.rss_samples.0, Some(want.rss_samples.1)),
        "{name}: RSS samples"
    );
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
            rss_samples: (269, 175_345_664),
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
            rss_samples: (1053, 55_267_328),
        },
    );
}

const PROG: &str = "prog.py";

#[test]
fn format_12_threads_match_memray_1_19() {
    for (name, rss_samples) in [
        ("threads12.bin", (2, 51_417_088)),
        ("threads12_native.bin", (4, 48_185_344)),
    ] {
        check(
            name,
            &Memray {
                peak_bytes: 6_307_295,
                allocations: 1309,
                allocated_bytes: 6_645_243,
                threads: 4,
                top_site: ("main", PROG, 20, 5_000_001),
                rss_samples,
            },
        );
    }
}

#[test]
fn format_13_threads_match_memray_1_20() {
    for (name, rss_samples) in [
        ("threads13.bin", (2, 44_736_512)),
        ("threads13_native.bin", (3, 48_672_768)),
    ] {
        check(
            name,
            &Memray {
                peak_bytes: 6_307_390,
                allocations: 1306,
                allocated_bytes: 6_645_148,
                threads: 4,
                top_site: ("make_table", PROG, 6, 1_304_510),
                rss_samples,
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
            rss_samples: (4, 45_273_088),
        },
    );
}

#[test]
fn real_captures_end_with_the_trailer_and_load_clean() {
    for name in [
        "pathology_manifest_builder_linux.memray.bin",
        "threads12_native.bin",
        "threads13.bin",
    ] {
        let (_, trace) = load(name);
        assert_eq!(trace.summary.truncated, None, "{name}");
        assert_eq!(trace.summary.bad_lines, 0, "{name}");
    }
}

// Bad input: damaged copies of `threads13.bin`'s decompressed stream, written as a
// `--no-compress` capture holds it.

#[path = "scratch/mod.rs"]
mod scratch;

fn raw_stream(name: &str) -> Vec<u8> {
    use std::io::Read as _;
    let file = std::fs::File::open(sample(name)).unwrap();
    let mut out = Vec::new();
    lz4_flex::frame::FrameDecoder::new(file)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// The length of a format-13 header: fixed fields, the command line, more fixed fields, then
/// libdest and two lists of strings, each ended by an empty one.
fn header_len_13(raw: &[u8]) -> usize {
    let nul_after = |at: usize| at + raw[at..].iter().position(|&b| b == 0).unwrap() + 1;
    let mut at = nul_after(49) + 23;
    at = nul_after(at);
    for _ in 0..2 {
        loop {
            let next = nul_after(at);
            let empty = next == at + 1;
            at = next;
            if empty {
                break;
            }
        }
    }
    at
}

fn options(strictness: Strictness) -> LoadOptions {
    LoadOptions {
        strictness,
        ..LoadOptions::default()
    }
}

fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn an_uncompressed_capture_reads_like_a_compressed_one() {
    // memray 1.20.0: `memray run -q --no-compress -o tiny13raw.bin tiny.py`; `memray stats
    // --json`: peak_memory 369846, total_num_allocations 164; FileReader: 2 thread ids.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/memray/tiny13raw.bin");
    assert_eq!(detect(&path).unwrap(), InputKind::Memray);
    let trace = load_memray(&path, &LoadOptions::default()).unwrap();
    let view = trace_view(&trace.events, &path).unwrap();
    let per_thread = events_per_thread(&trace.events, trace.threads.height()).unwrap();
    let stats = TraceStats::compute(&view, per_thread, &trace.summary);
    assert_eq!(stats.peak_live_bytes, 369_846);
    assert_eq!(trace.summary.mallocs, 164);
    assert_eq!(trace.threads.height(), 2);
}

#[test]
fn a_truncated_stream_is_an_error_naming_file_and_offset_and_lenient_keeps_the_head() {
    let dir = scratch::scratch_dir("memray-cut");
    let raw = raw_stream("threads13.bin");
    let cut = write(&dir, "cut.bin", &raw[..raw.len() / 3]);
    let e = load_memray(&cut, &options(Strictness::Strict))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cut.bin"), "{e}");
    assert!(e.contains("of the decompressed stream"), "{e}");
    let t = load_memray(&cut, &options(Strictness::Lenient)).unwrap();
    assert!(t.summary.truncated.is_some());
    let (_, whole) = load("threads13.bin");
    assert!(t.summary.mallocs > 0 && t.summary.mallocs < whole.summary.mallocs);
}

#[test]
fn a_truncated_lz4_file_is_an_error_naming_file_and_offset() {
    let dir = scratch::scratch_dir("memray-lz4");
    // Many LZ4 blocks: the cut falls after the header's.
    let bytes = std::fs::read(sample("async_analysis_linux.memray.bin")).unwrap();
    let cut = write(&dir, "cut.bin", &bytes[..bytes.len() / 2]);
    assert_eq!(detect(&cut).unwrap(), InputKind::Memray);
    let e = load_memray(&cut, &options(Strictness::Strict))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cut.bin") && e.contains("byte"), "{e}");
    let t = load_memray(&cut, &options(Strictness::Lenient)).unwrap();
    assert!(t.summary.truncated.as_ref().unwrap().contains("LZ4"));
    assert!(t.summary.mallocs > 0 && t.summary.mallocs < 161_580);
    // Cut inside the first block, the header itself is lost: refused in either mode, naming
    // the byte of the file where decoding stopped.
    let bytes = std::fs::read(sample("threads13.bin")).unwrap();
    let head = write(&dir, "head.bin", &bytes[..bytes.len() / 2]);
    let e = load_memray(&head, &options(Strictness::Lenient))
        .unwrap_err()
        .to_string();
    assert!(e.contains("head.bin") && e.contains("of the file"), "{e}");
}

#[test]
fn an_unknown_record_type_names_its_offset() {
    let dir = scratch::scratch_dir("memray-type");
    let mut raw = raw_stream("threads13.bin");
    let at = header_len_13(&raw);
    raw.insert(at, 0x03);
    let path = write(&dir, "bad.bin", &raw);
    let e = load_memray(&path, &options(Strictness::Strict))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.bin"), "{e}");
    assert!(
        e.contains(&format!(
            "unknown type 3 at byte {at} of the decompressed stream"
        )),
        "{e}"
    );
    let t = load_memray(&path, &options(Strictness::Lenient)).unwrap();
    assert!(
        t.summary
            .truncated
            .as_ref()
            .unwrap()
            .contains("unknown type 3")
    );
    assert_eq!(t.summary.events, 0);
}

#[test]
fn lenient_skips_and_counts_a_record_out_of_place_and_reads_the_rest() {
    let dir = scratch::scratch_dir("memray-pop");
    let mut raw = raw_stream("threads13.bin");
    let at = header_len_13(&raw);
    // A frame pop before any thread is named.
    raw.insert(at, 0x10);
    let path = write(&dir, "pop.bin", &raw);
    let e = load_memray(&path, &options(Strictness::Strict))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pop.bin") && e.contains(&format!("at byte {at}")),
        "{e}"
    );
    let t = load_memray(&path, &options(Strictness::Lenient)).unwrap();
    assert_eq!(t.summary.bad_lines, 1);
    assert_eq!(t.summary.first_bad_lines.len(), 1);
    assert_eq!(t.summary.truncated, None);
    // The rest reads as memray reads the undamaged file (its peak and count).
    let view = trace_view(&t.events, &path).unwrap();
    let per_thread = events_per_thread(&t.events, t.threads.height()).unwrap();
    let stats = TraceStats::compute(&view, per_thread, &t.summary);
    assert_eq!(stats.peak_live_bytes, 6_307_390);
    assert_eq!(t.summary.mallocs, 1306);
}

#[test]
fn other_versions_and_aggregated_captures_are_refused_by_name() {
    let dir = scratch::scratch_dir("memray-version");
    let mut raw = raw_stream("threads13.bin");
    raw[7] = 14;
    let path = write(&dir, "v14.bin", &raw);
    assert_eq!(detect(&path).unwrap(), InputKind::Memray);
    let e = load_memray(&path, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("v14.bin") && e.contains("format version 14"),
        "{e}"
    );
    assert!(
        e.contains("12 (memray 1.18 and 1.19) and 13 (memray 1.20)"),
        "{e}"
    );
    // memray 1.20.0: `memray run -q --aggregate -o tiny13agg.bin tiny.py`.
    let agg = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/memray/tiny13agg.bin");
    let e = load_memray(&agg, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tiny13agg.bin") && e.contains("aggregated"),
        "{e}"
    );
}
