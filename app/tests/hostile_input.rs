//! Hostile and careless input, through the real binary (issue 20).
//!
//! - Every command, given every input the fuzzer found a problem with
//!   (`fuzz/regressions/TARGET/`, made into the file its target loads) and a few crafted files,
//!   exits within a time limit and under a memory limit, with a result or a clear error (a
//!   line starting `error:`), never a panic, an abort or a hang. Twice: under a 2 GiB address
//!   space (a reservation by a header's claim fails at once), then with no limit, checking the
//!   resident memory each run reached stays under 2 GiB (these files are all under 1 MB).
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
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    run_guarded(&args, Guard::AddressSpace, &std::env::temp_dir())
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
    // Stacks whose inline frames multiply into billions of frames (issue 43).
    add("stacks_inline_bomb.avt", crafted::stacks_inline_bomb());
    // heaptrack: a call tree 20,000 nodes deep with an allocation at every node (stacks of
    // 200 million frames if nothing cut them).
    let mut deep = String::from("v 10400 3\ns 4 main\ni 1000 0 1\n");
    for n in 1..=20_000u32 {
        deep.push_str(&format!("t 1 {:x}\na 10 {n:x}\n+ {:x}\n", n - 1, n - 1));
    }
    add("heaptrack_deep.txt", deep.into_bytes());
    // memray captures: a decompressed stream cut inside a record, with a version no reader
    // knows, with an unknown record type where a record starts; an LZ4 frame cut mid-block.
    let raw = std::fs::read(repo("loaders/tests/data/memray/tiny13raw.bin")).unwrap();
    add("memray_cut.bin", raw[..raw.len() / 3].to_vec());
    let mut v99 = raw.clone();
    v99[7] = 99;
    add("memray_v99.bin", v99);
    let mut bad_type = raw.clone();
    bad_type[raw.len() / 4] = 0x03;
    add("memray_bad_byte.bin", bad_type);
    let lz4 = std::fs::read(repo("sample-traces/memray/threads13.bin")).unwrap();
    add("memray_lz4_cut.bin", lz4[..lz4.len() * 2 / 3].to_vec());
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

/// Every command and the options that take another road through the code (streamed or loaded,
/// strict or lenient, one replay thread or several, each output form), on one input. The
/// explorers are opened through `bench explorer`, which loads the input as `allocview FILE`
/// does and seeks and redraws its view-model without a terminal.
fn every_command(f: &str, out: &Path) -> Vec<Vec<String>> {
    let o = |name: &str| s(&out.join(name)).to_string();
    let commands: Vec<Vec<String>> = vec![
        vec!["stats".into(), f.into()],
        vec![
            "stats".into(),
            "--json".into(),
            "--lenient".into(),
            f.into(),
        ],
        vec!["stats".into(), "--stream".into(), f.into()],
        vec!["stats".into(), "--no-stream".into(), f.into()],
        vec!["compare".into(), "--jobs".into(), "1".into(), f.into()],
        vec![
            "compare".into(),
            "--jobs".into(),
            "2".into(),
            "--json".into(),
            "--lenient".into(),
            f.into(),
        ],
        vec![
            "compare".into(),
            "--stream".into(),
            "--jobs".into(),
            "2".into(),
            f.into(),
        ],
        vec![
            "compare".into(),
            "--min-limit".into(),
            "--policy".into(),
            "bfc,pytorch".into(),
            f.into(),
        ],
        vec!["plan".into(), f.into()],
        vec!["convert".into(), f.into(), o("converted.avt")],
        vec!["convert".into(), f.into(), o("converted.parquet")],
        vec!["sites".into(), f.into()],
        vec![
            "sites".into(),
            "--at".into(),
            "peak".into(),
            "--by".into(),
            "function".into(),
            "--policy".into(),
            "glibc".into(),
            "--json".into(),
            f.into(),
        ],
        vec!["leaks".into(), f.into()],
        vec!["flamegraph".into(), "-o".into(), o("flame.svg"), f.into()],
        vec![
            "flamegraph".into(),
            "--folded".into(),
            "-o".into(),
            o("flame.folded"),
            f.into(),
        ],
        vec!["diff".into(), f.into(), f.into()],
        vec!["spill".into(), "--limit".into(), "1MiB".into(), f.into()],
        vec!["predict".into(), f.into()],
        vec!["report".into(), "--out".into(), o("report"), f.into()],
        vec![
            "splice".into(),
            "--events".into(),
            "1000".into(),
            "--out".into(),
            o("spliced.avt"),
            f.into(),
        ],
        vec![
            "bench".into(),
            "explorer".into(),
            "--seeks".into(),
            "3".into(),
            f.into(),
        ],
    ];
    commands
}

