//! allocview's Parquet as the tools users run read it: pyarrow and DuckDB (through
//! `tests/python/read_parquet.py`) and polars, checked against allocview's own figures.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;

use polars::prelude::*;
use serde_json::Value;

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces")
        .join(name)
}

#[path = "../../loaders/tests/scratch/mod.rs"]
mod scratch;

/// A test's own folder: a command's companion files land beside its output, and a refused
/// command must leave nothing there.
fn scratch_dir() -> tempfile::TempDir {
    scratch::scratch_dir("allocview-parquet-")
}

fn allocview(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "allocview {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json_of(args: &[&str]) -> Value {
    serde_json::from_slice(&allocview(args).stdout).unwrap()
}

/// The Python that has duckdb and pyarrow (`ALLOCVIEW_PYTHON`, else `python3`). Missing, the
/// test is skipped, unless CI asks for every input (`ALLOCVIEW_REQUIRE_TEST_INPUTS`, set by
/// `.ci/run`, which installs both): then it fails, so a missing tool cannot turn it green.
fn python() -> Option<String> {
    let py = std::env::var("ALLOCVIEW_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let found = Command::new(&py)
        .args(["-c", "import duckdb, pyarrow"])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(py);
    }
    let why = format!(
        "{py} cannot import duckdb and pyarrow (`pip install duckdb pyarrow`; set \
         ALLOCVIEW_PYTHON to a Python that has them)"
    );
    assert!(
        std::env::var_os("ALLOCVIEW_REQUIRE_TEST_INPUTS").is_none(),
        "a required test tool is missing: {why}"
    );
    eprintln!("skipping: {why}");
    None
}

const EVENT_SCHEMA: [(&str, &str); 9] = [
    ("t_ns", "int64"),
    ("thread", "uint16"),
    ("kind", "uint8"),
    ("size_bytes", "uint64"),
    ("address", "uint64"),
    ("alloc_id", "uint32"),
    ("size_class", "uint8"),
    ("call", "uint8"),
    ("stack_id", "uint32"),
];

#[test]
fn duckdb_and_pyarrow_read_converted_traces_as_allocview_counts_them() {
    let tmp = scratch_dir();
    let Some(py) = python() else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/read_parquet.py");
    // Text streamed in small row groups (so pairing carries across batches), and binary.
    for (name, row_group_rows) in [("find_usr_include.trace.gz", 4096u64), ("perl_hash.avt", 0)] {
        let trace = sample(name);
        let trace = trace.to_str().unwrap();
        let stem = name.split('.').next().unwrap();
        let events = tmp.path().join(format!("{stem}.parquet"));
        let series = tmp.path().join(format!("{stem}.series.parquet"));
        let mut convert = vec!["convert", trace, events.to_str().unwrap()];
        let groups = row_group_rows.to_string();
        if row_group_rows > 0 {
            convert.extend(["--row-group-rows", &groups]);
        }
        allocview(&convert);
        let stats = json_of(&["stats", "--json", trace]);
        let compare = json_of(&[
            "compare",
            "--json",
            "--policy",
            "bfc,first-fit,buddy",
            "--parquet",
            series.to_str().unwrap(),
            trace,
        ]);
        let threads = tmp.path().join(format!("{stem}.threads.parquet"));
        let out = Command::new(&py)
            .arg(&script)
            .args([&events, &threads, &series])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let read: Value = serde_json::from_slice(&out.stdout).unwrap();
        let schema: Vec<(String, String)> = serde_json::from_value(read["schema"].clone()).unwrap();
        let expected: Vec<(String, String)> = EVENT_SCHEMA
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect();
        assert_eq!(schema, expected, "{name}: pyarrow's schema");
        let rows = read["rows"].as_u64().unwrap();
        assert_eq!(rows, stats["events"].as_u64().unwrap(), "{name}: rows");
        if row_group_rows > 0 {
            assert_eq!(
                read["row_groups"].as_u64().unwrap(),
                rows.div_ceil(row_group_rows),
                "{name}: row groups"
            );
        }
        assert_eq!(read["threads_rows"], stats["threads"], "{name}: threads");
        let meta = &read["metadata"];
        assert_eq!(meta["allocview.table"], "events", "{name}: {meta}");
        assert_eq!(meta["allocview.source"], trace, "{name}");
        assert!(
            meta["allocview.kind_codes"]
                .as_str()
                .is_some_and(|k| k.starts_with("0=alloc,1=free,")),
            "{name}: {meta}"
        );
        for key in ["peak_live_bytes", "final_live_bytes", "mallocs"] {
            assert_eq!(read[key], stats[key], "{name}: {key} from DuckDB");
        }
        for p in compare["policies"].as_array().unwrap() {
            let policy = p["name"].as_str().unwrap();
            assert_eq!(
                read["peak_footprint_bytes"][policy], p["peak_footprint_bytes"],
                "{name}: {policy}'s peak footprint from the series in DuckDB"
            );
        }
        assert_eq!(
            read["series_schema"],
            serde_json::json!([
                "policy",
                "t_s",
                "live_bytes",
                "allocated_bytes",
                "footprint_bytes",
                "fragmentation",
                "external_fragmentation"
            ])
        );
    }
}

