//! Watching a run while it is recorded: `record --live` and `allocview FILE --follow` in tmux,
//! on a real program that grows its heap one phase at a time, paced by the test through a
//! FIFO, so the screen is read while the program is still running. Skips (with a message)
//! where tmux is not installed; CI installs it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::tmux::{Session, keys, start, tmux_missing, wait_for};
use common::{build_c, json, ok};

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One phase per line read from the FIFO named by its argument: 1,000 blocks of 30,000 bytes
/// (size class 15), all kept, allocated in `grow_phase`; at the end of the FIFO it frees them
/// all and exits. The FIFO is opened once, before the first phase, so a phase allocates
/// nothing else.
const GROW_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static void *keep[100][1000];
__attribute__((noinline)) void grow_phase(void **blocks) {
    for (int i = 0; i < 1000; i++) {
        blocks[i] = malloc(30000);
        memset(blocks[i], 1, 64);
    }
}
int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "r");
    if (!f) return 2;
    char line[64];
    int phases = 0;
    while (phases < 100 && fgets(line, sizeof line, f)) {
        grow_phase(keep[phases]);
        phases++;
    }
    for (int p = 0; p < phases; p++)
        for (int i = 0; i < 1000; i++) free(keep[p][i]);
    return 0;
}
"#;

/// The number before ` events` on the status line.
fn events(screen: &str) -> Option<u64> {
    let line = screen.lines().rev().find(|l| l.contains(" events"))?;
    let before = line.split(" events").next()?;
    let n = before.rsplit(' ').next()?;
    n.replace(',', "").parse().ok()
}

/// The status line's `event C/L`: the cursor and the last event.
fn cursor(screen: &str) -> Option<(u64, u64)> {
    let line = screen.lines().rev().find(|l| l.contains("event "))?;
    let at = line.split("  event ").nth(1)?.split_whitespace().next()?;
    let (c, l) = at.split_once('/')?;
    Some((
        c.replace(',', "").parse().ok()?,
        l.replace(',', "").parse().ok()?,
    ))
}

/// The live count of size class 15 (16 KiB..32 KiB) in the panel at the cursor.
fn class_15(screen: &str) -> Option<u64> {
    let line = screen.lines().find(|l| l.contains("16.0 KiB..32.0 KiB"))?;
    let rest = line.split("16.0 KiB..32.0 KiB").nth(1)?;
    rest.split_whitespace()
        .next()?
        .replace(',', "")
        .parse()
        .ok()
}

/// The timeline's end label (the span drawn), in seconds.
fn span_s(screen: &str) -> Option<f64> {
    screen
        .lines()
        .find(|l| l.trim_start().starts_with("│  0.000000s"))?
        .split_whitespace()
        .rev()
        .find_map(|w| w.trim_end_matches('│').strip_suffix('s')?.parse().ok())
}

/// The program, its FIFO, opened for writing (read and write: opening does not wait for the
/// reader), in `dir`.
fn program(dir: &Path) -> (PathBuf, PathBuf, std::fs::File) {
    let exe = build_c(dir, "grow", GROW_C);
    let fifo = dir.join("phases");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let pipe = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    (exe, fifo, pipe)
}

/// Asks for a phase and waits until the explorer shows its 1,000 allocations: returns its
/// event count.
fn phase(s: &Session, pipe: &mut std::fs::File, before: u64) -> u64 {
    pipe.write_all(b"go\n").unwrap();
    let screen = wait_for(s, "a phase's 1,000 allocations", |sc| {
        events(sc).is_some_and(|n| n >= before + 1000)
    });
    let n = events(&screen).unwrap();
    assert_eq!(
        n,
        before + 1000,
        "a phase allocates 1,000 blocks:\n{screen}"
    );
    n
}

/// Whether a recording of `output` is still being written (its temporary file is there).
fn recording(output: &Path) -> bool {
    let name = output.file_name().unwrap().to_str().unwrap();
    let stem = name.split('.').next().unwrap();
    std::fs::read_dir(output.parent().unwrap())
        .unwrap()
        .flatten()
        .any(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(".allocview-tmp-") && n.contains(&format!("-{stem}."))
        })
}

