//! Sampled stacks (`record --stack-sample`): a C program with a known allocation pattern and a
//! Python one, recorded with stacks sampled by bytes. Every event is kept (counts and peak
//! equal a `--no-stacks` recording); few stacks are walked; the estimates by site fall within
//! five standard deviations of the truth, the deviation derived from the estimator's variance;
//! allocations of the interval or more always have their stack.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use allocview_loaders::{LoadOptions, Loaded, MallocTrace};
use serde_json::Value;

use common::{build_c, fails, json, ok, run};

const R_BYTES: f64 = 512.0 * 1024.0;

/// Site A: 200,000 blocks of 1 KiB; B: 2,000 of 256 KiB; C: 50 of 4 MiB; each site keeps its
/// last 32 blocks live (a ring), so the peak is known and the run stays small.
const PATTERN_C: &str = r#"
#include <stdlib.h>
#define RING 32
static void *ring[3][RING];
__attribute__((noinline)) void *site_a(void) { return malloc(1024); }
__attribute__((noinline)) void *site_b(void) { return malloc(256 * 1024); }
__attribute__((noinline)) void *site_c(void) { return malloc(4 << 20); }
static void run(int which, long n, void *(*f)(void)) {
    for (long i = 0; i < n; i++) {
        void **slot = &ring[which][i % RING];
        free(*slot);
        *slot = f();
    }
}
int main(void) {
    run(0, 200000, site_a);
    run(1, 2000, site_b);
    run(2, 50, site_c);
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < RING; i++) free(ring[w][i]);
    return 0;
}
"#;

/// The sites' (name, blocks, bytes each).
const SITES: [(&str, u64, u64); 3] = [
    ("site_a", 200_000, 1024),
    ("site_b", 2_000, 256 << 10),
    ("site_c", 50, 4 << 20),
];

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("record-sampled-{name}"));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn load(path: &Path) -> MallocTrace {
    let Loaded::MallocTrace(t) = allocview_loaders::load(path, &LoadOptions::default()).unwrap()
    else {
        panic!("{} is not a malloc trace", path.display());
    };
    t
}

/// Events of each kind (allocations, frees) and the peak of live bytes.
fn counts_and_peak(path: &Path, t: &MallocTrace) -> (usize, usize, u64) {
    let view = allocview_loaders::trace_view(&t.events, path).unwrap();
    let kinds = t.events.column("kind").unwrap().u8().unwrap();
    let allocs = kinds.iter().filter(|k| *k == Some(0)).count();
    (allocs, t.events.height() - allocs, view.peak_live().0)
}

/// The probability that the tracer walks an allocation of `s` bytes.
fn p_sampled(s: f64) -> f64 {
    if s >= R_BYTES {
        1.0
    } else {
        1.0 - (-s / R_BYTES).exp()
    }
}

/// The standard deviation of the byte estimate of `n` allocations of `s` bytes:
/// the estimator sums `s/p` over the sampled ones, each a Bernoulli(p) draw, so its variance
/// is `n * (s/p)^2 * p(1-p) = n * s^2 * (1-p)/p`.
fn bytes_sd(n: u64, s: u64) -> f64 {
    let p = p_sampled(s as f64);
    (n as f64 * (s as f64).powi(2) * (1.0 - p) / p).sqrt()
}

fn site<'a>(rows: &'a Value, name: &str) -> &'a Value {
    rows["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no site {name} in {rows}"))
}

