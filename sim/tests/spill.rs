//! The spill simulator on hand-made traces with answers worked out by hand, and properties on
//! generated ones.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry::build;
use allocview_sim::spill::{
    Evict, IoModel, SpillStats, Units, lower_bound_bytes, os_swap, simulate,
};
use allocview_sim::testing::{Op, ops_to_trace};
use allocview_sim::trace::{OwnedTrace, TraceView};

const IO: IoModel = IoModel {
    bandwidth_bytes_per_s: 1e6,
    latency_s: 1e-3,
};

fn run(view: &TraceView<'_>, units: Units<'_>, limit: u64, evict: Evict) -> SpillStats {
    let cfg = PolicyConfig {
        limit_bytes: Some(limit),
        ..PolicyConfig::default()
    };
    let policy = build("first-fit", &cfg, view).unwrap();
    simulate(view, units, policy, 16, evict, &IO).unwrap()
}

/// A, B, C of `size` each, then frees in allocation order.
fn abc(size: u64) -> OwnedTrace {
    let mut t = OwnedTrace::new();
    let a = t.alloc(0, size);
    let b = t.alloc(1, size);
    let c = t.alloc(2, size);
    t.free(3, a);
    t.free(4, b);
    t.free(5, c);
    t
}

#[test]
fn furthest_meets_the_lower_bound_and_lru_pays_twice() {
    // Room for two of three 1 KiB blocks. Furthest evicts B (freed after A), which is read back
    // once A has gone: 1 KiB each way, the lower bound. LRU evicts A, must read A back to free
    // it, evicting B for the room, and reads B back later: 2 KiB each way.
    let t = abc(1024);
    let view = t.view().unwrap();
    assert_eq!(lower_bound_bytes(&view, 2048), 1024);
    for evict in [Evict::Furthest, Evict::Largest, Evict::Executor] {
        let s = run(&view, Units::Blocks, 2048, evict);
        assert_eq!(
            (s.spilled_bytes, s.reloaded_bytes, s.evictions, s.reloads),
            (1024, 1024, 1, 1),
            "{evict:?}"
        );
        assert_eq!((s.stalls, s.failed), (2, 0), "{evict:?}");
        // 2 KiB at 1 MB/s plus two operations of 1 ms.
        assert!((s.estimated_io_seconds - (2048.0 / 1e6 + 2e-3)).abs() < 1e-12);
    }
    let s = run(&view, Units::Blocks, 2048, Evict::Lru);
    assert_eq!(
        (s.spilled_bytes, s.reloaded_bytes, s.evictions, s.reloads),
        (2048, 2048, 2, 2)
    );
    assert_eq!(s.peak_spilled_bytes, 1024);
}

#[test]
fn os_swap_moves_pages_lru() {
    // Three 8 KiB blocks (two pages each) in four page frames. C's pages push out A's (2 out);
    // freeing A reads its two pages back, pushing out B's (2 in, 2 more out); freeing B reads
    // B's back (2 in). The block model with furthest spills only the lower bound, 8 KiB.
    let t = abc(8192);
    let view = t.view().unwrap();
    let policy = build("first-fit", &PolicyConfig::default(), &view).unwrap();
    let s = os_swap(&view, Units::Blocks, policy, 16, 16384, &IO).unwrap();
    assert_eq!((s.page_outs, s.page_ins), (4, 4));
    assert_eq!((s.spilled_bytes, s.reloaded_bytes), (16384, 16384));
    assert!((s.estimated_io_seconds - (32768.0 / 1e6 + 8e-3)).abs() < 1e-12);
    let b = run(&view, Units::Blocks, 16384, Evict::Furthest);
    assert_eq!(b.spilled_bytes, lower_bound_bytes(&view, 16384));
    assert_eq!(b.spilled_bytes, 8192);
}

#[test]
fn executor_units_move_whole_units() {
    // Unit 0 allocates A and C, unit 1 allocates B, with room for two blocks. C evicts unit 1
    // (B); unit 1's next event reloads B, which evicts all of unit 0 (A and C); unit 0's next
    // event reloads both.
    let mut t = OwnedTrace::new();
    let a = t.alloc(0, 1024);
    let b = t.alloc(1, 1024);
    let c = t.alloc(2, 1024);
    t.free(3, b);
    t.free(4, a);
    t.free(5, c);
    let units = [0, 1, 0, 1, 0, 0];
    let view = t.view().unwrap();
    for evict in Evict::ALL {
        let s = run(&view, Units::Executors(&units), 2048, evict);
        assert_eq!(
            (s.spilled_bytes, s.reloaded_bytes, s.evictions, s.reloads),
            (3072, 3072, 2, 2),
            "{evict:?}"
        );
        assert_eq!((s.stalls, s.failed), (3, 0), "{evict:?}");
    }
    let short = [0u32; 5];
    let policy = build("first-fit", &PolicyConfig::default(), &view).unwrap();
    assert!(simulate(&view, Units::Executors(&short), policy, 16, Evict::Lru, &IO).is_err());
}

#[test]
fn a_block_larger_than_the_limit_fails_and_its_free_is_ignored() {
    let mut t = OwnedTrace::new();
    let a = t.alloc(0, 512);
    let big = t.alloc(1, 4096);
    t.free(2, big);
    t.free(3, a);
    let view = t.view().unwrap();
    for evict in Evict::ALL {
        let s = run(&view, Units::Blocks, 2048, evict);
        // Everything evictable (A) was evicted before giving up, and read back at its free.
        assert_eq!((s.failed, s.spilled_bytes, s.reloaded_bytes), (1, 512, 512));
    }
}

/// `n` ops, every allocation `size` bytes.
fn uniform(n: usize, seed: u64, size: u64) -> OwnedTrace {
    let mut x = seed;
    let ops: Vec<Op> = (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = x >> 33;
            if r.is_multiple_of(2) {
                Op::Alloc { size_bytes: size }
            } else {
                Op::Free {
                    victim: (r >> 4) as usize,
                }
            }
        })
        .collect();
    ops_to_trace(&ops)
}

#[test]
fn furthest_evicts_least_with_equal_sizes_and_no_fragmentation() {
    // Equal 1 KiB blocks in a limit of whole blocks: any hole fits any block, so this is
    // paging with uniform pages, where Belady's choice is optimal.
    for seed in 0..20 {
        let t = uniform(300, seed, 1024);
        let view = t.view().unwrap();
        let peak = view.peak_live().0;
        for slots in [2, 4, 8] {
            let limit = (slots * 1024).min(peak);
            let best = run(&view, Units::Blocks, limit, Evict::Furthest);
            assert_eq!(best.failed, 0);
            assert!(best.spilled_bytes >= lower_bound_bytes(&view, limit));
            for evict in Evict::ALL {
                let s = run(&view, Units::Blocks, limit, evict);
                assert!(
                    s.evictions >= best.evictions,
                    "seed {seed}, {slots} slots: {evict:?} {} < furthest {}",
                    s.evictions,
                    best.evictions
                );
                assert!(s.spilled_bytes >= lower_bound_bytes(&view, limit));
            }
        }
    }
}
