//! Property tests over random small instances: every planner's plan validates, the search never
//! does worse than greedy, and on tiny instances the search (with every switch setting) finds
//! exactly the optimum of a brute-force enumeration of all integer offsets.

use proptest::prelude::*;

use super::*;

/// Random buffers: sizes 0..=max_size, lifetimes inside [0, 10) (sometimes empty), alignments
/// 1/2/4, and occasionally an overwrite spec towards an earlier buffer that has no child yet.
fn instance(max_n: usize, max_size: u64, overwrites: bool) -> impl Strategy<Value = Vec<Buffer>> {
    prop::collection::vec(
        (
            0..=max_size,
            0u64..10,
            0u64..6,
            0u32..3,
            any::<(bool, u8, u8)>(),
        ),
        0..=max_n,
    )
    .prop_map(move |raw| {
        let mut bufs: Vec<Buffer> = Vec::new();
        let mut has_child = vec![false; raw.len()];
        for (i, (size, lower, len, align_log2, (ow, pick, off))) in raw.into_iter().enumerate() {
            let align = 1u64 << align_log2;
            let mut b = Buffer::new(size, lower, lower + len).with_align(align);
            if overwrites && ow && i > 0 {
                let parent = usize::from(pick) % i;
                let p = bufs[parent];
                if !has_child[parent] && size <= p.size_bytes {
                    has_child[parent] = true;
                    // Unaligned, so any place inside the parent keeps its alignment.
                    let offset = u64::from(off) % (p.size_bytes - size + 1);
                    b = b.with_align(1).overwriting(parent, offset);
                }
            }
            bufs.push(b);
        }
        bufs
    })
}

/// Is there a placement of height <= `cap` (every integer offset tried)?
fn brute_fits(bufs: &[Buffer], cap: u64) -> bool {
    let mut order: Vec<usize> = (0..bufs.len())
        .filter(|&i| bufs[i].needs_memory())
        .collect();
    order.sort_by_key(|&i| std::cmp::Reverse(bufs[i].size_bytes));
    let mut offsets = vec![0u64; bufs.len()];
    fn go(bufs: &[Buffer], order: &[usize], k: usize, cap: u64, offsets: &mut [u64]) -> bool {
        let Some(&i) = order.get(k) else { return true };
        let b = bufs[i];
        if b.size_bytes > cap {
            return false;
        }
        let mut o = 0;
        while o + b.size_bytes <= cap {
            let clash = order[..k].iter().any(|&j| {
                let c = bufs[j];
                c.overlaps_in_time(&b)
                    && offsets[j] < o + b.size_bytes
                    && o < offsets[j] + c.size_bytes
            });
            if !clash {
                offsets[i] = o;
                if go(bufs, order, k + 1, cap, offsets) {
                    return true;
                }
            }
            o += b.align_bytes;
        }
        false
    }
    go(bufs, &order, 0, cap, &mut offsets)
}

fn brute_optimum(bufs: &[Buffer]) -> u64 {
    let mut h = max_live_bytes(bufs).unwrap();
    while !brute_fits(bufs, h) {
        h += 1;
    }
    h
}

fn min_search(bufs: &[Buffer], params: SearchParams) -> SearchOutcome {
    search(
        bufs,
        &SearchOptions {
            params,
            ..SearchOptions::default()
        },
    )
    .unwrap()
}

/// The default switches, and each one turned off in turn (monotonic floor goes with canonical
/// order, which it relies on), and a single unbounded heuristic.
fn param_variants() -> Vec<SearchParams> {
    let d = SearchParams::default();
    vec![
        d,
        SearchParams {
            canonical_only: false,
            monotonic_floor: false,
            ..d
        },
        SearchParams {
            section_inference: false,
            ..d
        },
        SearchParams {
            check_dominance: false,
            ..d
        },
        SearchParams {
            unallocated_floor: false,
            ..d
        },
        SearchParams {
            dynamic_decomposition: false,
            ..d
        },
        SearchParams {
            monotonic_floor: false,
            ..d
        },
        SearchParams {
            hatless_pruning: false,
            ..d
        },
        SearchParams {
            heuristics: &["WAT"],
            ..d
        },
    ]
}

/// TFLite's `GreedyBySizeAssignment` as written: every placed buffer scanned in offset order,
/// with a uniform alignment (`AlignByN` of each placed end).
fn tflite_greedy_by_size(bufs: &[Buffer], align: u64) -> Vec<u64> {
    let mut order: Vec<usize> = (0..bufs.len())
        .filter(|&i| bufs[i].needs_memory())
        .collect();
    order.sort_by(|&a, &b| bufs[b].size_bytes.cmp(&bufs[a].size_bytes));
    let mut offsets = vec![0u64; bufs.len()];
    let mut ordered: Vec<usize> = Vec::new();
    for i in order {
        let b = bufs[i];
        let (mut best, mut best_diff, mut prev) = (None, u64::MAX, 0u64);
        for &j in &ordered {
            if !bufs[j].overlaps_in_time(&b) {
                continue;
            }
            let cur = offsets[j];
            if cur >= prev {
                let diff = cur - prev;
                if diff >= b.size_bytes && diff < best_diff {
                    best_diff = diff;
                    best = Some(prev);
                }
            }
            prev = prev.max((cur + bufs[j].size_bytes).div_ceil(align) * align);
        }
        let at = best.unwrap_or(prev);
        let pos = ordered.iter().take_while(|&&j| offsets[j] <= at).count();
        ordered.insert(pos, i);
        offsets[i] = at;
    }
    offsets
}

