//! The `bfc` policy against TensorFlow: checkpointed replays of the real MobileNetV2 memory
//! logs put every allocation at TensorFlow's address, reach TensorFlow's OOM with the dump's
//! chunk map, and reproduce TensorFlow's own peak. Totals alone prove nothing; addresses do.

// Test helpers may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use allocview_loaders::analysis::tf_fidelity::{
    Fidelity, FidelityOptions, ReplayStart, replay_checkpointed, replay_from_start,
};
use allocview_loaders::tf::dump::load_bfc_dump;
use allocview_loaders::tf::memlog::{TfMemoryLog, load_memory_log};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tf")
        .join(name)
}

fn replay(log: &TfMemoryLog, limit_bytes: Option<u64>) -> Fidelity {
    replay_checkpointed(
        log,
        &FidelityOptions {
            limit_bytes,
            allow_growth: None,
            ..FidelityOptions::default()
        },
    )
    .unwrap()
}

fn assert_exact(f: &Fidelity) {
    assert_eq!(f.first_divergence, None);
    assert!(f.all_addresses_match());
    assert_eq!(f.address_matches, f.checked);
    assert_eq!(f.size_matches, f.sizes_checked);
    assert!(
        f.regions_match(),
        "{:?} vs {:?}",
        f.regions_logged,
        f.regions_replayed
    );
}

#[test]
fn oom_log_replays_to_tensorflows_oom_and_chunk_map() {
    let path = data("mobilenetv2_oom_memlog_dump.txt.gz");
    let log = load_memory_log(&path).unwrap();
    let f = replay(&log, Some(512 << 20));
    assert_eq!(f.start, ReplayStart::Checkpoint);
    assert_exact(&f);
    assert_eq!(f.checked, 20_370);
    assert_eq!(f.sizes_checked, 20_370);
    let cp = f.checkpoint.as_ref().unwrap();
    assert_eq!((cp.event, cp.line), (24_749, 25_114));
    assert_eq!((cp.unknown_live, cp.unknown_after), (0, 0));
    assert_eq!(cp.live_variables, 687);
    // The live 38,535,168-byte raw input took the whole 64 MiB region (not split, since
    // 64 MiB < 2 x its rounded size); the 512-byte one took one 512-byte chunk.
    assert_eq!(
        cp.raw_chunk_bytes,
        vec![(140_332_806_946_880, 64 << 20), (140_333_311_887_168, 512)]
    );

    // TF failed this request; so does the replay, with TF's state.
    assert_eq!(f.logged_oom_reproduced, Some(true));
    assert_eq!(f.ooms, 1);
    let oom = f.first_oom.as_ref().unwrap();
    assert!(oom.logged);
    assert_eq!(oom.event, log.records.len() - 1);
    let dump = load_bfc_dump(&path).unwrap();
    let d = dump.figures;
    assert_eq!(
        oom.rounded_bytes,
        dump.oom.as_ref().unwrap().rounded_bytes.unwrap()
    );
    assert_eq!(oom.rounded_bytes, 102_760_448);
    assert_eq!(
        [
            oom.in_use_chunks,
            oom.in_use_bytes,
            oom.free_chunks,
            oom.free_bytes,
            oom.regions,
            oom.region_bytes,
            oom.largest_free_chunk_bytes
        ],
        [
            d.in_use_chunks.unwrap(),
            d.in_use_bytes.unwrap(),
            d.free_chunks.unwrap(),
            d.free_bytes.unwrap(),
            d.regions.unwrap(),
            d.region_bytes.unwrap(),
            d.largest_free_chunk_bytes.unwrap()
        ]
    );
    assert_eq!(oom.in_use_bytes, 432_013_312);
    // The same chunk map, chunk for chunk.
    let cmp = oom.dump_comparison.as_ref().unwrap();
    assert!(cmp.all_identical(), "{cmp:?}");
    assert_eq!(cmp.identical, 2_709);
    assert_eq!(oom.chunks.len(), 2_709);
    // BFC's own counters agree with TF's Stats block.
    let stats = f.final_state.stats();
    assert!(
        dump.stat("InUse")
            .unwrap()
            .value
            .contains(stats.bytes_in_use)
    );
    assert_eq!(
        stats.num_allocs,
        dump.stat("NumAllocs").unwrap().value.bytes
    );
}

#[test]
fn oom_log_with_a_larger_limit_does_not_fail() {
    let log = load_memory_log(&data("mobilenetv2_oom_memlog_dump.txt.gz")).unwrap();
    let f = replay(&log, Some(1 << 30));
    // With room for a new region the request fits: the replay says TF's OOM is not reproduced.
    assert_eq!(f.logged_oom_reproduced, Some(false));
    assert_eq!(f.ooms, 0);
    assert!(f.first_oom.is_none());
}

