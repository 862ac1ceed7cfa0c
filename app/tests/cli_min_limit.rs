//! `allocview compare --min-limit` as a user runs it: each policy's `min_limit_bytes` must
//! replay with no OOM at `--limit min_limit_bytes` and with some at one byte less.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{json, repo};

use std::process::Command;

use serde_json::Value;

fn ooms_at(file: &str, policy: &str, limit: u64) -> u64 {
    let v = json(&[
        "compare",
        file,
        "--json",
        "--policy",
        policy,
        "--limit",
        &limit.to_string(),
    ]);
    v["policies"][0]["ooms"].as_u64().unwrap()
}

/// Checks every policy's minimum of `file` at the minimum and one byte below; returns the JSON.
fn check_minima(file: &str, policies: &str) -> Value {
    let v = json(&[
        "compare",
        file,
        "--min-limit",
        "--json",
        "--policy",
        policies,
    ]);
    let max_live = v["max_live_bytes"].as_u64().unwrap();
    for p in v["policies"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        // A TensorFlow log's `bfc@checkpoint` row is what `--policy bfc` selects there.
        let policy = name.split_once('@').map_or(name, |(policy, _)| policy);
        let min = p["min_limit_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: {p}"));
        assert!(min >= max_live, "{name}: {min} below max live {max_live}");
        assert_eq!(ooms_at(file, policy, min), 0, "{name} at its minimum {min}");
        assert!(ooms_at(file, policy, min - 1) > 0, "{name} at {}", min - 1);
    }
    v
}

#[test]
fn malloc_trace_minima_are_tight() {
    let file = repo("sample-traces/xz_T2_8KiB_blocks.trace.gz");
    let v = check_minima(
        file.to_str().unwrap(),
        "first-fit,best-fit,bfc,buddy,pool,glibc,oracle,pytorch",
    );
    for p in v["policies"].as_array().unwrap() {
        let method = p["min_limit_method"].as_str().unwrap();
        let expected = match p["name"].as_str().unwrap() {
            "bfc" | "glibc" | "pytorch" => "search",
            _ => "unlimited-peak",
        };
        assert_eq!(method, expected, "{p}");
        if method == "unlimited-peak" {
            assert_eq!(p["min_limit_bytes"], p["peak_footprint_bytes"], "{p}");
        }
    }
}

#[test]
fn tensorflow_log_minimum_of_bfc_at_tensorflows_addresses() {
    let file = repo("loaders/tests/data/tf/mobilenetv2_infer_memlog.txt.gz");
    let v = check_minima(file.to_str().unwrap(), "bfc,first-fit");
    let bfc = &v["policies"][0];
    assert_eq!(bfc["replay"], "checkpoint");
    assert_eq!(bfc["min_limit_method"], "search");
}

#[test]
fn min_limit_and_limit_exclude_each_other() {
    let file = repo("sample-traces/find_usr_include.trace.gz");
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args([
            "compare",
            file.to_str().unwrap(),
            "--min-limit",
            "--limit",
            "1MiB",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn pytorch_snapshot_recorded_and_from_empty() {
    let file = repo("sample-traces/pytorch/lm_train_step_windows.pickle");
    let file = file.to_str().unwrap();
    // From an empty allocator the limit steers PyTorch's segment release: searched and tight.
    let v = check_minima(file, "pytorch:start=empty");
    assert_eq!(v["policies"][0]["min_limit_method"], "search");
    // The recorded replay does not apply a limit (the trace's own releases stand in for it):
    // its figure is the memory it held, the recorded peak.
    let v = json(&[
        "compare",
        file,
        "--min-limit",
        "--json",
        "--policy",
        "pytorch",
    ]);
    let p = &v["policies"][0];
    assert_eq!(p["min_limit_method"], "unlimited-peak");
    assert_eq!(p["min_limit_bytes"], p["peak_footprint_bytes"]);
}
