//! Plan loaders on real files: minimalloc's benchmark instances, a JSON graph plan with
//! overwrite specs, the MobileNetV2 TensorFlow memory logs and a real malloc trace. Expected
//! figures come from elsewhere: the shared data set's README (computed by an independent
//! script), the trace's reference statistics, the `oracle` policy, or the rules worked by hand.

// Test helpers may unwrap: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use allocview_loaders::plan::{
    MemoryPlan, PlanBuffers, PlanFormat, PlanLoadOptions, from_tf, load_any, load_plan_file,
    minimalloc::write_minimalloc_csv,
};
use allocview_loaders::tf::memlog::load_memory_log;
use allocview_loaders::{InputKind, LoadError, LoadOptions, Strictness, detect};
use allocview_sim::plan::{
    Buffer, Overwrite, Plan, greedy_by_size, max_live_bytes, pushdown, validate,
};
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::oracle::Oracle;
use polars::prelude::*;

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

mod scratch;
use scratch::Scratch;

fn scratch(name: &str) -> Scratch {
    scratch::scratch("allocview-plan-", name)
}

fn write(name: &str, text: &str) -> Scratch {
    let path = scratch(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn load(path: &Path) -> MemoryPlan {
    load_plan_file(path, &LoadOptions::default()).unwrap()
}

fn buffers(path: &Path) -> PlanBuffers {
    load(path).to_buffers().unwrap()
}

fn err(path: &Path) -> String {
    load_plan_file(path, &LoadOptions::default())
        .unwrap_err()
        .to_string()
}

/// (file, buffers, naive bytes, max-live bytes, greedy-by-size height), from the shared data
/// set's README.
const MINIMALLOC: &[(&str, usize, u64, u64, u64)] = &[
    ("A.1048576.csv", 154, 15_071_232, 1_048_576, 1_374_208),
    ("B.1048576.csv", 170, 17_871_872, 1_048_576, 1_432_576),
    ("C.1048576.csv", 203, 21_476_352, 1_039_360, 1_417_216),
    ("D.1048576.csv", 213, 7_328_768, 986_112, 1_339_392),
    ("E.1048576.csv", 215, 25_556_992, 1_048_576, 1_513_472),
    ("F.1048576.csv", 296, 20_930_560, 1_048_576, 1_433_600),
    ("G.1048576.csv", 308, 20_795_392, 1_048_576, 1_459_200),
    ("H.1048576.csv", 316, 20_830_208, 1_048_576, 1_355_776),
    ("I.1048576.csv", 374, 48_854_016, 1_048_576, 1_478_656),
    ("J.1048576.csv", 409, 13_794_304, 989_184, 1_350_656),
    ("K.1048576.csv", 454, 79_005_696, 1_048_576, 1_391_616),
    ("input.12.csv", 5, 20, 12, 12),
];

#[test]
fn minimalloc_instances_load_with_the_published_figures() {
    for &(file, n, naive, max_live, gbs) in MINIMALLOC {
        let path = data(&format!("plans/minimalloc/{file}"));
        assert_eq!(
            detect(&path).unwrap(),
            InputKind::Plan(PlanFormat::MinimallocCsv),
            "{file}"
        );
        let plan = load(&path);
        assert_eq!(plan.format, PlanFormat::MinimallocCsv);
        assert_eq!(plan.len(), n, "{file}");
        let names: Vec<&str> = plan
            .buffers
            .get_column_names()
            .iter()
            .map(|s| s.as_str())
            .collect();
        assert_eq!(names, ["id", "size_bytes", "lower", "upper"], "{file}");
        let pb = plan.to_buffers().unwrap();
        assert!(pb.planned_offsets.is_none());
        let sum: u64 = pb.buffers.iter().map(|b| b.size_bytes).sum();
        assert_eq!(sum, naive, "{file}: naive");
        assert_eq!(max_live_bytes(&pb.buffers).unwrap(), max_live, "{file}");
        let greedy = greedy_by_size::plan(&pb.buffers, 1).unwrap();
        validate(&pb.buffers, &greedy).unwrap();
        assert_eq!(greedy.total_bytes, gbs, "{file}: greedy-by-size");
    }
}

#[test]
fn minimalloc_example_reads_ids_and_half_open_lifetimes() {
    let pb = buffers(&data("plans/minimalloc/input.12.csv"));
    assert_eq!(pb.ids, ["b1", "b2", "b3", "b4", "b5"]);
    assert_eq!(
        pb.buffers,
        [
            Buffer::new(4, 0, 3),
            Buffer::new(4, 3, 9),
            Buffer::new(4, 0, 9),
            Buffer::new(4, 9, 21),
            Buffer::new(4, 0, 21),
        ]
    );
}

#[test]
fn old_start_end_header_is_inclusive_and_columns_may_come_in_any_order() {
    let reference = buffers(&data("plans/minimalloc/input.12.csv"));
    let old = write(
        "old.csv",
        "buffer,start,end,size\nb1,0,2,4\nb2,3,8,4\nb3,0,8,4\nb4,9,20,4\nb5,0,20,4\n",
    );
    assert_eq!(buffers(&old), reference);
    let shuffled = write(
        "shuffled.csv",
        "size,upper,id,lower\r\n4,3,b1,0\r\n4,9,b2,3\r\n\r\n4,9,b3,0\r\n4,21,b4,9\r\n4,21,b5,0\r\n",
    );
    assert_eq!(buffers(&shuffled), reference);
}

#[test]
fn published_solution_offsets_load_and_validate() {
    // The minimalloc README's solution at capacity 12.
    let path = write(
        "solution.csv",
        "id,lower,upper,size,alignment,offset\nb1,0,3,4,4,8\nb2,3,9,4,4,8\nb3,0,9,4,4,4\n\
         b4,9,21,4,4,4\nb5,0,21,4,4,0\n",
    );
    let plan = load(&path);
    assert!(plan.buffers.column("align_bytes").is_ok());
    let pb = plan.to_buffers().unwrap();
    assert!(pb.buffers.iter().all(|b| b.align_bytes == 4));
    let offsets = pb.planned_offsets.clone().unwrap();
    assert_eq!(offsets, [8, 8, 4, 4, 0]);
    validate(
        &pb.buffers,
        &Plan {
            offsets,
            total_bytes: 12,
        },
    )
    .unwrap();
    // b3 moved onto b1: they are live together, so the validator must object.
    let wrong = Plan {
        offsets: vec![8, 8, 8, 4, 0],
        total_bytes: 12,
    };
    assert!(validate(&pb.buffers, &wrong).is_err());
}

#[test]
fn gzipped_csv_is_detected_by_content() {
    let text = std::fs::read(data("plans/minimalloc/C.1048576.csv")).unwrap();
    let path = scratch("C.bin");
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&path).unwrap(),
        flate2::Compression::default(),
    );
    gz.write_all(&text).unwrap();
    gz.finish().unwrap();
    assert_eq!(
        detect(&path).unwrap(),
        InputKind::Plan(PlanFormat::MinimallocCsv)
    );
    assert_eq!(
        buffers(&path),
        buffers(&data("plans/minimalloc/C.1048576.csv"))
    );
}

