//! Hand-computed scenarios (glibc 2.36 rules, x86-64) and a random-sequence invariant check.

use proptest::prelude::*;

use super::*;

const FIRST_HEAP: u64 = 135_168; // ALIGN_UP(656 + 128 KiB + 32, 4096): the tcache struct's sbrk
const META: u64 = 656; // chunk of the 640-byte tcache struct, at the heap base

fn malloc(g: &mut Glibc, size: u64) -> Placement {
    let p = g.malloc(size, 0).unwrap();
    g.check().unwrap();
    p
}

fn free(g: &mut Glibc, addr: Addr) {
    g.free_chunk(addr).unwrap();
    g.check().unwrap();
}

#[test]
fn chunk_sizes_follow_request2size() {
    let cases = [
        (0, 32),
        (24, 32),
        (25, 48),
        (40, 48),
        (41, 64),
        (1000, 1008),
        (1032, 1040),
    ];
    for (req, chunk) in cases {
        assert_eq!(chunk_size(req), chunk, "request {req}");
    }
    assert_eq!(tcache_index(1040), Some(63));
    assert_eq!(tcache_index(1056), None);
    assert_eq!(fastbin_index(128), Some(6));
    assert_eq!(fastbin_index(144), None);
    assert_eq!(mmapped_bytes(204_816), 208_896);
    assert_eq!(mmapped_bytes(4088), 4096);
    assert_eq!(mmapped_bytes(4089), 8192);
}

#[test]
fn first_malloc_sbrks_for_the_tcache_struct_plus_top_pad() {
    let mut g = Glibc::default();
    assert_eq!(g.counters().footprint_bytes, 0);
    let p = malloc(&mut g, 1000);
    assert_eq!(
        p,
        Placement {
            addr: META,
            reserved_bytes: 1008
        }
    );
    let s = g.stats();
    assert_eq!(
        (s.heap_bytes, s.top_bytes),
        (FIRST_HEAP, FIRST_HEAP - META - 1008)
    );
    let mut blocks = Vec::new();
    g.blocks(&mut blocks);
    assert_eq!(
        blocks[0],
        Block {
            addr: 0,
            len_bytes: META,
            state: BlockState::Dead
        }
    );
    assert_eq!(blocks.len(), 3);
}

#[test]
fn tcache_holds_seven_per_class_lifo_and_blocks_coalescing() {
    let mut g = Glibc::default();
    let addrs: Vec<Addr> = (0..9).map(|_| malloc(&mut g, 200).addr).collect();
    assert_eq!(addrs[8], META + 8 * 208);
    for &a in &addrs {
        free(&mut g, a);
    }
    // Seven cached; the eighth is binned (its left neighbour is cached, so no merge); the
    // ninth merges with the eighth and then with the top. Too little to trim.
    assert_eq!(g.stats().cached_chunks, 7);
    assert_eq!(g.stats().top_bytes, FIRST_HEAP - META - 7 * 208);
    assert_eq!(g.stats().heap_bytes, FIRST_HEAP);
    for i in (0..7).rev() {
        assert_eq!(malloc(&mut g, 200).addr, addrs[i]);
    }
    assert_eq!(malloc(&mut g, 200).addr, addrs[7]);
}

#[test]
fn free_coalesces_with_both_neighbours_and_the_top() {
    let mut g = Glibc::default();
    let [a, b, c, d] = [0; 4].map(|_| malloc(&mut g, 2000).addr);
    assert_eq!([a, b, c, d], [META, META + 2016, META + 4032, META + 6048]);
    free(&mut g, a);
    free(&mut g, c);
    assert_eq!(g.counters().free_blocks, 3); // a, c, top
    free(&mut g, b);
    let mut blocks = Vec::new();
    g.blocks(&mut blocks);
    assert_eq!(
        blocks[1],
        Block {
            addr: a,
            len_bytes: 3 * 2016,
            state: BlockState::Free
        }
    );
    // Best fit reuses the low end of the merged chunk.
    let e = malloc(&mut g, 2000).addr;
    assert_eq!(e, a);
    free(&mut g, e);
    free(&mut g, d);
    assert_eq!(g.stats().top_bytes, FIRST_HEAP - META);
    assert_eq!(g.counters().free_blocks, 1);
}