/// How a run is held to its memory promise.
#[derive(Clone, Copy)]
enum Guard {
    /// `ulimit -v` of 2 GiB: a reservation by what a header claims fails at once.
    AddressSpace,
    /// No limit on the address space; the resident memory the command reached (GNU time's
    /// maximum resident set size) must stay under 2 GiB. A watchdog kills a run that passes it,
    /// so a memory bomb cannot take the machine.
    Resident,
}

/// Resident memory one command may reach in the second pass, on a file under 1 MB.
const RESIDENT_LIMIT_KIB: u64 = 2 << 20;

/// The resident memory of `pid` now, in KiB (None once it has gone).
fn resident_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The children of `pid` (GNU time runs allocview as its child).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// One run of allocview under `guard` and the time limit: its result, or what went wrong with
/// the run itself (a hang, a signal, resident memory past the limit).
fn run_guarded(
    args: &[String],
    guard: Guard,
    scratch_dir: &Path,
) -> Result<(bool, String), String> {
    let rss_file = scratch_dir.join("max-rss");
    let mut command = match guard {
        Guard::AddressSpace => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("ulimit -v {MEMORY_LIMIT_KIB}; exec \"$0\" \"$@\""))
                .arg(env!("CARGO_BIN_EXE_allocview"));
            c
        }
        Guard::Resident => {
            std::fs::remove_file(&rss_file).ok();
            let mut c = Command::new("/usr/bin/time");
            c.args(["-f", "%M", "-o"])
                .arg(&rss_file)
                .arg(env!("CARGO_BIN_EXE_allocview"));
            c
        }
    };
    let mut child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // stderr is read on a thread of its own, so a command that writes much cannot block on a
    // full pipe while this loop waits for it.
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut pipe, &mut text).ok();
        text
    });
    let started = Instant::now();
    let mut failure = None;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > TIME_LIMIT {
            failure = Some(format!("{args:?}: still running after {TIME_LIMIT:?}"));
        }
        if let Guard::Resident = guard {
            for pid in children(child.id()) {
                if resident_kib(pid).is_some_and(|kib| kib > RESIDENT_LIMIT_KIB) {
                    failure = Some(format!("{args:?}: resident memory passed 2 GiB"));
                    Command::new("kill")
                        .arg("-9")
                        .arg(pid.to_string())
                        .status()
                        .ok();
                }
            }
        }
        if failure.is_some() {
            child.kill().ok();
            child.wait().ok();
            reader.join().ok();
            return Err(failure.unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stderr = reader.join().unwrap();
    if let Guard::Resident = guard {
        // GNU time says "Command exited with non-zero status N" before the figure.
        let text = std::fs::read_to_string(&rss_file).unwrap_or_default();
        let Some(max_rss_kib) = text
            .lines()
            .last()
            .and_then(|l| l.trim().parse::<u64>().ok())
        else {
            return Err(format!(
                "{args:?}: GNU time gave no resident size: {text:?} {stderr}"
            ));
        };
        if max_rss_kib > RESIDENT_LIMIT_KIB {
            return Err(format!(
                "{args:?}: resident memory reached {max_rss_kib} KiB"
            ));
        }
        if text.contains("Command terminated by signal") {
            return Err(format!("{args:?}: killed by a signal: {text} {stderr}"));
        }
    } else if status.code().is_none() {
        return Err(format!("{args:?}: killed by a signal ({status}): {stderr}"));
    }
    Ok((status.success(), stderr))
}

/// Runs every command on every crafted and regression input under `guard`; returns what broke a
/// promise: a hang, a crash, memory past its limit, or a failure that is not one `error:` line.
fn sweep(test: &str, guard: Guard) -> Vec<String> {
    let dir = scratch(test);
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let mut inputs = crafted(&dir);
    inputs.extend(regressions(&dir));
    let mut problems = Vec::new();
    for input in &inputs {
        if let Guard::Resident = guard {
            // The promise this pass holds is for small files.
            assert!(
                std::fs::metadata(input).unwrap().len() < 1 << 20,
                "{input:?}"
            );
        }
        for args in every_command(s(input), &out_dir) {
            match run_guarded(&args, guard, &dir) {
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
            for name in ["converted.avt", "converted.parquet", "spliced.avt"] {
                std::fs::remove_file(out_dir.join(name)).ok();
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    problems
}

#[test]
fn every_command_on_every_hostile_input_ends_clearly_within_limits() {
    let problems = sweep("sweep", Guard::AddressSpace);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The same sweep with no limit on the address space: what a command really holds, not only
/// what it may reserve, stays under 2 GiB on any file under 1 MB.
#[test]
fn every_command_on_every_hostile_input_stays_under_two_gib_resident() {
    let problems = sweep("resident", Guard::Resident);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
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
