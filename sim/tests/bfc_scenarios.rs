//! Hand-made BFC scenarios with exact expected addresses (reference: `allocators.md` section 1),
//! a naive re-statement of the algorithm driven by proptest, and checkpoint round-trips.
// Test helpers outside `#[test]` fns (and the shared `support` reader) unwrap freely.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use allocview_sim::heap::{AllocError, Block, BlockState, Request};
use allocview_sim::policy::Policy;
use allocview_sim::policy::bfc::{
    Bfc, BfcOptions, BfcStateError, BfcStats, ChunkInfo, LiveChunk, RegionInfo, bin_num_for_size,
    rounded_bytes,
};
use allocview_sim::trace::{EventKind, NO_ALLOC_ID};
use proptest::prelude::*;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn growth(limit_bytes: u64) -> Bfc {
    Bfc::new(BfcOptions {
        limit_bytes,
        allow_growth: true,
        ..BfcOptions::default()
    })
}

fn fixed(limit_bytes: u64) -> Bfc {
    Bfc::new(BfcOptions {
        limit_bytes,
        allow_growth: false,
        ..BfcOptions::default()
    })
}

/// Allocates through the `Policy` trait and returns (addr, chunk bytes).
fn alloc(bfc: &mut Bfc, id: u32, size_bytes: u64) -> (u64, u64) {
    let p = Policy::alloc(
        bfc,
        Request {
            id,
            size_bytes,
            align_bytes: 16,
        },
    )
    .unwrap_or_else(|e| panic!("alloc {size_bytes}: {e}"));
    bfc.check_invariants().unwrap();
    (p.addr, p.reserved_bytes)
}

fn free(bfc: &mut Bfc, addr: u64) {
    Policy::free(bfc, addr).unwrap();
    bfc.check_invariants().unwrap();
}

fn region_sizes(bfc: &Bfc) -> Vec<u64> {
    bfc.regions().iter().map(|r| r.size_bytes).collect()
}

/// (addr, size, in_use) of every chunk.
fn chunk_map(bfc: &Bfc) -> Vec<(u64, u64, bool)> {
    bfc.chunks()
        .iter()
        .map(|c| (c.addr, c.size_bytes, c.in_use))
        .collect()
}

#[test]
fn rounding_and_bins_follow_tensorflow() {
    assert_eq!(rounded_bytes(1), 256);
    assert_eq!(rounded_bytes(256), 256);
    assert_eq!(rounded_bytes(257), 512);
    assert_eq!(rounded_bytes(1000), 1024);
    assert_eq!(bin_num_for_size(1), 0);
    assert_eq!(bin_num_for_size(511), 0);
    assert_eq!(bin_num_for_size(512), 1);
    assert_eq!(bin_num_for_size(2 * MIB - 1024), 12);
    assert_eq!(bin_num_for_size(2 * MIB), 13);
    assert_eq!(bin_num_for_size(256 * MIB - 1), 19);
    assert_eq!(bin_num_for_size(256 * MIB), 20);
    assert_eq!(bin_num_for_size(64 * GIB), 20);
}

#[test]
fn worked_example_first_request_and_region_doubling() {
    let mut bfc = growth(10 * GIB);
    assert_eq!(bfc.curr_region_allocation_bytes(), 2 * MIB);
    let (a, chunk) = alloc(&mut bfc, 0, 1000);
    assert_eq!((a, chunk), (0, 1024));
    assert_eq!(region_sizes(&bfc), [2 * MIB]);
    assert_eq!(bfc.curr_region_allocation_bytes(), 4 * MIB);
    assert_eq!(
        chunk_map(&bfc),
        [(0, 1024, true), (1024, 2 * MIB - 1024, false)]
    );
    let bins = bfc.bins();
    assert_eq!(bins.len(), 21);
    assert_eq!(bins[12].free_chunks, [(1024, 2 * MIB - 1024)]);
    assert!(
        bins.iter()
            .enumerate()
            .all(|(b, bin)| b == 12 || bin.free_chunks.is_empty())
    );

    // Requests that fit no free chunk each add a region of the current target, which then
    // doubles: 4, 8, 16 MiB.
    let (b, _) = alloc(&mut bfc, 1, 2 * MIB);
    assert_eq!(b, 2 * MIB);
    let (c, _) = alloc(&mut bfc, 2, 4 * MIB);
    assert_eq!(c, 6 * MIB);
    let (d, _) = alloc(&mut bfc, 3, 8 * MIB + 1);
    assert_eq!(d, 14 * MIB);
    assert_eq!(region_sizes(&bfc), [2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB]);
    assert_eq!(bfc.curr_region_allocation_bytes(), 32 * MIB);

    // 100 MiB > 32 MiB: the target doubles to 128 MiB, that region is made, and the target is
    // not doubled again.
    let (e, _) = alloc(&mut bfc, 4, 100 * MIB);
    assert_eq!(e, 30 * MIB);
    assert_eq!(bfc.regions().last().unwrap().size_bytes, 128 * MIB);
    assert_eq!(bfc.curr_region_allocation_bytes(), 128 * MIB);
    // The next Extend uses that target and doubles it.
    alloc(&mut bfc, 5, 30 * MIB);
    assert_eq!(bfc.regions().last().unwrap().size_bytes, 128 * MIB);
    assert_eq!(bfc.curr_region_allocation_bytes(), 256 * MIB);
    assert_eq!(bfc.total_region_allocated_bytes(), 286 * MIB);
}

