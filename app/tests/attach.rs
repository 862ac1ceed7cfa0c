//! `allocview attach` on real processes started without allocview: a C program and a Python
//! program run in phases paced by a pipe the test writes to, so that the test knows exactly
//! which allocations fall inside the attached window (phase B) and which before (phase A) and
//! after (phase C). Each must run through the attach and the detach with the output of an
//! untraced run, and the trace must hold exactly phase B's allocations of the sizes the
//! program chose, and count phase B's frees of phase A's blocks apart. Also the clear errors:
//! a process that may not be traced, and one that does not exist.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

mod common;
use common::{build_c, fails, run};

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use allocview_loaders::{LoadOptions, binary::load_binary};
use allocview_sim::trace::EventKind;

/// Phase A keeps 8 blocks of 12,345 bytes and a 5,000-byte one, and frees 5 of 23,456. Phase B
/// (attached) frees the 8, reallocates the 5,000-byte block to 56,789, allocates 7 blocks of
/// 34,567 that it keeps, and 11 of 45,678 that it frees. Phase C (detached) frees the 7 and
/// the realloc'd block, allocates and frees 13 of 67,890, and prints a checksum of every
/// block's contents.
const PHASES_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static unsigned long sum;
static void *fill(size_t n, int v) {
    unsigned char *p = malloc(n);
    memset(p, v, n);
    return p;
}
static void take(void *p, size_t n) {
    unsigned char *b = p;
    for (size_t i = 0; i < n; i += 97) sum = sum * 31 + b[i];
    free(p);
}
static void wait_for(const char *phase) {
    char line[64];
    printf("ready %s\n", phase);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) exit(3);
}
int main(void) {
    void *before[8], *kept[7];
    for (int i = 0; i < 8; i++) before[i] = fill(12345, i + 1);
    for (int i = 0; i < 5; i++) take(fill(23456, 40 + i), 23456);
    unsigned char *grown = fill(5000, 7);
    wait_for("B");
    for (int i = 0; i < 8; i++) take(before[i], 12345);
    grown = realloc(grown, 56789);
    memset(grown + 5000, 9, 56789 - 5000);
    for (int i = 0; i < 7; i++) kept[i] = fill(34567, 60 + i);
    for (int i = 0; i < 11; i++) take(fill(45678, 80 + i), 45678);
    wait_for("C");
    for (int i = 0; i < 7; i++) take(kept[i], 34567);
    take(grown, 56789);
    for (int i = 0; i < 13; i++) take(fill(67890, 100 + i), 67890);
    printf("checksum %lu\n", sum);
    return 0;
}
"#;

/// The same phases in Python: bytearrays of a million bytes and more are served by the C
/// library (pymalloc takes only requests up to 512 bytes), one byte more than their length.
const PHASES_PY: &str = r#"
import sys, zlib
def wait_for(phase):
    print("ready", phase, flush=True)
    if not sys.stdin.readline():
        sys.exit(3)
before = [bytearray([i + 1]) * 1_000_000 for i in range(3)]
wait_for("B")
total = sum(zlib.crc32(b) for b in before)
del before
kept = [bytearray([i]) * (2_000_000 + i) for i in range(4)]
for i in range(5):
    tmp = bytearray(1_234_567)
    tmp[i] = i
    total += zlib.crc32(tmp)
    del tmp
wait_for("C")
total += sum(zlib.crc32(b) for b in kept)
del kept
later = [bytearray(3_000_000) for _ in range(2)]
print("checksum", total + len(later), flush=True)
"#;

/// A program paced through its standard input: it prints `ready X` before each phase X and
/// waits for a line.
struct Paced {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Paced {
    fn spawn(command: &mut Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for `ready PHASE`.
    fn expect_ready(&mut self, phase: &str) {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), format!("ready {phase}"));
    }

    fn go(&mut self) {
        self.stdin.write_all(b"go\n").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The rest of its output, and that it exited with 0.
    fn finish(mut self) -> String {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the program ended with {status}: {rest}");
        rest
    }

    /// Runs every phase without attaching: the output of an untraced run.
    fn untraced(command: &mut Command) -> String {
        let mut p = Self::spawn(command);
        for phase in ["B", "C"] {
            p.expect_ready(phase);
            p.go();
        }
        p.finish()
    }
}

/// `allocview attach` running, its standard error read on a thread.
struct Attach {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Vec<String>,
}

impl Attach {
    fn start(pid: i32, out: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_allocview"))
            .args(["attach", &pid.to_string(), "-o", out.to_str().unwrap()])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut a = Self {
            child,
            lines,
            stderr: Vec::new(),
        };
        // Recording once it says so.
        loop {
            let line = a
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("attach said nothing: {:?}", a.stderr));
            a.stderr.push(line.clone());
            if line.starts_with("attached to process") {
                break;
            }
        }
        a
    }

