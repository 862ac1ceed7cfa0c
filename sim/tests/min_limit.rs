//! `min_limit` against brute force: on small traces, every limit below the answer (each byte
//! near it, a fine stride further down to the peak live bytes) must fail and the answer must
//! work, for every registered policy, in the regimes where the limit steers the policy (BFC's
//! growth, PyTorch's segment release, glibc's mmap fallback).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use allocview_sim::min_limit::{Method, limit_granule_bytes, min_limit, run_until_failure, search};
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry::{POLICY_NAMES, build};
use allocview_sim::testing::{Op, ops_to_trace};
use allocview_sim::trace::{OwnedTrace, TraceView};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// A deterministic workload of `n` ops with sizes from 1 B to `max_bytes`.
fn workload(n: usize, seed: u64, max_bytes: u64) -> OwnedTrace {
    let mut x = seed;
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let r = x >> 33;
        if r % 5 < 3 {
            ops.push(Op::Alloc {
                size_bytes: 1 + (r >> 3) % max_bytes,
            });
        } else {
            ops.push(Op::Free {
                victim: (r >> 4) as usize,
            });
        }
    }
    ops_to_trace(&ops)
}

fn works(view: &TraceView<'_>, name: &str, config: &PolicyConfig, limit: u64) -> bool {
    let cfg = PolicyConfig {
        limit_bytes: Some(limit),
        ..config.clone()
    };
    build(name, &cfg, view).is_ok_and(|p| {
        run_until_failure(view, p, cfg.align_bytes)
            .first_failure
            .is_none()
    })
}

/// Checks the answer of `min_limit` by brute force and returns it.
fn check(name: &str, config: &PolicyConfig, trace: &OwnedTrace, window_bytes: u64) -> u64 {
    let view = trace.view().unwrap();
    let found = min_limit(&view, name, config).unwrap();
    let answer = found
        .min_limit_bytes
        .unwrap_or_else(|| panic!("{name}: no limit works"));
    assert!(works(&view, name, config, answer), "{name}: {answer} fails");
    let peak_live = view.peak_live().0;
    assert!(answer >= peak_live, "{name}: {answer} below peak live");
    let near = answer.saturating_sub(window_bytes).max(peak_live);
    for limit in near..answer {
        assert!(
            !works(&view, name, config, limit),
            "{name}: {limit} works, below the answer {answer} ({:?})",
            found.method
        );
    }
    let stride = ((near - peak_live) / 2000).max(1);
    for limit in (peak_live..near).step_by(stride as usize) {
        assert!(
            !works(&view, name, config, limit),
            "{name}: {limit} works, below the answer {answer} ({:?})",
            found.method
        );
    }
    answer
}

fn small_config() -> PolicyConfig {
    PolicyConfig {
        buddy_min_block_bytes: 16,
        buddy_max_order: 8,
        pool_block_bytes: 4 * KIB,
        ..PolicyConfig::default()
    }
}

#[test]
fn every_policy_matches_brute_force_on_small_traces() {
    for seed in [1, 7, 42] {
        let trace = workload(60, seed, 3 * KIB);
        for name in POLICY_NAMES {
            check(name, &small_config(), &trace, 8 * KIB);
        }
    }
}

#[test]
fn gate_policies_need_their_unlimited_peak() {
    let trace = workload(80, 3, 2 * KIB);
    let view = trace.view().unwrap();
    for name in ["first-fit", "best-fit", "buddy", "pool", "oracle"] {
        let found = min_limit(&view, name, &small_config()).unwrap();
        assert_eq!(found.method, Method::UnlimitedPeak, "{name}");
        let unlimited = build(name, &small_config(), &view).unwrap();
        let peak = run_until_failure(&view, unlimited, 16).peak_footprint_bytes;
        assert_eq!(found.min_limit_bytes, Some(peak), "{name}");
    }
}

#[test]
fn bfc_growth_is_searched() {
    // Requests of up to 6 MiB make BFC grow regions of 2, 4, 8 MiB ... capped by the limit.
    for seed in [5, 11] {
        let trace = workload(40, seed, 6 * MIB);
        let view = trace.view().unwrap();
        let answer = check("bfc", &PolicyConfig::default(), &trace, 4 * KIB);
        let found = min_limit(&view, "bfc", &PolicyConfig::default()).unwrap();
        assert_eq!(found.method, Method::Search);
        // The cap on the last region makes the answer smaller than the unlimited peak.
        let unlimited = build("bfc", &PolicyConfig::default(), &view).unwrap();
        let peak = run_until_failure(&view, unlimited, 16).peak_footprint_bytes;
        assert!(answer < peak, "bfc: {answer} vs unlimited peak {peak}");
    }
}

#[test]
fn pytorch_and_glibc_are_searched() {
    let trace = workload(50, 9, 30 * MIB);
    check("pytorch", &PolicyConfig::default(), &trace, 4 * KIB);
    let trace = workload(200, 13, 600 * KIB);
    check("glibc", &PolicyConfig::default(), &trace, 4 * KIB);
}

#[test]
fn probes_find_a_lower_working_window() {
    // Works on 11..=30 and from 1000 up: bisection from 1000 alone would answer 1000.
    let found = search(Some(10), 1000, |l| {
        Ok::<_, ()>((11..=30).contains(&l) || l >= 1000)
    })
    .unwrap();
    assert_eq!(found.min_limit_bytes, Some(11));
    assert!(
        found
            .larger_limit_failing
            .is_some_and(|l| (31..1000).contains(&l))
    );
}

#[test]
fn monotone_search_is_exact() {
    for target in [0u64, 1, 2, 777, 4096, 1 << 40] {
        let found = search(None, 5, |l| Ok::<_, ()>(l >= target)).unwrap();
        assert_eq!(found.min_limit_bytes, Some(target));
        assert_eq!(found.larger_limit_failing, None);
    }
}

#[test]
fn searching_in_granules_gives_the_byte_search_answer_in_fewer_replays() {
    let cases = [
        ("glibc", workload(200, 13, 600 * KIB)),
        ("pytorch", workload(50, 9, 30 * MIB)),
        ("pytorch", workload(80, 21, 3 * MIB)),
    ];
    for (name, trace) in cases {
        let view = trace.view().unwrap();
        let config = PolicyConfig::default();
        assert!(limit_granule_bytes(name, &config) > 1);
        let found = min_limit(&view, name, &config).unwrap();
        let unlimited = build(name, &config, &view).unwrap();
        let peak = run_until_failure(&view, unlimited, 16).peak_footprint_bytes;
        let peak_live = view.peak_live().0;
        let bytes = search(Some(peak_live - 1), peak, |l| {
            Ok::<_, ()>(works(&view, name, &config, l))
        })
        .unwrap();
        assert_eq!(found.min_limit_bytes, bytes.min_limit_bytes, "{name}");
        assert!(found.replays < bytes.replays, "{name}");
    }
}