#[test]
fn split_rule_boundaries() {
    // Chunk exactly 2x the rounded request: split, low part allocated.
    let mut bfc = fixed(2048);
    assert_eq!(alloc(&mut bfc, 0, 1000), (0, 1024));
    assert_eq!(chunk_map(&bfc), [(0, 1024, true), (1024, 1024, false)]);
    // 2x - 256: handed out whole.
    let mut bfc = fixed(2048 - 256);
    assert_eq!(alloc(&mut bfc, 0, 1000), (0, 1792));
    assert_eq!(chunk_map(&bfc), [(0, 1792, true)]);
    assert_eq!(bfc.stats().bytes_in_use, 1792);

    // Under 2x, a leftover of exactly 128 MiB still splits; 256 B less does not.
    let mut bfc = fixed(384 * MIB);
    assert_eq!(alloc(&mut bfc, 0, 256 * MIB), (0, 256 * MIB));
    let mut bfc = fixed(384 * MIB);
    assert_eq!(alloc(&mut bfc, 0, 256 * MIB + 1), (0, 384 * MIB));

    // tsl's fragmentation_fraction replaces 128 MiB by fraction * limit (here 96 MiB).
    let frac = |f: f64| {
        Bfc::new(BfcOptions {
            limit_bytes: 384 * MIB,
            allow_growth: false,
            fragmentation_fraction: f,
            ..BfcOptions::default()
        })
    };
    let mut bfc = frac(0.25);
    assert_eq!(bfc.max_internal_fragmentation_bytes(), 96 * MIB);
    assert_eq!(alloc(&mut bfc, 0, 288 * MIB), (0, 288 * MIB));
    let mut bfc = frac(0.25);
    assert_eq!(alloc(&mut bfc, 0, 288 * MIB + 1), (0, 384 * MIB));
    let mut bfc = frac(0.0);
    assert_eq!(alloc(&mut bfc, 0, 288 * MIB), (0, 384 * MIB));

    // The same rule, asked directly.
    let bfc = fixed(GIB);
    assert!(bfc.splits(2048, 1024));
    assert!(!bfc.splits(1792, 1024));
    assert!(bfc.splits(384 * MIB, 256 * MIB));
    assert!(!bfc.splits(384 * MIB, 256 * MIB + 256));
}

#[test]
fn best_fit_prefers_smallest_then_lowest_address() {
    let mut bfc = fixed(64 * KIB);
    // Layout: [4K a][1K g][2K b][1K g][2K c][1K g][rest]
    let sizes = [4096, 1024, 2048, 1024, 2048, 1024];
    let addrs: Vec<u64> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| alloc(&mut bfc, i as u32, s).0)
        .collect();
    assert_eq!(addrs, [0, 4096, 5120, 7168, 8192, 10240]);
    free(&mut bfc, addrs[4]);
    free(&mut bfc, addrs[0]);
    free(&mut bfc, addrs[2]);
    // Free: 4K at 0, 2K at 5120, 2K at 8192, and the tail.
    assert_eq!(alloc(&mut bfc, 10, 2000), (5120, 2048));
    assert_eq!(alloc(&mut bfc, 11, 2048), (8192, 2048));
    // Only the 4K chunk and the tail are left: the 4K one splits exactly in half.
    assert_eq!(alloc(&mut bfc, 12, 1800), (0, 2048));
    assert_eq!(alloc(&mut bfc, 13, 1800), (2048, 2048));
}