#[test]
fn sampled_stacks_keep_every_event_and_estimate_sites_without_bias() {
    let dir = scratch("c");
    let exe = build_c(&dir, "pattern", PATTERN_C);
    let exe = exe.to_str().unwrap();
    let full = dir.join("none.avt");
    let sampled = dir.join("sampled.avt");
    ok(&[
        "record",
        "--no-stacks",
        "-o",
        full.to_str().unwrap(),
        "--",
        exe,
    ]);
    let out = run(&[
        "record",
        "--stack-sample",
        "512KiB",
        "-o",
        sampled.to_str().unwrap(),
        "--",
        exe,
    ]);
    assert!(out.status.success(), "{out:?}");

    // Every event is there: the same counts and peak as without stacks.
    let (t_none, t_sampled) = (load(&full), load(&sampled));
    let (allocs, frees, peak) = counts_and_peak(&sampled, &t_sampled);
    assert_eq!((allocs, frees, peak), counts_and_peak(&full, &t_none));
    let pattern_allocs: u64 = SITES.iter().map(|s| s.1).sum();
    assert!(allocs as u64 >= pattern_allocs, "{allocs} allocations");
    // The ring keeps 32 blocks of each site: the peak is when C's ring is full.
    assert!(peak >= 32 * (1024 + (256 << 10) + (4 << 20)), "{peak}");

    // Few stacks walked: about n p of each site's n blocks.
    let ids = t_sampled.events.column("stack_id").unwrap().u32().unwrap();
    let walked = ids.iter().flatten().count() as f64;
    let expected: f64 = SITES
        .iter()
        .map(|&(_, n, s)| n as f64 * p_sampled(s as f64))
        .sum();
    let var: f64 = SITES
        .iter()
        .map(|&(_, n, s)| n as f64 * p_sampled(s as f64) * (1.0 - p_sampled(s as f64)))
        .sum();
    // A few allocations of the C library's own (stdio) are walked too.
    assert!(
        (walked - expected).abs() < 5.0 * var.sqrt() + 20.0,
        "{walked} stacks walked, {expected:.0} expected"
    );
    assert!(
        walked * 100.0 < allocs as f64,
        "{walked} of {allocs} walked"
    );

    // The estimates by site, over the whole run.
    let rows = json(&["sites", sampled.to_str().unwrap(), "--at", "end", "--json"]);
    assert_eq!(rows["stack_sample_bytes"], 512 * 1024);
    assert_eq!(rows["estimated"], true);
    for (name, n, s) in SITES {
        let r = site(&rows, name);
        let est = r["alloc_bytes"].as_f64().unwrap();
        let truth = (n * s) as f64;
        let sd = bytes_sd(n, s);
        assert!(
            (est - truth).abs() <= 5.0 * sd + 1.0,
            "{name}: estimated {est}, truly {truth}, sd {sd:.0}"
        );
        let count = r["alloc_count"].as_f64().unwrap();
        assert!(
            (count - n as f64).abs() <= 5.0 * sd / s as f64 + 1.0,
            "{name}: {count} allocations estimated, {n} made"
        );
    }
    // 4 MiB is at least the interval: every such block has its stack, counted once.
    let c = site(&rows, "site_c");
    assert_eq!(c["alloc_bytes"], 50 * (4 << 20));
    assert_eq!(c["alloc_count"], 50);
    let sizes = t_sampled
        .events
        .column("size_bytes")
        .unwrap()
        .u64()
        .unwrap();
    let kinds = t_sampled.events.column("kind").unwrap().u8().unwrap();
    // Allocations (kind 0): frees carry their block's size too, and never a stack.
    let big_without = (0..t_sampled.events.height())
        .filter(|&i| kinds.get(i) == Some(0) && sizes.get(i) == Some(4 << 20))
        .filter(|&i| ids.get(i).is_none())
        .count();
    assert_eq!(big_without, 0);

    // The reports say the figures are estimates; the folded stacks weigh the same way.
    let text = ok(&["sites", sampled.to_str().unwrap(), "--at", "end"]);
    assert!(text.contains("estimates from sampled stacks"), "{text}");
    let folded = run(&[
        "flamegraph",
        sampled.to_str().unwrap(),
        "--folded",
        "--metric",
        "allocated",
    ]);
    let stderr = String::from_utf8_lossy(&folded.stderr);
    assert!(stderr.contains("estimates from sampled stacks"), "{stderr}");
    let b_bytes: f64 = String::from_utf8_lossy(&folded.stdout)
        .lines()
        .filter(|l| l.contains("site_b"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let truth = 2_000.0 * 262_144.0;
    assert!(
        (b_bytes - truth).abs() <= 5.0 * bytes_sd(2_000, 256 << 10) + 2.0,
        "site_b folded {b_bytes}"
    );
}

#[test]
fn stack_sample_refuses_what_cannot_hold_stacks() {
    for (flag, says) in [("--no-stacks", "--no-stacks"), ("--text", "--text")] {
        let err = fails(&["record", "--stack-sample", "512KiB", flag, "--", "true"]);
        assert!(
            err.contains("--stack-sample") && err.contains(says),
            "{err}"
        );
    }
    let err = fails(&["record", "--stack-sample", "0", "--", "true"]);
    assert!(err.contains("at least 1 byte"), "{err}");
    let err = fails(&["record", "--stack-sample", "12 parsecs", "--", "true"]);
    assert!(err.contains("unknown unit"), "{err}");
}

/// Python with its frames in the sampled stacks: two functions of known allocations.
#[test]
fn python_sites_are_estimated_from_sampled_hybrid_stacks() {
    let Some(python) = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| std::process::Command::new(p).arg("-V").output().is_ok())
    else {
        panic!("python3 must be installed");
    };
    let dir = scratch("py");
    let script = dir.join("two_sites.py");
    std::fs::write(
        &script,
        // A loop, not a comprehension: before Python 3.12 that is a function of its own.
        "def small():\n    out = []\n    for _ in range(50):\n        out.append(bytearray(4000))\n    return out\n\
         def big():\n    return bytearray(1 << 20)\n\
         for _ in range(400):\n    small()\n\
         for _ in range(200):\n    big()\n",
    )
    .unwrap();
    let out = dir.join("py.avt");
    ok(&[
        "record",
        "--stack-sample",
        "64KiB",
        "-o",
        out.to_str().unwrap(),
        "--",
        python,
        script.to_str().unwrap(),
    ]);
    let rows = json(&["sites", out.to_str().unwrap(), "--at", "end", "--json"]);
    assert_eq!(rows["stack_sample_bytes"], 64 * 1024);
    let r = 65_536.0;
    // big(): 200 blocks of 1 MiB (and a small object header each), all sampled.
    let big = site(&rows, "big")["alloc_bytes"].as_f64().unwrap();
    assert!(big >= 200.0 * 1_048_576.0, "{big}");
    assert!(big < 200.0 * 1_048_576.0 * 1.01, "{big}");
    // small(): 20,000 buffers of 4,001 bytes; besides them, list and object headers of some
    // 60 bytes each, 2% more at most.
    let small = site(&rows, "small")["alloc_bytes"].as_f64().unwrap();
    let (n, s) = (20_000.0, 4_001.0);
    let p = 1.0 - f64::exp(-s / r);
    let sd = (n * s * s * (1.0 - p) / p).sqrt();
    let truth = n * s;
    assert!(
        small > truth - 5.0 * sd && small < truth * 1.02 + 5.0 * sd,
        "small(): estimated {small}, buffers {truth}, sd {sd:.0}"
    );
}
