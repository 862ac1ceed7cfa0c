//! The malloc-trace loader on real traces: reference statistics, semantics, bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

use allocview_loaders::analysis::stats::TraceStats;
use allocview_loaders::{LoadError, LoadOptions, Strictness, malloc_trace::load_malloc_trace};
use allocview_sim::trace::EventKind;
use polars::prelude::*;
use serde_json::Value;

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces")
        .join(name)
}

fn shared(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/traces")
        .join(name);
    p.exists().then_some(p)
}

fn stats_of(path: &Path) -> (TraceStats, allocview_loaders::MallocTrace) {
    let trace = load_malloc_trace(path, &LoadOptions::default()).unwrap();
    let view = allocview_loaders::trace_view(&trace.events, path).unwrap();
    let per_thread = allocview_loaders::analysis::stats::events_per_thread(
        &trace.events,
        trace.threads.height(),
    )
    .unwrap();
    let stats = TraceStats::compute(&view, per_thread, &trace.summary);
    (stats, trace)
}

/// Every key of the reference file must match: integers exactly, floats to the reference's
/// printed precision.
fn check_against_reference(trace_path: &Path, reference: &Path) {
    let (s, _) = stats_of(trace_path);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(reference).unwrap()).unwrap();
    let int = |k: &str| {
        r[k].as_u64()
            .unwrap_or_else(|| panic!("reference lacks {k}"))
    };
    assert_eq!(s.events, int("events"), "events");
    assert_eq!(s.mallocs, int("mallocs"), "mallocs");
    assert_eq!(s.frees, int("frees"), "frees");
    assert_eq!(s.frees_null, int("frees_null"), "frees_null");
    assert_eq!(s.frees_unknown, int("frees_unknown"), "frees_unknown");
    assert_eq!(s.mallocs_failed, int("mallocs_failed"));
    assert_eq!(s.mallocs_of_live_ptr, int("mallocs_of_live_ptr"));
    assert_eq!(s.mallocs_size_zero, int("mallocs_size_zero"));
    assert_eq!(s.bad_lines, int("bad_lines"));
    assert_eq!(s.threads, int("threads"), "threads");
    let per_thread: Vec<u64> = r["events_per_thread"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(s.events_per_thread, per_thread);
    assert_eq!(s.timestamps_non_monotonic, int("timestamps_non_monotonic"));
    assert_eq!(s.malloc_bytes_total, int("malloc_bytes_total"));
    assert_eq!(s.malloc_size_min, int("malloc_size_min"));
    assert_eq!(s.malloc_size_max, int("malloc_size_max"));
    assert!((s.malloc_size_mean - r["malloc_size_mean"].as_f64().unwrap()).abs() < 1e-3);
    assert!((s.duration_s - r["duration_s"].as_f64().unwrap()).abs() < 1e-6);
    assert_eq!(s.peak_live_bytes, int("peak_live_bytes"), "peak_live_bytes");
    assert_eq!(s.peak_live_event, int("peak_live_event"), "peak_live_event");
    assert!((s.peak_live_time_s - r["peak_live_time_s"].as_f64().unwrap()).abs() < 1e-6);
    assert_eq!(
        s.peak_live_blocks_at_peak_bytes,
        int("peak_live_blocks_at_peak_bytes")
    );
    assert_eq!(s.max_live_blocks, int("max_live_blocks"));
    assert_eq!(
        s.final_live_bytes,
        int("final_live_bytes"),
        "final_live_bytes"
    );
    assert_eq!(
        s.final_live_blocks,
        int("final_live_blocks"),
        "final_live_blocks"
    );
    for (key, ours) in [
        ("size_classes", &s.size_classes),
        ("bytes_by_class", &s.bytes_by_class),
    ] {
        let theirs = r[key].as_object().unwrap();
        assert_eq!(theirs.len(), ours.len(), "{key}: number of classes");
        for (class, v) in theirs {
            let c: u8 = class.parse().unwrap();
            assert_eq!(ours.get(&c).copied(), v.as_u64(), "{key}[{class}]");
        }
    }
}

#[test]
fn find_usr_include_matches_reference() {
    check_against_reference(
        &sample("find_usr_include.trace.gz"),
        &sample("find_usr_include.stats.json"),
    );
}

#[test]
fn xz_multithreaded_matches_reference() {
    check_against_reference(
        &sample("xz_T2_8KiB_blocks.trace.gz"),
        &sample("xz_T2_8KiB_blocks.stats.json"),
    );
}

