//! Hand-made scenarios for the rules without a limit: rounding, pools, segment sizes, best
//! fit, split and merge, and the `max_split_size` oversize rules. Addresses are computed by
//! hand from the rules in the module documentation.

use super::rounding::division_interval;
use super::*;
use crate::heap::BlockState;

pub(super) const KIB: u64 = 1 << 10;
pub(super) const MIB: u64 = 1 << 20;
pub(super) const BASE: u64 = DEVICE_BASE_ADDR;

pub(super) fn policy(settings: PytorchSettings, limit_bytes: Option<u64>) -> Pytorch {
    let config = PolicyConfig {
        limit_bytes,
        ..PolicyConfig::default()
    };
    Pytorch::new(settings, &config).unwrap()
}

pub(super) fn try_alloc(
    p: &mut Pytorch,
    id: u32,
    size_bytes: u64,
) -> Result<Placement, AllocError> {
    let r = p.alloc(Request {
        id,
        size_bytes,
        align_bytes: 16,
    });
    p.check_invariants().unwrap();
    r
}

pub(super) fn alloc(p: &mut Pytorch, id: u32, size_bytes: u64) -> Placement {
    try_alloc(p, id, size_bytes).unwrap()
}

pub(super) fn free(p: &mut Pytorch, addr: u64) {
    p.free(addr).unwrap();
    p.check_invariants().unwrap();
}

/// `(kind, addr, size)` of every segment event.
pub(super) fn events(p: &Pytorch) -> Vec<(SegmentOpKind, u64, u64)> {
    p.segment_events()
        .iter()
        .map(|e| (e.op.kind, e.op.addr, e.op.size_bytes))
        .collect()
}

pub(super) fn free_blocks(p: &Pytorch) -> Vec<(u64, u64)> {
    let mut blocks = Vec::new();
    p.blocks(&mut blocks);
    blocks
        .iter()
        .filter(|b| b.state == BlockState::Free)
        .map(|b| (b.addr, b.len_bytes))
        .collect()
}

fn divisions(interval: usize, d: u32) -> PytorchSettings {
    let mut s = PytorchSettings::default();
    s.roundup_power2_divisions[interval] = d;
    s
}

use SegmentOpKind::{Alloc as SegAlloc, Free as SegFree};

#[test]
fn round_size_has_a_512_byte_floor_and_grid() {
    let s = PytorchSettings::default();
    assert_eq!(round_size(1, &s), 512);
    assert_eq!(round_size(511, &s), 512);
    assert_eq!(round_size(512, &s), 512);
    assert_eq!(round_size(513, &s), 1024);
    assert_eq!(round_size(1000, &s), 1024);
    assert_eq!(round_size(MIB, &s), MIB);
    assert_eq!(round_size(MIB + 1, &s), MIB + 512);
    assert_eq!(round_size(5 * MIB + 1, &s), 5 * MIB + 512);
    assert_eq!(round_size(u64::MAX, &s), u64::MAX - 511);
}

#[test]
fn next_division_rounds_to_equal_steps_of_the_power_of_two_interval() {
    // The source's own example: [1024, 2048) in 4 steps of 256.
    assert_eq!(roundup_power2_next_division(1200, 4), 1280);
    assert_eq!(roundup_power2_next_division(1280, 4), 1280);
    assert_eq!(roundup_power2_next_division(1024, 4), 1024);
    assert_eq!(roundup_power2_next_division(5 * MIB + 1, 4), 6 * MIB);
    assert_eq!(roundup_power2_next_division(5 * MIB + 1, 2), 6 * MIB);
    assert_eq!(
        roundup_power2_next_division(5 * MIB + 1, 8),
        5 * MIB + MIB / 2
    );
    // More divisions than bytes in the interval: the step is 0, the next power of two.
    assert_eq!(roundup_power2_next_division(5, 8), 8);
    assert_eq!(roundup_power2_next_division(3, 4), 4);
}

