//! The explorers' slimmed event table ([`super::slim_events`]) gives what the full one does.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use allocview_loaders::analysis::site_stats::{EventSites, SiteKind};
use allocview_loaders::sites::NO_STACK;
use allocview_loaders::{LoadOptions, Loaded};
use polars::prelude::*;

use super::TraceData;

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces")
        .join(name)
}

/// The loaded file as the explorers hold it, and its full event table with its stacks.
fn both(
    path: &Path,
) -> (
    TraceData,
    DataFrame,
    Option<allocview_loaders::sites::StackTable>,
) {
    let window = crate::session::WindowArgs::default();
    let data = TraceData::load(path, false, &window, Arc::new(AtomicU64::new(0))).unwrap();
    let (events, stacks) = match allocview_loaders::load(path, &LoadOptions::default()).unwrap() {
        Loaded::MallocTrace(t) => (t.events, t.stacks),
        Loaded::PytorchSnapshot(s) => (s.events.clone(), Some(s.stacks.clone())),
        _ => panic!("{}: not a trace", path.display()),
    };
    (data, events, stacks)
}

#[test]
fn addresses_and_sites_of_a_snapshot_are_those_of_the_full_table() {
    let path = sample("pytorch/lm_train_step_b.pickle");
    let (data, full, stacks) = both(&path);
    for dropped in ["address", "stack_id"] {
        assert!(
            data.events.column(dropped).is_err(),
            "{dropped} still in the table"
        );
    }
    let addresses = full.column("address").unwrap().u64().unwrap();
    assert_eq!(data.len(), full.height());
    for (i, a) in addresses.iter().enumerate() {
        assert_eq!(data.address_at(i), a.unwrap(), "event {i}");
    }

    let want = EventSites::from_events(&full, stacks.as_ref());
    let got = data.sites().unwrap();
    assert_eq!(got.kind, SiteKind::Stacks);
    assert_eq!(got.event_stack, want.event_stack);
    assert!(got.event_stack.iter().any(|&s| s != NO_STACK));
    assert!(got.event_stack.contains(&NO_STACK));

    // An allocation's frames come from its birth's stack id.
    let view = data.view();
    let stack_ids = full.column("stack_id").unwrap().u32().unwrap();
    let mut with_frames = 0;
    for (i, (&kind, &id)) in view.kind.iter().zip(view.alloc_id).enumerate() {
        if kind != allocview_sim::trace::EventKind::Alloc.code() {
            continue;
        }
        let stack = stack_ids.get(i).unwrap_or(NO_STACK);
        let want = stacks
            .as_ref()
            .unwrap()
            .site_lines(stack, super::MAX_FRAME_LINES, true);
        let got = data.frames_of_alloc(id);
        assert_eq!(got, want, "allocation {id}");
        with_frames += usize::from(!got.is_empty());
    }
    assert!(with_frames > 100, "{with_frames}");
}

#[test]
fn a_recorded_trace_keeps_its_addresses() {
    let path = sample("python_json.avt");
    let (data, full, _) = both(&path);
    let addresses = full.column("address").unwrap().u64().unwrap();
    assert!(data.events.column("address").is_err());
    for dropped in ["size_class", "call"] {
        assert!(
            data.events.column(dropped).is_err(),
            "{dropped} still in the table"
        );
    }
    for (i, a) in addresses.iter().enumerate() {
        assert_eq!(data.address_at(i), a.unwrap(), "event {i}");
    }
}

#[test]
fn an_explorer_opens_the_device_asked_for_of_a_profiler_trace() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../loaders/tests/data/kineto/tracelens_mi300_normalization_layer_test.json.gz");
    let window = crate::session::WindowArgs::default();
    let open = |device: Option<&str>| {
        let opening = super::Opening {
            device: device.map(|d| d.parse().unwrap()),
            ..super::Opening::default()
        };
        TraceData::load_with(&path, &opening, &window, Arc::new(AtomicU64::new(0)))
            .unwrap()
            .len()
    };
    // The file's HIP device holds 415 memory events and its CPU 60 (counted with Python's
    // json in loaders/tests/data/kineto/README.md).
    assert_eq!(open(None), 415);
    assert_eq!(open(Some("cpu")), 60);
}
