//! Hand-made scenarios under a limit (release and retry, `max_split_size` releases, garbage
//! collection) and with expandable segments.

use super::tests::{BASE, KIB, MIB, alloc, events, free, free_blocks, policy, try_alloc};
use super::*;
use SegmentOpKind::{Alloc as SegAlloc, Free as SegFree, Map, Unmap};

fn mss(bytes: u64) -> PytorchSettings {
    PytorchSettings {
        max_split_size_bytes: Some(bytes),
        ..PytorchSettings::default()
    }
}

/// Blocks, counters and events, for "nothing changed" checks.
fn state(p: &Pytorch) -> (Vec<Block>, Counters, Vec<SegmentEvent>) {
    let mut blocks = Vec::new();
    p.blocks(&mut blocks);
    (blocks, p.counters(), p.segment_events().to_vec())
}

#[test]
fn at_the_limit_cached_segments_are_released_and_the_cudamalloc_retried() {
    let mut p = policy(PytorchSettings::default(), Some(44 * MIB));
    let a = alloc(&mut p, 0, 20 * MIB);
    let b = alloc(&mut p, 1, 20 * MIB);
    assert_eq!((a.addr, b.addr), (BASE, BASE + 20 * MIB));
    free(&mut p, a.addr);
    // 22 MiB: no cached block fits, 40 + 22 > 44, so A's segment goes and 20 + 22 fits. The
    // new segment does not fit where A was, so it goes after B.
    let c = alloc(&mut p, 2, 22 * MIB);
    assert_eq!(c.addr, BASE + 40 * MIB);
    assert_eq!(
        events(&p),
        vec![
            (SegAlloc, BASE, 20 * MIB),
            (SegAlloc, BASE + 20 * MIB, 20 * MIB),
            (SegFree, BASE, 20 * MIB),
            (SegAlloc, BASE + 40 * MIB, 22 * MIB),
        ]
    );
    assert_eq!(p.segment_events()[2].alloc_id, 2);
    assert_eq!(p.counters().footprint_bytes, 42 * MIB);

    // 30 MiB cannot fit even with C's segment released (20 + 30 > 44): out of memory, and the
    // cached segment is still there.
    free(&mut p, c.addr);
    let before = state(&p);
    let err = try_alloc(&mut p, 3, 30 * MIB).unwrap_err();
    assert_eq!(
        err,
        AllocError::OutOfMemory {
            requested_bytes: 30 * MIB,
            largest_free_bytes: 22 * MIB,
            footprint_bytes: 42 * MIB,
            limit_bytes: Some(44 * MIB),
        }
    );
    assert_eq!(state(&p), before);
}

#[test]
fn max_split_size_releases_one_oversize_block_before_all() {
    let mut p = policy(mss(40 * MIB), Some(100 * MIB));
    let a = alloc(&mut p, 0, 50 * MIB);
    alloc(&mut p, 1, 30 * MIB);
    free(&mut p, a.addr);
    let small = alloc(&mut p, 2, 1000);
    assert_eq!(small.addr, BASE + 80 * MIB);
    free(&mut p, small.addr);
    // 30 MiB may not take the oversize 50 MiB block, and 82 + 30 > 100. The oversize block
    // alone is released (the small pool's cached segment stays), and the new segment takes
    // its place.
    let c = alloc(&mut p, 3, 30 * MIB);
    assert_eq!(c.addr, BASE);
    assert_eq!(
        events(&p)[3..],
        [(SegFree, BASE, 50 * MIB), (SegAlloc, BASE, 30 * MIB)]
    );
    assert_eq!(free_blocks(&p), vec![(BASE + 80 * MIB, 2 * MIB)]);
}

