//! `allocview sites`, `leaks`, `flamegraph` and `diff` as a user runs them, on a real PyTorch
//! snapshot (call stacks), a real TensorFlow memory log (operations) and a real malloc trace
//! without stacks (size classes).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{json, repo, run, snapshot};

use std::path::Path;
use std::process::Command;

use serde_json::Value;

#[test]
fn sites_of_a_snapshot_are_its_call_stacks() {
    let snap = snapshot("lm_train_step_b");
    let v = json(&["sites", &snap, "--json", "--policy", "pytorch"]);
    for key in ["file", "at_event", "by", "sites"] {
        assert!(v.get(key).is_some(), "{key}: {v}");
    }
    assert_eq!(v["by"], "function");
    let stats = json(&["stats", &snap, "--json"]);
    assert_eq!(v["at_event"], stats["peak_live_event"]);
    let sites = v["sites"].as_array().unwrap();
    // Sorted by live bytes; together they are the peak.
    let live: Vec<u64> = sites
        .iter()
        .map(|s| s["live_bytes"].as_u64().unwrap())
        .collect();
    assert!(live.windows(2).all(|w| w[0] >= w[1]), "{live:?}");
    assert_eq!(
        live.iter().sum::<u64>(),
        stats["peak_live_bytes"].as_u64().unwrap()
    );
    for s in sites {
        for key in [
            "name",
            "frames",
            "live_bytes",
            "live_blocks",
            "alloc_count",
            "alloc_bytes",
            "pinned_free_bytes",
        ] {
            assert!(s.get(key).is_some(), "{key}: {s}");
        }
        assert!(s["pinned_free_bytes"].is_u64(), "a policy was given: {s}");
    }
    // The optimizer's step allocates its state: the site is the program's own frame, with
    // the whole stack behind it.
    let step = sites.iter().find(|s| s["name"] == "step").unwrap();
    assert!(step["live_bytes"].as_u64().unwrap() > 500 << 20, "{step}");
    let frames = step["frames"].as_array().unwrap();
    assert!(frames.iter().any(|f| f["function"] == "step"
        && f["file"].as_str().unwrap().ends_with("optimizer.py")
        && f["line"].as_i64().unwrap() > 0));
    assert!(
        frames.iter().any(|f| f["function"]
            .as_str()
            .unwrap()
            .contains("CUDACachingAllocator")),
        "the innermost frames are kept in the JSON"
    );
    // The free holes attributed to sites lie inside the replayed heap.
    let pinned: u64 = sites
        .iter()
        .map(|s| s["pinned_free_bytes"].as_u64().unwrap())
        .sum();
    assert!(pinned > 0 && pinned < 1 << 30, "{pinned}");
}

