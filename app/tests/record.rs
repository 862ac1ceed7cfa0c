//! `allocview record` and `allocview convert` on real programs: C programs built here with
//! `cc`, Python, threads, fork, exec, signals. Every trace is checked with the loader: counts
//! match what the program did, each pointer is freed at most once and never before it was
//! allocated (no free of an unknown pointer, no allocation of a live one), threads are apart.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use allocview_loaders::binary::{self, TimeBase};
use allocview_loaders::events::{CALL_NAMES, Record};
use allocview_loaders::malloc_trace;
use allocview_loaders::{LoadOptions, Loaded, MallocTrace};
use polars::prelude::*;

mod common;
use common::run;

use common::build_c;

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("record-{name}"));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn load(path: &Path) -> MallocTrace {
    let Loaded::MallocTrace(t) = allocview_loaders::load(path, &LoadOptions::default()).unwrap()
    else {
        panic!("{} is not a malloc trace", path.display());
    };
    t
}

/// The rows of an event DataFrame.
#[derive(Debug, Clone, Copy)]
struct Row {
    thread: u16,
    kind: u8,
    size: u64,
    alloc_id: Option<u32>,
    call: &'static str,
}

fn rows(t: &MallocTrace) -> Vec<Row> {
    let e = &t.events;
    let thread = e.column("thread").unwrap().cast(&DataType::UInt16).unwrap();
    let thread: Vec<u16> = thread.u16().unwrap().into_no_null_iter().collect();
    let kind: Vec<u8> = e
        .column("kind")
        .unwrap()
        .u8()
        .unwrap()
        .into_no_null_iter()
        .collect();
    let size: Vec<u64> = e
        .column("size_bytes")
        .unwrap()
        .u64()
        .unwrap()
        .into_no_null_iter()
        .collect();
    let id: Vec<Option<u32>> = e
        .column("alloc_id")
        .unwrap()
        .u32()
        .unwrap()
        .iter()
        .collect();
    let call: Vec<u8> = e
        .column("call")
        .unwrap()
        .u8()
        .unwrap()
        .into_no_null_iter()
        .collect();
    (0..kind.len())
        .map(|i| Row {
            thread: thread[i],
            kind: kind[i],
            size: size[i],
            alloc_id: id[i],
            call: CALL_NAMES[call[i] as usize],
        })
        .collect()
}

const ALLOC: u8 = 0;
const FREE: u8 = 1;

/// The checks every traced run must pass: pairing is consistent and times never go back.
fn assert_consistent(t: &MallocTrace) {
    common::assert_pairing_clean(&t.summary);
    let mut freed: HashMap<u32, u32> = HashMap::new();
    for r in rows(t) {
        if r.kind == FREE {
            *freed.entry(r.alloc_id.unwrap()).or_default() += 1;
        }
    }
    assert!(freed.values().all(|&n| n == 1), "an allocation freed twice");
}

/// Allocations (and their frees) of exactly `size` bytes by `call`.
fn count(rows: &[Row], kind: u8, call: &str, size: u64) -> usize {
    rows.iter()
        .filter(|r| r.kind == kind && r.call == call && r.size == size)
        .count()
}

const COUNTS_C: &str = r#"
#include <stdlib.h>
#include <malloc.h>
#include <string.h>
int main(void) {
    void *p[100];
    for (int i = 0; i < 100; i++) p[i] = malloc(1000 + i);
    for (int i = 0; i < 100; i += 2) free(p[i]);
    char *c = calloc(7, 1111);
    for (int i = 1; i < 100; i += 2) p[i] = realloc(p[i], 5000 + i);
    void *a = NULL;
    posix_memalign(&a, 64, 3333);
    void *b = aligned_alloc(128, 4096);
    void *m = memalign(256, 2222);
    void *v = valloc(6666);
    void *r = reallocarray(NULL, 10, 777);
    free(NULL);
    free(c); free(a); free(b); free(m); free(v); free(r);
    for (int i = 1; i < 100; i += 2) if (i % 4 == 1) free(p[i]);
    return 0;
}
"#;

