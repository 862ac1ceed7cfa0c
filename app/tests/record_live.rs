//! `allocview record` converts a spool while the command runs (`LiveSpool`): on a real
//! multi-threaded program handing blocks between threads, the records read while the tracer
//! wrote them are exactly those of the finished file, and `record`'s trace is consistent.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use allocview_loaders::binary::{self, LivePoll, LiveSpool, TimeBase};
use allocview_loaders::events::Record;
use allocview_loaders::{LoadOptions, Loaded};

mod common;

/// Blocks each of the hand-over program's four threads allocates: enough that the tracer's
/// clock thread writes many flush marks while they run.
const ITERS: u32 = 600_000;

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("record-live-{name}"));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `exe` under the tracer (stacks on) while a [`LiveSpool`] reads its spool as
/// `record` does; returns the live records (`None` when an event came in late), how many
/// were emitted before the program ended, and the spool.
fn record_live(exe: &Path, dir: &Path, run: u32) -> (Option<Vec<Record>>, usize, PathBuf) {
    let so = Path::new(env!("OUT_DIR")).join("liballocview_tracer.so");
    let prefix = dir.join(format!("run{run}"));
    let mut child = Command::new(exe)
        .env("LD_PRELOAD", &so)
        .env("ALLOCVIEW_SPOOL", &prefix)
        .env("ALLOCVIEW_STACKS", "1")
        .env("MALLOC_ARENA_MAX", "1")
        .spawn()
        .unwrap();
    let spool = PathBuf::from(format!("{}.{}.spool", prefix.display(), child.id()));
    let mut live: Option<LiveSpool> = None;
    let mut out = Vec::new();
    let mut late = false;
    loop {
        let exited = child.try_wait().unwrap();
        if live.is_none() && spool.exists() {
            live = Some(LiveSpool::open(&spool, TimeBase::default()).unwrap());
        }
        if let Some(l) = live.as_mut()
            && !late
        {
            l.read().unwrap();
            let poll = l
                .emit(&mut |r| {
                    out.push(*r);
                    Ok(())
                })
                .unwrap();
            late = poll == LivePoll::Late;
        }
        if let Some(status) = exited {
            assert!(status.success());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let before_exit = out.len();
    let live = live.expect("the tracer wrote a spool");
    if late {
        return (None, before_exit, spool);
    }
    live.finish(&mut |r| {
        out.push(*r);
        Ok(())
    })
    .unwrap();
    (Some(out), before_exit, spool)
}

#[test]
fn a_spool_read_while_the_program_runs_gives_the_finished_files_records() {
    let dir = scratch("spool");
    // The program idles 400 ms before it exits, so the tracer's clock thread writes flush
    // marks after its last event while it still runs: however fast the machine, the live reader
    // has something to emit before the exit.
    let source = common::handover_c(ITERS);
    let paused = source
        .replace("    return 0;\n}", "    usleep(400000);\n    return 0;\n}")
        .replace(
            "#include <stdlib.h>",
            "#include <stdlib.h>\n#include <unistd.h>",
        );
    assert!(paused.contains("usleep(400000)") && paused.contains("unistd.h"));
    let exe = common::build_c(&dir, "handover", &paused);
    // A thread held up for over a clock period between reading the time and writing its
    // event makes the live reading give up (record then converts the file): rare, so one of
    // three runs must read live.
    let mut compared = 0;
    for run in 0..3 {
        let (live, before_exit, spool) = record_live(&exe, &dir, run);
        let mut whole = Vec::new();
        let info = binary::read_records(&spool, TimeBase::default(), |r| {
            whole.push(*r);
            Ok(())
        })
        .unwrap();
        assert!(info.stacks.is_some());
        assert!(whole.len() >= 4 * ITERS as usize * 2, "{}", whole.len());
        let Some(live) = live else { continue };
        assert!(
            before_exit > 0,
            "run {run}: nothing was emitted while the program ran"
        );
        assert_eq!(live.len(), whole.len(), "run {run}");
        assert!(
            live == whole,
            "run {run}: the live records differ from the file's"
        );
        compared += 1;
        break;
    }
    assert_eq!(compared, 1, "no run was read live to the end");
}

#[test]
fn a_trace_converted_while_the_program_ran_is_consistent() {
    let dir = scratch("record");
    let exe = common::build_c(&dir, "handover", &common::handover_c(ITERS));
    let out_path = dir.join("handover.avt");
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["record", "-o", out_path.to_str().unwrap(), "--"])
        .arg(&exe)
        .env("MALLOC_ARENA_MAX", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let Loaded::MallocTrace(t) =
        allocview_loaders::load(&out_path, &LoadOptions::default()).unwrap()
    else {
        panic!("not a malloc trace");
    };
    let s = &t.summary;
    common::assert_pairing_clean(s);
    assert!(s.mallocs >= u64::from(4 * ITERS), "{}", s.mallocs);
    // The summary, counted while writing, is the loaded trace's.
    let events = t.events.height();
    let shown = format!("{} events", allocview_count(events as u64));
    assert!(stderr.contains(&shown), "{shown} not in:\n{stderr}");
    assert!(
        stderr.contains(&format!("{} threads", t.threads.height())),
        "{stderr}"
    );
}

/// A count as allocview prints it (thousands separated by commas).
fn allocview_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
