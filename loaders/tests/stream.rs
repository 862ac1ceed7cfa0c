//! Streaming a binary trace block by block against loading it whole, on real traces: the same
//! events, the same statistics, and the same replay figures for every online policy; files
//! without a block index (written before it existed) index by a scan and stream the same.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

use allocview_loaders::analysis::stats::thread_indices;
use allocview_loaders::analysis::stats::{StatsAccumulator, TraceStats, events_per_thread};
use allocview_loaders::binary::{BinaryEventStream, BinaryWriter, load_binary, read_index};
use allocview_loaders::malloc_trace::read_text_records;
use allocview_loaders::{LoadOptions, MallocTrace};
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::predictive::Predictive;
use allocview_sim::policy::registry::{POLICY_NAMES, build};
use allocview_sim::predict::lifetime::AllocFeatures;
use allocview_sim::predict::streamed::{StreamedFeatures, Tapped};
use allocview_sim::replay::{Replay, ReplayOptions, replay};
use allocview_sim::stream::{EventBatch, replay_stream};

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces")
        .join(name)
}

mod scratch;

fn temp_dir() -> tempfile::TempDir {
    scratch::scratch_dir("allocview-stream-test-")
}

/// The real traces of the repository as binary files: the binary samples, and the text ones
/// converted (written by the current writer, so with a block index), and the folder that holds
/// the converted ones.
fn binary_traces() -> (tempfile::TempDir, Vec<PathBuf>) {
    let mut out: Vec<PathBuf> = ["perl_hash.avt", "python_json.avt", "xz_T2_libc.avt"]
        .iter()
        .map(|n| sample(n))
        .collect();
    let dir = temp_dir();
    for name in [
        "find_usr_include.trace.gz",
        "xz_T2_8KiB_blocks.trace.gz",
        "python_fragments.trace.gz",
    ] {
        let path = dir.path().join(name.replace(".trace.gz", ".avt"));
        let file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let mut w = BinaryWriter::new(file, &[]).unwrap();
        read_text_records(&sample(name), &LoadOptions::default(), |r| {
            w.push(r).map_err(|_| "a writable file")
        })
        .unwrap();
        w.finish().unwrap();
        out.push(path);
    }
    (dir, out)
}

/// Five copies of a real trace one after the other, each shifted in time and to pointers of
/// its own, the allocations a copy leaves live staying live: six blocks, with live
/// allocations and freed slots at every block boundary.
fn spliced_trace() -> scratch::Scratch {
    let path = scratch::scratch("allocview-stream-test-", "spliced.avt");
    let mut records = Vec::new();
    read_text_records(
        &sample("python_fragments.trace.gz"),
        &LoadOptions::default(),
        |r| {
            records.push(*r);
            Ok(())
        },
    )
    .unwrap();
    let span = records.last().unwrap().t_ns + 1;
    let file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut w = BinaryWriter::new(file, &[]).unwrap();
    for copy in 0..5u64 {
        for r in &records {
            let mut r = *r;
            r.t_ns += span * i64::try_from(copy).unwrap();
            if r.addr != 0 {
                r.addr += copy << 44;
            }
            w.push(&r).unwrap();
        }
    }
    w.finish().unwrap();
    path
}

/// Every event of the stream, and the stream at its end.
fn stream_all(path: &Path) -> (EventBatch, BinaryEventStream) {
    let mut stream = BinaryEventStream::open(path).unwrap();
    let all = rest_of(&mut stream);
    (all, stream)
}

/// The events `stream` has still to give.
fn rest_of(stream: &mut BinaryEventStream) -> EventBatch {
    let mut all = EventBatch::default();
    let mut batch = EventBatch::default();
    while stream.next_events(&mut batch).unwrap() {
        for k in 0..batch.len() {
            all.push(
                batch.t_ns[k],
                batch.kind[k],
                batch.size_bytes[k],
                batch.alloc_id[k],
                batch.slot[k],
                batch.thread[k],
                batch.addr[k],
            );
        }
    }
    all
}

fn loaded(path: &Path) -> MallocTrace {
    load_binary(path, &LoadOptions::default()).unwrap()
}

