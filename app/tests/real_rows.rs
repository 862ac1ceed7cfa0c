//! The real-allocator rows (`real-glibc`, `real-jemalloc`, `real-mimalloc`, `real-tcmalloc`)
//! against the test's own measurement: `real_rss.c` parses the text trace itself, replays it
//! under `LD_PRELOAD` and reads its anonymous resident memory after every call (the rows sample
//! every few hundred), sharing no code with allocview.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{fails, json, repo, sample};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// The libraries the rows preload (Debian's packages; `.ci/run` installs them).
const LIBS: &[(&str, &str)] = &[
    (
        "real-jemalloc",
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    ),
    (
        "real-mimalloc",
        "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
    ),
    (
        "real-tcmalloc",
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    ),
];

fn harness(dir: &Path) -> PathBuf {
    let exe = dir.join("real_rss");
    let st = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(repo("app/tests/real_rss.c"))
        .status()
        .unwrap();
    assert!(st.success(), "cc failed on real_rss.c");
    exe
}

/// The harness's (peak, final) resident bytes above its baseline for `trace` (gzipped text),
/// with `lib` preloaded.
fn measured(exe: &Path, trace: &Path, lib: Option<&str>, env: &[(&str, &str)]) -> (u64, u64) {
    {
        let text = Command::new("zcat").arg(trace).output().unwrap().stdout;
        let mut cmd = Command::new(exe);
        cmd.env_remove("LD_PRELOAD").env_remove("GLIBC_TUNABLES");
        if let Some(lib) = lib {
            cmd.env("LD_PRELOAD", lib);
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &text).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let s = String::from_utf8(out.stdout).unwrap();
        let mut w = s.split_whitespace().map(|v| v.parse::<u64>().unwrap());
        (w.next().unwrap(), w.next().unwrap())
    }
}

fn row<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no row {name} in {v}"))
}

/// Within 10% of the independent figure, or 128 KiB on the small ones (a few pages of each
/// process's own come and go, and mimalloc gives pages back after a delay, which the harness's
/// slower replay reaches more often).
fn close(ours: u64, theirs: u64) -> bool {
    ours.abs_diff(theirs) <= (theirs / 10).max(128 << 10)
}

/// Each row as the test replays it: the variant (jemalloc's decay turned off, so that what it
/// gives back does not depend on how long the replay takes: the harness reads its memory after
/// every call, and is far slower), the library, and the environment the harness gets to match.
/// mimalloc also gives pages back after a delay (`reset_delay`), with no setting that takes
/// time out of it: its final RSS is not compared, its peak is.
struct Checked {
    variant: &'static str,
    lib: Option<&'static str>,
    env: &'static [(&'static str, &'static str)],
    final_compared: bool,
}

const CHECKED: &[Checked] = &[
    Checked {
        variant: "real-glibc:threads=one",
        lib: None,
        env: &[],
        final_compared: true,
    },
    Checked {
        variant: "real-jemalloc:threads=one:dirty_decay_ms=-1:muzzy_decay_ms=-1",
        lib: Some(LIBS[0].1),
        env: &[("MALLOC_CONF", "dirty_decay_ms:-1,muzzy_decay_ms:-1")],
        final_compared: true,
    },
    Checked {
        variant: "real-mimalloc:threads=one",
        lib: Some(LIBS[1].1),
        env: &[],
        final_compared: false,
    },
    Checked {
        variant: "real-tcmalloc:threads=one",
        lib: Some(LIBS[2].1),
        env: &[],
        final_compared: true,
    },
];

#[test]
fn each_real_row_s_peak_rss_matches_an_independent_replay_under_ld_preload() {
    let dir = tempfile::tempdir().unwrap();
    let exe = harness(dir.path());
    for trace in ["find_usr_include.trace.gz", "python_fragments.trace.gz"] {
        let path = sample(trace);
        let policies: Vec<&str> = CHECKED.iter().map(|c| c.variant).collect();
        let v = json(&[
            "compare",
            path.to_str().unwrap(),
            "--json",
            "--policy",
            &policies.join(","),
        ]);
        let mut checked = 0;
        for c in CHECKED {
            let name = c.variant;
            let r = row(&v, name);
            let peak = r["peak_rss_bytes"].as_u64().unwrap();
            let fin = r["final_rss_bytes"].as_u64().unwrap();
            assert_eq!(r["peak_footprint_bytes"].as_u64().unwrap(), peak);
            let (their_peak, their_final) = measured(&exe, &path, c.lib, c.env);
            eprintln!("{trace} {name}: peak {peak} vs {their_peak}, final {fin} vs {their_final}");
            assert!(
                close(peak, their_peak),
                "{trace} {name}: peak RSS {peak} against the harness's {their_peak}"
            );
            assert!(
                !c.final_compared || close(fin, their_final),
                "{trace} {name}: final RSS {fin} against the harness's {their_final}"
            );
            assert!(r["rss_at_peak_live_bytes"].as_u64().unwrap() <= peak);
            assert_eq!(r["real"], true);
            checked += 1;
        }
        assert_eq!(checked, 4);
    }
}

