//! Exact test vectors for the static planners: TFLite's own unit tests
//! (`tensorflow/lite/delegates/gpu/common/memory_management_test.cc` @ dd3f9a13, records
//! `(size, first_task, last_task)` with closed intervals), the 8-tensor example of Pisarchyk & Lee
//! (total 124), and hand-worked MegEngine-style scenarios. Every plan is also validated.

// Test helpers outside #[test] functions: a malformed fixture should fail loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use allocview_sim::plan::{
    Buffer, PLANNER_NAMES, PlanError, PlanOptions, PlanResult, SearchMode, SearchOptions,
    SharedObjects, lower_bound, run_planner, search, validate,
};

const CHAIN: [(u64, u64, u64); 5] = [(16, 0, 1), (8, 1, 2), (64, 2, 3), (32, 3, 4), (8, 4, 5)];
const COMPLEX: [(u64, u64, u64); 9] = [
    (32, 0, 1),
    (32, 1, 4),
    (8, 2, 5),
    (16, 3, 5),
    (8, 4, 5),
    (64, 5, 7),
    (8, 6, 8),
    (8, 7, 8),
    (16, 8, 9),
];
const PAPER: [(u64, u64, u64); 8] = [
    (32, 0, 1),
    (28, 1, 4),
    (36, 2, 5),
    (16, 3, 5),
    (8, 4, 5),
    (64, 5, 7),
    (10, 6, 8),
    (40, 7, 8),
];

fn records(r: &[(u64, u64, u64)]) -> Vec<Buffer> {
    r.iter()
        .map(|&(size, first, last)| Buffer::from_closed(size, first, last))
        .collect()
}

fn run(name: &str, bufs: &[Buffer]) -> PlanResult {
    run_with(name, bufs, &PlanOptions::default())
}

