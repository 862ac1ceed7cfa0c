//! Memory logs: the real MobileNetV2 logs into the malloc-trace event schema. Expected figures
//! are the logs' own (MEMINFO lines, bfc_allocator lines) or counted with grep.

// Test helpers may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use allocview_loaders::tf::memlog::{
    MemlogOptions, RecordKind, TfMemoryLog, load_memory_log, load_memory_log_with,
};
use allocview_loaders::{LoadOptions, malloc_trace::load_malloc_trace, trace_view};
use allocview_sim::trace::EventKind;
use polars::prelude::*;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tf")
        .join(name)
}

fn load(name: &str) -> TfMemoryLog {
    load_memory_log(&data(name)).unwrap()
}

fn kinds(log: &TfMemoryLog) -> [usize; 5] {
    let mut k = [0; 5];
    for r in &log.records {
        k[r.kind.code() as usize] += 1;
    }
    k
}

#[test]
fn train_log_counts_and_pairing() {
    let log = load("mobilenetv2_train_memlog.txt.gz");
    assert_eq!(log.allocator, "bfc_cpu_allocator_for_gpu");
    assert_eq!(
        log.bfc_allocators,
        vec!["bfc_cpu_allocator_for_gpu".to_string()]
    );
    let s = &log.summary;
    // grep -c of each message name.
    assert_eq!(s.tensor_allocations, 32_922);
    assert_eq!(s.tensor_deallocations, 33_990);
    assert_eq!(s.raw_allocations, 6);
    assert_eq!(s.raw_deallocations, 6);
    assert_eq!(s.tensor_outputs, 12_451);
    // Empty tensors carry no allocation description.
    assert_eq!(s.tensors_without_buffer, 316);
    assert_eq!(s.unreadable_records, 0);
    // 32,922 - 316 + 6 allocations; every deallocation is an event.
    let [alloc, free, _, unknown, failed] = kinds(&log);
    assert_eq!(alloc, 32_612);
    assert_eq!(free + unknown, 33_996);
    // The 1,384 ids the log never shows allocated: 687 variables and 697 temporaries.
    assert_eq!(unknown, 1_384);
    assert_eq!(failed, 0);
    assert_eq!(log.events.height(), 66_608);
    assert_eq!(log.threads.height(), 3);
    assert!(s.timestamps_non_monotonic > 0);
    // The other allocator only appears in tensor outputs.
    assert!(
        log.allocator_counts
            .iter()
            .any(|(n, c)| n == "HostScalarTensorBuffer" && *c == 0)
    );
    // TF's peak and final, as printed by the workload.
    let last = log.meminfo.last().unwrap();
    assert_eq!(last.tag, "after_train_step_2");
    assert_eq!(
        (last.current_bytes, last.peak_bytes),
        (32_818_688, 1_191_003_136)
    );
    // Each MEMINFO is printed twice (stdout and stderr): kept once.
    assert_eq!(log.meminfo.len(), 4);
}

#[test]
fn train_log_regions_follow_the_extending_lines() {
    let log = load("mobilenetv2_train_memlog.txt.gz");
    let sizes: Vec<u64> = log.regions.iter().map(|r| r.size_bytes).collect();
    assert_eq!(sizes, (21..=30).map(|b| 1u64 << b).collect::<Vec<_>>());
    for r in &log.regions {
        assert!(r.extend_by.unwrap().contains(r.size_bytes), "{r:?}");
        assert_eq!(r.allocator.as_deref(), Some("bfc_cpu_allocator_for_gpu"));
    }
    assert_eq!(log.regions[0].base, 0x7f3b_85c3_c040);
    assert_eq!(log.regions[9].base, 0x7f3a_eea6_9040);
}

