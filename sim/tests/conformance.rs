//! One conformance suite, instantiated for every registered policy, plus hand-written golden
//! scenarios with exact addresses for first-fit, best-fit, buddy and pool.
//!
//! Every scenario is a trace, so offline policies (which plan from the trace) run it too. A
//! policy whose registry arm is not written yet is skipped with a message.
// Helpers outside #[test] functions unwrap too: a failed unwrap is a failed test here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use allocview_sim::heap::{AllocError, Block, BlockState, FreeError, Placement, Request};
use allocview_sim::policy::Policy;
use allocview_sim::policy::bfc::{Bfc, BinsSink, bins_of};
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry::{POLICY_NAMES, build};
use allocview_sim::replay::{ReplayOptions, replay};
use allocview_sim::testing::{
    DriveOptions, Driven, Op, build_available, check_layout_at, drive_checked, ops_to_trace,
};
use allocview_sim::trace::OwnedTrace;

const MIB: u64 = 1 << 20;

/// Builds `name` for `trace` and drives it with full checks; `None` when not available.
fn drive(name: &str, config: &PolicyConfig, trace: &OwnedTrace) -> Option<Driven> {
    let view = trace.view().unwrap();
    let Some(policy) = build_available(name, config, &view).unwrap() else {
        eprintln!("skipping {name}: not available yet");
        return None;
    };
    let opts = DriveOptions::strict(name, config.align_bytes);
    Some(drive_checked(policy, &view, &opts).unwrap_or_else(|e| panic!("{name}: {e}")))
}

/// A deterministic mixed workload: sizes from 1 B to 1 MiB, frees of pseudo-random victims.
fn mixed_ops(n: usize, seed: u64) -> Vec<Op> {
    let mut x = seed;
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let r = x >> 33;
        if r % 5 < 3 {
            let class = (r >> 3) % 21; // up to 1 MiB
            let size_bytes = 1 + ((r >> 8) % (1 << class));
            ops.push(Op::Alloc { size_bytes });
        } else {
            ops.push(Op::Free {
                victim: (r >> 4) as usize,
            });
        }
    }
    ops
}

fn mixed_sizes_are_shadow_checked(name: &str) {
    let trace = ops_to_trace(&mixed_ops(1500, 42));
    let Some(d) = drive(name, &PolicyConfig::default(), &trace) else {
        return;
    };
    assert!(d.failures.is_empty(), "{name}: {:?}", d.failures.first());
    let c = d.policy.counters();
    assert!(c.live_allocs > 0);
    assert!(c.footprint_bytes >= c.allocated_bytes);
    assert!(c.allocated_bytes >= c.live_bytes);
}

fn freeing_everything_leaves_nothing_live(name: &str) {
    let mut trace = OwnedTrace::new();
    let ids: Vec<u32> = (0..200)
        .map(|i| trace.alloc(i, 1 + (i as u64 * 7919) % 5000))
        .collect();
    // Free in a scrambled order.
    for k in 0..ids.len() {
        trace.free(1000 + k as i64, ids[(k * 37) % ids.len()]);
    }
    let Some(d) = drive(name, &PolicyConfig::default(), &trace) else {
        return;
    };
    let c = d.policy.counters();
    assert_eq!(
        (c.live_allocs, c.live_bytes, c.allocated_bytes),
        (0, 0, 0),
        "{name}"
    );
    let mut blocks = Vec::new();
    d.policy.blocks(&mut blocks);
    assert!(
        blocks
            .iter()
            .all(|b| !matches!(b.state, BlockState::Used { .. })),
        "{name}"
    );
}

fn limit_is_honoured(name: &str) {
    let limit = 256 * MIB;
    let mut trace = OwnedTrace::new();
    for i in 0..40 {
        trace.alloc(i, 16 * MIB);
    }
    let config = PolicyConfig {
        limit_bytes: Some(limit),
        ..PolicyConfig::default()
    };
    let Some(d) = drive(name, &config, &trace) else {
        return;
    };
    let served = d.placements.iter().flatten().count();
    assert!(served >= 1, "{name}: nothing fits under {limit} B");
    assert!(!d.failures.is_empty(), "{name}: 640 MiB fit under 256 MiB");
    for (event, e) in &d.failures {
        match e {
            AllocError::OutOfMemory {
                requested_bytes,
                limit_bytes,
                footprint_bytes,
                ..
            } => {
                assert_eq!(*requested_bytes, 16 * MIB, "{name} event {event}");
                assert_eq!(*limit_bytes, Some(limit), "{name}");
                assert!(*footprint_bytes <= limit, "{name}");
            }
            other => panic!("{name}: event {event}: {other}"),
        }
    }
    assert!(d.policy.counters().footprint_bytes <= limit, "{name}");
}

