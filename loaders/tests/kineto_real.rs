//! PyTorch profiler traces from real runs (`tests/data/kineto/README.md` says where each comes
//! from and how its figures were counted): per device, the events, the allocations and frees,
//! and the live bytes against the file's own `Total Allocated`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

use allocview_loaders::analysis::site_stats::EventSites;
use allocview_loaders::kineto::DeviceChoice;
use allocview_loaders::sites::OPERATOR_FRAMES_MODULE;
use allocview_loaders::{
    InputKind, LoadOptions, Loaded, MallocTrace, RecordedSeries, Strictness, detect, load,
};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/kineto")
        .join(name)
}

fn load_device(path: &Path, device: Option<&str>) -> MallocTrace {
    assert_eq!(detect(path).unwrap(), InputKind::KinetoTrace);
    let opts = LoadOptions {
        device: device.map(|d| d.parse::<DeviceChoice>().unwrap()),
        ..LoadOptions::default()
    };
    match load(path, &opts).unwrap() {
        Loaded::MallocTrace(t) => t,
        _ => panic!("a profiler trace loads as a malloc trace"),
    }
}

/// Live bytes after each event, from the event table alone.
fn live_peak_and_final(t: &MallocTrace) -> (u64, u64) {
    let view = allocview_loaders::trace_view(&t.events, Path::new("x")).unwrap();
    let mut live = 0i128;
    let mut peak = 0i128;
    for i in 0..view.len() {
        match view.kind[i] {
            0 => live += i128::from(view.size_bytes[i]),
            1 => live -= i128::from(view.size_bytes[i]),
            _ => {}
        }
        peak = peak.max(live);
    }
    (u64::try_from(peak).unwrap(), u64::try_from(live).unwrap())
}

/// Events whose site is an operator, and how many of them are in `op`.
fn operator_sites(t: &MallocTrace, op: &str) -> (usize, usize) {
    let sites = EventSites::from_events(&t.events, t.stacks.as_ref());
    let mut inside = 0;
    let mut in_op = 0;
    for &s in &sites.event_stack {
        if let Some(f) = sites.stacks.site_frame(s)
            && f.module == OPERATOR_FRAMES_MODULE
        {
            inside += 1;
            in_op += usize::from(f.function == op);
        }
    }
    (inside, in_op)
}

fn warnings(t: &MallocTrace) -> String {
    t.summary.warnings().join("\n")
}

#[test]
fn mi300_hip_stream_is_the_default_and_its_live_bytes_meet_total_allocated() {
    let t = load_device(
        &data("tracelens_mi300_normalization_layer_test.json.gz"),
        None,
    );
    assert_eq!(t.summary.events, 415);
    assert_eq!((t.summary.mallocs, t.summary.frees), (213, 202));
    assert_eq!(t.summary.frees_unknown, 0);
    let (peak, last) = live_peak_and_final(&t);
    // The device held 665,600 bytes before the first event: the file's totals count them.
    assert_eq!(peak + 665_600, 8_154_624);
    assert_eq!(last + 665_600, 1_852_416);
    let w = warnings(&t);
    assert!(
        w.contains("665600 bytes were allocated on hip:0 before"),
        "{w}"
    );
    assert!(w.contains("415 [memory] events of hip:0"), "{w}");
    assert_eq!(t.memory_series, RecordedSeries::AllocatorReserved);
    assert_eq!(t.memory.len(), 415);
    assert_eq!(
        t.memory.iter().map(|m| m.resident_bytes).max(),
        Some(8_388_608)
    );
    assert_eq!(operator_sites(&t, "aten::empty"), (408, 183));
}

#[test]
fn mi300_cpu_stream_is_read_on_request() {
    let t = load_device(
        &data("tracelens_mi300_normalization_layer_test.json.gz"),
        Some("cpu"),
    );
    assert_eq!(
        (t.summary.events, t.summary.mallocs, t.summary.frees),
        (60, 30, 30)
    );
    assert_eq!(live_peak_and_final(&t), (32, 0));
    assert!(
        t.memory.is_empty(),
        "Total Reserved is 0 throughout on the CPU"
    );
}

#[test]
fn cpu_only_trace_peaks_at_its_total_allocated_in_its_operators() {
    let t = load_device(&data("dtu_mlops_resnet18_cpu_trace.json.gz"), None);
    assert_eq!(
        (t.summary.events, t.summary.mallocs, t.summary.frees),
        (496, 248, 248)
    );
    assert_eq!(live_peak_and_final(&t), (117_349_888, 0));
    assert!(t.memory.is_empty());
    assert_eq!(operator_sites(&t, "aten::empty"), (373, 160));
    let stacks = t.stacks.as_ref().unwrap();
    let frames: Vec<&str> = (0..u32::try_from(stacks.num_stacks()).unwrap())
        .flat_map(|s| stacks.frames_of(s).map(|f| f.function.as_str()))
        .collect();
    assert!(frames.contains(&"aten::conv2d"));
}

