//! The heaptrack reader on real data files: its totals against heaptrack_print's on the same
//! file, a recording of our own program made with Debian's heaptrack, and damaged files.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;

use allocview_loaders::analysis::stats::{TraceStats, events_per_thread};
use allocview_loaders::heaptrack::load_heaptrack;
use allocview_loaders::{LoadOptions, MallocTrace, Strictness};
use allocview_sim::trace::EventKind;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/heaptrack")
        .join(name)
}

fn shared(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/interop/heaptrack")
        .join(name);
    p.exists().then_some(p)
}

fn installed(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
}

/// Skips (with a message) when a tool is missing, unless CI asks for every input.
fn require(tool: &str) -> bool {
    if installed(tool) {
        return true;
    }
    assert!(
        std::env::var_os("ALLOCVIEW_REQUIRE_TEST_INPUTS").is_none(),
        "{tool} is required (apt-get install heaptrack)"
    );
    eprintln!("skipping: {tool} is not installed (apt-get install heaptrack)");
    false
}

fn load(path: &Path, strictness: Strictness) -> MallocTrace {
    let opts = LoadOptions {
        strictness,
        ..LoadOptions::default()
    };
    load_heaptrack(path, &opts).unwrap()
}

fn stats(path: &Path, trace: &MallocTrace) -> TraceStats {
    let view = allocview_loaders::trace_view(&trace.events, path).unwrap();
    let per_thread = events_per_thread(&trace.events, trace.threads.height()).unwrap();
    TraceStats::compute(&view, per_thread, &trace.summary)
}

/// heaptrack_print's byte figures: under 1000 bytes `5B`, else two decimals in powers of 1000
/// (`996.97K`, `12.22M`).
fn heaptrack_bytes(bytes: u64) -> String {
    if bytes < 1000 {
        return format!("{bytes}B");
    }
    let mut value = bytes as f64;
    let mut unit = 'B';
    for u in ['K', 'M', 'G', 'T'] {
        if value < 1000.0 {
            break;
        }
        value /= 1000.0;
        unit = u;
    }
    format!("{value:.2}{unit}")
}

/// What `heaptrack_print` says of a file, with every leak counted (no suppression: allocview
/// counts every byte not freed).
struct Printed {
    calls: u64,
    temporary: u64,
    peak: String,
    leaked: String,
}

fn heaptrack_print(path: &Path) -> Printed {
    let out = Command::new("heaptrack_print")
        .args([
            "--disable-embedded-suppressions",
            "--disable-builtin-suppressions",
            "-p",
            "0",
            "-a",
            "0",
            "-T",
            "0",
            "-l",
            "0",
        ])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |prefix: &str| -> String {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("heaptrack_print printed no {prefix:?}:\n{text}"));
        line.trim().split(' ').next().unwrap().to_owned()
    };
    Printed {
        calls: field("calls to allocation functions:").parse().unwrap(),
        temporary: field("temporary memory allocations:").parse().unwrap(),
        peak: field("peak heap memory consumption:"),
        leaked: field("total memory leaked:"),
    }
}

/// heaptrack_print's count of temporary allocations, from our pairing: frees of the allocation
/// made just before them, with no other allocation or free between. heaptrack_print counts a
/// free of the same class as the last allocation, and only LIFO pairing makes that free end
/// that very allocation. It also resets its "last class" to 0 after each free, so a free of
/// class 0 (the first `a` line, the class of the first allocation) right after another free
/// counts too: that quirk is counted here as well.
fn temporary(trace: &MallocTrace) -> u64 {
    let kinds: Vec<u8> = trace.events["kind"]
        .u8()
        .unwrap()
        .into_no_null_iter()
        .collect();
    let ids: Vec<Option<u32>> = trace.events["alloc_id"].u32().unwrap().iter().collect();
    let stacks: Vec<Option<u32>> = trace.events["stack_id"].u32().unwrap().iter().collect();
    let sizes: Vec<u64> = trace.events["size_bytes"]
        .u64()
        .unwrap()
        .into_no_null_iter()
        .collect();
    let mut class_of = std::collections::HashMap::new();
    for i in 0..kinds.len() {
        if kinds[i] == EventKind::Alloc as u8 {
            class_of.insert(ids[i], (sizes[i], stacks[i]));
        }
    }
    let class_0 = class_of.get(&Some(0)).copied();
    let mut last_alloc = None;
    let mut after_free = false;
    let mut n = 0;
    for i in 0..kinds.len() {
        if kinds[i] == EventKind::Alloc as u8 {
            last_alloc = ids[i];
            after_free = false;
        } else if kinds[i] == EventKind::Free as u8 {
            let quirk = after_free && class_of.get(&ids[i]).copied() == class_0;
            n += u64::from((ids[i].is_some() && ids[i] == last_alloc) || quirk);
            last_alloc = None;
            after_free = true;
        }
    }
    n
}