fn zero_byte_requests_do_not_collide(name: &str) {
    let mut trace = OwnedTrace::new();
    let a = trace.alloc(0, 0);
    trace.alloc(1, 0);
    trace.alloc(2, 24);
    trace.free(3, a);
    trace.alloc(4, 0);
    let Some(d) = drive(name, &PolicyConfig::default(), &trace) else {
        return;
    };
    // A policy may refuse zero bytes (TensorFlow's BFC does), but only as unsupported.
    for (event, e) in &d.failures {
        assert!(
            matches!(e, AllocError::Unsupported(_)),
            "{name}: event {event}: {e}"
        );
    }
    assert!(d.placements[2].is_some(), "{name}");
}

fn alignment_is_respected(name: &str) {
    let trace = ops_to_trace(&mixed_ops(400, 7));
    let config = PolicyConfig {
        align_bytes: 64,
        ..PolicyConfig::default()
    };
    let Some(d) = drive(name, &config, &trace) else {
        return;
    };
    // The shadow checked every placement's alignment; a policy may refuse an alignment it
    // cannot honour, but only as unsupported.
    for (event, e) in &d.failures {
        assert!(
            matches!(e, AllocError::Unsupported(_)),
            "{name}: event {event}: {e}"
        );
    }
}

fn deterministic_and_clones_are_independent(name: &str) {
    let ops = mixed_ops(800, 99);
    let trace = ops_to_trace(&ops);
    let view = trace.view().unwrap();
    let config = PolicyConfig::default();
    let Some(first) = drive(name, &config, &trace) else {
        return;
    };
    let second = drive(name, &config, &trace).unwrap();
    assert_eq!(first.placements, second.placements, "{name}");

    // Clone half-way, run the rest on both: same placements, and the clone's work does not
    // leak into the original.
    let mut a = build(name, &config, &view).unwrap();
    let half = view.len() / 2;
    let mut addrs = vec![None; view.num_allocs as usize];
    let step = |p: &mut Box<dyn Policy>, i: usize, addrs: &mut Vec<Option<Placement>>| {
        let id = view.alloc_id[i];
        match view.kind[i] {
            0 => {
                let req = Request {
                    id,
                    size_bytes: view.size_bytes[i],
                    align_bytes: 16,
                };
                addrs[id as usize] = p.alloc(req).ok();
            }
            1 => {
                if let Some(pl) = addrs[id as usize] {
                    p.free(pl.addr).unwrap();
                }
            }
            _ => {}
        }
    };
    for i in 0..half {
        step(&mut a, i, &mut addrs);
    }
    let mut b = a.clone_box();
    let at_half = a.counters();
    let mut addrs_b = addrs.clone();
    for i in half..view.len() {
        step(&mut b, i, &mut addrs_b);
    }
    assert_eq!(a.counters(), at_half, "{name}: clone shares state");
    for i in half..view.len() {
        step(&mut a, i, &mut addrs);
    }
    assert_eq!(addrs, addrs_b, "{name}");
    assert_eq!(addrs, first.placements, "{name}");
}