#[test]
fn free_coalesces_next_then_prev() {
    let mut bfc = fixed(16 * KIB);
    let a = alloc(&mut bfc, 0, 1024).0;
    let b = alloc(&mut bfc, 1, 1024).0;
    let c = alloc(&mut bfc, 2, 1024).0;
    let d = alloc(&mut bfc, 3, 1024).0;
    let handle_of = |bfc: &Bfc, addr: u64| -> u32 {
        bfc.chunks()
            .iter()
            .find(|ch| ch.addr == addr)
            .unwrap()
            .handle
    };
    let (ha, hb, hc) = (handle_of(&bfc, a), handle_of(&bfc, b), handle_of(&bfc, c));
    free(&mut bfc, a);
    free(&mut bfc, c);
    assert_eq!(bfc.counters().free_blocks, 3);
    free(&mut bfc, b);
    assert_eq!(
        chunk_map(&bfc),
        [
            (0, 3072, false),
            (3072, 1024, true),
            (4096, 12 * KIB, false)
        ]
    );
    assert_eq!(d, 3072);
    // The merged chunk keeps the left neighbour's handle; b's and c's handles were deleted
    // (c first, then b), so the next new chunk reuses b's (LIFO), then c's.
    assert_eq!(handle_of(&bfc, 0), ha);
    alloc(&mut bfc, 4, 256); // splits the 3 KiB chunk: the remainder takes a reused handle
    let rest = bfc
        .chunks()
        .iter()
        .find(|ch| ch.addr == 256)
        .unwrap()
        .handle;
    assert_eq!(rest, hb);
    alloc(&mut bfc, 5, 256);
    let rest = bfc
        .chunks()
        .iter()
        .find(|ch| ch.addr == 512)
        .unwrap()
        .handle;
    assert_eq!(rest, hc);

    // Freeing d now merges with both sides into one chunk spanning everything but 0..512.
    free(&mut bfc, d);
    assert_eq!(
        chunk_map(&bfc),
        [
            (0, 256, true),
            (256, 256, true),
            (512, 16 * KIB - 512, false)
        ]
    );
}

#[test]
fn chunks_never_coalesce_across_regions() {
    let mut bfc = growth(GIB);
    let a = alloc(&mut bfc, 0, 2 * MIB).0;
    let b = alloc(&mut bfc, 1, 4 * MIB).0;
    assert_eq!((a, b), (0, 2 * MIB));
    free(&mut bfc, b);
    free(&mut bfc, a);
    assert_eq!(
        chunk_map(&bfc),
        [(0, 2 * MIB, false), (2 * MIB, 4 * MIB, false)]
    );
    let c = bfc.counters();
    assert_eq!((c.free_blocks, c.largest_free_bytes), (2, 4 * MIB));
    // 5 MiB fits neither region: a third one is made even though 6 contiguous MiB are free.
    alloc(&mut bfc, 2, 5 * MIB);
    assert_eq!(region_sizes(&bfc), [2 * MIB, 4 * MIB, 8 * MIB]);
}

#[test]
fn garbage_collection_releases_free_regions_only_when_needed() {
    let opts = |gc: bool| BfcOptions {
        limit_bytes: 8 * MIB,
        allow_growth: true,
        garbage_collection: gc,
        ..BfcOptions::default()
    };
    let setup = |gc: bool| {
        let mut bfc = Bfc::new(opts(gc));
        let a = alloc(&mut bfc, 0, 2 * MIB).0;
        alloc(&mut bfc, 1, 4 * MIB);
        free(&mut bfc, a);
        // Fits the free first region: no collection.
        let x = alloc(&mut bfc, 2, MIB).0;
        assert_eq!(x, 0);
        free(&mut bfc, x);
        assert_eq!(region_sizes(&bfc), [2 * MIB, 4 * MIB]);
        bfc
    };

    // Without GC: 2 MiB left under the limit, so 3 MiB fails.
    let mut bfc = setup(false);
    let err = Policy::alloc(
        &mut bfc,
        Request {
            id: 3,
            size_bytes: 3 * MIB,
            align_bytes: 16,
        },
    )
    .unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory { .. }));

    // With GC: even freed, 5 MiB would not fit under the limit, so nothing is released.
    let mut bfc = setup(true);
    assert!(
        Policy::alloc(
            &mut bfc,
            Request {
                id: 3,
                size_bytes: 5 * MIB,
                align_bytes: 16
            }
        )
        .is_err()
    );
    assert_eq!(region_sizes(&bfc), [2 * MIB, 4 * MIB]);
    // 3 MiB: the free 2 MiB region goes, then Extend makes min(target 8 MiB, 4 MiB available),
    // handed out whole (4 MiB < 2 x 3 MiB).
    let (addr, chunk) = alloc(&mut bfc, 4, 3 * MIB);
    assert_eq!((addr, chunk), (6 * MIB, 4 * MIB));
    assert_eq!(
        bfc.regions(),
        [
            RegionInfo {
                base: 2 * MIB,
                size_bytes: 4 * MIB
            },
            RegionInfo {
                base: 6 * MIB,
                size_bytes: 4 * MIB
            }
        ]
    );
    assert_eq!(bfc.total_region_allocated_bytes(), 8 * MIB);
    // The target is not reset by GC: it doubled after the 8 MiB-target Extend.
    assert_eq!(bfc.curr_region_allocation_bytes(), 16 * MIB);
}

