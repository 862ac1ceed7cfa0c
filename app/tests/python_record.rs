//! Python programs recorded as Python: `allocview record -- python3 ...` with no flag gives
//! every allocation made while Python code runs its Python frames (function, file, line),
//! spliced into the native stack, and sees pymalloc's objects, on every CPython 3.9 to 3.13
//! the machine has (Debian's `/usr/bin/python3`, without symbols, and pyenv's), in threads,
//! `multiprocessing` children (fork and spawn) and `subprocess` children. The figures are
//! checked against tracemalloc's, taken in a separate run of the same program.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{json, ok, run};
use serde_json::Value;

/// The interpreters to test: Debian's, and each pyenv 3.9-3.13 present.
fn interpreters() -> Vec<PathBuf> {
    let mut found = vec![PathBuf::from("/usr/bin/python3")];
    if let Some(home) = std::env::var_os("HOME") {
        for v in ["3.9", "3.10", "3.11", "3.12", "3.13"] {
            let dir = Path::new(&home).join(".pyenv/versions");
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let bin = e.path().join(format!("bin/python{v}"));
                if name.starts_with(&format!("{v}.")) && bin.exists() {
                    found.push(bin);
                }
            }
        }
    }
    assert!(found[0].exists(), "Debian's /usr/bin/python3 is needed");
    found
}

/// A pyenv interpreter of version `v` (3.x), when the machine has one.
fn pyenv(v: &str) -> Option<PathBuf> {
    interpreters().into_iter().skip(1).find(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy() == format!("python{v}"))
    })
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("python-record-{name}"));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Functions holding known bytes at the peak: a dict of tuples (small objects, pymalloc's),
/// 5 KB `bytes` (the C library's), cached strings; `at_peak` prints tracemalloc's figures when
/// run with tracemalloc on.
const PROGRAM: &str = r#"import os

def build_table(n):
    return {i: (i, i * 2, str(i)) for i in range(n)}

def make_blobs(n):
    blobs = []
    for i in range(n):
        blobs.append(bytes(5000) + bytes([i % 256]))
    return blobs

def grow_cache(n):
    cache = {}
    for i in range(n):
        cache[i] = "k" * 40 + str(i)
    return cache

def at_peak():
    if os.environ.get("TRACEMALLOC_REFERENCE"):
        import tracemalloc, json
        snap = tracemalloc.take_snapshot()
        me = os.path.abspath(__file__)
        by_line = {}
        for st in snap.statistics("traceback"):
            fr = next((f for f in reversed(st.traceback) if f.filename == me), None)
            if fr is not None:
                by_line[fr.lineno] = by_line.get(fr.lineno, 0) + st.size
        current, peak = tracemalloc.get_traced_memory()
        print(json.dumps({"by_line": by_line, "current": current, "peak": peak}))

def main():
    table = build_table(150000)
    blobs = make_blobs(5000)
    cache = grow_cache(60000)
    at_peak()

main()
"#;

/// The program's functions, by the line range of each `def`.
const FUNCTIONS: [(&str, u32, u32); 3] = [
    ("build_table", 3, 4),
    ("make_blobs", 6, 10),
    ("grow_cache", 12, 16),
];

fn function_of_line(line: u32) -> Option<&'static str> {
    FUNCTIONS
        .iter()
        .find(|&&(_, first, last)| (first..=last).contains(&line))
        .map(|&(name, _, _)| name)
}

/// Records `args` into `dir/r.avt`; the traces written (one per process).
fn record(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<PathBuf> {
    let out = dir.join("r.avt");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allocview"));
    cmd.args(["record", "-o", out.to_str().unwrap(), "--"])
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "record {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut traces: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "avt"))
        .collect();
    traces.sort();
    traces
}

/// `sites --by function --json` of `trace` (each function's row has one of its stacks).
fn sites(trace: &Path, extra: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "sites",
        trace.to_str().unwrap(),
        "--by",
        "function",
        "--json",
    ];
    args.extend_from_slice(extra);
    json(&args)["sites"].as_array().unwrap().clone()
}