fn bad_frees_are_errors_and_change_nothing(name: &str) {
    let mut trace = OwnedTrace::new();
    for i in 0..10 {
        trace.alloc(i, 100 + i as u64 * 10);
    }
    let Some(d) = drive(name, &PolicyConfig::default(), &trace) else {
        return;
    };
    let mut policy = d.policy;
    let p = d.placements[3].unwrap();
    let before = policy.counters();
    let mut before_blocks: Vec<Block> = Vec::new();
    policy.blocks(&mut before_blocks);
    for bad in [p.addr + 1, p.addr + p.reserved_bytes * 1000 + 4096] {
        assert_eq!(policy.free(bad), Err(FreeError::UnknownAddr(bad)), "{name}");
    }
    policy.free(p.addr).unwrap();
    assert_eq!(
        policy.free(p.addr),
        Err(FreeError::UnknownAddr(p.addr)),
        "{name}: double free"
    );
    let after = policy.counters();
    assert_eq!(after.live_allocs, before.live_allocs - 1, "{name}");
    let mut after_blocks = Vec::new();
    policy.blocks(&mut after_blocks);
    let used = |v: &[Block]| {
        v.iter()
            .filter(|b| matches!(b.state, BlockState::Used { .. }))
            .count()
    };
    assert_eq!(used(&after_blocks), used(&before_blocks) - 1, "{name}");
    policy.check_invariants().unwrap();
}

/// Where a policy supports the layout index, the block list it rebuilds at every event equals
/// the policy's own, with the same counters (under a limit too, where PyTorch frees cached
/// segments and retries).
fn layout_index_agrees_with_the_policy(name: &str) {
    let trace = ops_to_trace(&mixed_ops(1200, 7));
    let view = trace.view().unwrap();
    let mut configs = vec![
        PolicyConfig::default(),
        PolicyConfig {
            limit_bytes: Some(24 * MIB),
            ..PolicyConfig::default()
        },
    ];
    let mut expandable = PolicyConfig::default();
    expandable.pytorch.expandable_segments = true;
    configs.push(expandable);
    // BFC releasing wholly free regions when the limit stops it growing: ranges disappear.
    configs.push(PolicyConfig {
        limit_bytes: Some(24 * MIB),
        bfc_garbage_collection: true,
        ..PolicyConfig::default()
    });
    // Buddy with 256 KiB top-level blocks: the arena grows block by block, gaps span several
    // top-level blocks (free blocks stop at their size), and requests up to 1 MiB take runs.
    if name == "buddy" {
        for limit_bytes in [None, Some(24 * MIB)] {
            configs.push(PolicyConfig {
                limit_bytes,
                buddy_max_order: 10,
                ..PolicyConfig::default()
            });
        }
    }
    // Requests aligned past the policy's own 16 bytes: padding blocks in the fit heaps, runs
    // and arena gaps in buddy (when they exceed its 256 KiB top-level block).
    let mut over_aligned = vec![(PolicyConfig::default(), 4096)];
    if name == "buddy" {
        over_aligned.push((
            PolicyConfig {
                buddy_max_order: 10,
                ..PolicyConfig::default()
            },
            1 << 20,
        ));
    }
    let runs = configs
        .into_iter()
        .map(|c| (c, None))
        .chain(over_aligned.into_iter().map(|(c, a)| (c, Some(a))));
    for (config, align_bytes) in runs {
        let Some(policy) = build_available(name, &config, &view).unwrap() else {
            return;
        };
        let opts = ReplayOptions {
            layout_index: true,
            checkpoint_every: 64,
            align_bytes: align_bytes.unwrap_or(ReplayOptions::default().align_bytes),
            ..ReplayOptions::default()
        };
        let r = replay(&view, policy, &opts);
        if [
            "pytorch",
            "bfc",
            "first-fit",
            "best-fit",
            "buddy",
            "oracle",
            "predictive",
        ]
        .contains(&name)
        {
            assert!(r.has_layout_index(), "{name} keeps a layout index");
        }
        if !r.has_layout_index() {
            return;
        }
        for event in 0..view.len() {
            check_layout_at(&r, &view, event).unwrap_or_else(|e| panic!("{name}: {e}"));
            if name == "bfc" && event % 16 == 0 {
                // The explorers draw BFC's bins from the index's chunk list.
                let mut chunks = Vec::new();
                r.blocks_at(event, &mut chunks).unwrap();
                let (state, _) = r.state_at(&view, event).unwrap();
                let bfc = state.as_any().downcast_ref::<Bfc>().unwrap();
                assert_eq!(bins_of(&chunks), bfc.bins(), "bfc bins at event {event}");
                let mut sink = BinsSink::default();
                let (second, _) = r
                    .fold_blocks_at(event, &mut sink, |_| BinsSink::default())
                    .unwrap();
                let folded = match second {
                    Some(s) => sink.merge(s).finish(),
                    None => sink.finish(),
                };
                assert_eq!(folded, bfc.bins(), "bfc bins folded at event {event}");
            }
        }
    }
}

