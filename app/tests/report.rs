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

/// `report --out DIR` names its files itself, so a symbolic link planted in DIR under one of
/// those names is replaced, never written through: a file outside DIR that a link points to
/// stays as it was, and one that a dangling link names is not created (issue 43).
#[test]
fn links_planted_under_the_reports_names_are_replaced_not_followed() {
    let trace =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/xz_T2_8KiB_blocks.trace.gz");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let names = [
        "summary.csv",
        "timeline.csv",
        "classes.csv",
        "summary.parquet",
        "timeline.parquet",
        "classes.parquet",
        "timeline.png",
        "fragmentation.png",
        "classes.png",
        "heapmap_bfc.png",
    ];
    // Every other link points at an existing file outside, the rest at a missing one.
    for (i, name) in names.iter().enumerate() {
        let target = outside.join(format!("victim-{name}"));
        if i % 2 == 0 {
            std::fs::write(&target, format!("precious {name}")).unwrap();
        }
        std::os::unix::fs::symlink(&target, out.join(name)).unwrap();
    }
    let run = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["report", trace.to_str().unwrap(), "--policy", "bfc"])
        .args(["--size", "320x240", "--parquet", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    for (i, name) in names.iter().enumerate() {
        let target = outside.join(format!("victim-{name}"));
        if i % 2 == 0 {
            assert_eq!(
                std::fs::read_to_string(&target).unwrap(),
                format!("precious {name}"),
                "{name}: the file outside was written through the link"
            );
        } else {
            assert!(!target.exists(), "{name}: a file outside was created");
        }
        let meta = std::fs::symlink_metadata(out.join(name)).unwrap();
        assert!(meta.is_file(), "{name} is not a regular file in the report");
        assert!(meta.len() > 0, "{name} is empty");
    }
    let left: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), names.len().div_ceil(2), "{left:?}");
}
