//! PyTorch memory snapshots: the four real ones (their counts from the data set's README), and
//! hand-made ones (`data/pytorch/make_fixtures.py`) whose figures are worked out by hand.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use allocview_loaders::pytorch::model::Action;
use allocview_loaders::pytorch::{PytorchSnapshot, load_snapshot};
use allocview_loaders::{InputKind, LoadOptions, detect, trace_view};
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::pytorch::{Fidelity, Pytorch};
use allocview_sim::policy::registry::build;
use allocview_sim::replay::{ReplayOptions, replay};
use allocview_sim::testing::check_layout_at;
use allocview_sim::trace::EventKind;

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces/pytorch")
        .join(name)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/pytorch")
        .join(name)
}

fn load(path: &Path) -> PytorchSnapshot {
    assert_eq!(
        detect(path).unwrap(),
        InputKind::PytorchSnapshot,
        "{path:?}"
    );
    load_snapshot(path, &LoadOptions::default()).unwrap()
}

fn entries(s: &PytorchSnapshot, a: Action) -> u64 {
    s.entries_by_action
        .iter()
        .find(|(x, _)| *x == a)
        .map_or(0, |&(_, n)| n)
}

fn kinds(s: &PytorchSnapshot) -> Vec<u8> {
    s.events
        .column("kind")
        .unwrap()
        .u8()
        .unwrap()
        .into_no_null_iter()
        .collect()
}

/// Replays the snapshot through `pytorch` from its rebuilt start state.
fn fidelity(s: &PytorchSnapshot, path: &Path) -> Fidelity {
    let view = trace_view(&s.events, path).unwrap();
    let config = PolicyConfig {
        pytorch: s.settings.policy.clone(),
        pytorch_script: Some(Arc::new(s.script.clone())),
        ..PolicyConfig::default()
    };
    let policy = build("pytorch", &config, &view).unwrap();
    let r = replay(&view, policy, &ReplayOptions::default());
    assert!(r.ooms.is_empty(), "{:?}", r.ooms.first());
    assert!(r.free_failures.is_empty(), "{:?}", r.free_failures.first());
    let p = r.final_state.as_any().downcast_ref::<Pytorch>().unwrap();
    p.fidelity().unwrap().clone()
}

/// `(file, segments, blocks, reserved bytes, alloc, free_requested, free_completed)` from the
/// data set's README.
const REAL: [(&str, usize, usize, u64, u64, u64, u64); 4] = [
    (
        "lm_train_step_a.pickle",
        999,
        1987,
        23_842_521_088,
        6488,
        6488,
        6488,
    ),
    (
        "lm_forward_a.pickle",
        1722,
        4158,
        47_234_154_496,
        4138,
        2405,
        2405,
    ),
    (
        "lm_train_step_b.pickle",
        96,
        550,
        4_238_344_192,
        2162,
        2162,
        2162,
    ),
    (
        "lm_train_step_windows.pickle",
        216,
        455,
        14_180_941_824,
        1721,
        1721,
        1721,
    ),
];

