//! Property tests: random alloc/free sequences through every registered policy, checked against
//! the shadow model after every step, and replayed twice for determinism.
// Helpers outside #[test] functions unwrap too: a failed unwrap is a failed test here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use allocview_sim::heap::AllocError;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry::POLICY_NAMES;
use allocview_sim::testing::{DriveOptions, Op, build_available, drive_checked, ops_to_trace};
use proptest::prelude::*;

/// Sizes from 1 B to 4 MiB, mostly small, as in real programs.
fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 1u64..=256,
        3 => 257u64..=65_536,
        1 => 65_537u64..=(4 << 20),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => size_strategy().prop_map(|size_bytes| Op::Alloc { size_bytes }),
        2 => any::<usize>().prop_map(|victim| Op::Free { victim }),
    ]
}

fn ops_strategy() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op_strategy(), 1..160)
}

/// Drives `ops` through `name` twice with full checks after every step, the second time going on
/// from a checkpoint copy (`clone_box`) every few steps; the two runs must place every
/// allocation identically.
fn check(name: &str, config: &PolicyConfig, ops: &[Op]) -> Result<(), TestCaseError> {
    let trace = ops_to_trace(ops);
    let view = trace
        .view()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let run = |swap_for_clone_every| -> Result<Option<_>, TestCaseError> {
        let opts = DriveOptions {
            swap_for_clone_every,
            limit_bytes: config.limit_bytes,
            ..DriveOptions::strict(name, config.align_bytes)
        };
        let Some(policy) = build_available(name, config, &view).map_err(TestCaseError::fail)?
        else {
            return Ok(None);
        };
        drive_checked(policy, &view, &opts)
            .map(Some)
            .map_err(|e| TestCaseError::fail(format!("{name}: {e}")))
    };
    let (Some(first), Some(second)) = (run(None)?, run(Some(7))?) else {
        return Ok(());
    };
    prop_assert_eq!(
        &first.placements,
        &second.placements,
        "{} is not deterministic, or its checkpoint copies differ",
        name
    );
    // Without a limit nothing runs out of memory; a policy may only refuse what it cannot
    // model (e.g. an alignment beyond its grid).
    if config.limit_bytes.is_none() {
        for (event, e) in &first.failures {
            prop_assert!(
                matches!(e, AllocError::Unsupported(_)),
                "{}: event {}: {}",
                name,
                event,
                e
            );
        }
    }
    Ok(())
}

macro_rules! policy_properties {
    ($($module:ident => $name:literal),* $(,)?) => {
        $(
            mod $module {
                use super::*;

                proptest! {
                    #![proptest_config(ProptestConfig::with_cases(96))]

                    #[test]
                    fn random_ops_keep_every_invariant(ops in ops_strategy()) {
                        check($name, &PolicyConfig::default(), &ops)?;
                    }

                    #[test]
                    fn random_ops_under_a_limit(ops in ops_strategy(), limit_mib in 1u64..=192) {
                        let config = PolicyConfig {
                            limit_bytes: Some(limit_mib << 20),
                            ..PolicyConfig::default()
                        };
                        check($name, &config, &ops)?;
                    }

                    #[test]
                    fn random_ops_with_wide_alignment(ops in ops_strategy()) {
                        let config = PolicyConfig {
                            align_bytes: 256,
                            buddy_min_block_bytes: 64,
                            buddy_max_order: 12,
                            pool_block_bytes: 1 << 20,
                            ..PolicyConfig::default()
                        };
                        check($name, &config, &ops)?;
                    }
                }
            }
        )*
        const COVERED: &[&str] = &[$($name),*];
    };
}

policy_properties!(
    first_fit => "first-fit",
    best_fit => "best-fit",
    bfc => "bfc",
    buddy => "buddy",
    pool => "pool",
    glibc => "glibc",
    oracle => "oracle",
    pytorch => "pytorch",
    predictive => "predictive",
);

#[test]
fn every_registered_policy_has_properties() {
    assert_eq!(COVERED, POLICY_NAMES);
}