#[test]
fn glibc_model_and_real_glibc_say_how_far_apart_they_are() {
    let path = sample("python_fragments.trace.gz");
    let v = json(&[
        "compare",
        path.to_str().unwrap(),
        "--json",
        "--policy",
        "glibc,real-glibc",
    ]);
    let model = row(&v, "glibc");
    let real = row(&v, "real-glibc");
    let m = &model["model_vs_real"];
    assert_eq!(m, &real["model_vs_real"]);
    let (mp, rp) = (
        m["model_peak_footprint_bytes"].as_u64().unwrap(),
        m["real_peak_rss_bytes"].as_u64().unwrap(),
    );
    assert_eq!(mp, model["peak_footprint_bytes"].as_u64().unwrap());
    assert_eq!(rp, real["peak_rss_bytes"].as_u64().unwrap());
    let diff = m["difference_fraction"].as_f64().unwrap();
    assert!((diff - (mp as f64 - rp as f64) / rp as f64).abs() < 1e-9);
    let table = common::ok(&[
        "compare",
        path.to_str().unwrap(),
        "--policy",
        "glibc,real-glibc",
    ]);
    assert!(table.contains("glibc model against real-glibc"), "{table}");
}

#[test]
fn settings_reach_the_allocator_and_each_row_says_its_environment_line() {
    let path = sample("python_fragments.trace.gz");
    // jemalloc returning every freed page at once ends lower than jemalloc keeping them.
    let v = json(&[
        "compare",
        path.to_str().unwrap(),
        "--json",
        "--policy",
        "real-jemalloc,real-jemalloc:dirty_decay_ms=0,muzzy_decay_ms=0",
    ]);
    let plain = row(&v, "real-jemalloc");
    let eager = row(&v, "real-jemalloc:dirty_decay_ms=0:muzzy_decay_ms=0");
    assert_eq!(
        eager["env"],
        "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \
         MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0"
    );
    assert!(
        eager["final_rss_bytes"].as_u64().unwrap() < plain["final_rss_bytes"].as_u64().unwrap(),
        "{eager} against {plain}"
    );
    // real-glibc runs beside them as the program's own allocator, which advice compares with.
    let glibc = row(&v, "real-glibc");
    for a in v["advice"].as_array().unwrap() {
        assert_eq!(a["baseline"], "real-glibc");
        assert!(a["peak_rss_bytes"].as_u64().unwrap() < glibc["peak_rss_bytes"].as_u64().unwrap());
        assert!(a["text"].as_str().unwrap().contains("lower"));
    }
}

#[test]
fn every_traced_thread_replays_on_its_own_thread_and_threads_one_on_one() {
    let path = sample("xz_T2_8KiB_blocks.trace.gz");
    let v = json(&[
        "compare",
        path.to_str().unwrap(),
        "--json",
        "--policy",
        "real-glibc,real-glibc:threads=one",
    ]);
    for (name, threads) in [("real-glibc", "each"), ("real-glibc:threads=one", "one")] {
        let r = row(&v, name);
        assert_eq!(r["threads"], threads);
        // xz exits with its 64 MiB blocks live: 186 MiB stay resident, every page written.
        let fin = r["final_rss_bytes"].as_u64().unwrap();
        assert!((186 << 20..200 << 20).contains(&fin), "{name}: {fin}");
    }
}

#[test]
fn a_program_s_first_thread_replays_on_the_main_thread_and_its_main_arena() {
    // One traced thread: with `threads=each` it is the program's main thread, and glibc serves
    // it from the main arena on `brk`, as with `threads=one`; a thread of its own would get
    // an arena of its own, mapped in 64 MiB heaps and trimmed differently.
    let path = sample("find_usr_include.trace.gz");
    let v = json(&[
        "compare",
        path.to_str().unwrap(),
        "--json",
        "--policy",
        "real-glibc,real-glibc:threads=one",
    ]);
    let (each, one) = (row(&v, "real-glibc"), row(&v, "real-glibc:threads=one"));
    for key in ["peak_rss_bytes", "final_rss_bytes"] {
        assert_eq!(each[key], one[key], "{key}");
    }
}

