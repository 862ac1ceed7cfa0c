//! `allocview plan` as a user runs it: the real binary on minimalloc's instances, a JSON graph
//! plan, a CNN plan, a malloc trace and a TensorFlow memory log. Written plans are read back
//! through the CSV loader and checked with the simulator's validator, independently of the
//! command's own checks.

// Test helpers may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{json, ok, repo, run};

use std::path::{Path, PathBuf};

use allocview_loaders::LoadOptions;
use allocview_loaders::plan::load_plan_file;
use allocview_sim::plan::{Plan, max_live_bytes, validate};
use serde_json::Value;

fn minimalloc(name: &str) -> PathBuf {
    repo(&format!("loaders/tests/data/plans/minimalloc/{name}"))
}

#[path = "../../loaders/tests/scratch/mod.rs"]
mod scratch;
use scratch::Scratch;

fn scratch(name: &str) -> Scratch {
    scratch::scratch("allocview-cli-plan-", name)
}

fn planner<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["planners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no planner {name} in {v}"))
}

/// Reads a written plan back with the CSV loader and checks it with the validator.
fn read_back(path: &Path) -> (Vec<allocview_sim::plan::Buffer>, Plan) {
    let pb = load_plan_file(path, &LoadOptions::default())
        .unwrap()
        .to_buffers()
        .unwrap();
    let offsets = pb.planned_offsets.unwrap();
    let total_bytes = pb
        .buffers
        .iter()
        .zip(&offsets)
        .map(|(b, &o)| o + b.size_bytes)
        .max()
        .unwrap_or(0);
    let plan = Plan {
        offsets,
        total_bytes,
    };
    validate(&pb.buffers, &plan).unwrap();
    (pb.buffers, plan)
}

#[test]
fn json_has_the_documented_keys_and_the_example_figures() {
    let file = minimalloc("input.12.csv");
    let v = json(&["plan", file.to_str().unwrap(), "--json", "--capacity", "12"]);
    assert_eq!(v["buffers"], 5);
    assert_eq!(v["naive_bytes"], 20);
    assert_eq!(v["lower_bound_bytes"], 12);
    assert_eq!(v["format"], "minimalloc-csv");
    for name in [
        "naive",
        "greedy-by-size",
        "greedy-by-breadth",
        "pushdown",
        "search",
    ] {
        let p = planner(&v, name);
        assert!(p["total_bytes"].as_u64().unwrap() >= 12, "{p}");
        assert!(p["seconds"].as_f64().unwrap() >= 0.0, "{p}");
        assert!(p["fits"].is_boolean(), "{p}");
        assert!(p.get("proven_optimal").is_some(), "{p}");
    }
    assert_eq!(planner(&v, "naive")["total_bytes"], 20);
    assert_eq!(planner(&v, "naive")["fits"], false);
    assert_eq!(planner(&v, "greedy-by-size")["total_bytes"], 12);
    assert_eq!(planner(&v, "greedy-by-size")["fits"], true);
    assert_eq!(planner(&v, "greedy-by-size")["proven_optimal"], Value::Null);
    assert_eq!(planner(&v, "search")["fits"], true);
    assert_eq!(planner(&v, "search")["proven_optimal"], true);

    // Without a capacity there is no "fits".
    let v = json(&["plan", file.to_str().unwrap(), "--json"]);
    assert!(planner(&v, "search").get("fits").is_none(), "{v}");
    assert!(v.get("capacity_bytes").is_none());
}