#[test]
fn large_shared_traces_match_reference() {
    for name in ["git_log_p_gitui", "python311_json_re_sqlite"] {
        let (Some(trace), Some(reference)) = (
            shared(&format!("{name}.trace.gz")),
            shared(&format!("{name}.stats.json")),
        ) else {
            assert!(
                std::env::var_os("ALLOCVIEW_REQUIRE_TEST_INPUTS").is_none(),
                "a required test input is missing: ../shared/data/traces/{name}"
            );
            eprintln!("skipping {name}: ../shared/data/traces is not present");
            continue;
        };
        check_against_reference(&trace, &reference);
    }
}

fn column_u8(df: &DataFrame, name: &str) -> Vec<u8> {
    df.column(name)
        .unwrap()
        .u8()
        .unwrap()
        .into_no_null_iter()
        .collect()
}

fn column_u64(df: &DataFrame, name: &str) -> Vec<u64> {
    df.column(name)
        .unwrap()
        .u64()
        .unwrap()
        .into_no_null_iter()
        .collect()
}

fn column_ids(df: &DataFrame) -> Vec<Option<u32>> {
    df.column("alloc_id")
        .unwrap()
        .u32()
        .unwrap()
        .iter()
        .collect()
}

#[test]
fn schema_is_documented_one() {
    let (_, t) = stats_of(&sample("xz_T2_8KiB_blocks.trace.gz"));
    let schema = t.events.schema();
    let expected = [
        ("t_ns", DataType::Int64),
        ("thread", DataType::UInt8),
        ("kind", DataType::UInt8),
        ("size_bytes", DataType::UInt64),
        ("address", DataType::UInt64),
        ("alloc_id", DataType::UInt32),
        ("size_class", DataType::UInt8),
    ];
    assert_eq!(schema.len(), expected.len());
    for (name, dtype) in expected {
        assert_eq!(schema.get(name), Some(&dtype), "column {name}");
    }
    for col in t.events.columns() {
        assert_eq!(col.as_materialized_series().n_chunks(), 1, "{}", col.name());
    }
    // The threads table maps indices to the file's thread ids, in first-appearance order.
    let tids = column_u64(&t.threads, "tid");
    assert_eq!(tids.first(), Some(&139_717_592_927_104));
    assert_eq!(tids.len(), 3);
}

#[test]
fn free_null_is_kept_with_no_allocation() {
    let (_, t) = stats_of(&sample("xz_T2_8KiB_blocks.trace.gz"));
    let kind = column_u8(&t.events, "kind");
    let ids = column_ids(&t.events);
    let addr = column_u64(&t.events, "address");
    // Line 11 of the file is `0.000033 ... -1 (nil)`.
    assert_eq!(kind[10], EventKind::FreeNull.code());
    assert_eq!(ids[10], None);
    assert_eq!(addr[10], 0);
    let nulls = kind
        .iter()
        .filter(|&&k| k == EventKind::FreeNull.code())
        .count();
    assert_eq!(nulls, 14);
}

#[test]
fn address_reuse_starts_a_new_allocation() {
    let (_, t) = stats_of(&sample("xz_T2_8KiB_blocks.trace.gz"));
    let kind = column_u8(&t.events, "kind");
    let ids = column_ids(&t.events);
    let addr = column_u64(&t.events, "address");
    let size = column_u64(&t.events, "size_bytes");
    // Lines 1-2: malloc(5) = 0x558667a602a0, free; line 12: malloc(5) at the same address.
    assert_eq!(addr[0], 0x5586_67a6_02a0);
    assert_eq!(addr[11], addr[0]);
    assert_eq!((kind[0], ids[0]), (EventKind::Alloc.code(), Some(0)));
    assert_eq!((kind[1], ids[1]), (EventKind::Free.code(), Some(0)));
    assert_eq!(size[1], 5, "a free carries the size it frees");
    assert_eq!(kind[11], EventKind::Alloc.code());
    let reused = ids[11].unwrap();
    assert_ne!(reused, 0);
    // Ids are dense in allocation order.
    let allocs_before = kind[..11]
        .iter()
        .filter(|&&k| k == EventKind::Alloc.code())
        .count();
    assert_eq!(reused as usize, allocs_before);
}

#[test]
fn live_at_end_and_threads_interleaved() {
    let (s, t) = stats_of(&sample("xz_T2_8KiB_blocks.trace.gz"));
    let view = allocview_loaders::trace_view(&t.events, Path::new("x")).unwrap();
    // Allocations never freed: ids that no free carries.
    let mut freed = vec![false; view.num_allocs as usize];
    for (&k, &id) in view.kind.iter().zip(view.alloc_id) {
        if k == EventKind::Free.code() {
            freed[id as usize] = true;
        }
    }
    assert_eq!(
        freed.iter().filter(|f| !**f).count() as u64,
        s.final_live_blocks
    );
    assert_eq!(s.final_live_blocks, 186);
    // Threads interleave: thread changes more often than there are threads.
    let thread = column_u8(&t.events, "thread");
    let switches = thread.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(switches > 3, "threads switch {switches} times");
    assert_eq!(s.events_per_thread, vec![10_080, 9, 9]);
}