    /// Waits for it to end (successfully); its standard error.
    fn wait(mut self) -> String {
        let status = self.child.wait().unwrap();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.stderr.push(line);
        }
        let text = self.stderr.join("\n");
        assert!(status.success(), "attach failed: {text}");
        text
    }

    /// SIGKILL: gone without a word to the process it attached to.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Ctrl-C: stops the recording and detaches.
    fn interrupt(self) -> String {
        let ok = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        self.wait()
    }
}

/// Successful allocations and frees in the trace, by size.
fn by_size(
    trace: &Path,
) -> (
    HashMap<u64, u64>,
    HashMap<u64, u64>,
    allocview_loaders::LoadSummary,
) {
    let t = load_binary(trace, &LoadOptions::default()).unwrap();
    let kind = t.events.column("kind").unwrap().u8().unwrap().clone();
    let size = t
        .events
        .column("size_bytes")
        .unwrap()
        .u64()
        .unwrap()
        .clone();
    let (mut allocs, mut frees) = (HashMap::new(), HashMap::new());
    for (k, s) in kind.into_no_null_iter().zip(size.into_no_null_iter()) {
        match EventKind::from_code(k) {
            Some(EventKind::Alloc) => *allocs.entry(s).or_insert(0) += 1,
            Some(EventKind::Free) => *frees.entry(s).or_insert(0) += 1,
            _ => {}
        }
    }
    (allocs, frees, t.summary)
}

fn stats_json(trace: &Path) -> serde_json::Value {
    let out = run(&["stats", "--json", trace.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_c_program_runs_through_attach_and_detach_and_its_window_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "phases", PHASES_C);
    let expected = Paced::untraced(&mut Command::new(&exe));
    assert!(expected.starts_with("checksum "), "{expected}");

    let trace = dir.path().join("phases.avt");
    let mut p = Paced::spawn(&mut Command::new(&exe));
    p.expect_ready("B");
    let attach = Attach::start(p.pid(), &trace, &[]);
    p.go();
    p.expect_ready("C");
    let said = attach.interrupt();
    assert!(said.contains("stopped by a signal"), "{said}");
    p.go();
    assert_eq!(p.finish(), expected);

    let (allocs, frees, summary) = by_size(&trace);
    // Phase B's allocations, exactly; none of phase A's or C's.
    assert_eq!(allocs.get(&34_567), Some(&7), "{allocs:?}");
    assert_eq!(allocs.get(&45_678), Some(&11), "{allocs:?}");
    assert_eq!(allocs.get(&56_789), Some(&1), "{allocs:?}");
    for size in [12_345, 23_456, 5_000, 67_890] {
        assert_eq!(allocs.get(&size), None, "{size}: {allocs:?}");
    }
    assert_eq!(frees.get(&45_678), Some(&11), "{frees:?}");
    assert_eq!(frees.get(&34_567), None, "{frees:?}");
    // The 8 blocks of phase A and the realloc's old block, freed while attached.
    assert!(summary.started_mid_run);
    assert_eq!(summary.frees_unknown, 0);
    assert!(summary.frees_before_recording >= 9, "{summary:?}");
    let stats = stats_json(&trace);
    assert_eq!(stats["frees_unknown"], 0);
    assert_eq!(
        stats["frees_before_recording"],
        summary.frees_before_recording
    );
    let text = String::from_utf8(run(&["stats", trace.to_str().unwrap()]).stdout).unwrap();
    assert!(
        text.contains("frees of blocks allocated before recording started"),
        "{text}"
    );
}

#[test]
fn a_process_attached_twice_records_each_window() {
    // The second attach finds the tracer the first loaded and reuses it; `--duration` ends it.
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "phases", PHASES_C);
    let mut p = Paced::spawn(&mut Command::new(&exe));
    p.expect_ready("B");
    let first = dir.path().join("first.avt");
    Attach::start(p.pid(), &first, &["--duration", "200ms"]).wait();
    let second = dir.path().join("second.avt");
    assert!(record_phase_b(p, &second).starts_with("checksum "));
    let (allocs, _, _) = by_size(&first);
    assert_eq!(allocs.get(&34_567), None);
    let (allocs, _, _) = by_size(&second);
    assert_eq!(allocs.get(&34_567), Some(&7), "{allocs:?}");
}