#[test]
fn limit_is_exact() {
    // 100 B over 4 MiB: only whole 256 B units count.
    let mut bfc = growth(4 * MIB + 100);
    alloc(&mut bfc, 0, 2 * MIB);
    // Available is now 2 MiB + 100 -> 2 MiB, so 2 MiB + 1 (rounded 2 MiB + 256) fails...
    let err = Policy::alloc(
        &mut bfc,
        Request {
            id: 1,
            size_bytes: 2 * MIB + 1,
            align_bytes: 16,
        },
    )
    .unwrap_err();
    assert_eq!(
        err,
        AllocError::OutOfMemory {
            requested_bytes: 2 * MIB + 1,
            largest_free_bytes: 0,
            footprint_bytes: 2 * MIB,
            limit_bytes: Some(4 * MIB + 100),
        }
    );
    // ...and exactly 2 MiB succeeds, in a region cut to the available bytes.
    assert_eq!(alloc(&mut bfc, 2, 2 * MIB), (2 * MIB, 2 * MIB));
    assert_eq!(region_sizes(&bfc), [2 * MIB, 2 * MIB]);
    assert!(
        Policy::alloc(
            &mut bfc,
            Request {
                id: 3,
                size_bytes: 1,
                align_bytes: 16
            }
        )
        .is_err()
    );
    assert_eq!(bfc.stats().num_allocs, 2);

    // Without growth the first region is the whole limit, rounded down to 256 B.
    let mut bfc = fixed(10 * 256 + 100);
    assert_eq!(alloc(&mut bfc, 0, 2560), (0, 2560));
    assert_eq!(region_sizes(&bfc), [2560]);
}

#[test]
fn zero_bytes_and_large_alignment_are_refused() {
    let mut bfc = growth(GIB);
    let req = |size_bytes, align_bytes| Request {
        id: 0,
        size_bytes,
        align_bytes,
    };
    assert!(matches!(
        Policy::alloc(&mut bfc, req(0, 16)),
        Err(AllocError::Unsupported(_))
    ));
    assert!(matches!(
        Policy::alloc(&mut bfc, req(10, 512)),
        Err(AllocError::Unsupported(_))
    ));
    assert_eq!(Policy::alloc(&mut bfc, req(10, 256)).unwrap().addr, 0);
    assert_eq!(bfc.stats().num_allocs, 1);
}

#[test]
fn stats_and_allocation_ids() {
    let mut bfc = growth(GIB);
    assert_eq!(bfc.stats().bytes_limit, GIB);
    let a = bfc.allocate(1000, 7).unwrap();
    let b = bfc.allocate(5000, 8).unwrap();
    assert_eq!((a.allocation_id, b.allocation_id), (1, 2));
    assert_eq!((a.chunk_bytes, b.chunk_bytes), (1024, 5120));
    let s = bfc.stats();
    assert_eq!(
        s,
        BfcStats {
            num_allocs: 2,
            bytes_in_use: 6144,
            peak_bytes_in_use: 6144,
            largest_alloc_size: 5120,
            bytes_limit: GIB,
        }
    );
    let c = bfc.counters();
    assert_eq!((c.live_bytes, c.allocated_bytes), (6000, 6144));
    assert_eq!(c.footprint_bytes, 2 * MIB);
    assert_eq!(c.free_bytes, 2 * MIB - 6144);
    assert_eq!(bfc.deallocate(a.addr).unwrap(), 1024);
    assert_eq!(bfc.stats().bytes_in_use, 5120);
    assert_eq!(bfc.stats().peak_bytes_in_use, 6144);
    assert_eq!(bfc.chunk_at(b.addr).unwrap().request_id, 8);
    assert_eq!(bfc.chunk_at(b.addr).unwrap().allocation_id, Some(2));
    bfc.clear_stats();
    let s = bfc.stats();
    assert_eq!(
        (s.num_allocs, s.peak_bytes_in_use, s.largest_alloc_size),
        (0, 5120, 0)
    );
    // Ids keep counting after ClearStats.
    assert_eq!(bfc.allocate(1, 9).unwrap().allocation_id, 3);
    assert!(bfc.deallocate(12345).is_err());
}

