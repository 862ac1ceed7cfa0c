//! The MiniMalloc benchmark instances (google/minimalloc, Apache-2.0; `tests/data/minimalloc/`):
//! the 11 "challenging" files at capacity 1,048,576 and the README example at capacity 12.
//! Greedy-by-size cannot fit any challenging file (it needs 1.28 to 1.44 times the capacity);
//! `search` must fit every one. Per-instance figures are printed (`--no-capture` to see them).

// Test helpers outside #[test] functions: a malformed fixture should fail loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use allocview_sim::plan::{
    Buffer, PlanOptions, SearchMode, SearchOptions, lower_bound, run_planner, search, validate,
};

const CAPACITY: u64 = 1_048_576;
const CHALLENGING: [&str; 11] = ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K"];

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/minimalloc")
        .join(name)
}

/// Reads minimalloc's CSV: a header naming `id`, `lower`, `upper`, `size` in any order (other
/// columns ignored). `start`/`begin` stand for `lower`; with `end` instead of `upper` the end is
/// inclusive, as minimalloc's converter reads it.
fn read_csv(path: &Path) -> (Vec<String>, Vec<Buffer>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next().unwrap().split(',').map(str::trim).collect();
    let col: HashMap<&str, usize> = header.iter().enumerate().map(|(i, h)| (*h, i)).collect();
    let find = |names: &[&str]| names.iter().find_map(|n| col.get(n).copied());
    let id = find(&["id", "buffer", "buffer_id"]).expect("id column");
    let lower = find(&["lower", "start", "begin"]).expect("lower column");
    let (upper, inclusive) = match find(&["upper"]) {
        Some(c) => (c, false),
        None => (find(&["end"]).expect("upper or end column"), true),
    };
    let size = find(&["size"]).expect("size column");
    let (mut ids, mut bufs) = (Vec::new(), Vec::new());
    for line in lines {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let num = |c: usize| f[c].parse::<u64>().unwrap();
        ids.push(f[id].to_owned());
        bufs.push(Buffer::new(
            num(size),
            num(lower),
            num(upper) + u64::from(inclusive),
        ));
    }
    (ids, bufs)
}

#[test]
fn csv_reader_takes_columns_in_any_order() {
    let dir = std::env::temp_dir().join(format!("allocview-csv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("x.csv");
    std::fs::write(&p, "size,upper,id,lower\n4,3,b1,0\n8,9,b2,3\n").unwrap();
    let (ids, bufs) = read_csv(&p);
    assert_eq!(ids, ["b1", "b2"]);
    assert_eq!(bufs, [Buffer::new(4, 0, 3), Buffer::new(8, 3, 9)]);
    std::fs::write(&p, "begin,end,buffer,size\n0,2,a,4\n").unwrap();
    assert_eq!(read_csv(&p).1, [Buffer::new(4, 0, 3)]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn readme_example_fits_at_12() {
    let (ids, bufs) = read_csv(&data("input.12.csv"));
    assert_eq!(ids, ["b1", "b2", "b3", "b4", "b5"]);
    let out = search(
        &bufs,
        &SearchOptions {
            mode: SearchMode::Fit { capacity_bytes: 12 },
            ..SearchOptions::default()
        },
    )
    .unwrap();
    validate(&bufs, &out.plan).unwrap();
    assert_eq!(out.fits, Some(true));
    assert_eq!(out.plan.total_bytes, 12);
    // Minimising gives the same height, proven: the bound is 12.
    let min = search(&bufs, &SearchOptions::default()).unwrap();
    validate(&bufs, &min.plan).unwrap();
    assert_eq!((min.plan.total_bytes, min.proven_optimal), (12, true));
    // And at 11 nothing fits.
    let tight = search(
        &bufs,
        &SearchOptions {
            mode: SearchMode::Fit { capacity_bytes: 11 },
            ..SearchOptions::default()
        },
    )
    .unwrap();
    assert_eq!(tight.fits, Some(false));
}

#[test]
fn greedy_by_size_does_not_fit_any_challenging_instance() {
    for name in CHALLENGING {
        let (_, bufs) = read_csv(&data(&format!("{name}.{CAPACITY}.csv")));
        let r = run_planner("greedy-by-size", &bufs, &PlanOptions::default()).unwrap();
        validate(&bufs, &r.plan).unwrap();
        let ratio = r.plan.total_bytes as f64 / CAPACITY as f64;
        let lb = lower_bound(&bufs).unwrap().max_live_bytes;
        println!(
            "{name}: {} buffers, max-live {lb}, greedy-by-size {} = {ratio:.3} x capacity",
            bufs.len(),
            r.plan.total_bytes
        );
        assert!(lb <= CAPACITY, "{name}: bound {lb} above capacity");
        assert!(r.plan.total_bytes > CAPACITY, "{name}: greedy fits");
        assert!((1.25..1.5).contains(&ratio), "{name}: ratio {ratio}");
    }
}

/// Wall-clock budget per instance in the test profile. minimalloc's published times are 0.6 to
/// 5.4 s per instance; this allows for a busy 2-core machine.
const BUDGET: Duration = Duration::from_secs(60);

#[test]
fn search_fits_every_challenging_instance() {
    let mut total = Duration::ZERO;
    for name in CHALLENGING {
        let (_, bufs) = read_csv(&data(&format!("{name}.{CAPACITY}.csv")));
        let t0 = Instant::now();
        let out = search(
            &bufs,
            &SearchOptions {
                mode: SearchMode::Fit {
                    capacity_bytes: CAPACITY,
                },
                time_budget: Some(BUDGET),
                ..SearchOptions::default()
            },
        )
        .unwrap();
        let took = t0.elapsed();
        total += took;
        println!(
            "{name}: {} buffers, fits {:?}, height {}, {:.3} s, {} nodes, {} backtracks",
            bufs.len(),
            out.fits,
            out.plan.total_bytes,
            took.as_secs_f64(),
            out.stats.nodes,
            out.stats.backtracks
        );
        validate(&bufs, &out.plan).unwrap();
        assert_eq!(out.fits, Some(true), "{name}");
        assert!(out.plan.total_bytes <= CAPACITY, "{name}");
    }
    println!("total {:.3} s", total.as_secs_f64());
}

#[test]
fn a_spent_budget_returns_the_incumbent_unproven() {
    let (_, bufs) = read_csv(&data("A.1048576.csv"));
    let lb = lower_bound(&bufs).unwrap().max_live_bytes;
    let greedy = run_planner("greedy-by-size", &bufs, &PlanOptions::default()).unwrap();
    let out = search(
        &bufs,
        &SearchOptions {
            time_budget: Some(Duration::ZERO),
            ..SearchOptions::default()
        },
    )
    .unwrap();
    validate(&bufs, &out.plan).unwrap();
    assert!(!out.proven_optimal);
    assert!(out.plan.total_bytes > lb);
    assert!(out.plan.total_bytes <= greedy.plan.total_bytes);
    let fit = search(
        &bufs,
        &SearchOptions {
            mode: SearchMode::Fit {
                capacity_bytes: CAPACITY,
            },
            time_budget: Some(Duration::ZERO),
            ..SearchOptions::default()
        },
    )
    .unwrap();
    validate(&bufs, &fit.plan).unwrap();
    assert_eq!(fit.fits, None, "undecided when out of time");
}
