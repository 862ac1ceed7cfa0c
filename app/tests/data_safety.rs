//! allocview never destroys a user's file: the real binary, run as a careless user would.
//!
//! - An output that is the input (the same path, another spelling of it, a hard link, a
//!   symbolic link) is refused, and the input is left byte for byte as it was.
//! - A failing command leaves an existing output untouched and no temporary file behind.
//! - A binary trace damaged in the middle is an error naming the file and the offset, or, with
//!   `--lenient`, loads with what was lost and where counted; it is never called "truncated".
//! - `convert` never writes a binary trace that allocview would then refuse (too many threads).

// Test helpers may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{fails, repo, run};

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

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

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Runs a command that must succeed; returns (stdout, stderr).
fn succeeds(args: &[&str]) -> (String, String) {
    let out = run(args);
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

/// `record -o FILE` where the command names FILE too, plainly or after `=` and however it is
/// spelled, is refused before the command runs: the trace and the command's own output would
/// overwrite each other (issue 43).
#[test]
fn record_refuses_an_output_the_command_names_as_its_own() {
    let dir = scratch("record-named");
    let out = dir.join("out.txt");
    // The command writes the file its `--log=` names.
    let script = r#"for a; do case "$a" in --log=*) echo log > "${a#--log=}";; *) echo plain > "$a";; esac; done"#;
    let spelled = format!("{}/./out.txt", p(&dir));
    for arg in [
        format!("--log={}", p(&out)),
        format!("--log={spelled}"),
        p(&out).to_owned(),
        spelled.clone(),
    ] {
        let err = fails(&[
            "record",
            "-o",
            p(&out),
            "--",
            "sh",
            "-c",
            script,
            "sh",
            &arg,
        ]);
        assert!(err.contains("refusing to record into"), "{arg}: {err}");
        assert!(
            err.contains("the command names the same file"),
            "{arg}: {err}"
        );
        assert!(!out.exists(), "{arg}: the command ran");
    }
    // An existing file the command names after `=` is kept as it was.
    std::fs::write(&out, "the user's data\n").unwrap();
    let arg = format!("--log={}", p(&out));
    let err = fails(&[
        "record", "-o", &spelled, "--", "sh", "-c", script, "sh", &arg,
    ]);
    assert!(err.contains("refusing"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "the user's data\n");
    // Another file is fine.
    let other = dir.join("other.txt");
    let arg = format!("--log={}", p(&other));
    succeeds(&[
        "record",
        "-o",
        p(&dir.join("t.avt")),
        "--",
        "sh",
        "-c",
        script,
        "sh",
        &arg,
    ]);
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "log\n");
    std::fs::remove_dir_all(&dir).ok();
}

/// A command interrupted by SIGTERM or SIGINT while it writes removes its temporary file on
/// the way out and ends as the signal would have (a shell shows 128 + the signal); nothing of
/// the output is left (issue 43: the `.allocview-tmp-*` file stayed behind).
#[test]
fn an_interrupted_command_leaves_no_temporary_file() {
    use std::os::unix::process::ExitStatusExt as _;
    use std::time::{Duration, Instant};
    for (sig, number) in [("TERM", 15), ("INT", 2)] {
        let dir = scratch(&format!("interrupt-{sig}"));
        let out = dir.join("big.avt");
        // Far more records than it writes before the signal: it is mid-write when it comes.
        let mut child = Command::new(env!("CARGO_BIN_EXE_allocview"))
            .args(["splice", p(&repo("sample-traces/perl_hash.avt"))])
            .args(["--events", "4000000000", "--out", p(&out)])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while leftovers(&dir).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!leftovers(&dir).is_empty(), "{sig}: never started writing");
        std::thread::sleep(Duration::from_millis(200));
        let sent = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(sent.success());
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                child.kill().ok();
                panic!("{sig}: still running after the signal");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let shown = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap());
        assert_eq!(shown, 128 + number, "{sig}: {status}");
        assert_eq!(leftovers(&dir), Vec::<String>::new(), "{sig}");
        assert!(!out.exists(), "{sig}");
        std::fs::remove_dir_all(&dir).ok();
    }
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

/// A text trace of `events` allocations over `threads` threads.
fn text_trace(path: &Path, events: u64, threads: u64) {
    let mut text = String::new();
    for i in 0..events {
        writeln!(
            text,
            "{}.{:06}\t{}\t{}\t0x{:x}",
            i / 1_000_000,
            i % 1_000_000,
            1000 + i % threads,
            16 + i % 64,
            0x10_0000 + i * 16
        )
        .unwrap();
    }
    std::fs::write(path, text).unwrap();
}