#[test]
fn real_snapshots_load_with_their_published_counts() {
    for (file, segs, blocks, reserved, alloc, freq, fcomp) in REAL {
        let path = sample(file);
        let s = load(&path);
        assert_eq!(s.raw_segments.len(), segs, "{file}");
        assert_eq!(s.segments.height(), segs, "{file}");
        assert_eq!(s.blocks.height(), blocks, "{file}");
        let total: u64 = s.raw_segments.iter().map(|g| g.total_bytes).sum();
        assert_eq!(total, reserved, "{file}");
        assert_eq!(entries(&s, Action::Alloc), alloc, "{file}");
        assert_eq!(entries(&s, Action::FreeRequested), freq, "{file}");
        assert_eq!(entries(&s, Action::FreeCompleted), fcomp, "{file}");
        assert_eq!(entries(&s, Action::SegmentAlloc), 0, "{file}");
        assert_eq!(s.protocol, 4);
        assert!(s.settings.present);
        assert_eq!(
            s.settings.policy.max_split_size_bytes, None,
            "{file}: -1 is unlimited"
        );
        // Two of the runs marked their optimizer phases (4 and 2 annotations).
        let phases = match file {
            "lm_train_step_a.pickle" => 4,
            "lm_train_step_b.pickle" => 2,
            _ => 0,
        };
        assert_eq!(s.raw_annotations.len(), phases, "{file}");
        assert_eq!(s.annotations.height(), phases, "{file}");
        assert!(s.warnings.is_empty(), "{file}: {:?}", s.warnings);
        // Events: carried-in allocations, then one row per alloc/free entry.
        let k = kinds(&s);
        assert_eq!(
            k.len() as u64,
            u64::from(s.carried_in) + alloc + freq + fcomp,
            "{file}"
        );
        let count = |kind: EventKind| k.iter().filter(|&&c| c == kind.code()).count() as u64;
        assert_eq!(count(EventKind::Alloc), u64::from(s.carried_in) + alloc);
        assert_eq!(
            count(EventKind::Free),
            fcomp,
            "{file}: every free_completed is matched"
        );
        assert_eq!(count(EventKind::FreeRequested), freq);
        assert_eq!(count(EventKind::FreeUnknown), 0);
        // The events are a valid trace for the simulator.
        let view = trace_view(&s.events, &path).unwrap();
        assert_eq!(view.num_allocs, s.carried_in + alloc as u32);
        // Frames: shared lists interned once, far fewer stacks than entries.
        assert!(s.stacks.num_stacks() > 0);
        assert!((s.stacks.num_stacks() as u64) < alloc, "{file}");
        // Traced events without frames: the Windows run recorded frames for 1,421 of its
        // 5,163 entries (counted with Python's pickle); the others for all.
        let frameless_entries = if file == "lm_train_step_windows.pickle" {
            3742
        } else {
            0
        };
        let stack_nulls = s.events.column("stack_id").unwrap().null_count();
        let carried_nulls = (0..s.carried_in as usize)
            .filter(|&i| {
                s.events
                    .column("stack_id")
                    .unwrap()
                    .u32()
                    .unwrap()
                    .get(i)
                    .is_none()
            })
            .count();
        assert_eq!(stack_nulls - carried_nulls, frameless_entries, "{file}");
    }
}

#[test]
fn real_snapshots_replay_address_for_address() {
    for (file, ..) in REAL {
        let path = sample(file);
        let s = load(&path);
        let f = fidelity(&s, &path);
        let traced = entries(&s, Action::Alloc);
        assert_eq!(f.checked, traced, "{file}");
        assert_eq!(
            f.address_matches, traced,
            "{file}: first divergence {:?}",
            f.first_divergence
        );
        assert_eq!(f.divergences, 0, "{file}");
        assert!(f.first_divergence.is_none());
        // No segment_alloc in these traces, and the policy needed none.
        assert_eq!(f.segment_allocs_checked, 0, "{file}");
    }
}

