//! The desktop explorer in a real X server (Xvfb): start it on a sample trace, let it load and
//! replay, take a screenshot of the window and check that it shows something. Skips (with a
//! message) where xvfb-run is not installed; CI installs it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test
#![cfg(feature = "gui")]

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

/// Runs `allocview gui FILE ARGS --screenshot` in Xvfb at 1400x900; `None` without xvfb-run.
fn screenshot(file: &Path, args: &[&str]) -> Option<image::RgbaImage> {
    if Command::new("xvfb-run").arg("--help").output().is_err() {
        skip_missing("xvfb-run is not installed");
        return None;
    }
    let out_dir = std::env::temp_dir().join(format!(
        "allocview-gui-{}-{}",
        std::process::id(),
        file.file_stem().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&out_dir).unwrap();
    let shot = out_dir.join("gui.png");
    let out = Command::new("xvfb-run")
        .args(["-a", "-s", "-screen 0 1400x900x24"])
        .arg(env!("CARGO_BIN_EXE_allocview"))
        .arg("gui")
        .arg(file)
        .args(args)
        .args(["--size", "1400x900"])
        .arg("--screenshot")
        .arg(&shot)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "allocview gui failed:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let img = image::open(&shot).unwrap().to_rgba8();
    std::fs::remove_dir_all(&out_dir).ok();
    Some(img)
}

/// Not blank: many distinct colours (plot lines, heap map cells, text), and a good share of
/// pixels that are not the background.
fn assert_not_blank(img: &image::RgbaImage) {
    assert!(
        img.width() >= 1000 && img.height() >= 600,
        "{}x{}",
        img.width(),
        img.height()
    );
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
}

/// Pixels close to `rgb` (each channel within 16).
fn pixels_like(img: &image::RgbaImage, rgb: [u8; 3]) -> usize {
    img.pixels()
        .filter(|p| (0..3).all(|c| p.0[c].abs_diff(rgb[c]) <= 16))
        .count()
}

#[test]
fn gui_renders_a_trace_under_xvfb() {
    let trace =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/find_usr_include.trace.gz");
    let Some(img) = screenshot(
        &trace,
        &["--policy", "bfc,first-fit,buddy", "--goto", "peak"],
    ) else {
        return;
    };
    assert_not_blank(&img);
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

#[test]
fn gui_renders_a_pytorch_snapshot_under_xvfb() {
    let snap = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces/pytorch/lm_train_step_b.pickle");
    let Some(img) = screenshot(&snap, &["--goto", "846"]) else {
        return;
    };
    assert_not_blank(&img);
    // The heap map (left of the middle band) is drawn, not empty: nearly every pixel there is
    // a cell, in the colours of free space and of several size classes.
    let background = *img.get_pixel(img.width() - 5, img.height() / 2);
    let mut heap_colours = HashSet::new();
    let (mut drawn, mut total) = (0u64, 0u64);
    for y in 300..580 {
        for x in 20..900 {
            let p = img.get_pixel(x, y);
            heap_colours.insert(p.0);
            total += 1;
            drawn += u64::from(*p != background);
        }
    }
    assert!(
        heap_colours.len() >= 4,
        "heap area has {} colours",
        heap_colours.len()
    );
    assert!(
        drawn * 10 > total * 9,
        "{drawn} of {total} heap-area pixels drawn"
    );
    // The optimizer phases' boundaries (theme::PHASE, #40b0a0) are on the timeline.
    let phase = pixels_like(&img, [0x40, 0xb0, 0xa0]);
    assert!(phase > 50, "phase colour on {phase} pixels");
}

/// A BFC dump fills the window with its own chunks beside its bins (it had shown an empty
/// "heap: first-fit" box above an empty event list).
#[test]
fn gui_renders_a_bfc_dump_under_xvfb() {
    let dump = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../loaders/tests/data/tf/mobilenetv2_oom_dump.txt.gz");
    let Some(img) = screenshot(&dump, &[]) else {
        return;
    };
    assert_not_blank(&img);
    let background = *img.get_pixel(img.width() - 5, img.height() / 2);
    let (mut drawn, mut total) = (0u64, 0u64);
    for y in 250..750 {
        for x in 20..900 {
            total += 1;
            drawn += u64::from(*img.get_pixel(x, y) != background);
        }
    }
    assert!(
        drawn * 10 > total * 9,
        "{drawn} of {total} heap-area pixels drawn"
    );
}

/// A memory plan's picture shows its buffers in many colours (one per buffer, neighbours apart)
/// and the lower bound's line.
#[test]
fn gui_renders_a_plan_under_xvfb() {
    let plan =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/plans/mobilenet_v2.csv");
    let Some(img) = screenshot(&plan, &[]) else {
        return;
    };
    assert_not_blank(&img);
    let mut colours = HashSet::new();
    for y in 500..800 {
        for x in 100..1300 {
            colours.insert(img.get_pixel(x, y).0);
        }
    }
    assert!(
        colours.len() > 30,
        "plan area has {} colours",
        colours.len()
    );
    let bound = pixels_like(&img, [0xff, 0xd7, 0x00]);
    assert!(bound > 1000, "the bound's line on {bound} pixels");
}

#[test]
fn gui_sites_panel_marks_a_sites_blocks_under_xvfb() {
    let snap = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces/pytorch/lm_train_step_b.pickle");
    let Some(img) = screenshot(&snap, &["--goto", "peak", "--sites"]) else {
        return;
    };
    assert_not_blank(&img);
    // The selected site (the blocks live since before the trace, 2.85 of 3.58 GiB at the
    // peak) is drawn in theme::SELECTED (#00e0ff) in the heap map and on the timeline.
    let selected = pixels_like(&img, [0x00, 0xe0, 0xff]);
    assert!(selected > 20_000, "selected colour on {selected} pixels");
}

/// A test whose input or tool is missing is skipped with a message; where CI asks for every
/// input (`ALLOCVIEW_REQUIRE_TEST_INPUTS` set, as `.ci/run` does) it fails instead, so a missing
/// `../shared` or tool cannot turn tests green.
fn skip_missing(why: &str) {
    assert!(
        std::env::var_os("ALLOCVIEW_REQUIRE_TEST_INPUTS").is_none(),
        "a required test tool is missing: {why}"
    );
    eprintln!("skipping: {why}");
}

/// `--tune` (View > Tune): the default and the best settings are added beside the session's
/// policy, their footprints drawn in the next policy colours (`theme::series(2)` and `(3)`).
#[test]
fn gui_tune_draws_the_best_setting_beside_the_default_under_xvfb() {
    let snap = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces/pytorch/lm_train_step_b.pickle");
    let args = ["--policy", "pytorch", "--limit", "3.8GiB"];
    let Some(plain) = screenshot(&snap, &args) else {
        return;
    };
    let Some(tuned) = screenshot(&snap, &[&args[..], &["--tune"]].concat()) else {
        return;
    };
    assert_not_blank(&tuned);
    let [g, o] = [allocview::theme::series(2), allocview::theme::series(3)];
    let green = |img: &image::RgbaImage| pixels_like(img, [g.0, g.1, g.2]);
    let orange = |img: &image::RgbaImage| pixels_like(img, [o.0, o.1, o.2]);
    assert!(
        green(&tuned) > 200 && orange(&tuned) > 200,
        "{} {}",
        green(&tuned),
        orange(&tuned)
    );
    assert!(
        green(&plain) < green(&tuned) / 4,
        "{} {}",
        green(&plain),
        green(&tuned)
    );
    assert!(
        orange(&plain) < orange(&tuned) / 4,
        "{} {}",
        orange(&plain),
        orange(&tuned)
    );
}

/// An input that fails to load is shown with its error and the screenshot taken: the window
/// used to wait for its policies' replays, which never start, for good.
#[test]
fn gui_shows_a_load_error_instead_of_waiting_for_ever_under_xvfb() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.trace");
    std::fs::write(&bad, "not a trace line\n").unwrap();
    let Some(img) = screenshot(&bad, &[]) else {
        return;
    };
    assert!(img.width() >= 1000, "{}", img.width());
}

/// `gui FILE --follow` on a recording in progress: the window shows the run so far while the
/// program still runs (it waits on its standard input), its heap map and timeline drawn.
#[test]
fn gui_follows_a_recording_in_progress_under_xvfb() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("hold.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    for (int i = 0; i < 3000; i++) memset(malloc(1000 + i % 3000), 1, 16);
    getchar();
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.path().join("hold");
    let cc = Command::new("cc")
        .args(["-O0", "-fno-builtin", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(cc.success());
    let out = dir.path().join("hold.avt");
    let mut record = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["record", "-o", out.to_str().unwrap(), "--"])
        .arg(&exe)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let img = screenshot(&out, &["--follow"]);
    // The program was still waiting when the window was drawn: it ends now.
    assert!(
        record.try_wait().unwrap().is_none(),
        "the program ended too early"
    );
    drop(record.stdin.take());
    assert!(record.wait().unwrap().success());
    let Some(img) = img else { return };
    assert_not_blank(&img);
}