/// Issue 20, item 11: a request near 2^64 fails as out of memory (no policy serves more than
/// `MAX_REQUEST_BYTES`) and wraps nothing: the footprint stays that of the small blocks.
fn requests_past_any_address_space_fail_without_wrapping(name: &str) {
    use allocview_sim::policy::MAX_REQUEST_BYTES;
    let mut trace = OwnedTrace::new();
    let small = trace.alloc(0, 100);
    trace.alloc(1, u64::MAX - 15);
    trace.alloc(2, MAX_REQUEST_BYTES + 1);
    trace.free(3, small);
    let view = trace.view().unwrap();
    let config = PolicyConfig::default();
    let policy = match build_available(name, &config, &view) {
        Ok(Some(p)) => p,
        Ok(None) => return,
        // A planner over the whole trace (oracle) may refuse it up front, clearly.
        Err(e) => {
            assert!(e.to_string().contains("overflow 64 bits"), "{name}: {e}");
            return;
        }
    };
    let r = replay(&view, policy, &ReplayOptions::default());
    let requested: Vec<u64> = r.ooms.iter().map(|o| o.request.size_bytes).collect();
    assert_eq!(requested, [u64::MAX - 15, MAX_REQUEST_BYTES + 1], "{name}");
    assert_eq!(r.summary.peak_live_bytes, 100, "{name}");
    // The same footprint as the small block alone.
    let mut alone = OwnedTrace::new();
    let id = alone.alloc(0, 100);
    alone.free(3, id);
    let alone_view = alone.view().unwrap();
    let policy = build_available(name, &config, &alone_view)
        .unwrap()
        .unwrap();
    let expected = replay(&alone_view, policy, &ReplayOptions::default());
    assert_eq!(
        r.summary.peak_footprint_bytes, expected.summary.peak_footprint_bytes,
        "{name}"
    );
}

macro_rules! conformance {
    ($($module:ident => $name:literal),* $(,)?) => {
        $(
            mod $module {
                #[test]
                fn requests_past_any_address_space_fail_without_wrapping() {
                    super::requests_past_any_address_space_fail_without_wrapping($name);
                }
                #[test]
                fn mixed_sizes_are_shadow_checked() {
                    super::mixed_sizes_are_shadow_checked($name);
                }
                #[test]
                fn freeing_everything_leaves_nothing_live() {
                    super::freeing_everything_leaves_nothing_live($name);
                }
                #[test]
                fn limit_is_honoured() {
                    super::limit_is_honoured($name);
                }
                #[test]
                fn zero_byte_requests_do_not_collide() {
                    super::zero_byte_requests_do_not_collide($name);
                }
                #[test]
                fn alignment_is_respected() {
                    super::alignment_is_respected($name);
                }
                #[test]
                fn deterministic_and_clones_are_independent() {
                    super::deterministic_and_clones_are_independent($name);
                }
                #[test]
                fn bad_frees_are_errors_and_change_nothing() {
                    super::bad_frees_are_errors_and_change_nothing($name);
                }
                #[test]
                fn layout_index_agrees_with_the_policy() {
                    super::layout_index_agrees_with_the_policy($name);
                }
            }
        )*
        const INSTANTIATED: &[&str] = &[$($name),*];
    };
}