#[test]
fn old_schema_without_addresses_pairs_by_size_and_says_so() {
    let t = load_device(
        &data("kineto_tbplugin_resnet50_first200ms.pt.trace.json.gz"),
        None,
    );
    assert_eq!(t.summary.events, 1370);
    assert_eq!((t.summary.mallocs, t.summary.frees), (685, 685));
    assert_eq!(t.summary.frees_unknown, 0);
    // Paired by size, every free ends an allocation of its own size: the live bytes are the
    // running sum of the file's Bytes.
    assert_eq!(live_peak_and_final(&t), (2_791_636_480, 0));
    assert!(warnings(&t).contains("lifetimes are approximate"));
    assert!(t.memory.is_empty(), "the 2021 schema has no totals");
    assert_eq!(operator_sites(&t, "aten::empty"), (821, 449));
    let cpu = load_device(
        &data("kineto_tbplugin_resnet50_first200ms.pt.trace.json.gz"),
        Some("cpu"),
    );
    assert_eq!((cpu.summary.mallocs, cpu.summary.frees), (444, 431));
}

/// A plain copy of `name`, edited.
fn damaged(name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> tempfile::NamedTempFile {
    use std::io::{Read as _, Write as _};
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(data(name)).unwrap())
        .read_to_end(&mut text)
        .unwrap();
    edit(&mut text);
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&text).unwrap();
    f
}

#[test]
fn a_truncated_trace_names_file_and_offset_and_loads_leniently() {
    let f = damaged("tracelens_mi300_normalization_layer_test.json.gz", |t| {
        // Among the [memory] events (bytes 194,778 to about 300,000).
        t.truncate(250_000);
    });
    let half = std::fs::metadata(f.path()).unwrap().len();
    let e = load(f.path(), &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains(&f.path().display().to_string()), "{e}");
    assert!(e.contains(&format!("at byte {half} ")), "{e}");
    assert!(e.contains("ends early"), "{e}");
    let lenient = LoadOptions {
        strictness: Strictness::Lenient,
        ..LoadOptions::default()
    };
    let Loaded::MallocTrace(t) = load(f.path(), &lenient).unwrap() else {
        panic!("a malloc trace");
    };
    assert!(t.summary.events > 0 && t.summary.events < 415);
    assert!(warnings(&t).contains("ends early"));
}

#[test]
fn a_corrupted_trace_names_file_and_offset() {
    let mut at = 0;
    let f = damaged("dtu_mlops_resnet18_cpu_trace.json.gz", |t| {
        at = t.windows(8).position(|w| w == b"\"Bytes\":").unwrap() + 12;
        t[at] = b'#';
    });
    let e = load(f.path(), &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains(&f.path().display().to_string()), "{e}");
    assert!(e.contains("malformed"), "{e}");
    assert!(e.contains(&format!("at byte {}", at + 1)), "{e}");
}

#[test]
fn a_bad_value_is_skipped_and_counted_leniently() {
    let f = damaged("dtu_mlops_resnet18_cpu_trace.json.gz", |t| {
        let at = t.windows(8).position(|w| w == b"\"Bytes\":").unwrap() + 8;
        t.splice(at..at, *b" \"x\", \"ignored\":");
    });
    let e = load(f.path(), &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("Bytes") && e.contains("--lenient"), "{e}");
    let lenient = LoadOptions {
        strictness: Strictness::Lenient,
        ..LoadOptions::default()
    };
    let Loaded::MallocTrace(t) = load(f.path(), &lenient).unwrap() else {
        panic!("a malloc trace");
    };
    assert_eq!(t.summary.events, 495);
    assert!(warnings(&t).contains("skipped 1 malformed trace events"));
}

/// The full traces of `../shared/data/interop/kineto` (not in the repository): run with
/// `--run-ignored all` where they are. Figures from that folder's README.
#[test]
#[ignore = "needs the interop traces outside the repository"]
fn full_interop_traces() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/interop/kineto");
    let h100 = load_device(&dir.join("tracelens_h100_owlv2_large.json.gz"), None);
    assert_eq!(h100.summary.events, 12_270);
    let (peak, last) = live_peak_and_final(&h100);
    assert_eq!(peak + 917_445_120, 2_707_847_680);
    assert_eq!(last + 917_445_120, 917_445_120);
    assert_eq!(
        h100.memory.iter().map(|m| m.resident_bytes).max(),
        Some(3_600_809_984)
    );
    let mi300 = load_device(&dir.join("tracelens_mi300_owlv2_large.json.gz"), None);
    assert_eq!(mi300.summary.events, 13_060);
    let (peak, _) = live_peak_and_final(&mi300);
    assert_eq!(peak + 1_018_108_416, 2_808_510_976);
    assert_eq!(
        mi300.memory.iter().map(|m| m.resident_bytes).max(),
        Some(2_973_761_536)
    );
    let old = load_device(
        &dir.join("kineto_tbplugin_resnet50_nw0_worker0.1623143089861.pt.trace.json.gz"),
        None,
    );
    assert_eq!(
        (old.summary.events, old.summary.mallocs, old.summary.frees),
        (8220, 4110, 4110)
    );
}
