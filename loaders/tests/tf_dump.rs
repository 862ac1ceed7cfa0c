//! BFC OOM dumps: the two real MobileNetV2 dumps and three public ones. Expected figures come
//! from the data's README (counted independently from the dumps' chunk lines) and from the
//! dumps' own printed lines.

// Test helpers may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use allocview_loaders::tf::dump::{
    BfcDump, DumpFormat, NO_NEXT_HANDLE, load_bfc_dump, load_bfc_dumps, parse_bfc_dumps,
};
use polars::prelude::*;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tf")
        .join(name)
}

fn load(name: &str) -> BfcDump {
    load_bfc_dump(&data(name)).unwrap()
}

const REACTANT: &str =
    "public_EnzymeAD-Reactant.jl_docs-src-introduction-index.md@f17387c0_xla-gpu-2025.txt";

fn stat_text(d: &BfcDump, key: &str) -> String {
    d.stat(key)
        .unwrap_or_else(|| panic!("no {key}"))
        .text
        .clone()
}

/// (in-use chunks, in-use bytes, free chunks, free bytes, regions, region bytes)
fn totals(d: &BfcDump) -> [u64; 6] {
    let f = d.figures;
    [
        f.in_use_chunks.unwrap(),
        f.in_use_bytes.unwrap(),
        f.free_chunks.unwrap(),
        f.free_bytes.unwrap(),
        f.regions.unwrap(),
        f.region_bytes.unwrap(),
    ]
}

#[test]
fn mobilenetv2_dump_only_matches_the_readme_table() {
    let d = load("mobilenetv2_oom_dump.txt.gz");
    assert_eq!(d.format, DumpFormat::Current);
    assert_eq!(d.allocator.as_deref(), Some("bfc_cpu_allocator_for_gpu"));
    let oom = d.oom.as_ref().unwrap();
    assert_eq!(oom.text, "98.00MiB");
    assert_eq!(oom.rounded_bytes, Some(102_760_448));
    assert_eq!(
        oom.op.as_deref(),
        Some("mobilenetv2_1.00_224_1/expanded_conv_depthwise_BN_1/moments/SquaredDifference")
    );
    assert_eq!(totals(&d), [2706, 534_765_568, 3, 8_192, 8, 534_773_760]);
    for (key, text) in [
        ("bytes_limit", "512.00MiB"),
        ("bytes_in_use", "509.99MiB"),
        ("peak_bytes_in_use", "509.99MiB"),
        ("num_allocs", "34563"),
        ("largest_alloc_size", "151.88MiB"),
    ] {
        assert_eq!(stat_text(&d, key), text, "{key}");
    }
    assert_eq!(d.stat("num_allocs").unwrap().value.bytes, 34_563);
    assert_eq!(d.stat("Limit").unwrap().value.bytes, 512 << 20);
    // Human-readable InUse is a range that holds the exact in-use chunk bytes.
    assert!(d.stat("bytes_in_use").unwrap().value.contains(534_765_568));
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert!(d.missing.is_empty(), "{:?}", d.missing);
    // Only 8 KiB free: not a fragmentation OOM.
    assert_eq!(d.figures.fragmentation_oom, Some(false));
    assert_eq!(d.bins.len(), 21);
    assert_eq!(d.frames.chunks.height(), 2709);
    assert_eq!(d.frames.regions.height(), 8);
}

