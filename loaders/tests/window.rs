//! Windows of real traces: the allocations live at the window's start are carried in, so live
//! bytes at every event of the window are the whole trace's, under every policy replayed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use allocview_loaders::window::{WindowError, window};
use allocview_loaders::{LoadOptions, Loaded, load, trace_view};
use allocview_sim::metrics::live_bytes;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry;
use allocview_sim::replay::{ReplayOptions, replay};
use allocview_sim::testing::live_bytes_after_each;
use allocview_sim::trace::EventKind;
use polars::prelude::*;

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces")
        .join(name)
}

fn events_of(name: &str) -> DataFrame {
    match load(&sample(name), &LoadOptions::default()).unwrap() {
        Loaded::MallocTrace(t) => t.events,
        other => panic!("{name}: not a malloc trace: {other:?}"),
    }
}

/// (address, size) of every allocation live just before event `at`.
fn live_set_before(events: &DataFrame, at: usize) -> BTreeMap<u64, u64> {
    let kind = events.column("kind").unwrap().u8().unwrap();
    let addr = events.column("address").unwrap().u64().unwrap();
    let size = events.column("size_bytes").unwrap().u64().unwrap();
    let mut live = BTreeMap::new();
    for i in 0..at {
        let (k, a, s) = (
            kind.get(i).unwrap(),
            addr.get(i).unwrap(),
            size.get(i).unwrap(),
        );
        if k == EventKind::Alloc as u8 {
            live.insert(a, s);
        } else if k == EventKind::Free as u8 {
            live.remove(&a);
        }
    }
    live
}

/// Windows at the start, in the middle, across the peak and at the end of each trace.
fn windows(n: usize) -> Vec<(usize, usize)> {
    vec![
        (0, n / 10),
        (n / 3, n / 3 + 2_000.min(n / 4)),
        (n / 4, 3 * n / 4),
        (n / 2, n),
        (n - 1, n),
    ]
}

#[test]
fn a_windows_live_bytes_are_the_whole_traces_at_every_event() {
    for name in [
        "find_usr_include.trace.gz",
        "perl_hash.avt",
        "python_json.avt",
    ] {
        let events = events_of(name);
        let full = trace_view(&events, Path::new(name)).unwrap();
        let full_live = live_bytes_after_each(&full);
        let n = full.len();
        for (start, end) in windows(n) {
            let (cut, info) = window(&events, start, end).unwrap();
            // The simulator's invariants hold: dense ids in allocation order, frees of live ids.
            let view = trace_view(&cut, Path::new(name)).unwrap();
            let k = info.carried_in as usize;
            assert_eq!(view.len(), k + end - start, "{name} {start}..{end}");
            let live = live_bytes_after_each(&view);
            let before = if start == 0 { 0 } else { full_live[start - 1] };
            assert_eq!(
                live.get(k.wrapping_sub(1)).copied().unwrap_or(0),
                before,
                "{name} {start}..{end}: live bytes at the window's start"
            );
            assert_eq!(
                &live[k..],
                &full_live[start..end],
                "{name} {start}..{end}: live bytes after each event of the window"
            );
            // The carried-in blocks are the very allocations live there (addresses and sizes).
            let carried = live_set_before(&cut, k);
            assert_eq!(carried, live_set_before(&events, start), "{name} {start}");
            // Their time is the window's start, so the window's clock starts there.
            let t = cut.column("t_ns").unwrap().i64().unwrap();
            let t0 = events.column("t_ns").unwrap().i64().unwrap().get(start);
            assert!((0..k).all(|i| t.get(i) == t0), "{name} {start}");
        }
    }
}

#[test]
fn policies_replaying_a_window_see_the_whole_traces_live_bytes() {
    let events = events_of("find_usr_include.trace.gz");
    let full = trace_view(&events, Path::new("full")).unwrap();
    let full_live = live_bytes_after_each(&full);
    let n = full.len();
    let (start, end) = (n / 3, n / 3 + 6_000);
    let (cut, info) = window(&events, start, end).unwrap();
    let view = trace_view(&cut, Path::new("window")).unwrap();
    let k = info.carried_in as usize;
    let opts = ReplayOptions {
        checkpoint_every: 512,
        ..ReplayOptions::default()
    };
    let config = PolicyConfig::default();
    for policy in ["first-fit", "best-fit", "bfc", "buddy", "glibc"] {
        let built = registry::build(policy, &config, &view).unwrap();
        let rep = replay(&view, built, &opts);
        assert_eq!(rep.summary.oom_count, 0, "{policy}");
        for j in (0..end - start).step_by(97).chain([end - start - 1]) {
            let (_, counters) = rep.state_at(&view, k + j).unwrap();
            assert_eq!(
                live_bytes(&counters),
                full_live[start + j],
                "{policy}: live bytes at event {}",
                start + j
            );
        }
        // The window's peak is the whole trace's peak over the window and its start.
        let expected = full_live[start - 1..end].iter().copied().max().unwrap();
        assert_eq!(rep.summary.peak_live_bytes, expected, "{policy}");
    }
}

#[test]
fn empty_and_out_of_range_windows_are_refused() {
    let events = events_of("python_json.avt");
    let n = events.height();
    for (start, end) in [(10, 10), (20, 10), (0, n + 1)] {
        let err = window(&events, start, end).unwrap_err();
        assert!(
            matches!(err, WindowError::OutOfRange { .. }),
            "{start}..{end}: {err}"
        );
        assert!(
            err.to_string().contains(&format!("{start}..{end}")),
            "{err}"
        );
    }
}