fn read_parquet(path: &Path) -> DataFrame {
    ParquetReader::new(std::fs::File::open(path).unwrap())
        .finish()
        .unwrap()
}

/// The streamed conversion pairs records as the loader does: the file holds exactly the
/// loaded event table (in the exported schema), across row groups.
#[test]
fn a_streamed_conversion_equals_the_loaded_event_table() {
    let tmp = scratch_dir();
    for name in [
        "find_usr_include.trace.gz",
        "python_json.avt",
        "xz_T2_libc.avt",
    ] {
        let out = tmp.path().join(format!("streamed-{name}.parquet"));
        allocview(&[
            "convert",
            sample(name).to_str().unwrap(),
            out.to_str().unwrap(),
            "--row-group-rows",
            "1000",
        ]);
        let allocview_loaders::Loaded::MallocTrace(t) =
            allocview_loaders::load(&sample(name), &allocview_loaders::LoadOptions::default())
                .unwrap()
        else {
            panic!("{name} is a malloc trace")
        };
        let expected = allocview_loaders::export::export_events(&t.events).unwrap();
        let got = read_parquet(&out);
        assert!(
            got.equals_missing(&expected),
            "{name}: {got:?}\n{expected:?}"
        );
        let threads = read_parquet(&out.with_file_name(format!("streamed-{name}.threads.parquet")));
        assert!(threads.equals(&t.threads), "{name}: threads");
    }
}

#[test]
fn report_parquet_holds_the_csvs_tables() {
    let tmp = scratch_dir();
    let dir = tmp.path().join("report");
    allocview(&[
        "report",
        sample("xz_T2_8KiB_blocks.trace.gz").to_str().unwrap(),
        "--policy",
        "bfc,first-fit",
        "--out",
        dir.to_str().unwrap(),
        "--parquet",
    ]);
    for table in ["summary", "timeline", "classes"] {
        let parquet = read_parquet(&dir.join(format!("{table}.parquet")));
        assert!(parquet.height() > 0, "{table}");
        let csv = CsvReadOptions::default()
            .with_has_header(true)
            .with_schema(Some(parquet.schema().clone()))
            .try_into_reader_with_file_path(Some(dir.join(format!("{table}.csv"))))
            .unwrap()
            .finish()
            .unwrap();
        assert_eq!(parquet.shape(), csv.shape(), "{table}");
        // Floats go through CSV as decimal text: compare the integer columns exactly.
        for col in parquet.columns() {
            if !col.dtype().is_float() {
                assert!(
                    col.equals_missing(csv.column(col.name()).unwrap()),
                    "{table}.{}",
                    col.name()
                );
            }
        }
    }
}

#[test]
fn a_pytorch_snapshot_converts_with_its_stacks_and_frames() {
    let tmp = scratch_dir();
    let out = tmp.path().join("lm.parquet");
    allocview(&[
        "convert",
        sample("pytorch/lm_forward_a.pickle").to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    let events = read_parquet(&out);
    let names: Vec<&str> = events
        .get_column_names()
        .into_iter()
        .map(|n| n.as_str())
        .collect();
    assert_eq!(&names[..9], EVENT_SCHEMA.map(|(n, _)| n).as_slice());
    let stacks = read_parquet(&tmp.path().join("lm.stacks.parquet"));
    let frames = read_parquet(&tmp.path().join("lm.frames.parquet"));
    // Every stack an event names has rows in the stacks table, whose frames exist.
    let max_frame = stacks.column("frame_id").unwrap().u32().unwrap().max();
    assert!(max_frame.is_some_and(|m| (m as usize) < frames.height()));
    let known: std::collections::HashSet<u32> = stacks
        .column("stack_id")
        .unwrap()
        .u32()
        .unwrap()
        .into_no_null_iter()
        .collect();
    let used = events.column("stack_id").unwrap().u32().unwrap();
    assert!(used.null_count() < used.len(), "some events have stacks");
    assert!(used.iter().flatten().all(|s| known.contains(&s)));
    for table in [
        "threads",
        "segments",
        "blocks",
        "segment_events",
        "annotations",
    ] {
        assert!(
            tmp.path().join(format!("lm.{table}.parquet")).exists(),
            "{table}"
        );
    }
}

#[test]
fn a_bfc_dump_is_refused_with_what_to_use_instead() {
    let tmp = scratch_dir();
    let dump = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../loaders/tests/data/tf/mobilenetv2_oom_dump.txt.gz");
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["convert", dump.to_str().unwrap()])
        .arg(tmp.path().join("dump.parquet"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("BFC dump") && err.contains("stats"), "{err}");
    // Nothing at all: no table, no companion, no temporary file left behind.
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}