mod scratch;

fn write_temp(name: &str, content: &[u8]) -> scratch::Scratch {
    let p = scratch::scratch("allocview-test-", name);
    std::fs::write(&p, content).unwrap();
    p
}

fn gunzip(path: &Path) -> Vec<u8> {
    use std::io::Read as _;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// The original libtracemalloc does not trace calloc/realloc, so their blocks' frees name
/// pointers it never saw. Reproduce that on a real trace by dropping some allocation lines.
#[test]
fn frees_of_unknown_pointers_are_counted_and_kept() {
    let text = String::from_utf8(gunzip(&sample("find_usr_include.trace.gz"))).unwrap();
    let mut dropped_ptrs = std::collections::HashSet::new();
    let mut kept = String::new();
    for (i, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split('\t').collect();
        if f[2] != "-1" && i % 97 == 0 {
            dropped_ptrs.insert(f[3].to_owned());
            continue;
        }
        kept.push_str(line);
        kept.push('\n');
    }
    // Count the frees that now have no matching allocation, independently of the loader.
    let mut live = std::collections::HashSet::new();
    let mut expected_unknown = 0;
    for line in kept.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f[2] == "-1" {
            if f[3] != "(nil)" && !live.remove(f[3]) {
                expected_unknown += 1;
            }
        } else {
            live.insert(f[3].to_owned());
        }
    }
    assert!(expected_unknown > 50);
    let path = write_temp("unknown_frees.trace", kept.as_bytes());
    let (s, t) = stats_of(&path);
    assert_eq!(s.frees_unknown, expected_unknown);
    assert_eq!(s.events, kept.lines().count() as u64, "nothing dropped");
    let kind = column_u8(&t.events, "kind");
    assert_eq!(
        kind.iter()
            .filter(|&&k| k == EventKind::FreeUnknown.code())
            .count() as u64,
        expected_unknown
    );
    assert!(
        t.summary
            .warnings()
            .iter()
            .any(|w| w.contains("never allocated"))
    );
}

#[test]
fn plain_text_is_detected_by_content_not_name() {
    let text = gunzip(&sample("xz_T2_8KiB_blocks.trace.gz"));
    let plain = write_temp("looks_compressed.gz", &text);
    let (s, t) = stats_of(&plain);
    assert_eq!(s.events, 10_098);
    assert_eq!(
        t.summary.compression,
        Some(allocview_loaders::input::Compression::Plain)
    );
    let gz = write_temp(
        "no_extension",
        &std::fs::read(sample("xz_T2_8KiB_blocks.trace.gz")).unwrap(),
    );
    let (s2, _) = stats_of(&gz);
    assert_eq!(s, s2);
}

