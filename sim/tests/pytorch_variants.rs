//! Property tests of the `pytorch` policy under each of its options (the shared suite runs only
//! PyTorch's defaults): random alloc/free sequences, checked against the shadow after every
//! step, replayed twice (once through checkpoint copies) for determinism.
// Helpers outside #[test] functions unwrap too: a failed unwrap is a failed test here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use allocview_sim::heap::AllocError;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::pytorch::PytorchSettings;
use allocview_sim::testing::{DriveOptions, Op, build_available, drive_checked, ops_to_trace};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// Sizes from 1 B to 48 MiB, so that both pools, the 10 MiB segment boundary and oversize
/// blocks (`max_split_size` 24 MiB below) all occur.
fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        5 => 1u64..=4096,
        3 => 4097u64..=(2 * MIB),
        2 => (2 * MIB)..=(12 * MIB),
        1 => (12 * MIB)..=(48 * MIB),
    ]
}

fn ops_strategy() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => size_strategy().prop_map(|size_bytes| Op::Alloc { size_bytes }),
        2 => any::<usize>().prop_map(|victim| Op::Free { victim }),
    ];
    prop::collection::vec(op, 1..120)
}

/// Mostly requests of 8 to 48 MiB, each in a segment of its own, freed as often as made: cached
/// whole segments pile up, so a tight limit exercises every release path.
fn churn_strategy() -> impl Strategy<Value = Vec<Op>> {
    let size = prop_oneof![
        1 => 1u64..=(2 * MIB),
        6 => (8 * MIB)..=(48 * MIB),
    ];
    let op = prop_oneof![
        1 => size.prop_map(|size_bytes| Op::Alloc { size_bytes }),
        1 => any::<usize>().prop_map(|victim| Op::Free { victim }),
    ];
    prop::collection::vec(op, 1..120)
}

fn settings_strategy() -> impl Strategy<Value = PytorchSettings> {
    (
        prop::option::of(prop_oneof![Just(24 * MIB), Just(64 * MIB)]),
        prop_oneof![Just(0u32), Just(2), Just(4), Just(8)],
        prop_oneof![Just(0u32), Just(500_000), Just(800_000)],
        any::<bool>(),
    )
        .prop_map(|(mss, divisions, gc_ppm, expandable)| PytorchSettings {
            max_split_size_bytes: mss,
            roundup_power2_divisions: [divisions; 16],
            garbage_collection_threshold_ppm: gc_ppm,
            expandable_segments: expandable,
            ..PytorchSettings::default()
        })
}

fn check(config: &PolicyConfig, ops: &[Op]) -> Result<(), TestCaseError> {
    let trace = ops_to_trace(ops);
    let view = trace.view().unwrap();
    let run = |swap_for_clone_every| {
        let opts = DriveOptions {
            swap_for_clone_every,
            ..DriveOptions::strict("pytorch", config.align_bytes)
        };
        let policy = build_available("pytorch", config, &view).unwrap().unwrap();
        drive_checked(policy, &view, &opts).map_err(TestCaseError::fail)
    };
    let first = run(None)?;
    let second = run(Some(5))?;
    prop_assert_eq!(&first.placements, &second.placements);
    let c = first.policy.counters();
    if let Some(limit) = config.limit_bytes {
        prop_assert!(c.footprint_bytes <= limit);
    } else {
        prop_assert!(
            first
                .failures
                .iter()
                .all(|(_, e)| matches!(e, AllocError::Unsupported(_))),
            "{:?}",
            first.failures.first()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn every_option_keeps_every_invariant(ops in ops_strategy(), settings in settings_strategy()) {
        let config = PolicyConfig { pytorch: settings, ..PolicyConfig::default() };
        check(&config, &ops)?;
    }

    #[test]
    fn every_option_under_a_limit(
        ops in ops_strategy(),
        settings in settings_strategy(),
        limit_mib in 2u64..=160,
    ) {
        let config = PolicyConfig {
            pytorch: settings,
            limit_bytes: Some(limit_mib * MIB),
            ..PolicyConfig::default()
        };
        check(&config, &ops)?;
    }

    #[test]
    fn large_requests_churn_under_a_tight_limit(
        ops in churn_strategy(),
        settings in settings_strategy(),
        limit_mib in 40u64..=200,
    ) {
        let config = PolicyConfig {
            pytorch: settings,
            limit_bytes: Some(limit_mib * MIB),
            ..PolicyConfig::default()
        };
        check(&config, &ops)?;
    }
}

#[test]
fn an_empty_script_replays_like_a_fresh_allocator() {
    let ops: Vec<Op> = (0..50)
        .map(|i| {
            if i % 3 == 2 {
                Op::Free { victim: i }
            } else {
                Op::Alloc {
                    size_bytes: 1000 + i as u64 * 70_000,
                }
            }
        })
        .collect();
    let trace = ops_to_trace(&ops);
    let view = trace.view().unwrap();
    let scripted = PolicyConfig {
        pytorch_script: Some(Arc::default()),
        ..PolicyConfig::default()
    };
    let policy = build_available("pytorch", &scripted, &view)
        .unwrap()
        .unwrap();
    let d = drive_checked(policy, &view, &DriveOptions::strict("pytorch", 16)).unwrap();
    assert!(d.failures.is_empty());
}
