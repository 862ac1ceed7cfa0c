//! Replays the sample traces through every available policy and checks the facts that hold for
//! any correct policy: live bytes follow the trace's reference statistics, the footprint covers
//! the live bytes everywhere, and seeking from a checkpoint gives the state of a straight replay.
// Helpers outside #[test] functions unwrap too: a failed unwrap is a failed test here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use allocview_sim::classes::ClassSeries;
use allocview_sim::heap::{Block, Request};
use allocview_sim::policy::Policy;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry::POLICY_NAMES;
use allocview_sim::replay::{Replay, ReplayOptions, replay};
use allocview_sim::series::Bucketing;
use allocview_sim::testing::build_available;
use allocview_sim::trace::{EventKind, OwnedTrace, TraceView};

/// The number after `"key":` in a stats JSON file (no serde in `sim`).
fn stat(json: &str, key: &str) -> u64 {
    let pat = format!("\"{key}\":");
    let at = json.find(&pat).unwrap_or_else(|| panic!("{key} missing")) + pat.len();
    json[at..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

struct Sample {
    trace: OwnedTrace,
    stats: String,
}

fn sample(name: &str) -> Sample {
    let trace = support::read_trace(&support::sample_trace(&format!("{name}.trace.gz")));
    let stats =
        std::fs::read_to_string(support::sample_trace(&format!("{name}.stats.json"))).unwrap();
    Sample { trace, stats }
}

const OPTS: ReplayOptions = ReplayOptions {
    checkpoint_every: 4096,
    checkpoint_budget_bytes: 512 << 20,
    checkpoint_min_copies: 0,
    buckets: 300,
    align_bytes: 16,
    layout_index: false,
};

/// Applies events `0..=last` to a fresh policy, without the engine: the reference for seeks.
fn straight(policy: &mut Box<dyn Policy>, view: &TraceView<'_>, last: usize) {
    let mut addrs = vec![None; view.num_allocs as usize];
    for i in 0..=last {
        let id = view.alloc_id[i];
        match view.kind_at(i) {
            Some(EventKind::Alloc) => {
                let req = Request {
                    id,
                    size_bytes: view.size_bytes[i],
                    align_bytes: OPTS.align_bytes,
                };
                addrs[id as usize] = policy.alloc(req).ok().map(|p| p.addr);
            }
            Some(EventKind::Free) => {
                if let Some(a) = addrs[id as usize] {
                    policy.free(a).unwrap();
                }
            }
            _ => {}
        }
    }
}

fn check_replay(name: &str, s: &Sample, view: &TraceView<'_>, r: &Replay) {
    let peak_live = stat(&s.stats, "peak_live_bytes");
    let sum = &r.summary;
    assert_eq!(sum.events, stat(&s.stats, "events") as usize, "{name}");
    assert!(r.ooms.is_empty() && r.free_failures.is_empty(), "{name}");
    assert_eq!(sum.peak_live_bytes, peak_live, "{name}");
    assert_eq!(
        sum.peak_live_event,
        Some(stat(&s.stats, "peak_live_event") as usize),
        "{name}"
    );
    let fin = sum.final_counters;
    assert_eq!(fin.live_bytes, stat(&s.stats, "final_live_bytes"), "{name}");
    assert_eq!(
        fin.live_allocs,
        stat(&s.stats, "final_live_blocks"),
        "{name}"
    );
    assert!(
        sum.peak_footprint_bytes >= sum.peak_allocated_bytes,
        "{name}"
    );
    assert!(sum.peak_allocated_bytes >= sum.peak_live_bytes, "{name}");
    assert_eq!(sum.final_footprint_bytes, fin.footprint_bytes, "{name}");
    assert!((0.0..=1.0).contains(&sum.mean_fragmentation), "{name}");

    let se = &r.series;
    assert_eq!(se.len(), OPTS.buckets, "{name}");
    assert_eq!(se.event_count.iter().sum::<u64>() as usize, sum.events);
    for b in 0..se.len() {
        let (fp, live, alloc) = (&se.footprint_bytes, &se.live_bytes, &se.allocated_bytes);
        assert!(fp.max[b] >= live.max[b], "{name} bucket {b}");
        assert!(fp.min[b] >= live.min[b], "{name} bucket {b}");
        assert!(fp.last[b] >= live.last[b], "{name} bucket {b}");
        assert!(alloc.last[b] >= live.last[b], "{name} bucket {b}");
        assert!(
            fp.min[b] <= fp.last[b] && fp.last[b] <= fp.max[b],
            "{name} bucket {b}"
        );
    }
    assert_eq!(se.live_bytes.max.iter().max(), Some(&peak_live), "{name}");
    assert_eq!(
        se.footprint_bytes.max.iter().max(),
        Some(&sum.peak_footprint_bytes),
        "{name}"
    );

    // Seeks from checkpoints agree with straight replays, blocks included.
    let n = sum.events;
    let k = r.checkpoint_every();
    assert!(
        r.checkpoint_count() > 2,
        "{name}: too few checkpoints to test seeking"
    );
    let events = [0, 1, k - 1, k, k + 1, 2 * k + 17, n / 2, n - 2, n - 1];
    for event in events.into_iter().filter(|&e| e < n) {
        let (seeked, counters) = r.state_at(view, event).unwrap();
        let mut fresh = build_available(name, &PolicyConfig::default(), view)
            .unwrap()
            .unwrap();
        straight(&mut fresh, view, event);
        assert_eq!(counters, fresh.counters(), "{name} event {event}");
        let (mut a, mut b): (Vec<Block>, Vec<Block>) = (Vec::new(), Vec::new());
        seeked.blocks(&mut a);
        fresh.blocks(&mut b);
        assert_eq!(a, b, "{name} event {event}");
    }
}

fn replay_all(trace_name: &str) {
    let s = sample(trace_name);
    let view = s.trace.view().unwrap();
    let mut replayed = 0;
    for name in POLICY_NAMES {
        let Some(policy) = build_available(name, &PolicyConfig::default(), &view).unwrap() else {
            eprintln!("skipping {name}: not available yet");
            continue;
        };
        let r = replay(&view, policy, &OPTS);
        eprintln!(
            "{trace_name} {name}: peak footprint {} B, {:.1} M events/s",
            r.summary.peak_footprint_bytes,
            r.summary.events_per_second / 1e6
        );
        check_replay(name, &s, &view, &r);
        replayed += 1;
    }
    assert!(replayed >= 4, "only {replayed} policies available");
}

#[test]
fn find_usr_include_through_every_policy() {
    replay_all("find_usr_include");
}

#[test]
fn xz_through_every_policy() {
    replay_all("xz_T2_8KiB_blocks");
}

#[test]
fn size_classes_follow_the_trace() {
    let s = sample("find_usr_include");
    let view = s.trace.view().unwrap();
    let bucketing = Bucketing::for_trace(&view, OPTS.buckets);
    let classes = ClassSeries::build(&view, bucketing, 1000);
    let peak_event = stat(&s.stats, "peak_live_event") as usize;
    let h = classes.histogram_at(&view, peak_event).unwrap();
    assert_eq!(
        h.live_bytes.iter().sum::<u64>(),
        stat(&s.stats, "peak_live_bytes")
    );
    assert_eq!(
        h.live_count.iter().sum::<u64>(),
        stat(&s.stats, "peak_live_blocks_at_peak_bytes")
    );
    let last = classes.live_bytes_at_end(OPTS.buckets - 1).unwrap();
    assert_eq!(last.iter().sum::<u64>(), stat(&s.stats, "final_live_bytes"));
    let h_end = classes.histogram_at(&view, view.len() - 1).unwrap();
    assert_eq!(&h_end.live_bytes[..], last);

    // The per-bucket class totals agree with the replay's live-bytes series.
    let r = replay(
        &view,
        build_available("first-fit", &PolicyConfig::default(), &view)
            .unwrap()
            .unwrap(),
        &OPTS,
    );
    for b in 0..OPTS.buckets {
        let total: u64 = classes.live_bytes_at_end(b).unwrap().iter().sum();
        assert_eq!(total, r.series.live_bytes.last[b], "bucket {b}");
        let peak: u64 = classes.live_bytes_peak(b).unwrap().iter().sum();
        assert!(peak >= r.series.live_bytes.max[b], "bucket {b}");
    }
}

/// Replay rates on the shared traces (run with `--run-ignored only --no-capture`): the best of
/// three replays per policy, and the bare policy calls without the engine's bookkeeping.
#[test]
#[ignore = "timing report, not a check"]
fn replay_rates() {
    for file in [
        "find_usr_include.trace.gz",
        "git_log_p_gitui.trace.gz",
        "python311_json_re_sqlite.trace.gz",
    ] {
        let Some(path) = support::shared_trace(file) else {
            continue;
        };
        let trace = support::read_trace(&path);
        let view = trace.view().unwrap();
        for name in POLICY_NAMES {
            let config = PolicyConfig::default();
            let Some(proto) = build_available(name, &config, &view).unwrap() else {
                continue;
            };
            let best = (0..3)
                .map(|_| replay(&view, proto.clone_box(), &ReplayOptions::default()))
                .map(|r| r.summary.events_per_second)
                .fold(0.0, f64::max);
            let no_checkpoints = ReplayOptions {
                checkpoint_every: 0,
                ..ReplayOptions::default()
            };
            let best_unseekable = (0..3)
                .map(|_| replay(&view, proto.clone_box(), &no_checkpoints))
                .map(|r| r.summary.events_per_second)
                .fold(0.0, f64::max);
            let bare = (0..3)
                .map(|_| {
                    let mut p = proto.clone_box();
                    let t = std::time::Instant::now();
                    straight(&mut p, &view, view.len() - 1);
                    view.len() as f64 / t.elapsed().as_secs_f64()
                })
                .fold(0.0, f64::max);
            let r = replay(&view, proto.clone_box(), &ReplayOptions::default());
            let mut worst_seek_ms = 0.0f64;
            for k in 1..=20 {
                let event = view.len() * k / 21 + k * 977 % 16_384;
                let t = std::time::Instant::now();
                let (p, _) = r.state_at(&view, event.min(view.len() - 1)).unwrap();
                worst_seek_ms = worst_seek_ms.max(t.elapsed().as_secs_f64() * 1e3);
                drop(p);
            }
            eprintln!(
                "{file} {name}: replay {:.1} M events/s ({:.1} without checkpoints), bare policy \
                 calls {:.1} M events/s, worst of 20 seeks {worst_seek_ms:.2} ms ({} checkpoints \
                 every {} events)",
                best / 1e6,
                best_unseekable / 1e6,
                bare / 1e6,
                r.checkpoint_count(),
                r.checkpoint_every()
            );
        }
    }
}

/// Seek latency on a synthetic 27-million-event trace (run with `--run-ignored only
/// --no-capture`): about 100k live allocations, so checkpoints are large and the budget thins
/// them.
#[test]
#[ignore = "timing report on a large synthetic trace, not a check"]
fn seek_on_27m_events() {
    let mut trace = OwnedTrace::new();
    let mut live: Vec<u32> = Vec::new();
    let mut x: u64 = 12345;
    let mut t = 0i64;
    while trace.kind.len() < 27_000_000 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        t += 1;
        let r = x >> 33;
        if live.len() < 100_000 && (r.is_multiple_of(2) || live.is_empty()) {
            let size = 1 + (r >> 8) % (1 << ((r >> 3) % 16));
            live.push(trace.alloc(t, size));
        } else {
            let k = (r >> 4) as usize % live.len();
            trace.free(t, live.swap_remove(k));
        }
    }
    let view = trace.view().unwrap();
    for name in ["best-fit", "bfc", "buddy"] {
        let policy = build_available(name, &PolicyConfig::default(), &view)
            .unwrap()
            .unwrap();
        let r = replay(&view, policy, &ReplayOptions::default());
        let mut worst_ms = 0.0f64;
        for k in 1..=20 {
            let event = view.len() / 21 * k + k * 7919 % 50_000;
            let start = std::time::Instant::now();
            let (p, _) = r.state_at(&view, event).unwrap();
            worst_ms = worst_ms.max(start.elapsed().as_secs_f64() * 1e3);
            drop(p);
        }
        eprintln!(
            "{name}: {:.1} M events/s, {} checkpoints every {} events, worst seek {worst_ms:.1} ms",
            r.summary.events_per_second / 1e6,
            r.checkpoint_count(),
            r.checkpoint_every()
        );
    }
}