#[test]
fn train_log_matches_every_address_and_tensorflows_peak() {
    let log = load_memory_log(&data("mobilenetv2_train_memlog.txt.gz")).unwrap();
    let f = replay(&log, None);
    assert_exact(&f);
    assert_eq!(f.checked, 19_805);
    let tf_peak = log.meminfo.iter().map(|m| m.peak_bytes).max().unwrap();
    assert_eq!(tf_peak, 1_191_003_136);
    assert_eq!(f.peak_bytes_in_use, tf_peak);
    // Every MEMINFO after the checkpoint: same bytes in use and same peak so far.
    assert_eq!(f.meminfo.len(), 3);
    for m in &f.meminfo {
        assert_eq!(m.replay_current_bytes, m.tf_current_bytes, "{}", m.tag);
        assert_eq!(m.replay_peak_bytes, m.tf_peak_bytes, "{}", m.tag);
    }
    // Region growth: the replay's regions are the logged ones, whose sizes the Extending lines
    // print.
    assert_eq!(f.regions_replayed.len(), 10);
    for (region, logged) in f.regions_replayed.iter().zip(&log.regions) {
        assert!(logged.extend_by.unwrap().contains(region.1));
    }
    assert_eq!(f.final_bytes_in_use, 0);
}

#[test]
fn infer_log_matches_every_address() {
    let log = load_memory_log(&data("mobilenetv2_infer_memlog.txt.gz")).unwrap();
    let f = replay(&log, None);
    assert_exact(&f);
    assert_eq!(f.checked, 1_504);
    // Two variables are allocated after the checkpoint and placed by their ids.
    assert_eq!(f.variables_replayed, 2);
    assert_eq!(f.peak_bytes_in_use, 242_347_776);
    for m in &f.meminfo {
        assert_eq!(m.replay_current_bytes, m.tf_current_bytes, "{}", m.tag);
    }
}

#[test]
fn a_replay_from_process_start_diverges_early() {
    let log = load_memory_log(&data("mobilenetv2_oom_memlog_dump.txt.gz")).unwrap();
    let opts = FidelityOptions {
        limit_bytes: Some(512 << 20),
        allow_growth: None,
        ..FidelityOptions::default()
    };
    let f = replay_from_start(&log, &opts).unwrap();
    assert_eq!(f.start, ReplayStart::FromStart);
    assert!(f.checkpoint.is_none());
    // Only a handful of the 33k allocations land at TF's address.
    assert!(f.checked > 33_000);
    assert!(f.address_matches < 100, "{}", f.address_matches);
    let d = f.first_divergence.unwrap();
    assert_eq!(d.event, 12);
    assert_ne!(d.got_addr, Some(d.expected_addr));
}

/// A tiny log: one 2 MiB region at 0x100000, then the given records (thread, message body).
fn synthetic(records: &[(u64, &str)]) -> TfMemoryLog {
    use allocview_loaders::tf::memlog::{MemlogOptions, parse_memory_log};
    let mut text = String::from(
        "I0000 00:00:1.000000 1 bfc_allocator.cc:176] Extending allocation by 2.00MiB bytes for A_bfc.\n\
         I0000 00:00:1.000001 1 bfc_allocator.cc:186] Allocated memory at 0x100000 to 0x300000\n",
    );
    for (i, (tid, body)) in records.iter().enumerate() {
        text.push_str(&format!(
            "I0000 00:00:2.{i:06} {tid} log_memory.cc:34] __LOG_MEMORY__ {body}\n"
        ));
    }
    parse_memory_log(&text, &MemlogOptions::default()).unwrap()
}

fn alloc(id: u64, ptr: u64) -> String {
    format!(
        "MemoryLogTensorAllocation {{ step_id: 1 kernel_name: \"k\" tensor {{ dtype: DT_FLOAT shape {{ }} \
         allocation_description {{ requested_bytes: 256 allocated_bytes: 256 allocator_name: \"A_bfc\" \
         allocation_id: {id} ptr: {ptr} }} }} }}"
    )
}

fn free(id: u64) -> String {
    format!("MemoryLogTensorDeallocation {{ allocation_id: {id} allocator_name: \"A_bfc\" }}")
}