#[test]
fn challenging_instance_greedy_misses_the_capacity_and_search_fits_it() {
    for name in ["A.1048576.csv", "C.1048576.csv"] {
        let file = minimalloc(name);
        let out = scratch(&format!("{name}.plan.csv"));
        let v = json(&[
            "plan",
            file.to_str().unwrap(),
            "--json",
            "--capacity",
            "1MiB",
            "--planner",
            "search,greedy-by-size",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(v["capacity_bytes"], 1_048_576);
        let greedy = planner(&v, "greedy-by-size");
        assert_eq!(greedy["fits"], false, "{name}");
        assert!(
            greedy["ratio_to_lower_bound"].as_f64().unwrap() > 1.25,
            "{name}"
        );
        let search = planner(&v, "search");
        assert_eq!(search["fits"], true, "{name}");
        let total = search["total_bytes"].as_u64().unwrap();
        assert!(total <= 1_048_576, "{name}: {total}");
        // The first named planner's plan was written; read back, it is valid and as high.
        assert_eq!(v["written"], "search");
        let (buffers, plan) = read_back(&out);
        assert_eq!(buffers.len(), v["buffers"].as_u64().unwrap() as usize);
        assert_eq!(plan.total_bytes, total);
        // And the command itself accepts the written file as a solution.
        let again = json(&[
            "plan",
            out.to_str().unwrap(),
            "--json",
            "--planner",
            "naive",
        ]);
        assert_eq!(again["file_plan"]["total_bytes"], total);
    }
}

#[test]
fn out_without_planner_writes_the_smallest_plan() {
    let file = repo("sample-traces/plans/resnet18.csv");
    let out = scratch("resnet18.plan.csv");
    let v = json(&[
        "plan",
        file.to_str().unwrap(),
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    let smallest = v["planners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["total_bytes"].as_u64().unwrap())
        .min()
        .unwrap();
    let (buffers, plan) = read_back(&out);
    assert_eq!(plan.total_bytes, smallest);
    assert_eq!(max_live_bytes(&buffers).unwrap(), v["lower_bound_bytes"]);
    let written = v["written"].as_str().unwrap();
    assert_eq!(planner(&v, written)["total_bytes"], smallest);
}

#[test]
fn graph_plan_with_overwrites_round_trips_through_the_csv() {
    let file = repo("loaders/tests/data/plans/residual_block.json");
    let out = scratch("residual.plan.csv");
    let text = ok(&[
        "plan",
        file.to_str().unwrap(),
        "--planner",
        "pushdown",
        "--out",
        out.to_str().unwrap(),
        "--picture",
        "40x8",
    ]);
    assert!(text.contains("graph-json (8 buffers"), "{text}");
    assert!(text.contains("lower bound"), "{text}");
    assert!(text.contains("pushdown's plan"), "{text}");
    let csv = std::fs::read_to_string(&out).unwrap();
    assert!(csv.starts_with("id,lower,upper,size,alignment,parent,parent_offset,offset"));
    let (buffers, _) = read_back(&out);
    assert_eq!(buffers.iter().filter(|b| b.overwrite.is_some()).count(), 4);
}

#[test]
fn table_and_picture_are_readable() {
    let file = minimalloc("input.12.csv");
    let text = ok(&[
        "plan",
        file.to_str().unwrap(),
        "--capacity",
        "12",
        "--planner",
        "search",
        "--picture",
        "21x12",
    ]);
    assert!(text.contains("lower bound (max live) 12 B"), "{text}");
    assert!(text.contains("fits"), "{text}");
    // Picture: 12 rows of 21 cells between bars, the bound on the top row.
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" |") && l.matches('|').count() == 2)
        .collect();
    assert_eq!(rows.len(), 12, "{text}");
    assert!(rows[0].contains("lower bound 12 B"), "{text}");
    // One cell per byte and time unit: the empty cells are the pool's idle byte-time, 12 x 21
    // minus each buffer's size x lifetime.
    let cells = |r: &str| r.split('|').nth(1).unwrap().to_owned();
    assert!(rows.iter().all(|r| cells(r).len() == 21));
    let empty: usize = rows.iter().map(|r| cells(r).matches('.').count()).sum();
    let pb = load_plan_file(&file, &LoadOptions::default())
        .unwrap()
        .to_buffers()
        .unwrap();
    let used: u64 = pb
        .buffers
        .iter()
        .map(|b| b.size_bytes * (b.upper - b.lower))
        .sum();
    assert_eq!(empty as u64, 12 * 21 - used, "{text}");
    // Before time 9 the pool is full (the bound is reached there).
    assert!(rows.iter().all(|r| !cells(r)[..9].contains('.')), "{text}");
}

#[test]
fn malloc_trace_plans_against_its_peak() {
    let file = repo("sample-traces/find_usr_include.trace.gz");
    let v = json(&[
        "plan",
        file.to_str().unwrap(),
        "--json",
        "--planner",
        "greedy-by-size,pushdown",
    ]);
    assert_eq!(v["format"], "malloc-trace");
    assert_eq!(v["buffers"], 20_260);
    assert_eq!(v["lower_bound_bytes"], 247_976);
    for p in v["planners"].as_array().unwrap() {
        assert!(p["total_bytes"].as_u64().unwrap() >= 247_976, "{p}");
    }
}

#[test]
fn tf_memory_log_step_is_chosen_and_named() {
    let file = repo("loaders/tests/data/tf/mobilenetv2_infer_memlog.txt.gz");
    let out = run(&[
        "plan",
        file.to_str().unwrap(),
        "--json",
        "--planner",
        "greedy-by-size",
    ]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["format"], "tf-memory-log");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("note: step "), "{stderr}");
    let out = run(&["plan", file.to_str().unwrap(), "--step", "-99"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("no allocations in step -99"), "{stderr}");
}

#[test]
fn bad_inputs_fail_with_where_and_why() {
    let bad = scratch("bad.csv");
    std::fs::write(&bad, "id,lower,upper,size\nb1,0,3,4\nb2,x,9,4\n").unwrap();
    let out = run(&["plan", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("line 3, column 4"), "{stderr}");
    assert!(stderr.contains("bad.csv"), "{stderr}");

    // A solution whose offsets overlap is refused, naming the buffers.
    let wrong = scratch("wrong.csv");
    std::fs::write(
        &wrong,
        "id,lower,upper,size,offset\nb1,0,3,4,8\nb2,3,9,4,8\nb3,0,9,4,8\nb4,9,21,4,4\nb5,0,21,4,0\n",
    )
    .unwrap();
    let out = run(&["plan", wrong.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("not a valid plan"), "{stderr}");
    assert!(stderr.contains("\"b1\""), "{stderr}");
    assert!(stderr.contains("\"b3\""), "{stderr}");

    let out = run(&[
        "plan",
        minimalloc("input.12.csv").to_str().unwrap(),
        "--planner",
        "magic",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("unknown planner")
    );
}

/// Issue 20, item 10: on more buffers than SHARED_OBJECTS_DEFAULT_MAX_BUFFERS, the default set
/// leaves the quadratic shared-objects out and says so; named, it runs.
#[test]
fn the_default_set_leaves_shared_objects_out_on_large_inputs() {
    let csv = scratch("many_buffers.csv");
    let mut text = String::from("id,lower,upper,size\n");
    for i in 0..6000u64 {
        text.push_str(&format!(
            "{i},{},{},{}\n",
            i % 3000,
            i % 3000 + 1 + i % 17,
            16 + i % 100
        ));
    }
    std::fs::write(&csv, text).unwrap();
    let out = ok(&[
        "plan",
        "--json",
        "--planner",
        "all",
        "--time-budget",
        "0.5",
        csv.to_str().unwrap(),
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    // "all" names every planner: nothing is skipped.
    assert!(v.get("skipped_planners").is_none(), "{v}");
    let (v, stderr) = default_plan(&csv);
    let names = names_in(&v["planners"]);
    assert!(!names.contains(&"shared-objects"), "{names:?}");
    assert!(names.contains(&"search"), "{names:?}");
    assert_eq!(v["skipped_planners"][0]["name"], "shared-objects", "{v}");
    assert!(
        stderr.contains("--planner shared-objects runs it"),
        "{stderr}"
    );
}

/// 50,000 buffers all live at once: greedy-by-breadth would compare each with every one of
/// its 50,000 objects (2.5 billion comparisons, minutes), so the default set leaves it out and
/// says how to run it; every other planner plans the trace in seconds.
#[test]
fn the_default_set_leaves_greedy_by_breadth_out_when_it_would_compare_billions() {
    let csv = scratch("all_live.csv");
    let mut text = String::from("id,lower,upper,size\n");
    for i in 0..50_000u64 {
        text.push_str(&format!("{i},{i},50001,{}\n", 16 + (i % 7) * 8));
    }
    std::fs::write(&csv, text).unwrap();
    let (v, stderr) = default_plan(&csv);
    let names = names_in(&v["planners"]);
    assert!(!names.contains(&"greedy-by-breadth"), "{names:?}");
    assert!(names.contains(&"greedy-by-size"), "{names:?}");
    let skipped = names_in(&v["skipped_planners"]);
    assert_eq!(skipped, ["shared-objects", "greedy-by-breadth"], "{v}");
    assert!(stderr.contains("50,000 live at once"), "{stderr}");
    assert!(
        stderr.contains("--planner greedy-by-breadth runs it"),
        "{stderr}"
    );
}

/// The `name` of every object in a JSON list of planners.
fn names_in(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect()
}

/// `plan --json` with the default planner set (a short search budget): its JSON and stderr.
fn default_plan(csv: &Path) -> (Value, String) {
    let out = run(&[
        "plan",
        "--json",
        "--time-budget",
        "0.5",
        csv.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    (
        serde_json::from_slice(&out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