#[test]
fn a_ring_buffer_trace_is_rebuilt_from_its_end() {
    for name in ["ring_buffer.pickle", "ring_buffer_p2.pickle"] {
        let path = fixture(name);
        let s = load(&path);
        // A (final, never allocated in the trace) and C (freed, never allocated) were live at
        // the start, in address order.
        assert_eq!(s.carried_in, 2, "{name}");
        let addr: Vec<u64> = s
            .events
            .column("address")
            .unwrap()
            .u64()
            .unwrap()
            .into_no_null_iter()
            .collect();
        assert_eq!(&addr[..2], &[0x1_0000_0000, 0x1_0000_0400]);
        let k = kinds(&s);
        let code = |k: EventKind| k.code();
        assert_eq!(
            k,
            [
                code(EventKind::Alloc),
                code(EventKind::Alloc),
                code(EventKind::FreeRequested),
                code(EventKind::Free),
                code(EventKind::Alloc),
                code(EventKind::Alloc),
                code(EventKind::FreeRequested),
                code(EventKind::Free),
            ],
            "{name}"
        );
        let rounded: Vec<u64> = s
            .events
            .column("rounded_bytes")
            .unwrap()
            .u64()
            .unwrap()
            .into_no_null_iter()
            .collect();
        assert_eq!(rounded, [512, 1024, 1024, 1024, 512, 2_000_384, 512, 512]);
        // The start had S1 and the segment freed at the end; not the one allocated in it.
        assert_eq!(s.start_segments, 2);
        assert_eq!(s.start_reserved_bytes, 4 << 20);
        assert_eq!(s.peaks.reserved_bytes, 24 << 20);
        assert_eq!(s.peaks.allocated_bytes, 512 + 512 + 2_000_384);
        assert_eq!(s.peaks.requested_bytes, 100 + 300 + 2_000_000);
        // Segment events sit between the rows they happened between.
        let before: Vec<u32> = s
            .segment_events
            .column("before_event")
            .unwrap()
            .u32()
            .unwrap()
            .into_no_null_iter()
            .collect();
        assert_eq!(before, [5, 8]);
        // Times from the first entry; phases on the same clock.
        let t: Vec<i64> = s
            .events
            .column("t_ns")
            .unwrap()
            .i64()
            .unwrap()
            .into_no_null_iter()
            .collect();
        assert_eq!(t, [0, 0, 0, 1000, 2000, 3000, 4000, 5000]);
        assert_eq!(s.raw_annotations.len(), 2);
        let at: Vec<i64> = s
            .annotations
            .column("t_ns")
            .unwrap()
            .i64()
            .unwrap()
            .into_no_null_iter()
            .collect();
        assert_eq!(at, [1000, 5000]);
        // The unknown action is counted, not lost; the unknown setting kept as written.
        assert!(
            s.warnings
                .iter()
                .any(|w| w.contains("1 trace entries with unknown action \"some_future_action\"")),
            "{:?}",
            s.warnings
        );
        assert!(
            s.settings
                .raw
                .iter()
                .any(|(k, v)| k == "a_setting_from_the_future" && v == "True")
        );
        // The site of the 2,000,000-byte allocation is the program's own frame.
        let stack = s
            .events
            .column("stack_id")
            .unwrap()
            .u32()
            .unwrap()
            .get(5)
            .unwrap();
        assert_eq!(s.stacks.site_frame(stack).unwrap().function, "forward");
        // Replayed through `pytorch`: both placements and the new segment as recorded.
        let f = fidelity(&s, &path);
        assert_eq!((f.checked, f.address_matches, f.divergences), (2, 2, 0));
        assert_eq!((f.segment_allocs_checked, f.segment_alloc_matches), (1, 1));
    }
}

#[test]
fn a_divergence_is_counted_and_the_replay_continues_from_the_recorded_place() {
    let path = fixture("ring_buffer_diverging.pickle");
    let s = load(&path);
    let f = fidelity(&s, &path);
    assert_eq!(f.checked, 2);
    assert_eq!(f.address_matches, 1, "{f:?}");
    assert_eq!(f.divergences, 1);
    let d = f.first_divergence.unwrap();
    assert_eq!(d.alloc_id, 2);
    assert_eq!(d.recorded_addr, 0x1_0000_0600);
    assert_eq!(d.policy_addr, Some(0x1_0000_0200));
    // The large allocation after it is still checked and matches.
    assert_eq!((f.segment_allocs_checked, f.segment_alloc_matches), (1, 1));
}