#[test]
fn another_threads_free_logged_before_it_took_effect_is_held_back() {
    let base = 0x100000;
    let (a1, a2, f1, a3) = (
        alloc(1, base),
        alloc(2, base + 256),
        free(1),
        alloc(3, base + 512),
    );
    // Thread 2 logs the free of id 1 before thread 1 logs id 3, which TF placed after id 2:
    // the free had not taken effect yet.
    let log = synthetic(&[(1, &a1), (1, &a2), (2, &f1), (1, &a3)]);
    let f = replay(&log, None);
    assert_eq!(f.held_back, 1);
    assert_eq!((f.checked, f.address_matches), (3, 3));
    // Logged by the same thread, the free came first: nothing is held back and BFC reuses
    // the freed chunk, so TF's logged address would be a divergence.
    let log = synthetic(&[(1, &a1), (1, &a2), (1, &f1), (1, &a3)]);
    let f = replay(&log, None);
    assert_eq!(f.held_back, 0);
    let d = f.first_divergence.unwrap();
    assert_eq!((d.tf_alloc_id, d.got_addr), (3, Some(base)));
}

#[test]
fn allocations_are_replayed_in_bfc_id_order() {
    let base = 0x100000;
    let (a1, a2) = (alloc(1, base), alloc(2, base + 256));
    // Thread 2 logs id 2 before thread 1 logs id 1: BFC made id 1 first.
    let log = synthetic(&[(2, &a2), (1, &a1)]);
    let f = replay(&log, None);
    assert_eq!((f.checked, f.address_matches), (2, 2));
    assert_eq!(f.first_divergence, None);
}

#[test]
fn the_description_names_the_checkpoint_and_the_matches() {
    let log = load_memory_log(&data("mobilenetv2_oom_memlog_dump.txt.gz")).unwrap();
    let lines = replay(&log, Some(512 << 20)).describe();
    assert!(
        lines[0].starts_with("checkpoint at event 24749"),
        "{lines:?}"
    );
    assert_eq!(
        lines[1],
        "20370 of 20370 allocations at TensorFlow's address, 20370 of 20370 with its chunk size"
    );
    assert_eq!(
        lines.last().unwrap(),
        "chunk map identical to the dump's (2709 chunks)"
    );
}

/// Issue 20, item 16: the guided replay says how many decisions consulted TensorFlow's
/// addresses, and of what kind; without guidance none does, and the match rate is its own.
#[test]
fn guided_decisions_are_counted_and_no_guidance_reports_its_own_match_rate() {
    let log = load_memory_log(&data("mobilenetv2_train_memlog.txt.gz")).unwrap();
    let guided = replay(&log, None);
    assert!(guided.guided);
    let g = guided.guided_decisions;
    // Two threads race on frees (7 allocations retried, all kept) and two raw chunks are
    // live at the checkpoint.
    assert_eq!(g.placements_retried, 7);
    assert_eq!(g.held_back_frees, guided.held_back);
    assert_eq!(g.raw_chunk_sizes_chosen, 2);
    assert_eq!(g.total(), 9);
    assert_exact(&guided);
    let plain = replay_checkpointed(
        &log,
        &FidelityOptions {
            no_guidance: true,
            ..FidelityOptions::default()
        },
    )
    .unwrap();
    assert!(!plain.guided);
    assert_eq!(plain.guided_decisions.total(), 0);
    assert_eq!(plain.held_back, 0);
    assert_eq!(plain.checked, guided.checked);
    // Every address is checked, and without the log's help some land elsewhere.
    assert_eq!(plain.address_matches, 18_392);
    assert!(plain.first_divergence.is_some());
    assert!(
        plain
            .describe()
            .iter()
            .any(|l| l.starts_with("no guidance")),
        "{:?}",
        plain.describe()
    );
}

/// "N of M chunks identical" counts the chunks both maps hold, whatever their position: one
/// extra chunk at a low address in the replay must not make every later chunk "differ".
#[test]
fn chunk_map_comparison_counts_common_chunks_not_positions() {
    use allocview_loaders::analysis::tf_fidelity::compare_chunk_maps;
    use allocview_sim::policy::bfc::ChunkInfo;
    let dump = load_bfc_dump(&data("mobilenetv2_oom_dump.txt.gz")).unwrap();
    let chunk = |addr: u64, size_bytes: u64, in_use: bool| ChunkInfo {
        addr,
        size_bytes,
        in_use,
        requested_bytes: 0,
        allocation_id: None,
        request_id: u32::MAX,
        bin: 0,
        region: 0,
        handle: 0,
        next_handle: None,
    };
    let mut replay: Vec<ChunkInfo> = dump
        .chunks
        .iter()
        .map(|c| chunk(c.address, c.size_bytes, c.in_use))
        .collect();
    let same = compare_chunk_maps(&dump, &replay);
    assert!(same.all_identical());
    let n = same.dump_chunks;
    assert!(n > 1000);
    // One extra chunk below every other one.
    let lowest = dump.chunks.iter().map(|c| c.address).min().unwrap();
    replay.push(chunk(lowest - 256, 256, false));
    let c = compare_chunk_maps(&dump, &replay);
    assert_eq!(c.replay_chunks, n + 1);
    assert_eq!(c.identical, n, "every dump chunk is still in the replay");
    assert!(!c.all_identical());
    // One chunk changed: one fewer in common.
    replay.pop();
    replay[n as usize / 2].in_use = !replay[n as usize / 2].in_use;
    let c = compare_chunk_maps(&dump, &replay);
    assert_eq!(c.identical, n - 1);
}

