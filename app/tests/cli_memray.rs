//! memray captures as a user reads them: `stats`, `sites`, `compare`, `flamegraph`, `leaks`,
//! `diff` and `export` on captures in `sample-traces/memray/` (see its README and
//! `loaders/tests/memray.rs`). The figures expected are memray's own (`memray stats --json`'s
//! `metadata.peak_memory`, its top locations), not ours.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{fails, json, ok, run, sample};

#[path = "../../loaders/tests/scratch/mod.rs"]
mod scratch;

fn capture(name: &str) -> String {
    sample(&format!("memray/{name}")).display().to_string()
}

#[test]
fn stats_peak_is_memray_stats_peak_memory() {
    // memray 1.19.3 `memray stats --json`: metadata.peak_memory 101872638 (101.9 MB), 1015213
    // allocations; memray 1.20.0: 6307390 for threads13.bin.
    for (name, peak, allocations) in [
        (
            "pathology_manifest_builder_linux.memray.bin",
            101_872_638u64,
            1_015_213u64,
        ),
        ("threads13.bin", 6_307_390, 1306),
    ] {
        let v = json(&["stats", &capture(name), "--json"]);
        assert_eq!(v["peak_live_bytes"], peak, "{name}");
        assert_eq!(v["mallocs"], allocations, "{name}");
    }
    // The text form says what the format keeps.
    let out = run(&["stats", &capture("threads13.bin")]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("memray capture format 13 (memray 1.20)"),
        "{stderr}"
    );
}

#[test]
fn sites_name_the_python_functions_memray_names() {
    // memray 1.20.0 `memray stats`: main:prog.py:20 allocated 5000001 B, make_table:prog.py:6
    // 1304510 B.
    let v = json(&["sites", &capture("threads13_native.bin"), "--json"]);
    let sites = v["sites"].as_array().unwrap();
    let names: Vec<&str> = sites.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names[..2], ["main", "make_table"], "{names:?}");
    let make_table = &sites[1];
    let frames = make_table["frames"].as_array().unwrap();
    assert!(
        frames
            .iter()
            .any(|f| f["function"] == "make_table" && f["file"] == "prog.py" && f["line"] == 6),
        "{make_table}"
    );
    // Its callers, the thread's target, follow it.
    assert!(
        frames
            .iter()
            .any(|f| f["function"] == "worker" && f["line"] == 10)
    );
}

#[test]
fn compare_replays_a_capture_from_its_peak() {
    let v = json(&[
        "compare",
        &capture("threads12.bin"),
        "--json",
        "--policy",
        "bfc,glibc",
    ]);
    // memray 1.19.3 `memray stats --json`: peak_memory 6307295.
    assert_eq!(v["max_live_bytes"], 6_307_295);
    assert_eq!(v["policies"].as_array().unwrap().len(), 2);
    // memray's RSS samples are the recorded memory: memray.FileReader's
    // get_memory_snapshots() has 2, the largest rss 51417088.
    assert_eq!(v["recorded_memory"]["peak_rss_bytes"], 51_417_088);
    assert_eq!(v["recorded_memory"]["samples"], 2);
}

#[test]
fn flamegraph_leaks_diff_and_export_read_captures() {
    let dir = scratch::scratch_dir("memray-cli");
    let svg = dir.path().join("fg.svg");
    ok(&[
        "flamegraph",
        &capture("threads13.bin"),
        "-o",
        svg.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("make_table"),
        "the flame graph names the Python function"
    );
    let leaks = ok(&["leaks", &capture("threads13.bin")]);
    assert!(leaks.contains("live at the end"), "{leaks}");
    let diff = ok(&["diff", &capture("threads12.bin"), &capture("threads13.bin")]);
    assert!(diff.contains("peak live"), "{diff}");
    let pprof = dir.path().join("x.pb.gz");
    ok(&[
        "export",
        &capture("threads13.bin"),
        "-o",
        pprof.to_str().unwrap(),
    ]);
    assert!(std::fs::metadata(&pprof).unwrap().len() > 0);
}

#[test]
fn a_cut_capture_is_refused_naming_file_and_byte_and_lenient_loads_its_head() {
    let dir = scratch::scratch_dir("memray-cut");
    let bytes = std::fs::read(sample("memray/async_analysis_linux.memray.bin")).unwrap();
    let cut = dir.path().join("cut.bin");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let cut = cut.to_str().unwrap();
    let e = fails(&["stats", cut]);
    assert!(e.contains("cut.bin") && e.contains("byte"), "{e}");
    assert!(e.contains("--lenient"), "{e}");
    let v = json(&["stats", cut, "--lenient", "--json"]);
    assert!(v["mallocs"].as_u64().unwrap() > 0);
    assert_eq!(v["truncated"], true, "{v}");
}