#[test]
fn bins_report_free_chunks_and_debug_counters() {
    let mut bfc = fixed(MIB);
    let a = alloc(&mut bfc, 0, 300).0; // 512
    alloc(&mut bfc, 1, 600); // 768
    let c = alloc(&mut bfc, 2, 1024).0; // 1024
    alloc(&mut bfc, 3, 1024); // 1024
    free(&mut bfc, a);
    free(&mut bfc, c);
    let bins = bfc.bins();
    assert_eq!(bins.len(), 21);
    for (b, bin) in bins.iter().enumerate() {
        assert_eq!(bin.bin_size_bytes, 256 << b);
    }
    // Chunks: 512 free, 768 used (bin 1), 1024 free (bin 2), 1024 used, tail free.
    assert_eq!(bins[1].free_chunks, [(0, 512)]);
    assert_eq!(bins[2].free_chunks, [(1280, 1024)]);
    let tail = MIB - 3328;
    assert_eq!(bins[bin_num_for_size(tail)].free_chunks, [(3328, tail)]);
    assert_eq!(
        (
            bins[1].total_chunks,
            bins[1].chunks_in_use,
            bins[1].total_bytes,
            bins[1].bytes_in_use,
            bins[1].requested_bytes_in_use
        ),
        (2, 1, 1280, 768, 600)
    );
    assert_eq!(
        (
            bins[2].total_chunks,
            bins[2].chunks_in_use,
            bins[2].bytes_in_use,
            bins[2].requested_bytes_in_use
        ),
        (2, 1, 1024, 1024)
    );
    let total: u64 = bins.iter().map(|b| b.total_bytes).sum();
    assert_eq!(total, MIB);
    // Free chunks of one bin come in (size, addr) order.
    let mut bfc = fixed(MIB);
    let xs: Vec<u64> = [768, 256, 512, 256, 512, 256]
        .iter()
        .enumerate()
        .map(|(i, &s)| alloc(&mut bfc, i as u32, s).0)
        .collect();
    free(&mut bfc, xs[0]);
    free(&mut bfc, xs[2]);
    free(&mut bfc, xs[4]);
    assert_eq!(
        bfc.bins()[1].free_chunks,
        [(1024, 512), (1792, 512), (0, 768)]
    );
}

#[test]
fn caller_chosen_region_bases() {
    let mut bfc = growth(GIB);
    bfc.queue_region_bases([0x7f00_0000_0040, 0x7e00_0000_0000]);
    let a = alloc(&mut bfc, 0, 2 * MIB).0;
    let b = alloc(&mut bfc, 1, 4 * MIB).0;
    assert_eq!((a, b), (0x7f00_0000_0040, 0x7e00_0000_0000));
    // Default placement resumes after the highest end.
    let c = alloc(&mut bfc, 2, 8 * MIB).0;
    assert_eq!(c, 0x7f00_0000_0040 + 2 * MIB);
    assert_eq!(
        bfc.regions().iter().map(|r| r.base).collect::<Vec<_>>(),
        [
            0x7e00_0000_0000,
            0x7f00_0000_0040,
            0x7f00_0000_0040 + 2 * MIB
        ]
    );
    let regions: Vec<usize> = bfc.chunks().iter().map(|c| c.region).collect();
    assert_eq!(regions, [0, 1, 2]);
    // A 64-aligned base limits the alignment BFC can promise.
    assert!(
        Policy::alloc(
            &mut bfc,
            Request {
                id: 3,
                size_bytes: 8,
                align_bytes: 128
            }
        )
        .is_err()
    );
    // A base that overlaps an existing region is refused, not silently used.
    bfc.set_next_region_base(0x7e00_0000_0000 + MIB);
    assert!(matches!(
        bfc.allocate(64 * MIB, 4),
        Err(AllocError::Unsupported(_))
    ));
    bfc.check_invariants().unwrap();
}

fn live_chunks(bfc: &Bfc) -> Vec<LiveChunk> {
    bfc.chunks()
        .iter()
        .filter(|c| c.in_use)
        .map(|c: &ChunkInfo| LiveChunk {
            addr: c.addr,
            size_bytes: c.size_bytes,
            requested_bytes: c.requested_bytes,
            allocation_id: c.allocation_id.unwrap(),
            request_id: c.request_id,
        })
        .collect()
}

