use super::*;
use crate::events::{LoadOptions, Strictness};
use crate::events::{MAX_THREADS, Record};
use std::path::PathBuf;

fn records() -> Vec<Record> {
    vec![
        Record {
            t_ns: 1_000,
            tid: 7,
            size_bytes: Some(24),
            addr: 0x1000,
            call: Some(1),
            stack: None,
            heap: 0,
        },
        Record {
            t_ns: 3_000,
            tid: 7,
            size_bytes: None,
            addr: 0x1000,
            call: Some(2),
            stack: None,
            heap: 0,
        },
        Record {
            t_ns: 3_000,
            tid: 9,
            size_bytes: Some(96),
            addr: 0x3000,
            call: Some(2),
            stack: None,
            heap: 0,
        },
        Record {
            t_ns: 2_500,
            tid: 7,
            size_bytes: None,
            addr: 0,
            call: None,
            stack: None,
            heap: 0,
        },
        Record {
            t_ns: 4_000,
            tid: 9,
            size_bytes: Some(u64::MAX),
            addr: 0,
            call: Some(0),
            stack: None,
            heap: 0,
        },
        Record {
            t_ns: 4_001,
            tid: u64::MAX,
            size_bytes: None,
            addr: u64::MAX,
            call: Some(3),
            stack: None,
            heap: 0,
        },
    ]
}

fn write(records: &[Record]) -> Vec<u8> {
    let mut w = BinaryWriter::new(Vec::new(), &[("pid".into(), "1".into())]).unwrap();
    for r in records {
        w.push(r).unwrap();
    }
    w.finish().unwrap()
}

pub(super) fn read(bytes: &[u8]) -> (Vec<Record>, BinaryInfo) {
    let dir = tempfile::Builder::new()
        .prefix("allocview-binary-test-")
        .tempdir()
        .unwrap();
    let path = dir.path().join(format!("{}.avt", bytes.len()));
    std::fs::write(&path, bytes).unwrap();
    let mut out = Vec::new();
    let info = read_records(&path, TimeBase::default(), |r| {
        out.push(*r);
        Ok(())
    })
    .unwrap();
    std::fs::remove_file(&path).ok();
    (out, info)
}

#[test]
fn records_round_trip_exactly() {
    let recs = records();
    let (back, info) = read(&write(&recs));
    assert_eq!(back, recs);
    assert_eq!(info.records, recs.len() as u64);
    assert_eq!(info.truncated, None);
    assert_eq!(info.meta_value("pid"), Some("1"));
}

#[test]
fn many_blocks_round_trip() {
    let recs: Vec<Record> = (0..(BLOCK_EVENTS as u64 * 2 + 17))
        .map(|i| Record {
            t_ns: i as i64 * 37,
            tid: i % 3,
            size_bytes: (i % 2 == 0).then_some(i * 8),
            addr: 0x5555_0000 + (i / 2) * 64,
            call: Some((i % 11) as u8),
            stack: None,
            heap: 0,
        })
        .collect();
    let bytes = write(&recs);
    assert!(
        bytes.len() < recs.len() * 3,
        "{} bytes for {} records",
        bytes.len(),
        recs.len()
    );
    let (back, _) = read(&bytes);
    assert_eq!(back, recs);
}

#[test]
fn a_cut_file_reads_what_is_there_and_says_so() {
    let recs = records();
    let bytes = write(&recs);
    // Drop the END frame (1 tag + 4 length + 1 varint).
    let (back, info) = read(&bytes[..bytes.len() - 6]);
    assert_eq!(back, recs);
    assert!(info.truncated.is_some());
    // Cut inside the INDEX frame (before END): every event is there, the cut is reported.
    let (back, info) = read(&bytes[..bytes.len() - 9]);
    assert_eq!(back, recs);
    assert!(info.truncated.is_some());
    // Cut inside the events frame (which ends where the INDEX frame starts, as its trailer
    // says): nothing of it is read, and the cut is reported.
    let end_at = bytes.len() - 6;
    let index_at = u64::from_le_bytes(bytes[end_at - 8..end_at].try_into().unwrap()) as usize;
    assert_eq!(bytes[index_at], 0x09);
    let (back, info) = read(&bytes[..index_at - 6]);
    assert!(back.is_empty());
    assert!(info.truncated.is_some());
}