#[test]
fn mobilenetv2_memlog_dump_is_a_fragmentation_oom() {
    let d = load("mobilenetv2_oom_memlog_dump.txt.gz");
    assert_eq!(
        totals(&d),
        [2706, 432_013_312, 3, 102_760_448, 8, 534_773_760]
    );
    for (key, text) in [
        ("bytes_limit", "512.00MiB"),
        ("bytes_in_use", "412.00MiB"),
        ("peak_bytes_in_use", "412.00MiB"),
        ("num_allocs", "34561"),
        ("largest_alloc_size", "151.91MiB"),
    ] {
        assert_eq!(stat_text(&d, key), text, "{key}");
    }
    let oom = d.oom.as_ref().unwrap();
    assert_eq!(oom.rounded_bytes, Some(102_760_448));
    // The free bytes equal the rounded request exactly, in three chunks.
    assert_eq!(d.figures.fragmentation_oom, Some(true));
    assert!(d.figures.largest_free_chunk_bytes.unwrap() < 102_760_448);
    assert!(d.diagnosis().unwrap().starts_with("fragmentation"));
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    // Every region's last chunk says next -1, and only it.
    let last_of_region = d
        .chunks
        .iter()
        .filter(|c| c.next_handle == Some(NO_NEXT_HANDLE))
        .count();
    assert_eq!(last_of_region, 8);
    // The dump sits at the end of a 69,503-line memory log.
    assert_eq!(d.first_line, 66_698);
    // Region sizes as printed: 256 MiB down to 2 MiB.
    let sizes: Vec<u64> = d.regions.iter().map(|r| r.size_bytes).collect();
    assert_eq!(
        sizes,
        (21..=28).rev().map(|b| 1u64 << b).collect::<Vec<_>>()
    );
    // The chunks DataFrame agrees with the typed rows.
    let in_use = d
        .frames
        .chunks
        .column("in_use")
        .unwrap()
        .bool()
        .unwrap()
        .sum();
    assert_eq!(in_use, Some(2706));
}

#[test]
fn alexnet_2017_old_format_tiles_the_limit() {
    let d = load("public_alexnet-k40c-2017.txt");
    assert_eq!(d.format, DumpFormat::Old);
    assert_eq!(d.allocator.as_deref(), Some("GPU_0_bfc"));
    let oom = d.oom.as_ref().unwrap();
    assert_eq!(oom.text, "74.16MiB");
    assert_eq!(oom.rounded_bytes, None);
    // One inferred region: the chunks tile the whole Limit.
    assert_eq!(d.regions.len(), 1);
    assert_eq!(d.regions[0].size_bytes, 285_474_816);
    assert_eq!(d.regions[0].line, None);
    assert_eq!(d.stat("bytes_limit").unwrap().value.bytes, 285_474_816);
    assert!(d.stat("bytes_limit").unwrap().value.is_exact());
    // In-use chunk sum = InUse = summary sum.
    assert_eq!(d.figures.in_use_bytes, Some(208_404_480));
    assert_eq!(d.stat("InUse").unwrap().value.bytes, 208_404_480);
    let summary: u64 = d.summary.iter().map(|r| r.size_bytes * r.count).sum();
    assert_eq!(summary, 208_404_480);
    assert_eq!(d.figures.in_use_chunks, Some(20));
    assert_eq!(d.figures.free_chunks, Some(4));
    assert_eq!(d.figures.free_bytes, Some(285_474_816 - 208_404_480));
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    for m in [
        "rounded request",
        "requesting op",
        "region lines",
        "next handles",
    ] {
        assert!(d.missing.iter().any(|x| x == m), "{m} in {:?}", d.missing);
    }
    // Not a fragmentation OOM: the free chunks add up to less than the request.
    assert_eq!(d.figures.fragmentation_oom, Some(false));
}