fn rebuild(bfc: &Bfc) -> Bfc {
    Bfc::from_state(
        *bfc.options(),
        &bfc.regions(),
        &live_chunks(bfc),
        bfc.curr_region_allocation_bytes(),
        bfc.stats(),
    )
    .unwrap()
}

fn without_handles(chunks: Vec<ChunkInfo>) -> Vec<ChunkInfo> {
    chunks
        .into_iter()
        .map(|c| ChunkInfo {
            handle: 0,
            next_handle: None,
            ..c
        })
        .collect()
}

#[test]
fn from_state_round_trip_on_a_real_trace() {
    let trace = support::read_trace(&support::sample_trace("find_usr_include.trace.gz"));
    let view = trace.view().unwrap();
    let mut live = vec![None; view.num_allocs as usize];
    let mut original = growth(64 * MIB);
    let mut rebuilt: Option<Bfc> = None;
    let checkpoint = view.len() / 3;
    let mut compared = 0;
    for i in 0..view.len() {
        if i == checkpoint {
            let copy = rebuild(&original);
            copy.check_invariants().unwrap();
            assert_eq!(
                without_handles(copy.chunks()),
                without_handles(original.chunks())
            );
            assert_eq!(copy.bins(), original.bins());
            assert_eq!(copy.counters(), original.counters());
            assert_eq!(copy.next_allocation_id(), original.next_allocation_id());
            rebuilt = Some(copy);
        }
        let id = view.alloc_id[i];
        match view.kind_at(i).unwrap() {
            EventKind::Alloc => {
                let req = Request {
                    id,
                    size_bytes: view.size_bytes[i].max(1),
                    align_bytes: 16,
                };
                let p = original.alloc(req).unwrap();
                if let Some(r) = rebuilt.as_mut() {
                    assert_eq!(r.alloc(req).unwrap(), p, "event {i}");
                    compared += 1;
                }
                live[id as usize] = Some(p.addr);
            }
            EventKind::Free => {
                let addr = live[id as usize].take().unwrap();
                original.free(addr).unwrap();
                if let Some(r) = rebuilt.as_mut() {
                    r.free(addr).unwrap();
                }
            }
            _ => {}
        }
        if i % 997 == 0 {
            original.check_invariants().unwrap();
        }
    }
    let rebuilt = rebuilt.unwrap();
    assert!(compared > 10_000, "only {compared} placements compared");
    assert_eq!(
        without_handles(rebuilt.chunks()),
        without_handles(original.chunks())
    );
    assert_eq!(rebuilt.stats(), original.stats());
    assert_eq!(
        rebuilt.curr_region_allocation_bytes(),
        original.curr_region_allocation_bytes()
    );
    rebuilt.check_invariants().unwrap();
}

#[test]
fn from_state_rejects_inconsistent_input() {
    let opts = BfcOptions::default();
    let region = |base, size_bytes| RegionInfo { base, size_bytes };
    let chunk = |addr, size_bytes| LiveChunk {
        addr,
        size_bytes,
        requested_bytes: size_bytes,
        allocation_id: 1,
        request_id: NO_ALLOC_ID,
    };
    let stats = |bytes_in_use| BfcStats {
        bytes_in_use,
        peak_bytes_in_use: bytes_in_use,
        ..BfcStats::default()
    };
    let build = |regions: &[RegionInfo], chunks: &[LiveChunk], in_use| {
        Bfc::from_state(opts, regions, chunks, 4 * MIB, stats(in_use))
    };
    let ok = build(&[region(0, 4096)], &[chunk(1024, 512)], 512).unwrap();
    assert_eq!(
        chunk_map(&ok),
        [(0, 1024, false), (1024, 512, true), (1536, 2560, false)]
    );
    assert_eq!(ok.next_allocation_id(), 2);
    assert!(matches!(
        build(&[region(0, 4096), region(2048, 4096)], &[], 0),
        Err(BfcStateError::RegionsOverlap { .. })
    ));
    assert!(matches!(
        build(&[region(0, 4000)], &[], 0),
        Err(BfcStateError::BadRegion { .. })
    ));
    assert!(matches!(
        build(&[region(0, 4096)], &[chunk(0, 1024), chunk(768, 512)], 1536),
        Err(BfcStateError::ChunksOverlap { .. })
    ));
    assert!(matches!(
        build(&[region(0, 4096)], &[chunk(3840, 512)], 512),
        Err(BfcStateError::ChunkOutsideRegions { .. })
    ));
    assert!(matches!(
        build(&[region(4096, 4096)], &[chunk(0, 512)], 512),
        Err(BfcStateError::ChunkOutsideRegions { .. })
    ));
    assert!(matches!(
        build(&[region(0, 4096)], &[chunk(100, 512)], 512),
        Err(BfcStateError::ChunkOutsideRegions { .. })
    ));
    assert!(matches!(
        build(&[region(0, 4096)], &[chunk(0, 500)], 500),
        Err(BfcStateError::BadChunk { .. })
    ));
    assert!(matches!(
        build(&[region(0, 4096)], &[chunk(0, 512)], 1024),
        Err(BfcStateError::BytesInUseMismatch { .. })
    ));
    assert!(matches!(
        Bfc::from_state(
            BfcOptions {
                limit_bytes: 2048,
                ..opts
            },
            &[region(0, 4096)],
            &[],
            0,
            stats(0)
        ),
        Err(BfcStateError::OverLimit { .. })
    ));
}