#[test]
fn record_live_shows_the_run_while_it_goes_on() {
    if tmux_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (exe, fifo, mut pipe) = program(dir.path());
    let out = dir.path().join("run.avt");
    let cmd = format!(
        "{} record --live -o {} -- {} {}; sleep 60",
        env!("CARGO_BIN_EXE_allocview"),
        out.display(),
        exe.display(),
        fifo.display()
    );
    let s = start(
        format!("allocview-live-record-{}", std::process::id()),
        200,
        50,
        &cmd,
    );
    // The program has opened its FIFO: its start-up events are shown, following the head.
    let first = wait_for(&s, "the start of the run", |sc| {
        sc.contains("[LIVE, following]") && events(sc).is_some()
    });
    let start = events(&first).unwrap();

    // Each phase shows up while the program still runs (it waits for the next line).
    let e1 = phase(&s, &mut pipe, start);
    assert!(recording(&out), "the program should still be recorded");
    let one = wait_for(&s, "the classes of phase 1", |sc| {
        class_15(sc) == Some(1000)
    });
    assert_eq!(cursor(&one), Some((e1 - 1, e1 - 1)), "{one}");
    // A mark put in while it runs is on the timeline before the run ends, as is the program's
    // resident memory.
    let pid = Command::new("pgrep")
        .arg("-f")
        .arg(format!("^{} ", exe.display()))
        .output()
        .unwrap();
    let pid = String::from_utf8_lossy(&pid.stdout).trim().to_owned();
    assert!(!pid.is_empty(), "the program's pid");
    ok(&["ctl", &pid, "mark", "before two"]);
    let e2 = phase(&s, &mut pipe, e1);
    wait_for(&s, "the mark and the RSS", |sc| {
        sc.contains("before two") && sc.contains("recorded RSS")
    });
    let two = wait_for(&s, "the classes of phase 2", |sc| {
        class_15(sc) == Some(2000) && cursor(sc) == Some((e2 - 1, e2 - 1))
    });
    assert!(recording(&out));
    assert!(
        span_s(&two).unwrap() > span_s(&one).unwrap(),
        "the timeline grows:\n{one}\n{two}"
    );
    // The sites panel shows the run's call stacks by function while it runs: the 2,000
    // blocks of the two phases at `grow_phase` (selected, its frames below the rows), and
    // the FIFO's buffer at `main`.
    keys(&s, &["s"]);
    let sites = wait_for(&s, "the sites of the run", |sc| {
        sc.contains("(call stacks)")
            && sc.lines().any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.windows(3).any(|w| w == ["2000", "2000", "grow_phase"])
            })
    });
    assert!(sites.contains("at grow_phase"), "{sites}");
    assert!(sites.lines().any(|l| l.contains("  main ")), "{sites}");
    assert!(recording(&out), "the program should still be recorded");
    keys(&s, &["s"]);
    wait_for(&s, "the sites panel closed", |sc| {
        !sc.contains("(call stacks)")
    });

    // Back in time while the run goes on: the cursor stays, the run grows.
    keys(&s, &["h"]);
    keys(&s, &["h"]);
    keys(&s, &["h"]);
    wait_for(&s, "the cursor held", |sc| {
        sc.contains("[LIVE, cursor held: F follows]") && cursor(sc) == Some((e2 - 4, e2 - 1))
    });
    let e3 = phase(&s, &mut pipe, e2);
    let three = wait_for(&s, "the held cursor", |sc| {
        cursor(sc) == Some((e2 - 4, e3 - 1))
    });
    assert_eq!(
        class_15(&three),
        Some(1997),
        "the classes at the held cursor:\n{three}"
    );
    // `F` follows the newest event again.
    keys(&s, &["F"]);
    wait_for(&s, "the head followed", |sc| {
        sc.contains("[LIVE, following]")
            && cursor(sc) == Some((e3 - 1, e3 - 1))
            && class_15(sc) == Some(3000)
    });

    // The end of the FIFO ends the program: it frees everything, the recording ends, and the
    // policies that need the whole trace replay.
    drop(pipe);
    let end = wait_for(&s, "the end of the recording", |sc| {
        sc.contains("[recording ended]") && sc.contains("(9/9 replayed)")
    });
    let total = events(&end).unwrap();
    assert_eq!(total, e3 + 3000, "{end}");
    keys(&s, &["q"]);
    let done = wait_for(&s, "record's last words", |sc| {
        sc.contains("the command's output is in")
    });
    assert!(
        done.contains(&format!("recorded {}", out.display())),
        "{done}"
    );
    let stats = json(&["stats", out.to_str().unwrap(), "--json"]);
    assert_eq!(stats["events"].as_u64(), Some(total), "{stats}");
    let log = std::fs::read_to_string(dir.path().join("run.avt.log")).unwrap();
    assert!(log.contains("recorded 1 process"), "{log}");
}