#[test]
fn divisions_apply_per_interval_and_only_above_512_times_d() {
    assert_eq!(division_interval(1), 0);
    assert_eq!(division_interval(2 * MIB - 1), 0);
    assert_eq!(division_interval(2 * MIB), 1);
    assert_eq!(division_interval(5 * MIB), 2);
    assert_eq!(division_interval(32 << 30), 15);
    assert_eq!(division_interval(1 << 45), 15);
    // 1200 B is not above 512 * 4, so plain 512 rounding, even with 4 divisions.
    assert_eq!(round_size(1200, &divisions(0, 4)), 1536);
    assert_eq!(round_size(3000, &divisions(0, 4)), 3072);
    assert_eq!(round_size(1300 * KIB, &divisions(0, 4)), 1536 * KIB);
    // 5 MiB + 1 is in interval 2 ([4, 8) MiB).
    assert_eq!(round_size(5 * MIB + 1, &divisions(2, 4)), 6 * MIB);
    assert_eq!(round_size(5 * MIB + 1, &divisions(1, 4)), 5 * MIB + 512);
    // One division is off, and a power of two stays.
    assert_eq!(round_size(5 * MIB + 1, &divisions(2, 1)), 5 * MIB + 512);
    assert_eq!(round_size(4 * MIB, &divisions(2, 4)), 4 * MIB);
    let p = policy(divisions(2, 4), None);
    assert_eq!(p.round_size(5 * MIB + 1), 6 * MIB);
}

#[test]
fn settings_are_validated_as_pytorch_parses_them() {
    let ok = PytorchSettings::default();
    assert!(ok.validate().is_ok());
    let bad = [
        PytorchSettings {
            max_split_size_bytes: Some(20 * MIB),
            ..ok.clone()
        },
        PytorchSettings {
            max_non_split_rounding_bytes: 19 * MIB,
            ..ok.clone()
        },
        divisions(3, 3),
        PytorchSettings {
            garbage_collection_threshold_ppm: 1_000_000,
            ..ok.clone()
        },
    ];
    for s in bad {
        assert!(
            Pytorch::new(s.clone(), &PolicyConfig::default()).is_err(),
            "{s:?}"
        );
    }
    let fine = PytorchSettings {
        max_split_size_bytes: Some(20 * MIB + 1),
        ..ok
    };
    assert!(fine.validate().is_ok());
}

#[test]
fn pools_part_at_one_mebibyte_and_segments_take_their_sizes() {
    let mut p = policy(PytorchSettings::default(), None);
    // Exactly 1 MiB is small: a 2 MiB segment.
    assert_eq!(alloc(&mut p, 0, MIB).addr, BASE);
    // 1 MiB + 1 rounds to 1 MiB + 512: large, a 20 MiB segment, 19 MiB - 512 split off.
    assert_eq!(alloc(&mut p, 1, MIB + 1).addr, BASE + 2 * MIB);
    // The split-off rest serves the next large request; 9 MiB stay free after it.
    assert_eq!(alloc(&mut p, 2, 10 * MIB - 512).addr, BASE + 3 * MIB + 512);
    // From 10 MiB on, a new segment is the request rounded up to 2 MiB...
    assert_eq!(alloc(&mut p, 3, 10 * MIB).addr, BASE + 22 * MIB);
    assert_eq!(alloc(&mut p, 4, 11 * MIB).addr, BASE + 32 * MIB);
    // ...and below it 20 MiB.
    assert_eq!(alloc(&mut p, 5, 9 * MIB + MIB / 2).addr, BASE + 44 * MIB);
    // The large pool's free 9 MiB never serve a small request: it takes the small segment's
    // second half.
    assert_eq!(alloc(&mut p, 6, 1000).addr, BASE + MIB);
    assert_eq!(
        events(&p),
        vec![
            (SegAlloc, BASE, 2 * MIB),
            (SegAlloc, BASE + 2 * MIB, 20 * MIB),
            (SegAlloc, BASE + 22 * MIB, 10 * MIB),
            (SegAlloc, BASE + 32 * MIB, 12 * MIB),
            (SegAlloc, BASE + 44 * MIB, 20 * MIB),
        ]
    );
    let ids: Vec<u32> = p.segment_events().iter().map(|e| e.alloc_id).collect();
    assert_eq!(ids, vec![0, 1, 3, 4, 5]);
    assert_eq!(p.counters().footprint_bytes, 64 * MIB);
    let segs = p.segments();
    assert_eq!(segs.len(), 5);
    assert!(segs[0].small_pool && !segs[1].small_pool);
    assert_eq!(allocation_size(MIB), 2 * MIB);
    assert_eq!(allocation_size(MIB + 512), 20 * MIB);
    assert_eq!(allocation_size(10 * MIB - 512), 20 * MIB);
    assert_eq!(allocation_size(10 * MIB + 1), 12 * MIB);
}