/// The phases program, built in `dir`: the output of an untraced run, and a run waiting to
/// start phase B.
fn phases_waiting_for_b(dir: &Path) -> (String, Paced) {
    let exe = build_c(dir, "phases", PHASES_C);
    let expected = Paced::untraced(&mut Command::new(&exe));
    let mut p = Paced::spawn(&mut Command::new(&exe));
    p.expect_ready("B");
    (expected, p)
}

/// Attaches to `p`, waiting for phase B, for phase B only, into `out`; lets it finish: its
/// output.
fn record_phase_b(mut p: Paced, out: &Path) -> String {
    let attach = Attach::start(p.pid(), out, &[]);
    p.go();
    p.expect_ready("C");
    attach.interrupt();
    p.go();
    p.finish()
}

/// The spool an attach's tracer has open in process `pid`, if any.
fn attach_spool_open_in(pid: i32) -> Option<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .find(|p| {
            let s = p.to_string_lossy();
            s.contains("/allocview-attach-") && s.ends_with(".spool")
        })
}

/// An `allocview attach` killed (SIGKILL, the OOM killer) cannot stop its recording: the
/// tracer sees its lock go and ends the run by itself, instead of recording into its spool
/// until the program ends (a disk filled by a service that runs for weeks) and refusing every
/// later attach as "being recorded already". The spool is left where it was.
#[test]
fn a_killed_attach_ends_its_recording_and_the_process_can_be_attached_again() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, p) = phases_waiting_for_b(dir.path());
    let killed = Attach::start(p.pid(), &dir.path().join("killed.avt"), &[]);
    let spool = attach_spool_open_in(p.pid()).expect("the attached run's spool is open");
    killed.kill();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while attach_spool_open_in(p.pid()).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the tracer still records into {} after its attach was killed",
            spool.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(spool.exists(), "the spool is left for the user");

    let second = dir.path().join("second.avt");
    assert_eq!(record_phase_b(p, &second), expected);
    let (allocs, _, _) = by_size(&second);
    assert_eq!(allocs.get(&34_567), Some(&7), "{allocs:?}");
    if let Some(d) = spool.parent() {
        std::fs::remove_dir_all(d).ok();
    }
}

#[test]
fn a_process_that_exits_while_attached_leaves_what_it_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "phases", PHASES_C);
    let trace = dir.path().join("exits.avt");
    let mut p = Paced::spawn(&mut Command::new(&exe));
    p.expect_ready("B");
    let attach = Attach::start(p.pid(), &trace, &[]);
    p.go();
    p.expect_ready("C");
    // No line for phase C: the program exits (status 3) while attached.
    let Paced {
        mut child, stdin, ..
    } = p;
    drop(stdin);
    assert_eq!(child.wait().unwrap().code(), Some(3));
    let said = attach.wait();
    assert!(said.contains("the process exited"), "{said}");
    let (allocs, frees, summary) = by_size(&trace);
    assert_eq!(allocs.get(&34_567), Some(&7), "{allocs:?}");
    assert_eq!(frees.get(&45_678), Some(&11), "{frees:?}");
    assert!(summary.started_mid_run);
}

/// Four threads allocate, reallocate and free as fast as they can until the test's line
/// comes; each keeps 64 blocks in a ring, freed and replaced in turn. The main thread waits
/// on standard input.
const THREADS_C: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static volatile int stop;
static void *work(void *arg) {
    long t = (long)arg;
    unsigned long n = 0;
    void *keep[64] = {0};
    for (long i = 0; !stop; i++) {
        int k = i % 64;
        free(keep[k]);
        keep[k] = malloc(100 + (i % 5000) + t);
        memset(keep[k], 1, 100);
        free(realloc(malloc(50), 3000));
        n++;
    }
    for (int k = 0; k < 64; k++) free(keep[k]);
    return (void *)n;
}
int main(void) {
    pthread_t th[4];
    char line[64];
    for (long t = 0; t < 4; t++) pthread_create(&th[t], NULL, work, (void *)t);
    printf("ready B\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 3;
    stop = 1;
    int all = 1;
    for (int t = 0; t < 4; t++) {
        void *n;
        pthread_join(th[t], &n);
        all &= n != NULL;
    }
    printf("every thread ran: %d\n", all);
    return 0;
}
"#;

#[test]
fn busy_threads_run_on_through_attach_and_detach() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "threads", THREADS_C);
    let trace = dir.path().join("threads.avt");
    let mut p = Paced::spawn(&mut Command::new(&exe));
    p.expect_ready("B");
    // Attached and detached while every thread allocates.
    let said = Attach::start(p.pid(), &trace, &["--duration", "100ms"]).wait();
    assert!(said.contains("the duration ended"), "{said}");
    p.go();
    assert_eq!(p.finish(), "every thread ran: 1\n");
    let t = load_binary(&trace, &LoadOptions::default()).unwrap();
    let s = &t.summary;
    assert!(s.events > 1000, "{s:?}");
    assert_eq!(s.frees_unknown, 0);
    assert_eq!(s.mallocs_of_live_ptr, 0);
    // At most each thread's 64 kept blocks and one block between its malloc and realloc.
    assert!((1..=4 * 65).contains(&s.frees_before_recording), "{s:?}");
    assert!(t.threads.height() >= 4, "{:?}", t.threads);
}

