//! `allocview stats` as a user runs it: the real binary on the bundled sample traces.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{run, sample};

use std::process::Command;

use serde_json::Value;

#[test]
fn stats_json_has_the_documented_keys_and_reference_values() {
    for name in ["find_usr_include", "xz_T2_8KiB_blocks"] {
        let trace = sample(&format!("{name}.trace.gz"));
        let out = run(&["stats", "--json", trace.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours: Value = serde_json::from_slice(&out.stdout).unwrap();
        let reference: Value = serde_json::from_str(
            &std::fs::read_to_string(sample(&format!("{name}.stats.json"))).unwrap(),
        )
        .unwrap();
        for key in [
            "events",
            "mallocs",
            "frees",
            "frees_null",
            "frees_unknown",
            "threads",
            "peak_live_bytes",
            "peak_live_event",
            "final_live_bytes",
            "final_live_blocks",
            "size_classes",
            "bytes_by_class",
        ] {
            assert_eq!(ours[key], reference[key], "{name}: {key}");
        }
        assert!(ours["load_seconds"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn stats_table_is_readable() {
    let trace = sample("xz_T2_8KiB_blocks.trace.gz");
    let out = run(&["stats", trace.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("10,098"), "{text}");
    assert!(text.contains("peak live"), "{text}");
    assert!(text.contains("186 MiB"), "{text}");
    assert!(text.contains("class"), "{text}");
}

#[test]
fn bad_input_fails_with_file_line_and_expectation_and_lenient_recovers() {
    let dir_guard = tempfile::Builder::new()
        .prefix("allocview-cli-")
        .tempdir()
        .unwrap();
    let dir = dir_guard.path().to_path_buf();
    let path = dir.join("bad.trace");
    std::fs::write(
        &path,
        "0.1\t1\t8\t0x10\n0.2\t1\t8\tnotaptr\n0.3\t1\t-1\t0x10\n",
    )
    .unwrap();
    let out = run(&["stats", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("line 2"), "{err}");
    assert!(err.contains("column 9"), "{err}");
    assert!(err.contains("pointer"), "{err}");
    assert!(err.contains("bad.trace"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let out = run(&["stats", "--lenient", "--json", path.to_str().unwrap()]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["events"], 2);
    assert_eq!(v["bad_lines"], 1);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("skipped 1 malformed"), "{err}");
}

#[test]
fn unknown_input_and_missing_file_are_clear_errors() {
    let out = run(&["stats", "/nonexistent.trace"]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("/nonexistent.trace"), "{err}");

    let out = run(&["stats", env!("CARGO_MANIFEST_DIR")]);
    assert!(!out.status.success());
    assert!(!String::from_utf8(out.stderr).unwrap().contains("panicked"));

    let dir = tempfile::Builder::new()
        .prefix("allocview-cli-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("text.txt");
    std::fs::write(&path, "hello world\n").unwrap();
    let out = run(&["stats", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("unrecognised input"), "{err}");
}

#[test]
fn help_is_readable() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("stats"));
    assert!(text.contains("Examples"));
}

/// `--policy`'s help names every policy the default set runs (it left out `predictive`).
#[test]
fn policy_help_names_every_policy() {
    for command in ["compare", "report", "diff", "bench", "gui"] {
        let out = run(&[command, "--help"]);
        let text = String::from_utf8(out.stdout).unwrap();
        let known = &text[text.find("Known:").unwrap()..];
        let known = &known[..known.find('.').unwrap()];
        for name in allocview_sim::policy::registry::POLICY_NAMES {
            assert!(
                known.contains(name),
                "{command} --help: {name} missing from {known:?}"
            );
        }
    }
}

#[test]
fn a_closed_pipe_ends_quietly() {
    use std::process::Stdio;
    let trace = sample("find_usr_include.trace.gz");
    let mut child = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["stats", trace.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close our end before the child has loaded the trace and written anything, so its
    // first write meets a closed pipe (like `| head` that has already exited).
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success(), "{err}");
}

#[test]
fn compare_says_which_ooms_are_requests_a_policy_cannot_serve() {
    let trace = sample("find_usr_include.trace.gz");
    let out = run(&[
        "compare",
        trace.to_str().unwrap(),
        "--align",
        "1024",
        "--policy",
        "bfc,first-fit",
        "--json",
    ]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["policies"].as_array().unwrap();
    // BFC's 256-byte grid cannot honour a 1 KiB alignment: every request is refused, and
    // the JSON says so rather than leaving it to read as memory running out.
    assert_eq!(rows[0]["unsupported"], rows[0]["ooms"]);
    assert!(rows[0]["unsupported"].as_u64().unwrap() > 0);
    assert!(
        rows[0]["unsupported_reason"]
            .as_str()
            .unwrap()
            .contains("256 B grid")
    );
    assert_eq!(rows[1]["unsupported"], 0);
    assert_eq!(rows[1]["ooms"], 0);
    let out = run(&[
        "compare",
        trace.to_str().unwrap(),
        "--align",
        "1024",
        "--policy",
        "bfc",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("requests it cannot serve at all"), "{text}");
}

/// A trace recorded from the middle of a run (META `started_mid_run=1`): its frees of blocks
/// it never saw allocated are counted apart, in the table and the JSON, loaded or streamed.
#[test]
fn stats_counts_frees_from_before_a_mid_run_start_apart() {
    use allocview_loaders::binary::BinaryWriter;
    use allocview_loaders::events::Record;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("joined.avt");
    let meta = [("started_mid_run".to_owned(), "1".to_owned())];
    let mut w = BinaryWriter::new(Vec::new(), &meta).unwrap();
    let rec = |t_ns, size_bytes, addr| Record {
        t_ns,
        tid: 3,
        size_bytes,
        addr,
        call: None,
        stack: None,
        heap: 0,
    };
    for r in [
        rec(1, Some(12_345), 0x1000),
        rec(2, None, 0x5000),
        rec(3, None, 0x6000),
        rec(4, None, 0x7000),
        rec(5, None, 0x1000),
    ] {
        w.push(&r).unwrap();
    }
    std::fs::write(&path, w.finish().unwrap()).unwrap();
    let p = path.to_str().unwrap();
    for extra in [&[][..], &["--no-stream"][..]] {
        let mut args = vec!["stats", "--json", p];
        args.extend_from_slice(extra);
        let out = run(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["frees_unknown"], 0, "{extra:?}");
        assert_eq!(v["frees_before_recording"], 3, "{extra:?}");
        assert_eq!(v["final_live_blocks"], 0, "{extra:?}");
    }
    let out = run(&["stats", p]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("3   frees of blocks allocated before recording started"),
        "{text}"
    );
    assert!(text.contains("0 of unknown pointers"), "{text}");
}