#[test]
fn streamed_events_and_stats_are_the_loaded_ones() {
    let (_dir, paths) = binary_traces();
    for path in paths {
        let trace = loaded(&path);
        let view = allocview_loaders::trace_view(&trace.events, &path).unwrap();
        let (all, stream) = stream_all(&path);
        assert_eq!(all.t_ns, view.t_ns, "{}", path.display());
        assert_eq!(all.kind, view.kind, "{}", path.display());
        assert_eq!(all.size_bytes, view.size_bytes, "{}", path.display());
        assert_eq!(all.alloc_id, view.alloc_id, "{}", path.display());
        let address: Vec<u64> = trace
            .events
            .column("address")
            .unwrap()
            .u64()
            .unwrap()
            .into_no_null_iter()
            .collect();
        assert_eq!(all.addr, address, "{}", path.display());
        assert_eq!(stream.summary(), &trace.summary, "{}", path.display());
        let per_thread = events_per_thread(&trace.events, trace.threads.height()).unwrap();
        assert_eq!(stream.events_per_thread(), per_thread.as_slice());
        let stats = TraceStats::compute(&view, per_thread.clone(), &trace.summary);
        let mut acc = StatsAccumulator::default();
        // In uneven pieces: the accumulator must not care where batches end.
        for piece in all.kind.chunks(1000).enumerate() {
            let at = piece.0 * 1000;
            let end = at + piece.1.len();
            acc.push_all(
                &all.t_ns[at..end],
                &all.kind[at..end],
                &all.size_bytes[at..end],
            );
        }
        assert_eq!(
            acc.finish(per_thread, stream.summary()),
            stats,
            "{}",
            path.display()
        );
        assert_eq!(stream.peak_live_bytes(), view.peak_live().0);
        assert_eq!(stream.peak_live_event(), view.peak_live().1 as u64);
        // Slots are recycled: never more of them than allocations live at once.
        let slots = all
            .slot
            .iter()
            .filter(|&&s| s != allocview_sim::trace::NO_ALLOC_ID)
            .max()
            .map_or(0, |&s| u64::from(s) + 1);
        assert!(
            slots <= stats.max_live_blocks.max(1),
            "{}: {slots} slots for at most {} live blocks",
            path.display(),
            stats.max_live_blocks
        );
    }
}

/// The figures two replays must share (not their timings).
fn assert_same_replay(a: &Replay, b: &Replay, what: &str) {
    let (sa, sb) = (&a.summary, &b.summary);
    assert_eq!(sa.events, sb.events, "{what}");
    assert_eq!(sa.peak_footprint_bytes, sb.peak_footprint_bytes, "{what}");
    assert_eq!(sa.peak_footprint_event, sb.peak_footprint_event, "{what}");
    assert_eq!(sa.final_footprint_bytes, sb.final_footprint_bytes, "{what}");
    assert_eq!(sa.peak_live_bytes, sb.peak_live_bytes, "{what}");
    assert_eq!(sa.peak_live_event, sb.peak_live_event, "{what}");
    assert_eq!(sa.peak_allocated_bytes, sb.peak_allocated_bytes, "{what}");
    assert_eq!(
        sa.fragmentation_at_peak.to_bits(),
        sb.fragmentation_at_peak.to_bits(),
        "{what}"
    );
    assert_eq!(
        sa.mean_fragmentation.to_bits(),
        sb.mean_fragmentation.to_bits(),
        "{what}"
    );
    assert_eq!(sa.oom_count, sb.oom_count, "{what}");
    assert_eq!(sa.final_counters, sb.final_counters, "{what}");
    assert_eq!(a.series, b.series, "{what}");
    assert_eq!(a.ooms, b.ooms, "{what}");
    assert_eq!(a.free_failures, b.free_failures, "{what}");
}

#[test]
fn streamed_replays_equal_loaded_replays_for_every_online_policy() {
    let (_dir, paths) = binary_traces();
    for path in paths {
        let trace = loaded(&path);
        let view = allocview_loaders::trace_view(&trace.events, &path).unwrap();
        let peak = view.peak_live().0;
        // Unlimited, and a limit under the peak so that allocations fail too.
        for limit in [None, Some(peak / 2 + 1)] {
            let config = PolicyConfig {
                limit_bytes: limit,
                ..PolicyConfig::default()
            };
            for &name in POLICY_NAMES {
                if name == "oracle" {
                    continue; // it plans from the whole trace: not streamed
                }
                let opts = ReplayOptions::default();
                let mut stream = BinaryEventStream::open(&path).unwrap();
                let (in_memory, streamed) = if name == "predictive" {
                    // Loaded: each thread's calls computed beforehand; streamed: as they come.
                    let threads = thread_indices(&trace.events).unwrap();
                    let features = AllocFeatures::from_trace(&view, Some(&threads), None);
                    let with_features = PolicyConfig {
                        alloc_features: Some(std::sync::Arc::new(features)),
                        ..config.clone()
                    };
                    let policy = build(name, &with_features, &view).unwrap();
                    let in_memory = replay(&view, policy, &opts);
                    let queue = std::sync::Arc::new(StreamedFeatures::default());
                    let policy = Predictive::streamed(&config, queue.clone()).unwrap();
                    let mut tapped = Tapped::new(&mut stream, queue);
                    let streamed = replay_stream(&mut tapped, Box::new(policy), &opts, None);
                    (in_memory, streamed.unwrap())
                } else {
                    let in_memory = replay(&view, build(name, &config, &view).unwrap(), &opts);
                    let policy = build(name, &config, &view).unwrap();
                    (
                        in_memory,
                        replay_stream(&mut stream, policy, &opts, None).unwrap(),
                    )
                };
                let what = format!("{name} with limit {limit:?} on {}", path.display());
                assert_same_replay(&in_memory, &streamed, &what);
                assert!(streamed.state_at(&view, 0).is_err(), "{what}: cannot seek");
            }
        }
    }
}