/// Debian's Python, else a pyenv 3.12.
fn python() -> PathBuf {
    let debian = PathBuf::from("/usr/bin/python3");
    if debian.exists() {
        return debian;
    }
    let home = std::env::var("HOME").unwrap();
    let versions = Path::new(&home).join(".pyenv/versions");
    std::fs::read_dir(&versions)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("3.12"))
        .map(|p| p.join("bin/python3"))
        .expect("a python3")
}

#[test]
fn a_python_program_runs_through_attach_and_detach_and_its_window_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("phases.py");
    std::fs::write(&script, PHASES_PY).unwrap();
    let py = python();
    let expected = Paced::untraced(Command::new(&py).arg(&script));
    assert!(expected.starts_with("checksum "), "{expected}");

    let trace = dir.path().join("phases.avt");
    let mut p = Paced::spawn(Command::new(&py).arg(&script));
    p.expect_ready("B");
    // Recording for long enough that phase B, a few milliseconds, falls inside; the test
    // waits for the duration to end before phase C.
    let attach = Attach::start(p.pid(), &trace, &["--duration", "3s"]);
    p.go();
    p.expect_ready("C");
    let said = attach.wait();
    assert!(said.contains("the duration ended"), "{said}");
    p.go();
    assert_eq!(p.finish(), expected);

    let (allocs, frees, summary) = by_size(&trace);
    assert_eq!(allocs.get(&1_234_568), Some(&5), "{allocs:?}");
    assert_eq!(frees.get(&1_234_568), Some(&5), "{frees:?}");
    for i in 0..4 {
        assert_eq!(allocs.get(&(2_000_001 + i)), Some(&1), "{allocs:?}");
    }
    assert_eq!(allocs.get(&1_000_001), None, "{allocs:?}");
    assert_eq!(allocs.get(&3_000_001), None, "{allocs:?}");
    assert_eq!(summary.frees_unknown, 0);
    // The three bytearrays of phase A, freed while attached.
    assert!(summary.frees_before_recording >= 3, "{summary:?}");
}

#[test]
fn attaching_without_ptrace_permission_says_why_and_what_to_do() {
    // A process of this user (root), attached by user nobody without capabilities.
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            env!("CARGO_BIN_EXE_allocview"),
            "attach",
            &sleeper.id().to_string(),
            "-o",
            // A folder that exists: refused at the attach, before anything is written.
            "/tmp/allocview-never-written.avt",
        ])
        .current_dir("/")
        .output()
        .unwrap();
    sleeper.kill().ok();
    sleeper.wait().ok();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("not allowed to trace process"), "{stderr}");
    assert!(stderr.contains("belongs to user 0"), "{stderr}");
    assert!(stderr.contains("--cap-add SYS_PTRACE"), "{stderr}");
    assert!(!Path::new("/tmp/allocview-never-written.avt").exists());
}

#[test]
fn attaching_to_no_process_says_so() {
    let stderr = fails(&["attach", &i32::MAX.to_string()]);
    assert!(
        stderr.contains(&format!("no process {}", i32::MAX)),
        "{stderr}"
    );
    let stderr = fails(&["attach", "0"]);
    assert!(stderr.contains("0 is not a process id"), "{stderr}");
}

/// An output that cannot be written is refused before the process is touched: a program
/// waiting on its standard input is never attached to, and runs on as it was.
#[test]
fn an_output_in_no_folder_is_refused_before_attaching() {
    let dir = tempfile::tempdir().unwrap();
    let (expected, mut p) = phases_waiting_for_b(dir.path());
    let nowhere = dir.path().join("no-such-folder").join("x.avt");
    let stderr = fails(&[
        "attach",
        &p.pid().to_string(),
        "-o",
        nowhere.to_str().unwrap(),
    ]);
    assert!(stderr.contains("is not a folder"), "{stderr}");
    assert!(!stderr.contains("attached to"), "{stderr}");
    p.go();
    p.expect_ready("C");
    p.go();
    assert_eq!(p.finish(), expected);
}
