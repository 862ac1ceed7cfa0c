//! The terminal explorer end to end: the real binary in tmux, real keys, the screen read back
//! with capture-pane. Skips (with a message) where tmux is not installed; CI installs it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::tmux::{keys, start, tmux, tmux_missing, wait_for};

/// Runs `cmd`, which must succeed (its error output is the failure's message).
fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn explorer_in_tmux() {
    if tmux_missing() {
        return;
    }
    let trace =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/find_usr_include.trace.gz");
    let name = format!("allocview-test-{}", std::process::id());
    let cmd = format!(
        "{} {} --policy first-fit,bfc,buddy",
        env!("CARGO_BIN_EXE_allocview"),
        trace.display()
    );
    let s = start(name, 150, 45, &cmd);

    let screen = wait_for(&s, "all policies replayed", |t| {
        t.contains("(3/3 replayed)")
    });
    assert!(screen.contains("heap: first-fit"), "{screen}");
    assert!(screen.contains("event 0/40,402"), "{screen}");

    // Go to the reference peak by number.
    keys(&s, &["g", "22255", "Enter"]);
    let screen = wait_for(&s, "the goto", |t| t.contains("event 22,255/40,402"));
    assert!(screen.contains("live 242 KiB"), "{screen}");

    // Step with arrows and vim keys.
    keys(&s, &["Right", "l", "l", "h"]);
    wait_for(&s, "three steps", |t| t.contains("event 22,257/40,402"));

    // Next policy: bfc, with its bins.
    keys(&s, &["p"]);
    let screen = wait_for(&s, "the bfc view", |t| t.contains("heap: bfc"));
    assert!(screen.contains("BFC bins"), "{screen}");

    // Comparison view: all three heaps at once.
    keys(&s, &["c"]);
    let screen = wait_for(&s, "the comparison view", |t| t.contains("heap: buddy"));
    assert!(
        screen.contains("heap: first-fit") && screen.contains("heap: bfc"),
        "{screen}"
    );

    // Help, then quit (q closes the help first).
    keys(&s, &["?"]);
    wait_for(&s, "the help", |t| t.contains("keys (? to close)"));
    keys(&s, &["q"]);
    wait_for(&s, "the help to close", |t| {
        !t.contains("keys (? to close)")
    });

    // Resize to something tiny and back: no panic, still running.
    tmux(&["resize-window", "-t", &s.0, "-x", "30", "-y", "8"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux(&["resize-window", "-t", &s.0, "-x", "150", "-y", "45"]);
    wait_for(&s, "redraw after resize", |t| t.contains("heap: buddy"));

    keys(&s, &["q"]);
    let start = Instant::now();
    while tmux(&["list-sessions"]).contains(&s.0) {
        assert!(start.elapsed() < Duration::from_secs(5), "q did not quit");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A binary trace too big to load opens on its first events that fit (here made "too big" by
/// telling allocview it has 200 KB: 7,486 events would take 300 KB), read block by block, and
/// the status line says so.
#[test]
fn a_trace_too_big_to_load_opens_on_its_first_events() {
    if tmux_missing() {
        return;
    }
    // A binary trace written now: with the block index that tells its size before reading.
    let dir = std::env::temp_dir().join(format!("allocview-tmux-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("python_json.avt");
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/python_json.avt");
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_allocview"))
            .args(["convert", "--to", "binary"])
            .args([&sample, &trace]),
    );
    let name = format!("allocview-test-big-{}", std::process::id());
    let cmd = format!(
        "env ALLOCVIEW_AVAILABLE_MEMORY=200000 {} {} --policy bfc",
        env!("CARGO_BIN_EXE_allocview"),
        trace.display()
    );
    let s = start(name, 200, 45, &cmd);
    // 200,000 / 4 bytes of budget at 64 bytes an event: the first 781 events.
    // The status line says it once.
    let screen = wait_for(&s, "the first events", |t| {
        t.contains("too many to load whole: showing its first 781") && t.contains("event 0/780")
    });
    assert!(screen.contains("heap: bfc"), "{screen}");
    // The whole trace is read in the background: its strip, in the timeline's bottom border,
    // says so once the read is done (the first part is shown in reverse).
    let screen = wait_for(&s, "the whole trace's strip", |t| {
        t.contains("whole trace, peak live") && t.contains("resume points")
    });
    assert!(screen.contains('█'), "{screen}");
    keys(&s, &["End"]);
    wait_for(&s, "the last event of the window, replayed", |t| {
        t.contains("event 780/780") && t.contains("781 events") && t.contains("(1/1 replayed)")
    });
    // The next part, and back.
    keys(&s, &["}"]);
    wait_for(&s, "the next part, replayed", |t| {
        t.contains("(part 781..1,562 of 7,486;") && t.contains("(1/1 replayed)")
    });
    keys(&s, &["{"]);
    wait_for(&s, "the first part again", |t| {
        t.contains("(part 0..781 of 7,486;") && t.contains("(1/1 replayed)")
    });
    keys(&s, &["q"]);
    drop(s);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_pytorch_snapshot_in_tmux() {
    if tmux_missing() {
        return;
    }
    let snap = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces/pytorch/lm_train_step_b.pickle");
    let name = format!("allocview-test-pt-{}", std::process::id());
    // No --policy: a snapshot opens on `pytorch`, its recorded heap.
    let cmd = format!("{} {}", env!("CARGO_BIN_EXE_allocview"), snap.display());
    let s = start(name, 170, 50, &cmd);
    let n = allocview_sim::policy::registry::POLICY_NAMES.len();
    let all_replayed = format!("({n}/{n} replayed)");
    let screen = wait_for(&s, "all policies replayed", |t| t.contains(&all_replayed));
    assert!(screen.contains("heap: pytorch"), "{screen}");
    assert!(
        screen.contains("phases: Optimizer.step#AdamW.step"),
        "{screen}"
    );
    keys(&s, &["g", "846", "Enter"]);
    let screen = wait_for(&s, "the goto", |t| t.contains("event 846/6,932"));
    assert!(screen.contains("at forward (model.py:41)"), "{screen}");
    // The sites panel, then the next site.
    keys(&s, &["s"]);
    let screen = wait_for(&s, "the sites panel", |t| t.contains("sites at event 846"));
    assert!(screen.contains("(no stack recorded)"), "{screen}");
    // The first site (the blocks live since before the trace, 2.85 GiB) is selected: its
    // cells are `#` in the heap map.
    wait_for(&s, "a site's blocks marked", |t| t.contains("####"));
    keys(&s, &[">"]);
    wait_for(&s, "the next site", |t| {
        t.lines()
            .any(|l| l.contains("site step live") || l.contains("site forward live"))
    });
    keys(&s, &["q"]);
}

#[test]
fn the_recorded_memory_and_a_real_allocator_are_drawn_on_the_timeline() {
    if tmux_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("find.avt");
    run_ok(Command::new(env!("CARGO_BIN_EXE_allocview")).args([
        "record",
        "-o",
        trace.to_str().unwrap(),
        "--",
        "find",
        "/usr/include",
        "-name",
        "*.h",
    ]));
    let name = format!("allocview-test-rss-{}", std::process::id());
    let cmd = format!(
        "{} {} --policy glibc,real-glibc",
        env!("CARGO_BIN_EXE_allocview"),
        trace.display()
    );
    let s = start(name, 170, 50, &cmd);
    // The real row replays after the policies: its line comes last.
    let screen = wait_for(&s, "the real row", |t| t.contains("real-glibc RSS"));
    // The legend names the measured lines beside the model's footprint.
    assert!(screen.contains("recorded RSS"), "{screen}");
    assert!(screen.contains("glibc footprint"), "{screen}");
    keys(&s, &["q"]);
}

#[test]
fn t_tunes_the_allocator_and_draws_the_best_setting_beside_the_default() {
    if tmux_missing() {
        return;
    }
    let snap = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces/pytorch/lm_train_step_b.pickle");
    let name = format!("allocview-test-tune-{}", std::process::id());
    let cmd = format!(
        "{} {} --policy pytorch --limit 3.8GiB",
        env!("CARGO_BIN_EXE_allocview"),
        snap.display()
    );
    let s = start(name, 220, 50, &cmd);
    wait_for(&s, "the replay", |t| t.contains("(1/1 replayed)"));
    keys(&s, &["T"]);
    // The search's answer (what `tune --limit 3.8GiB` prints) and both settings' lines.
    let screen = wait_for(&s, "the search", |t| {
        t.contains("pytorch:start=empty:expandable_segments=true footprint")
    });
    assert!(screen.contains("pytorch:start=empty footprint"), "{screen}");
    assert!(screen.contains("footprint of every policy"), "{screen}");
    keys(&s, &["q"]);
}