#[test]
fn counts_match_what_a_c_program_did() {
    let dir = scratch("counts");
    let exe = build_c(&dir, "counts", COUNTS_C);
    let out_path = dir.join("counts.avt");
    let out = run(&[
        "record",
        "-o",
        out_path.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]);
    assert_eq!(
        ok(&out),
        "",
        "the summary goes to stderr, stdout is the command's"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("explore: allocview stats"), "{stderr}");
    assert!(stderr.contains("1 threads"), "{stderr}");
    let t = load(&out_path);
    assert_consistent(&t);
    let r = rows(&t);
    let mallocs = (0..100)
        .filter(|i| count(&r, ALLOC, "malloc", 1000 + i) == 1)
        .count();
    assert_eq!(mallocs, 100);
    let freed_mallocs = (0..100)
        .step_by(2)
        .filter(|i| count(&r, FREE, "free", 1000 + i) == 1);
    assert_eq!(freed_mallocs.count(), 50);
    // realloc: a free of the old block and an allocation of the new one, both named realloc.
    let realloc_frees = (1..100)
        .step_by(2)
        .filter(|i| count(&r, FREE, "realloc", 1000 + i) == 1);
    assert_eq!(realloc_frees.count(), 50);
    let realloc_allocs = (1..100)
        .step_by(2)
        .filter(|i| count(&r, ALLOC, "realloc", 5000 + i) == 1);
    assert_eq!(realloc_allocs.count(), 50);
    let freed_reallocs = (1..100)
        .step_by(2)
        .filter(|i| count(&r, FREE, "free", 5000 + i) == 1);
    assert_eq!(freed_reallocs.count(), 25);
    for (call, size) in [
        ("calloc", 7 * 1111),
        ("posix_memalign", 3333),
        ("aligned_alloc", 4096),
        ("memalign", 2222),
        ("valloc", 6666),
        ("reallocarray", 7770),
    ] {
        assert_eq!(count(&r, ALLOC, call, size), 1, "{call}");
        assert_eq!(count(&r, FREE, "free", size), 1, "free of the {call} block");
    }
    assert!(t.summary.frees_null >= 1);
    assert_eq!(t.threads.height(), 1);
}

const THREADS_C: &str = r#"
#include <pthread.h>
#include <stdlib.h>
#define THREADS 4
#define N 20000
static void *handoff[THREADS][64];
static void *work(void *arg) {
    long t = (long)arg;
    for (int i = 0; i < N; i++) {
        void *p = malloc(100 + t);
        free(p);
    }
    /* Free blocks the main thread allocated: cross-thread frees. */
    for (int i = 0; i < 64; i++) free(handoff[t][i]);
    return NULL;
}
int main(void) {
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++)
        for (int i = 0; i < 64; i++) handoff[t][i] = malloc(50000 + t);
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, work, (void *)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    return 0;
}
"#;

#[test]
fn threads_are_separated_and_cross_thread_frees_pair_up() {
    let dir = scratch("threads");
    let exe = build_c(&dir, "threads", THREADS_C);
    let out_path = dir.join("threads.avt");
    ok(&run(&[
        "record",
        "-o",
        out_path.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]));
    let t = load(&out_path);
    assert_consistent(&t);
    assert_eq!(t.threads.height(), 5);
    let r = rows(&t);
    let main_thread = r.first().unwrap().thread;
    let mut worker_threads = Vec::new();
    for w in 0..4u64 {
        let mine: Vec<&Row> = r
            .iter()
            .filter(|x| x.kind == ALLOC && x.size == 100 + w)
            .collect();
        assert_eq!(mine.len(), 20000, "thread {w}");
        let th = mine[0].thread;
        assert!(
            mine.iter().all(|x| x.thread == th),
            "thread {w} mixed with others"
        );
        assert_ne!(th, main_thread);
        worker_threads.push(th);
        let handed: Vec<&Row> = r.iter().filter(|x| x.size == 50000 + w).collect();
        assert_eq!(handed.iter().filter(|x| x.kind == ALLOC).count(), 64);
        assert!(
            handed
                .iter()
                .filter(|x| x.kind == ALLOC)
                .all(|x| x.thread == main_thread)
        );
        let frees: Vec<&&Row> = handed.iter().filter(|x| x.kind == FREE).collect();
        assert_eq!(
            frees.len(),
            64,
            "every handed-off block is freed, and paired"
        );
        assert!(frees.iter().all(|x| x.thread == th));
    }
    worker_threads.sort_unstable();
    worker_threads.dedup();
    assert_eq!(worker_threads.len(), 4);
}

