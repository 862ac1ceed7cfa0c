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
    bfc.free_by_size.remove(&free_key(1024, 0));
    assert!(bfc.check().unwrap_err().contains("not in its bin"));
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
    bfc.free_by_size.insert(free_key(1024, 1024), h);
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
fn address_hash_spreads_256_byte_multiples() {
    use std::hash::BuildHasher;
    let build = BuildHasherDefault::<AddrHasher>::default();
    // hashbrown picks buckets from the low bits: they must vary for 256-aligned keys.
    let low: std::collections::HashSet<u64> = (0..4096u64)
        .map(|i| build.hash_one(i * 256) & 0xfff)
        .collect();
    assert!(
        low.len() > 2000,
        "only {} distinct low-bit patterns",
        low.len()
    );
}
