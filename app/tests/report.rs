//! `allocview report` as a user runs it: every file written, charts that are real pictures.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::process::Command;

#[test]
fn report_writes_csvs_and_charts() {
    let trace =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/find_usr_include.trace.gz");
    let out_guard = tempfile::Builder::new()
        .prefix("allocview-report-cli-")
        .tempdir()
        .unwrap();
    // A folder the command makes, as a user's would be.
    let out = out_guard.path().join("report");
    let run = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args([
            "report",
            trace.to_str().unwrap(),
            "--policy",
            "first-fit,bfc,buddy",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    for f in [
        "summary.csv",
        "timeline.csv",
        "classes.csv",
        "timeline.png",
        "fragmentation.png",
        "classes.png",
        "heapmap_first-fit.png",
        "heapmap_bfc.png",
        "heapmap_buddy.png",
    ] {
        let p = out.join(f);
        assert!(p.exists(), "{f} missing");
        if f.ends_with(".png") {
            let img = image::open(&p).unwrap().to_rgba8();
            assert_eq!((img.width(), img.height()), (1200, 700), "{f}");
            let distinct: std::collections::HashSet<[u8; 4]> = img.pixels().map(|p| p.0).collect();
            assert!(
                distinct.len() > 20,
                "{f} looks blank: {} colours",
                distinct.len()
            );
        }
    }
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let mut lines = summary.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("name,peak_footprint_bytes,final_footprint_bytes,peak_live_bytes")
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 3);
    // Every policy saw the trace's exact peak of live bytes (no limit, nothing failed).
    assert!(
        rows.iter().all(|r| r.split(',').nth(3) == Some("247976")),
        "{summary}"
    );
}

/// `--size` is bounded: the smallest and the largest sizes it takes draw every chart, and a
/// size past either end is refused before anything is replayed or written (a height of 100
/// pixels or less looped forever in the class chart; a huge one aborted in the bitmap).
#[test]
fn chart_sizes_are_bounded_at_both_ends() {
    let trace =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/xz_T2_8KiB_blocks.trace.gz");
    let dir = tempfile::tempdir().unwrap();
    let report = |size: &str| {
        let out = dir.path().join(size);
        let run = Command::new(env!("CARGO_BIN_EXE_allocview"))
            .args(["report", trace.to_str().unwrap(), "--policy", "bfc"])
            .args(["--size", size, "--out"])
            .arg(&out)
            .output()
            .unwrap();
        (run, out)
    };
    for size in ["320x240", "8192x240"] {
        let (run, out) = report(size);
        assert!(
            run.status.success(),
            "{size}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let (w, h) = image::image_dimensions(out.join("classes.png")).unwrap();
        assert_eq!(format!("{w}x{h}"), size);
    }
    for size in [
        "1200x100",
        "1200x239",
        "319x700",
        "1x1",
        "8193x700",
        "100000x100000",
    ] {
        let (run, out) = report(size);
        assert_eq!(run.status.code(), Some(1), "{size}");
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(
            err.contains("charts are 320x240 to 8192x8192 pixels"),
            "{size}: {err}"
        );
        assert!(!out.exists(), "{size}: nothing is written");
    }
}
