//! Recording on demand: `record --paused` starts a program with recording stopped, and
//! `allocview ctl PID start|stop|mark NAME` starts and stops it and puts named marks into the
//! trace, which `stats` and the timelines show.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::tmux::{capture, keys, start, tmux_missing, wait_for};
use common::{build_c, fails, json, ok};

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// Does one phase per line read (answering `ok` once done), so that the test knows which
/// allocations happen while recording is on. Sizes tell the phases apart.
const PHASES_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static void *a[100], *b[40], *c[30], *d[10];
/* Each phase's blocks come from a function of their own: a site each in `leaks`. */
__attribute__((noinline)) void *alloc_b(void) { return malloc(22222); }
__attribute__((noinline)) void *alloc_d(void) { return malloc(44444); }
int main(void) {
    char line[16];
    printf("%d\n", (int)getpid());
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        switch (line[0]) {
        case 'a': for (int i = 0; i < 100; i++) a[i] = malloc(11111); break;
        case 'b':
            for (int i = 0; i < 40; i++) b[i] = alloc_b();
            for (int i = 0; i < 50; i++) free(a[i]);
            break;
        case 'c': for (int i = 0; i < 30; i++) c[i] = malloc(33333); break;
        case 'd':
            for (int i = 0; i < 30; i++) free(c[i]);
            for (int i = 50; i < 100; i++) free(a[i]);
            for (int i = 0; i < 10; i++) d[i] = alloc_d();
            for (int i = 0; i < 20; i++) free(b[i]);
            break;
        case 'q': return 0;
        }
        printf("ok\n");
        fflush(stdout);
    }
    return 1;
}
"#;

/// The program under `record --paused`, driven phase by phase.
struct Driven {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
    pid: String,
}

impl Driven {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_allocview"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut pid = String::new();
        stdout.read_line(&mut pid).unwrap();
        Self {
            child,
            stdin,
            stdout,
            pid: pid.trim().to_owned(),
        }
    }

    /// Runs phase `p` and waits until the program has done it.
    fn phase(&mut self, p: &str) {
        writeln!(self.stdin, "{p}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ok", "phase {p}");
    }

    fn ctl(&self, args: &[&str]) -> String {
        let mut all = vec!["ctl", self.pid.as_str()];
        all.extend_from_slice(args);
        ok(&all)
    }

    fn finish(mut self) -> String {
        writeln!(self.stdin, "q").unwrap();
        drop(self.stdin);
        let out = self.child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    }
}

/// How many allocations of `size_bytes` the trace at `t` holds (its size classes are coarse:
/// the text form is read instead).
fn allocations_of(t: &str, size_bytes: u64, dir: &std::path::Path) -> usize {
    let text = dir.join(format!("{size_bytes}.trace"));
    ok(&["convert", t, text.to_str().unwrap()]);
    std::fs::read_to_string(&text)
        .unwrap()
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some(&size_bytes.to_string()))
        .count()
}

/// Records the phases program into `dir/phases.avt`: paused through phase a, recording b,
/// a mark, stopped through c, recording d. Returns the trace and `record`'s stderr.
fn record_on_demand(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    let exe = build_c(dir, "phases", PHASES_C);
    let trace = dir.join("phases.avt");
    let t = trace.to_str().unwrap();
    let mut p = Driven::start(&["record", "--paused", "-o", t, "--", exe.to_str().unwrap()]);
    p.phase("a"); // paused: not recorded
    assert_eq!(
        p.ctl(&["start"]).trim(),
        format!("recording started in process {}", p.pid)
    );
    p.phase("b");
    p.ctl(&["mark", "after b ✓"]);
    // Two `ctl`s at once: each waits its turn, neither command is lost.
    std::thread::scope(|s| {
        for name in ["one", "two"] {
            let p = &p;
            s.spawn(move || p.ctl(&["mark", name]));
        }
    });
    p.ctl(&["stop"]);
    p.phase("c"); // stopped: not recorded
    p.ctl(&["start"]);
    p.phase("d");
    (trace, p.finish())
}