#[test]
fn best_fit_takes_the_smallest_block_then_the_lowest_address() {
    let mut p = policy(PytorchSettings::default(), None);
    // [A 4K][B 8K][C 4K][D 4K][E 4K][F 4K][rest] in one small segment.
    let sizes = [4 * KIB, 8 * KIB, 4 * KIB, 4 * KIB, 4 * KIB, 4 * KIB];
    let addrs: Vec<u64> = (0u32..)
        .zip(sizes)
        .map(|(id, s)| alloc(&mut p, id, s).addr)
        .collect();
    assert_eq!(addrs, [0, 4, 12, 16, 20, 24].map(|k| BASE + k * KIB));
    // Holes: 8K at +4K, 4K at +16K, 4K at +24K.
    free(&mut p, BASE + 4 * KIB);
    free(&mut p, BASE + 16 * KIB);
    free(&mut p, BASE + 24 * KIB);
    // F's hole merged with the tail; the 4K hole at +16K is the best fit.
    assert_eq!(alloc(&mut p, 6, 4 * KIB).addr, BASE + 16 * KIB);
    // Two blocks of 8K and more: the 8K hole is smaller than the tail.
    assert_eq!(alloc(&mut p, 7, 3 * KIB).addr, BASE + 4 * KIB);
    // What is left of it (5K at +7K) is smaller than the tail.
    assert_eq!(alloc(&mut p, 8, 5 * KIB).addr, BASE + 7 * KIB);
    assert_eq!(alloc(&mut p, 9, 5 * KIB).addr, BASE + 24 * KIB);
}

#[test]
fn equal_blocks_go_lowest_address_first() {
    let mut p = policy(PytorchSettings::default(), None);
    for id in 0..5 {
        alloc(&mut p, id, 2 * KIB);
    }
    // Equal holes at +6K and +2K (freed in that order).
    free(&mut p, BASE + 6 * KIB);
    free(&mut p, BASE + 2 * KIB);
    assert_eq!(alloc(&mut p, 5, 2 * KIB).addr, BASE + 2 * KIB);
    assert_eq!(alloc(&mut p, 6, 2 * KIB).addr, BASE + 6 * KIB);
}

#[test]
fn small_pool_splits_any_remainder_of_512_bytes() {
    let mut p = policy(PytorchSettings::default(), None);
    let a = alloc(&mut p, 0, 1000);
    assert_eq!((a.addr, a.reserved_bytes), (BASE, 1024));
    assert_eq!(free_blocks(&p), vec![(BASE + 1024, 2 * MIB - 1024)]);
    // Fill to 512 B short of the end: the 512 B left is split off too.
    let b = alloc(&mut p, 1, MIB);
    let c = alloc(&mut p, 2, MIB - 1536);
    assert_eq!(
        (b.addr, c.addr, c.reserved_bytes),
        (BASE + 1024, BASE + MIB + 1024, MIB - 1536)
    );
    assert_eq!(free_blocks(&p), vec![(BASE + 2 * MIB - 512, 512)]);
}

