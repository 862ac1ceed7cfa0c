//! allocview never destroys a user's file: the real binary, run as a careless user would.
//!
//! - An output that is the input (the same path, another spelling of it, a hard link, a
//!   symbolic link) is refused, and the input is left byte for byte as it was.
//! - A failing command leaves an existing output untouched and no temporary file behind.

// Test helpers may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// A fresh directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "allocview-data-safety-{test}-{}",
        std::process::id()
    ));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn allocview(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .output()
        .unwrap()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Runs a command that must fail; returns its stderr.
fn fails(args: &[&str]) -> String {
    let out = allocview(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
    stderr
}

/// Runs a command that must succeed; returns (stdout, stderr).
fn succeeds(args: &[&str]) -> (String, String) {
    let out = allocview(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{args:?} failed: {stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

/// The `.allocview-tmp-*` files left in `dir`.
fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".allocview-tmp-"))
        .collect()
}

/// A copy of a small bundled binary trace in `dir`; returns its path and bytes.
fn sample_trace(dir: &Path) -> (PathBuf, Vec<u8>) {
    let bytes = std::fs::read(repo("sample-traces/perl_hash.avt")).unwrap();
    let path = dir.join("a.avt");
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

#[test]
fn convert_refuses_an_output_that_is_its_input_however_it_is_named() {
    let dir = scratch("convert-same");
    let (input, original) = sample_trace(&dir);
    let hard = dir.join("hard.avt");
    std::fs::hard_link(&input, &hard).unwrap();
    let soft = dir.join("soft.trace.gz");
    std::os::unix::fs::symlink("a.avt", &soft).unwrap();
    let spelled = dir.join("sub/../a.avt");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    for out in [&input, &hard, &soft, &spelled] {
        for to in ["text", "binary"] {
            let err = fails(&["convert", p(&input), p(out), "--to", to]);
            assert!(err.contains("refusing to write"), "{out:?}: {err}");
            assert_eq!(std::fs::read(&input).unwrap(), original, "{out:?}");
        }
    }
    // The link itself as the input, the file as the output: refused the same way.
    let err = fails(&["convert", p(&hard), p(&input)]);
    assert!(err.contains("refusing to write"), "{err}");
    assert_eq!(std::fs::read(&input).unwrap(), original);
    assert!(leftovers(&dir).is_empty());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn plan_out_onto_its_input_is_refused() {
    let dir = scratch("plan-same");
    let (input, original) = sample_trace(&dir);
    let hard = dir.join("hard.avt");
    std::fs::hard_link(&input, &hard).unwrap();
    for out in [&input, &hard] {
        let err = fails(&[
            "plan",
            "--planner",
            "greedy-by-size",
            "--out",
            p(out),
            p(&input),
        ]);
        assert!(err.contains("refusing to write"), "{err}");
        assert_eq!(std::fs::read(&input).unwrap(), original);
    }
    // A real output is still written.
    let csv = dir.join("plan.csv");
    succeeds(&[
        "plan",
        "--planner",
        "greedy-by-size",
        "--out",
        p(&csv),
        p(&input),
    ]);
    assert!(std::fs::read_to_string(&csv).unwrap().contains(','));
    assert!(leftovers(&dir).is_empty());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn record_refuses_to_write_over_the_program_or_its_input_files() {
    let dir = scratch("record-same");
    let program = dir.join("true");
    std::fs::copy("/bin/true", &program).unwrap();
    let program_bytes = std::fs::read(&program).unwrap();
    let err = fails(&["record", "-o", p(&program), "--", p(&program)]);
    assert!(err.contains("refusing to write"), "{err}");
    assert_eq!(std::fs::read(&program).unwrap(), program_bytes);
    let data = dir.join("data.txt");
    std::fs::write(&data, "the user's data\n").unwrap();
    let err = fails(&["record", "-o", p(&data), "--", "cat", p(&data)]);
    assert!(err.contains("refusing to write"), "{err}");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "the user's data\n");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_failing_convert_leaves_an_existing_output_untouched() {
    let dir = scratch("convert-fail");
    let keep = dir.join("keep.avt");
    std::fs::write(&keep, b"a precious older trace").unwrap();
    // Garbage that is recognised as text and fails on its first line.
    let garbage = dir.join("garbage.bin");
    std::fs::write(&garbage, b"\x01\x02 not a trace at all\n\x7f\x00\xff").unwrap();
    fails(&["convert", p(&garbage), p(&keep)]);
    assert_eq!(std::fs::read(&keep).unwrap(), b"a precious older trace");
    // A binary trace cut in its header: fails too, still untouched.
    let (input, original) = sample_trace(&dir);
    let cut = dir.join("cut.avt");
    std::fs::write(&cut, &original[..9]).unwrap();
    fails(&["convert", p(&cut), p(&keep), "--to", "text"]);
    assert_eq!(std::fs::read(&keep).unwrap(), b"a precious older trace");
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
    // A good conversion replaces it.
    succeeds(&["convert", p(&input), p(&keep), "--to", "binary"]);
    assert_ne!(std::fs::read(&keep).unwrap(), b"a precious older trace");
    assert!(leftovers(&dir).is_empty());
    std::fs::remove_dir_all(&dir).ok();
}