#[test]
fn recording_starts_and_stops_on_demand_and_marks_land_in_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (trace, stderr) = record_on_demand(dir.path());
    let t = trace.to_str().unwrap();
    assert!(stderr.contains("recording is paused"), "{stderr}");

    // Only what the program allocated while recording was on.
    for (size, n) in [(11111, 0), (22222, 40), (33333, 0), (44444, 10)] {
        assert_eq!(
            allocations_of(t, size, dir.path()),
            n,
            "blocks of {size} bytes"
        );
    }
    let s = json(&["stats", t, "--json"]);
    // Frees of a's 100 blocks (allocated while paused) and c's 30 (while stopped) are
    // expected, not unknown; the record summary says the same.
    assert_eq!(s["frees_before_recording"], 130, "{s}");
    assert_eq!(s["frees_unknown"], 0, "{s}");
    assert!(!stderr.contains("never allocated"), "{stderr}");
    let marks = s["marks"].as_array().unwrap();
    let kinds: Vec<(&str, &str)> = marks
        .iter()
        .map(|m| (m["kind"].as_str().unwrap(), m["name"].as_str().unwrap()))
        .collect();
    // The two concurrent marks in either order.
    let mut middle = kinds[2..4].to_vec();
    middle.sort_unstable();
    assert_eq!(
        [&kinds[..2], &middle[..], &kinds[4..]].concat(),
        [
            ("recording started", ""),
            ("mark", "after b ✓"),
            ("mark", "one"),
            ("mark", "two"),
            ("recording stopped", ""),
            ("recording started", ""),
        ],
        "{kinds:?}"
    );
    let times: Vec<f64> = marks.iter().map(|m| m["t_s"].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // Loaded whole or streamed, the same marks; the table names them.
    assert_eq!(
        json(&["stats", t, "--json", "--no-stream"])["marks"],
        s["marks"]
    );
    let table = ok(&["stats", t]);
    assert!(table.contains("mark \"after b ✓\""), "{table}");
    // Half of alloc_b's blocks are live at the end, all allocated before recording stopped:
    // they may have been freed while it was stopped, so they are not called a leak.
    let leaks = json(&["leaks", t, "--json"]);
    assert!(
        leaks["recording_last_stopped_s"].as_f64().unwrap() > 0.0,
        "{leaks}"
    );
    let kind_of = |site: &str| {
        let row = leaks["leaks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"].as_str().unwrap().contains(site))
            .unwrap_or_else(|| panic!("no site {site}: {leaks}"));
        (
            row["kind"].as_str().unwrap().to_owned(),
            row["live_bytes"].as_u64().unwrap(),
        )
    };
    assert_eq!(kind_of("alloc_b"), ("unknown".to_owned(), 20 * 22222));
    let (d_kind, d_bytes) = kind_of("alloc_d");
    assert_ne!(d_kind, "unknown");
    assert_eq!(d_bytes, 10 * 44444);
    // A Chrome trace (Perfetto) has them as global instants.
    let chrome = dir.path().join("phases.json");
    ok(&[
        "export",
        t,
        "-o",
        chrome.to_str().unwrap(),
        "--to",
        "chrome",
    ]);
    let chrome: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&chrome).unwrap()).unwrap();
    let instants: Vec<&str> = chrome["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "i" && e["s"] == "g")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(instants.len(), 6, "{instants:?}");
    assert_eq!(
        [instants[0], instants[1], instants[4], instants[5]],
        [
            "recording started",
            "after b ✓",
            "recording stopped",
            "recording started"
        ]
    );
    // They survive a conversion to the binary form.
    let copy = dir.path().join("copy.avt");
    ok(&["convert", t, copy.to_str().unwrap(), "--to", "binary"]);
    assert_eq!(
        json(&["stats", copy.to_str().unwrap(), "--json"])["marks"],
        s["marks"]
    );
}

#[test]
fn ctl_refuses_a_process_that_is_not_recorded_and_a_bad_command() {
    let me = std::process::id().to_string();
    let err = fails(&["ctl", &me, "start"]);
    assert!(err.contains("not recorded by allocview"), "{err}");
    assert!(fails(&["ctl", "4000000000", "stop"]).contains("no process"));
    assert!(fails(&["ctl", &me, "mark"]).contains("needs a name"));
    assert!(fails(&["ctl", &me, "pause"]).contains("invalid value"));
}

/// The terminal explorer draws the marks on the timeline, names them in its legend, and `n`
/// stops at them.
#[test]
fn the_explorer_shows_the_marks_and_n_stops_at_them() {
    if tmux_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (trace, _) = record_on_demand(dir.path());
    let name = format!("allocview-test-marks-{}", std::process::id());
    let cmd = format!("{} {}", env!("CARGO_BIN_EXE_allocview"), trace.display());
    let s = start(name, 200, 50, &cmd);
    // The legend names the first three marks in view and counts the rest.
    wait_for(&s, "the marks in the legend", |seen| {
        seen.contains("marks: ") && seen.contains("after b ✓") && seen.contains("more")
    });
    // `n` goes from mark to mark (peaks and OOMs too) until it reaches the user's.
    let mut reached = false;
    let mut seen = String::new();
    for _ in 0..12 {
        keys(&s, &["n"]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        seen = capture(&s);
        if seen.contains("mark \"after b ✓\"") {
            reached = true;
            break;
        }
    }
    assert!(reached, "n never stopped at the mark:\n{seen}");
}
