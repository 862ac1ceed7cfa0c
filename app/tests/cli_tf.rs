//! The commands on real TensorFlow output (committed fixtures; no TensorFlow needed).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{json, ok};

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn tf(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../loaders/tests/data/tf")
        .join(name)
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
    assert_eq!(bfc["name"], "bfc@checkpoint");
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

/// A tiny memory log whose OOM the replay reproduces only by holding back another thread's
/// free: one 2 MiB region holds ids 1 and 2 (1 MiB each); thread 2 logs the free of id 1, then
/// thread 1's request of 1 MiB fails in TensorFlow (the free had not taken effect). Applied at
/// once, the free makes room and the request fits.
fn held_back_oom_log(dir: &Path) -> PathBuf {
    let alloc = |id: u64, ptr: u64| {
        format!(
            "I0000 00:00:2.{id:06} 1 log_memory.cc:34] __LOG_MEMORY__ MemoryLogTensorAllocation {{ \
             step_id: 1 kernel_name: \"k\" tensor {{ dtype: DT_FLOAT shape {{ }} \
             allocation_description {{ requested_bytes: 1048576 allocated_bytes: 1048576 \
             allocator_name: \"A_bfc\" allocation_id: {id} ptr: {ptr} }} }} }}\n"
        )
    };
    let mut text = String::from(
        "I0000 00:00:1.000000 1 bfc_allocator.cc:176] Extending allocation by 2.00MiB bytes for A_bfc.\n\
         I0000 00:00:1.000001 1 bfc_allocator.cc:186] Allocated memory at 0x100000 to 0x300000\n",
    );
    text.push_str(&alloc(1, 0x10_0000));
    text.push_str(&alloc(2, 0x20_0000));
    text.push_str(
        "I0000 00:00:2.000003 2 log_memory.cc:34] __LOG_MEMORY__ MemoryLogTensorDeallocation { \
         allocation_id: 1 allocator_name: \"A_bfc\" }\n\
         W0000 00:00:2.000004 1 bfc_allocator.cc:502] Allocator (A_bfc) ran out of memory trying \
         to allocate 1.00MiB (rounded to 1048576)requested by op k\n\
         I0000 00:00:2.000005 1 bfc_allocator.cc:1056] Bin (256): \tTotal Chunks: 0, Chunks in use: 0. \
         0B allocated for chunks. 0B in use in bin. 0B client-requested in use in bin.\n\
         I0000 00:00:2.000006 1 bfc_allocator.cc:1092] Next region of size 2097152\n\
         I0000 00:00:2.000007 1 bfc_allocator.cc:1105] InUse at 100000 of size 1048576 next 1\n\
         I0000 00:00:2.000008 1 bfc_allocator.cc:1105] InUse at 200000 of size 1048576 next 18446744073709551615\n\
         I0000 00:00:2.000009 1 bfc_allocator.cc:1116] Sum Total of in-use chunks: 2.00MiB\n",
    );
    let path = dir.join("held_back_oom.txt");
    std::fs::write(&path, text).unwrap();
    path
}

/// TensorFlow's OOM reproduced by holding back another thread's free is a guided result, and
/// the row says so (with how many frees were held back); without guidance it is not
/// reproduced, and the row says that too.
#[test]
fn an_oom_reproduced_by_holding_back_frees_is_said_to_be_guided() {
    let dir = tempfile::tempdir().unwrap();
    let log = held_back_oom_log(dir.path());
    let log = log.to_str().unwrap();
    let base = ["compare", "--policy", "bfc", "--limit", "2MiB", log];
    let v = json(&[&base[..], &["--json"]].concat());
    let f = &v["policies"][0]["fidelity"];
    assert_eq!(f["logged_oom_reproduced"], true, "{f}");
    assert_eq!(f["logged_oom_reproduced_with_guidance"], true, "{f}");
    assert_eq!(f["logged_oom_held_back_frees"], 1, "{f}");
    let text = ok(&base);
    assert!(
        text.contains(
            "TensorFlow's OOM reproduced only with guidance: 1 other thread's free held back"
        ),
        "{text}"
    );
    let v = json(&[&base[..], &["--json", "--no-guidance"]].concat());
    let f = &v["policies"][0]["fidelity"];
    assert_eq!(f["logged_oom_reproduced"], false, "{f}");
    assert_eq!(f["logged_oom_reproduced_with_guidance"], false, "{f}");
    let text = ok(&[&base[..], &["--no-guidance"]].concat());
    assert!(text.contains("TensorFlow's OOM not reproduced"), "{text}");
}

/// On the real OOM log the OOM is reproduced with no free held back, under guidance of
/// other kinds (raw chunk sizes): the line says it was guided all the same.
#[test]
fn the_real_oom_log_says_how_its_oom_was_reproduced() {
    let p = tf("mobilenetv2_oom_memlog_dump.txt.gz");
    let text = ok(&[
        "compare",
        "--policy",
        "bfc",
        "--limit",
        "512MiB",
        p.to_str().unwrap(),
    ]);
    assert!(
        text.contains("TensorFlow's OOM reproduced with guidance (no free held back"),
        "{text}"
    );
}

/// `compare --min-limit --no-guidance` searches the replay without guidance: its minimum is
/// tight for `compare --limit N --no-guidance`.
#[test]
fn min_limit_honours_no_guidance() {
    let dir = tempfile::tempdir().unwrap();
    let log = held_back_oom_log(dir.path());
    let log = log.to_str().unwrap();
    // OOMs under `limit`; a limit below what the log's regions already hold at the checkpoint
    // cannot be replayed at all, and compare says so: that does not fit either.
    let ooms = |limit: u64, extra: &[&str]| {
        let l = limit.to_string();
        let args = [
            &["compare", "--json", "--policy", "bfc", "--limit", &l, log][..],
            extra,
        ]
        .concat();
        let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
            .args(&args)
            .output()
            .unwrap();
        if !out.status.success() {
            let e = String::from_utf8_lossy(&out.stderr);
            assert!(e.contains("more than the limit"), "{args:?}: {e}");
            return u64::MAX;
        }
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["policies"][0]["ooms"].as_u64().unwrap()
    };
    for extra in [&[][..], &["--no-guidance"][..]] {
        let v = json(
            &[
                &["compare", "--json", "--min-limit", "--policy", "bfc", log][..],
                extra,
            ]
            .concat(),
        );
        let min = v["policies"][0]["min_limit_bytes"].as_u64().unwrap();
        assert_eq!(ooms(min, extra), 0, "{extra:?} at {min}");
        assert!(ooms(min - 1, extra) > 0, "{extra:?} at {}", min - 1);
    }
}

/// On a TensorFlow memory log, `compare`'s replay at TensorFlow's addresses is not the
/// simulated `bfc` that `report`, the explorers and `--parquet` run: its row has its own name.
#[test]
fn the_replay_at_tensorflows_addresses_is_named_apart_from_simulated_bfc() {
    let p = tf("mobilenetv2_infer_memlog.txt.gz");
    let p = p.to_str().unwrap();
    let v = json(&["compare", "--json", "--policy", "bfc,first-fit", p]);
    assert_eq!(v["policies"][0]["name"], "bfc@checkpoint");
    assert_eq!(v["policies"][0]["replay"], "checkpoint");
    assert_eq!(v["policies"][1]["name"], "first-fit");
    let v = json(&["compare", "--json", "--policy", "bfc", "--from-start", p]);
    assert_eq!(v["policies"][0]["name"], "bfc@process-start");
    let text = ok(&["compare", "--policy", "bfc", p]);
    assert!(text.contains("  bfc@checkpoint "), "{text}");
    // A variant of bfc is simulated, like every other policy, under its own label.
    let v = json(&["compare", "--json", "--policy", "bfc:allow_growth=true", p]);
    assert_eq!(v["policies"][0]["name"], "bfc:allow_growth=true");
    assert!(v["policies"][0].get("replay").is_none());
}