conformance!(
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
fn every_registered_policy_is_in_the_suite() {
    assert_eq!(INSTANTIATED, POLICY_NAMES);
    let empty = OwnedTrace::new();
    let view = empty.view().unwrap();
    for name in POLICY_NAMES {
        match build_available(name, &PolicyConfig::default(), &view).unwrap() {
            Some(p) => assert_eq!(p.name(), *name),
            None => eprintln!("{name}: not available yet"),
        }
    }
}

/// Golden scenarios: exact addresses, computed by hand from each algorithm's rules.
mod golden {
    use super::*;

    fn req(id: u32, size_bytes: u64) -> Request {
        Request {
            id,
            size_bytes,
            align_bytes: 16,
        }
    }

    fn policy(name: &str, config: &PolicyConfig) -> Box<dyn Policy> {
        let empty = OwnedTrace::new();
        build(name, config, &empty.view().unwrap()).unwrap()
    }

    fn addr(p: &mut Box<dyn Policy>, id: u32, size_bytes: u64) -> u64 {
        let placement = p.alloc(req(id, size_bytes)).unwrap();
        p.check_invariants().unwrap();
        placement.addr
    }

    /// [A 200][B 16][C 96][D 16], then A and C freed: holes of 208 B at 0 and 96 B at 224.
    fn two_holes(name: &str) -> Box<dyn Policy> {
        let mut p = policy(name, &PolicyConfig::default());
        assert_eq!(addr(&mut p, 0, 200), 0);
        assert_eq!(addr(&mut p, 1, 16), 208);
        assert_eq!(addr(&mut p, 2, 96), 224);
        assert_eq!(addr(&mut p, 3, 16), 320);
        p.free(0).unwrap();
        p.free(224).unwrap();
        let c = p.counters();
        assert_eq!(
            (c.free_blocks, c.free_bytes, c.largest_free_bytes),
            (2, 304, 208)
        );
        assert_eq!(c.footprint_bytes, 336);
        p
    }

    #[test]
    fn first_fit_takes_the_lowest_hole() {
        let mut p = two_holes("first-fit");
        assert_eq!(addr(&mut p, 4, 80), 0);
        // The 128 B left at 80 still comes before the 96 B hole.
        assert_eq!(addr(&mut p, 5, 90), 80);
        assert_eq!(addr(&mut p, 6, 90), 224);
        assert_eq!(p.counters().footprint_bytes, 336);
    }

    #[test]
    fn best_fit_takes_the_smallest_hole() {
        let mut p = two_holes("best-fit");
        assert_eq!(addr(&mut p, 4, 80), 224);
        // What is left: 208 B at 0 and 16 B at 304; 16 B fits the small one exactly.
        assert_eq!(addr(&mut p, 5, 16), 304);
        assert_eq!(addr(&mut p, 6, 100), 0);
        assert_eq!(p.counters().free_blocks, 1);
    }

    #[test]
    fn best_fit_breaks_ties_by_lowest_address() {
        let mut p = policy("best-fit", &PolicyConfig::default());
        for (id, size) in [(0, 64), (1, 16), (2, 64), (3, 16), (4, 64), (5, 16)] {
            addr(&mut p, id, size);
        }
        // Holes of 64 B at 160 and 0 (freed in that order).
        p.free(160).unwrap();
        p.free(0).unwrap();
        assert_eq!(addr(&mut p, 6, 64), 0);
        assert_eq!(addr(&mut p, 7, 64), 160);
    }

    #[test]
    fn fit_policies_coalesce_and_trim_the_top() {
        for name in ["first-fit", "best-fit"] {
            let mut p = policy(name, &PolicyConfig::default());
            for (id, size) in [(0, 32), (1, 32), (2, 32), (3, 32)] {
                addr(&mut p, id, size);
            }
            p.free(32).unwrap();
            p.free(64).unwrap();
            let c = p.counters();
            assert_eq!((c.free_blocks, c.largest_free_bytes), (1, 64), "{name}");
            // Freeing the block below the merged hole joins all three.
            p.free(0).unwrap();
            assert_eq!(p.counters().largest_free_bytes, 96, "{name}");
            // Freeing the topmost block hands the whole heap back.
            p.free(96).unwrap();
            let c = p.counters();
            assert_eq!((c.footprint_bytes, c.free_blocks), (0, 0), "{name}");
            p.check_invariants().unwrap();
        }
    }

    #[test]
    fn fit_policies_round_to_alignment_and_give_zero_bytes_one_unit() {
        for name in ["first-fit", "best-fit"] {
            let mut p = policy(name, &PolicyConfig::default());
            assert_eq!(
                p.alloc(req(0, 0)).unwrap(),
                Placement {
                    addr: 0,
                    reserved_bytes: 16
                }
            );
            assert_eq!(
                p.alloc(req(1, 17)).unwrap(),
                Placement {
                    addr: 16,
                    reserved_bytes: 32
                }
            );
            // An over-aligned request pads; the padding becomes a free block.
            let big_align = Request {
                id: 2,
                size_bytes: 10,
                align_bytes: 256,
            };
            assert_eq!(p.alloc(big_align).unwrap().addr, 256);
            let c = p.counters();
            assert_eq!(
                (c.free_blocks, c.free_bytes, c.footprint_bytes),
                (1, 208, 272)
            );
            p.check_invariants().unwrap();
        }
    }

    #[test]
    fn fit_policies_fail_at_the_limit() {
        for name in ["first-fit", "best-fit"] {
            let config = PolicyConfig {
                limit_bytes: Some(100),
                ..PolicyConfig::default()
            };
            let mut p = policy(name, &config);
            assert_eq!(addr(&mut p, 0, 90), 0);
            let err = p.alloc(req(1, 1)).unwrap_err();
            assert_eq!(
                err,
                AllocError::OutOfMemory {
                    requested_bytes: 1,
                    largest_free_bytes: 0,
                    footprint_bytes: 96,
                    limit_bytes: Some(100),
                },
                "{name}"
            );
        }
    }

    #[test]
    fn buddy_rounds_to_powers_of_two_and_merges() {
        let mut p = policy("buddy", &PolicyConfig::default());
        let a = p.alloc(req(0, 3000)).unwrap();
        assert_eq!(
            a,
            Placement {
                addr: 0,
                reserved_bytes: 4096
            }
        );
        let mut blocks = Vec::new();
        p.blocks(&mut blocks);
        assert_eq!(
            blocks[0],
            Block {
                addr: 0,
                len_bytes: 4096,
                state: BlockState::Used {
                    id: 0,
                    requested_bytes: 3000
                }
            }
        );
        let c = p.counters();
        assert_eq!((c.live_bytes, c.allocated_bytes), (3000, 4096));
        assert_eq!(c.footprint_bytes, 64 * MIB);
        // The 4096 B buddy of the first block.
        assert_eq!(addr(&mut p, 1, 4000), 4096);
        // 100 B take a 256 B block split from the 8 KiB block at 8192.
        assert_eq!(addr(&mut p, 2, 100), 8192);
        assert_eq!(addr(&mut p, 3, 256), 8448);
        p.free(0).unwrap();
        p.free(4096).unwrap();
        p.free(8192).unwrap();
        p.free(8448).unwrap();
        let c = p.counters();
        assert_eq!((c.free_blocks, c.largest_free_bytes), (1, 64 * MIB));
        p.check_invariants().unwrap();
    }

    #[test]
    fn buddy_grows_by_top_level_blocks() {
        let config = PolicyConfig {
            buddy_min_block_bytes: 256,
            buddy_max_order: 4,
            ..PolicyConfig::default()
        };
        let mut p = policy("buddy", &config);
        assert_eq!(addr(&mut p, 0, 4096), 0);
        assert_eq!(addr(&mut p, 1, 1), 4096);
        assert_eq!(p.counters().footprint_bytes, 8192);
        // Larger than a top-level block: a 16 KiB run of four top-level blocks.
        let run = p.alloc(req(2, 10_000)).unwrap();
        assert_eq!(
            run,
            Placement {
                addr: 8192,
                reserved_bytes: 16384
            }
        );
        assert_eq!(p.counters().footprint_bytes, 8192 + 16384);
    }

    #[test]
    fn pool_never_reuses() {
        let config = PolicyConfig {
            pool_block_bytes: 4096,
            ..PolicyConfig::default()
        };
        let mut p = policy("pool", &config);
        assert_eq!(addr(&mut p, 0, 100), 0);
        p.free(0).unwrap();
        assert_eq!(addr(&mut p, 1, 100), 112);
        assert_eq!(addr(&mut p, 2, 4000), 4096);
        let c = p.counters();
        assert_eq!(c.footprint_bytes, 8192);
        assert_eq!((c.live_bytes, c.allocated_bytes), (4100, 112 + 4000));
        let mut blocks = Vec::new();
        p.blocks(&mut blocks);
        assert_eq!(
            blocks[0],
            Block {
                addr: 0,
                len_bytes: 112,
                state: BlockState::Dead
            }
        );
        assert_eq!(blocks[2].state, BlockState::Dead);
        assert_eq!((blocks[2].addr, blocks[2].len_bytes), (224, 4096 - 224));
        assert_eq!(blocks.last().unwrap().state, BlockState::Free);
    }
}