#[test]
fn blocks_handed_between_threads_in_one_arena_keep_their_exact_order() {
    let dir = scratch("handover");
    let exe = build_c(&dir, "handover", &common::handover_c(50_000));
    // The interleaving differs from run to run: several runs, each must be exact.
    for run in 0..3 {
        let out_path = dir.join(format!("handover-{run}.avt"));
        let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
            .args(["record", "-o", out_path.to_str().unwrap(), "--"])
            .arg(&exe)
            .env("MALLOC_ARENA_MAX", "1")
            .output()
            .unwrap();
        ok(&out);
        let t = load(&out_path);
        assert_consistent(&t);
        assert_eq!(t.threads.height(), 5, "run {run}");
        let r = rows(&t);
        // The program's blocks (pthread_create makes a few small allocations of its own).
        let allocs: Vec<&Row> = r
            .iter()
            .filter(|x| x.kind == ALLOC && x.call == "malloc" && x.size >= 1100)
            .collect();
        assert_eq!(allocs.len(), 4 * 50_000, "run {run}");
        let frees = r
            .iter()
            .filter(|x| x.kind == FREE && x.call == "free" && x.size >= 1100)
            .count();
        assert_eq!(frees, 4 * 50_000, "run {run}: every block is freed once");
        let mut worker_threads = Vec::new();
        for w in 0..4u64 {
            let mine: Vec<&&Row> = allocs.iter().filter(|x| x.size % 4 == w).collect();
            assert_eq!(mine.len(), 50_000, "run {run}, thread {w}");
            let th = mine[0].thread;
            assert!(
                mine.iter().all(|x| x.thread == th),
                "run {run}: thread {w} mixed with others"
            );
            worker_threads.push(th);
        }
        worker_threads.sort_unstable();
        worker_threads.dedup();
        assert_eq!(worker_threads.len(), 4, "run {run}");
    }
}

const FORK_EXEC_C: &str = r#"
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "after-exec") == 0) {
        for (int i = 0; i < 30; i++) free(malloc(44444));
        return 0;
    }
    for (int i = 0; i < 10; i++) free(malloc(11111));
    pid_t child = fork();
    if (child == 0) {
        for (int i = 0; i < 20; i++) free(malloc(22222));
        malloc(22223); /* never freed */
        _exit(0);
    }
    waitpid(child, NULL, 0);
    pid_t killed = fork();
    if (killed == 0) {
        for (int i = 0; i < 5; i++) malloc(33333);
        raise(SIGTERM); /* dies by the signal: the tracer flushes first */
        _exit(1);
    }
    waitpid(killed, NULL, 0);
    for (int i = 0; i < 10; i++) free(malloc(11112));
    char *args[] = {argv[0], "after-exec", NULL};
    execv(argv[0], args);
    return 1;
}
"#;

