//! PyTorch profiler (Kineto) traces through the commands, as a user runs them: the GPU stream
//! replays through `pytorch` beside the reserved bytes the trace recorded, the sites are the
//! operators, and `--device` reads another stream. Figures: `loaders/tests/data/kineto/README.md`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{fails, json, ok, repo_arg, run};

fn mi300() -> String {
    repo_arg("loaders/tests/data/kineto/tracelens_mi300_normalization_layer_test.json.gz")
}

#[test]
fn compare_replays_the_hip_stream_through_pytorch_beside_the_recorded_reserved_bytes() {
    let out = run(&["compare", &mi300(), "--policy", "pytorch,first-fit"]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stdout.contains("  pytorch "), "{stdout}");
    assert!(
        stdout.contains("PyTorch's caching allocator reserved at most 8.00 MiB"),
        "{stdout}"
    );
    assert!(!stdout.contains("RSS"), "{stdout}");
    assert!(stderr.contains("415 [memory] events of hip:0"), "{stderr}");
    let v = json(&["compare", &mi300(), "--policy", "pytorch", "--json"]);
    assert_eq!(v["format"], "pytorch-profiler");
    assert_eq!(v["events"], 415);
    assert_eq!(v["recorded_memory"]["series"], "allocator_reserved");
    assert_eq!(v["recorded_memory"]["peak_rss_bytes"], 8_388_608u64);
    let row = &v["policies"][0];
    assert_eq!(row["name"], "pytorch");
    assert_eq!(
        row["error_against_recorded"]["recorded_peak_reserved_bytes"],
        8_388_608u64
    );
}

#[test]
fn sites_names_the_operators() {
    let out = ok(&["sites", &mi300()]);
    assert!(out.contains("aten::empty"), "{out}");
    let cpu = ok(&[
        "sites",
        &repo_arg("loaders/tests/data/kineto/dtu_mlops_resnet18_cpu_trace.json.gz"),
    ]);
    assert!(cpu.contains("aten::mkldnn_convolution"), "{cpu}");
}

#[test]
fn stats_and_flamegraph_work_and_device_reads_the_cpu_stream() {
    let v = json(&["stats", &mi300(), "--json"]);
    assert_eq!(v["events"], 415);
    assert_eq!(v["recorded_memory"]["series"], "allocator_reserved");
    let text = ok(&["stats", &mi300()]);
    assert!(text.contains("peak reserved"), "{text}");
    let cpu = json(&["stats", &mi300(), "--device", "cpu", "--json"]);
    assert_eq!(cpu["events"], 60);
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("f.svg");
    ok(&["flamegraph", &mi300(), "-o", &svg.display().to_string()]);
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains("aten::empty"));
    let e = fails(&["stats", &mi300(), "--device", "cuda:0"]);
    assert!(e.contains("hip:0 (415 events)"), "{e}");
}

#[test]
fn the_old_schema_says_its_lifetimes_are_approximate() {
    let out = run(&[
        "stats",
        &repo_arg("loaders/tests/data/kineto/kineto_tbplugin_resnet50_first200ms.pt.trace.json.gz"),
    ]);
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("lifetimes are approximate"), "{stderr}");
}
