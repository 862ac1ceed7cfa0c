//! `allocview spill` as a user runs it, on the bundled traces, a TensorFlow log and a PyTorch
//! snapshot.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{json, repo_arg, run};

use std::path::PathBuf;

use serde_json::Value;

fn peak_live(file: &str) -> u64 {
    json(&["compare", file, "--json", "--policy", "first-fit"])["max_live_bytes"]
        .as_u64()
        .unwrap()
}

/// The keys, and the lower bound below every policy that served everything.
fn check_point(v: &Value, peak_live: u64) {
    let limit = v["limit_bytes"].as_u64().unwrap();
    let bound = v["lower_bound_bytes"].as_u64().unwrap();
    assert_eq!(bound, peak_live.saturating_sub(limit));
    let evictions = v["evictions"].as_array().unwrap();
    assert_eq!(evictions.len(), 4);
    for e in evictions {
        for key in [
            "evict",
            "spilled_bytes",
            "reloaded_bytes",
            "evictions",
            "stalls",
            "estimated_io_seconds",
            "failed",
        ] {
            assert!(e.get(key).is_some(), "{key} missing in {e}");
        }
        if e["failed"] == 0 {
            assert!(e["spilled_bytes"].as_u64().unwrap() >= bound, "{e}");
        }
    }
    for key in ["spilled_bytes", "reloaded_bytes", "estimated_io_seconds"] {
        assert!(v["os_swap"].get(key).is_some(), "os_swap.{key} missing");
    }
}

#[test]
fn one_limit_on_a_malloc_trace() {
    let file = repo_arg("sample-traces/find_usr_include.trace.gz");
    let v = json(&["spill", &file, "--limit", "128KiB", "--json"]);
    for key in ["file", "limit_bytes", "policy", "unit", "lower_bound_bytes"] {
        assert!(v.get(key).is_some(), "{key} missing");
    }
    assert_eq!(v["limit_bytes"], 128 << 10);
    assert_eq!(v["unit"], "block");
    assert_eq!(v["policy"], "best-fit");
    check_point(&v, peak_live(&file));
    let by = |name: &str| {
        v["evictions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["evict"] == name)
            .unwrap()
            .clone()
    };
    // Knowing the future helps: Belady's choice spills less than LRU here.
    assert!(by("furthest")["spilled_bytes"].as_u64() < by("lru")["spilled_bytes"].as_u64());
}

#[test]
fn sweep_prints_and_plots_the_curve() {
    let file = repo_arg("sample-traces/xz_T2_8KiB_blocks.trace.gz");
    let png: PathBuf =
        std::env::temp_dir().join(format!("allocview-spill-{}.png", std::process::id()));
    let v = json(&[
        "spill",
        &file,
        "--sweep",
        "--json",
        "--unit",
        "executor",
        "--png",
        png.to_str().unwrap(),
    ]);
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG"));
    std::fs::remove_file(&png).unwrap();
    assert_eq!(v["unit"], "executor");
    let peak = v["peak_live_bytes"].as_u64().unwrap();
    let points = v["sweep"].as_array().unwrap();
    assert_eq!(points[0]["percent_of_peak_live"], 100);
    assert!(points.len() >= 2);
    for p in points {
        check_point(p, peak);
    }
    // The sweep stops at the first limit where every eviction policy fails, or at 10%.
    let last = points.last().unwrap();
    let all_failed = last["evictions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["failed"].as_u64().unwrap() > 0);
    assert!(all_failed || last["percent_of_peak_live"] == 10);

    let table = run(&["spill", &file, "--sweep", "--png", png.to_str().unwrap()]);
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("furthest") && text.contains("os-swap") && text.contains("90%"));
    std::fs::remove_file(&png).unwrap();
}

#[test]
fn tensorflow_log_and_pytorch_snapshot() {
    let tf = repo_arg("loaders/tests/data/tf/mobilenetv2_infer_memlog.txt.gz");
    let limit = peak_live(&tf) / 2;
    for unit in ["block", "executor"] {
        let v = json(&[
            "spill",
            &tf,
            "--limit",
            &limit.to_string(),
            "--unit",
            unit,
            "--json",
        ]);
        check_point(&v, peak_live(&tf));
    }
    let snap = repo_arg("sample-traces/pytorch/lm_train_step_windows.pickle");
    let limit = peak_live(&snap) * 3 / 4;
    let v = json(&[
        "spill",
        &snap,
        "--limit",
        &limit.to_string(),
        "--policy",
        "pytorch",
        "--unit",
        "executor",
        "--json",
    ]);
    check_point(&v, peak_live(&snap));
}

#[test]
fn bad_flags_are_explained() {
    let file = repo_arg("sample-traces/find_usr_include.trace.gz");
    let out = run(&["spill", &file, "--limit", "1MiB", "--evict", "random"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown eviction policy"));
    let out = run(&["spill", &file, "--limit", "1MiB", "--bandwidth", "fast"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bandwidth"));
    let out = run(&["spill", &file, "--limit", "1MiB", "--policy", "oracle"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("online policy"));
    assert!(!run(&["spill", &file]).status.success());
}