#[test]
fn bad_csv_rows_name_file_line_column_and_expectation() {
    let path = write(
        "bad_size.csv",
        "id,lower,upper,size\nb1,0,3,4\nb2,3,9,four\nb3,0,9,4\n",
    );
    let e = err(&path);
    assert!(e.contains("bad_size.csv"), "{e}");
    assert!(e.contains("line 3, column 8"), "{e}");
    assert!(e.contains("size"), "{e}");
    assert!(e.contains("unsigned decimal integer"), "{e}");
    assert!(e.contains("\"four\""), "{e}");

    let path = write("backwards.csv", "id,lower,upper,size\nb1,5,3,4\n");
    let e = err(&path);
    assert!(e.contains("line 2, column 6"), "{e}");
    assert!(e.contains("upper"), "{e}");

    let path = write("short.csv", "id,lower,upper,size\nb1,0,3,4\n\nb2,0,3\n");
    let e = err(&path);
    assert!(e.contains("line 4"), "{e}");
    assert!(e.contains("too few"), "{e}");

    let path = write("dup.csv", "id,lower,upper,size\nb1,0,3,4\nb1,0,3,4\n");
    let e = err(&path);
    assert!(e.contains("line 3, column 1"), "{e}");

    let path = write("align.csv", "id,lower,upper,size,alignment\nb1,0,3,4,3\n");
    let e = err(&path);
    assert!(e.contains("line 2, column 10"), "{e}");
    assert!(e.contains("power of two"), "{e}");

    // Lenient mode skips the bad row and says so.
    let path = write(
        "lenient.csv",
        "id,lower,upper,size\nb1,0,3,4\nb2,3,9,four\nb3,0,9,4\n",
    );
    let plan = load_plan_file(
        &path,
        &LoadOptions {
            strictness: Strictness::Lenient,
            progress: None,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    assert_eq!(plan.to_buffers().unwrap().ids, ["b1", "b3"]);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("1 malformed rows skipped"))
    );
}