#[test]
fn corrupt_blocks_are_errors_not_panics() {
    let mut bytes = write(&records());
    let dir = std::env::temp_dir();
    let path = dir.join(format!(
        "allocview-binary-corrupt-{}.avt",
        std::process::id()
    ));
    // Flip every byte after the header in turn; reading must never panic.
    for i in 10..bytes.len() {
        bytes[i] ^= 0x5a;
        std::fs::write(&path, &bytes).unwrap();
        let _ = read_records(&path, TimeBase::default(), |_| Ok(()));
        bytes[i] ^= 0x5a;
    }
    std::fs::remove_file(&path).ok();
}

/// Records over `blocks` full blocks plus a few, as `convert` writes them.
fn many_records(blocks: u64) -> Vec<Record> {
    (0..(u64::from(BLOCK_EVENTS) * blocks + 17))
        .map(|i| Record {
            t_ns: i as i64 * 37,
            tid: i % 3,
            size_bytes: (i % 2 == 0).then_some(i * 8),
            addr: 0x5555_0000 + (i / 2) * 64,
            call: Some((i % 11) as u8),
            stack: None,
            heap: 0,
        })
        .collect()
}

/// The frames of a written trace: (offset in the file, tag, payload length).
fn frames_of(bytes: &[u8]) -> Vec<(usize, u8, usize)> {
    let mut out = Vec::new();
    let mut pos = 10;
    while pos + 5 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[pos + 1..pos + 5].try_into().unwrap()) as usize;
        out.push((pos, bytes[pos], len));
        pos += 5 + len;
    }
    out
}

fn read_with(bytes: &[u8], strictness: Strictness) -> Result<(Vec<Record>, BinaryInfo), String> {
    let dir = tempfile::Builder::new()
        .prefix("allocview-binary-damage-")
        .tempdir()
        .unwrap();
    let path = dir
        .path()
        .join(format!("{}-{strictness:?}.avt", bytes.len()));
    std::fs::write(&path, bytes).unwrap();
    let mut out = Vec::new();
    let info = read_records_with(&path, TimeBase::default(), strictness, |r| {
        out.push(*r);
        Ok(())
    });
    std::fs::remove_file(&path).ok();
    info.map(|i| (out, i)).map_err(|e| e.to_string())
}

/// The second events block of a four-block trace: (its offset, its payload length).
fn second_block(bytes: &[u8]) -> (usize, usize) {
    let blocks: Vec<_> = frames_of(bytes)
        .into_iter()
        .filter(|f| f.1 == FRAME_EVENTS)
        .collect();
    assert_eq!(blocks.len(), 4);
    (blocks[1].0, blocks[1].2)
}

#[test]
fn a_corrupt_frame_length_in_the_middle_is_an_error_or_repaired_never_a_cut() {
    let recs = many_records(3);
    let good = write(&recs);
    let (at, len) = second_block(&good);
    // An impossible length, and a plausible one that ends inside the block's own data.
    for bad_len in [u32::MAX - 7, (len / 2) as u32] {
        let mut bytes = good.clone();
        bytes[at + 1..at + 5].copy_from_slice(&bad_len.to_le_bytes());
        let err = read_with(&bytes, Strictness::Strict).unwrap_err();
        assert!(err.contains(&format!("at byte {at}")), "{err}");
        assert!(err.contains("only its length is wrong"), "{err}");
        let (back, info) = read_with(&bytes, Strictness::Lenient).unwrap();
        assert_eq!(back, recs, "every event is recovered");
        assert_eq!(info.truncated, None);
        assert_eq!(info.events_lost, Some(0));
        assert_eq!(info.damaged.len(), 1);
        assert!(info.damaged[0].repaired);
        assert_eq!(info.damaged[0].offset, at as u64);
    }
}

