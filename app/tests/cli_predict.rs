//! `allocview predict` as a user runs it: the real binary on the bundled traces of every kind
//! that has events.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{json, repo, run};

use serde_json::Value;

const FIGURES: [&str; 7] = [
    "top1",
    "top3",
    "log_loss_bits",
    "seed_label_top1",
    "alloc_top1",
    "free_top1",
    "byte_weighted_top1",
];

fn fraction(v: &Value) -> f64 {
    let x = v.as_f64().unwrap();
    assert!((0.0..=1.0).contains(&x), "{x}");
    x
}

#[test]
fn json_has_the_issues_keys_and_context_beats_the_baselines() {
    let trace = repo("sample-traces/find_usr_include.trace.gz");
    let v = json(&["predict", "--json", trace.to_str().unwrap()]);
    // Every call of the trace is a token (the reference statistics count 40,403 calls).
    assert_eq!(v["events"], 40_403);
    assert_eq!(v["threads"], 1);
    assert_eq!(v["split_fraction"], 0.8);
    let models = v["models"].as_array().unwrap();
    let names: Vec<&str> = models.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "majority", "last", "period", "order-1", "order-2", "order-3", "order-4", "order-5",
            "order-6", "order-7", "order-8"
        ]
    );
    for m in models {
        for mode in ["split", "online"] {
            for key in FIGURES {
                assert!(m[mode].get(key).is_some(), "{} {mode} {key}", m["name"]);
            }
            fraction(&m[mode]["top1"]);
            assert!(fraction(&m[mode]["top3"]) >= fraction(&m[mode]["top1"]));
            assert!(m[mode]["log_loss_bits"].as_f64().unwrap() > 0.0);
        }
        assert!(m["cross_run"].is_null());
        let threads = m["per_thread"].as_array().unwrap();
        assert_eq!(threads.len(), 1);
        assert_eq!(threads[0]["events"], 40_403);
        assert_eq!(threads[0]["online_top1"], m["online"]["top1"]);
        assert!(m["train_events_per_s"].as_f64().unwrap() > 0.0);
        assert!(m["predict_events_per_s"].as_f64().unwrap() > 0.0);
    }
    let by = |name: &str| models.iter().find(|m| m["name"] == name).unwrap();
    let order8 = fraction(&by("order-8")["split"]["top1"]);
    assert!(order8 > 0.8, "{order8}");
    assert!(order8 > fraction(&by("majority")["split"]["top1"]) + 0.5);
    // The collapsed label is easier than the class.
    assert!(fraction(&by("order-8")["split"]["seed_label_top1"]) > order8);
    let l = &v["lifetime"];
    assert_eq!(l["short_threshold_allocs"], 64);
    assert_eq!(l["allocations"], 20_260);
    assert!(fraction(&l["accuracy"]) >= fraction(&l["baseline_accuracy"]));
    for key in ["true_short_fraction", "short_precision", "short_recall"] {
        fraction(&l[key]);
    }
}

#[test]
fn threads_and_cross_run_on_pytorch_snapshots() {
    let a = repo("sample-traces/pytorch/lm_train_step_a.pickle");
    let b = repo("sample-traces/pytorch/lm_train_step_b.pickle");
    let v = json(&[
        "predict",
        "--json",
        "--model",
        "order-3,majority",
        "--train",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
    ]);
    assert!(
        v["train_file"]
            .as_str()
            .unwrap()
            .ends_with("lm_train_step_a.pickle")
    );
    for m in v["models"].as_array().unwrap() {
        let cross = &m["cross_run"];
        for key in FIGURES {
            assert!(cross.get(key).is_some(), "{key}");
        }
        let events: u64 = m["per_thread"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["events"].as_u64().unwrap())
            .sum();
        assert_eq!(events, v["events"].as_u64().unwrap());
    }
    // Two different students' models (other sizes): what one teaches hardly fits the other.
    let order3 = &v["models"][0];
    assert_eq!(order3["name"], "order-3");
    assert!(fraction(&order3["cross_run"]["top1"]) < fraction(&order3["online"]["top1"]));
    // Learnt on the very same run, the frozen model knows every context it meets.
    let same = json(&[
        "predict",
        "--json",
        "--model",
        "order-3",
        "--train",
        b.to_str().unwrap(),
        b.to_str().unwrap(),
    ]);
    let m = &same["models"][0];
    assert!(
        fraction(&m["cross_run"]["top1"]) > fraction(&m["online"]["top1"]),
        "{m}"
    );
}

#[test]
fn a_tensorflow_memory_log_is_predicted_too() {
    let log = repo("loaders/tests/data/tf/mobilenetv2_infer_memlog.txt.gz");
    let v = json(&["predict", "--json", "--order", "2", log.to_str().unwrap()]);
    let models = v["models"].as_array().unwrap();
    assert_eq!(models.len(), 5, "three baselines, order-1 and order-2");
    assert!(v["events"].as_u64().unwrap() > 100);
    fraction(&models[4]["online"]["top1"]);
}

#[test]
fn bad_requests_say_what_is_wrong() {
    let trace = repo("sample-traces/xz_T2_8KiB_blocks.trace.gz");
    let t = trace.to_str().unwrap();
    let err = |args: &[&str]| {
        let out = run(args);
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(err(&["predict", "--order", "9", t]).contains("--order 9"));
    assert!(err(&["predict", "--split", "1.5", t]).contains("--split"));
    assert!(err(&["predict", "--model", "lstm", t]).contains("order-1 ... order-8"));
    let plan = repo("sample-traces/plans/resnet18.csv");
    assert!(err(&["predict", plan.to_str().unwrap()]).contains("needs allocation events"));
    // The table names the modes and the lifetime predictor.
    let out = run(&["predict", "--order", "3", t]);
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "time-ordered split",
        "online",
        "order-3",
        "per thread",
        "lifetime",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
}
