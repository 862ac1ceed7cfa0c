//! `allocview tune` against brute force: every combination of the family's keys and values
//! replayed by `compare`, the best picked by the same rule; and the proof, `compare` with the
//! printed variant under the limit.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{json, sample, snapshot};

use allocview::answers::tune::space;
use serde_json::Value;

/// Every combination of `family`'s keys (each set to one of its values, or left out).
fn grid(family: &str) -> Vec<Vec<(String, String)>> {
    let mut out: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (k, vs) in space(family) {
        let mut next = Vec::new();
        for c in &out {
            next.push(c.clone());
            for v in &vs {
                let mut with = c.clone();
                with.push((k.to_owned(), (*v).to_owned()));
                next.push(with);
            }
        }
        out = next;
    }
    out
}

/// The best of the grid under `limit` by brute force: `(keys changed, peak footprint)` of
/// the best fitting combination, replayed by `compare`.
fn brute_force(file: &str, family: &str, base: &str, limit: u64) -> Option<(usize, u64)> {
    let grid = grid(family);
    let variants: Vec<String> = grid
        .iter()
        .map(|c| {
            std::iter::once(base.to_owned())
                .chain(c.iter().map(|(k, v)| format!("{k}={v}")))
                .collect::<Vec<_>>()
                .join(":")
        })
        .collect();
    let v = json(&[
        "compare",
        file,
        "--json",
        "--policy",
        &variants.join(","),
        "--limit",
        &limit.to_string(),
    ]);
    let rows = v["policies"].as_array().unwrap();
    assert_eq!(rows.len(), variants.len());
    grid.iter()
        .zip(rows)
        .filter(|(_, r)| r["ooms"] == 0)
        .map(|(c, r)| (c.len(), r["peak_footprint_bytes"].as_u64().unwrap()))
        .min()
}

fn tune(file: &str, limit: u64) -> Value {
    json(&["tune", file, "--json", "--limit", &limit.to_string()])
}

#[test]
fn tune_finds_what_brute_force_finds_on_a_snapshot() {
    let file = snapshot("lm_train_step_b");
    // Limits where the default fits, where only some settings do, and where none does.
    for limit in [4u64 << 30, 3_800 << 20, 3_600 << 20] {
        let t = tune(&file, limit);
        let want = brute_force(&file, "pytorch", "pytorch:start=empty", limit);
        assert_eq!(t["fits"], want.is_some(), "{limit}: {t}");
        if let Some((keys, peak)) = want {
            let best = &t["best"];
            assert_eq!(best["changed"].as_array().unwrap().len(), keys, "{limit}");
            assert_eq!(best["peak_footprint_bytes"], peak, "{limit}");
            assert_eq!(best["ooms"], 0);
            // The proof: compare replays the printed variant under the limit with no OOM.
            let policy = best["policy"].as_str().unwrap();
            let proof = json(&[
                "compare",
                &file,
                "--json",
                "--policy",
                policy,
                "--limit",
                &limit.to_string(),
            ]);
            assert_eq!(proof["policies"][0]["ooms"], 0, "{policy}");
            assert!(
                best["env"]
                    .as_str()
                    .unwrap()
                    .starts_with("PYTORCH_CUDA_ALLOC_CONF=")
                    || keys == 0
            );
        } else {
            // Nothing fits: each setting's smallest limit, above the one asked for.
            let mins = t["min_limits"].as_array().unwrap();
            assert!(!mins.is_empty());
            for m in mins {
                assert!(m["min_limit_bytes"].as_u64().unwrap() > limit, "{m}");
            }
            // What the peak must lose for the least demanding one, and where those bytes are.
            let least = mins
                .iter()
                .map(|m| m["min_limit_bytes"].as_u64().unwrap())
                .min()
                .unwrap();
            let shrink = &t["shrink"];
            assert_eq!(shrink["bytes"].as_u64().unwrap(), least - limit);
            let held: u64 = shrink["sites"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["live_bytes"].as_u64().unwrap())
                .sum();
            assert!(held >= least - limit, "{shrink}");
            let lost: u64 = shrink["sites"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["shrink_bytes"].as_u64().unwrap())
                .sum();
            assert_eq!(lost, least - limit, "{shrink}");
        }
        assert!(t["replays"].as_u64().unwrap() < grid("pytorch").len() as u64);
    }
}

#[test]
fn tune_finds_what_brute_force_finds_on_a_malloc_trace() {
    let file = sample("python_fragments.trace.gz");
    let file = file.to_str().unwrap();
    let unlimited = json(&["tune", file, "--json"]);
    // Without a limit every setting fits; the lowest peak comes first.
    let floor = unlimited["best"]["peak_footprint_bytes"].as_u64().unwrap();
    for limit in [floor, floor + (1 << 20)] {
        let t = tune(file, limit);
        let want = brute_force(file, "glibc", "glibc", limit);
        let best = &t["best"];
        let (keys, peak) = want.unwrap();
        assert_eq!(best["changed"].as_array().unwrap().len(), keys);
        assert_eq!(best["peak_footprint_bytes"], peak);
    }
    assert_eq!(tune(file, floor - 1)["fits"], false);
}

#[test]
fn tune_searches_a_real_allocator_s_settings_by_its_measured_rss() {
    let file = sample("python_fragments.trace.gz");
    let file = file.to_str().unwrap();
    let t = json(&["tune", file, "--json", "--policy", "real-jemalloc"]);
    let (best, default) = (&t["best"], &t["default"]);
    // Returning freed pages at once lowers the peak by far more than runs differ (13% here).
    let changed: Vec<&str> = best["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kv| kv[0].as_str().unwrap())
        .collect();
    assert!(changed.contains(&"dirty_decay_ms"), "{t}");
    assert!(
        best["peak_footprint_bytes"].as_u64().unwrap()
            < default["peak_footprint_bytes"].as_u64().unwrap()
    );
    assert!(
        best["env"]
            .as_str()
            .unwrap()
            .contains("MALLOC_CONF=dirty_decay_ms:")
    );
    // Under a limit no replay stays below, nothing fits, and each needs its own peak RSS.
    let t = json(&[
        "tune",
        file,
        "--json",
        "--policy",
        "real-jemalloc",
        "--limit",
        "1MiB",
    ]);
    assert_eq!(t["fits"], false);
    for m in t["min_limits"].as_array().unwrap() {
        assert!(m["min_limit_bytes"].as_u64().unwrap() > 1 << 20);
    }
}