#[test]
fn max_split_size_releases_oversize_blocks_from_the_largest_down() {
    let mut p = policy(mss(40 * MIB), Some(150 * MIB));
    let a = alloc(&mut p, 0, 44 * MIB);
    let b = alloc(&mut p, 1, 42 * MIB);
    let x = alloc(&mut p, 2, 20 * MIB);
    assert_eq!(
        (a.addr, b.addr, x.addr),
        (BASE, BASE + 44 * MIB, BASE + 86 * MIB)
    );
    free(&mut p, a.addr);
    free(&mut p, b.addr);
    // No single cached block reaches 60 MiB: 44 then 42 are released (86 >= 60).
    let c = alloc(&mut p, 3, 60 * MIB);
    assert_eq!(c.addr, BASE);
    assert_eq!(
        events(&p)[3..],
        [
            (SegFree, BASE, 44 * MIB),
            (SegFree, BASE + 44 * MIB, 42 * MIB),
            (SegAlloc, BASE, 60 * MIB),
        ]
    );
}

#[test]
fn garbage_collection_releases_blocks_at_least_as_old_as_the_mean() {
    let gc = PytorchSettings {
        garbage_collection_threshold_ppm: 300_000,
        ..PytorchSettings::default()
    };
    // Threshold: 0.3 * 200 MiB = 60 MiB.
    let mut p = policy(gc.clone(), Some(200 * MIB));
    let a = alloc(&mut p, 0, 20 * MIB); // search 1
    let k = alloc(&mut p, 1, 30 * MIB); // search 2
    alloc(&mut p, 2, 20 * MIB); // search 3
    free(&mut p, a.addr); // A free since 3 searches
    free(&mut p, k.addr);
    // Two more searches, both served by K and freed again: A ages, K stays young.
    let y = alloc(&mut p, 3, 25 * MIB);
    assert_eq!(y.addr, k.addr);
    free(&mut p, y.addr);
    let y = alloc(&mut p, 4, 25 * MIB);
    free(&mut p, y.addr);
    // Search 6 fails; 70 MiB reserved > 60: ages A 3, K 1, mean 2, so A alone goes.
    let z = alloc(&mut p, 5, 35 * MIB);
    assert_eq!(z.addr, BASE + 70 * MIB);
    assert_eq!(
        events(&p)[3..],
        [
            (SegFree, BASE, 20 * MIB),
            (SegAlloc, BASE + 70 * MIB, 36 * MIB)
        ]
    );
    assert_eq!(free_blocks(&p), vec![(k.addr, 30 * MIB)]);

    // Without a limit the threshold is never consulted.
    let mut q = policy(gc, None);
    for (id, size) in [(0, 20), (1, 30), (2, 20)] {
        alloc(&mut q, id, size * MIB);
    }
    free(&mut q, BASE);
    alloc(&mut q, 5, 35 * MIB);
    assert!(events(&q).iter().all(|e| e.0 == SegAlloc));
}

#[test]
fn expandable_segments_map_pages_into_one_reservation_per_pool() {
    let expandable = PytorchSettings {
        expandable_segments: true,
        ..PytorchSettings::default()
    };
    let mut p = policy(expandable, None);
    // 90 GiB reservations: small pool first, then large.
    let va = 90 << 30;
    let large = BASE + va;
    let s = alloc(&mut p, 0, KIB);
    assert_eq!((s.addr, s.reserved_bytes), (BASE, KIB));
    let b = alloc(&mut p, 1, 5 * MIB);
    assert_eq!((b.addr, b.reserved_bytes), (large, 5 * MIB));
    // 30 MiB: the 15 MiB free after B plus one more 20 MiB page, merged.
    let c = alloc(&mut p, 2, 30 * MIB);
    assert_eq!((c.addr, c.reserved_bytes), (large + 5 * MIB, 30 * MIB));
    assert_eq!(
        events(&p),
        vec![
            (Map, BASE, 2 * MIB),
            (Map, large, 20 * MIB),
            (Map, large + 20 * MIB, 20 * MIB),
        ]
    );
    assert_eq!(p.counters().footprint_bytes, 42 * MIB);
    // Any remainder of 512 B or more is split off, large pool included.
    assert_eq!(
        free_blocks(&p),
        vec![(BASE + KIB, 2 * MIB - KIB), (large + 35 * MIB, 5 * MIB)]
    );
    let segs = p.segments();
    assert_eq!(
        segs.iter()
            .map(|s| (s.addr, s.size_bytes, s.expandable))
            .collect::<Vec<_>>(),
        vec![(BASE, 2 * MIB, true), (large, 40 * MIB, true)]
    );

    // Releasing unmaps whole free pages; a reservation left unmapped is dropped. The small
    // page still holds S.
    free(&mut p, b.addr);
    free(&mut p, c.addr);
    p.empty_cache();
    p.check_invariants().unwrap();
    assert_eq!(events(&p)[3..], [(Unmap, large, 40 * MIB)]);
    assert_eq!(p.counters().footprint_bytes, 2 * MIB);
    assert_eq!(p.segments().len(), 1);
}

