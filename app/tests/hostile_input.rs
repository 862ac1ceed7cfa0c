//! Hostile and careless input, through the real binary (issue 20).
//!
//! - Every command, given every input the fuzzer found a problem with
//!   (`fuzz/regressions/TARGET/`, made into the file its target loads) and a few crafted files,
//!   exits within a time limit and under a memory limit, with a result or a clear error (a
//!   line starting `error:`), never a panic, an abort or a hang.
//! - The messages of item 15: a CSV with a misspelled column, `convert` on what it does not
//!   read, a missing file, a binary file cut inside its header.

// Test helpers may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use allocview_loaders::binary::crafted;
use allocview_loaders::fuzzing::{Target, file_bytes};

/// Address space allowed to one command (`ulimit -v`, KiB): 2 GiB, as for the fuzzer.
const MEMORY_LIMIT_KIB: u64 = 2 << 20;
/// Wall time allowed to one command (a debug build on a busy two-core machine).
const TIME_LIMIT: Duration = Duration::from_secs(120);

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("allocview-hostile-{test}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs allocview under the memory limit; kills it past the time limit. Returns (exit status
/// success, stderr), or an error saying what went wrong with the run itself.
fn run_limited(args: &[&str]) -> Result<(bool, String), String> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {MEMORY_LIMIT_KIB}; exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > TIME_LIMIT {
            child.kill().ok();
            child.wait().ok();
            return Err(format!("{args:?}: still running after {TIME_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    if status.code().is_none() {
        return Err(format!("{args:?}: killed by a signal ({status}): {stderr}"));
    }
    Ok((status.success(), stderr))
}

/// The crafted files: one per problem the issue names that a fuzzer would take long to find.
fn crafted(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        files.push(p);
    };
    add(
        "wrap.trace",
        b"0.000001\t1\t18446744073709551600\t0x1000\n0.000002\t1\t100\t0x2000\n".to_vec(),
    );
    add(
        "huge_request.trace",
        b"0.000001\t1\t18446744073709551600\t0x1000\n0.000002\t1\t-1\t0x1000\n".to_vec(),
    );
    // 1 TiB: the OS swap baseline of `spill` would track 2^28 pages.
    add(
        "one_tib.trace",
        b"0.000001\t1\t1099511627776\t0x1000\n0.000002\t1\t-1\t0x1000\n".to_vec(),
    );
    add(
        "dump_u64max.log",
        b"I0000 00:00:1.0 1 bfc_allocator.cc:1049] BFCAllocator dump for A\n\
          I0000 00:00:1.0 1 bfc_allocator.cc:1085] Next region of size 2048\n\
          I0000 00:00:1.0 1 bfc_allocator.cc:1085] InUse at 1000 of size 1024 next 1\n\
          I0000 00:00:1.0 1 bfc_allocator.cc:1085] InUse at 1400 of size 18446744073709551615 next 2\n"
            .to_vec(),
    );
    add(
        "misspelled.csv",
        b"id,lower,upper,sise\n0,0,1,10\n".to_vec(),
    );
    add("cut_header.avt", b"\x89AVT\r\n\x1a\n\x01".to_vec());
    // Block bombs and INDEX frames that do not describe the blocks (issue 43).
    add("block_bomb.avt", crafted::block_decompression_bomb());
    add("block_claim.avt", crafted::block_claim_unsized());
    add("blocks_over_limit.avt", crafted::blocks_over_format_limit());
    add("index_dup.avt", crafted::index_duplicated_block());
    add("index_skip.avt", crafted::index_skips_a_block());
    add("index_end.avt", crafted::index_end_disagrees());
    add("index_times.avt", crafted::index_lying_times());
    add(
        "block_damaged_end_agrees.avt",
        crafted::damaged_block_end_agrees(),
    );
    add("empty", Vec::new());
    files
}

/// Every input of `fuzz/regressions/`, as the file its target loads.
fn regressions(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(targets) = std::fs::read_dir(repo("fuzz/regressions")) else {
        return files;
    };
    for t in targets {
        let t = t.unwrap().path();
        let target = Target::from_name(&t.file_name().unwrap().to_string_lossy()).unwrap();
        for f in std::fs::read_dir(&t).unwrap() {
            let f = f.unwrap().path();
            let out = dir.join(format!(
                "{}-{}",
                target.name(),
                f.file_name().unwrap().to_string_lossy()
            ));
            std::fs::write(&out, file_bytes(target, &std::fs::read(&f).unwrap())).unwrap();
            files.push(out);
        }
    }
    files.sort();
    files
}

#[test]
fn every_command_on_every_hostile_input_ends_clearly_within_limits() {
    let dir = scratch("sweep");
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let mut inputs = crafted(&dir);
    inputs.extend(regressions(&dir));
    let converted = out_dir.join("converted.avt");
    let svg = out_dir.join("flame.svg");
    let report = out_dir.join("report");
    let mut problems = Vec::new();
    for input in &inputs {
        let f = s(input);
        let commands: Vec<Vec<&str>> = vec![
            vec!["stats", f],
            vec!["compare", "--jobs", "1", f],
            vec!["plan", f],
            vec!["convert", f, s(&converted)],
            vec!["sites", f],
            vec!["leaks", f],
            vec!["flamegraph", "-o", s(&svg), f],
            vec!["diff", f, f],
            vec!["spill", "--limit", "1MiB", f],
            vec!["predict", f],
            vec!["report", "--out", s(&report), f],
        ];
        for args in &commands {
            match run_limited(args) {
                Ok((true, _)) => {}
                Ok((false, stderr)) => {
                    // Warnings may come first; the failure itself is one `error:` line.
                    if !stderr.lines().any(|l| l.starts_with("error: "))
                        || stderr.contains("panicked")
                    {
                        problems.push(format!("{args:?}: unclear failure: {stderr}"));
                    }
                }
                Err(why) => problems.push(why),
            }
            std::fs::remove_file(&converted).ok();
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs a command that must fail (no limit needed); returns its stderr.
fn fails(args: &[&str]) -> String {
    let (ok, stderr) = run_limited(args).unwrap();
    assert!(!ok, "{args:?} succeeded: {stderr}");
    stderr
}

#[test]
fn a_csv_with_a_misspelled_column_names_it_and_the_columns_expected() {
    let dir = scratch("csv");
    let csv = dir.join("plan.csv");
    std::fs::write(&csv, "id,lower,upper,sise\n0,0,1,10\n").unwrap();
    let e = fails(&["plan", s(&csv)]);
    assert!(e.contains("unknown column \"sise\" (column 16)"), "{e}");
    assert!(e.contains("no size column"), "{e}");
    assert!(
        e.contains("a header needs id, lower, upper (or end) and size"),
        "{e}"
    );
    // What else plan reads is listed too.
    assert!(
        e.contains("a JSON graph plan") && e.contains("libtracemalloc trace"),
        "{e}"
    );
    // convert says what it converts, not that a time field is bad.
    let e = fails(&["convert", s(&csv), s(&dir.join("out.avt"))]);
    assert!(
        e.contains("`allocview convert` converts malloc traces"),
        "{e}"
    );
    assert!(!e.contains("time field"), "{e}");
    assert!(!dir.join("out.avt").exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn convert_names_what_it_reads_for_a_tensorflow_log() {
    let dir = scratch("tf");
    let e = fails(&[
        "convert",
        s(&repo("loaders/tests/data/tf/public_alexnet-k40c-2017.txt")),
        s(&dir.join("out.avt")),
    ]);
    assert!(
        e.contains("`allocview convert` converts malloc traces"),
        "{e}"
    );
    assert!(e.contains("a TensorFlow BFC dump"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_missing_file_is_named_once_with_its_os_error_once() {
    let dir = scratch("missing");
    let missing = dir.join("nope.trace");
    for args in [
        vec!["stats", s(&missing)],
        vec!["convert", s(&missing), s(&dir.join("o.avt"))],
        vec!["plan", s(&missing)],
    ] {
        let e = fails(&args);
        assert_eq!(
            e.matches("No such file or directory").count(),
            1,
            "{args:?}: {e}"
        );
        assert_eq!(e.matches("nope.trace").count(), 1, "{args:?}: {e}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn binary_header_errors_say_what_is_there_in_words() {
    let dir = scratch("header");
    let cut = dir.join("cut.avt");
    std::fs::write(&cut, b"\x89AVT\r\n\x1a\n\x01").unwrap();
    let cut_error = fails(&["stats", s(&cut)]);
    assert!(
        cut_error.contains("byte 9: unknown allocview file kind none (the file ends)"),
        "{cut_error}"
    );
    let v9 = dir.join("v9.avt");
    std::fs::write(&v9, b"\x89AVT\r\n\x1a\n\x09\x00").unwrap();
    let v9_error = fails(&["stats", s(&v9)]);
    assert!(
        v9_error.contains("byte 8: unsupported allocview binary version 9"),
        "{v9_error}"
    );
    for e in [&cut_error, &v9_error] {
        assert!(!e.contains("Some(") && !e.contains("None"), "{e}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs allocview with `ALLOCVIEW_AVAILABLE_MEMORY` set; returns (success, stderr).
fn run_with_memory(available_bytes: u64, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .env("ALLOCVIEW_AVAILABLE_MEMORY", available_bytes.to_string())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A few kilobytes of zstd blocks holding millions of events, with no INDEX frame: the
/// choice to stream, and the refusal to load, count the events the blocks declare, before
/// anything is loaded (the file's size, or a missing index, said it was small).
#[test]
fn a_trace_whose_blocks_hold_more_events_than_fit_streams_or_is_refused_before_loading() {
    let dir = scratch("blocks-many");
    let trace = dir.join("many.avt");
    // 64 blocks of 65,536 events: 4,194,304 events, about 160 MiB loaded, in 3 KB.
    std::fs::write(&trace, crafted::blocks_many(64, false)).unwrap();
    let available_bytes = 100_000_000;
    let (ok, stderr) = run_with_memory(available_bytes, &["plan", s(&trace)]);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("holds 4,194,304 events"), "{stderr}");
    let (ok, stderr) = run_with_memory(available_bytes, &["stats", s(&trace)]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("streaming it block by block"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A block copied and left out of the INDEX frame: `stats` streamed by the index and loaded
/// from the blocks would count different events; both refuse, naming the block's offset.
#[test]
fn stats_streamed_or_loaded_refuses_an_index_that_does_not_describe_the_blocks() {
    let dir = scratch("index-dup");
    let trace = dir.join("dup.avt");
    std::fs::write(&trace, crafted::index_duplicated_block()).unwrap();
    for args in [
        vec!["stats", s(&trace)],
        vec!["stats", "--stream", s(&trace)],
        vec!["stats", "--no-stream", s(&trace)],
    ] {
        let stderr = fails(&args);
        assert!(
            stderr.contains("byte 2184: the EVENTS block at byte 2184 is not in the INDEX"),
            "{args:?}: {stderr}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