#[test]
fn events_have_the_malloc_trace_schema() {
    let log = load("mobilenetv2_train_memlog.txt.gz");
    let malloc = load_malloc_trace(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/xz_T2_8KiB_blocks.trace.gz"),
        &LoadOptions::default(),
    )
    .unwrap();
    for name in [
        "t_ns",
        "thread",
        "kind",
        "size_bytes",
        "address",
        "alloc_id",
        "size_class",
    ] {
        assert_eq!(
            log.events.column(name).unwrap().dtype(),
            malloc.events.column(name).unwrap().dtype(),
            "{name}"
        );
    }
    let view = trace_view(&log.events, Path::new("train")).unwrap();
    assert_eq!(view.num_allocs, 32_612);
    for (name, dtype) in [
        ("record", DataType::UInt8),
        ("line", DataType::UInt64),
        ("allocator", DataType::String),
        ("step", DataType::Int64),
        ("kernel", DataType::String),
        ("requested_bytes", DataType::UInt64),
        ("allocated_bytes", DataType::UInt64),
        ("tf_alloc_id", DataType::Int64),
    ] {
        assert_eq!(log.events.column(name).unwrap().dtype(), &dtype, "{name}");
    }
    // The first event: tensor allocation 1 at line 34 (grep -n), 8 bytes in a 256-byte chunk.
    let r = &log.records[0];
    assert_eq!(r.record, RecordKind::TensorAllocation);
    assert_eq!(
        (r.line, r.tf_alloc_id, r.requested_bytes, r.allocated_bytes),
        (34, 1, 8, Some(256))
    );
    assert_eq!(r.ptr, 139_893_623_996_480);
    assert_eq!(r.step, Some(-6));
    assert_eq!(r.kernel.as_deref(), Some("Unknown"));
    // Its free carries its size and pointer.
    let free = log
        .records
        .iter()
        .find(|x| x.kind == EventKind::Free && x.alloc_id == 0)
        .unwrap();
    assert_eq!((free.ptr, free.requested_bytes), (r.ptr, 8));
    // Raw allocations carry the requested bytes only.
    let raw = log
        .records
        .iter()
        .find(|x| x.record == RecordKind::RawAllocation)
        .unwrap();
    assert_eq!((raw.tf_alloc_id, raw.requested_bytes), (4824, 9_633_792));
    assert_eq!(raw.allocated_bytes, None);
    assert_eq!(raw.kernel.as_deref(), Some("TF_NewTensor"));
}

#[test]
fn oom_log_yields_the_trace_and_the_dump() {
    let log = load("mobilenetv2_oom_memlog_dump.txt.gz");
    assert_eq!(log.dumps.len(), 1);
    let dump = &log.dumps[0];
    assert_eq!(dump.figures.in_use_chunks, Some(2706));
    let last = log.records.last().unwrap();
    assert_eq!(last.kind, EventKind::AllocFailed);
    assert_eq!(last.record, RecordKind::OomRequest);
    assert_eq!(last.requested_bytes, 102_760_448);
    assert_eq!(last.line, 66_698);
    assert_eq!(
        last.kernel.as_deref(),
        Some("mobilenetv2_1.00_224_1/expanded_conv_depthwise_1/depthwise")
    );
    assert_eq!(log.events.height(), 65_033);
    let [alloc, ..] = kinds(&log);
    assert_eq!(alloc, 33_177);
    // The dump's NumAllocs is BFC's allocation counter: the largest id in the log.
    let max_id = log.records.iter().map(|r| r.tf_alloc_id).max().unwrap();
    assert_eq!(max_id, 34_561);
    assert_eq!(dump.stat("NumAllocs").unwrap().value.bytes, 34_561);
    assert_eq!(log.regions.len(), 8);
}

#[test]
fn infer_log_with_the_debugonly_marker() {
    let log = load("mobilenetv2_infer_memlog.txt.gz");
    assert_eq!(log.summary.records, 7_559);
    assert_eq!(log.summary.unreadable_records, 0);
    assert_eq!(log.events.height(), 4_580);
    let peaks: Vec<u64> = log.meminfo.iter().map(|m| m.peak_bytes).collect();
    assert_eq!(
        peaks,
        vec![29_529_088, 242_347_776, 242_347_776, 242_347_776]
    );
    assert!(log.dumps.is_empty());
}

#[test]
fn allocator_choice_and_bad_input() {
    let err = load_memory_log_with(
        &data("mobilenetv2_infer_memlog.txt.gz"),
        &MemlogOptions {
            allocator: Some("GPU_0_bfc".into()),
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("GPU_0_bfc"), "{err}");
    // A dump without a memory log is not a memory log.
    let err = load_memory_log(&data("public_alexnet-k40c-2017.txt")).unwrap_err();
    assert!(err.to_string().contains("__LOG_MEMORY__"), "{err}");
}

#[test]
fn load_detects_tensorflow_inputs() {
    use allocview_loaders::{InputKind, Loaded, detect, load};
    let opts = LoadOptions::default();
    let path = data("mobilenetv2_oom_memlog_dump.txt.gz");
    assert_eq!(detect(&path).unwrap(), InputKind::TfMemoryLog);
    match load(&path, &opts).unwrap() {
        // A log that ends in a dump yields both.
        Loaded::TfMemoryLog(log) => {
            assert_eq!(log.events.height(), 65_033);
            assert_eq!(log.dumps.len(), 1);
        }
        other => panic!("loaded {other:?}"),
    }
    let path = data("public_alexnet-k40c-2017.txt");
    assert_eq!(detect(&path).unwrap(), InputKind::TfBfcDump);
    match load(&path, &opts).unwrap() {
        Loaded::TfBfcDump(d) => assert_eq!(d.allocator.as_deref(), Some("GPU_0_bfc")),
        other => panic!("loaded {other:?}"),
    }
    assert!(detect(&data("README.md")).is_err());
}