#[test]
fn mmap_threshold_moves_on_free_up_to_32_mib() {
    let mut g = Glibc::default();
    // 128 KiB still fits the top left by the first sbrk: no mmap.
    let p = malloc(&mut g, 128 << 10);
    assert_eq!(p.addr, META);
    free(&mut g, p.addr);
    // 200 KiB does not fit: mmapped, 204,816 B chunk + 8, page-rounded.
    let m = malloc(&mut g, 200 << 10);
    assert_eq!(m.reserved_bytes, 208_896);
    assert_eq!(m.addr, g.options().mmap_base);
    assert_eq!(g.counters().footprint_bytes, FIRST_HEAP + 208_896);
    free(&mut g, m.addr);
    let s = g.stats();
    assert_eq!(
        (s.mmap_threshold_bytes, s.trim_threshold_bytes),
        (208_896, 417_792)
    );
    assert_eq!(g.counters().footprint_bytes, FIRST_HEAP);
    // Now below the threshold: the heap grows by 204,816 + 128 KiB + 32 - top, page-rounded.
    let h = malloc(&mut g, 200 << 10);
    assert_eq!(h.addr, META);
    assert_eq!(g.stats().heap_bytes, FIRST_HEAP + 204_800);
    free(&mut g, h.addr);
    // Top (339,312 B) is under the raised trim threshold: kept.
    assert_eq!(g.stats().heap_bytes, FIRST_HEAP + 204_800);
    // A 40 MiB mapping is above DEFAULT_MMAP_THRESHOLD_MAX: freeing it leaves the threshold.
    let big = malloc(&mut g, 40 << 20);
    assert!(big.addr >= g.options().mmap_base);
    free(&mut g, big.addr);
    assert_eq!(g.stats().mmap_threshold_bytes, 208_896);
}

#[test]
fn trim_keeps_the_top_pad() {
    let mut g = Glibc::default();
    malloc(&mut g, 100_000); // from the first top
    let b = malloc(&mut g, 100_000); // grows the heap by 49 pages
    assert_eq!(b.addr, META + 100_016);
    assert_eq!(g.stats().heap_bytes, FIRST_HEAP + 200_704);
    free(&mut g, b.addr);
    // Top 235,200 B >= 128 KiB: release ALIGN_DOWN(235,200 - 33 - 128 KiB, 4096) = 25 pages.
    assert_eq!(g.stats().heap_bytes, FIRST_HEAP + 200_704 - 102_400);
    assert_eq!(g.stats().top_bytes, 132_800);
}

#[test]
fn fastbins_feed_the_tcache_and_consolidate_for_large_requests() {
    let mut g = Glibc::default();
    let xs: Vec<Addr> = (0..9).map(|_| malloc(&mut g, 20).addr).collect();
    for &x in &xs {
        free(&mut g, x);
    }
    assert_eq!(g.stats().cached_chunks, 9); // 7 in the tcache, 2 in a fastbin
    for i in (0..7).rev() {
        assert_eq!(malloc(&mut g, 20).addr, xs[i]);
    }
    // Fastbin hit (most recent first); the other chunk moves to the tcache.
    assert_eq!(malloc(&mut g, 20).addr, xs[8]);
    assert_eq!(g.stats().cached_chunks, 1);
    assert_eq!(malloc(&mut g, 20).addr, xs[7]);

    // Large request: fastbin chunks next to the top are consolidated into it first.
    let mut g = Glibc::default();
    let xs: Vec<Addr> = (0..9).map(|_| malloc(&mut g, 20).addr).collect();
    for &x in &xs {
        free(&mut g, x);
    }
    assert_eq!(malloc(&mut g, 2000).addr, xs[7]);
    assert_eq!(g.stats().cached_chunks, 7);
}

