//! Heap profiles as inputs: pprof (a Go program's heap profile made here with Debian's Go, a
//! JAX device memory profile, jemalloc's pprof output) and DHAT's JSON (Valgrind's, dhat-rs's).
//! `sites`, `flamegraph`, `diff` and `export` read them, checked against `go tool pprof` and the
//! files' own figures; the commands that replay say why they cannot.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{fails, json, ok, pprof_top, repo, require_tool};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("profiles-{name}"));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn data(name: &str) -> String {
    repo(&format!("loaders/tests/data/profiles/{name}"))
        .display()
        .to_string()
}

/// A Go program whose live heap comes from two named functions, profiled at every allocation.
const HEAP_GO: &str = r#"package main

import (
	"os"
	"runtime"
	"runtime/pprof"
)

var keep [][]byte

//go:noinline
func makeTable() { keep = append(keep, make([]byte, 3<<20)) }

//go:noinline
func makeNames(n int) {
	for i := 0; i < n; i++ {
		keep = append(keep, make([]byte, 4096+i))
	}
}

func main() {
	runtime.MemProfileRate = 1
	makeTable()
	makeNames(100)
	runtime.GC()
	f, _ := os.Create(os.Args[1])
	pprof.WriteHeapProfile(f)
	f.Close()
}
"#;

/// A Go heap profile made here by `runtime/pprof`.
fn go_heap_profile(dir: &Path) -> PathBuf {
    std::fs::write(dir.join("main.go"), HEAP_GO).unwrap();
    std::fs::write(dir.join("go.mod"), "module heapdemo\n\ngo 1.19\n").unwrap();
    let exe = dir.join("heapdemo");
    let build = Command::new("go")
        .args(["build", "-o"])
        .arg(&exe)
        .arg(".")
        .current_dir(dir)
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GOFLAGS", "-mod=mod")
        .output()
        .unwrap();
    assert!(build.status.success(), "{build:?}");
    let profile = dir.join("heap.pprof");
    let run = Command::new(&exe).arg(&profile).output().unwrap();
    assert!(run.status.success(), "{run:?}");
    profile
}

#[test]
fn a_go_heap_profile_s_sites_are_go_tool_pprof_s_top_functions() {
    if !require_tool("go", &["version"], "apt-get install golang-go") {
        return;
    }
    let dir = scratch("go");
    let profile = go_heap_profile(&dir);
    let profile_arg = profile.to_str().unwrap();
    let (top, total) = pprof_top(&profile, "inuse_space");
    let v = json(&["sites", profile_arg, "--json", "--by", "function"]);
    let sites: HashMap<String, u64> = v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["live_bytes"].as_u64().unwrap(),
            )
        })
        .filter(|(_, b)| *b > 0)
        .collect();
    assert_eq!(sites.values().sum::<u64>(), total, "{sites:?}");
    // The program's own functions, with the bytes it asked for (Go rounds to its size classes).
    for f in ["main.makeTable", "main.makeNames"] {
        assert_eq!(sites.get(f), top.get(f), "{f}: {sites:?} {top:?}");
    }
    assert!(sites.get("main.makeTable").is_some_and(|&b| b >= 3 << 20));
    let stats = json(&["stats", profile_arg, "--json"]);
    assert_eq!(stats["format"], "heap-profile");
    assert_eq!(stats["live_bytes"].as_u64().unwrap(), total);
    // Read and written back, the profile shows go tool pprof the same heap.
    let again = dir.join("again.pb.gz");
    ok(&["export", profile_arg, "-o", again.to_str().unwrap()]);
    assert_eq!(pprof_top(&again, "inuse_space"), (top.clone(), total));
    assert_eq!(
        pprof_top(&again, "alloc_space").1,
        pprof_top(&profile, "alloc_space").1
    );
    // A flame graph of it, folded.
    let folded = ok(&["flamegraph", profile_arg, "--folded"]);
    assert!(
        folded.lines().any(|l| l.contains("main.makeTable")),
        "{folded}"
    );
}