#[test]
fn bad_csv_headers_are_refused_with_the_reason() {
    // Detection needs a full header, so load the CSV parser's errors through a file whose
    // header is recognised but wrong, and check detection refuses the others.
    let path = write("both_ends.csv", "id,lower,upper,end,size\nb1,0,3,2,4\n");
    let e = err(&path);
    assert!(e.contains("both `upper`"), "{e}");
    let path = write("no_size.csv", "id,lower,upper\nb1,0,3\n");
    assert!(matches!(detect(&path), Err(LoadError::Format { .. })));
    let text = "id,lower,upper,size,colour\nb1,0,3,4,red\n";
    let e = allocview_loaders::plan::minimalloc::parse_minimalloc_csv(
        text,
        Path::new("colour.csv"),
        Strictness::Strict,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("line 1, column 21"), "{e}");
    assert!(e.contains("unknown column \"colour\""), "{e}");
    assert!(e.contains("colour.csv"), "{e}");
}

fn index(pb: &PlanBuffers) -> HashMap<&str, usize> {
    pb.ids
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str(), i))
        .collect()
}

#[test]
fn graph_json_lifetimes_and_overwrites_follow_the_rules() {
    let path = data("plans/residual_block.json");
    assert_eq!(
        detect(&path).unwrap(),
        InputKind::Plan(PlanFormat::GraphJson)
    );
    let plan = load(&path);
    assert_eq!(plan.format, PlanFormat::GraphJson);
    assert_eq!(plan.time_unit, "operator");
    let pb = plan.to_buffers().unwrap();
    let at = index(&pb);
    let b = |id: &str| pb.buffers[at[id]];
    // [producer, last reader + 1); graph outputs to the end (8 operators).
    let spans: Vec<(&str, u64, u64)> = pb
        .ids
        .iter()
        .zip(&pb.buffers)
        .map(|(id, b)| (id.as_str(), b.lower, b.upper))
        .collect();
    assert_eq!(
        spans,
        [
            ("x", 0, 5),
            ("c1", 1, 3),
            ("r1", 2, 4),
            ("c2", 3, 5),
            ("s", 4, 6),
            ("y", 5, 7),
            ("y_hi", 6, 8),
            ("p", 7, 8),
        ]
    );
    assert!(pb.buffers.iter().all(|b| b.align_bytes == 64));
    let ow = |parent: &str, offset_bytes: u64| {
        Some(Overwrite {
            parent: at[parent],
            offset_bytes,
        })
    };
    assert_eq!(b("r1").overwrite, ow("c1", 0));
    assert_eq!(b("s").overwrite, ow("c2", 0));
    assert_eq!(b("y").overwrite, ow("s", 0));
    assert_eq!(b("y_hi").overwrite, ow("y", 401_408));
    assert_eq!(b("x").overwrite, None);
    assert_eq!(b("p").overwrite, None);
    // At operator 3 x, the c1/r1 chain and c2 are live: three 784 KiB activations.
    assert_eq!(max_live_bytes(&pb.buffers).unwrap(), 3 * 802_816);
    for plan in [
        greedy_by_size::plan(&pb.buffers, 1).unwrap(),
        pushdown::plan(&pb.buffers, 1).unwrap(),
    ] {
        validate(&pb.buffers, &plan).unwrap();
        let off = |id: &str| plan.offsets[at[id]];
        assert_eq!(off("r1"), off("c1"));
        assert_eq!(off("y"), off("c2"));
        assert_eq!(off("y_hi"), off("c2") + 401_408);
    }
}