/// The file with its INDEX frame left out: a trace as written before the index existed.
fn without_index(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes[..10].to_vec();
    let mut pos = 10;
    while pos < bytes.len() {
        let tag = bytes[pos];
        let len = u32::from_le_bytes(bytes[pos + 1..pos + 5].try_into().unwrap()) as usize;
        if tag != 0x09 {
            out.extend_from_slice(&bytes[pos..pos + 5 + len]);
        }
        pos += 5 + len;
    }
    out
}

#[test]
fn files_without_an_index_are_scanned_and_stream_the_same() {
    let dir = temp_dir();
    // The binary samples were written before the index existed: they are indexed by a scan.
    assert!(!read_index(&sample("perl_hash.avt")).unwrap().from_frame);
    let (_converted, paths) = binary_traces();
    for original in paths {
        // Written again by the current writer (with an index), and without its index.
        let path = dir.path().join(format!(
            "new-{}",
            original.file_name().unwrap().to_string_lossy()
        ));
        let file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let mut w = BinaryWriter::new(file, &[]).unwrap();
        allocview_loaders::binary::read_records(&original, Default::default(), |r| {
            w.push(r).map_err(|_| "a writable file")
        })
        .unwrap();
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let old = without_index(&bytes);
        assert!(old.len() < bytes.len(), "{} has an index", path.display());
        let old_path = dir.path().join(format!(
            "old-{}",
            path.file_name().unwrap().to_string_lossy()
        ));
        std::fs::write(&old_path, &old).unwrap();
        let indexed = read_index(&path).unwrap();
        let scanned = read_index(&old_path).unwrap();
        assert!(indexed.from_frame && !scanned.from_frame);
        // Offsets differ by nothing: the index comes after every block.
        assert_eq!(indexed.blocks, scanned.blocks, "{}", path.display());
        assert_eq!(indexed.threads, scanned.threads, "{}", path.display());
        let summary = loaded(&path).summary;
        assert_eq!(
            indexed.records(),
            summary.events - summary.mallocs_of_live_ptr
        );
        // Both load whole the same, and stream the same.
        assert_eq!(loaded(&old_path).events, loaded(&path).events);
        let (a, _) = stream_all(&path);
        let (b, _) = stream_all(&old_path);
        assert_eq!(a, b, "{}", path.display());
        // Any record is reached through its block.
        let last = indexed.records() - 1;
        let k = indexed.block_of(last).unwrap();
        assert_eq!(k, indexed.blocks.len() - 1);
        assert_eq!(indexed.block_of(last + 1), None);
    }
}

/// A stream opened at a point taken between two blocks goes on exactly as the stream it was
/// taken from: the same events after it (slots included, which the free slots' order decides),
/// and the same counts, threads and peak at the end; so does one opened at the point packed
/// and unpacked (what a whole-trace scan keeps).
#[test]
fn a_stream_opened_at_a_point_goes_on_as_the_stream_it_was_taken_from() {
    use allocview_loaders::binary::StreamPoint;
    let spliced = spliced_trace();
    let (_dir, paths) = binary_traces();
    for path in paths.into_iter().chain([spliced.to_path_buf()]) {
        let (all, whole) = stream_all(&path);
        let blocks = whole.index().blocks.len();
        let points = if path == *spliced {
            assert_eq!(blocks, 6);
            (0..=blocks).collect()
        } else {
            vec![0, 1, blocks / 2, blocks]
        };
        for (after, packed) in points.into_iter().flat_map(|a| [(a, false), (a, true)]) {
            let mut s = BinaryEventStream::open(&path).unwrap();
            let mut batch = EventBatch::default();
            for _ in 0..after {
                assert!(s.next_events(&mut batch).unwrap());
            }
            let mut point: StreamPoint = s.point();
            if packed {
                let p = point.pack();
                assert_eq!(p.events(), point.events());
                point = p.unpack().unwrap();
            }
            assert_eq!(point.events(), s.summary().events);
            let mut resumed = BinaryEventStream::open_at(&path, &point).unwrap();
            let rest = rest_of(&mut resumed);
            let what = format!(
                "{} after {after} of {blocks} blocks{}",
                path.display(),
                if packed { ", packed" } else { "" }
            );
            let skip = point.events() as usize;
            assert_eq!(rest.len(), all.len() - skip, "{what}");
            for k in 0..rest.len() {
                assert_eq!(rest.row(k), all.row(skip + k), "{what}: event {}", skip + k);
            }
            assert_eq!(resumed.summary(), whole.summary(), "{what}");
            assert_eq!(resumed.thread_ids(), whole.thread_ids(), "{what}");
            assert_eq!(
                resumed.events_per_thread(),
                whole.events_per_thread(),
                "{what}"
            );
            assert_eq!(
                (resumed.peak_live_bytes(), resumed.peak_live_event()),
                (whole.peak_live_bytes(), whole.peak_live_event()),
                "{what}"
            );
        }
    }
}