/// The frames of a binary trace: (offset, tag, payload length).
fn frames_of(bytes: &[u8]) -> Vec<(usize, u8, usize)> {
    let mut out = Vec::new();
    let mut pos = 10;
    while pos + 5 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[pos + 1..pos + 5].try_into().unwrap()) as usize;
        out.push((pos, bytes[pos], len));
        pos += 5 + len;
    }
    out
}

fn stats_json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap()
}

#[test]
fn a_binary_trace_damaged_in_the_middle_says_what_was_lost_and_where() {
    let dir = scratch("damaged");
    let text = dir.join("t.trace");
    text_trace(&text, 200_000, 4);
    let good = dir.join("good.avt");
    succeeds(&["convert", p(&text), p(&good)]);
    let bytes = std::fs::read(&good).unwrap();
    let blocks: Vec<_> = frames_of(&bytes)
        .into_iter()
        .filter(|f| f.1 == 0x03)
        .collect();
    assert_eq!(blocks.len(), 4, "65,536 events a block");
    let (at, _, len) = blocks[1];

    // One corrupt frame length: strict names the file and the offset; lenient repairs it.
    let mut bad_len = bytes.clone();
    bad_len[at + 1..at + 5].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
    let path = dir.join("bad-length.avt");
    std::fs::write(&path, &bad_len).unwrap();
    let err = fails(&["stats", p(&path)]);
    assert!(err.contains(&format!("at byte {at}")), "{err}");
    assert!(err.contains("bad-length.avt"), "{err}");
    let (out, warn) = succeeds(&["stats", "--json", "--lenient", p(&path)]);
    assert_eq!(stats_json(&out)["events"], 200_000, "{warn}");
    assert!(warn.contains("nothing lost"), "{warn}");
    assert!(!warn.contains("truncated"), "{warn}");

    // A damaged block: skipped, the blocks after it read, the loss counted.
    let mut bad_block = bytes.clone();
    let mid = at + 5 + len / 2;
    bad_block[mid..mid + 32].fill(0);
    let path = dir.join("bad-block.avt");
    std::fs::write(&path, &bad_block).unwrap();
    let err = fails(&["stats", p(&path)]);
    assert!(err.contains(&format!("at byte {at}")), "{err}");
    let (out, warn) = succeeds(&["stats", "--json", "--lenient", p(&path)]);
    assert_eq!(stats_json(&out)["events"], 200_000 - 65_536, "{warn}");
    assert!(warn.contains("65536 events lost"), "{warn}");
    assert!(warn.contains(&format!("byte {at}")), "{warn}");
    assert!(!warn.contains("truncated"), "{warn}");

    // convert reads the same way: strict refuses, lenient converts what is there and says so.
    let back = dir.join("back.trace");
    let err = fails(&["convert", p(&path), p(&back)]);
    assert!(err.contains(&format!("at byte {at}")), "{err}");
    assert!(!back.exists());
    let (_, warn) = succeeds(&["convert", "--lenient", p(&path), p(&back)]);
    assert!(warn.contains("65536 events lost"), "{warn}");
    let lines = std::fs::read_to_string(&back).unwrap().lines().count();
    assert_eq!(lines, 200_000 - 65_536);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn convert_never_writes_a_binary_trace_allocview_would_refuse() {
    let dir = scratch("threads");
    // The most threads allocview loads: converts and loads back.
    let most = dir.join("most.trace");
    text_trace(&most, 65_536, 65_536);
    let most_avt = dir.join("most.avt");
    succeeds(&["convert", p(&most), p(&most_avt)]);
    let (out, _) = succeeds(&["stats", "--json", p(&most_avt)]);
    assert_eq!(stats_json(&out)["threads"], 65_536);
    // One more: refused before anything is written, with the reason.
    let over = dir.join("over.trace");
    text_trace(&over, 65_537, 65_537);
    let over_avt = dir.join("over.avt");
    let err = fails(&["convert", p(&over), p(&over_avt)]);
    assert!(err.contains("at most 65536 threads"), "{err}");
    assert!(!over_avt.exists());
    // Over an existing file: left as it was.
    std::fs::write(&over_avt, b"older").unwrap();
    fails(&["convert", p(&over), p(&over_avt)]);
    assert_eq!(std::fs::read(&over_avt).unwrap(), b"older");
    assert!(leftovers(&dir).is_empty());
    std::fs::remove_dir_all(&dir).ok();
}