#[test]
fn a_missing_library_is_named_with_how_to_install_it() {
    let path = sample("find_usr_include.trace.gz");
    let err = fails(&[
        "compare",
        path.to_str().unwrap(),
        "--policy",
        "real-jemalloc:lib=/nonexistent/libjemalloc.so.2",
    ]);
    assert!(err.contains("/nonexistent/libjemalloc.so.2"), "{err}");
    let err = fails(&["compare", path.to_str().unwrap(), "--policy", "real-hoard"]);
    assert!(err.contains("real-jemalloc"), "{err}");
    // A PyTorch snapshot's GPU memory is not replayed through a C allocator.
    let err = fails(&[
        "compare",
        &common::snapshot("lm_forward_a"),
        "--policy",
        "real-glibc",
    ]);
    assert!(err.contains("malloc traces"), "{err}");
    // Commands that replay only the simulated policies say so.
    let err = fails(&[
        "bench",
        "replay",
        path.to_str().unwrap(),
        "--policy",
        "real-glibc",
    ]);
    assert!(err.contains("real-allocator row"), "{err}");
}

#[test]
fn the_series_of_a_real_row_is_its_resident_memory_on_the_trace_s_time_axis() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("series.parquet");
    let path = sample("python_fragments.trace.gz");
    json(&[
        "compare",
        path.to_str().unwrap(),
        "--json",
        "--policy",
        "glibc,real-glibc",
        "--parquet",
        out.to_str().unwrap(),
    ]);
    use polars::prelude::SerReader as _;
    let df = polars::prelude::ParquetReader::new(std::fs::File::open(&out).unwrap())
        .finish()
        .unwrap();
    let policy = df.column("policy").unwrap().str().unwrap().clone();
    let foot = df.column("footprint_bytes").unwrap().u64().unwrap().clone();
    let t = df.column("t_s").unwrap().f64().unwrap().clone();
    let of = |name: &str| -> Vec<(f64, u64)> {
        (0..df.height())
            .filter(|&i| policy.get(i) == Some(name))
            .map(|i| (t.get(i).unwrap(), foot.get(i).unwrap()))
            .collect()
    };
    let (model, real) = (of("glibc"), of("real-glibc"));
    assert_eq!(model.len(), real.len());
    assert!(model.iter().zip(&real).all(|(a, b)| a.0 == b.0));
    let v = json(&[
        "compare",
        path.to_str().unwrap(),
        "--json",
        "--policy",
        "real-glibc",
    ]);
    let peak = row(&v, "real-glibc")["peak_rss_bytes"].as_u64().unwrap();
    let series_peak = real.iter().map(|r| r.1).max().unwrap();
    assert!(close(series_peak, peak), "{series_peak} against {peak}");
}

#[test]
fn report_and_diff_draw_and_compare_the_real_rows_beside_the_policies() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let path = sample("python_fragments.trace.gz");
    common::ok(&[
        "report",
        path.to_str().unwrap(),
        "--policy",
        "glibc,real-jemalloc",
        "--out",
        out.to_str().unwrap(),
    ]);
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let names: Vec<&str> = summary
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap())
        .collect();
    assert_eq!(names, ["glibc", "real-glibc", "real-jemalloc"]);
    let timeline = std::fs::read_to_string(out.join("timeline.csv")).unwrap();
    for name in names {
        assert!(
            timeline.lines().any(|l| l.starts_with(&format!("{name},"))),
            "{name} has no series"
        );
    }
    assert!(out.join("timeline.png").is_file());
    // The model's heap map only: a real allocator's heap is not seen.
    assert!(out.join("heapmap_glibc.png").is_file());
    assert!(!out.join("heapmap_real-jemalloc.png").exists());

    let v = json(&[
        "diff",
        sample("find_usr_include.trace.gz").to_str().unwrap(),
        path.to_str().unwrap(),
        "--json",
        "--policy",
        "glibc,real-jemalloc",
    ]);
    let names: Vec<&str> = v["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["glibc", "real-glibc", "real-jemalloc"]);
    let je = &v["policies"][2];
    // Two traces of 242 KiB and 18.8 MiB live: the real peak follows.
    assert!(
        je["a_peak_footprint_bytes"].as_u64().unwrap() < 4 << 20,
        "{je}"
    );
    assert!(
        je["b_peak_footprint_bytes"].as_u64().unwrap() > 18 << 20,
        "{je}"
    );
}