#[test]
fn fork_exec_and_signals_give_one_complete_file_per_process_image() {
    let dir = scratch("fork");
    let exe = build_c(&dir, "forker", FORK_EXEC_C);
    let out_path = dir.join("f.avt");
    let out = run(&[
        "record",
        "-o",
        out_path.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]);
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("recorded 4 processes"), "{stderr}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "avt"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "{files:?}");
    assert!(
        !dir.read_dir()
            .unwrap()
            .any(|e| { e.unwrap().file_name().to_string_lossy().contains("spool") })
    );
    let mut seen = HashMap::new();
    for f in &files {
        let t = load(f);
        assert_consistent(&t);
        let r = rows(&t);
        for size in [11111, 11112, 22222, 22223, 33333, 44444] {
            let n = count(&r, ALLOC, "malloc", size);
            if n > 0 {
                assert!(
                    seen.insert(size, (n, f.clone())).is_none(),
                    "{size} in two files"
                );
            }
        }
    }
    let n = |size| seen.get(&size).map(|(n, _)| *n);
    assert_eq!(n(11111), Some(10));
    assert_eq!(n(11112), Some(10));
    assert_eq!(n(22222), Some(20));
    assert_eq!(n(22223), Some(1));
    assert_eq!(n(33333), Some(5), "the SIGTERM handler flushed the buffer");
    assert_eq!(n(44444), Some(30));
    // The parent before exec and after exec share a pid but not a file; both name the pid.
    let (_, before) = &seen[&11111];
    let (_, after) = &seen[&44444];
    assert_ne!(before, after);
    assert_eq!(&seen[&11112].1, before);
    // Fork children are other processes with their own files.
    assert_ne!(&seen[&22222].1, before);
    assert_ne!(&seen[&33333].1, &seen[&22222].1);
}

const MAIN_EXITS_FIRST_C: &str = r#"
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
static void *work(void *arg) {
    usleep(200000);
    for (int i = 0; i < 100; i++) free(malloc(7777));
    return arg;
}
int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, work, NULL);
    pthread_exit(NULL); /* the process lives on until the worker returns */
}
"#;

#[test]
fn a_process_whose_main_thread_exits_first_still_ends_and_is_complete() {
    // The tracer's clock thread must not keep the process alive once the program's last
    // thread is gone, and the trace carries the clock's resolution.
    let dir = scratch("main-exits");
    let exe = build_c(&dir, "main_exits", MAIN_EXITS_FIRST_C);
    let out_path = dir.join("m.avt");
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["record", "-o", out_path.to_str().unwrap(), "--"])
        .arg(&exe)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(30) {
            child.kill().ok();
            panic!("the traced process did not end");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success());
    let t = load(&out_path);
    assert_consistent(&t);
    assert_eq!(count(&rows(&t), ALLOC, "malloc", 7777), 100);
    assert_eq!(count(&rows(&t), FREE, "free", 7777), 100);
    let mut meta = None;
    binary::read_records(&out_path, TimeBase::default(), |_| Ok(()))
        .map(|info| meta = info.meta_value("clock_resolution_ns").map(str::to_owned))
        .unwrap();
    assert_eq!(meta.as_deref(), Some("1000000"));
}

fn real_python() -> Option<PathBuf> {
    // pyenv's `python3` is a shell script that runs several processes: trace the interpreter.
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()?;
    let p = String::from_utf8(out.stdout).ok()?;
    Some(PathBuf::from(p.trim()))
}

#[test]
fn python_allocations_are_traced() {
    let Some(python) = real_python() else {
        panic!("python3 is needed for this test");
    };
    let dir = scratch("python");
    let out_path = dir.join("py.trace.gz");
    ok(&run(&[
        "record",
        "--text",
        "-o",
        out_path.to_str().unwrap(),
        "--",
        python.to_str().unwrap(),
        "-c",
        "blocks = [bytearray(200000 + i) for i in range(40)]\ndel blocks",
    ]));
    let t = load(&out_path);
    assert_consistent(&t);
    assert!(t.summary.has_call_column);
    let r = rows(&t);
    // bytearray(n) asks for n + 1 bytes (the trailing NUL), by malloc or calloc.
    let big: Vec<&Row> = r
        .iter()
        .filter(|x| x.kind == ALLOC && (200001..200041).contains(&x.size))
        .collect();
    assert_eq!(
        big.len(),
        40,
        "{:?}",
        big.iter().map(|x| x.size).collect::<Vec<_>>()
    );
    let big_frees = r
        .iter()
        .filter(|x| x.kind == FREE && (200001..200041).contains(&x.size))
        .count();
    assert_eq!(big_frees, 40);
    assert!(t.summary.events > 1000);
}