fn run_with(name: &str, bufs: &[Buffer], opts: &PlanOptions) -> PlanResult {
    let r = run_planner(name, bufs, opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    validate(bufs, &r.plan).unwrap_or_else(|e| panic!("{name}: invalid plan: {e}"));
    r
}

fn objects(r: &PlanResult) -> (Vec<usize>, Vec<u64>) {
    let o = r.objects.as_ref().expect("a shared-object planner");
    (
        o.object_of.iter().map(|x| x.expect("assigned")).collect(),
        o.object_sizes_bytes.clone(),
    )
}

#[test]
fn empty_records() {
    for name in PLANNER_NAMES {
        let r = run(name, &[]);
        assert!(r.plan.offsets.is_empty(), "{name}");
        assert_eq!(r.plan.total_bytes, 0, "{name}");
    }
    let b = lower_bound(&[]).unwrap();
    assert_eq!((b.max_live_bytes, b.positional_max_bytes), (0, 0));
}

#[test]
fn one_record() {
    let bufs = records(&[(16, 0, 1)]);
    for name in PLANNER_NAMES {
        let r = run(name, &bufs);
        assert_eq!(r.plan.offsets, vec![0], "{name}");
        assert_eq!(r.plan.total_bytes, 16, "{name}");
    }
    for name in ["naive", "greedy-by-breadth", "shared-objects"] {
        assert_eq!(objects(&run(name, &bufs)), (vec![0], vec![16]), "{name}");
    }
}

#[test]
fn chain_records() {
    let bufs = records(&CHAIN);
    let naive = run("naive", &bufs);
    assert_eq!(
        objects(&naive),
        (vec![0, 1, 2, 3, 4], vec![16, 8, 64, 32, 8])
    );
    assert_eq!(naive.plan.total_bytes, 128);

    let gbs = run("greedy-by-size", &bufs);
    assert_eq!(gbs.plan.offsets, vec![0, 64, 0, 64, 0]);
    assert_eq!(gbs.plan.total_bytes, 96);

    for name in ["greedy-by-breadth", "shared-objects"] {
        let r = run(name, &bufs);
        assert_eq!(objects(&r), (vec![0, 1, 0, 1, 0], vec![64, 32]), "{name}");
        assert_eq!(r.plan.total_bytes, 96, "{name}");
    }

    let b = lower_bound(&bufs).unwrap();
    assert_eq!(b.max_live_bytes, 96);
    assert_eq!(b.positional_max_bytes, 96);
}

#[test]
fn complex_records() {
    let bufs = records(&COMPLEX);
    let naive = run("naive", &bufs);
    assert_eq!(
        objects(&naive),
        (
            (0..9).collect::<Vec<_>>(),
            vec![32, 32, 8, 16, 8, 64, 8, 8, 16]
        )
    );
    assert_eq!(naive.plan.total_bytes, 192);

    let gbs = run("greedy-by-size", &bufs);
    assert_eq!(gbs.plan.offsets, vec![0, 32, 80, 64, 88, 0, 64, 72, 0]);
    assert_eq!(gbs.plan.total_bytes, 96);

    let gbb = run("greedy-by-breadth", &bufs);
    assert_eq!(
        objects(&gbb),
        (vec![0, 4, 2, 1, 3, 0, 2, 3, 1], vec![64, 16, 8, 8, 32])
    );
    assert_eq!(gbb.plan.total_bytes, 128);

    let so = run("shared-objects", &bufs);
    assert_eq!(
        objects(&so),
        (vec![1, 0, 2, 1, 3, 0, 1, 2, 0], vec![64, 32, 8, 8])
    );
    assert_eq!(so.plan.total_bytes, 112);

    let b = lower_bound(&bufs).unwrap();
    assert_eq!(b.max_live_bytes, 96);
    assert_eq!(b.positional_max_bytes, 112);
}

#[test]
fn paper_example() {
    let bufs = records(&PAPER);
    assert_eq!(run("naive", &bufs).plan.total_bytes, 234);
    let gbs = run("greedy-by-size", &bufs);
    assert_eq!(gbs.plan.offsets, vec![0, 32, 64, 100, 116, 0, 104, 64]);
    assert_eq!(gbs.plan.total_bytes, 124);
    let b = lower_bound(&bufs).unwrap();
    assert_eq!(b.max_live_bytes, 124);
    assert_eq!(b.positional_max_bytes, 128);
}

#[test]
fn objects_to_offsets() {
    // TFLite's ManyObjectsAssignment.
    let o = SharedObjects {
        object_of: [2, 0, 2, 1, 3, 3, 1, 5].into_iter().map(Some).collect(),
        object_sizes_bytes: vec![16, 8, 32, 32, 4, 16],
    };
    let starts = o.object_offsets_bytes();
    let offsets: Vec<u64> = o.object_of.iter().map(|x| starts[x.unwrap()]).collect();
    assert_eq!(offsets, vec![24, 0, 24, 16, 56, 56, 16, 92]);
    assert_eq!(o.total_bytes(), 108);
}

#[test]
fn greedy_by_size_alignment_option() {
    // Worked by hand from TFLite's rule with base_addr_align_bytes = 128: the 32-byte record
    // meets the 64-byte one, whose end 64 aligns to 128.
    let bufs = records(&CHAIN);
    let opts = PlanOptions {
        align_bytes: 128,
        ..PlanOptions::default()
    };
    let r = run_with("greedy-by-size", &bufs, &opts);
    assert_eq!(r.plan.offsets, vec![0, 128, 0, 128, 0]);
    assert_eq!(r.plan.total_bytes, 160);
    for name in PLANNER_NAMES {
        let r = run_with(name, &bufs, &opts);
        assert!(r.plan.offsets.iter().all(|o| o % 128 == 0), "{name}");
    }
}

#[test]
fn search_reaches_the_bound_on_every_vector() {
    for (label, recs) in [
        ("chain", &CHAIN[..]),
        ("complex", &COMPLEX),
        ("paper", &PAPER),
    ] {
        let bufs = records(recs);
        let lb = lower_bound(&bufs).unwrap().max_live_bytes;
        let r = run("search", &bufs);
        assert_eq!(r.plan.total_bytes, lb, "{label}");
        assert_eq!(r.proven_optimal, Some(true), "{label}");
        assert_eq!(r.fits, None, "{label}");
        // Below the bound nothing fits, and the search says so.
        let tight = run_with(
            "search",
            &bufs,
            &PlanOptions {
                capacity_bytes: Some(lb - 1),
                ..PlanOptions::default()
            },
        );
        assert_eq!(tight.fits, Some(false), "{label}");
    }
}

#[test]
fn pushdown_grows_the_largest_free_block_and_pushes_down() {
    // Worked by hand from MegEngine's description (half-open lifetimes):
    // A 4 B [0,2), B 4 B [0,4), C 8 B [2,4).
    // t=0: A then B are appended (B lies on A). t=2: A is freed; C (8 B) finds no free block
    // large enough, so the largest (A's old 4 B block) grows to 8 B, below B: B lies on C.
    // Push-down: A = 0, C = 0, B = max(end A, end C) = 8; pool 12 (the max-live bound).
    let bufs = [
        Buffer::new(4, 0, 2),
        Buffer::new(4, 0, 4),
        Buffer::new(8, 2, 4),
    ];
    let pd = run("pushdown", &bufs);
    assert_eq!(pd.plan.offsets, vec![0, 8, 0]);
    assert_eq!(pd.plan.total_bytes, 12);
    // MegEngine's BEST_FIT never grows a free block: C goes on top, pool 16.
    let bf = run("pushdown-best-fit", &bufs);
    assert_eq!(bf.plan.offsets, vec![0, 4, 8]);
    assert_eq!(bf.plan.total_bytes, 16);
}

#[test]
fn overwrite_specs_share_memory() {
    // An in-place operator: Y (8 B) starts at X's last step and overwrites X at offset 0; Z is
    // live throughout. Without the spec the peak is 24 B; with it X and Y share 8 B.
    let bufs = [
        Buffer::new(8, 0, 2),
        Buffer::new(8, 1, 3).overwriting(0, 0),
        Buffer::new(8, 0, 3),
    ];
    assert_eq!(lower_bound(&bufs).unwrap().max_live_bytes, 16);
    for name in PLANNER_NAMES {
        let r = run(name, &bufs);
        assert_eq!(r.plan.offsets[1], r.plan.offsets[0], "{name}");
        assert_eq!(r.plan.total_bytes, 16, "{name}");
    }
    let pd = run("pushdown", &bufs);
    assert_eq!(pd.plan.offsets, vec![0, 0, 8]);

    // A child in the upper half of its parent.
    let half = [
        Buffer::new(16, 0, 2),
        Buffer::new(8, 1, 4).overwriting(0, 8),
        Buffer::new(4, 2, 4),
    ];
    for name in PLANNER_NAMES {
        let r = run(name, &half);
        assert_eq!(r.plan.offsets[1], r.plan.offsets[0] + 8, "{name}");
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let backwards = [Buffer::new(4, 3, 1)];
    let odd_align = [Buffer::new(4, 0, 1).with_align(3)];
    for name in PLANNER_NAMES {
        let opts = PlanOptions::default();
        assert!(matches!(
            run_planner(name, &backwards, &opts),
            Err(PlanError::BadLifetime { index: 0, .. })
        ));
        assert!(matches!(
            run_planner(name, &odd_align, &opts),
            Err(PlanError::BadAlign { index: 0, .. })
        ));
    }
    assert!(matches!(
        run_planner("lower-bound", &[], &PlanOptions::default()),
        Err(PlanError::NotAPlanner(_))
    ));
    assert!(matches!(
        run_planner("tetris", &[], &PlanOptions::default()),
        Err(PlanError::UnknownPlanner { .. })
    ));
    let huge = [Buffer::new(u64::MAX, 0, 1), Buffer::new(2, 0, 1)];
    assert_eq!(
        run_planner("greedy-by-size", &huge, &PlanOptions::default()),
        Err(PlanError::Overflow)
    );
}

#[test]
fn readme_example_of_minimalloc() {
    // minimalloc's README: capacity 12, published solution b1->8, b2->8, b3->4, b4->4, b5->0.
    let bufs = [
        Buffer::new(4, 0, 3),
        Buffer::new(4, 3, 9),
        Buffer::new(4, 0, 9),
        Buffer::new(4, 9, 21),
        Buffer::new(4, 0, 21),
    ];
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
    assert!(out.plan.total_bytes <= 12);
}

/// 100,000 buffers shaped like a malloc trace: starts every two time units, 90% short-lived
/// (up to 200 units), 9% medium (up to 20,000), 1% long (up to 200,000); sizes log-uniform from
/// 16 B to 1 MiB. About a thousand buffers are live at any time.
fn trace_like(n: usize) -> Vec<Buffer> {
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    (0..n as u64)
        .map(|i| {
            let lower = 2 * i + next() % 2;
            let r = next() % 100;
            let len = 1 + match r {
                0..90 => next() % 200,
                90..99 => next() % 20_000,
                _ => next() % 200_000,
            };
            let size = 16u64 << (next() % 17);
            Buffer::new(size + next() % size, lower, lower + len)
        })
        .collect()
}

/// 100,000 buffers shaped like an inference graph: one output per operator, read by the next
/// one to ten operators, sizes 1 KiB to 4 MiB. About ten buffers are live at any time.
fn graph_like(n: usize) -> Vec<Buffer> {
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
    (0..n as u64)
        .map(|i| {
            let size = 1024u64 << (next() % 12);
            Buffer::new(size, i, i + 1 + next() % 10)
        })
        .collect()
}

fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Prints each planner's time on 100,000 buffers; with optimisations on and debug assertions
/// off (`--release`), greedy-by-size must take under a second on both shapes.
#[test]
#[ignore = "timing; run with --run-ignored only (prints the figures)"]
fn greedy_planning_of_100k_buffers_takes_under_a_second() {
    let mut greedy_seconds = Vec::new();
    for (shape, bufs) in [
        ("trace-like", trace_like(100_000)),
        ("graph-like", graph_like(100_000)),
    ] {
        let lb = lower_bound(&bufs).unwrap().max_live_bytes;
        for name in [
            "naive",
            "greedy-by-size",
            "pushdown",
            "pushdown-best-fit",
            "greedy-by-breadth",
        ] {
            let t0 = std::time::Instant::now();
            let r = run_planner(name, &bufs, &PlanOptions::default()).unwrap();
            let took = t0.elapsed().as_secs_f64();
            validate(&bufs, &r.plan).unwrap();
            println!(
                "{shape} {name}: {took:.3} s, total {} B = {:.3} x max-live",
                r.plan.total_bytes,
                r.plan.total_bytes as f64 / lb as f64
            );
            if name == "greedy-by-size" {
                greedy_seconds.push((shape, took));
            }
        }
    }
    if !cfg!(debug_assertions) {
        for (shape, took) in greedy_seconds {
            assert!(took < 1.0, "{shape}: greedy-by-size took {took:.3} s");
        }
    }
}

#[test]
#[ignore = "timing on the shared real traces; run with --run-ignored only (prints the figures)"]
fn oracle_plans_the_shared_traces() {
    use allocview_sim::policy::Policy;
    use allocview_sim::policy::config::PolicyConfig;
    use allocview_sim::policy::oracle::Oracle;
    for name in [
        "find_usr_include.trace.gz",
        "git_log_p_gitui.trace.gz",
        "python311_json_re_sqlite.trace.gz",
    ] {
        let Some(path) = support::shared_trace(name) else {
            support::skip(&format!("../shared/data/traces/{name} not present"));
            continue;
        };
        let trace = support::read_trace(&path);
        let view = trace.view().unwrap();
        let t0 = std::time::Instant::now();
        let oracle = Oracle::new(&view, &PolicyConfig::default()).unwrap();
        let took = t0.elapsed();
        oracle.check_invariants().unwrap();
        println!(
            "{name}: {} allocations, planned in {:.3} s, plan {} B, max live {} B, ratio {:.4}",
            view.num_allocs,
            took.as_secs_f64(),
            oracle.plan_total_bytes(),
            oracle.lower_bound_bytes(),
            oracle.plan_total_bytes() as f64 / oracle.lower_bound_bytes() as f64
        );
        assert!(oracle.plan_total_bytes() >= oracle.lower_bound_bytes());
    }
}