#[test]
fn graph_json_errors_name_the_operator_or_the_json_position() {
    let cases = [
        (
            "syntax.json",
            "{\"operators\": [\n  {\"outputs\": [{\"tensor\": \"a\", \"size_bytes\": 4}]},\n  \
             {\"inputs\": [\"a\"] \"outputs\": []}\n]}",
            "line 3, column",
        ),
        (
            "unknown_input.json",
            r#"{"operators": [{"name": "conv", "inputs": ["ghost"]}]}"#,
            r#"operators[0] ("conv").inputs[0]: tensor "ghost" is produced by no earlier operator"#,
        ),
        (
            "typo.json",
            r#"{"operators": [{"outputs": [{"tensor": "a", "size": 4}]}]}"#,
            r#"unknown key "size""#,
        ),
        (
            "read_after_overwrite.json",
            r#"{"operators": [
                {"outputs": [{"tensor": "a", "size_bytes": 8}]},
                {"name": "relu", "inputs": ["a"],
                 "outputs": [{"tensor": "b", "size_bytes": 8, "overwrites": "a"}]},
                {"name": "late", "inputs": ["a", "b"]}]}"#,
            r#"operators[2] ("late").inputs[0]: tensor "a" was already overwritten"#,
        ),
        (
            "not_an_input.json",
            r#"{"operators": [
                {"outputs": [{"tensor": "a", "size_bytes": 8}]},
                {"name": "relu", "outputs": [{"tensor": "b", "size_bytes": 8, "overwrites": "a"}]}]}"#,
            "overwrites \"a\", which is not an input of this operator",
        ),
        (
            "too_big.json",
            r#"{"operators": [
                {"outputs": [{"tensor": "a", "size_bytes": 8}]},
                {"inputs": ["a"],
                 "outputs": [{"tensor": "b", "size_bytes": 8, "overwrites": "a", "offset_bytes": 4}]}]}"#,
            "8 B at offset 4 do not fit inside \"a\" (8 B)",
        ),
        (
            "twice.json",
            r#"{"operators": [
                {"outputs": [{"tensor": "a", "size_bytes": 8}]},
                {"outputs": [{"tensor": "a", "size_bytes": 8}]}]}"#,
            "tensor \"a\" is already produced by operators[0]",
        ),
    ];
    for (name, text, want) in cases {
        let path = write(name, text);
        let e = err(&path);
        assert!(e.contains(want), "{name}: {e}");
        assert!(e.contains(name), "{name}: {e}");
    }
}