/// The Python frames of a site, as (function, file name, line).
fn python_frames(site: &Value) -> Vec<(String, String, u32)> {
    site["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["python"] == true)
        .map(|f| {
            let file = f["file"].as_str().unwrap();
            (
                f["function"].as_str().unwrap().to_owned(),
                file.rsplit('/').next().unwrap().to_owned(),
                f["line"].as_u64().unwrap() as u32,
            )
        })
        .collect()
}

/// Live bytes at the peak by the program's function (the innermost frame in its file),
/// as allocview and as tracemalloc count them, and each one's peak live bytes.
fn measure(
    python: &Path,
    dir: &Path,
) -> (
    HashMap<&'static str, u64>,
    HashMap<&'static str, u64>,
    u64,
    u64,
) {
    let prog = dir.join("prog.py");
    std::fs::write(&prog, PROGRAM).unwrap();
    let reference = Command::new(python)
        .args(["-X", "tracemalloc=25"])
        .arg(&prog)
        .env("TRACEMALLOC_REFERENCE", "1")
        .output()
        .unwrap();
    assert!(reference.status.success());
    let reference: Value = serde_json::from_slice(&reference.stdout).unwrap();
    let mut theirs = HashMap::new();
    for (line, bytes) in reference["by_line"].as_object().unwrap() {
        if let Some(f) = function_of_line(line.parse().unwrap()) {
            *theirs.entry(f).or_insert(0) += bytes.as_u64().unwrap();
        }
    }
    let traces = record(
        dir,
        &[python.to_str().unwrap(), prog.to_str().unwrap()],
        &[],
    );
    assert_eq!(traces.len(), 1, "{traces:?}");
    // By function: a comprehension is a function of its own before 3.12
    // (`build_table.<locals>.<dictcomp>`), part of its function after.
    let mut ours = HashMap::new();
    for site in sites(&traces[0], &[]) {
        let name = site["name"].as_str().unwrap();
        if let Some(&(f, _, _)) = FUNCTIONS
            .iter()
            .find(|(f, _, _)| name == *f || name.starts_with(&format!("{f}.<locals>.")))
        {
            *ours.entry(f).or_insert(0) += site["live_bytes"].as_u64().unwrap();
        }
    }
    let stats = json(&["stats", traces[0].to_str().unwrap(), "--json"]);
    let peak = stats["peak_live_bytes"].as_u64().unwrap();
    (ours, theirs, peak, reference["peak"].as_u64().unwrap())
}

fn within(ours: u64, theirs: u64, fraction: f64) -> bool {
    (ours as f64 - theirs as f64).abs() <= theirs as f64 * fraction
}

/// Each function's live bytes at the peak, and the peak, within 10% of tracemalloc's, on
/// Debian's interpreter (no symbols) and on a pyenv 3.12 or 3.13.
#[test]
fn sites_and_the_peak_match_tracemalloc_on_two_interpreters() {
    let mut pythons = vec![PathBuf::from("/usr/bin/python3")];
    pythons.extend(pyenv("3.12").or_else(|| pyenv("3.13")));
    assert!(pythons.len() == 2, "a pyenv 3.12 or 3.13 is needed");
    for (i, python) in pythons.iter().enumerate() {
        let dir = scratch(&format!("accuracy-{i}"));
        let (ours, theirs, peak, their_peak) = measure(python, &dir);
        for (f, _, _) in FUNCTIONS {
            let (o, t) = (ours.get(f).copied().unwrap_or(0), theirs[f]);
            assert!(
                t > 5_000_000 && within(o, t, 0.10),
                "{}: {f}: {o} bytes here, tracemalloc {t}",
                python.display()
            );
        }
        assert!(
            within(peak, their_peak, 0.10),
            "{}: peak {peak}, tracemalloc {their_peak}",
            python.display()
        );
    }
}

/// Every interpreter the machine has records the program's own functions, files and lines
/// (3.9 and 3.10 name functions without their class), and `stats` sees pymalloc's objects.
#[test]
fn every_interpreter_records_python_frames() {
    let program = "class Store:\n    def fill(self):\n        return [str(i) * 3 for i in range(30000)]\n\
                   def main():\n    return Store().fill()\n\
                   kept = main()\n";
    for (i, python) in interpreters().iter().enumerate() {
        let dir = scratch(&format!("versions-{i}"));
        let prog = dir.join("store.py");
        std::fs::write(&prog, program).unwrap();
        let traces = record(
            &dir,
            &[python.to_str().unwrap(), prog.to_str().unwrap()],
            &[],
        );
        let all = sites(&traces[0], &[]);
        // The site of the strings (the interpreter's start-up, imports of installed
        // packages included, may hold more).
        let site = all
            .iter()
            .find(|s| {
                python_frames(s)
                    .iter()
                    .any(|(f, file, _)| f == "main" && file == "store.py")
            })
            .unwrap_or_else(|| panic!("{}: no site in main: {:#?}", python.display(), &all[..3]));
        let top = python_frames(site);
        let names: Vec<&str> = top.iter().map(|(f, _, _)| f.as_str()).collect();
        let fill = names
            .iter()
            .position(|f| f.ends_with("fill") || f.contains("listcomp"));
        let main = names.iter().position(|f| *f == "main");
        assert!(
            fill.is_some() && main.is_some() && fill < main,
            "{}: {top:?}",
            python.display()
        );
        assert!(
            top.iter()
                .any(|(f, file, line)| f == "main" && file == "store.py" && *line == 5)
        );
        assert!(
            top.iter()
                .any(|(_, file, line)| file == "store.py" && *line == 3),
            "{}: {top:?}",
            python.display()
        );
        // 30,000 strings of about 60 bytes each are pymalloc's objects: seen.
        assert!(
            site["live_blocks"].as_u64().unwrap() >= 30_000,
            "{}: {site}",
            python.display()
        );
    }
}

/// Threads, `multiprocessing` children (fork and spawn) and a `subprocess` child: each
/// process's trace names the program's functions.
#[test]
fn threads_and_child_processes_have_python_frames() {
    let dir = scratch("children");
    let prog = dir.join("kids.py");
    std::fs::write(
        &prog,
        "import threading, multiprocessing as mp, subprocess, sys\n\
         def worker(n):\n    keep = [bytes(1000) for _ in range(n)]\n    return len(keep)\n\
         def child(q):\n    q.put(worker(2000))\n\
         if __name__ == '__main__':\n\
         \x20   ts = [threading.Thread(target=worker, args=(3000,)) for _ in range(3)]\n\
         \x20   [t.start() for t in ts]; [t.join() for t in ts]\n\
         \x20   for method in ('fork', 'spawn'):\n\
         \x20       ctx = mp.get_context(method)\n\
         \x20       q = ctx.Queue(); p = ctx.Process(target=child, args=(q,)); p.start(); q.get(); p.join()\n\
         \x20   subprocess.run([sys.executable, '-c', 'def sub():\\n    return [str(i) for i in range(20000)]\\nx = sub()'], check=True)\n",
    )
    .unwrap();
    let traces = record(&dir, &["/usr/bin/python3", prog.to_str().unwrap()], &[]);
    let mut worker_threads = 0;
    let mut children = 0;
    let mut sub = 0;
    for t in &traces {
        for site in sites(t, &[]) {
            let frames = python_frames(&site);
            let has = |f: &str| frames.iter().any(|(name, _, _)| name == f);
            if has("worker") && has("Thread.run") {
                worker_threads += 1;
            }
            if has("worker") && has("child") {
                children += 1;
            }
            if has("sub") {
                sub += 1;
            }
        }
    }
    assert!(traces.len() >= 4, "{traces:?}");
    assert!(worker_threads >= 1, "no thread site");
    assert!(
        children >= 2,
        "the fork and spawn children: {children} sites"
    );
    assert!(sub >= 1, "no subprocess site");
}

/// `PYTHONMALLOC=malloc` keeps working as before: every allocation reaches the C library,
/// with Python frames still.
#[test]
fn pythonmalloc_malloc_is_recorded_as_the_c_librarys_calls() {
    let dir = scratch("pythonmalloc");
    let prog = dir.join("p.py");
    std::fs::write(
        &prog,
        "def keep():\n    return [str(i) for i in range(40000)]\nx = keep()\n",
    )
    .unwrap();
    let traces = record(
        &dir,
        &["/usr/bin/python3", prog.to_str().unwrap()],
        &[("PYTHONMALLOC", "malloc")],
    );
    let t = traces[0].to_str().unwrap();
    let objects = json(&["stats", t, "--json"]);
    let libc = json(&["stats", t, "--json", "--requests", "libc"]);
    assert_eq!(
        objects["events"], libc["events"],
        "one view when no pymalloc"
    );
    let top = sites(&traces[0], &[]);
    assert!(python_frames(&top[0]).iter().any(|(f, _, _)| f == "keep"));
}

/// `compare` replays what reached the C library by default (pymalloc's arenas, not its
/// objects), says so, and `--requests objects` replays the objects.
#[test]
fn compare_replays_the_c_librarys_requests_by_default() {
    let dir = scratch("compare");
    let prog = dir.join("p.py");
    std::fs::write(
        &prog,
        "def keep():\n    return [str(i) for i in range(100000)]\nx = keep()\n",
    )
    .unwrap();
    let traces = record(&dir, &["/usr/bin/python3", prog.to_str().unwrap()], &[]);
    let t = traces[0].to_str().unwrap();
    let out = run(&["compare", t, "--policy", "glibc"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("recorded in a CPython interpreter: read what reached the C library"),
        "{stderr}"
    );
    let libc = json(&["compare", t, "--policy", "glibc", "--json"]);
    let objects = json(&[
        "compare",
        t,
        "--policy",
        "glibc",
        "--json",
        "--requests",
        "objects",
    ]);
    let events = |v: &Value| v["events"].as_u64().unwrap();
    // 100,000 strings are 100,000 object requests, served from a few dozen arenas.
    assert!(
        events(&objects) > events(&libc) + 150_000,
        "{} vs {}",
        events(&objects),
        events(&libc)
    );
    let text = ok(&["stats", t]);
    assert!(!text.is_empty());
}

/// `leaks`, `flamegraph`, `diff` and Parquet's frames table carry the Python frames, and the
/// frames table says which frames are Python's.
#[test]
fn leaks_flamegraphs_diffs_and_parquet_carry_python_frames() {
    use polars::prelude::*;

    let dir = scratch("consumers");
    let mut traces = Vec::new();
    for n in [20_000, 60_000] {
        let sub = dir.join(n.to_string());
        std::fs::create_dir_all(&sub).unwrap();
        let prog = sub.join("grow.py");
        std::fs::write(
            &prog,
            // `os._exit`: the interpreter's teardown would free what it keeps. The sleep lets
            // the tracer's clock thread join the interpreter first (it does so once
            // `Py_IsInitialized()` is true, between two bytecodes): on a loaded machine the
            // whole program could otherwise run before, with no Python frames to show.
            format!(
                "import os, time\nKEPT = []\ndef keep(n):\n    KEPT.append([str(i) * 4 for i in range(n)])\n\
                 time.sleep(0.5)\nkeep({n})\nos._exit(0)\n"
            ),
        )
        .unwrap();
        traces.extend(record(
            &sub,
            &["/usr/bin/python3", prog.to_str().unwrap()],
            &[],
        ));
    }
    let (a, b) = (traces[0].to_str().unwrap(), traces[1].to_str().unwrap());
    let folded = ok(&["flamegraph", b, "--folded"]);
    assert!(
        folded.lines().any(|l| l.contains(";<module>;keep;")),
        "{}",
        &folded[..folded.len().min(2000)]
    );
    let leaks = json(&["leaks", b, "--json"]);
    let kept = leaks["leaks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| {
            python_frames(l)
                .iter()
                .any(|(f, file, line)| f == "keep" && file == "grow.py" && *line == 4)
        })
        .unwrap_or_else(|| panic!("{leaks}"));
    assert!(kept["live_bytes"].as_u64().unwrap() > 1_000_000);
    let diff = json(&["diff", a, b, "--json"]);
    assert!(
        diff["sites"].as_array().unwrap().iter().any(|s| {
            s["name"].as_str().is_some_and(|n| n.starts_with("keep"))
                && s["change_bytes"].as_i64().unwrap() > 1_000_000
        }),
        "{diff}"
    );
    let parquet = dir.join("b.parquet");
    ok(&["convert", b, parquet.to_str().unwrap()]);
    let frames = ParquetReader::new(std::fs::File::open(dir.join("b.frames.parquet")).unwrap())
        .finish()
        .unwrap();
    let python = frames.column("python").unwrap().bool().unwrap();
    let functions = frames.column("function").unwrap().str().unwrap();
    let modules = frames.column("module").unwrap().str().unwrap();
    let mut saw_keep = false;
    for i in 0..frames.height() {
        let is_python = python.get(i).unwrap();
        assert_eq!(is_python, modules.get(i) == Some("[python]"));
        saw_keep |= is_python && functions.get(i) == Some("keep");
    }
    assert!(saw_keep && python.any() && !python.all());
}