#[test]
fn blocks_list_every_chunk_in_address_order() {
    let mut bfc = growth(GIB);
    let a = alloc(&mut bfc, 5, 100).0;
    alloc(&mut bfc, 6, 3 * MIB);
    let mut blocks = Vec::new();
    bfc.blocks(&mut blocks);
    assert_eq!(
        blocks,
        [
            Block {
                addr: a,
                len_bytes: 256,
                state: BlockState::Used {
                    id: 5,
                    requested_bytes: 100
                }
            },
            Block {
                addr: 256,
                len_bytes: 2 * MIB - 256,
                state: BlockState::Free
            },
            Block {
                addr: 2 * MIB,
                len_bytes: 4 * MIB,
                state: BlockState::Used {
                    id: 6,
                    requested_bytes: 3 * MIB
                }
            },
        ]
    );
    // The 4 MiB chunk was not split: 4 MiB < 2 x 3 MiB.
    let boxed: Box<dyn Policy> = bfc.clone_box();
    assert!(boxed.as_any().downcast_ref::<Bfc>().is_some());
    assert_eq!(boxed.counters(), bfc.counters());
}

/// (addr, size, in_use).
type NaiveChunk = (u64, u64, bool);

/// A deliberately naive restatement of BFC (linear scans over a chunk list per region), to
/// cross-check the real one on random sequences.
#[derive(Clone, Debug)]
struct Naive {
    limit: u64,
    curr: u64,
    total: u64,
    gc: bool,
    next_base: u64,
    /// Per region: base and its chunks.
    regions: Vec<(u64, Vec<NaiveChunk>)>,
}

impl Naive {
    fn new(limit: u64, allow_growth: bool, gc: bool) -> Self {
        let curr = if allow_growth {
            rounded_bytes(limit.min(2 * MIB))
        } else {
            rounded_bytes(limit)
        };
        Self {
            limit,
            curr,
            total: 0,
            gc,
            next_base: 0,
            regions: Vec::new(),
        }
    }

    fn find(&mut self, rounded: u64) -> Option<(u64, u64)> {
        let mut best: Option<(u64, u64, usize, usize)> = None;
        for (ri, (_, chunks)) in self.regions.iter().enumerate() {
            for (ci, &(addr, size, used)) in chunks.iter().enumerate() {
                if !used && size >= rounded && best.is_none_or(|b| (size, addr) < (b.1, b.0)) {
                    best = Some((addr, size, ri, ci));
                }
            }
        }
        let (addr, size, ri, ci) = best?;
        let chunks = &mut self.regions[ri].1;
        if size >= 2 * rounded || size - rounded >= 128 * MIB {
            chunks[ci] = (addr, rounded, true);
            chunks.insert(ci + 1, (addr + rounded, size - rounded, false));
            Some((addr, rounded))
        } else {
            chunks[ci].2 = true;
            Some((addr, size))
        }
    }

    fn extend(&mut self, rounded: u64) -> bool {
        let available = (self.limit - self.total) / 256 * 256;
        if rounded > available {
            return false;
        }
        let mut grew = false;
        while rounded > self.curr {
            self.curr *= 2;
            grew = true;
        }
        let bytes = self.curr.min(available);
        if !grew {
            self.curr *= 2;
        }
        self.total += bytes;
        self.regions
            .push((self.next_base, vec![(self.next_base, bytes, false)]));
        self.next_base += bytes;
        true
    }