/// Our totals equal heaptrack_print's on the same file.
fn check_against_heaptrack_print(path: &Path) {
    let trace = load(path, Strictness::Strict);
    let s = stats(path, &trace);
    let printed = heaptrack_print(path);
    let name = path.display();
    assert_eq!(s.mallocs, printed.calls, "allocation calls of {name}");
    assert_eq!(
        heaptrack_bytes(s.peak_live_bytes),
        printed.peak,
        "peak of {name}"
    );
    assert_eq!(
        heaptrack_bytes(s.final_live_bytes),
        printed.leaked,
        "leaked of {name}"
    );
    assert_eq!(temporary(&trace), printed.temporary, "temporary of {name}");
    assert_eq!(s.frees_unknown, 0, "{name}");
    assert!(trace.summary.notes.iter().any(|n| n.contains("LIFO")));
}

#[test]
fn the_byte_format_is_heaptrack_prints() {
    assert_eq!(heaptrack_bytes(5), "5B");
    assert_eq!(heaptrack_bytes(72_714), "72.71K");
    assert_eq!(heaptrack_bytes(12_220_000), "12.22M");
}

#[test]
fn small_real_files_match_heaptrack_print() {
    // Figures heaptrack_print 1.4.0 printed for these files, for machines without it:
    // `heaptrack_print --disable-embedded-suppressions --disable-builtin-suppressions FILE`.
    for (name, calls, peak, leaked) in [
        ("heaptrack.david.18594.gz", 2896, "996.97K", "30.46K"),
        (
            "heaptrack.embedded_lsan_suppressions.84207.zst",
            5,
            "72.71K",
            "10B",
        ),
    ] {
        let path = data(name);
        let trace = load(&path, Strictness::Strict);
        let s = stats(&path, &trace);
        assert_eq!(s.mallocs, calls, "{name}");
        assert_eq!(heaptrack_bytes(s.peak_live_bytes), peak, "{name}");
        assert_eq!(heaptrack_bytes(s.final_live_bytes), leaked, "{name}");
        if installed("heaptrack_print") {
            check_against_heaptrack_print(&path);
        }
    }
}

#[test]
fn large_shared_files_match_heaptrack_print() {
    for name in [
        "heaptrack.heaptrack_gui.99454.zst",
        "heaptrack.heaptrack_gui.99529.zst",
    ] {
        let Some(path) = shared(name) else {
            assert!(
                std::env::var_os("ALLOCVIEW_REQUIRE_TEST_INPUTS").is_none(),
                "a required test input is missing: ../shared/data/interop/heaptrack/{name}"
            );
            eprintln!("skipping {name}: ../shared/data/interop/heaptrack is not present");
            continue;
        };
        if require("heaptrack_print") {
            check_against_heaptrack_print(&path);
        }
        let trace = load(&path, Strictness::Strict);
        assert!(trace.memory.len() > 200, "{name}: RSS samples");
    }
}

fn frames_named(trace: &MallocTrace, stack: u32) -> Vec<String> {
    let stacks = trace.stacks.as_ref().unwrap();
    stacks
        .frames_of(stack)
        .map(|f| f.function.clone())
        .collect()
}

/// The sizes allocated under `function` and still live at the end, in event order.
fn allocations_under(trace: &MallocTrace, function: &str) -> (Vec<u64>, Vec<u64>) {
    let kinds: Vec<u8> = trace.events["kind"]
        .u8()
        .unwrap()
        .into_no_null_iter()
        .collect();
    let sizes: Vec<u64> = trace.events["size_bytes"]
        .u64()
        .unwrap()
        .into_no_null_iter()
        .collect();
    let ids: Vec<Option<u32>> = trace.events["alloc_id"].u32().unwrap().iter().collect();
    let stacks: Vec<Option<u32>> = trace.events["stack_id"].u32().unwrap().iter().collect();
    let mut freed = std::collections::HashSet::new();
    for (k, id) in kinds.iter().zip(&ids) {
        if *k == EventKind::Free as u8 {
            freed.insert(*id);
        }
    }
    let (mut all, mut live) = (Vec::new(), Vec::new());
    for i in 0..kinds.len() {
        let under = stacks[i].is_some_and(|s| frames_named(trace, s).iter().any(|f| f == function));
        if kinds[i] == EventKind::Alloc as u8 && under {
            all.push(sizes[i]);
            if !freed.contains(&ids[i]) {
                live.push(sizes[i]);
            }
        }
    }
    (all, live)
}