#[test]
fn large_pool_keeps_a_remainder_of_up_to_one_mebibyte() {
    let mut p = policy(PytorchSettings::default(), None);
    // 5 MiB in a 20 MiB segment: 15 MiB split off.
    let a = alloc(&mut p, 0, 5 * MIB);
    assert_eq!((a.addr, a.reserved_bytes), (BASE, 5 * MIB));
    // 14.5 MiB from the 15 MiB block: 0.5 MiB is not split off.
    let b = alloc(&mut p, 1, 14 * MIB + MIB / 2);
    assert_eq!((b.addr, b.reserved_bytes), (BASE + 5 * MIB, 15 * MIB));
    let c = p.counters();
    assert_eq!(
        (c.live_bytes, c.allocated_bytes),
        (19 * MIB + MIB / 2, 20 * MIB)
    );
    free(&mut p, b.addr);
    // Exactly 1 MiB left: still not split (the rule is "more than 1 MiB").
    let d = alloc(&mut p, 2, 14 * MIB);
    assert_eq!((d.addr, d.reserved_bytes), (BASE + 5 * MIB, 15 * MIB));
    free(&mut p, d.addr);
    // 1 MiB + 512 left: split.
    let e = alloc(&mut p, 3, 14 * MIB - 512);
    assert_eq!((e.addr, e.reserved_bytes), (BASE + 5 * MIB, 14 * MIB - 512));
    assert_eq!(free_blocks(&p), vec![(BASE + 19 * MIB - 512, MIB + 512)]);
    assert!(should_split(
        15 * MIB,
        14 * MIB - 512,
        false,
        &PytorchSettings::default()
    ));
    assert!(!should_split(
        15 * MIB,
        14 * MIB,
        false,
        &PytorchSettings::default()
    ));
    assert!(should_split(
        2 * MIB,
        2 * MIB - 512,
        true,
        &PytorchSettings::default()
    ));
}

#[test]
fn a_free_merges_with_both_neighbours_but_never_across_segments() {
    let mut p = policy(PytorchSettings::default(), None);
    for id in 0..3 {
        alloc(&mut p, id, 4 * KIB);
    }
    free(&mut p, BASE);
    free(&mut p, BASE + 8 * KIB);
    assert_eq!(
        free_blocks(&p),
        vec![(BASE, 4 * KIB), (BASE + 8 * KIB, 2 * MIB - 8 * KIB)]
    );
    free(&mut p, BASE + 4 * KIB);
    assert_eq!(free_blocks(&p), vec![(BASE, 2 * MIB)]);

    // Two adjacent segments stay two blocks when both are free.
    let mut q = policy(PytorchSettings::default(), None);
    assert_eq!(alloc(&mut q, 0, MIB).addr, BASE);
    assert_eq!(alloc(&mut q, 1, MIB).addr, BASE + MIB);
    assert_eq!(alloc(&mut q, 2, MIB).addr, BASE + 2 * MIB);
    for addr in [BASE, BASE + MIB, BASE + 2 * MIB] {
        free(&mut q, addr);
    }
    assert_eq!(
        free_blocks(&q),
        vec![(BASE, 2 * MIB), (BASE + 2 * MIB, 2 * MIB)]
    );
    assert_eq!(q.counters().free_blocks, 2);
}

#[test]
fn under_max_split_size_an_oversize_block_is_never_taken() {
    let mss = PytorchSettings {
        max_split_size_bytes: Some(40 * MIB),
        ..PytorchSettings::default()
    };
    let mut p = policy(mss, None);
    let big = alloc(&mut p, 0, 50 * MIB);
    free(&mut p, big.addr);
    // 30 MiB would fit the cached 50 MiB block, but it is oversize: a new segment.
    let a = alloc(&mut p, 1, 30 * MIB);
    assert_eq!((a.addr, a.reserved_bytes), (BASE + 50 * MIB, 30 * MIB));
    assert_eq!(free_blocks(&p), vec![(BASE, 50 * MIB)]);
    // Without the option the cached block is split.
    let mut q = policy(PytorchSettings::default(), None);
    let big = alloc(&mut q, 0, 50 * MIB);
    free(&mut q, big.addr);
    let b = alloc(&mut q, 1, 30 * MIB);
    assert_eq!((b.addr, b.reserved_bytes), (BASE, 30 * MIB));
}