#[test]
fn jax_and_jemalloc_profiles_load_with_go_tool_pprof_s_totals() {
    if !require_tool("go", &["version"], "apt-get install golang-go") {
        return;
    }
    for (file, index) in [
        ("jax_gpu_jaxdips_aeeea9b_memory.prof", "space"),
        ("jemalloc_pprof_appflowy_cloud_heap.pb.gz", "inuse_space"),
    ] {
        let path = data(file);
        let (_, total) = pprof_top(Path::new(&path), index);
        let stats = json(&["stats", &path, "--json"]);
        assert_eq!(stats["live_bytes"].as_u64().unwrap(), total, "{file}");
        let sites = json(&["sites", &path, "--json", "--by", "stack"]);
        let live: u64 = sites["sites"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["live_bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(live, total, "{file}");
    }
    // jemalloc's profile is unsymbolized: its frames are its modules and addresses.
    let sites = json(&[
        "sites",
        &data("jemalloc_pprof_appflowy_cloud_heap.pb.gz"),
        "--json",
    ]);
    let name = sites["sites"][0]["name"].as_str().unwrap();
    assert!(name.contains("+0x"), "{name}");
}

/// The sums of a DHAT file's program points, read with serde here.
fn dhat_sums(path: &str, key: &str) -> u64 {
    let doc: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    doc["pps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[key].as_u64().unwrap())
        .sum()
}

#[test]
fn dhat_files_give_their_peak_end_and_totals_by_site() {
    for file in [
        "z_ant_valgrind_dhat.out",
        "graphql_hive_router_gateway.dhat-heap.json",
    ] {
        let path = data(file);
        let stats = json(&["stats", &path, "--json"]);
        assert_eq!(stats["profile_format"], "dhat");
        assert_eq!(stats["alloc_bytes"].as_u64(), Some(dhat_sums(&path, "tb")));
        assert_eq!(stats["peak_bytes"].as_u64(), Some(dhat_sums(&path, "gb")));
        assert_eq!(stats["live_bytes"].as_u64(), Some(dhat_sums(&path, "eb")));
        for (at, key) in [("peak", "gb"), ("end", "eb")] {
            let v = json(&["sites", &path, "--json", "--at", at, "--by", "stack"]);
            let live: u64 = v["sites"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["live_bytes"].as_u64().unwrap())
                .sum();
            assert_eq!(live, dhat_sums(&path, key), "{file} --at {at}");
        }
    }
    // Valgrind's frames keep their files and lines; the site is the program's own frame.
    let v = json(&["sites", &data("z_ant_valgrind_dhat.out"), "--json"]);
    let frames = v["sites"][0]["frames"].as_array().unwrap();
    assert!(
        frames
            .iter()
            .any(|f| f["file"] == "Allocator.zig" && f["line"].as_i64().unwrap() > 0),
        "{frames:?}"
    );
    // Two profiles side by side, by site.
    let d = json(&[
        "diff",
        &data("z_ant_valgrind_dhat.out"),
        &data("graphql_hive_router_gateway.dhat-heap.json"),
        "--json",
    ]);
    assert_eq!(
        d["peak_live_bytes"]["a"].as_u64(),
        Some(dhat_sums(&data("z_ant_valgrind_dhat.out"), "gb"))
    );
}

#[test]
fn what_needs_events_says_what_reads_a_profile() {
    let path = data("jax_gpu_jaxdips_aeeea9b_memory.prof");
    for cmd in ["compare", "leaks", "report"] {
        let mut args = vec![cmd, path.as_str()];
        let dir = scratch("needs-events");
        let out = dir.join("out");
        if cmd == "report" {
            args.extend(["--out", out.to_str().unwrap()]);
        }
        let err = fails(&args);
        assert!(
            err.contains("heap profile") && err.contains("`allocview sites`"),
            "{cmd}: {err}"
        );
    }
    let err = fails(&["sites", &path, "--at", "1.5s"]);
    assert!(err.contains("one moment"), "{err}");
    let err = fails(&["sites", &path, "--policy", "bfc"]);
    assert!(err.contains("no events to replay"), "{err}");
    let dir = scratch("chrome");
    let err = fails(&[
        "export",
        &path,
        "-o",
        dir.join("x.trace.json").to_str().unwrap(),
    ]);
    assert!(err.contains("without a timeline"), "{err}");
}

#[test]
fn a_cut_or_damaged_profile_is_refused_naming_the_file_and_byte() {
    let dir = scratch("damaged");
    let whole = std::fs::read(data("jax_gpu_jaxdips_aeeea9b_memory.prof")).unwrap();
    let cut = dir.join("cut.prof");
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let err = fails(&["stats", cut.to_str().unwrap()]);
    assert!(
        err.contains("cut.prof") && err.contains("damaged after"),
        "{err}"
    );
    // Uncompressed and cut inside a message: the error names the byte where it ends early.
    let mut inflated = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(whole.as_slice()),
        &mut inflated,
    )
    .unwrap();
    let cut = dir.join("cut-raw.prof");
    std::fs::write(&cut, &inflated[..inflated.len() - 7]).unwrap();
    let err = fails(&["stats", cut.to_str().unwrap()]);
    assert!(
        err.contains("cut-raw.prof") && err.contains("at byte"),
        "{err}"
    );
    let dhat = std::fs::read_to_string(data("graphql_hive_router_gateway.dhat-heap.json")).unwrap();
    let bad = dir.join("bad.dhat.json");
    std::fs::write(&bad, dhat.replacen("\"fs\": [", "\"fs\": [999,", 1)).unwrap();
    let err = fails(&["sites", bad.to_str().unwrap()]);
    assert!(
        err.contains("bad.dhat.json") && err.contains("999"),
        "{err}"
    );
    // --lenient reads what it can and counts what it skips.
    let out = common::run(&["sites", bad.to_str().unwrap(), "--lenient"]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("skipped 1 program points"), "{err}");
    let out = common::run(&["stats", cut.to_str().unwrap(), "--lenient", "--json"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the profile is damaged"),
        "{out:?}"
    );
}