#[test]
fn our_own_program_recorded_with_heaptrack() {
    if !require("heaptrack") || !require("heaptrack_print") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("prog");
    let cc = Command::new("cc")
        .args(["-g", "-O0", "-o"])
        .arg(&exe)
        .arg(data("prog.c"))
        .status()
        .unwrap();
    assert!(cc.success());
    let out = dir.path().join("heaptrack.prog");
    let run = Command::new("heaptrack")
        .arg("-o")
        .arg(&out)
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let file = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("heaptrack.prog")
        })
        .expect("heaptrack wrote no data file");
    assert!(allocview_loaders::detect(&file).unwrap() == allocview_loaders::InputKind::Heaptrack);
    let trace = load(&file, Strictness::Strict);
    // prog.c: ten make_block(1000), five freed; make_table(100) (calloc 800 bytes) freed,
    // make_table(3) (24 bytes) leaked.
    let (blocks, blocks_live) = allocations_under(&trace, "make_block");
    assert_eq!(blocks, [1000; 10]);
    assert_eq!(blocks_live, [1000; 5]);
    let (tables, tables_live) = allocations_under(&trace, "make_table");
    assert_eq!(tables, [800, 24]);
    assert_eq!(tables_live, [24]);
    let (from_main, _) = allocations_under(&trace, "main");
    assert_eq!(from_main.len(), 12);
    check_against_heaptrack_print(&file);
}

#[test]
fn a_cut_file_names_where_it_stops_and_lenient_loads_what_is_before() {
    let whole = std::fs::read(data("heaptrack.david.18594.gz")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.gz");
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let strict = load_heaptrack(&cut, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(strict.contains("cut short after line"), "{strict}");
    assert!(
        strict.contains("bytes of the file read") && strict.contains("cut.gz"),
        "{strict}"
    );
    let t = load(&cut, Strictness::Lenient);
    assert!(t.summary.truncated.is_some());
    assert!(t.summary.mallocs > 0 && t.summary.mallocs < 2896);
}

#[test]
fn a_corrupt_file_names_its_line_and_lenient_counts_the_lines_it_skips() {
    let text = {
        use std::io::Read as _;
        let mut s = String::new();
        flate2::read::GzDecoder::new(
            std::fs::File::open(data("heaptrack.david.18594.gz")).unwrap(),
        )
        .read_to_string(&mut s)
        .unwrap();
        s
    };
    // Lines 600 and 700 damaged (a letter no line starts with, a size that is not hex).
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines[599] = format!("Q{}", &lines[599]);
    lines[699] = "a 12g4 1".to_owned();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let e = load_heaptrack(&bad, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("line 600, column 1") && e.contains("bad.txt"),
        "{e}"
    );
    let t = load(&bad, Strictness::Lenient);
    assert_eq!(t.summary.bad_lines, 2);
    assert_eq!(t.summary.first_bad_lines[1].line, 700);
}

#[test]
fn a_corrupt_zstd_stream_names_the_file_byte() {
    let mut bytes = std::fs::read(data("heaptrack.embedded_lsan_suppressions.84207.zst")).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 16] {
        *b ^= 0x5a;
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.zst");
    std::fs::write(&bad, &bytes).unwrap();
    let e = load_heaptrack(&bad, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("zstd stream") && e.contains("bytes of the file read") && e.contains("bad.zst"),
        "{e}"
    );
    // Lenient: what was decompressed before the damage (maybe nothing) loads, and says so.
    let t = load(&bad, Strictness::Lenient);
    assert!(t.summary.truncated.is_some());
}

#[test]
fn the_raw_stream_is_refused_as_not_yet_interpreted() {
    let path = data("heaptrack.test_sysroot.raw");
    assert_eq!(
        allocview_loaders::detect(&path).unwrap(),
        allocview_loaders::InputKind::Heaptrack
    );
    let e = allocview_loaders::load(&path, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("RAW") && e.contains("heaptrack_interpret"),
        "{e}"
    );
}
