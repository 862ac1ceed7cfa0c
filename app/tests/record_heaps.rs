//! A program's own heaps (`include/allocview.h`): a C program with a bump arena and a pool of
//! device offsets (on a second thread) reports their blocks, and `allocview record` keeps
//! them as named heaps beside malloc's. Each heap reads with `--heap NAME` with exactly the
//! counts and peak the program made; malloc's heap is what the same program recorded without
//! its reports; `compare` replays the arena, `sites` names the C function that allocated; the
//! same binary runs without allocview.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const ARENA_C: &str = include_str!("heaps/arena.c");
/// The arena's blocks: 4096 + i bytes for i in 0..1000; every third (i = 0, 3, ...) freed.
const ARENA_ALLOCS: u64 = 1000;
const ARENA_FREES: u64 = 334;
const ARENA_PEAK_BYTES: u64 = 4096 * 1000 + 999 * 1000 / 2;

fn arena_final_bytes() -> u64 {
    (0..1000u64).filter(|i| i % 3 != 0).map(|i| 4096 + i).sum()
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("record-heaps-{name}"));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../include")
}

fn build_c(dir: &Path, name: &str, defines: &[&str]) -> PathBuf {
    let src = dir.join("arena.c");
    std::fs::write(&src, ARENA_C).unwrap();
    let exe = dir.join(name);
    let out = Command::new("cc")
        .args(["-O1", "-g", "-pthread", "-fno-builtin"])
        .args(defines)
        .arg("-I")
        .arg(include_dir())
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("cc must be installed (build-essential)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn allocview(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = allocview(args);
    assert!(
        out.status.success(),
        "allocview {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(args)).unwrap()
}

fn record(dir: &Path, exe: &Path, name: &str) -> PathBuf {
    let trace = dir.join(format!("{name}.avt"));
    let out = allocview(&[
        "record",
        "-o",
        trace.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("reporting=1"));
    trace
}

#[test]
fn a_programs_own_heaps_are_recorded_and_read_by_name() {
    let dir = scratch("c");
    let exe = build_c(&dir, "arena", &[]);
    // Without allocview the weak symbols are null: the program runs and reports nothing.
    let alone = Command::new(&exe).output().unwrap();
    assert!(alone.status.success());
    assert_eq!(
        String::from_utf8_lossy(&alone.stdout).trim(),
        "sum=124716 reporting=0"
    );
    let trace = record(&dir, &exe, "arena");
    let t = trace.to_str().unwrap();

    let arena = json(&["stats", t, "--heap", "arena", "--json"]);
    assert_eq!(arena["mallocs"], ARENA_ALLOCS);
    assert_eq!(arena["frees"], ARENA_FREES);
    assert_eq!(arena["events"], ARENA_ALLOCS + ARENA_FREES);
    assert_eq!(arena["frees_unknown"], 0);
    assert_eq!(arena["peak_live_bytes"], ARENA_PEAK_BYTES);
    assert_eq!(arena["final_live_bytes"], arena_final_bytes());
    assert_eq!(arena["malloc_size_min"], 4096);
    assert_eq!(arena["malloc_size_max"], 5095);
    assert_eq!(arena["heap"], "arena");

    // The pool's offsets from 0, recorded on another thread, are a heap of their own.
    let pool = json(&["stats", t, "--heap", "device pool", "--json", "--no-stream"]);
    assert_eq!(pool["mallocs"], 200);
    assert_eq!(pool["frees"], 200);
    assert_eq!(pool["frees_unknown"], 0);
    assert_eq!(pool["peak_live_bytes"], 200 * 256);
    assert_eq!(pool["final_live_bytes"], 0);

    // `stats` lists the heaps with their figures.
    let heaps = arena["heaps"].as_array().unwrap();
    let names: Vec<&str> = heaps.iter().map(|h| h["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["malloc", "arena", "device pool"]);
    assert_eq!(heaps[1]["events"], ARENA_ALLOCS + ARENA_FREES);
    assert_eq!(heaps[1]["peak_live_bytes"], ARENA_PEAK_BYTES);
    assert_eq!(heaps[2]["peak_live_bytes"], 200 * 256);
    let table = ok(&["stats", t]);
    assert!(table.contains("heaps (--heap NAME reads one)"), "{table}");
    assert!(table.contains("device pool"), "{table}");

    // An unknown name fails, naming the heaps there are.
    let bad = allocview(&["stats", t, "--heap", "arenas"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("no heap named `arenas`") && err.contains("malloc, arena, device pool"),
        "{err}"
    );

    // `compare` replays the arena's blocks through other policies.
    let cmp = json(&[
        "compare",
        t,
        "--heap",
        "arena",
        "--policy",
        "buddy,first-fit",
        "--json",
    ]);
    assert_eq!(cmp["events"], ARENA_ALLOCS + ARENA_FREES);
    assert_eq!(cmp["max_live_bytes"], ARENA_PEAK_BYTES);
    let rows = cmp["policies"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert_eq!(row["peak_live_bytes"], ARENA_PEAK_BYTES);
        assert_eq!(row["ooms"], 0);
        assert!(row["peak_footprint_bytes"].as_u64().unwrap() >= ARENA_PEAK_BYTES);
    }

    // `sites` names the C function that asked the arena, with its stack.
    let sites = ok(&["sites", t, "--heap", "arena"]);
    let first_site = sites
        .lines()
        .find(|l| l.contains("1,000     1,000"))
        .unwrap_or_default();
    assert!(first_site.trim_end().ends_with("arena_alloc"), "{sites}");
    assert!(sites.contains("main (arena.c:"), "{sites}");
}

#[test]
fn mallocs_heap_is_unchanged_by_the_programs_reports() {
    let dir = scratch("unchanged");
    let with = record(&dir, &build_c(&dir, "with", &[]), "with");
    let without_exe = build_c(&dir, "without", &["-DNO_REPORTS"]);
    let trace = dir.join("without.avt");
    let out = allocview(&[
        "record",
        "-o",
        trace.to_str().unwrap(),
        "--",
        without_exe.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let a = json(&["stats", with.to_str().unwrap(), "--json"]);
    let b = json(&["stats", trace.to_str().unwrap(), "--json"]);
    for key in [
        "events",
        "mallocs",
        "frees",
        "frees_unknown",
        "malloc_bytes_total",
    ] {
        assert_eq!(a[key], b[key], "{key}");
    }
    // The arena's 8 MiB block and the program's ten blocks of 100 to 109 bytes.
    assert!(a["mallocs"].as_u64().unwrap() >= 11);
    assert!(a["peak_live_bytes"].as_u64().unwrap() >= 8 << 20);
    assert!(a.get("heap").is_none());
    // A trace without heaps lists none, and is read as before.
    assert!(b.get("heaps").is_none());
    let bad = allocview(&["stats", trace.to_str().unwrap(), "--heap", "arena"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("the trace's heaps are malloc"));
}

/// Compiles the `allocview-heap` crate and its `bump_arena` example with a bare `rustc` (std
/// only, as `build.rs` compiles the tracer), into `dir`.
fn build_rust_example(dir: &Path) -> PathBuf {
    let heap = Path::new(env!("CARGO_MANIFEST_DIR")).join("../heap");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let lib = dir.join("liballocview_heap.rlib");
    let out = Command::new(&rustc)
        .args(["--edition", "2024", "--crate-type", "rlib", "--crate-name"])
        .arg("allocview_heap")
        .arg(heap.join("src/lib.rs"))
        .arg("-o")
        .arg(&lib)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exe = dir.join("bump_arena");
    let out = Command::new(&rustc)
        .args(["--edition", "2024", "-g", "--extern"])
        .arg(format!("allocview_heap={}", lib.display()))
        .arg(heap.join("examples/bump_arena.rs"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
fn the_rust_crate_reports_a_heap() {
    let dir = scratch("rust");
    let exe = build_rust_example(&dir);
    let alone = Command::new(&exe).output().unwrap();
    assert!(alone.status.success());
    assert_eq!(
        String::from_utf8_lossy(&alone.stdout).trim(),
        "blocks=500 reporting=0"
    );
    let trace = dir.join("rust.avt");
    let out = allocview(&[
        "record",
        "-o",
        trace.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("blocks=500 reporting=1"));
    let t = trace.to_str().unwrap();
    // 500 blocks of 1000 + i bytes, those of even i freed.
    let s = json(&["stats", t, "--heap", "rust-arena", "--json"]);
    assert_eq!(s["mallocs"], 500);
    assert_eq!(s["frees"], 250);
    assert_eq!(
        s["peak_live_bytes"],
        (0..500u64).map(|i| 1000 + i).sum::<u64>()
    );
    assert_eq!(
        s["final_live_bytes"],
        (0..500u64)
            .filter(|i| i % 2 == 1)
            .map(|i| 1000 + i)
            .sum::<u64>()
    );
    let sites = ok(&["sites", t, "--heap", "rust-arena"]);
    assert!(sites.contains("main (bump_arena.rs:"), "{sites}");
}

/// The OpenTelemetry eBPF profiler's memory USDT contract: a program firing
/// `otel_memory:alloc(user, size, weight)` and `otel_memory:free(ptr)` behind semaphores
/// (`<sys/sdt.h>`, Debian's systemtap-sdt-dev) has them recorded as heap `otel_memory`,
/// without root or eBPF: the tracer sets the semaphores and traps the probes' `nop`s.
#[test]
fn otel_memory_usdt_probes_land_in_their_heap() {
    if !Path::new("/usr/include/x86_64-linux-gnu/sys/sdt.h").exists()
        && !Path::new("/usr/include/sys/sdt.h").exists()
    {
        panic!("<sys/sdt.h> is missing: install systemtap-sdt-dev (.ci/run does)");
    }
    let dir = scratch("otel");
    let src = dir.join("otel.c");
    std::fs::write(&src, include_str!("heaps/otel.c")).unwrap();
    let exe = dir.join("otel");
    let out = Command::new("cc")
        .args(["-O2", "-g", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Alone, nobody sets the semaphores: the probes do not fire.
    let alone = Command::new(&exe).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&alone.stdout).trim(),
        "probes enabled=0 errno lost=0"
    );
    let trace = dir.join("otel.avt");
    let out = allocview(&[
        "record",
        "-o",
        trace.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "probes enabled=1 errno lost=0"
    );
    let t = trace.to_str().unwrap();
    // 300 blocks of 64 * (i + 1) bytes, the first 100 freed.
    let s = json(&["stats", t, "--heap", "otel_memory", "--json"]);
    assert_eq!(s["mallocs"], 300);
    assert_eq!(s["frees"], 100);
    assert_eq!(s["frees_unknown"], 0);
    assert_eq!(s["peak_live_bytes"], 64 * (1..=300u64).sum::<u64>());
    assert_eq!(s["final_live_bytes"], 64 * (101..=300u64).sum::<u64>());
    // The same blocks, through malloc, are in malloc's heap as before.
    let m = json(&["stats", t, "--json"]);
    assert!(m["mallocs"].as_u64().unwrap() >= 300);
    assert!(m["peak_live_bytes"].as_u64().unwrap() >= 64 * (1..=300u64).sum::<u64>());
}

/// A heap named before `fork` keeps its name in the child's trace (its spool is a file of its
/// own, which the parent's name frame never reached).
#[test]
fn a_forked_child_keeps_its_heaps_names() {
    let dir = scratch("fork");
    let src = dir.join("fork.c");
    std::fs::write(&src, include_str!("heaps/fork.c")).unwrap();
    let exe = dir.join("fork");
    let out = Command::new("cc")
        .args(["-O1", "-g", "-I"])
        .arg(include_dir())
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = dir.join("fork.avt");
    let out = allocview(&[
        "record",
        "-o",
        trace.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut allocations: Vec<u64> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "avt"))
        .map(|p| {
            json(&["stats", p.to_str().unwrap(), "--heap", "pool", "--json"])["mallocs"]
                .as_u64()
                .unwrap()
        })
        .collect();
    allocations.sort_unstable();
    assert_eq!(allocations, [1, 10]);
}