#[test]
fn older_formats_load_and_say_what_they_lack() {
    let path = fixture("legacy_1_13.pickle");
    let s = load(&path);
    assert_eq!(s.raw_segments.len(), 1);
    let b = &s.raw_blocks[s.raw_segments[0].blocks.clone()];
    assert_eq!(b[0].address, 0x70_0000_0000);
    assert_eq!(b[0].requested_bytes, 1000, "from history");
    assert_eq!(b[1].address, 0x70_0000_0400, "running sum of block sizes");
    assert_eq!(s.stacks.frames_of(b[0].stack_id).count(), 1);
    assert!(s.notes.iter().any(|n| n.contains("1.13")), "{:?}", s.notes);
    // No trace: the live block is carried in, and that is all.
    assert_eq!(s.carried_in, 1);
    assert_eq!(s.events.height(), 1);

    let path = fixture("v2_0.pickle");
    let s = load(&path);
    assert_eq!(s.protocol, 3);
    for what in [
        "time_us",
        "allocator_settings",
        "external_annotations",
        "requested_size",
    ] {
        assert!(
            s.notes.iter().any(|n| n.contains(what)),
            "{what}: {:?}",
            s.notes
        );
    }
    assert_eq!(s.carried_in, 0);
    assert_eq!(s.events.height(), 4);
    // Trace order stands in for time.
    let t: Vec<i64> = s
        .events
        .column("t_ns")
        .unwrap()
        .i64()
        .unwrap()
        .into_no_null_iter()
        .collect();
    assert_eq!(t, [1000, 2000, 3000, 4000]);
    let f = fidelity(&s, &path);
    assert_eq!((f.checked, f.address_matches), (2, 2), "{f:?}");
    assert_eq!((f.segment_allocs_checked, f.segment_alloc_matches), (1, 1));
}

