//! Script mode on hand-made snapshots: carried-in blocks, exact replays, recorded segment
//! events, and recovery from forced divergences. Every run goes through the shadow-checked
//! driver, so the state stays consistent whatever the script says.

use std::sync::Arc;

use super::tests::{MIB, events};
use super::*;
use crate::testing::{DriveOptions, drive_checked};
use crate::trace::OwnedTrace;
use SegmentOpKind::{Alloc as SegAlloc, Free as SegFree, Map, Unmap};

const S0: u64 = 0x1000_0000;
const S1: u64 = 0x2000_0000;

fn small(addr: u64) -> ScriptSegment {
    ScriptSegment {
        addr,
        size_bytes: 2 * MIB,
        small_pool: true,
        stream: 0,
        expandable: false,
    }
}

fn large(addr: u64, size_bytes: u64) -> ScriptSegment {
    ScriptSegment {
        addr,
        size_bytes,
        small_pool: false,
        stream: 0,
        expandable: false,
    }
}

fn op(kind: SegmentOpKind, addr: u64, size_bytes: u64) -> SegmentOp {
    SegmentOp {
        kind,
        addr,
        size_bytes,
    }
}

/// Replays `trace` under `script` with full checks after every event; returns the
/// placements and the policy.
fn replay(
    settings: PytorchSettings,
    script: PytorchScript,
    trace: &OwnedTrace,
) -> (Vec<Option<Placement>>, Pytorch) {
    let config = PolicyConfig {
        pytorch: settings.clone(),
        pytorch_script: Some(Arc::new(script)),
        ..PolicyConfig::default()
    };
    let policy = Pytorch::new(settings, &config).unwrap();
    let view = trace.view().unwrap();
    let d = drive_checked(
        Box::new(policy),
        &view,
        &DriveOptions::strict("pytorch", 16),
    )
    .unwrap();
    assert!(d.failures.is_empty(), "{:?}", d.failures);
    let p = d.policy.as_any().downcast_ref::<Pytorch>().unwrap().clone();
    (d.placements, p)
}

fn addr_and_size(p: Option<Placement>) -> (u64, u64) {
    let p = p.unwrap();
    (p.addr, p.reserved_bytes)
}

#[test]
fn a_faithful_script_matches_and_a_forced_difference_is_recovered() {
    let script = PytorchScript {
        start_segments: vec![small(S0), large(S1, 20 * MIB)],
        recorded_addr: vec![
            S0,
            S1,
            S0 + 1024,
            S1 + 5 * MIB,
            0x3000_0000,
            // The algorithm picks S1 + 11 MiB (the 9 MiB block's start); the trace says 4 MiB
            // further in.
            S1 + 15 * MIB,
            S1 + 17 * MIB,
            0x4000_0000,
        ],
        stream: vec![0; 8],
        carried_in: 2,
        segment_ops: vec![
            (4, op(SegAlloc, 0x3000_0000, 10 * MIB)),
            (7, op(SegFree, 0x3000_0000, 10 * MIB)),
            (7, op(SegAlloc, 0x4000_0000, 10 * MIB)),
        ],
    };
    let mut trace = OwnedTrace::new();
    for (t, size) in [1000, 5 * MIB, 2000, 6 * MIB, 10 * MIB, 2 * MIB, 3 * MIB]
        .into_iter()
        .enumerate()
    {
        trace.alloc(t as i64, size);
    }
    trace.free(7, 4);
    trace.alloc(8, 10 * MIB);
    let (placements, p) = replay(PytorchSettings::default(), script, &trace);
    assert_eq!(addr_and_size(placements[0]), (S0, 1024));
    assert_eq!(addr_and_size(placements[1]), (S1, 5 * MIB));
    assert_eq!(addr_and_size(placements[2]), (S0 + 1024, 2048));
    assert_eq!(addr_and_size(placements[3]), (S1 + 5 * MIB, 6 * MIB));
    assert_eq!(addr_and_size(placements[4]), (0x3000_0000, 10 * MIB));
    // Went on from the recorded placement: 4 MiB free before it, 3 MiB after.
    assert_eq!(addr_and_size(placements[5]), (S1 + 15 * MIB, 2 * MIB));
    // So the next best fit is the recorded one again.
    assert_eq!(addr_and_size(placements[6]), (S1 + 17 * MIB, 3 * MIB));
    // The trace's segment_free came first, so a new segment, at the trace's address.
    assert_eq!(addr_and_size(placements[7]), (0x4000_0000, 10 * MIB));
    let f = p.fidelity().unwrap();
    assert_eq!(
        (
            f.checked,
            f.address_matches,
            f.segment_allocs_checked,
            f.segment_alloc_matches
        ),
        (6, 5, 2, 2)
    );
    assert_eq!(f.divergences, 1);
    let d = f.first_divergence.as_ref().unwrap();
    assert_eq!(
        (
            d.alloc_id,
            d.requested_bytes,
            d.recorded_addr,
            d.policy_addr
        ),
        (5, 2 * MIB, S1 + 15 * MIB, Some(S1 + 11 * MIB))
    );
    assert!(
        d.what.contains("went on from the recorded placement"),
        "{}",
        d.what
    );
    assert_eq!(
        events(&p),
        vec![
            (SegAlloc, 0x3000_0000, 10 * MIB),
            (SegFree, 0x3000_0000, 10 * MIB),
            (SegAlloc, 0x4000_0000, 10 * MIB),
        ]
    );
    let tags: Vec<u32> = p.segment_events().iter().map(|e| e.alloc_id).collect();
    assert_eq!(tags, vec![4, 7, 7]);
    assert_eq!(p.segments().len(), 3);
}