#[test]
fn reactant_2025_xla_dump_with_raw_stats() {
    let d = load(REACTANT);
    assert_eq!(d.format, DumpFormat::Current);
    assert_eq!(d.allocator.as_deref(), Some("GPU_0_bfc"));
    let oom = d.oom.as_ref().unwrap();
    assert_eq!(oom.rounded_bytes, Some(4_000_000_000));
    assert_eq!(oom.op, None);
    assert_eq!(
        totals(&d),
        [4, 16_000_000_000, 1, 2_995_773_440, 1, 18_995_773_440]
    );
    assert_eq!(d.figures.largest_free_chunk_bytes, Some(2_995_773_440));
    let stats: Vec<(String, u64)> = d.stats_bytes();
    let expect = [
        ("bytes_limit", 18_995_773_440),
        ("bytes_in_use", 16_000_000_000),
        ("peak_bytes_in_use", 16_000_000_000),
        ("num_allocs", 4),
        ("largest_alloc_size", 4_000_000_000),
        ("bytes_reserved", 0),
        ("peak_bytes_reserved", 0),
        ("largest_free_block_bytes", 0),
    ];
    assert_eq!(stats.len(), expect.len());
    for ((k, v), (ek, ev)) in stats.iter().zip(expect) {
        assert_eq!((k.as_str(), *v), (ek, ev));
    }
    assert!(d.stats.iter().all(|s| s.value.is_exact()));
    let pool = d.pool.unwrap();
    assert_eq!(pool.region_bytes.unwrap().bytes, 18_995_773_440);
    assert_eq!(pool.curr_region_allocation.unwrap().bytes, 37_991_546_880);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(d.missing, vec!["requesting op".to_string()]);
}

#[test]
fn tf08_partial_dump_loads_what_is_there() {
    let d = load("public_tf080-mnist-blog-2016_partial.txt");
    assert_eq!(d.format, DumpFormat::Partial);
    assert_eq!(d.summary.len(), 10);
    assert_eq!(d.figures.in_use_chunks, Some(62));
    assert_eq!(d.figures.in_use_bytes, Some(1_477_023_232));
    assert_eq!(d.stat("InUse").unwrap().value.bytes, 1_477_023_232);
    assert_eq!(d.stat("MaxInUse").unwrap().value.bytes, 1_477_423_360);
    assert_eq!(d.stat("NumAllocs").unwrap().value.bytes, 2_405_088);
    // The request line comes after the dump in TF 0.8.
    let oom = d.oom.as_ref().unwrap();
    assert_eq!(oom.text, "29.91MiB");
    assert_eq!(oom.line, 21);
    assert_eq!(d.figures.free_bytes, None);
    assert_eq!(d.figures.fragmentation_oom, None);
    assert_eq!(d.diagnosis(), None);
    for m in ["allocator name", "bins", "chunks", "region lines"] {
        assert!(d.missing.iter().any(|x| x == m), "{m} in {:?}", d.missing);
    }
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(
        d.occupancy.as_deref().map(str::len),
        Some(100),
        "the occupancy line"
    );
}

/// A dump whose lines disagree gets warnings that name the lines.
#[test]
fn mismatches_are_warnings_with_line_numbers() {
    let text = std::fs::read_to_string(data("public_alexnet-k40c-2017.txt")).unwrap();
    // Line 25 is the first chunk; make it 256 bytes larger than printed elsewhere.
    let tampered = text.replacen(
        "Chunk at 0x905a40000 of size 1280",
        "Chunk at 0x905a40000 of size 1536",
        1,
    );
    assert_ne!(tampered, text);
    let d = parse_bfc_dumps(&tampered).unwrap().remove(0);
    let lines: Vec<u64> = d.warnings.iter().map(|w| w.line).collect();
    // The summary (line 50, its first row) and InUse (line 65) disagree with the chunks.
    assert!(lines.contains(&50), "{:?}", d.warnings);
    assert!(lines.contains(&65), "{:?}", d.warnings);
    // Bin 1024 (line 3) now counts a chunk it did not print, bin 2048 printed none.
    assert!(
        d.warnings.iter().any(|w| w.message.contains("bin 1024")),
        "{:?}",
        d.warnings
    );
    // The chunk now overlaps its neighbour: the inferred region splits in two.
    assert_eq!(d.regions.len(), 2);
}

#[test]
fn chunks_that_do_not_tile_their_region_are_reported() {
    let text = "\
I0000 00:00:1.0 1 bfc_allocator.cc:1049] BFCAllocator dump for A
I0000 00:00:1.0 1 bfc_allocator.cc:1085] Next region of size 2048
I0000 00:00:1.0 1 bfc_allocator.cc:1085] InUse at 1000 of size 1024 next 1
I0000 00:00:1.0 1 bfc_allocator.cc:1085] Free  at 1500 of size 512 next 18446744073709551615
I0000 00:00:1.0 1 bfc_allocator.cc:1085] Stats: 
InUse:        1024