#[test]
fn expandable_best_fit_prefers_a_block_that_cannot_grow() {
    let expandable = PytorchSettings {
        expandable_segments: true,
        ..PytorchSettings::default()
    };
    let mut p = policy(expandable, None);
    let base = BASE; // the large pool's reservation comes first here
    alloc(&mut p, 0, 30 * MIB); // maps 40 MiB: 10 MiB free after it
    let x = alloc(&mut p, 1, 16 * MIB); // maps 20 more: 14 MiB free after it
    alloc(&mut p, 2, 4 * MIB); // 10 MiB free after it, then unmapped space
    free(&mut p, x.addr);
    assert_eq!(
        free_blocks(&p),
        vec![(base + 30 * MIB, 16 * MIB), (base + 50 * MIB, 10 * MIB)]
    );
    // 9 MiB: the 10 MiB block is the smallest, but it can grow into the unmapped space; the
    // 16 MiB one cannot, so it is the better fit.
    let y = alloc(&mut p, 3, 9 * MIB);
    assert_eq!((y.addr, y.reserved_bytes), (base + 30 * MIB, 9 * MIB));
}

#[test]
fn expandable_segments_under_a_limit_unmap_then_map_again() {
    let expandable = PytorchSettings {
        expandable_segments: true,
        ..PytorchSettings::default()
    };
    // 64 MiB: the large reservation is 72 MiB rounded up to 20 MiB pages, 80 MiB.
    let mut p = policy(expandable, Some(64 * MIB));
    let a = alloc(&mut p, 0, 20 * MIB);
    let b = alloc(&mut p, 1, 20 * MIB);
    assert_eq!((a.addr, b.addr), (BASE, BASE + 20 * MIB));
    free(&mut p, b.addr);
    // 30 MiB: the free 20 MiB block is too small, 40 + 30 > 64; B's page is unmapped, then
    // two pages are mapped from the same place.
    let c = alloc(&mut p, 2, 30 * MIB);
    assert_eq!((c.addr, c.reserved_bytes), (BASE + 20 * MIB, 30 * MIB));
    assert_eq!(
        events(&p),
        vec![
            (Map, BASE, 20 * MIB),
            (Map, BASE + 20 * MIB, 20 * MIB),
            (Unmap, BASE + 20 * MIB, 20 * MIB),
            (Map, BASE + 20 * MIB, 40 * MIB),
        ]
    );
    assert_eq!(p.counters().footprint_bytes, 60 * MIB);

    // 18 MiB more: 60 + 18 > 64 and nothing is free to unmap: out of memory, unchanged.
    let before = state(&p);
    assert!(matches!(
        try_alloc(&mut p, 3, 18 * MIB),
        Err(AllocError::OutOfMemory { .. })
    ));
    assert_eq!(state(&p), before);
}

#[test]
fn expandable_failure_after_unmapping_puts_everything_back() {
    let expandable = PytorchSettings {
        expandable_segments: true,
        ..PytorchSettings::default()
    };
    let mut p = policy(expandable, Some(44 * MIB));
    let a = alloc(&mut p, 0, 20 * MIB);
    alloc(&mut p, 1, 20 * MIB);
    free(&mut p, a.addr);
    // 22 MiB passes the limit check once A's page is unmapped (20 + 22 <= 44), but no run of
    // address space holds it (A's page is followed by B) and a new reservation would need two
    // pages (20 + 40 > 44): out of memory, with A's page mapped again.
    let before = state(&p);
    assert!(matches!(
        try_alloc(&mut p, 2, 22 * MIB),
        Err(AllocError::OutOfMemory { .. })
    ));
    assert_eq!(state(&p), before);
}