#[test]
fn carried_in_blocks_keep_the_slack_the_split_rule_leaves_in_either_order() {
    const L: u64 = 0x5000_0000;
    for reversed in [false, true] {
        // Large pool: 0.5 MiB between the two blocks is the first one's slack. Small pool:
        // 512 B between them is a free block.
        let mut carried = [
            (L, 5 * MIB),
            (L + 5 * MIB + MIB / 2, 3 * MIB),
            (S0, 1000),
            (S0 + 1536, 1000),
        ];
        if reversed {
            carried.reverse();
        }
        let script = PytorchScript {
            start_segments: vec![small(S0), large(L, 20 * MIB)],
            recorded_addr: carried.iter().map(|c| c.0).collect(),
            stream: vec![0; 4],
            carried_in: 4,
            segment_ops: Vec::new(),
        };
        let mut trace = OwnedTrace::new();
        for (t, c) in carried.iter().enumerate() {
            trace.alloc(t as i64, c.1);
        }
        let (placements, p) = replay(PytorchSettings::default(), script, &trace);
        let by_addr = |addr: u64| {
            placements
                .iter()
                .flatten()
                .find(|pl| pl.addr == addr)
                .map(|pl| pl.reserved_bytes)
        };
        assert_eq!(by_addr(L), Some(5 * MIB + MIB / 2), "reversed: {reversed}");
        assert_eq!(by_addr(L + 5 * MIB + MIB / 2), Some(3 * MIB));
        assert_eq!(by_addr(S0), Some(1024));
        assert_eq!(by_addr(S0 + 1536), Some(1024));
        assert_eq!(
            super::tests::free_blocks(&p),
            vec![
                (S0 + 1024, 512),
                (S0 + 2560, 2 * MIB - 2560),
                (L + 8 * MIB + MIB / 2, 11 * MIB + MIB / 2),
            ]
        );
        let f = p.fidelity().unwrap();
        assert_eq!((f.checked, f.divergences), (0, 0));
    }
}

