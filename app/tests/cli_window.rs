//! `--from`/`--to`/`--events` as a user runs them: a window's figures are the whole trace's
//! restricted to the window, on every command that reads a trace, and empty or inverted
//! windows are refused with a message that says why.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{json, run, sample};

/// Times and live bytes after each event of the whole trace, from the loader's table.
fn full_trace(name: &str) -> (Vec<i64>, Vec<u64>) {
    let allocview_loaders::Loaded::MallocTrace(t) =
        allocview_loaders::load(&sample(name), &allocview_loaders::LoadOptions::default()).unwrap()
    else {
        panic!("{name} is a malloc trace")
    };
    let view = allocview_loaders::trace_view(&t.events, &sample(name)).unwrap();
    let lives = allocview_sim::testing::live_bytes_after_each(&view);
    (view.t_ns.to_vec(), lives)
}

/// The whole trace's peak over the window `start..end` and the moment before it.
fn restricted_peak(live: &[u64], start: usize, end: usize) -> u64 {
    live[start.saturating_sub(1)..end]
        .iter()
        .copied()
        .max()
        .unwrap()
}

#[test]
fn stats_and_compare_of_a_window_are_the_whole_traces_figures_there() {
    let name = "find_usr_include.trace.gz";
    let trace = sample(name);
    let trace = trace.to_str().unwrap();
    let (t_ns, live) = full_trace(name);
    let by_events = [
        (1_000usize, 5_000usize),
        (20_000, 30_000),
        (35_000, t_ns.len()),
    ];
    for (start, end) in by_events {
        let range = format!("{start}..{end}");
        let stats = json(&["stats", "--json", "--events", &range, trace]);
        assert_eq!(
            stats["peak_live_bytes"].as_u64().unwrap(),
            restricted_peak(&live, start, end),
            "{range}"
        );
        assert_eq!(
            stats["final_live_bytes"].as_u64().unwrap(),
            live[end - 1],
            "{range}"
        );
        let compare = json(&[
            "compare",
            "--json",
            "--policy",
            "first-fit,bfc,buddy,glibc",
            "--events",
            &range,
            trace,
        ]);
        for p in compare["policies"].as_array().unwrap() {
            assert_eq!(
                p["peak_live_bytes"].as_u64().unwrap(),
                restricted_peak(&live, start, end),
                "{range} {}",
                p["name"]
            );
        }
    }
    // By time: 10 ms to 20 ms selects the events at those times, half-open.
    let stats = json(&["stats", "--json", "--from", "10ms", "--to", "0.02", trace]);
    let start = t_ns.partition_point(|&t| t < 10_000_000);
    let end = t_ns.partition_point(|&t| t < 20_000_000);
    assert!(start > 0 && end > start && end < t_ns.len());
    assert_eq!(
        stats["peak_live_bytes"].as_u64().unwrap(),
        restricted_peak(&live, start, end)
    );
}

#[test]
fn every_command_that_reads_a_trace_takes_a_window() {
    let trace = sample("find_usr_include.trace.gz");
    let trace = trace.to_str().unwrap();
    let out_dir_guard = tempfile::Builder::new()
        .prefix("allocview-window-")
        .tempdir()
        .unwrap();
    let out_dir = out_dir_guard.path().to_path_buf();
    let report = out_dir.join("report");
    let svg = out_dir.join("fg.svg");
    let parquet = out_dir.join("w.parquet");
    let commands: Vec<Vec<&str>> = vec![
        vec!["stats", trace],
        vec!["compare", "--policy", "bfc", trace],
        vec![
            "report",
            "--policy",
            "bfc",
            "--out",
            report.to_str().unwrap(),
            trace,
        ],
        vec!["predict", trace],
        vec!["convert", trace, parquet.to_str().unwrap()],
        vec!["sites", trace],
        vec!["leaks", trace],
        vec!["flamegraph", trace, "-o", svg.to_str().unwrap()],
        vec!["diff", trace, trace],
        vec!["spill", "--limit", "200KiB", trace],
        vec!["plan", trace],
    ];
    for cmd in commands {
        let mut args = cmd.clone();
        args.extend(["--events", "2000..12000"]);
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        assert!(
            err.contains("window: events 2,000..12,000"),
            "{args:?} says which window it loaded: {err}"
        );
    }
}

#[test]
fn empty_and_inverted_windows_are_refused_with_the_reason() {
    let trace = sample("find_usr_include.trace.gz");
    let trace = trace.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (&["--events", "500..100"], "empty or inverted"),
        (&["--events", "100..100"], "empty or inverted"),
        (&["--from", "20ms", "--to", "10ms"], "is not before --to"),
        (&["--from", "5s"], "selects no events"),
        (&["--events", "x..5"], "is not an event number"),
    ];
    for (flags, why) in cases {
        let mut args = vec!["stats", trace];
        args.extend_from_slice(flags);
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}");
        assert!(err.contains(why), "{flags:?}: {err}");
    }
    // `convert`'s --to is its output form or the window's end, and says so when it is neither.
    let out = run(&["convert", trace, "/nonexistent/x.parquet", "--to", "bogus"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("output form"),
        "{err}"
    );
    let out = run(&["convert", trace, "/nonexistent/x.trace", "--to", "5ms"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Parquet output only"),
        "{err}"
    );
    let snapshot = sample("pytorch/lm_forward_a.pickle");
    let out = run(&["stats", snapshot.to_str().unwrap(), "--events", "0..10"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("PyTorch"), "{err}");
}
