//! The commands on real TensorFlow output (committed fixtures; no TensorFlow needed).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn tf(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../loaders/tests/data/tf")
        .join(name)
}

fn json(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn stats_json_of_a_bfc_dump_has_the_documented_keys() {
    let p = tf("mobilenetv2_oom_dump.txt.gz");
    let v = json(&["stats", "--json", p.to_str().unwrap()]);
    // What TensorFlow printed (shared/data/tf/README.md).
    assert_eq!(v["format"], "tf-bfc-dump");
    assert_eq!(v["allocator"], "bfc_cpu_allocator_for_gpu");
    assert_eq!(v["in_use_chunks"], 2706);
    assert_eq!(v["in_use_bytes"], 534_765_568u64);
    assert_eq!(v["free_chunks"], 3);
    assert_eq!(v["free_bytes"], 8192);
    assert_eq!(v["regions"], 8);
    assert_eq!(v["region_bytes"], 534_773_760u64);
    assert_eq!(v["oom_rounded_bytes"], 102_760_448u64);
    assert!(v["oom_op"].as_str().unwrap().contains("SquaredDifference"));
    assert!(v["largest_free_chunk_bytes"].as_u64().unwrap() < 8192);
    assert_eq!(v["stats"]["num_allocs"], 34563);
    assert_eq!(v["stats"]["bytes_limit"], 536_870_912u64);
    // Not a fragmentation OOM: only 8 KiB were free.
    assert_eq!(v["fragmentation_oom"], false);
    assert!(
        v["diagnosis"]
            .as_str()
            .unwrap()
            .contains("8192 bytes are free")
    );

    let p = tf("mobilenetv2_oom_memlog_dump.txt.gz");
    let v = json(&["stats", "--json", p.to_str().unwrap()]);
    assert_eq!(v["format"], "tf-memory-log");
    let dump = &v["tf"]["dump"];
    assert_eq!(dump["free_bytes"], 102_760_448u64);
    assert_eq!(
        dump["fragmentation_oom"], true,
        "free bytes equal the request, split in 3 chunks"
    );
}

#[test]
fn compare_replays_bfc_at_tensorflows_addresses_and_reaches_its_oom() {
    let p = tf("mobilenetv2_oom_memlog_dump.txt.gz");
    let v = json(&[
        "compare",
        "--json",
        "--policy",
        "bfc,first-fit",
        "--limit",
        "512MiB",
        p.to_str().unwrap(),
    ]);
    let bfc = &v["policies"][0];
    assert_eq!(bfc["name"], "bfc");
    assert_eq!(bfc["replay"], "checkpoint");
    assert!(
        bfc["checkpoint"]["reason"]
            .as_str()
            .unwrap()
            .contains("never shows")
    );
    let f = &bfc["fidelity"];
    assert_eq!(f["checked"], 20_370);
    assert_eq!(f["address_matches"], 20_370);
    assert_eq!(f["size_matches"], 20_370);
    assert!(f["first_divergence"].is_null());
    let oom = &bfc["first_oom"];
    for (k, want) in [
        ("request_bytes", 102_760_448u64),
        ("rounded_bytes", 102_760_448),
        ("in_use_chunks", 2706),
        ("in_use_bytes", 432_013_312),
        ("free_chunks", 3),
        ("free_bytes", 102_760_448),
        ("regions", 8),
        ("region_bytes", 534_773_760),
    ] {
        assert_eq!(oom[k], want, "first_oom.{k}");
    }
    assert!(oom["event"].is_u64());
    assert_eq!(oom["dump_comparison"]["all_identical"], true);
    assert_eq!(oom["dump_comparison"]["identical"], 2709);
    assert_eq!(v["policies"][1]["name"], "first-fit");

    // From process start the log's missing allocations make the replay diverge at once.
    let v = json(&[
        "compare",
        "--json",
        "--policy",
        "bfc",
        "--from-start",
        p.to_str().unwrap(),
    ]);
    let f = &v["policies"][0]["fidelity"];
    assert_eq!(v["policies"][0]["replay"], "process-start");
    assert!(!f["first_divergence"].is_null());
    assert!(f["address_matches"].as_u64().unwrap() < f["checked"].as_u64().unwrap() / 10);
}

#[test]
fn compare_on_the_training_log_matches_tensorflows_own_peak() {
    let p = tf("mobilenetv2_train_memlog.txt.gz");
    let v = json(&["compare", "--json", "--policy", "bfc", p.to_str().unwrap()]);
    let bfc = &v["policies"][0];
    let f = &bfc["fidelity"];
    assert_eq!(f["address_matches"], f["checked"]);
    assert_eq!(f["checked"], 19_805);
    assert_eq!(f["regions_match"], true);
    let peak_tf = f["meminfo"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["tf_peak_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(peak_tf, 1_191_003_136);
    assert_eq!(f["peak_bytes_in_use"], 1_191_003_136u64);
}

#[test]
fn a_dump_is_not_an_event_trace_and_the_error_says_what_reads_it() {
    let p = tf("public_alexnet-k40c-2017.txt");
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["compare", p.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("BFC dump") && err.contains("allocview stats"),
        "{err}"
    );
    // But stats reads it, old format and all.
    let v = json(&["stats", "--json", p.to_str().unwrap()]);
    assert_eq!(v["dump_format"], "old");
    assert_eq!(v["in_use_bytes"], 208_404_480u64);
}

/// `stats` on a memory log shows every get_memory_info reading with where it was taken (the
/// first, after the model was built, is far below the run's peak), and `--json` lists them.
#[test]
fn stats_says_where_each_get_memory_info_reading_was_taken() {
    let p = tf("mobilenetv2_train_memlog.txt.gz");
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["stats", p.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("own peak"), "{text}");
    let readings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("get_memory_info"))
        .collect();
    assert_eq!(readings.len(), 4, "{text}");
    assert!(readings[0].contains("after_build at line 1,101, after 1,054 of 66,608 events"));
    assert!(readings[3].contains("after_train_step_2"));
    let v = json(&["stats", "--json", p.to_str().unwrap()]);
    let m = v["tf"]["meminfo"].as_array().unwrap();
    assert_eq!(m.len(), 4);
    assert_eq!(m[0]["tag"], "after_build");
    assert_eq!(m[0]["events_before"], 1054);
    assert_eq!(v["tf"]["meminfo_peak_bytes"], m[3]["peak_bytes"]);
}