#[test]
fn an_unwritable_spool_leaves_the_program_running() {
    let so = Path::new(env!("OUT_DIR")).join("liballocview_tracer.so");
    let out = Command::new("sh")
        .args(["-c", "echo ran; exit 3"])
        .env("LD_PRELOAD", &so)
        .env("ALLOCVIEW_SPOOL", "/nonexistent-dir/x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("runs untraced"));
    // Without the variable the tracer stays silent and passes every call through.
    let out = Command::new("sh")
        .args(["-c", "echo ran"])
        .env("LD_PRELOAD", &so)
        .env_remove("ALLOCVIEW_SPOOL")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(out.stderr.is_empty());
}

/// `record` exits with the recorded command's status, as `time` does: its exit code, or the
/// signal that killed it plus 128, after writing the trace (it exited 0 whatever the command
/// did; issue 43).
#[test]
fn record_exits_with_the_commands_status_after_writing_the_trace() {
    let dir = scratch("status");
    for (name, body, expected) in [
        ("exits7", "return 7;", 7),
        ("segv", "raise(SIGSEGV); return 0;", 128 + 11),
        ("ok", "return 0;", 0),
    ] {
        let source = format!(
            "#include <signal.h>\n#include <stdlib.h>\n#include <string.h>\n\
             int main(void) {{ char *p = malloc(4096); memset(p, 1, 4096); free(p); {body} }}\n"
        );
        let exe = build_c(&dir, name, &source);
        let trace = dir.join(format!("{name}.avt"));
        let out = run(&[
            "record",
            "-o",
            trace.to_str().unwrap(),
            "--",
            exe.to_str().unwrap(),
        ]);
        assert_eq!(
            out.status.code(),
            Some(expected),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stats = ok(&run(&["stats", trace.to_str().unwrap(), "--json"]));
        let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
        assert!(v["mallocs"].as_u64().unwrap() >= 1, "{name}: {v}");
    }
}

fn text_records(path: &Path) -> Vec<Record> {
    let mut v = Vec::new();
    malloc_trace::read_text_records(path, &LoadOptions::default(), |r| {
        v.push(*r);
        Ok(())
    })
    .unwrap();
    v
}

fn binary_records(path: &Path) -> Vec<Record> {
    let mut v = Vec::new();
    binary::read_records(path, TimeBase::default(), |r| {
        v.push(*r);
        Ok(())
    })
    .unwrap();
    v
}

#[test]
fn convert_round_trips_losslessly_both_ways() {
    let dir = scratch("convert");
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces");
    for name in ["find_usr_include.trace.gz", "xz_T2_8KiB_blocks.trace.gz"] {
        let text = sample.join(name);
        let bin = dir.join(format!("{name}.avt"));
        let back = dir.join(format!("{name}.back.trace.gz"));
        let bin2 = dir.join(format!("{name}.back.avt"));
        ok(&run(&[
            "convert",
            text.to_str().unwrap(),
            bin.to_str().unwrap(),
        ]));
        ok(&run(&[
            "convert",
            bin.to_str().unwrap(),
            back.to_str().unwrap(),
        ]));
        ok(&run(&[
            "convert",
            back.to_str().unwrap(),
            bin2.to_str().unwrap(),
        ]));
        let original = text_records(&text);
        assert!(original.len() > 1000);
        assert_eq!(binary_records(&bin), original, "{name}: text -> binary");
        assert_eq!(text_records(&back), original, "{name}: binary -> text");
        assert_eq!(
            binary_records(&bin2),
            original,
            "{name}: text -> binary again"
        );
        // The binary form loads into exactly the text loader's DataFrame, and is smaller.
        let (a, b) = (load(&text), load(&bin));
        assert!(a.events.equals_missing(&b.events), "{name}: events differ");
        assert!(a.threads.equals(&b.threads), "{name}: threads differ");
        assert_eq!(a.summary.frees_unknown, b.summary.frees_unknown);
        let size = |p: &Path| std::fs::metadata(p).unwrap().len();
        assert!(
            size(&bin) < size(&text),
            "{name}: binary {} >= gzip text {}",
            size(&bin),
            size(&text)
        );
        // Whole-file text identity: the sample's lines come back byte for byte.
        let plain = dir.join(format!("{name}.txt"));
        ok(&run(&[
            "convert",
            "--to",
            "text",
            bin.to_str().unwrap(),
            plain.to_str().unwrap(),
        ]));
        let mut original_text = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::MultiGzDecoder::new(std::fs::File::open(&text).unwrap()),
            &mut original_text,
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(&plain).unwrap(),
            original_text,
            "{name}"
        );
    }
}

#[test]
fn convert_keeps_call_names_and_their_absence() {
    let dir = scratch("convert-calls");
    let text = dir.join("mixed.trace");
    let content = "0.000001\t7\t24\t0x1000\tcalloc\n\
                   0.000002\t7\t-1\t0x1000\n\
                   0.000003\t8\t-1\t(nil)\tfree\n\
                   0.000000500\t7\t96\t0x3000\trealloc\n";
    std::fs::write(&text, content).unwrap();
    let bin = dir.join("mixed.avt");
    let back = dir.join("mixed.back.trace");
    ok(&run(&[
        "convert",
        text.to_str().unwrap(),
        bin.to_str().unwrap(),
    ]));
    ok(&run(&[
        "convert",
        bin.to_str().unwrap(),
        back.to_str().unwrap(),
    ]));
    assert_eq!(std::fs::read_to_string(&back).unwrap(), content);
}

#[test]
fn bundled_recordings_load_cleanly() {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces");
    for (name, events, threads) in [
        ("python_json.avt", 7486, 1),
        ("perl_hash.avt", 28264, 1),
        ("xz_T2_libc.avt", 383, 3),
    ] {
        let t = load(&sample.join(name));
        assert_consistent(&t);
        assert_eq!(t.summary.events, events, "{name}");
        assert_eq!(t.threads.height(), threads, "{name}");
        assert!(t.summary.has_call_column, "{name}");
    }
}

/// The spool's start (`tick0`) is the clock word's time as the first events read it: a fresh
/// clock reading, masked, could be a 64 µs step later, and the first events then came before
/// the start, a negative time: `convert` of the spool an interrupted `record` leaves could not
/// write it as text (about half of all short runs). Eight short traced runs, each with a fair
/// chance of the step.
#[test]
fn no_event_comes_before_the_spools_start() {
    let Some(python) = real_python() else {
        panic!("python3 is needed for this test");
    };
    let so = Path::new(env!("OUT_DIR")).join("liballocview_tracer.so");
    let dir = scratch("tick0");
    for attempt in 0..8 {
        let prefix = dir.join(format!("run{attempt}"));
        let status = Command::new(&python)
            .args([
                "-c",
                "import json; [json.dumps({'a': [i] * 5}) for i in range(2000)]",
            ])
            .env("LD_PRELOAD", &so)
            .env("ALLOCVIEW_SPOOL", &prefix)
            .status()
            .unwrap();
        assert!(status.success());
        let spool = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().contains(&format!("run{attempt}.")))
            .unwrap();
        let text = dir.join(format!("run{attempt}.trace"));
        ok(&run(&[
            "convert",
            "--to",
            "text",
            spool.to_str().unwrap(),
            text.to_str().unwrap(),
        ]));
        assert!(text_records(&text).iter().all(|r| r.t_ns >= 0));
    }
}