#[test]
fn truncated_or_foreign_pickles_are_clear_errors() {
    let bytes = std::fs::read(fixture("ring_buffer.pickle")).unwrap();
    let dir = std::env::temp_dir().join(format!("allocview-pt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for cut in [20, 100, 500, 1000, bytes.len() - 1] {
        let p = dir.join(format!("cut{cut}.pickle"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let err = load_snapshot(&p, &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("offset"), "cut at {cut}: {err}");
        assert!(err.contains(&*p.to_string_lossy()), "{err}");
    }
    // A pickle of something else: said plainly.
    let p = dir.join("other.pickle");
    std::fs::write(
        &p,
        b"\x80\x04\x95\n\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s.",
    )
    .unwrap();
    let err = load_snapshot(&p, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a PyTorch memory snapshot"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The explorer draws a snapshot's heap from the replay's layout index; on the real snapshots
/// and the fixtures (segment events among them) it gives the policy's own blocks and counters.
#[test]
fn layout_index_gives_the_replayed_blocks() {
    let mut paths: Vec<PathBuf> = REAL.iter().map(|r| sample(r.0)).collect();
    for entry in std::fs::read_dir(fixture("")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "pickle") && is_snapshot_fixture(&path) {
            paths.push(path);
        }
    }
    assert!(paths.len() > REAL.len(), "fixtures found");
    for path in paths {
        let s = load(&path);
        let view = trace_view(&s.events, &path).unwrap();
        let config = PolicyConfig {
            pytorch: s.settings.policy.clone(),
            pytorch_script: Some(Arc::new(s.script.clone())),
            ..PolicyConfig::default()
        };
        let policy = build("pytorch", &config, &view).unwrap();
        let opts = ReplayOptions {
            layout_index: true,
            ..ReplayOptions::default()
        };
        let r = replay(&view, policy, &opts);
        assert!(r.has_layout_index(), "{path:?}");
        let n = view.len();
        let step = (n / 97).max(1);
        for event in (0..n).step_by(step).chain([n - 1]) {
            check_layout_at(&r, &view, event).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        }
    }
}

/// Fixtures that are snapshots (some are deliberately broken pickles).
fn is_snapshot_fixture(path: &Path) -> bool {
    detect(path).is_ok_and(|k| k == InputKind::PytorchSnapshot)
        && load_snapshot(path, &LoadOptions::default()).is_ok_and(|s| s.events.height() > 0)
}

/// An `oom` entry keeps its `device_free` and has no address; entries keep their streams, a
/// large stream handle included.
#[test]
fn oom_entries_and_streams_survive_the_compact_entries() {
    let s = load(&fixture("oom_streams.pickle"));
    let seg = &s.segment_events;
    let col = |name: &str| seg.column(name).unwrap().clone();
    let actions = col("action");
    let actions = actions.str().unwrap();
    let oom = (0..seg.height())
        .position(|i| actions.get(i) == Some("oom"))
        .unwrap();
    assert_eq!(col("address").u64().unwrap().get(oom), Some(0));
    assert_eq!(
        col("device_free_bytes").u64().unwrap().get(oom),
        Some(123_456_789)
    );
    assert_eq!(col("size_bytes").u64().unwrap().get(oom), Some(8 << 30));
    assert_eq!(
        col("stream").u64().unwrap().get(oom),
        Some(0x55D2_C3A4_B5C0)
    );
    let kinds = kinds(&s);
    assert_eq!(
        kinds.len(),
        4,
        "two allocs, a free request and its completion"
    );
    let streams: Vec<u64> = s
        .threads
        .column("tid")
        .unwrap()
        .u64()
        .unwrap()
        .into_no_null_iter()
        .collect();
    assert_eq!(streams, vec![0x55D2_C3A4_B5C0, 0]);
}

/// Entries that cannot be read are skipped, and every one is counted, not only those described.
#[test]
fn every_skipped_entry_is_counted() {
    let s = load(&fixture("many_bad.pickle"));
    assert_eq!(kinds(&s).len(), 4, "the good entries load");
    let described = s
        .warnings
        .iter()
        .filter(|w| w.contains("no `addr`"))
        .count();
    assert_eq!(described, 20, "{:?}", s.warnings);
    assert!(
        s.warnings
            .iter()
            .any(|w| w == "25 skipped items in all; the first 20 are listed"),
        "{:?}",
        s.warnings
    );
}

/// Found by the pickle fuzz target (issue 20): a settings value that holds itself through the
/// memo (`l = []; l.append(l)`) overflowed the stack when the settings were rendered for the
/// report. It renders to a bounded depth now.
#[test]
fn a_self_referential_settings_value_renders_to_a_bounded_depth() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/regressions/pickle/self_referential_settings.pickle");
    let snap = load_snapshot(&path, &LoadOptions::default()).unwrap();
    let (key, text) = snap.settings.raw.first().unwrap();
    assert_eq!(key, "x");
    assert_eq!(text, "[[[[[...]]]]]");
}

/// A hostile snapshot whose expandable segments are mapped and unmapped at the top of the
/// address space: the start state is rebuilt (the ranges end at the address space's end) or
/// refused, never a panic from an address sum that overflows.
#[test]
fn segment_events_at_the_end_of_the_address_space_do_not_overflow() {
    use allocview_loaders::pytorch::from_raw;
    use allocview_loaders::pytorch::model::{Action, RawEntry, RawSnapshot};
    let entry = |action, addr: u64, size_bytes| RawEntry {
        action,
        stream_index: 0,
        stack_id: 0,
        addr,
        size_bytes,
        time_us: 0,
    };
    let top = u64::MAX - (1 << 20);
    let trace = vec![
        entry(Action::SegmentUnmap, top, 4 << 20),
        entry(Action::SegmentUnmap, top - (4 << 20), 4 << 20),
        entry(Action::SegmentMap, top, 4 << 20),
        entry(Action::SegmentMap, u64::MAX, u64::MAX),
    ];
    let raw = RawSnapshot {
        device_traces: vec![trace],
        streams: vec![0],
        ..RawSnapshot::default()
    };
    // Either outcome is fine; what matters is that it returns.
    let _ = from_raw(raw, 4);
}