#[test]
fn segment_decisions_that_differ_are_counted_and_the_trace_wins() {
    const NEW: u64 = 0x6000_0000;
    const OTHER: u64 = 0x7000_0000;
    let script = PytorchScript {
        start_segments: vec![large(S1, 10 * MIB)],
        recorded_addr: vec![NEW, OTHER, S1],
        stream: vec![0; 3],
        carried_in: 0,
        segment_ops: vec![
            // A 20 MiB segment where get_allocation_size(12 MiB + 512) is 14 MiB.
            (0, op(SegAlloc, NEW, 20 * MIB)),
            // A segment the algorithm does not need (the rest of NEW serves 5 MiB).
            (1, op(SegAlloc, OTHER, 20 * MIB)),
        ],
    };
    let mut trace = OwnedTrace::new();
    trace.alloc(0, 12 * MIB + 1);
    trace.alloc(1, 5 * MIB);
    // 40 MiB: the algorithm needs a segment the trace does not make; the trace has the block
    // in the 10 MiB start segment, where it cannot be, so the algorithm's placement stands.
    trace.alloc(2, 40 * MIB);
    let (placements, p) = replay(PytorchSettings::default(), script, &trace);
    assert_eq!(placements[0].unwrap().addr, NEW);
    assert_eq!(placements[1].unwrap().addr, OTHER);
    let own = placements[2].unwrap().addr;
    assert!(own >= DEVICE_BASE_ADDR, "{own:#x}");
    let f = p.fidelity().unwrap();
    assert_eq!(
        (
            f.checked,
            f.address_matches,
            f.segment_allocs_checked,
            f.segment_alloc_matches
        ),
        (3, 1, 3, 0)
    );
    assert_eq!(f.divergences, 3);
    let first = f.first_divergence.as_ref().unwrap();
    assert_eq!((first.alloc_id, first.policy_addr), (0, Some(NEW)));
    assert!(
        first.what.contains("cudaMalloc of 20971520 B"),
        "{}",
        first.what
    );
    // The trace's extra segment exists (it happened); the 5 MiB went there.
    assert_eq!(
        events(&p),
        vec![
            (SegAlloc, NEW, 20 * MIB),
            (SegAlloc, OTHER, 20 * MIB),
            (SegAlloc, own, 40 * MIB),
        ]
    );
    let segs = p.segments();
    assert_eq!(segs.len(), 4);
}

#[test]
fn a_recorded_placement_inside_a_free_block_is_carved_out_of_it() {
    let script = PytorchScript {
        start_segments: vec![large(S1, 40 * MIB)],
        recorded_addr: vec![S1, S1 + 25 * MIB],
        stream: vec![0; 2],
        carried_in: 1,
        segment_ops: Vec::new(),
    };
    let mut trace = OwnedTrace::new();
    // Carried in: 24 MiB at S1, so 16 MiB free after it.
    trace.alloc(0, 24 * MIB);
    // The algorithm puts 14 MiB at S1 + 24 MiB; the trace has it 1 MiB further in. Carved
    // there, the 1 MiB after it is not split off (large pool).
    trace.alloc(1, 14 * MIB);
    let (placements, p) = replay(PytorchSettings::default(), script, &trace);
    assert_eq!(addr_and_size(placements[1]), (S1 + 25 * MIB, 15 * MIB));
    assert_eq!(super::tests::free_blocks(&p), vec![(S1 + 24 * MIB, MIB)]);
    assert!(p.segment_events().is_empty());
    let d = p.fidelity().unwrap().first_divergence.clone().unwrap();
    assert_eq!(d.policy_addr, Some(S1 + 24 * MIB));
}

#[test]
fn a_segment_the_policy_makes_but_does_not_use_is_taken_back() {
    let mss = PytorchSettings {
        max_split_size_bytes: Some(40 * MIB),
        ..PytorchSettings::default()
    };
    let script = PytorchScript {
        start_segments: vec![large(S1, 50 * MIB)],
        recorded_addr: vec![S1],
        stream: vec![0],
        carried_in: 0,
        segment_ops: Vec::new(),
    };
    let mut trace = OwnedTrace::new();
    // 10 MiB may not take the oversize 50 MiB block: the algorithm makes a segment the trace
    // does not have, and the trace puts the block in the oversize one.
    trace.alloc(0, 10 * MIB);
    let (placements, p) = replay(mss, script, &trace);
    assert_eq!(addr_and_size(placements[0]), (S1, 10 * MIB));
    assert!(p.segment_events().is_empty());
    assert_eq!(p.segments().len(), 1);
    let f = p.fidelity().unwrap();
    assert_eq!(
        (
            f.checked,
            f.address_matches,
            f.segment_allocs_checked,
            f.segment_alloc_matches
        ),
        (1, 0, 1, 0)
    );
    let d = f.first_divergence.as_ref().unwrap();
    assert!(d.policy_addr.is_some_and(|a| a >= DEVICE_BASE_ADDR));
    assert!(d.what.contains("the trace made nothing"), "{}", d.what);
}

