//! Hand-made traces: the rules of the reader, each on the smallest trace that shows it.

use std::io::Write as _;

use super::*;
use crate::events::LoadOptions;

fn write(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn mem(ts: &str, tid: u32, dev: (i64, i64), bytes: i64, addr: Option<u64>, tr: u64) -> String {
    let addr = addr.map(|a| format!(", \"Addr\": {a}")).unwrap_or_default();
    format!(
        r#"{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": {tid}, "ts": {ts}, "args": {{"Device Type": {}, "Device Id": {}, "Bytes": {bytes}{addr}, "Total Allocated": 0, "Total Reserved": {tr}}}}}"#,
        dev.0, dev.1
    )
}

fn op(name: &str, ts: u32, dur: u32, tid: u32) -> String {
    format!(
        r#"{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": 1, "tid": {tid}, "ts": {ts}, "dur": {dur}, "args": {{"Input Dims": [[1, 2], []]}}}}"#
    )
}

fn trace(events: &[String]) -> String {
    format!(
        "{{\"schemaVersion\": 1, \"deviceProperties\": [], \"traceEvents\": [\n{}\n], \"traceName\": \"x\"}}",
        events.join(",\n")
    )
}

fn load(text: &str, opts: &LoadOptions) -> Result<MallocTrace, LoadError> {
    let f = write(text);
    assert!(is_kineto(text.as_bytes()));
    load_kineto(f.path(), opts)
}

fn sample() -> String {
    trace(&[
        op("aten::empty", 10, 3, 1),
        mem("12", 1, (1, 0), 512, Some(0x7000), 2 << 20),
        mem("13", 1, (0, -1), 8, Some(0x10), 0),
        mem("14.5", 1, (1, 0), 1024, Some(0x8000), 2 << 20),
        mem("20", 1, (1, 0), -512, Some(0x7000), 2 << 20),
        mem("21", 1, (0, -1), -8, Some(0x10), 0),
    ])
}

#[test]
fn the_gpu_with_the_most_events_is_read_paired_by_address_with_its_reserved_series() {
    let t = load(&sample(), &LoadOptions::default()).unwrap();
    assert_eq!(t.summary.mallocs, 2);
    assert_eq!(t.summary.frees, 1);
    let t_ns: Vec<i64> = t.events["t_ns"]
        .i64()
        .unwrap()
        .into_no_null_iter()
        .collect();
    assert_eq!(t_ns, [0, 2500, 8000]);
    assert_eq!(t.memory_series, RecordedSeries::AllocatorReserved);
    assert_eq!(t.memory.len(), 3);
    assert!(t.memory.iter().all(|m| m.resident_bytes == 2 << 20));
    let stacks = t.stacks.as_ref().unwrap();
    let ids: Vec<Option<u32>> = t.events["stack_id"].u32().unwrap().iter().collect();
    assert_eq!(
        stacks.site_frame(ids[0].unwrap()).unwrap().function,
        "aten::empty"
    );
    assert_eq!(ids[1], None);
    let w = t.summary.warnings().join("\n");
    assert!(w.contains("the 3 [memory] events of cuda:0"), "{w}");
    assert!(w.contains("--device cpu"), "{w}");
}

#[test]
fn device_flag_picks_another_stream_and_a_missing_one_is_named() {
    let cpu = LoadOptions {
        device: Some("cpu".parse().unwrap()),
        ..LoadOptions::default()
    };
    let t = load(&sample(), &cpu).unwrap();
    assert_eq!((t.summary.mallocs, t.summary.frees), (1, 1));
    assert!(t.memory.is_empty(), "the CPU reserves nothing");
    let hip = LoadOptions {
        device: Some("hip:0".parse().unwrap()),
        ..LoadOptions::default()
    };
    let e = load(&sample(), &hip).unwrap_err().to_string();
    assert!(
        e.contains("cuda:0 (3 events)") && e.contains("cpu (2 events)"),
        "{e}"
    );
    assert_eq!(
        "6:1".parse::<DeviceChoice>().unwrap(),
        DeviceChoice {
            device_type: 6,
            index: Some(1)
        }
    );
    assert!("gpu:x".parse::<DeviceChoice>().is_err());
}

#[test]
fn without_addresses_frees_pair_with_the_latest_live_allocation_of_their_size() {
    let text = trace(&[
        mem("1", 1, (1, 0), 256, None, 0),
        mem("2", 1, (1, 0), 256, None, 0),
        mem("3", 1, (1, 0), 64, None, 0),
        mem("4", 1, (1, 0), -256, None, 0),
        mem("5", 1, (1, 0), -128, None, 0),
    ]);
    let t = load(&text, &LoadOptions::default()).unwrap();
    let ids: Vec<Option<u32>> = t.events["alloc_id"].u32().unwrap().iter().collect();
    assert_eq!(ids, [Some(0), Some(1), Some(2), Some(1), None]);
    assert_eq!(t.summary.frees_unknown, 1);
    assert!(
        t.summary
            .warnings()
            .iter()
            .any(|w| w.contains("lifetimes are approximate"))
    );
}

#[test]
fn events_out_of_time_order_are_paired_in_time_order() {
    let text = trace(&[
        mem("30", 2, (6, 0), -100, Some(0x100), 0),
        mem("10", 1, (6, 0), 100, Some(0x100), 0),
    ]);
    let t = load(&text, &LoadOptions::default()).unwrap();
    assert_eq!((t.summary.mallocs, t.summary.frees), (1, 1));
    assert_eq!(t.summary.frees_unknown, 0);
}

#[test]
fn a_bad_event_is_named_strictly_and_skipped_and_counted_leniently() {
    let mut events = vec![
        mem("1", 1, (1, 0), 256, Some(0x100), 0),
        mem("2", 1, (1, 0), 256, Some(0x200), 0),
    ];
    events[1] = events[1].replace("\"Bytes\": 256", "\"Bytes\": \"lots\"");
    let text = trace(&events);
    let e = load(&text, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("trace event 1") && e.contains("Bytes"), "{e}");
    assert!(e.contains("byte ") && e.contains("--lenient"), "{e}");
    let lenient = LoadOptions {
        strictness: Strictness::Lenient,
        ..LoadOptions::default()
    };
    let t = load(&text, &lenient).unwrap();
    assert_eq!(t.summary.mallocs, 1);
    assert!(
        t.summary
            .warnings()
            .iter()
            .any(|w| w.contains("skipped 1 malformed trace events"))
    );
}

#[test]
fn a_cut_trace_names_its_offset_and_loads_what_came_before_leniently() {
    let text = sample();
    let cut = &text[..text.find("14.5").unwrap() + 2];
    let e = load(cut, &LoadOptions::default()).unwrap_err().to_string();
    assert!(
        e.contains("ends early") && e.contains(&format!("byte {}", cut.len())),
        "{e}"
    );
    let lenient = LoadOptions {
        strictness: Strictness::Lenient,
        ..LoadOptions::default()
    };
    let t = load(cut, &lenient).unwrap();
    assert_eq!(t.summary.mallocs, 1);
}

#[test]
fn detection_wants_a_profiler_trace() {
    assert!(!is_kineto(b"{\"traceEvents\": []}"));
    assert!(!is_kineto(b"[{\"ph\": \"X\"}]"));
    assert!(is_kineto(b"  {\"schemaVersion\": 1, \"traceEvents\": ["));
}

#[test]
fn no_memory_events_says_how_to_record_them() {
    let text = trace(&[op("aten::mm", 1, 2, 1)]);
    let e = load(&text, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("profile_memory=True"), "{e}");
}