#[test]
fn follow_switches_from_a_finished_trace_to_a_new_recording_and_into_the_program_a_shell_execs() {
    if tmux_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (exe, fifo, mut pipe) = program(dir.path());
    let out = dir.path().join("run.avt");
    // A finished trace of that name: shown as it is until a new recording starts.
    std::fs::copy(common::sample("python_json.avt"), &out).unwrap();
    let old = json(&["stats", out.to_str().unwrap(), "--json"])["events"]
        .as_u64()
        .unwrap();
    let cmd = format!(
        "{} {} --follow",
        env!("CARGO_BIN_EXE_allocview"),
        out.display()
    );
    let s = start(
        format!("allocview-live-follow-{}", std::process::id()),
        200,
        50,
        &cmd,
    );
    wait_for(&s, "the finished trace", |sc| {
        sc.contains("[recording ended]") && events(sc) == Some(old)
    });
    // Another `record` starts writing it, of a shell that execs the program (as a wrapper
    // script or `env` does): two process images, the second the one that works.
    let mut record = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["record", "-o", out.to_str().unwrap(), "--", "sh", "-c"])
        .arg("exec \"$0\" \"$1\"")
        .arg(&exe)
        .arg(&fifo)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    pipe.write_all(b"go\n").unwrap();
    let one = wait_for(&s, "the program's first phase", |sc| {
        sc.contains("[LIVE, following]") && class_15(sc) == Some(1000)
    });
    let e1 = events(&one).unwrap();
    let e2 = phase(&s, &mut pipe, e1);
    wait_for(&s, "phase 2's classes", |sc| class_15(sc) == Some(2000));
    drop(pipe);
    assert!(record.wait().unwrap().success());
    let end = wait_for(&s, "the end", |sc| {
        sc.contains("[recording ended]") && events(sc) == Some(e2 + 2000)
    });
    keys(&s, &["q"]);
    // The program's image has its own trace (`run.PID-1.avt`), the one shown.
    let program_trace = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with("-1.avt"))
        .expect("a trace of the exec'd program");
    let stats = json(&["stats", program_trace.to_str().unwrap(), "--json"]);
    assert_eq!(stats["events"].as_u64(), events(&end), "{stats}");
}

/// Without a terminal, the terminal explorer and `record --live` say so instead of panicking
/// in the terminal library, and `record --live` starts nothing.
#[test]
fn without_a_terminal_the_explorers_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let sample = common::sample("python_json.avt");
    for args in [
        vec![sample.to_str().unwrap().to_owned()],
        vec![
            "record".to_owned(),
            "--live".to_owned(),
            "-o".to_owned(),
            dir.path().join("t.avt").to_str().unwrap().to_owned(),
            "--".to_owned(),
            "true".to_owned(),
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("terminal"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing written"
    );
}

/// A recording that fails before writing anything: `record --live` says so on its screen,
/// and prints the end of the log on the way out.
#[test]
fn record_live_says_when_the_recording_wrote_nothing() {
    if tmux_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("none.avt");
    let cmd = format!(
        "{} record --live -o {} -- /nonexistent-program; echo EXIT=$?; sleep 60",
        env!("CARGO_BIN_EXE_allocview"),
        out.display()
    );
    let s = start(
        format!("allocview-live-none-{}", std::process::id()),
        200,
        50,
        &cmd,
    );
    wait_for(&s, "the failed recording", |sc| {
        sc.contains("the recording ended without writing") && sc.contains("none.avt.log")
    });
    keys(&s, &["q"]);
    let end = wait_for(&s, "the exit", |sc| sc.contains("EXIT="));
    assert!(end.contains("cannot run /nonexistent-program"), "{end}");
    assert!(
        end.contains("the end of") && end.contains("none.avt.log"),
        "{end}"
    );
    assert!(end.contains("EXIT=1"), "{end}");
    assert!(!out.exists());
}