/// Big enough for the occupancy index's tree to have many nodes, long-lived buffers in the
/// unions of several of them, and partly covered buckets: the query merges many sources that
/// repeat one another. Greedy-by-size places as TFLite's quadratic loop does.
#[test]
fn greedy_by_size_matches_tflite_on_thousands_of_overlapping_buffers() {
    for seed in 1..=4u64 {
        let mut x = seed;
        let mut next = move || {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            x >> 33
        };
        let bufs: Vec<Buffer> = (0..2500u64)
            .map(|i| {
                let size = 1 + next() % 4096;
                let len = match next() % 10 {
                    0 => 1 + next() % 2500,
                    1..=3 => 1 + next() % 200,
                    _ => 1 + next() % 12,
                };
                Buffer::new(size, i, i + len)
            })
            .collect();
        for align in [1, 16] {
            let want = tflite_greedy_by_size(&bufs, align);
            let plan = greedy_by_size::plan(&bufs, align).unwrap();
            assert_eq!(plan.offsets, want, "seed {seed}, align {align}");
            // Small buckets and few cached levels: queries also merge `full` unions of nodes
            // below the cached levels, which the default shape only has past 32,768 starts.
            for (bucket, cache_depth) in [(4, 1), (1, 0), (16, 3)] {
                let plan = greedy_by_size::plan_shaped(&bufs, align, bucket, cache_depth).unwrap();
                assert_eq!(
                    plan.offsets, want,
                    "seed {seed}, align {align}, bucket {bucket}, cache depth {cache_depth}"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn greedy_by_size_matches_tflite_as_written(
        raw in prop::collection::vec((1u64..64, 0u64..60, 1u64..30), 0..120),
        align_log2 in 0u32..4,
    ) {
        let bufs: Vec<Buffer> = raw
            .iter()
            .map(|&(s, lo, len)| Buffer::new(s, lo, lo + len))
            .collect();
        let align = 1u64 << align_log2;
        let plan = greedy_by_size::plan(&bufs, align).unwrap();
        prop_assert_eq!(plan.offsets, tflite_greedy_by_size(&bufs, align));
    }

    #[test]
    fn every_planner_gives_a_valid_plan(bufs in instance(14, 24, true), align_log2 in 0u32..3) {
        let opts = PlanOptions { align_bytes: 1 << align_log2, ..PlanOptions::default() };
        let bound = max_live_bytes(&bufs).unwrap();
        for name in PLANNER_NAMES {
            let r = run_planner(name, &bufs, &opts).unwrap();
            prop_assert_eq!(validate(&bufs, &r.plan), Ok(()), "{}", name);
            prop_assert!(r.plan.total_bytes >= bound, "{} below the bound", name);
            if let Some(o) = &r.objects {
                prop_assert_eq!(r.plan.total_bytes >= o.total_bytes(), true, "{}", name);
                prop_assert!(o.total_bytes() >= positional_max_bytes(&bufs).unwrap(), "{}", name);
            }
        }
    }

    #[test]
    fn search_never_loses_to_greedy(bufs in instance(12, 24, true)) {
        let greedy = greedy_by_size::plan(&bufs, 1).unwrap();
        let out = min_search(&bufs, SearchParams::default());
        prop_assert_eq!(validate(&bufs, &out.plan), Ok(()));
        prop_assert!(out.plan.total_bytes <= greedy.total_bytes);
        prop_assert!(out.proven_optimal);
    }

    #[test]
    fn search_finds_the_brute_force_optimum(bufs in instance(5, 4, false)) {
        let opt = brute_optimum(&bufs);
        for params in param_variants() {
            let out = min_search(&bufs, params);
            prop_assert_eq!(validate(&bufs, &out.plan), Ok(()));
            prop_assert_eq!(out.plan.total_bytes, opt, "{:?}", params);
            prop_assert!(out.proven_optimal);
        }
        // The decision mode agrees at the optimum and just below it.
        for cap in [opt, opt.saturating_sub(1)] {
            let out = search(&bufs, &SearchOptions {
                mode: SearchMode::Fit { capacity_bytes: cap },
                ..SearchOptions::default()
            }).unwrap();
            prop_assert_eq!(out.fits, Some(opt <= cap), "capacity {}", cap);
            if opt <= cap {
                prop_assert!(out.plan.total_bytes <= cap);
            }
        }
    }
}
