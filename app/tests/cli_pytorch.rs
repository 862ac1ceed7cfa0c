//! PyTorch snapshots through the commands, as a user runs them: `stats`, `compare` with its
//! fidelity block and what-if variants, and `convert` saying what it reads.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{json, run, snapshot};

#[test]
fn stats_describes_the_snapshot() {
    let v = json(&["stats", &snapshot("lm_train_step_b"), "--json"]);
    assert_eq!(v["format"], "pytorch-snapshot");
    let p = &v["pytorch"];
    // The data set's README: 96 segments of 4,238,344,192 B, 550 blocks, 2,162 of each entry.
    assert_eq!(p["at_snapshot"]["segments"], 96);
    assert_eq!(p["at_snapshot"]["blocks"], 550);
    assert_eq!(p["at_snapshot"]["reserved_bytes"], 4_238_344_192u64);
    for action in ["alloc", "free_requested", "free_completed"] {
        assert_eq!(p["entries"][action], 2162, "{action}");
    }
    assert_eq!(p["allocator_settings"]["max_split_size"], "-1");
    assert_eq!(p["annotations"].as_array().unwrap().len(), 2);
    // No segment was made or freed in the trace: the reserved bytes never changed.
    assert_eq!(p["peaks"]["reserved_bytes"], 4_238_344_192u64);
    assert_eq!(p["start_reserved_bytes"], 4_238_344_192u64);
    let largest = p["largest_allocations"].as_array().unwrap();
    let sizes: Vec<u64> = largest
        .iter()
        .map(|a| a["size_bytes"].as_u64().unwrap())
        .collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]));
    assert!(!p["top_stacks"].as_array().unwrap().is_empty());
}

#[test]
fn compare_reports_fidelity_and_runs_variants() {
    let snap = snapshot("lm_train_step_a");
    let v = json(&[
        "compare",
        &snap,
        "--json",
        "--policy",
        "pytorch,pytorch:start=empty,pytorch:expandable_segments=true,bfc:allow_growth=false,buddy:min_block=4096",
    ]);
    let rows = v["policies"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "pytorch",
            "pytorch:start=empty",
            "pytorch:expandable_segments=true",
            "bfc:allow_growth=false",
            "buddy:min_block=4096"
        ]
    );
    let f = &rows[0]["fidelity"];
    assert_eq!(f["checked"], 6488);
    assert_eq!(f["address_matches"], 6488);
    assert_eq!(f["segment_allocs_checked"], 0);
    assert_eq!(f["segment_alloc_matches"], 0);
    assert!(f["first_divergence"].is_null());
    assert_eq!(f["divergences"], 0);
    // From the rebuilt start the footprint is what the snapshot's segments held.
    assert_eq!(rows[0]["peak_footprint_bytes"], 23_842_521_088u64);
    // Variants run from an empty allocator and make their own segments.
    assert!(rows[1].get("fidelity").is_none());
    assert!(rows[1]["segments"]["segment_alloc"].as_u64().unwrap() > 0);
    assert!(rows[2]["segments"]["segment_map"].as_u64().unwrap() > 0);
    let foot = |i: usize| rows[i]["peak_footprint_bytes"].as_u64().unwrap();
    assert!(foot(2) < foot(1), "expandable segments waste less here");
    // A typo is refused before anything replays, naming what is known.
    let out = run(&["compare", &snap, "--policy", "pytorch:max_split=1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_split_size_mb"), "{err}");
}

#[test]
fn convert_says_what_it_reads() {
    let dir = std::env::temp_dir().join(format!("allocview-ptconv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_file = dir.join("x.avt");
    let out = run(&[
        "convert",
        &snapshot("lm_train_step_b"),
        out_file.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is a PyTorch memory snapshot"), "{err}");
    assert!(!out_file.exists());
    std::fs::remove_dir_all(&dir).ok();
}

/// The replay of a snapshot's recorded run applies no limit (the recorded releases stand in for
/// it): under any `--limit` it has no OOM, and the row says so, in the table and in `--json`,
/// instead of reading as "fits in 1 GiB". Where its figures come from is said too.
#[test]
fn snapshot_row_says_the_limit_is_not_applied_and_where_its_figures_come_from() {
    let snap = snapshot("lm_train_step_a");
    let v = json(&[
        "compare", &snap, "--json", "--policy", "pytorch", "--limit", "1GiB",
    ]);
    let row = &v["policies"][0];
    assert_eq!(row["ooms"], 0, "the recorded replay ignores the limit");
    assert_eq!(row["limit_applied"], false, "{row}");
    assert!(
        row["limit_note"].as_str().unwrap().contains("1.00 GiB"),
        "{row}"
    );
    // No divergence here: the figures are the model's, from the recorded start state.
    assert_eq!(row["figures_follow_recording"], false, "{row}");
    assert!(
        row["figures_note"].as_str().unwrap().contains("recorded"),
        "{row}"
    );
    // A variant from an empty allocator applies the limit and has no such fields.
    let v = json(&[
        "compare",
        &snap,
        "--json",
        "--policy",
        "pytorch:start=empty",
        "--limit",
        "1GiB",
    ]);
    assert!(v["policies"][0].get("limit_applied").is_none());
    assert!(v["policies"][0]["ooms"].as_u64().unwrap() > 0);

    let out = run(&["compare", &snap, "--policy", "pytorch", "--limit", "1GiB"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--limit 1.00 GiB is not applied"),
        "the table's note says the limit is ignored: {text}"
    );
}