#[test]
fn sites_of_a_memory_log_are_its_operations_and_of_a_plain_trace_its_size_classes() {
    let log = repo("loaders/tests/data/tf/mobilenetv2_train_memlog.txt.gz");
    let v = json(&["sites", log.to_str().unwrap(), "--json", "--at", "end"]);
    assert_eq!(v["site_kind"], "operations");
    let sites = v["sites"].as_array().unwrap();
    assert!(sites.len() > 10, "{}", sites.len());
    assert!(
        sites
            .iter()
            .all(|s| s["name"].as_str().is_some_and(|n| !n.is_empty()))
    );

    let trace = repo("sample-traces/find_usr_include.trace.gz");
    let v = json(&["sites", trace.to_str().unwrap(), "--json"]);
    assert_eq!(v["site_kind"], "size_classes");
    assert!(
        v["sites"][0]["name"]
            .as_str()
            .unwrap()
            .starts_with("size class")
    );
    assert!(v["sites"][0]["pinned_free_bytes"].is_null(), "no --policy");
    let out = run(&["sites", trace.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("records no call stacks"), "{text}");
}

#[test]
fn leaks_are_told_from_caches() {
    let snap = snapshot("lm_train_step_b");
    let v = json(&["leaks", &snap, "--json"]);
    assert!(v.get("file").is_some());
    let leaks = v["leaks"].as_array().unwrap();
    let stats = json(&["stats", &snap, "--json"]);
    let live: u64 = leaks
        .iter()
        .map(|l| l["live_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(live, stats["final_live_bytes"].as_u64().unwrap());
    for l in leaks {
        for key in [
            "name",
            "frames",
            "live_bytes",
            "live_blocks",
            "first_alloc_s",
            "last_alloc_s",
            "kind",
        ] {
            assert!(l.get(key).is_some(), "{key}: {l}");
        }
        assert!(l["kind"] == "leak" || l["kind"] == "cache");
    }
    // Blocks live since before the trace and never freed: levelled off from the start.
    let carried = leaks
        .iter()
        .find(|l| l["name"] == "(no stack recorded)")
        .unwrap();
    assert_eq!(carried["kind"], "cache");
    // The optimizer's state appears during the step and is still growing at its end.
    let step = leaks.iter().find(|l| l["name"] == "step").unwrap();
    assert_eq!(step["kind"], "leak");
}

#[test]
fn flame_graphs_add_up_to_the_live_bytes() {
    let snap = snapshot("lm_train_step_b");
    let out = run(&["flamegraph", &snap, "--folded"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let total: u64 = text
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    let stats = json(&["stats", &snap, "--json"]);
    assert_eq!(total, stats["peak_live_bytes"].as_u64().unwrap());
    // Outermost first: the thread start, the interpreter, the caching allocator innermost.
    assert!(
        text.lines()
            .any(|l| l.contains(";fake_train;") && l.contains("CUDACachingAllocator")),
        "{text}"
    );
    let dir = std::env::temp_dir().join(format!("allocview-fg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("fg.svg");
    let out = run(&[
        "flamegraph",
        &snap,
        "--metric",
        "allocated",
        "-o",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let body = std::fs::read_to_string(&svg).unwrap();
    assert!(body.starts_with("<svg") && body.trim_end().ends_with("</svg>"));
    assert!(
        body.contains("<title>step ("),
        "the optimizer's frame is drawn"
    );
    // An SVG needs a file.
    assert!(!run(&["flamegraph", &snap]).status.success());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn diff_attributes_growth_to_sites_and_gates_ci() {
    let (a, b) = (snapshot("lm_train_step_b"), snapshot("lm_train_step_a"));
    let args = |x: &str, y: &str| {
        vec![
            "diff".to_owned(),
            x.to_owned(),
            y.to_owned(),
            "--json".to_owned(),
            "--policy".to_owned(),
            "pytorch,bfc".to_owned(),
        ]
    };
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args(&a, &b))
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pa = json(&["stats", &a, "--json"])["peak_live_bytes"]
        .as_u64()
        .unwrap();
    let pb = json(&["stats", &b, "--json"])["peak_live_bytes"]
        .as_u64()
        .unwrap();
    assert_eq!(v["peak_live_bytes"]["a"].as_u64().unwrap(), pa);
    assert_eq!(v["peak_live_bytes"]["b"].as_u64().unwrap(), pb);
    let pct = v["peak_live_bytes"]["change_pct"].as_f64().unwrap();
    assert!((pct - 100.0 * (pb as f64 - pa as f64) / pa as f64).abs() < 1e-9);
    let sites = v["sites"].as_array().unwrap();
    let changes: Vec<i64> = sites
        .iter()
        .map(|s| s["change_bytes"].as_i64().unwrap())
        .collect();
    assert!(changes.windows(2).all(|w| w[0].abs() >= w[1].abs()));
    for s in sites {
        assert_eq!(
            s["change_bytes"].as_i64().unwrap(),
            s["b_bytes"].as_i64().unwrap() - s["a_bytes"].as_i64().unwrap()
        );
    }
    assert_eq!(v["policies"].as_array().unwrap().len(), 2);
    // The gate: B's peak is several times A's.
    let gate = |x: &str, y: &str| {
        Command::new(env!("CARGO_BIN_EXE_allocview"))
            .args(["diff", x, y, "--policy", "bfc", "--fail-on-increase", "10"])
            .output()
            .unwrap()
    };
    let up = gate(&a, &b);
    assert_eq!(up.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&up.stdout).contains("FAIL"));
    let down = gate(&b, &a);
    assert_eq!(down.status.code(), Some(0));
}

/// `diff --fail-on-increase` fails closed: growth from a run whose peak is 0 bytes fails the
/// gate (there is no percentage to compare), and a limit that is not a finite number (`nan`,
/// `inf`, `1e309`, which parses as infinity) is refused rather than passing every run.
#[test]
fn the_diff_gate_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.trace");
    // One free of NULL: events, but nothing ever live.
    std::fs::write(&empty, "0.000000\t1\t-1\t0x0\n").unwrap();
    let empty = empty.to_str().unwrap();
    let b = repo("sample-traces/xz_T2_8KiB_blocks.trace.gz");
    let b = b.to_str().unwrap();
    let gate = |x: &str, y: &str, pct: &str| {
        Command::new(env!("CARGO_BIN_EXE_allocview"))
            .args(["diff", x, y, "--policy", "bfc"])
            .arg(format!("--fail-on-increase={pct}"))
            .output()
            .unwrap()
    };
    let from_zero = gate(empty, b, "10");
    assert_eq!(
        from_zero.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&from_zero.stderr)
    );
    let out = String::from_utf8_lossy(&from_zero.stdout);
    assert!(
        out.contains("FAIL: peak live bytes grew from 0 B to"),
        "{out}"
    );
    // Nothing live in either: no growth, the gate passes.
    assert_eq!(gate(empty, empty, "10").status.code(), Some(0));
    for bad in ["nan", "inf", "1e309", "-inf"] {
        let refused = gate(b, b, bad);
        assert_eq!(refused.status.code(), Some(2), "--fail-on-increase {bad}");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(err.contains("not a finite percentage"), "{bad}: {err}");
    }
}

/// A binary trace whose call stack's function and file names hold what a terminal or a folded
/// file must not receive raw: an escape sequence, a line break, a `;` (the folded frame
/// separator), a bidirectional override. Three live allocations at one stack, none freed.
fn hostile_names_trace(path: &Path) {
    use allocview_loaders::binary::{
        BinaryWriter, Location, NativeModule, NativeStack, NativeStacks, SourceFrame, StackEnd,
    };
    use allocview_loaders::events::Record;
    let frame = |function: &str, file: &str| {
        vec![SourceFrame {
            function: function.to_owned(),
            file: file.to_owned(),
            line: 7,
        }]
    };
    let stacks = NativeStacks {
        modules: vec![NativeModule {
            path: "/bin/evil\u{1b}]0;title\u{7}".to_owned(),
            ..NativeModule::default()
        }],
        locations: (1..=3)
            .map(|i| Location {
                module: Some(0),
                offset: i * 16,
            })
            .collect(),
        stacks: [(
            0,
            NativeStack {
                locations: vec![0, 1, 2],
                end: StackEnd::Complete,
            },
        )]
        .into(),
        symbols: vec![
            frame("evil\u{1b}[2J\u{1b}[31mred", "x\u{1b}[1m.c"),
            frame("two\nlines 999999", "y\n.c"),
            frame("semi;colon\u{202e}rtl", "z.c"),
        ],
    };
    let file = std::fs::File::create(path).unwrap();
    let mut w = BinaryWriter::new(file, &[]).unwrap();
    for i in 0..3u64 {
        w.push(&Record {
            t_ns: 1_000 * (i as i64 + 1),
            tid: 1,
            size_bytes: Some(4096),
            addr: 0x10_000 + 0x1000 * i,
            call: None,
            stack: Some(0),
            heap: 0,
        })
        .unwrap();
    }
    w.write_stacks(&stacks).unwrap();
    w.finish().unwrap();
}

/// Function and file names from a trace reach no text output raw: no control character but
/// the line ends in `sites`, `leaks` and `diff` tables, one folded line per stack with its
/// three frames, and the SVG well-formed; each name is shown with U+FFFD where the control
/// or override character was (issue 43).
#[test]
fn names_from_a_trace_are_escaped_in_every_text_output() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("hostile.avt");
    hostile_names_trace(&trace);
    let t = trace.to_str().unwrap();
    let text = |args: &[&str]| {
        let out = run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            !stdout.chars().any(|c| c.is_control() && c != '\n'),
            "{args:?} printed a control character: {stdout:?}"
        );
        assert!(!stdout.contains('\u{202e}'), "{args:?}: {stdout:?}");
        stdout
    };
    for by in ["function", "stack", "module"] {
        for out in [
            text(&["sites", t, "--by", by]),
            text(&["leaks", t, "--by", by]),
        ] {
            // The line break in a name injected a line of its own.
            assert!(
                !out.lines()
                    .any(|l| l.trim_start().starts_with("lines 999999")),
                "{by}: {out}"
            );
        }
    }
    let sites = text(&["sites", t, "--by", "stack"]);
    assert!(sites.contains("evil\u{fffd}[2J\u{fffd}[31mred"), "{sites}");
    text(&["diff", t, t]);
    let folded = text(&["flamegraph", t, "--folded"]);
    let lines: Vec<&str> = folded.lines().collect();
    assert_eq!(lines.len(), 1, "one stack, one line: {folded:?}");
    let (frames, value) = lines[0].rsplit_once(' ').unwrap();
    assert_eq!(value, "12288");
    assert_eq!(
        frames.split(';').collect::<Vec<_>>(),
        [
            "semi:colon\u{fffd}rtl",
            "two\u{fffd}lines 999999",
            "evil\u{fffd}[2J\u{fffd}[31mred"
        ]
    );
    let svg = dir.path().join("f.svg");
    text(&["flamegraph", t, "-o", svg.to_str().unwrap()]);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(!svg.chars().any(|c| c.is_control() && c != '\n'), "{svg:?}");
    assert!(svg.contains("two\u{fffd}lines"), "{svg}");
}
