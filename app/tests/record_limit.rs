//! `allocview record --limit` (and `--fail-nth`, `--fail-rate --seed`) on C programs built here:
//! one handles allocation failure, one does not. The failures the program saw must be the
//! failed allocations in its trace, and `record` must say how the program ended.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use allocview_loaders::{LoadOptions, Loaded};

const HANDLES: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    void *blocks[64];
    int n = 0, failed = 0, enomem = 0;
    for (int i = 0; i < 64; i++) {
        errno = 0;
        void *p = (i % 2) ? calloc(1, 1 << 20) : malloc(1 << 20);
        if (p == NULL) { failed++; enomem += errno == ENOMEM; continue; }
        memset(p, 1, 1 << 20);
        blocks[n++] = p;
    }
    for (int i = 0; i < n; i++) free(blocks[i]);
    printf("got %d failed %d enomem %d\n", n, failed, enomem);
    fflush(stdout);
    return failed > 0 ? 3 : 0;
}
"#;

const CRASHES: &str = r#"
#include <stdlib.h>
#include <string.h>
int main(void) {
    for (int i = 0; i < 64; i++) {
        char *p = malloc(1 << 20);
        memset(p, 1, 1 << 20);
    }
    return 0;
}
"#;

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("record-limit-{name}"));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn build_c(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let exe = dir.join(name);
    let out = Command::new("cc")
        .args(["-O0", "-fno-builtin", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("cc must be installed (build-essential)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Records `exe`; `allocview` exits with the program's status (128 + a signal's number when
/// one killed it), which must be `status`.
fn record(trace: &Path, flags: &[&str], exe: &Path, status: i32) -> Output {
    let mut args: Vec<String> = vec!["record".into(), "-o".into(), trace.display().to_string()];
    args.extend(flags.iter().map(|s| (*s).to_owned()));
    args.push("--".into());
    args.push(exe.display().to_string());
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(&args)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(status),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// (got, failed, failed with ENOMEM) as the program printed them.
fn counts(out: &Output) -> (u64, u64, u64) {
    let text = String::from_utf8_lossy(&out.stdout);
    let w: Vec<u64> = text
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    (w[0], w[1], w[2])
}

/// Failed allocations of 1 MiB in the trace.
fn failed_in_trace(path: &Path) -> u64 {
    let Loaded::MallocTrace(t) = allocview_loaders::load(path, &LoadOptions::default()).unwrap()
    else {
        panic!("not a malloc trace");
    };
    let kind = t.events.column("kind").unwrap().u8().unwrap().clone();
    let size = t
        .events
        .column("size_bytes")
        .unwrap()
        .u64()
        .unwrap()
        .clone();
    kind.iter()
        .zip(size.iter())
        .filter(|&(k, s)| k == Some(4) && s == Some(1 << 20))
        .count() as u64
}

#[test]
fn a_program_that_handles_failure_sees_enomem_past_the_limit() {
    let dir = scratch("handles");
    let exe = build_c(&dir, "handles", HANDLES);
    let trace = dir.join("h.avt");
    let out = record(&trace, &["--limit", "10MiB"], &exe, 3);
    let (got, failed, enomem) = counts(&out);
    // Blocks of 1 MiB (and a little) under 10 MiB: nine fit, the other 55 fail, all with
    // ENOMEM, and every one is in the trace.
    assert_eq!((got, failed, enomem), (9, 55, 55));
    assert_eq!(failed_in_trace(&trace), failed);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exited with status 3"), "{err}");
    assert!(err.contains("55 failed allocations"), "{err}");
    if cfg!(target_arch = "x86_64") {
        assert!(
            err.contains("      main"),
            "the first failure's stack: {err}"
        );
    }
    // Without a limit nothing fails.
    let out = record(&trace, &[], &exe, 0);
    assert_eq!(counts(&out), (64, 0, 0));
}

#[test]
fn a_program_that_does_not_check_is_killed_and_the_failure_reported() {
    let dir = scratch("crashes");
    let exe = build_c(&dir, "crashes", CRASHES);
    let trace = dir.join("c.avt");
    let out = record(&trace, &["--limit", "10MiB"], &exe, 128 + 11);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("killed by signal 11 (SIGSEGV)"), "{err}");
    assert!(err.contains("1 failed allocation;"), "{err}");
    assert_eq!(failed_in_trace(&trace), 1);
}

#[test]
fn fault_injection_by_call_number_and_by_seeded_rate() {
    let dir = scratch("inject");
    let exe = build_c(&dir, "handles", HANDLES);
    let trace = dir.join("i.avt");
    let out = record(&trace, &["--fail-nth", "3"], &exe, 3);
    assert_eq!(counts(&out), (63, 1, 1));
    assert_eq!(failed_in_trace(&trace), 1);
    let a = counts(&record(
        &trace,
        &["--fail-rate", "0.5", "--seed", "7"],
        &exe,
        3,
    ));
    let b = counts(&record(
        &trace,
        &["--fail-rate", "0.5", "--seed", "7"],
        &exe,
        3,
    ));
    assert_eq!(a, b, "the same seed fails the same calls");
    assert!(a.1 > 10 && a.1 < 54, "{a:?}");
    assert_eq!(failed_in_trace(&trace), b.1);
}