#[test]
fn csv_round_trip_keeps_buffers_overwrites_and_offsets() {
    let pb = buffers(&data("plans/residual_block.json"));
    let plan = greedy_by_size::plan(&pb.buffers, 1).unwrap();
    let path = scratch("round_trip.csv");
    let mut out = Vec::new();
    write_minimalloc_csv(&mut out, &pb.ids, &pb.buffers, Some(&plan.offsets)).unwrap();
    std::fs::write(&path, &out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with("id,lower,upper,size,alignment,parent,parent_offset,offset\n"),
        "{text}"
    );
    let back = buffers(&path);
    assert_eq!(back.ids, pb.ids);
    assert_eq!(back.buffers, pb.buffers);
    assert_eq!(back.planned_offsets.as_deref(), Some(&plan.offsets[..]));

    // Ids that need quoting survive too.
    let ids = vec!["a,b".to_owned(), "say \"hi\"".to_owned()];
    let bufs = [Buffer::new(8, 0, 2), Buffer::new(8, 1, 3)];
    let mut out = Vec::new();
    write_minimalloc_csv(&mut out, &ids, &bufs, None).unwrap();
    let path = scratch("quoted.csv");
    std::fs::write(&path, &out).unwrap();
    let back = buffers(&path);
    assert_eq!(back.ids, ids);
    assert_eq!(back.buffers, bufs);
}

fn tf_log(name: &str) -> PathBuf {
    data(&format!("tf/{name}"))
}

