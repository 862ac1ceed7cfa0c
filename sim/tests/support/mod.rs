//! Test-only reader of libtracemalloc text traces (plain or gzip), so `sim` tests can replay real
//! traces without depending on the polars loaders. Deliberately minimal: it trusts its input.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use allocview_sim::trace::{EventKind, NO_ALLOC_ID, OwnedTrace};

/// A test whose input or tool is missing is skipped with a message; where CI asks for every
/// input (`ALLOCVIEW_REQUIRE_TEST_INPUTS` set, as `.ci/run` does) it fails instead, so a missing
/// `../shared` or tool cannot turn tests green.
pub fn skip(why: &str) {
    assert!(
        std::env::var_os("ALLOCVIEW_REQUIRE_TEST_INPUTS").is_none(),
        "a required test input is missing: {why}"
    );
    println!("skipped: {why}");
}

/// `<workspace>/sample-traces/<name>`.
pub fn sample_trace(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("sample-traces")
        .join(name)
}

/// `../shared/data/traces/<name>` beside the checkout, if present (tests skip without it).
pub fn shared_trace(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/traces")
        .join(name);
    p.exists().then_some(p)
}

/// Reads a text trace into owned columns.
pub fn read_trace(path: &Path) -> OwnedTrace {
    let file = std::fs::File::open(path).unwrap();
    let mut peek = BufReader::new(file);
    let is_gz = {
        let buf = peek.fill_buf().unwrap();
        buf.len() >= 2 && buf[0] == 0x1f && buf[1] == 0x8b
    };
    let reader: Box<dyn Read> = if is_gz {
        Box::new(flate2::bufread::MultiGzDecoder::new(peek))
    } else {
        Box::new(peek)
    };
    let mut trace = OwnedTrace::new();
    let mut live: HashMap<u64, u32> = HashMap::new();
    for line in BufReader::new(reader).lines() {
        let line = line.unwrap();
        let mut cols = line.split('\t');
        let t = cols.next().unwrap();
        let _tid = cols.next().unwrap();
        let size: i64 = cols.next().unwrap().parse().unwrap();
        let ptr = cols.next().unwrap();
        let (sec, usec) = t.split_once('.').unwrap();
        let t_ns =
            sec.parse::<i64>().unwrap() * 1_000_000_000 + usec.parse::<i64>().unwrap() * 1000;
        let addr = if ptr == "(nil)" {
            0
        } else {
            u64::from_str_radix(ptr.trim_start_matches("0x"), 16).unwrap()
        };
        if size < 0 {
            if addr == 0 {
                push_raw(&mut trace, t_ns, EventKind::FreeNull);
            } else if let Some(id) = live.remove(&addr) {
                trace.free(t_ns, id);
            } else {
                push_raw(&mut trace, t_ns, EventKind::FreeUnknown);
            }
        } else if addr == 0 {
            push_raw(&mut trace, t_ns, EventKind::AllocFailed);
        } else {
            if let Some(old) = live.remove(&addr) {
                trace.free(t_ns, old);
            }
            let id = trace.alloc(t_ns, size as u64);
            live.insert(addr, id);
        }
    }
    trace
}

fn push_raw(trace: &mut OwnedTrace, t_ns: i64, kind: EventKind) {
    trace.t_ns.push(t_ns);
    trace.kind.push(kind.code());
    trace.size_bytes.push(0);
    trace.alloc_id.push(NO_ALLOC_ID);
}