#[test]
fn a_damaged_block_in_the_middle_is_skipped_counted_and_the_rest_read() {
    let recs = many_records(3);
    let good = write(&recs);
    let (at, len) = second_block(&good);
    let mut bytes = good.clone();
    // Zeros over the middle of the block's compressed data (its checksum catches it).
    let mid = at + 5 + len / 2;
    bytes[mid..mid + 64].fill(0);
    let err = read_with(&bytes, Strictness::Strict).unwrap_err();
    assert!(err.contains(&format!("at byte {at}")), "{err}");
    let (back, info) = read_with(&bytes, Strictness::Lenient).unwrap();
    let block = BLOCK_EVENTS as usize;
    // The first block, then everything after the damaged second one.
    assert_eq!(back.len(), recs.len() - block);
    assert_eq!(back[..block], recs[..block]);
    assert_eq!(back[block..], recs[2 * block..]);
    assert_eq!(info.events_lost, Some(BLOCK_EVENTS as u64));
    assert_eq!(info.truncated, None);
    assert_eq!(info.damaged.len(), 1);
    let d = &info.damaged[0];
    assert_eq!(
        (d.offset, d.skipped_bytes, d.repaired),
        (at as u64, len as u64 + 5, false)
    );

    // Loaded leniently, the summary says what was lost and where.
    let dir = std::env::temp_dir().join(format!("allocview-binary-lost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("damaged.avt");
    std::fs::write(&path, &bytes).unwrap();
    let opts = LoadOptions {
        strictness: Strictness::Lenient,
        progress: None,
        ..LoadOptions::default()
    };
    let t = load_binary(&path, &opts).unwrap();
    assert!(load_binary(&path, &LoadOptions::default()).is_err());
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(t.summary.events_lost, Some(u64::from(BLOCK_EVENTS)));
    let warnings = t.summary.warnings().join("\n");
    assert!(warnings.contains("65536 events lost"), "{warnings}");
    assert!(warnings.contains(&format!("byte {at}")), "{warnings}");
    assert!(!warnings.contains("truncated"), "{warnings}");
}

#[test]
fn damage_anywhere_never_panics_and_never_invents_events() {
    let recs = many_records(1);
    let good = write(&recs);
    let key = |r: &Record| (r.t_ns, r.tid, r.size_bytes, r.addr, r.call);
    let known: std::collections::HashSet<_> = recs.iter().map(key).collect();
    let frames = frames_of(&good);
    // Every frame header byte, and bytes across each payload.
    let mut spots: Vec<usize> = frames.iter().flat_map(|f| f.0..f.0 + 5).collect();
    for f in &frames {
        spots.extend((f.0 + 5..f.0 + 5 + f.2).step_by(f.2 / 24 + 1));
    }
    for i in spots {
        let mut bytes = good.clone();
        bytes[i] ^= 0xa5;
        if let Ok((back, info)) = read_with(&bytes, Strictness::Lenient) {
            // Whatever was read is a run of the true records (a damaged META or an unknown
            // frame loses nothing): no record is made up.
            for r in &back {
                assert!(known.contains(&key(r)), "byte {i}: {r:?}");
            }
            if back.len() < recs.len() {
                assert!(
                    !info.damaged.is_empty() || info.truncated.is_some(),
                    "byte {i}: {} of {} read without a word",
                    back.len(),
                    recs.len()
                );
            }
        }
    }
}

#[test]
fn the_writer_refuses_a_thread_the_loader_could_not_hold() {
    let rec = |tid: u64| Record {
        t_ns: 1,
        tid,
        size_bytes: Some(8),
        addr: 0x1000 + tid * 16,
        call: Some(0),
        stack: None,
        heap: 0,
    };
    let mut w = BinaryWriter::new(Vec::new(), &[]).unwrap();
    for tid in 0..MAX_THREADS as u64 {
        w.push(&rec(tid)).unwrap();
    }
    // A thread already seen is fine; one more is refused with a reason.
    w.push(&rec(7)).unwrap();
    let err = w.push(&rec(1 << 40)).unwrap_err();
    assert!(err.to_string().contains("at most 65536 threads"), "{err}");
    // What was written up to there loads: exactly the most threads allowed.
    let bytes = w.finish().unwrap();
    let dir = std::env::temp_dir().join(format!("allocview-binary-threads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("threads.avt");
    std::fs::write(&path, &bytes).unwrap();
    let t = load_binary(&path, &LoadOptions::default()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(t.threads.height(), MAX_THREADS);
    assert_eq!(t.summary.mallocs, MAX_THREADS as u64 + 1);
}

/// A record the pairing refuses, in a later block: the pairing runs on the thread decoding the
/// blocks, yet the error names the record and its block as before, and a lenient load keeps
/// every event before it and nothing of it.
#[test]
fn a_refused_record_in_a_later_block_is_named_and_what_precedes_it_loads() {
    let refused_at = u64::from(BLOCK_EVENTS) + 3;
    let recs: Vec<Record> = (0..u64::from(BLOCK_EVENTS) * 2 + 5)
        .map(|i| Record {
            t_ns: i as i64,
            tid: 1 + i % 2,
            // Past the 16 EiB a live set can hold, with 8 bytes already live.
            size_bytes: Some(if i == refused_at { u64::MAX } else { 8 }),
            // At a live address: the size check counts the block it would displace.
            addr: if i == refused_at { 0x10 } else { 0x10 + i * 16 },
            call: None,
            stack: None,
            heap: 0,
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("allocview-binary-refused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("refused.avt");
    let mut w = BinaryWriter::new(Vec::new(), &[]).unwrap();
    for r in &recs {
        w.push(r).unwrap();
    }
    std::fs::write(&path, w.finish().unwrap()).unwrap();
    let strict = load_binary(&path, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    let lenient = load_binary(
        &path,
        &LoadOptions {
            strictness: Strictness::Lenient,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        strict.contains(&format!(
            "record {refused_at} (in the events block at byte "
        )),
        "{strict}"
    );
    assert!(strict.contains("below 2^64"), "{strict}");
    let truncated = lenient.summary.truncated.clone().unwrap_or_default();
    assert!(
        truncated.contains(&format!("record {refused_at} ")),
        "{truncated}"
    );
    assert_eq!(lenient.summary.mallocs, refused_at);
    // The events before the refused one, and nothing of it.
    assert_eq!(lenient.events.height() as u64, refused_at);
}

/// A trace joined mid-run: one block allocated and freed while recorded, a free and a realloc
/// (free half plus allocation) of blocks allocated before the recording, and a block still
/// live at the end.
fn mid_run_records() -> Vec<Record> {
    let rec = |t_ns, size_bytes, addr, call| Record {
        t_ns,
        tid: 5,
        size_bytes,
        addr,
        call: Some(call),
        stack: None,
        heap: 0,
    };
    vec![
        rec(10, Some(12_345), 0x7000, 0),
        rec(20, None, 0x9000, 3),
        rec(30, None, 0xa000, 2),
        rec(30, Some(640), 0xb000, 2),
        rec(40, None, 0x7000, 3),
    ]
}

/// Writes `records` with `meta` to a file of `dir`, returns its path.
fn write_file(dir: &Path, name: &str, meta: &[(String, String)], records: &[Record]) -> PathBuf {
    let mut w = BinaryWriter::new(Vec::new(), meta).unwrap();
    for r in records {
        w.push(r).unwrap();
    }
    let path = dir.join(name);
    std::fs::write(&path, w.finish().unwrap()).unwrap();
    path
}

#[test]
fn frees_of_blocks_from_before_a_mid_run_start_are_counted_apart() {
    use crate::analysis::stats::{TraceStats, events_per_thread};
    let dir = tempfile::tempdir().unwrap();
    let mid = [(META_STARTED_MID_RUN.to_owned(), "1".to_owned())];
    let joined = write_file(dir.path(), "joined.avt", &mid, &mid_run_records());
    let plain = write_file(dir.path(), "plain.avt", &[], &mid_run_records());

    let t = load_binary(&joined, &LoadOptions::default()).unwrap();
    let s = &t.summary;
    assert!(s.started_mid_run);
    assert_eq!((s.frees_unknown, s.frees_before_recording), (0, 2));
    assert_eq!(s.frees, 3);
    let warnings = s.warnings().join("\n");
    assert!(
        warnings.contains("2 frees of blocks allocated before recording started"),
        "{warnings}"
    );
    assert!(!warnings.contains("never allocated"), "{warnings}");
    let view = crate::trace_view(&t.events, &joined).unwrap();
    let per_thread = events_per_thread(&t.events, 1).unwrap();
    let stats = TraceStats::compute(&view, per_thread, s);
    assert_eq!(stats.frees_unknown, 0);
    assert_eq!(stats.frees_before_recording, 2);
    // Only what was allocated while recorded is live at the end: the realloc's new block.
    assert_eq!((stats.final_live_blocks, stats.final_live_bytes), (1, 640));

    // The same events without the META line: unknown frees, as before.
    let t = load_binary(&plain, &LoadOptions::default()).unwrap();
    assert!(!t.summary.started_mid_run);
    assert_eq!(
        (t.summary.frees_unknown, t.summary.frees_before_recording),
        (2, 0)
    );

    // Streamed, the same counts.
    let mut stream = BinaryEventStream::open(&joined).unwrap();
    let mut batch = allocview_sim::stream::EventBatch::default();
    while allocview_sim::stream::EventSource::next_batch(&mut stream, &mut batch).unwrap() {}
    let s = stream.summary();
    assert_eq!((s.frees_unknown, s.frees_before_recording), (0, 2));
    assert!(started_mid_run(&read_meta(&joined).unwrap()));
    assert!(!started_mid_run(&read_meta(&plain).unwrap()));
}

#[test]
fn heap_events_round_trip_with_their_names_and_load_by_heap() {
    let mut recs = records();
    // The arena's block lies inside malloc's first block, at the same address: heaps apart.
    let arena = |size: Option<u64>, addr: u64| Record {
        t_ns: 4_000,
        tid: 11,
        size_bytes: size,
        addr,
        call: Some(if size.is_some() { 0 } else { 3 }),
        stack: None,
        heap: 300,
    };
    recs.insert(1, arena(Some(64), 0x1000));
    recs.insert(2, arena(Some(32), 0x1040));
    recs.insert(3, arena(None, 0x1000));
    let mut w = BinaryWriter::new(Vec::new(), &[]).unwrap();
    for r in &recs {
        w.push(r).unwrap();
    }
    w.write_heap_names(&[super::HeapName {
        id: 300,
        name: "arena".into(),
    }])
    .unwrap();
    let bytes = w.finish().unwrap();
    let (back, info) = read(&bytes);
    assert_eq!(back, recs);
    assert_eq!(
        info.heaps,
        [super::HeapName {
            id: 300,
            name: "arena".into()
        }]
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heaps.avt");
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(super::resolve_heap(&path, "arena").unwrap(), 300);
    assert_eq!(super::resolve_heap(&path, "malloc").unwrap(), 0);
    let err = super::resolve_heap(&path, "pool").unwrap_err().to_string();
    assert!(err.contains("the trace's heaps are malloc, arena"), "{err}");
    let opts = LoadOptions {
        heap: 300,
        ..LoadOptions::default()
    };
    let t = load_binary(&path, &opts).unwrap();
    assert_eq!(t.summary.mallocs, 2);
    assert_eq!(t.summary.frees, 1);
    assert_eq!(t.summary.frees_unknown, 0);
    let malloc = load_binary(&path, &LoadOptions::default()).unwrap();
    let plain_path = dir.path().join("plain.avt");
    std::fs::write(&plain_path, write(&records())).unwrap();
    let plain = load_binary(&plain_path, &LoadOptions::default()).unwrap();
    assert_eq!(malloc.summary.events, plain.summary.events);
    assert_eq!(malloc.summary.mallocs, plain.summary.mallocs);
    assert!(malloc.events.equals_missing(&plain.events));
    assert_eq!(malloc.summary.other_heap_events, 3);
    let figures = super::heap_figures(&path).unwrap();
    assert_eq!(figures[1].name, "arena");
    assert_eq!(figures[1].peak_live_bytes, 96);
    assert_eq!(figures[1].final_live_bytes, 32);
}

#[test]
fn a_trace_without_heap_events_is_written_as_before() {
    // No HEAPS frame and no op bit 7: the bytes readers before heaps read.
    let recs = records();
    let bytes = write(&recs);
    let mut w = BinaryWriter::new(Vec::new(), &[("pid".into(), "1".into())]).unwrap();
    for r in &recs {
        w.push(r).unwrap();
    }
    w.write_heap_names(&[]).unwrap();
    assert_eq!(w.finish().unwrap(), bytes);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain.avt");
    std::fs::write(&path, &bytes).unwrap();
    assert!(super::heap_names(&path).unwrap().is_empty());
}

/// Each allocation's frames, as the loader gives them (empty: no stack).
fn frames_per_allocation(path: &std::path::Path) -> Vec<Vec<String>> {
    let t = load_binary(path, &LoadOptions::default()).unwrap();
    let table = t.stacks.expect("a trace with stacks");
    let sites = crate::analysis::site_stats::EventSites::from_events(&t.events, Some(&table));
    sites
        .event_stack
        .iter()
        .map(|&id| {
            if id == crate::sites::NO_STACK {
                Vec::new()
            } else {
                table.frames_of(id).map(|f| f.to_string()).collect()
            }
        })
        .collect()
}

/// A recording writes the stacks as they are placed (`record` while the program runs): the
/// finished trace reads as if they were written once at the end, and the trace cut after the
/// first round has the stacks of its events.
#[test]
fn stacks_appended_as_they_grow_read_as_stacks_written_once() {
    use super::stacks::{PyCode, StackDef};
    let module = |path: &str, lo: u64| NativeModule {
        path: path.to_owned(),
        build_id: vec![1, 2],
        bias: lo,
        segments: vec![(lo, lo + 0x1000)],
    };
    let modules = [module("/prog", 0x40_0000), module("/libx.so", 0x7000_0000)];
    let def = |id: u32, pcs: Vec<u64>| StackDef {
        id,
        end: StackEnd::Complete,
        pcs,
        modules_before: 2,
    };
    let python = super::stacks::PY_FRAME_BIT | 5 << 24 | 12;
    let code = PyCode {
        id: 5,
        name: "train".to_owned(),
        file: "train.py".to_owned(),
    };
    let alloc = |i: u64, stack: u32| Record {
        t_ns: 1_000 * (i as i64 + 1),
        tid: 1,
        size_bytes: Some(64),
        addr: 0x10_000 + 0x100 * i,
        call: None,
        stack: Some(stack),
        heap: 0,
    };
    let native = |loc: usize, name: &str| {
        (
            loc,
            vec![SourceFrame {
                function: name.to_owned(),
                file: "x.c".to_owned(),
                line: 3,
            }],
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let grown = dir.path().join("grown.avt");
    let cut = dir.path().join("cut.avt");
    let mut p = super::stacks::Placer::default();
    let mut written = StacksWritten::default();
    let mut w = BinaryWriter::new(std::fs::File::create(&grown).unwrap(), &[]).unwrap();
    // Round 1: the program's own module, one stack; its symbol found.
    p.take_modules(&modules[..1]);
    p.place([def(1, vec![0x40_0010, 0x40_0020])], false);
    w.push(&alloc(0, 1)).unwrap();
    w.push(&alloc(1, 1)).unwrap();
    w.append_stacks(p.stacks(), &[native(0, "inner")], &mut written)
        .unwrap();
    w.flush().unwrap();
    std::fs::copy(&grown, &cut).unwrap();
    // Round 2: a library, a Python frame, the other symbol.
    p.take_modules(&modules);
    p.take_codes([code.clone()]);
    p.place([def(2, vec![0x7000_0100, python, 0x40_0020])], false);
    w.push(&alloc(2, 2)).unwrap();
    let located = p.stacks().locations.len();
    assert_eq!(written.locations(), 2);
    w.append_stacks(p.stacks(), &[native(1, "outer")], &mut written)
        .unwrap();
    p.place([], true);
    w.append_stacks(p.stacks(), &[], &mut written).unwrap();
    assert_eq!(written.locations(), located);
    w.finish().unwrap();

    // The same tables, placed and written at once, symbols and all.
    let mut once_stacks = super::stacks::from_spool(
        modules.to_vec(),
        vec![
            def(1, vec![0x40_0010, 0x40_0020]),
            def(2, vec![0x7000_0100, python, 0x40_0020]),
        ],
        &[code],
    );
    once_stacks
        .symbols
        .resize(once_stacks.locations.len(), Vec::new());
    once_stacks.symbols[0] = native(0, "inner").1;
    once_stacks.symbols[1] = native(1, "outer").1;
    let once = dir.path().join("once.avt");
    let mut w = BinaryWriter::new(std::fs::File::create(&once).unwrap(), &[]).unwrap();
    for (i, s) in [(0, 1), (1, 1), (2, 2)] {
        w.push(&alloc(i, s)).unwrap();
    }
    w.write_stacks(&once_stacks).unwrap();
    w.finish().unwrap();

    let expected = frames_per_allocation(&once);
    assert_eq!(
        expected[2],
        ["libx.so+0x100", "train (train.py:12)", "outer (x.c:3)"]
    );
    assert_eq!(frames_per_allocation(&grown), expected);
    // Cut after round 1: its events' stacks, with the one symbol found by then.
    let first = ["inner (x.c:3)", "prog+0x20"];
    assert_eq!(frames_per_allocation(&cut), [first, first]);
}