#[test]
fn limit_refuses_growth_and_mmap() {
    let mut g = Glibc::new(GlibcOptions {
        limit_bytes: Some(FIRST_HEAP),
        ..GlibcOptions::default()
    });
    malloc(&mut g, 1000);
    let err = g.malloc(200_000, 1).unwrap_err();
    assert!(matches!(
        err,
        AllocError::OutOfMemory {
            requested_bytes: 200_000,
            ..
        }
    ));
    assert!(matches!(
        err,
        AllocError::OutOfMemory {
            footprint_bytes: FIRST_HEAP,
            ..
        }
    ));
    g.check().unwrap();
    assert!(g.malloc(100_000, 2).is_ok());
}

#[test]
fn invariant_check_catches_corruption() {
    let mut g = Glibc::default();
    let a = malloc(&mut g, 2000).addr;
    malloc(&mut g, 2000);
    free(&mut g, a);
    let mut bad = g.clone();
    bad.free_by_size.clear();
    assert!(bad.check().is_err());
    let mut bad = g.clone();
    bad.top_bytes += 16;
    assert!(bad.check().is_err());
    let mut bad = g.clone();
    bad.live_bytes += 1;
    assert!(bad.check().is_err());
    let mut bad = g;
    bad.cached_chunks += 1;
    assert!(bad.check().is_err());
}

#[test]
fn registry_config() {
    let cfg = PolicyConfig {
        glibc_mmap_threshold_bytes: 0,
        ..PolicyConfig::default()
    };
    assert!(Glibc::from_config(&cfg).is_err());
    let mut g = Glibc::default();
    let wide = Request {
        id: 0,
        size_bytes: 8,
        align_bytes: 32,
    };
    assert!(matches!(g.alloc(wide), Err(AllocError::Unsupported(_))));
    let cfg = PolicyConfig {
        glibc_mmap_threshold_bytes: 1 << 20,
        ..PolicyConfig::default()
    };
    let g = Glibc::from_config(&cfg).unwrap();
    assert_eq!(g.stats().mmap_threshold_bytes, 1 << 20);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    #[test]
    fn random_sequences_keep_invariants(
        ops in prop::collection::vec(
            prop_oneof![
                3 => (0u64..140).prop_map(Some),
                2 => (140u64..1100).prop_map(Some),
                2 => (1100u64..70_000).prop_map(Some),
                1 => (70_000u64..400_000).prop_map(Some),
                6 => Just(None),
            ],
            1..400,
        ),
        picks in prop::collection::vec(any::<usize>(), 400),
    ) {
        let mut g = Glibc::default();
        let mut live: Vec<Placement> = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Some(size) => live.push(g.malloc(size, i as u32).unwrap()),
                None if !live.is_empty() => {
                    let p = live.swap_remove(picks[i] % live.len());
                    g.free_chunk(p.addr).unwrap();
                }
                None => {}
            }
            g.check().map_err(TestCaseError::fail)?;
            let mut sorted = live.clone();
            sorted.sort_by_key(|p| p.addr);
            for w in sorted.windows(2) {
                prop_assert!(w[0].addr + w[0].reserved_bytes <= w[1].addr);
            }
        }
        for p in live {
            g.free_chunk(p.addr).unwrap();
        }
        g.check().map_err(TestCaseError::fail)?;
        prop_assert_eq!(g.counters().live_allocs, 0);
        prop_assert_eq!(g.stats().mmapped_bytes, 0);
    }
}

/// A checkpoint copies the whole chunk table, the slots of merged chunks included: the budget
/// must be charged for them, not for the few blocks a heap has once it is freed.
#[test]
fn state_bytes_counts_the_chunk_slots_a_copy_keeps() {
    let mut g = Glibc::default();
    // Past the tcache's sizes, so each free merges at once.
    let addrs: Vec<Addr> = (0..1000).map(|_| malloc(&mut g, 2000).addr).collect();
    for a in addrs {
        free(&mut g, a);
    }
    let c = g.counters();
    assert!(c.live_allocs + c.free_blocks < 10, "{c:?}");
    assert_eq!(g.chunks.len(), 1001);
    assert!(
        g.state_bytes() >= 1001 * std::mem::size_of::<Chunk>() as u64,
        "{} bytes",
        g.state_bytes()
    );
}