#[test]
fn an_unplaceable_recorded_address_keeps_the_policys_choice() {
    let script = PytorchScript {
        start_segments: vec![large(S1, 40 * MIB)],
        recorded_addr: vec![S1 + 2 * MIB],
        stream: vec![0],
        carried_in: 0,
        segment_ops: vec![(0, op(SegFree, S1, 40 * MIB))],
    };
    let mut trace = OwnedTrace::new();
    trace.alloc(0, 30 * MIB);
    // The trace frees the start segment before the request yet records the block inside it:
    // the release stands, so the algorithm's own segment does too, and the divergence says so.
    let (placements, p) = replay(PytorchSettings::default(), script, &trace);
    let pl = placements[0].unwrap();
    assert!(pl.addr >= DEVICE_BASE_ADDR);
    let f = p.fidelity().unwrap();
    assert_eq!((f.checked, f.address_matches, f.divergences), (1, 0, 1));
    let what = &f.first_divergence.as_ref().unwrap().what;
    assert!(what.contains("not free here"), "{what}");
    assert_eq!(
        events(&p),
        vec![(SegFree, S1, 40 * MIB), (SegAlloc, pl.addr, 30 * MIB)]
    );
}

#[test]
fn expandable_scripts_follow_recorded_maps_and_unmaps() {
    const E: u64 = 0x8000_0000;
    let settings = PytorchSettings {
        expandable_segments: true,
        ..PytorchSettings::default()
    };
    let script = PytorchScript {
        start_segments: vec![ScriptSegment {
            expandable: true,
            ..large(E, 20 * MIB)
        }],
        recorded_addr: vec![E, E],
        stream: vec![0; 2],
        carried_in: 0,
        segment_ops: vec![
            (0, op(Map, E + 20 * MIB, 20 * MIB)),
            (1, op(Unmap, E + 20 * MIB, 20 * MIB)),
        ],
    };
    let mut trace = OwnedTrace::new();
    trace.alloc(0, 30 * MIB);
    trace.free(1, 0);
    trace.alloc(2, 15 * MIB);
    let (placements, p) = replay(settings, script, &trace);
    assert_eq!(addr_and_size(placements[0]), (E, 30 * MIB));
    assert_eq!(addr_and_size(placements[1]), (E, 15 * MIB));
    let f = p.fidelity().unwrap();
    assert_eq!(
        (
            f.checked,
            f.address_matches,
            f.segment_allocs_checked,
            f.segment_alloc_matches
        ),
        (2, 2, 1, 1)
    );
    assert_eq!(f.divergences, 0);
    assert_eq!(
        events(&p),
        vec![
            (Map, E + 20 * MIB, 20 * MIB),
            (Unmap, E + 20 * MIB, 20 * MIB)
        ]
    );
    assert_eq!(p.counters().footprint_bytes, 20 * MIB);
    assert_eq!(p.segments()[0].size_bytes, 20 * MIB);
}

#[test]
fn scripts_that_cannot_be_laid_out_are_refused() {
    let overlapping = PytorchScript {
        start_segments: vec![large(S1, 20 * MIB), small(S1 + 2 * MIB)],
        ..PytorchScript::default()
    };
    let config = PolicyConfig {
        pytorch_script: Some(Arc::new(overlapping)),
        ..PolicyConfig::default()
    };
    assert!(Pytorch::new(PytorchSettings::default(), &config).is_err());
    let ragged = PytorchScript {
        start_segments: vec![ScriptSegment {
            expandable: true,
            ..large(S1, 3 * MIB)
        }],
        ..PytorchScript::default()
    };
    let config = PolicyConfig {
        pytorch_script: Some(Arc::new(ragged)),
        ..PolicyConfig::default()
    };
    assert!(Pytorch::new(PytorchSettings::default(), &config).is_err());
}
