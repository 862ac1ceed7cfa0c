//! The desktop explorer in a real X server (Xvfb): start it on a sample trace, let it load and
//! replay, take a screenshot of the window and check that it shows something. Skips (with a
//! message) where xvfb-run is not installed; CI installs it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test
#![cfg(feature = "gui")]

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

#[test]
fn gui_renders_a_trace_under_xvfb() {
    if Command::new("xvfb-run").arg("--help").output().is_err() {
        eprintln!("skipping: xvfb-run is not installed");
        return;
    }
    let trace =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/find_usr_include.trace.gz");
    let out_dir = std::env::temp_dir().join(format!("allocview-gui-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let shot = out_dir.join("gui.png");
    let out = Command::new("xvfb-run")
        .args(["-a", "-s", "-screen 0 1400x900x24"])
        .arg(env!("CARGO_BIN_EXE_allocview"))
        .arg("gui")
        .arg(&trace)
        .args([
            "--policy",
            "bfc,first-fit,buddy",
            "--goto",
            "peak",
            "--size",
            "1400x900",
        ])
        .arg("--screenshot")
        .arg(&shot)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "allocview gui failed:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let img = image::open(&shot).unwrap().to_rgba8();
    assert!(
        img.width() >= 1000 && img.height() >= 600,
        "{}x{}",
        img.width(),
        img.height()
    );
    // Not blank: many distinct colours (plot lines, heap map cells, text), and a good share of
    // pixels that are not the background.
    let background = *img.get_pixel(img.width() - 5, img.height() / 2);
    let mut colours = HashSet::new();
    let mut not_background = 0u64;
    for p in img.pixels() {
        colours.insert(p.0);
        if p != &background {
            not_background += 1;
        }
    }
    let total = u64::from(img.width()) * u64::from(img.height());
    assert!(colours.len() > 200, "only {} colours", colours.len());
    assert!(
        not_background * 10 > total,
        "{not_background} of {total} pixels differ from the background"
    );
    // The cursor colour (theme::CURSOR, #ffd700) is drawn: the timeline's cursor line and the
    // event row at the cursor.
    let cursor_pixels = img
        .pixels()
        .filter(|p| p.0[0] > 0xf0 && (0xc8..0xe0).contains(&p.0[1]) && p.0[2] < 0x30)
        .count();
    assert!(
        cursor_pixels > 100,
        "cursor colour found on {cursor_pixels} pixels"
    );
}