#[test]
fn malformed_line_names_file_line_column_and_expectation() {
    let mut text = gunzip(&sample("find_usr_include.trace.gz"));
    let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if i == 41 {
            out.extend_from_slice(b"0.000100\t140642980739072\tabc\t0x1000\n");
        }
        out.extend_from_slice(l);
        if i + 1 < lines.len() {
            out.push(b'\n');
        }
    }
    text = out;
    let path = write_temp("bad.trace", &text);
    let err = load_malloc_trace(&path, &LoadOptions::default()).unwrap_err();
    let msg = err.to_string();
    match &err {
        LoadError::Parse { detail, path: p } => {
            assert_eq!(detail.line, 42);
            assert_eq!(detail.column, 26);
            assert_eq!(detail.field, "size");
            assert_eq!(detail.found, "abc");
            assert_eq!(p, &*path);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(msg.contains("line 42"), "{msg}");
    assert!(msg.contains("column 26"), "{msg}");
    assert!(msg.contains("size in bytes"), "{msg}");
    assert!(msg.contains("bad.trace"), "{msg}");

    // Lenient: skipped, counted, reported, and everything else loaded.
    let lenient = LoadOptions {
        strictness: Strictness::Lenient,
        ..LoadOptions::default()
    };
    let t = load_malloc_trace(&path, &lenient).unwrap();
    assert_eq!(t.summary.bad_lines, 1);
    assert_eq!(t.summary.first_bad_lines.len(), 1);
    assert_eq!(t.summary.first_bad_lines[0].line, 42);
    assert_eq!(t.events.height(), 40_403);
    assert!(
        t.summary
            .warnings()
            .iter()
            .any(|w| w.contains("skipped 1 malformed"))
    );
}

#[test]
fn lenient_reports_only_the_first_few_but_counts_all() {
    let mut text = String::new();
    for i in 0..20 {
        text.push_str(&format!("0.{i:06}\t1\t16\t0x{:x}\n", 0x1000 + i * 32));
        text.push_str("garbage line\n");
    }
    let path = write_temp("many_bad.trace", text.as_bytes());
    let t = load_malloc_trace(
        &path,
        &LoadOptions {
            strictness: Strictness::Lenient,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    assert_eq!(t.summary.bad_lines, 20);
    assert_eq!(t.summary.first_bad_lines.len(), 5);
    assert_eq!(t.events.height(), 20);
}

#[test]
fn truncated_gzip_loads_what_was_there_and_says_so() {
    let full = std::fs::read(sample("find_usr_include.trace.gz")).unwrap();
    let cut = &full[..full.len() / 2];
    let path = write_temp("cut.trace.gz", cut);
    let t = load_malloc_trace(&path, &LoadOptions::default()).unwrap();
    let why = t.summary.truncated.as_deref().expect("truncation reported");
    assert!(!why.is_empty());
    assert!(t.events.height() > 10_000 && t.events.height() < 40_403);
    // Every loaded row is a prefix of the real trace.
    let (_, whole) = stats_of(&sample("find_usr_include.trace.gz"));
    let n = t.events.height();
    let a = whole.events.slice(0, n);
    for name in ["t_ns", "kind", "size_bytes", "address", "alloc_id"] {
        assert!(
            a.column(name)
                .unwrap()
                .equals_missing(t.events.column(name).unwrap()),
            "column {name} differs"
        );
    }
    assert!(t.summary.warnings()[0].contains("truncated"));
}

#[test]
fn extended_form_with_call_names() {
    let text = "0.000001\t7\t24\t0x1000\tcalloc\n\
                0.000002\t7\t48\t0x2000\tmalloc\n\
                0.000003\t7\t-1\t0x1000\trealloc\n\
                0.000003\t7\t96\t0x3000\trealloc\n\
                0.000004\t8\t-1\t0x2000\tfree\n\
                0.000005\t8\t64\t0x4000\tposix_memalign\n";
    let path = write_temp("ext.trace", text.as_bytes());
    let t = load_malloc_trace(&path, &LoadOptions::default()).unwrap();
    assert!(t.summary.has_call_column);
    let call = column_u8(&t.events, "call");
    let names: Vec<&str> = call
        .iter()
        .map(|&c| allocview_loaders::events::CALL_NAMES[c as usize])
        .collect();
    assert_eq!(
        names,
        [
            "calloc",
            "malloc",
            "realloc",
            "realloc",
            "free",
            "posix_memalign"
        ]
    );
    assert_eq!(
        column_ids(&t.events),
        [Some(0), Some(1), Some(0), Some(2), Some(1), Some(3)]
    );
    assert_eq!(t.threads.height(), 2);

    // Mixed: lines without the column get the default call.
    let mixed = "0.1\t1\t8\t0x10\n0.2\t1\t8\t0x20\tcalloc\n0.3\t1\t-1\t0x10\n";
    let path = write_temp("mixed.trace", mixed.as_bytes());
    let t = load_malloc_trace(&path, &LoadOptions::default()).unwrap();
    assert_eq!(column_u8(&t.events, "call"), [0, 1, 3]);
}

#[test]
fn missing_file_is_a_clear_error() {
    let err =
        load_malloc_trace(Path::new("/nonexistent/trace.gz"), &LoadOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("/nonexistent/trace.gz"), "{msg}");
}

#[test]
fn a_live_pointer_returned_again_ends_the_older_allocation() {
    let text = "0.1\t1\t100\t0x10\n0.2\t1\t30\t0x10\n0.3\t1\t-1\t0x10\n";
    let path = write_temp("live_again.trace", text.as_bytes());
    let (s, t) = stats_of(&path);
    assert_eq!(s.mallocs_of_live_ptr, 1);
    assert_eq!(t.events.height(), 4, "a synthetic free row was added");
    assert_eq!(column_u8(&t.events, "kind"), [0, 1, 0, 1]);
    assert_eq!(s.final_live_bytes, 0);
    assert_eq!(s.peak_live_bytes, 100);
}

#[test]
fn timestamps_going_backwards_are_clamped_and_counted() {
    let text = "0.5\t1\t8\t0x10\n0.4\t1\t-1\t0x10\n";
    let path = write_temp("backwards.trace", text.as_bytes());
    let (s, t) = stats_of(&path);
    assert_eq!(s.timestamps_non_monotonic, 1);
    let times: Vec<i64> = t
        .events
        .column("t_ns")
        .unwrap()
        .i64()
        .unwrap()
        .into_no_null_iter()
        .collect();
    assert_eq!(times, [500_000_000, 500_000_000]);
}