/// Replays `log` on a thread; fails (rather than hangs) when it takes longer than 60 s.
fn replay_within_a_minute(log: TfMemoryLog) -> Fidelity {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(replay(&log, None)).ok());
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("the replay ended within a minute")
}

/// Issue 43: an allocation id of 10^18 walked the checkpoint search and the replay's id-order
/// pass through every id below it (years), and one of i64::MAX overflowed `id + 1`. The
/// counts come from the ids that occur.
#[test]
fn huge_allocation_ids_are_counted_not_walked() {
    let base = 0x100000;
    let huge = 1_000_000_000_000_000_000u64;
    let (a1, a_huge) = (alloc(1, base), alloc(huge, base + 256));
    let f = replay_within_a_minute(synthetic(&[(1, &a1), (1, &a_huge)]));
    let cp = f.checkpoint.as_ref().unwrap();
    // Every id but 1 and 10^18 is unlogged, and all of them come after the checkpoint.
    assert_eq!(cp.unlogged_ids, huge - 2);
    assert_eq!((cp.unknown_live, cp.unknown_after), (0, huge - 2));
    assert_eq!((f.checked, f.address_matches), (2, 2));

    // i64::MAX, after a free of an id the log never shows (the checkpoint comes after it).
    let max = i64::MAX as u64;
    let (f5, a_max) = (free(5), alloc(max, base + 256));
    let f = replay_within_a_minute(synthetic(&[(1, &a1), (1, &f5), (1, &a_max)]));
    let cp = f.checkpoint.as_ref().unwrap();
    assert_eq!(cp.event, 2);
    assert_eq!(cp.unlogged_ids, max - 2);
    // Below the counter (i64::MAX): every id but 1 (logged) and 5 (freed) is live unknown.
    assert_eq!((cp.unknown_live, cp.unknown_after), (max - 3, 0));
    assert_eq!(cp.live_logged, 1);
}

/// Issue 43: the chunks live at the checkpoint carry the log's pointers and sizes, and the
/// replay added them unchecked (a raw chunk's end, the state's bytes in use): a panic in a
/// debug build, a wrapped figure in a release one. A state that runs past the address space
/// is refused instead, the replay ends with an error.
#[test]
fn live_chunks_past_the_address_space_are_refused_not_added_up() {
    let big = |id: u64, ptr: u64| {
        format!(
            "MemoryLogTensorAllocation {{ step_id: 1 kernel_name: \"k\" tensor {{ dtype: DT_FLOAT \
             shape {{ }} allocation_description {{ requested_bytes: 256 allocated_bytes: {} \
             allocator_name: \"A_bfc\" allocation_id: {id} ptr: {ptr} }} }} }}",
            1u64 << 63
        )
    };
    let raw = format!(
        "MemoryLogRawAllocation {{ step_id: 1 operation: \"x\" num_bytes: {} ptr: {} \
         allocation_id: 3 allocator_name: \"A_bfc\" }}",
        u64::MAX - 4096,
        u64::MAX - 512
    );
    let (a1, a2, f9, a4) = (
        big(1, 0x100000),
        big(2, 0x100100),
        free(9),
        alloc(4, 0x100200),
    );
    // The free of id 9, which the log never shows allocated, puts the checkpoint after the
    // three live chunks.
    for records in [
        vec![(1, a1.as_str()), (1, &a2), (1, &f9), (1, &a4)],
        vec![(1, raw.as_str()), (1, &f9), (1, &a4)],
    ] {
        let log = synthetic(&records);
        let e = replay_checkpointed(&log, &FidelityOptions::default()).unwrap_err();
        assert!(e.to_string().contains("not a valid BFC state"), "{e}");
    }
}