#[test]
fn at_max_split_size_a_block_may_exceed_the_request_by_less_than_the_rounding_limit() {
    let mss = PytorchSettings {
        max_split_size_bytes: Some(40 * MIB),
        ..PytorchSettings::default()
    };
    let mut p = policy(mss.clone(), None);
    let big = alloc(&mut p, 0, 64 * MIB);
    free(&mut p, big.addr);
    // 41 MiB: 64 >= 41 + 20, so not the cached block; a 42 MiB segment.
    assert_eq!(alloc(&mut p, 1, 41 * MIB).addr, BASE + 64 * MIB);
    // 45 MiB: 64 < 45 + 20, so the cached block, whole (oversize blocks are never split).
    let c = alloc(&mut p, 2, 45 * MIB);
    assert_eq!((c.addr, c.reserved_bytes), (BASE, 64 * MIB));

    // A larger max_non_split_rounding lets the 41 MiB request have it.
    let loose = PytorchSettings {
        max_non_split_rounding_bytes: 30 * MIB,
        ..mss
    };
    let mut q = policy(loose, None);
    let big = alloc(&mut q, 0, 64 * MIB);
    free(&mut q, big.addr);
    let d = alloc(&mut q, 1, 41 * MIB);
    assert_eq!((d.addr, d.reserved_bytes), (BASE, 64 * MIB));
    assert_eq!(events(&q), vec![(SegAlloc, BASE, 64 * MIB)]);
}

#[test]
fn zero_bytes_and_wide_alignment_are_refused_and_bad_frees_are_errors() {
    let mut p = policy(PytorchSettings::default(), None);
    assert!(matches!(
        try_alloc(&mut p, 0, 0),
        Err(AllocError::Unsupported(_))
    ));
    let wide = p.alloc(Request {
        id: 1,
        size_bytes: 10,
        align_bytes: 1024,
    });
    assert!(matches!(wide, Err(AllocError::Unsupported(_))));
    let ok = p
        .alloc(Request {
            id: 2,
            size_bytes: 10,
            align_bytes: 512,
        })
        .unwrap();
    assert_eq!(ok.addr, BASE);
    assert_eq!(p.free(BASE + 512), Err(FreeError::UnknownAddr(BASE + 512)));
    free(&mut p, BASE);
    assert_eq!(p.free(BASE), Err(FreeError::UnknownAddr(BASE)));
    assert!(p.fidelity().is_none());
}

#[test]
fn empty_cache_frees_wholly_free_segments_only() {
    let mut p = policy(PytorchSettings::default(), None);
    let a = alloc(&mut p, 0, 1000);
    alloc(&mut p, 1, 1000);
    let big = alloc(&mut p, 2, 12 * MIB);
    free(&mut p, a.addr);
    free(&mut p, big.addr);
    p.empty_cache();
    p.check_invariants().unwrap();
    assert_eq!(
        events(&p),
        vec![
            (SegAlloc, BASE, 2 * MIB),
            (SegAlloc, BASE + 2 * MIB, 12 * MIB),
            (SegFree, BASE + 2 * MIB, 12 * MIB),
        ]
    );
    assert_eq!(p.segment_events()[2].alloc_id, u32::MAX);
    assert_eq!(p.counters().footprint_bytes, 2 * MIB);
    // The freed range is the lowest fit again.
    assert_eq!(alloc(&mut p, 3, 11 * MIB).addr, BASE + 2 * MIB);
}