    fn alloc(&mut self, size: u64) -> Option<(u64, u64)> {
        let rounded = rounded_bytes(size);
        if let Some(p) = self.find(rounded) {
            return Some(p);
        }
        if self.extend(rounded) {
            return self.find(rounded);
        }
        if self.gc {
            let free: u64 = self
                .regions
                .iter()
                .filter(|(_, c)| c.iter().all(|x| !x.2))
                .map(|(_, c)| c.iter().map(|x| x.1).sum::<u64>())
                .sum();
            if free > 0 && rounded <= self.limit - self.total + free {
                self.regions.retain(|(_, c)| c.iter().any(|x| x.2));
                self.total -= free;
                if self.extend(rounded) {
                    return self.find(rounded);
                }
            }
        }
        None
    }

    fn free(&mut self, addr: u64) {
        for (_, chunks) in &mut self.regions {
            if let Some(i) = chunks.iter().position(|c| c.0 == addr && c.2) {
                chunks[i].2 = false;
                if i + 1 < chunks.len() && !chunks[i + 1].2 {
                    chunks[i].1 += chunks[i + 1].1;
                    chunks.remove(i + 1);
                }
                if i > 0 && !chunks[i - 1].2 {
                    chunks[i - 1].1 += chunks[i].1;
                    chunks.remove(i);
                }
                return;
            }
        }
        panic!("naive: free of unknown {addr:#x}");
    }

    fn chunk_map(&self) -> Vec<(u64, u64, bool)> {
        let mut out: Vec<_> = self.regions.iter().flat_map(|r| r.1.clone()).collect();
        out.sort();
        out
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..3000).prop_map(Op::Alloc),
        2 => (3000u64..(3 * MIB)).prop_map(Op::Alloc),
        1 => (3 * MIB..(20 * MIB)).prop_map(Op::Alloc),
        5 => any::<usize>().prop_map(Op::Free),
    ]
}

fn small_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..800).prop_map(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Free),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    // Few distinct sizes and long runs: many free chunks of one size, merged away and reused,
    // which is what the exact-size buckets' lazy deletion has to get right.
    #[test]
    fn matches_a_naive_model_on_few_sizes(ops in prop::collection::vec(small_op(), 1..1500)) {
        let limit = 4 * MIB;
        let mut bfc = fixed(limit);
        let mut naive = Naive::new(limit, false, false);
        let mut live: Vec<u64> = Vec::new();
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Alloc(size) => {
                    let got = bfc.allocate(size, step as u32).ok().map(|a| (a.addr, a.chunk_bytes));
                    prop_assert_eq!(got, naive.alloc(size), "step {} alloc {}", step, size);
                    if let Some((addr, _)) = got {
                        live.push(addr);
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let addr = live.swap_remove(i % live.len());
                    bfc.deallocate(addr).unwrap();
                    naive.free(addr);
                }
                Op::Free(_) => {}
            }
            if step % 16 == 0 {
                bfc.check_invariants().map_err(TestCaseError::fail)?;
                prop_assert_eq!(chunk_map(&bfc), naive.chunk_map());
            }
        }
        bfc.check_invariants().map_err(TestCaseError::fail)?;
        prop_assert_eq!(chunk_map(&bfc), naive.chunk_map());
    }

    #[test]
    fn matches_a_naive_model(
        ops in prop::collection::vec(op(), 1..300),
        limit_mib in prop::sample::select(vec![3u64, 8, 24, 64]),
        extra in 0u64..512,
        allow_growth in any::<bool>(),
        gc in any::<bool>(),
    ) {
        let limit = limit_mib * MIB + extra;
        let mut bfc = Bfc::new(BfcOptions {
            limit_bytes: limit,
            allow_growth,
            garbage_collection: gc,
            ..BfcOptions::default()
        });
        let mut naive = Naive::new(limit, allow_growth, gc);
        let mut live: Vec<u64> = Vec::new();
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Alloc(size) => {
                    let got = bfc.allocate(size, step as u32).ok().map(|a| (a.addr, a.chunk_bytes));
                    prop_assert_eq!(got, naive.alloc(size), "step {} alloc {}", step, size);
                    if let Some((addr, _)) = got {
                        live.push(addr);
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let addr = live.swap_remove(i % live.len());
                    bfc.deallocate(addr).unwrap();
                    naive.free(addr);
                }
                Op::Free(_) => {}
            }
            bfc.check_invariants().map_err(TestCaseError::fail)?;
            prop_assert_eq!(chunk_map(&bfc), naive.chunk_map());
            prop_assert_eq!(bfc.curr_region_allocation_bytes(), naive.curr);
        }
    }
}