#[test]
fn tf_memory_log_step_becomes_a_plan_in_log_order() {
    let path = tf_log("mobilenetv2_infer_memlog.txt.gz");
    let log = load_memory_log(&path).unwrap();
    let steps = from_tf::step_allocations(&log);

    // Allocations per step, counted independently from the event DataFrame.
    let ev = &log.events;
    let record = ev.column("record").unwrap().u8().unwrap();
    let step = ev.column("step").unwrap().i64().unwrap();
    let alloc_id = ev.column("alloc_id").unwrap().u32().unwrap();
    let kind = ev.column("kind").unwrap().u8().unwrap();
    let mut per_step: HashMap<i64, u64> = HashMap::new();
    for ((r, s), a) in record.iter().zip(step.iter()).zip(alloc_id.iter()) {
        if let (Some(0 | 2), Some(s), Some(_)) = (r, s, a) {
            *per_step.entry(s).or_default() += 1;
        }
    }
    assert_eq!(steps.len(), per_step.len());
    for &(s, n) in &steps {
        assert_eq!(per_step[&s], n, "step {s}");
    }
    // The default: the real step (not one of TF's special ids -1 to -6) with the most
    // allocations, the first such on a tie (the three inference steps tie).
    let mut best: Option<(i64, u64)> = None;
    for &(s, n) in steps.iter().filter(|&&(s, _)| !(-6..0).contains(&s)) {
        if best.is_none_or(|(_, bn)| n > bn) {
            best = Some((s, n));
        }
    }
    let (best, best_n) = best.unwrap();

    let plan = load_any(&path, &PlanLoadOptions::default()).unwrap();
    assert_eq!(plan.format, PlanFormat::TfMemoryLog);
    assert!(
        plan.notes[0].contains(&format!("step {best}")),
        "{:?}",
        plan.notes
    );
    let pb = plan.to_buffers().unwrap();
    assert_eq!(pb.buffers.len() as u64, best_n);
    assert!(pb.buffers.iter().all(|b| b.align_bytes == 64));

    // Order check against the event rows: buffer a is dead before b starts exactly when a's
    // free row comes before b's alloc row.
    let mut alloc_row: HashMap<u32, usize> = HashMap::new();
    let mut free_row: HashMap<u32, usize> = HashMap::new();
    let mut ids_in_order = Vec::new();
    for (row, ((((r, s), a), k), _)) in record
        .iter()
        .zip(step.iter())
        .zip(alloc_id.iter())
        .zip(kind.iter())
        .zip(0..)
        .enumerate()
    {
        let Some(a) = a else { continue };
        if matches!(r, Some(0 | 2)) && s == Some(best) {
            alloc_row.insert(a, row);
            ids_in_order.push(a);
        } else if k == Some(1) && alloc_row.contains_key(&a) {
            free_row.entry(a).or_insert(row);
        }
    }
    assert_eq!(ids_in_order.len(), pb.buffers.len());
    for (i, ai) in ids_in_order.iter().enumerate() {
        for (j, aj) in ids_in_order.iter().enumerate() {
            let dead_before = free_row.get(ai).is_some_and(|&f| f < alloc_row[aj]);
            assert_eq!(
                pb.buffers[i].upper <= pb.buffers[j].lower,
                dead_before,
                "buffers {i} and {j}"
            );
        }
    }
    let greedy = greedy_by_size::plan(&pb.buffers, 1).unwrap();
    validate(&pb.buffers, &greedy).unwrap();
    // What the step had live can never exceed what BFC held at its peak (MEMINFO).
    let peak = log.meminfo.iter().map(|m| m.peak_bytes).max().unwrap();
    assert!(max_live_bytes(&pb.buffers).unwrap() <= peak);

    // --step picks another step; an unknown one lists the steps.
    let (other, other_n) = steps.iter().copied().find(|&(s, _)| s != best).unwrap();
    let chosen = load_any(
        &path,
        &PlanLoadOptions {
            step: Some(other),
            ..PlanLoadOptions::default()
        },
    )
    .unwrap();
    assert_eq!(chosen.len() as u64, other_n);
    let e = load_any(
        &path,
        &PlanLoadOptions {
            step: Some(12_345),
            ..PlanLoadOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("no allocations in step 12345"), "{e}");
    assert!(e.contains(&format!("{best} ({best_n} allocations)")), "{e}");
}

#[test]
fn tf_train_log_plans_every_step_alike() {
    // Training steps repeat: the three iterations' plans need the same memory.
    let path = tf_log("mobilenetv2_train_memlog.txt.gz");
    let log = load_memory_log(&path).unwrap();
    let steps = from_tf::step_allocations(&log);
    // The three training iterations: the real steps (TF's special ids are -1 to -6; the
    // set-up under -6 has the most allocations of all).
    let big: Vec<(i64, u64)> = steps.iter().copied().filter(|&(s, _)| s < -6).collect();
    assert_eq!(big.len(), 3, "{steps:?}");
    assert!(big.iter().all(|&(_, n)| n > 1000), "{steps:?}");
    let default = from_tf::plan_from_memory_log(&log, None, &path).unwrap();
    let best = big.iter().max_by_key(|&&(_, n)| n).unwrap();
    assert_eq!(default.len() as u64, best.1);
    assert!(default.notes[0].contains(&format!("step {}", best.0)));
    let mut bounds = Vec::new();
    for &(s, _) in &big {
        let plan = from_tf::plan_from_memory_log(&log, Some(s), &path).unwrap();
        let pb = plan.to_buffers().unwrap();
        bounds.push(max_live_bytes(&pb.buffers).unwrap());
    }
    let (lo, hi) = (bounds.iter().min().unwrap(), bounds.iter().max().unwrap());
    assert!(*hi - *lo <= *hi / 20, "{bounds:?}");
}

#[test]
fn bfc_dump_is_refused_as_nothing_to_plan() {
    let e = load_any(
        &tf_log("mobilenetv2_oom_dump.txt.gz"),
        &PlanLoadOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("no lifetimes"), "{e}");
}

#[test]
fn malloc_trace_becomes_the_oracle_plan() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/find_usr_include.trace.gz");
    let plan = load_any(&path, &PlanLoadOptions::default()).unwrap();
    assert_eq!(plan.format, PlanFormat::MallocTrace);
    assert_eq!(plan.time_unit, "event");
    let pb = plan.to_buffers().unwrap();
    // The reference statistics: 20,260 mallocs (none of size 0), 247,976 B live at the peak.
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(path.with_file_name("find_usr_include.stats.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(reference["mallocs_size_zero"], 0);
    assert_eq!(
        pb.buffers.len() as u64,
        reference["mallocs"].as_u64().unwrap()
    );
    assert_eq!(
        max_live_bytes(&pb.buffers).unwrap(),
        reference["peak_live_bytes"].as_u64().unwrap()
    );
    assert_eq!(pb.ids[17], "17");

    // The oracle policy plans the same buffers with greedy-by-size.
    let loaded = allocview_loaders::load(&path, &LoadOptions::default()).unwrap();
    let allocview_loaders::Loaded::MallocTrace(trace) = loaded else {
        panic!("not a trace");
    };
    let view = allocview_loaders::trace_view(&trace.events, &path).unwrap();
    let config = PolicyConfig {
        align_bytes: 16,
        ..PolicyConfig::default()
    };
    let oracle = Oracle::new(&view, &config).unwrap();
    let greedy = greedy_by_size::plan(&pb.buffers, 16).unwrap();
    validate(&pb.buffers, &greedy).unwrap();
    assert_eq!(greedy.total_bytes, oracle.plan_total_bytes());
    assert_eq!(
        max_live_bytes(&pb.buffers).unwrap(),
        oracle.lower_bound_bytes()
    );
    for id in [0u32, 100, 5000, 20_259] {
        assert_eq!(Some(greedy.offsets[id as usize]), oracle.planned_offset(id));
    }
}

#[test]
fn plans_of_torchvision_cnns_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/plans");
    for (name, n) in [
        ("resnet18", 70),
        ("resnet50", 176),
        ("mobilenet_v2", 154),
        ("mobilenet_v3_large", 188),
        ("mobilenet_v3_small", 158),
    ] {
        let path = dir.join(format!("{name}.csv"));
        let pb = buffers(&path);
        assert_eq!(pb.buffers.len(), n, "{name}");
        // The input image is the first buffer: 1x3x224x224 float32.
        assert_eq!(pb.ids[0], "x", "{name}");
        assert_eq!(pb.buffers[0].size_bytes, 3 * 224 * 224 * 4, "{name}");
        let greedy = greedy_by_size::plan(&pb.buffers, 1).unwrap();
        validate(&pb.buffers, &greedy).unwrap();
    }
}

#[test]
fn frame_has_the_documented_schema() {
    let plan = load(&data("plans/residual_block.json"));
    let schema: Vec<(String, DataType)> = plan
        .buffers
        .schema()
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    assert_eq!(
        schema,
        [
            ("id".to_owned(), DataType::String),
            ("size_bytes".to_owned(), DataType::UInt64),
            ("lower".to_owned(), DataType::UInt64),
            ("upper".to_owned(), DataType::UInt64),
            ("align_bytes".to_owned(), DataType::UInt64),
            ("parent".to_owned(), DataType::String),
            ("offset_bytes".to_owned(), DataType::UInt64),
        ]
    );
    let parent = plan.buffers.column("parent").unwrap();
    assert_eq!(parent.null_count(), 4);
}

#[test]
fn book_json_example_means_what_the_book_says() {
    // The example of the book's memory plan formats page.
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference/plan-files.md"),
    )
    .unwrap();
    let section = &page[page.find("**JSON graph plan**").unwrap()..];
    let start = section.find("```json\n").unwrap() + "```json\n".len();
    let end = start + section[start..].find("```").unwrap();
    let path = write("book_example.json", &section[start..end]);
    let pb = buffers(&path);
    let at = index(&pb);
    let span = |id: &str| (pb.buffers[at[id]].lower, pb.buffers[at[id]].upper);
    assert_eq!(span("x"), (0, 5));
    assert_eq!(span("c1"), (1, 3));
    assert_eq!(span("r1"), (2, 4));
    assert_eq!(span("p"), (6, 7));
    assert_eq!(pb.buffers[at["r1"]].overwrite.unwrap().parent, at["c1"]);
    assert_eq!(
        pb.buffers[at["s_hi"]].overwrite,
        Some(Overwrite {
            parent: at["s"],
            offset_bytes: 401_408
        })
    );
    assert_eq!(max_live_bytes(&pb.buffers).unwrap(), 3 * 802_816);
}
