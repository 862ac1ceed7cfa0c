//! The commands on heaptrack data files: `stats`, `compare` (with the approximate-lifetimes
//! note), `sites`, `leaks`, `flamegraph`, `convert` to Parquet, and damaged files.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::{fails, ok, repo, run};

fn data(name: &str) -> String {
    repo("loaders/tests/data/heaptrack")
        .join(name)
        .display()
        .to_string()
}

const DAVID: &str = "heaptrack.david.18594.gz";
/// Recorded with Debian's heaptrack 1.4.0 from `prog.c` (see the folder's README).
const PROG: &str = "heaptrack.prog.zst";

#[test]
fn stats_counts_heaptracks_allocation_calls() {
    // heaptrack_print: "calls to allocation functions: 2896", 2,859 `-` lines.
    let out = ok(&["stats", &data(DAVID)]);
    assert!(out.contains("2,896 allocations, 2,859 frees"), "{out}");
    let v = common::json(&["stats", "--json", &data(DAVID)]);
    assert_eq!(v["mallocs"], 2896);
    // heaptrack_print: "peak heap memory consumption: 996.97K" (two decimals, powers of 1000).
    let peak = v["peak_live_bytes"].as_u64().unwrap();
    assert_eq!(format!("{:.2}", peak as f64 / 1000.0), "996.97");
    // heaptrack samples the whole resident set only: nothing is said of an anonymous part or
    // of mappings it did not record.
    let out = ok(&["stats", &data("heaptrack.prog.zst")]);
    assert!(
        out.contains("no anonymous part or mappings recorded"),
        "{out}"
    );
    assert!(!out.contains("mapped outside"), "{out}");
    assert_eq!(
        common::json(&["stats", "--json", &data("heaptrack.prog.zst")])["recorded_memory"]["series"],
        "resident_only"
    );
    // --stream reads binary traces; a heaptrack file does not convert to one, so the error
    // says to read it whole rather than to convert it.
    let err = common::fails(&["stats", "--stream", &data("heaptrack.prog.zst")]);
    assert!(
        err.contains("loaded whole") && !err.contains("convert"),
        "{err}"
    );
}

#[test]
fn compare_says_lifetimes_are_approximate() {
    let out = run(&["compare", "--policy", "first-fit,bfc", &data(DAVID)]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("lifetimes are approximate") && stderr.contains("LIFO"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("first-fit") && stdout.contains("bfc"),
        "{stdout}"
    );
}

#[test]
fn sites_and_leaks_name_the_programs_functions() {
    let out = ok(&["sites", "--at", "end", &data(PROG)]);
    assert!(out.contains("make_block"), "{out}");
    assert!(out.contains("prog.c"), "{out}");
    let out = ok(&["leaks", &data(PROG)]);
    assert!(
        out.contains("make_block") && out.contains("make_table"),
        "{out}"
    );
    let out = ok(&["sites", &data(DAVID)]);
    assert!(
        out.contains("QCoreApplicationPrivate::initLocale()"),
        "{out}"
    );
}

#[test]
fn flamegraph_of_a_heaptrack_file_holds_its_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("f.svg");
    let folded = dir.path().join("f.folded");
    ok(&["flamegraph", &data(PROG), "-o", svg.to_str().unwrap()]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.starts_with("<?xml") || text.starts_with("<svg"),
        "not an SVG"
    );
    assert!(text.contains("make_block"));
    ok(&[
        "flamegraph",
        "--metric",
        "allocated",
        "--folded",
        &data(PROG),
        "-o",
        folded.to_str().unwrap(),
    ]);
    let folded = std::fs::read_to_string(&folded).unwrap();
    // Ten make_block(1000) calls from main: 10,000 bytes allocated on that stack.
    assert!(
        folded
            .lines()
            .any(|l| l.contains("main;make_block") && l.ends_with(" 10000")),
        "{folded}"
    );
}

#[test]
fn convert_writes_parquet_and_names_what_a_heaptrack_file_is_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let pq = dir.path().join("d.parquet");
    ok(&["convert", &data(DAVID), pq.to_str().unwrap()]);
    assert!(pq.exists());
    let err = fails(&[
        "convert",
        &data(DAVID),
        dir.path().join("d.avt").to_str().unwrap(),
    ]);
    assert!(err.contains("is a heaptrack data file"), "{err}");
}

#[test]
fn a_damaged_file_names_its_line_and_lenient_counts_what_it_skips() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("heaptrack.bad");
    let text = "v 10400 3\ns 4 main\ni 1000 0 1\nt 1 0\na 10 1\n+ 0\n+ 9\n- 0\n";
    std::fs::write(&bad, text).unwrap();
    let err = fails(&["stats", bad.to_str().unwrap()]);
    assert!(
        err.contains("line 7, column 3") && err.contains("heaptrack.bad"),
        "{err}"
    );
    let out = run(&["stats", "--lenient", bad.to_str().unwrap()]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("skipped 1 malformed lines"), "{stderr}");
}
