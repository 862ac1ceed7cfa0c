//! What the command-line tests share: running the binary, reading its JSON, the repository's
//! files, and the programs the record tests build.

// Each test binary uses some of these, none all of them.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub mod tmux;

/// A path in the repository, from its root.
pub fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// A path in the repository, as an argument.
pub fn repo_arg(rel: &str) -> String {
    repo(rel).display().to_string()
}

/// A bundled sample trace (`sample-traces/NAME`).
pub fn sample(name: &str) -> PathBuf {
    repo("sample-traces").join(name)
}

/// A sample PyTorch snapshot (`sample-traces/pytorch/NAME.pickle`), as an argument.
pub fn snapshot(name: &str) -> String {
    repo(&format!("sample-traces/pytorch/{name}.pickle"))
        .display()
        .to_string()
}

/// Runs allocview with `args`, whatever its status.
pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .output()
        .unwrap()
}

/// Runs allocview, which must succeed; its standard output.
pub fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs allocview, which must fail; its standard error.
pub fn fails(args: &[&str]) -> String {
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
    stderr
}

/// Runs allocview, which must succeed; its standard output as JSON.
pub fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(args)).unwrap()
}

/// Producer/consumer hand-over under one shared arena (run with `MALLOC_ARENA_MAX=1`): four
/// threads each allocate `ITERS` blocks of 1100 bytes and more (past the tcache's reach of
/// small sizes, so freed blocks go back to the arena that all threads share) and pass them
/// through a mutex-guarded stack; whoever takes a block frees it. Within one millisecond the
/// threads take turns on the same addresses many times. Thread `t` allocates the sizes equal
/// to `t` modulo 4.
const HANDOVER_C: &str = r#"
#include <pthread.h>
#include <stdlib.h>
#define THREADS 4
#define ITERS @ITERS@
#define QCAP 1024
static void *queue[QCAP];
static int qlen;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *work(void *arg) {
    long t = (long)arg;
    for (int i = 0; i < ITERS; i++) {
        void *p = malloc(1100 + 4 * (i % 256) + t);
        void *q = NULL;
        pthread_mutex_lock(&lock);
        if (qlen == QCAP || (qlen > 0 && (i & 1))) q = queue[--qlen];
        if (qlen < QCAP) queue[qlen++] = p; else q = p;
        pthread_mutex_unlock(&lock);
        free(q);
    }
    return NULL;
}
int main(void) {
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, work, (void *)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    while (qlen > 0) free(queue[--qlen]);
    return 0;
}
"#;

/// [`HANDOVER_C`] with `iters` blocks a thread.
pub fn handover_c(iters: u32) -> String {
    HANDOVER_C.replace("@ITERS@", &iters.to_string())
}

/// Compiles a C program with `cc -pthread`, without builtins: the compiler may otherwise drop
/// an allocation whose block is never used.
pub fn build_c(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let exe = dir.join(name);
    let out = Command::new("cc")
        .args(["-O0", "-fno-builtin", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("cc must be installed (build-essential)");
    assert!(out.status.success(), "{out:?}");
    exe
}

/// The loader's pairing found nothing amiss: no free of a pointer never allocated, no
/// allocation of a live one, no time going back, nothing cut.
/// Frees of Python objects allocated before the tracer joined the interpreter (in its
/// start-up) are known and counted apart, not amiss.
pub fn assert_pairing_clean(s: &allocview_loaders::LoadSummary) {
    assert_eq!(
        s.frees_unknown - s.frees_unknown_python,
        0,
        "a free of a pointer never allocated"
    );
    assert_eq!(
        s.mallocs_of_live_ptr, 0,
        "an allocation of a pointer still live"
    );
    assert_eq!(s.timestamps_non_monotonic, 0, "times went backwards");
    assert!(s.truncated.is_none(), "{:?}", s.truncated);
}

/// Whether `tool` runs; a missing one skips the test, unless CI asks for every tool
/// (`ALLOCVIEW_REQUIRE_TEST_INPUTS`, set by `.ci/run`, which installs them): then it fails.
pub fn require_tool(tool: &str, args: &[&str], install: &str) -> bool {
    let found = Command::new(tool)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("ALLOCVIEW_REQUIRE_TEST_INPUTS").is_none(),
            "a required test tool is missing: {tool} ({install})"
        );
        eprintln!("skipping: {tool} is missing ({install})");
    }
    found
}

/// `go tool pprof -top` of `profile` for `index`: bytes (flat) by function, and the total.
pub fn pprof_top(profile: &Path, index: &str) -> (HashMap<String, u64>, u64) {
    let out = Command::new("go")
        .args([
            "tool",
            "pprof",
            "-top",
            "-unit=B",
            "-nodefraction=0",
            "-nodecount=100000",
        ])
        .arg(format!("-sample_index={index}"))
        .arg(profile)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let total = text
        .lines()
        .find_map(|l| {
            l.split(" of ")
                .nth(1)?
                .strip_suffix("B total")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no total in {text}"));
    let mut flat = HashMap::new();
    for line in text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
    {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [f, _, _, _, _, name @ ..] = fields.as_slice() else {
            continue;
        };
        let bytes: u64 = f.trim_end_matches('B').parse().unwrap();
        if bytes > 0 {
            *flat.entry(name.join(" ")).or_insert(0) += bytes;
        }
    }
    (flat, total)
}