";
    let d = parse_bfc_dumps(text).unwrap().remove(0);
    let msgs: Vec<String> = d.warnings.iter().map(ToString::to_string).collect();
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("line 4: chunk at 0x1500")),
        "{msgs:?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("line 2: the region's 2 chunks hold 1536")),
        "{msgs:?}"
    );
    assert_eq!(d.stat("InUse").unwrap().value.bytes, 1024);
}

#[test]
fn a_log_without_a_dump_is_an_error_and_warnings_alone_are_no_dump() {
    let text = "I0000 00:00:1.0 1 bfc_allocator.cc:462] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.20GiB with freed_by_count=0. The caller indicates that this is not a failure\n";
    assert!(parse_bfc_dumps(text).unwrap().is_empty());
    assert!(load_bfc_dump(&data("mobilenetv2_infer_memlog.txt.gz")).is_err());
    assert!(
        load_bfc_dumps(&data("mobilenetv2_infer_memlog.txt.gz"))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn two_dumps_in_one_log_are_two_dumps() {
    let one = std::fs::read_to_string(data(REACTANT)).unwrap();
    let twice = format!("{one}\nsome other output\n{one}");
    let dumps = parse_bfc_dumps(&twice).unwrap();
    assert_eq!(dumps.len(), 2);
    assert_eq!(totals(&dumps[0]), totals(&dumps[1]));
    assert!(dumps[1].first_line > dumps[0].last_line);
    let stats = &dumps[1].frames.stats;
    let key = stats.column("key").unwrap().str().unwrap().get(0);
    assert_eq!(key, Some("bytes_limit"));
    assert_eq!(stats.column("bytes").unwrap().dtype(), &DataType::UInt64);
}

#[test]
fn tensorflow_inputs_are_detected_by_content() {
    use allocview_loaders::tf::{TfKind, detect_kind};
    let kind = |name: &str| detect_kind(&data(name)).unwrap();
    assert_eq!(kind("mobilenetv2_oom_dump.txt.gz"), Some(TfKind::BfcDump));
    assert_eq!(kind("public_alexnet-k40c-2017.txt"), Some(TfKind::BfcDump));
    assert_eq!(
        kind("public_tf080-mnist-blog-2016_partial.txt"),
        Some(TfKind::BfcDump)
    );
    assert_eq!(kind(REACTANT), Some(TfKind::BfcDump));
    assert_eq!(
        kind("mobilenetv2_oom_memlog_dump.txt.gz"),
        Some(TfKind::MemoryLog)
    );
    assert_eq!(
        kind("mobilenetv2_train_memlog.txt.gz"),
        Some(TfKind::MemoryLog)
    );
    assert_eq!(kind("README.md"), None);
}

/// Each dump, rebuilt as a BFC allocator, is a valid state and refuses the request TF refused.
#[test]
fn the_dumps_state_refuses_its_own_request() {
    use allocview_sim::policy::Policy;
    for name in [
        "mobilenetv2_oom_dump.txt.gz",
        "mobilenetv2_oom_memlog_dump.txt.gz",
        "public_alexnet-k40c-2017.txt",
        REACTANT,
    ] {
        let d = load(name);
        let mut bfc = d.to_bfc().unwrap();
        bfc.check_invariants().unwrap();
        assert_eq!(bfc.chunks().len(), d.chunks.len(), "{name}");
        assert_eq!(
            bfc.largest_free_chunk_bytes(),
            d.figures.largest_free_chunk_bytes.unwrap()
        );
        let request = d.figures.request_rounded_bytes.unwrap();
        assert!(bfc.allocate(request, 0).is_err(), "{name}");
        // A request the largest free chunk holds succeeds.
        let fits = d.figures.largest_free_chunk_bytes.unwrap();
        if fits > 0 {
            assert!(bfc.allocate(fits, 0).is_ok(), "{name}");
        }
        let blocks = d.blocks();
        assert_eq!(blocks.len(), d.chunks.len());
        assert!(blocks.windows(2).all(|w| w[0].addr < w[1].addr));
    }
    // A partial dump has no chunks to rebuild from.
    assert!(
        load("public_tf080-mnist-blog-2016_partial.txt")
            .to_bfc()
            .is_ok_and(|b| b.chunks().is_empty())
    );
}

const P: &str = "I0000 00:00:1.0 1 bfc_allocator.cc:1085]";

/// Issue 20, item 11: sums past 2^64 are an error naming the line, never a wrapped figure.
#[test]
fn sums_past_64_bits_are_an_error_naming_the_line() {
    // A chunk of u64::MAX bytes beside a real one: the in-use total does not fit.
    let text = format!(
        "{P} BFCAllocator dump for A\n\
         {P} Next region of size 2048\n\
         {P} InUse at 1000 of size 1024 next 1\n\
         {P} InUse at 1400 of size 18446744073709551615 next 18446744073709551615\n"
    );
    let err = parse_bfc_dumps(&text).err().unwrap().to_string();
    assert!(err.starts_with("line "), "{err}");
    assert!(err.contains("past 2^64 - 1"), "{err}");
    // `size x count` of a summary row past 2^64.
    let text = format!(
        "{P} BFCAllocator dump for A\n\
         {P} 4294967296 Chunks of size 8589934592 totalling 1.0KiB\n"
    );
    let err = parse_bfc_dumps(&text).err().unwrap().to_string();
    assert!(err.starts_with("line 2:"), "{err}");
    assert!(
        err.contains("4294967296 chunks of 8589934592 bytes"),
        "{err}"
    );
    // Through the file loader, the error names the file too.
    let dir = std::env::temp_dir().join(format!("allocview-dumpwrap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("wrap.log");
    std::fs::write(&path, &text).unwrap();
    let err = load_bfc_dumps(&path).err().unwrap().to_string();
    assert!(err.contains("line 2:") && err.contains("wrap.log"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 20, item 12: unreadable chunk lines and overlapping or repeated chunk addresses are
/// counted and warned about; an unreadable Stats value does not end the Stats block.
#[test]
fn unreadable_lines_and_overlaps_are_counted_and_the_stats_block_survives() {
    let text = format!(
        "{P} BFCAllocator dump for A\n\
         {P} Next region of size 2048\n\
         {P} InUse at 1000 of size 1024 next 1\n\
         {P} InUse at zzzz of size 512 next 2\n\
         {P} InUse at 1000 of size 512 next 3\n\
         {P} Free  at 1200 of size 512 next 18446744073709551615\n\
         {P} Next region of size 99999999999999999999999\n\
         {P} Stats: \n\
         Limit:        18446744073709551616\n\
         InUse:        1536\n\
         MaxInUse:     2048\n"
    );
    let d = parse_bfc_dumps(&text).unwrap().remove(0);
    let msgs: Vec<String> = d.warnings.iter().map(ToString::to_string).collect();
    // The bad chunk line, the region line past 2^64 and the Limit past 2^64.
    assert_eq!(d.unreadable_lines, 3, "{msgs:?}");
    for line in [4, 7, 9] {
        assert!(
            msgs.iter()
                .any(|m| m.starts_with(&format!("line {line}: unreadable line"))),
            "line {line}: {msgs:?}"
        );
    }
    // Line 5 repeats line 3's address; line 6 starts inside line 3's chunk.
    assert_eq!(d.overlapping_chunks, 2, "{msgs:?}");
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("line 5: chunk at 0x1000 repeats the address of line 3")),
        "{msgs:?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("line 6: chunk at 0x1200 starts inside the chunk of line 3")),
        "{msgs:?}"
    );
    // The Stats lines after the unreadable Limit are kept.
    assert_eq!(d.stat("InUse").unwrap().value.bytes, 1536);
    assert_eq!(d.stat("MaxInUse").unwrap().value.bytes, 2048);
    assert!(d.stat("Limit").is_none());
}
