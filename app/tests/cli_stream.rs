//! `stats --stream` and `compare --stream` as a user runs them: the same JSON as the loaded
//! trace's (but for timings and the `streamed` mark), and clear refusals where streaming does
//! not apply.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{fails, json, run, sample};

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// `allocview args`, which must succeed.
fn allocview_ok(args: &[&str]) -> std::process::Output {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The JSON without the keys that measure time or say how it was read.
fn without_timings(mut v: Value) -> Value {
    if let Some(obj) = v.as_object_mut() {
        for key in ["load_seconds", "streamed"] {
            obj.remove(key);
        }
        if let Some(Value::Array(rows)) = obj.get_mut("policies") {
            for row in rows {
                if let Some(row) = row.as_object_mut() {
                    row.remove("events_per_second");
                    row.remove("replay_seconds");
                }
            }
        }
    }
    v
}

/// A binary trace of two threads taking turns, each with its own pattern of sizes and
/// lifetimes, written into `dir`: `predictive`'s features from the wrong thread's calls would
/// class its allocations otherwise.
fn two_thread_trace(dir: &Path) -> PathBuf {
    let two = dir.join("two_threads.trace");
    let mut text = String::new();
    let mut live: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    for i in 0..30_000u64 {
        // Turns of one call each, the same sizes on both threads: only each thread's own
        // calls tell thread 0's long-lived blocks (freed oldest first, after many) from
        // thread 1's short-lived ones (freed newest first, after few).
        let t = (i % 2) as usize;
        let tid = 100 + t as u64;
        let us = i;
        let cap = if t == 0 { 40 } else { 2 + (i / 2 % 3) as usize };
        if live[t].len() > cap || (t == 1 && i % 6 == 5) {
            let p = if t == 0 {
                live[t].remove(0)
            } else {
                live[t].pop().unwrap()
            };
            text.push_str(&format!("0.{us:06}\t{tid}\t-1\t0x{p:x}\n"));
        } else {
            let size = 16 + (i / 2 % 4) * 48;
            let p = 0x10_0000 * (t as u64 + 1) + (i % 4096) * 0x10 + (i / 4096) * 0x1_0000_0000;
            live[t].push(p);
            text.push_str(&format!("0.{us:06}\t{tid}\t{size}\t0x{p:x}\n"));
        }
    }
    std::fs::write(&two, text).unwrap();
    let two_avt = dir.join("two_threads.avt");
    allocview_ok(&[
        "convert",
        "--to",
        "binary",
        two.to_str().unwrap(),
        two_avt.to_str().unwrap(),
    ]);
    two_avt
}

#[test]
fn streamed_stats_and_compare_print_what_the_loaded_trace_gives() {
    // A trace of two threads with thousands of events, converted: `predictive`'s features
    // follow each thread's calls.
    let dir = std::env::temp_dir().join(format!("allocview-cli-streamcmp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let xz = dir.join("xz_T2_8KiB_blocks.avt");
    allocview_ok(&[
        "convert",
        "--to",
        "binary",
        sample("xz_T2_8KiB_blocks.trace.gz").to_str().unwrap(),
        xz.to_str().unwrap(),
    ]);
    let two_avt = two_thread_trace(&dir);
    // A cut file (its INDEX and END frames gone) is loaded by `stats`, so the loader says so.
    let cut = dir.join("cut.avt");
    let bytes = std::fs::read(&two_avt).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let cut = cut.to_str().unwrap();
    let by_default = run(&["stats", "--json", cut]);
    let loaded = run(&["stats", "--json", "--no-stream", cut]);
    assert_eq!(by_default.status.code(), loaded.status.code());
    assert_eq!(by_default.stderr, loaded.stderr);
    assert_eq!(
        without_timings(serde_json::from_slice(&by_default.stdout).unwrap_or(Value::Null)),
        without_timings(serde_json::from_slice(&loaded.stdout).unwrap_or(Value::Null))
    );
    let files = ["perl_hash.avt", "python_json.avt", "xz_T2_libc.avt"]
        .map(sample)
        .into_iter()
        .chain([xz, two_avt]);
    for path in files {
        let name = path.display().to_string();
        let file = path.to_str().unwrap();
        let loaded = json(&["stats", "--json", "--no-stream", file]);
        assert!(loaded.get("streamed").is_none(), "{name}: loaded");
        let streamed = json(&["stats", "--json", "--stream", file]);
        assert_eq!(streamed["streamed"], Value::Bool(true));
        assert_eq!(
            without_timings(streamed),
            without_timings(loaded.clone()),
            "{name}"
        );
        // `stats` streams on its own a file that ends with its INDEX frame (every file written
        // now: the converted ones); the samples predate the frame and load.
        let default = json(&["stats", "--json", file]);
        let finished = path.starts_with(&dir);
        assert_eq!(default.get("streamed").is_some(), finished, "{name}");
        assert_eq!(without_timings(default), without_timings(loaded), "{name}");
        for extra in [&[][..], &["--limit", "64KiB"][..]] {
            let policies = "bfc,glibc,first-fit,predictive,predictive:short_allocs=16,oracle,\
                            predictive:lifetimes=true,predictive:lifetimes=true:short_allocs=3";
            let mut args = vec!["compare", "--json", "--policy", policies, file];
            args.extend_from_slice(extra);
            let loaded = json(&args);
            args.push("--stream");
            let streamed = json(&args);
            assert_eq!(
                without_timings(streamed),
                without_timings(loaded),
                "{name} {extra:?}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `predict` streamed reads each pass from the file: the same figures as loaded, cross-run
/// included (the other trace streamed too), but for the speeds and the marks of how it was read.
#[test]
fn streamed_predict_gives_the_loaded_figures() {
    let strip = |mut v: Value| {
        if let Some(obj) = v.as_object_mut() {
            obj.remove("streamed");
            if let Some(Value::Object(l)) = obj.get_mut("lifetime") {
                l.remove("sites_used");
            }
            if let Some(Value::Array(models)) = obj.get_mut("models") {
                for m in models.iter_mut().filter_map(Value::as_object_mut) {
                    for key in [
                        "train_events_per_s",
                        "predict_events_per_s",
                        "online_events_per_s",
                    ] {
                        assert!(m.remove(key).is_some(), "{key}");
                    }
                }
            }
        }
        v
    };
    let other = sample("perl_hash.avt");
    for name in ["python_json.avt", "xz_T2_libc.avt"] {
        let file = sample(name);
        let args = [
            "predict",
            "--json",
            "--model",
            "majority,period,order-2,order-8",
            "--train",
            other.to_str().unwrap(),
            file.to_str().unwrap(),
        ];
        let loaded = json(&args);
        let mut with_stream = args.to_vec();
        with_stream.push("--stream");
        let streamed = json(&with_stream);
        assert_eq!(streamed["streamed"], Value::Bool(true));
        assert_eq!(streamed["lifetime"]["sites_used"], Value::Bool(false));
        assert!(loaded["models"][3]["cross_run"]["top1"].as_f64().unwrap() > 0.0);
        assert_eq!(strip(streamed), strip(loaded), "{name}");
    }
}

#[test]
fn streaming_refuses_what_it_cannot_do_and_says_why() {
    let text = sample("find_usr_include.trace.gz");
    let err = fails(&["stats", "--stream", text.to_str().unwrap()]);
    assert!(err.contains("allocview convert"), "{err}");
    let bin = sample("perl_hash.avt");
    let bin = bin.to_str().unwrap();
    let err = fails(&["stats", "--stream", "--events", "90000..", bin]);
    assert!(err.contains("the window selects no events"), "{err}");
    let err = fails(&["stats", "--stream", "--from", "2s", "--to", "1s", bin]);
    assert!(err.contains("is not before --to"), "{err}");
}

/// A window (`--from/--to/--events`) streams as it is cut from the loaded trace: the
/// allocations live at its start carried in, the same JSON from `stats`, `compare` and
/// `predict`, the same files from `report`.
#[test]
fn streamed_windows_give_the_loaded_windows_figures() {
    /// The JSON without what measures time or says how it was read, at any depth.
    fn strip(v: Value) -> Value {
        const SKIP: [&str; 8] = [
            "load_seconds",
            "streamed",
            "events_per_second",
            "replay_seconds",
            "train_events_per_s",
            "predict_events_per_s",
            "online_events_per_s",
            "sites_used",
        ];
        match v {
            Value::Array(a) => Value::Array(a.into_iter().map(strip).collect()),
            Value::Object(o) => Value::Object(
                o.into_iter()
                    .filter(|(k, _)| !SKIP.contains(&k.as_str()))
                    .map(|(k, v)| (k, strip(v)))
                    .collect(),
            ),
            other => other,
        }
    }
    for name in ["python_json.avt", "xz_T2_libc.avt"] {
        let file = sample(name);
        let file = file.to_str().unwrap();
        for window in [
            &["--events", "100..300"][..],
            &["--from", "0.02", "--to", "0.12"],
        ] {
            for cmd in [
                &["stats", "--json", "--no-stream"][..],
                &[
                    "compare",
                    "--json",
                    "--policy",
                    "bfc,glibc,first-fit,predictive,oracle,predictive:lifetimes=true",
                ],
                &["predict", "--json", "--model", "majority,order-4"],
            ] {
                let mut args = cmd.to_vec();
                args.extend_from_slice(window);
                args.push(file);
                let loaded = json(&args);
                args.retain(|&a| a != "--no-stream");
                args.push("--stream");
                let streamed = json(&args);
                assert_eq!(streamed["streamed"], Value::Bool(true), "{args:?}");
                assert_eq!(strip(streamed), strip(loaded), "{args:?}");
            }
        }
    }
    let dir = std::env::temp_dir().join(format!("allocview-cli-wreport-{}", std::process::id()));
    let file = sample("python_json.avt");
    let mut outs = Vec::new();
    for (k, extra) in [&[][..], &["--stream"][..]].iter().enumerate() {
        let out_dir = dir.join(k.to_string());
        let mut args = vec!["report", "--policy", "bfc", "--events", "2000..6000"];
        args.extend([file.to_str().unwrap(), "--out", out_dir.to_str().unwrap()]);
        args.extend_from_slice(extra);
        let out = allocview_ok(&args);
        assert!(String::from_utf8_lossy(&out.stderr).contains("carried in"));
        outs.push(out_dir);
    }
    for name in [
        "timeline.csv",
        "classes.csv",
        "timeline.png",
        "heapmap_bfc.png",
    ] {
        let a = std::fs::read(outs[0].join(name)).unwrap();
        let b = std::fs::read(outs[1].join(name)).unwrap();
        assert!(a == b, "{name} differs");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// LEB128.
fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[test]
fn a_trace_too_big_to_load_is_refused_with_the_commands_that_stream_it() {
    let dir = std::env::temp_dir().join(format!("allocview-cli-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // 64 blocks of 65,536 events (4,194,304 events, about 160 MiB loaded) in a few KB; the
    // blocks' own headers tell how big the trace is, before anything is loaded.
    let path = dir.join("big.avt");
    std::fs::write(
        &path,
        allocview_loaders::binary::crafted::blocks_many(64, true),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .env("ALLOCVIEW_AVAILABLE_MEMORY", "100000000")
        .args(["sites", path.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("4,194,304 events"), "{err}");
    assert!(err.contains("stream it block by block"), "{err}");
    // A file whose INDEX and END claim 2^40 events its blocks do not hold is not taken at its
    // word: it is refused as corrupt, naming where.
    let mut bytes = b"\x89AVT\r\n\x1a\n\x01\x00".to_vec();
    let index_at = bytes.len() as u64;
    let mut index = Vec::new();
    varint(0, &mut index); // threads
    varint(1, &mut index); // blocks
    varint(10, &mut index); // offset
    varint(1 << 40, &mut index); // events
    varint(0, &mut index); // first time (zigzag)
    varint(0, &mut index); // largest time - first
    index.extend_from_slice(&index_at.to_le_bytes());
    bytes.push(0x09);
    bytes.extend_from_slice(&(index.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&index);
    let mut end = Vec::new();
    varint(1 << 40, &mut end);
    bytes.push(0x04);
    bytes.extend_from_slice(&(end.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&end);
    let path = dir.join("lying.avt");
    std::fs::write(&path, &bytes).unwrap();
    let err = fails(&["sites", path.to_str().unwrap()]);
    assert!(
        err.contains("corrupt allocview binary file at byte"),
        "{err}"
    );
    assert!(err.contains("lying.avt"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_streamed_report_writes_the_loaded_reports_files() {
    let dir = std::env::temp_dir().join(format!("allocview-cli-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // `predictive` on two threads: loaded and streamed, it learns from each thread's calls.
    let two = two_thread_trace(&dir);
    for (file, policies) in [
        (sample("python_json.avt"), "bfc,first-fit,oracle"),
        (two, "bfc,predictive"),
    ] {
        let mut outs = Vec::new();
        for (k, extra) in [&[][..], &["--stream"][..]].iter().enumerate() {
            let out_dir = dir.join(format!("{policies}-{k}"));
            let mut args = vec![
                "report",
                "--policy",
                policies,
                file.to_str().unwrap(),
                "--out",
                out_dir.to_str().unwrap(),
            ];
            args.extend_from_slice(extra);
            allocview_ok(&args);
            outs.push(out_dir);
        }
        let heapmaps = policies.split(',').map(|p| format!("heapmap_{p}.png"));
        for name in [
            "timeline.csv",
            "classes.csv",
            "timeline.png",
            "fragmentation.png",
            "classes.png",
        ]
        .map(str::to_owned)
        .into_iter()
        .chain(heapmaps)
        {
            let a = std::fs::read(outs[0].join(&name)).unwrap();
            let b = std::fs::read(outs[1].join(&name)).unwrap();
            assert!(a == b, "{policies}: {name} differs");
        }
        // The summary's last column is the replay speed.
        let rows = |d: &Path| -> Vec<String> {
            std::fs::read_to_string(d.join("summary.csv"))
                .unwrap()
                .lines()
                .map(|l| l.rsplit_once(',').unwrap().0.to_owned())
                .collect()
        };
        assert_eq!(rows(&outs[0]), rows(&outs[1]), "{policies}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn splice_copies_real_traces_shifted_and_frees_their_leftovers() {
    let dir = std::env::temp_dir().join(format!("allocview-cli-splice-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let perl = sample("perl_hash.avt");
    let python = sample("python_json.avt");
    let stats = |f: &Path| json(&["stats", "--json", f.to_str().unwrap()]);
    let original = stats(&perl);
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap();
    // One whole copy: the records, then a free of every block left live.
    let one_copy = n(&original, "events") + n(&original, "final_live_blocks");
    let out = dir.join("one.avt");
    let o = out.to_str().unwrap();
    allocview_ok(&[
        "splice",
        "--events",
        &one_copy.to_string(),
        "--out",
        o,
        perl.to_str().unwrap(),
    ]);
    let s = stats(&out);
    assert_eq!(n(&s, "events"), one_copy);
    assert_eq!(n(&s, "final_live_blocks"), 0);
    assert_eq!(n(&s, "peak_live_bytes"), n(&original, "peak_live_bytes"));
    // Several copies of two traces, cut at an exact count: every free finds its allocation
    // (the copies' pointers never meet), and times keep going forward.
    let out = dir.join("many.avt");
    let o = out.to_str().unwrap();
    allocview_ok(&[
        "splice",
        "--events",
        "80000",
        "--out",
        o,
        perl.to_str().unwrap(),
        python.to_str().unwrap(),
    ]);
    let s = stats(&out);
    assert_eq!(n(&s, "events"), 80_000);
    assert_eq!(n(&s, "frees_unknown"), 0);
    assert_eq!(n(&s, "mallocs_of_live_ptr"), 0);
    assert_eq!(n(&s, "timestamps_non_monotonic"), 0);
    assert!(s["duration_s"].as_f64().unwrap() > 2.0 * original["duration_s"].as_f64().unwrap());
    // Every copy empties its heap, so `oracle` streamed plans the copies as pieces of their
    // own, on two threads, and still gives the loaded plan's figures, limit or not.
    for extra in [&[][..], &["--limit", "96KiB"][..]] {
        let mut args = vec!["compare", "--json", "--policy", "oracle,bfc", o];
        args.extend_from_slice(extra);
        let loaded = json(&args);
        args.push("--stream");
        let out = allocview_ok(&args);
        let note = String::from_utf8_lossy(&out.stderr);
        let pieces: u64 = note
            .split(" allocations planned in ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|p| p.replace(',', "").parse().ok())
            .unwrap_or_else(|| panic!("{note}"));
        assert!(pieces >= 3, "{note}");
        let streamed: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            without_timings(streamed),
            without_timings(loaded.clone()),
            "{extra:?}"
        );
        if !extra.is_empty() {
            assert!(loaded["policies"][0]["ooms"].as_u64().unwrap() > 0);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The explorers open a window of a trace too big to load by reading it block by block: the
/// tables and addresses are the loaded window's (the explorers keep no call column, which a
/// stream does not carry).
#[test]
fn the_explorers_streamed_window_has_the_loaded_windows_tables() {
    use allocview::model::trace_data::TraceData;
    use allocview::session::WindowArgs;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;
    for name in ["python_json.avt", "xz_T2_libc.avt", "perl_hash.avt"] {
        let file = sample(name);
        for window in [
            WindowArgs {
                events: Some("100..300".into()),
                ..WindowArgs::default()
            },
            WindowArgs {
                from: Some("0.005".into()),
                to: Some("0.12".into()),
                ..WindowArgs::default()
            },
        ] {
            let progress = Arc::new(AtomicU64::new(0));
            let loaded = TraceData::load(&file, false, &window, Arc::clone(&progress)).unwrap();
            let streamed = TraceData::load_streamed_window(&file, &window, &progress).unwrap();
            let want = &loaded.events;
            assert!(want.height() > 0, "{name} {window:?}");
            assert!(streamed.events.equals_missing(want), "{name} {window:?}");
            // The addresses, kept beside the table.
            assert!(
                (0..want.height()).all(|i| streamed.address_at(i) == loaded.address_at(i)),
                "{name} {window:?}"
            );
            assert!((0..want.height()).any(|i| loaded.address_at(i) != 0));
            assert!(
                streamed.threads.equals(&loaded.threads),
                "{name} {window:?}"
            );
            assert_eq!(streamed.num_allocs, loaded.num_allocs);
            // The progress bar counts the file's bytes read.
            let read = progress.load(std::sync::atomic::Ordering::Relaxed);
            assert!(read > 0 && read <= std::fs::metadata(&file).unwrap().len());
        }
    }
}

/// Every command that loads its input works on a window of a trace too big to load (made
/// "too big" here by telling allocview it has 200 KB): the window is read block by block and
/// the command gives what it gives on the loaded window. Without a window, it refuses and
/// says what works.
#[test]
fn loading_commands_work_on_a_window_of_a_trace_too_big_to_load() {
    let dir = std::env::temp_dir().join(format!("allocview-cli-bigwin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Written now, so it has the block index that tells its size before reading it.
    let file = dir.join("python_json.avt");
    let sample = sample("python_json.avt");
    allocview_ok(&[
        "convert",
        "--to",
        "binary",
        sample.to_str().unwrap(),
        file.to_str().unwrap(),
    ]);
    let file = file.to_str().unwrap();
    let small = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_allocview"))
            .env("ALLOCVIEW_AVAILABLE_MEMORY", "200000")
            .args(args)
            .output()
            .unwrap()
    };
    let folded = dir.join("folded.txt");
    let folded = folded.to_str().unwrap();
    for cmd in [
        &["sites", "--json", "--top", "5"][..],
        &["leaks", "--json"],
        &["compare", "--json", "--policy", "bfc", "--min-limit"],
        &["flamegraph", "--folded", "-o", folded],
    ] {
        let mut args = cmd.to_vec();
        args.extend(["--events", "1000..5000", file]);
        let loaded = run(&args);
        let loaded_folded = std::fs::read(folded).ok();
        let windowed = small(&args);
        let windowed_folded = std::fs::read(folded).ok();
        assert!(
            windowed.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&windowed.stderr)
        );
        assert!(
            String::from_utf8_lossy(&windowed.stderr).contains("carried in"),
            "{args:?}"
        );
        // The JSON but for the replay speeds; other output as it is.
        let comparable = |out: &[u8]| match serde_json::from_slice::<Value>(out) {
            Ok(mut v) => {
                for p in v["policies"].as_array_mut().into_iter().flatten() {
                    p.as_object_mut().unwrap().remove("events_per_second");
                }
                v.to_string()
            }
            Err(_) => String::from_utf8_lossy(out).into_owned(),
        };
        assert_eq!(
            comparable(&windowed.stdout),
            comparable(&loaded.stdout),
            "{args:?}"
        );
        assert_eq!(windowed_folded, loaded_folded, "{args:?}");
    }
    let refused = small(&["sites", file]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("the explorers open a window of it"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// 400,000 records spliced from a real trace (seven blocks), written into `dir`.
fn spliced_python(dir: &Path) -> PathBuf {
    let file = dir.join("spliced.avt");
    allocview_ok(&[
        "splice",
        "--events",
        "400000",
        "--out",
        file.to_str().unwrap(),
        sample("python_json.avt").to_str().unwrap(),
    ]);
    file
}

/// The explorers' background scan of a trace too big to load: it reads the whole trace once,
/// keeping resume points and an overview whose highest stretch is the trace's peak; a part
/// read from the nearest point before it has exactly the tables read from the trace's start.
#[test]
fn a_part_read_from_the_scans_resume_point_has_the_tables_read_from_the_start() {
    use allocview::model::scan::{OVERVIEW_BUCKETS, scan_of};
    use allocview::session::WindowArgs;
    use allocview::session::source::window_tables;
    let dir = std::env::temp_dir().join(format!("allocview-cli-scan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = spliced_python(&dir);
    let stats = json(&["stats", "--json", file.to_str().unwrap()]);
    let events = stats["events"].as_u64().unwrap();
    let scan = scan_of(&file, events);
    let started = std::time::Instant::now();
    let overview = loop {
        let o = scan.overview();
        if o.done || o.error.is_some() {
            break o;
        }
        assert!(started.elapsed().as_secs() < 120, "the scan did not end");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(overview.error, None);
    assert_eq!(overview.scanned_events, events);
    assert!(overview.points >= 6, "{overview:?}");
    assert_eq!(overview.max_live_bytes.len(), OVERVIEW_BUCKETS);
    assert_eq!(
        overview.max_live_bytes.iter().max().copied(),
        stats["peak_live_bytes"].as_u64(),
    );
    for window in [
        WindowArgs {
            events: Some("300000..350000".into()),
            ..WindowArgs::default()
        },
        WindowArgs {
            events: Some("131072..131100".into()),
            ..WindowArgs::default()
        },
        WindowArgs {
            from: Some("1.9".into()),
            ..WindowArgs::default()
        },
    ] {
        let spec = window.spec().unwrap().unwrap();
        let point = scan.point_for(&spec).expect("a point before the window");
        assert!(point.before.events() > 0, "{window:?}");
        let read = window_tables(&file, &window, None, false, None).unwrap();
        let resumed = window_tables(&file, &window, None, false, Some(point.clone())).unwrap();
        assert_eq!(read.read_from_event, 0);
        assert_eq!(resumed.read_from_event, point.before.events() as u64);
        assert!(resumed.events.height() > 0, "{window:?}");
        assert!(resumed.events.equals_missing(&read.events), "{window:?}");
        assert!(resumed.threads.equals(&read.threads), "{window:?}");
        assert_eq!(resumed.summary, read.summary, "{window:?}");
        assert_eq!(
            (resumed.part, resumed.trace_events),
            (read.part, read.trace_events),
            "{window:?}"
        );
    }
    // The scan is found again for the same file, and not for a file written anew there.
    let again = allocview::model::scan::existing(&file).expect("the scan of this file");
    assert!(std::sync::Arc::ptr_eq(&again, &scan));
    let out = run(&[
        "splice",
        "--events",
        "300000",
        "--out",
        file.to_str().unwrap(),
        sample("python_json.avt").to_str().unwrap(),
    ]);
    assert!(out.status.success());
    assert!(allocview::model::scan::existing(&file).is_none());
    std::fs::remove_dir_all(&dir).ok();
}

/// `bench hops` on a trace made too big to load: the explorer shows its first part, waits for
/// the background read, then goes to events all over the trace; it fails if the cursor does
/// not land on the event asked for. (That a part read from a resume point is the part read
/// from the start is the test above.)
#[test]
fn bench_hops_lands_on_every_event_it_goes_to() {
    let dir = std::env::temp_dir().join(format!("allocview-cli-hops-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = spliced_python(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        // 2 MB: parts of 7,812 events, a quarter of it at 64 bytes an event.
        .env("ALLOCVIEW_AVAILABLE_MEMORY", "2000000")
        .args(["bench", "hops", "--seeks", "12", file.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("first part 0..7,812 read, replayed and drawn"),
        "{stdout}"
    );
    assert!(stdout.contains("resume points"), "{stdout}");
    assert!(
        stdout.contains("go to an event (12 of them, 12 in another part)"),
        "{stdout}"
    );
    // A trace that fits is shown whole: no parts to go between.
    let whole = run(&["bench", "hops", file.to_str().unwrap()]);
    assert!(!whole.status.success());
    assert!(String::from_utf8_lossy(&whole.stderr).contains("fits in memory"));
    std::fs::remove_dir_all(&dir).ok();
}
