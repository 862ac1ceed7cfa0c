//! White-box tests: `check_invariants` must catch each kind of corruption it claims to.

use super::*;

fn sample() -> Bfc {
    let mut bfc = Bfc::new(BfcOptions {
        limit_bytes: 1 << 20,
        allow_growth: false,
        ..BfcOptions::default()
    });
    let a = bfc.allocate(1000, 0).unwrap().addr;
    bfc.allocate(1000, 1).unwrap();
    bfc.allocate(1000, 2).unwrap();
    bfc.deallocate(a).unwrap();
    bfc.check().unwrap();
    bfc
}

fn handle_at(bfc: &Bfc, addr: Addr) -> u32 {
    bfc.chunks().iter().find(|c| c.addr == addr).unwrap().handle
}

#[test]
fn detects_a_free_chunk_missing_from_its_bin() {
    let mut bfc = sample();
    bfc.free.remove(1024, 0);
    assert!(bfc.check().unwrap_err().contains("free chunks"));
}

#[test]
fn detects_adjacent_free_chunks() {
    let mut bfc = sample();
    // Mark the chunk after the free one free without coalescing.
    let h = handle_at(&bfc, 1024);
    bfc.in_use_by_addr.remove(&1024);
    let c = &mut bfc.chunks[h as usize];
    c.allocation_id = 0;
    c.requested_bytes = 0;
    bfc.free.insert(&bfc.chunks, 1024, 1024, h);
    bfc.stats.bytes_in_use -= 1024;
    bfc.live_bytes -= 1000;
    assert!(bfc.check().unwrap_err().contains("adjacent free"));
}

#[test]
fn detects_broken_tiling_and_links() {
    let mut bfc = sample();
    let h = handle_at(&bfc, 2048);
    bfc.chunks[h as usize].size_bytes = 768;
    assert!(bfc.check().is_err());

    let mut bfc = sample();
    let h = handle_at(&bfc, 2048);
    bfc.chunks[h as usize].prev = NONE;
    assert!(bfc.check().unwrap_err().contains("prev link"));
}

#[test]
fn detects_counter_drift() {
    let mut bfc = sample();
    bfc.stats.bytes_in_use += 256;
    assert!(bfc.check().is_err());

    let mut bfc = sample();
    bfc.live_bytes += 1;
    assert!(bfc.check().is_err());

    let mut bfc = sample();
    bfc.total_region_allocated_bytes += 256;
    assert!(bfc.check().is_err());
}

#[test]
fn detects_leaked_handles() {
    let mut bfc = sample();
    bfc.chunks.push(free_chunk(0, 0, NONE));
    assert!(bfc.check().unwrap_err().contains("neither"));
}

#[test]
fn stale_bucket_entries_are_compacted_and_never_served() {
    let mut bfc = Bfc::new(BfcOptions {
        limit_bytes: 1 << 20,
        allow_growth: false,
        ..BfcOptions::default()
    });
    let b0 = bfc.allocate(256, 0).unwrap().addr;
    bfc.allocate(512, 0).unwrap();
    let a: Vec<Addr> = (0..200)
        .map(|_| bfc.allocate(256, 0).unwrap().addr)
        .collect();
    bfc.allocate(512, 0).unwrap();
    for x in a.iter().step_by(2) {
        bfc.deallocate(*x).unwrap();
    }
    assert_eq!(bfc.free.bucket_entries(256), 100);
    // Freeing the odd ones merges the even ones away: their entries go stale, except the last
    // even chunk, which stays free (a[199] is still in use).
    for x in a.iter().skip(1).step_by(2).take(98) {
        bfc.deallocate(*x).unwrap();
    }
    bfc.check().unwrap();
    assert_eq!(bfc.free.bucket_entries(256), 100);
    // An isolated 256 B chunk enters the bucket: the stale entries are compacted first.
    bfc.deallocate(b0).unwrap();
    bfc.check().unwrap();
    assert_eq!(bfc.free.bucket_entries(256), 2);
    // Best fit: the two 256 B chunks, lowest address first, then the merged run is split.
    assert_eq!(bfc.allocate(200, 1).unwrap().addr, b0);
    assert_eq!(bfc.allocate(200, 2).unwrap().addr, a[198]);
    assert_eq!(bfc.allocate(200, 3).unwrap().addr, a[0]);
    bfc.check().unwrap();
}

/// The bins of a chunk list are the same whether its blocks go through one sink or its two
/// halves through two sinks merged (a big heap's two-thread pass).
#[test]
fn bins_of_halves_merged_equal_bins_of_the_whole() {
    let mut bfc = Bfc::default();
    let mut addrs = Vec::new();
    for (i, size) in [300u64, 5000, 700, 70_000, 256, 1 << 20, 9000, 300]
        .iter()
        .enumerate()
    {
        addrs.push(bfc.allocate(*size, i as u32).unwrap().addr);
    }
    for a in [addrs[1], addrs[3], addrs[6]] {
        bfc.deallocate(a).unwrap();
    }
    let mut blocks = Vec::new();
    bfc.blocks_impl(&mut blocks);
    let whole = bins_of(&blocks);
    assert_eq!(whole, bfc.bins());
    assert!(whole.iter().map(|b| b.free_chunks.len()).sum::<usize>() >= 3);
    for cut in 0..=blocks.len() {
        let (a, b) = blocks.split_at(cut);
        let (mut x, mut y) = (BinsSink::default(), BinsSink::default());
        a.iter().for_each(|blk| x.add(blk));
        b.iter().for_each(|blk| y.add(blk));
        assert_eq!(x.merge(y).finish(), whole, "cut at {cut}");
    }
}

/// A replay kept for seeking gives back its final state's map headroom; `compare`'s does not
/// spend the time.
#[test]
fn a_replay_kept_for_seeking_shrinks_its_final_address_map() {
    use crate::replay::{ReplayOptions, replay};
    use crate::trace::OwnedTrace;
    let mut t = OwnedTrace::new();
    let ids: Vec<u32> = (0..20_000).map(|i| t.alloc(i, 300)).collect();
    for (k, &id) in ids.iter().enumerate().skip(100) {
        t.free(20_000 + k as i64, id);
    }
    let view = t.view().unwrap();
    let slots = |layout_index| {
        let opts = ReplayOptions {
            layout_index,
            checkpoint_every: 0,
            ..ReplayOptions::default()
        };
        let r = replay(&view, Box::new(Bfc::default()), &opts);
        let bfc = r.final_state.as_any().downcast_ref::<Bfc>().unwrap();
        assert_eq!(bfc.in_use_by_addr.len(), 100);
        bfc.in_use_by_addr.slot_count()
    };
    // Grown for 20,000 at most a quarter full, then shrunk for 100 at most half full.
    assert!(slots(false) >= 80_000);
    assert!(slots(true) <= 256, "{} slots", slots(true));
}
