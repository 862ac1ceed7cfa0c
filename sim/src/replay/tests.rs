//! The replay engine's tests: exact scalars and series on small traces worked by hand,
//! seeks, checkpoints and their budget.

use super::*;
use crate::policy::config::PolicyConfig;
use crate::policy::registry::build;
use crate::trace::OwnedTrace;

fn sample_trace() -> OwnedTrace {
    let mut t = OwnedTrace::new();
    let a = t.alloc(0, 100); // first fit: [0, 112)
    let b = t.alloc(10, 200); // [112, 320)
    t.free(20, a);
    let c = t.alloc(30, 50); // reuses [0, 64)
    t.free(40, b);
    t.free(50, c);
    t
}

#[test]
fn fragmentation_at_peak_is_taken_where_the_peak_is_best_used() {
    let mut t = OwnedTrace::new();
    let a = t.alloc(0, 100); // [0, 112)
    t.alloc(1, 200); // [112, 320): peak footprint 320 first reached with 300 live
    t.free(2, a);
    t.alloc(3, 112); // [0, 112) again: 312 live in the same 320
    let view = t.view().unwrap();
    let policy = build("first-fit", &PolicyConfig::default(), &view).unwrap();
    let r = replay(&view, policy, &ReplayOptions::default());
    assert_eq!(r.summary.peak_footprint_bytes, 320);
    assert_eq!(r.summary.peak_footprint_event, Some(1));
    assert!((r.summary.fragmentation_at_peak - (1.0 - 312.0 / 320.0)).abs() < 1e-12);
}

/// A policy whose copy alone would overrun the checkpoint budget is not copied past the
/// initial state, and seeks still work (from the start).
#[test]
fn a_copy_bigger_than_the_budget_is_not_made() {
    let mut t = OwnedTrace::new();
    // 200 top-level buddy blocks of 64 MiB, each filled with one block of every order from
    // 32 MiB down: each keeps one free block of 256 B, 64 MiB from the last one, so each is a
    // page of the order-0 bitmap of its own (4 KiB): 800 KiB of state.
    let mut at = 0i64;
    for _ in 0..200 {
        for order in (0..18).rev() {
            t.alloc(at, 256u64 << order);
            at += 1;
        }
    }
    let view = t.view().unwrap();
    let policy = build("buddy", &PolicyConfig::default(), &view).unwrap();
    let budget_bytes = 256 << 10;
    let opts = ReplayOptions {
        checkpoint_every: 1,
        checkpoint_budget_bytes: budget_bytes,
        ..ReplayOptions::default()
    };
    let r = replay(&view, policy, &opts);
    assert!(
        r.final_state.state_bytes() > budget_bytes,
        "the bitmaps outgrow the budget"
    );
    // 64 bytes per live allocation would charge the last state under 300 KB.
    assert!(r.final_state.counters().live_allocs * 64 < 300 << 10);
    let real: u64 = r.checkpoints.iter().map(|c| c.policy.state_bytes()).sum();
    assert!(real <= budget_bytes, "checkpoints hold {real} bytes");
    let (_, c) = r.state_at(&view, 150).unwrap();
    assert_eq!(c.live_allocs, 151);
    assert_eq!(r.summary.final_footprint_bytes, 200 * (64 << 20));
}

#[test]
fn replays_first_fit_with_exact_scalars() {
    let owned = sample_trace();
    let view = owned.view().unwrap();
    let policy = build("first-fit", &PolicyConfig::default(), &view).unwrap();
    let opts = ReplayOptions {
        checkpoint_every: 2,
        buckets: 3,
        ..ReplayOptions::default()
    };
    let r = replay(&view, policy, &opts);
    let s = &r.summary;
    assert_eq!(s.events, 6);
    assert_eq!(s.peak_footprint_bytes, 320);
    assert_eq!(s.peak_footprint_event, Some(1));
    assert_eq!(s.final_footprint_bytes, 0);
    assert_eq!(s.peak_live_bytes, 300);
    assert_eq!(s.peak_allocated_bytes, 112 + 208);
    assert!((s.fragmentation_at_peak - (1.0 - 300.0 / 320.0)).abs() < 1e-12);
    assert_eq!(s.oom_count, 0);
    // (live, footprint) after each event: (100, 112), (300, 320), (200, 320), (250, 320),
    // (50, 64), (0, 0).
    let by_hand = (12.0 / 112.0 + 20.0 / 320.0 + 120.0 / 320.0 + 70.0 / 320.0 + 14.0 / 64.0) / 6.0;
    assert!((s.mean_fragmentation - by_hand).abs() < 1e-12);
    assert_eq!(r.addr_of(2), Some(0));
    assert_eq!(r.series.len(), 3);
    assert_eq!(r.series.footprint_bytes.max, vec![320, 320, 64]);
    assert_eq!(r.series.footprint_bytes.last, vec![320, 320, 0]);
    assert_eq!(r.checkpoint_count(), 3);

    for event in 0..6 {
        let (_, from_seek) = r.state_at(&view, event).unwrap();
        let mut fresh = build("first-fit", &PolicyConfig::default(), &view).unwrap();
        let mut addrs = vec![FAILED; 3];
        for i in 0..=event {
            let out = apply(
                fresh.as_mut(),
                view.kind[i],
                view.alloc_id[i],
                view.alloc_id[i],
                view.size_bytes[i],
                16,
                addrs.as_slice(),
            );
            if let Ok(Some(a)) = out {
                addrs[view.alloc_id[i] as usize] = a.addr;
            }
        }
        assert_eq!(from_seek, fresh.counters(), "event {event}");
    }
    assert!(matches!(
        r.state_at(&view, 6),
        Err(SeekError::OutOfRange { .. })
    ));
}

/// The replay, which measures stretches of events in runs of one time bucket, gives the
/// series and the summary that event-by-event shadows give on the states after each event
/// (one fresh policy replayed by hand): for traces longer than a stretch, with checkpoints
/// cutting the spans, out-of-memory failures, and times that stall.
#[test]
fn the_replay_measures_as_event_by_event_shadows_do() {
    use crate::replay::peaks::tests::shadow as peaks_shadow;
    use crate::series::State;
    use crate::series::tests::shadow as series_shadow;

    let mut t = OwnedTrace::new();
    let (mut x, mut live, mut time) = (12345u64, Vec::new(), 0i64);
    for _ in 0..1500 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        time += (x >> 61) as i64;
        if x % 3 != 0 || live.is_empty() {
            live.push(t.alloc(time, 1 + (x >> 20) % 70_000));
        } else {
            let id = live.swap_remove((x >> 7) as usize % live.len());
            t.free(time, id);
        }
    }
    let view = t.view().unwrap();
    for (name, limit) in [
        ("first-fit", None),
        ("best-fit", Some(3 << 20)),
        ("bfc", Some(4 << 20)),
        ("buddy", Some(8 << 20)),
        ("glibc", None),
    ] {
        let config = PolicyConfig {
            limit_bytes: limit,
            ..PolicyConfig::default()
        };
        let opts = ReplayOptions {
            checkpoint_every: 97,
            buckets: 37,
            ..ReplayOptions::default()
        };
        let r = replay(&view, build(name, &config, &view).unwrap(), &opts);
        let mut fresh = build(name, &config, &view).unwrap();
        let mut addrs = vec![FAILED; view.num_allocs as usize];
        let mut states = Vec::new();
        for i in 0..view.kind.len() {
            let id = view.alloc_id[i];
            let out = apply(
                fresh.as_mut(),
                view.kind[i],
                id,
                id,
                view.size_bytes[i],
                opts.align_bytes,
                addrs.as_slice(),
            );
            if let Ok(Some(p)) = out {
                addrs[id as usize] = p.addr;
            }
            states.push(State::of(&fresh.counters(), matches!(out, Err(Ok(_)))));
        }
        let ooms = states.iter().filter(|s| s.failed).count();
        assert_eq!(r.summary.oom_count, ooms as u64, "{name}");
        assert_eq!(
            limit.is_some(),
            ooms > 0,
            "{name}: the limits are meant to bind"
        );
        let b = Bucketing::for_trace(&view, opts.buckets);
        assert_eq!(r.series, series_shadow(b, view.t_ns, &states), "{name}");
        let (fp, fp_event, live_at, live, live_event, allocated, frag) = peaks_shadow(&states);
        let s = &r.summary;
        assert_eq!(
            (s.peak_footprint_bytes, s.peak_footprint_event),
            (fp, fp_event),
            "{name}"
        );
        assert_eq!(
            (s.peak_live_bytes, s.peak_live_event),
            (live, live_event),
            "{name}"
        );
        assert_eq!(s.peak_allocated_bytes, allocated, "{name}");
        let at_peak = crate::metrics::fragmentation(&Counters {
            live_bytes: live_at,
            footprint_bytes: fp,
            ..Counters::default()
        });
        assert_eq!(
            s.fragmentation_at_peak.to_bits(),
            at_peak.to_bits(),
            "{name}"
        );
        let mean = frag / view.kind.len() as f64;
        assert_eq!(s.mean_fragmentation.to_bits(), mean.to_bits(), "{name}");
        assert_eq!(s.final_counters, fresh.counters(), "{name}");
        for id in 0..view.num_allocs {
            assert_eq!(
                r.addr_of(id),
                Some(addrs[id as usize]).filter(|&a| a != FAILED),
                "{name}"
            );
        }
    }
}

/// Addresses that pass 4 GiB midway widen the replay's address table without losing the
/// addresses placed before: every free still finds its block, and the table answers for
/// each allocation.
#[test]
fn addresses_past_4_gib_widen_the_table_midway() {
    let mut t = OwnedTrace::new();
    let small = t.alloc(0, 64);
    let big = t.alloc(1, 5 << 30);
    let high = t.alloc(2, 64);
    t.free(3, small);
    t.free(4, high);
    t.free(5, big);
    let view = t.view().unwrap();
    let r = replay(
        &view,
        build("first-fit", &PolicyConfig::default(), &view).unwrap(),
        &ReplayOptions::default(),
    );
    assert!(r.free_failures.is_empty());
    assert_eq!(r.summary.final_counters.live_allocs, 0);
    assert_eq!(r.addr_of(small), Some(0));
    assert_eq!(r.addr_of(big), Some(64));
    assert_eq!(r.addr_of(high), Some(64 + (5 << 30)));
}

/// A cancelled replay stops at its next check and says so; one never cancelled is the
/// plain replay.
#[test]
fn a_cancelled_replay_stops() {
    let mut t = OwnedTrace::new();
    for i in 0..3 * PROGRESS_EVERY as i64 {
        let id = t.alloc(i, 16);
        t.free(i, id);
    }
    let view = t.view().unwrap();
    let config = PolicyConfig::default();
    let opts = ReplayOptions::default();
    let cancel = std::sync::atomic::AtomicBool::new(true);
    let (r, cancelled) = replay_cancellable(
        &view,
        build("first-fit", &config, &view).unwrap(),
        &opts,
        None,
        &cancel,
    );
    assert!(cancelled);
    assert_eq!(r.summary.events, 0);
    cancel.store(false, std::sync::atomic::Ordering::Relaxed);
    let (whole, cancelled) = replay_cancellable(
        &view,
        build("first-fit", &config, &view).unwrap(),
        &opts,
        None,
        &cancel,
    );
    assert!(!cancelled);
    assert_eq!(whole.summary.events, view.len());
}

#[test]
fn failed_allocations_are_recorded_and_their_frees_skipped() {
    let mut t = OwnedTrace::new();
    let a = t.alloc(0, 64);
    let big = t.alloc(1, 1000);
    let c = t.alloc(2, 32);
    t.free(3, big);
    t.free(4, a);
    t.free(5, c);
    let view = t.view().unwrap();
    let config = PolicyConfig {
        limit_bytes: Some(256),
        ..PolicyConfig::default()
    };
    let policy = build("best-fit", &config, &view).unwrap();
    let r = replay(&view, policy, &ReplayOptions::default());
    assert_eq!(r.ooms.len(), 1);
    let oom = &r.ooms[0];
    assert_eq!(oom.event, 1);
    assert_eq!(oom.request.size_bytes, 1000);
    assert_eq!(oom.counters_at_failure.live_bytes, 64);
    assert!(matches!(oom.error, AllocError::OutOfMemory { .. }));
    let first = r.first_oom_state.as_ref().unwrap();
    assert_eq!(first.counters().footprint_bytes, 64);
    assert!(r.free_failures.is_empty());
    assert_eq!(r.addr_of(big), None);
    assert_eq!(r.addr_of(c), Some(64));
    assert_eq!(r.summary.oom_count, 1);
    assert_eq!(r.series.ooms.iter().sum::<u64>(), 1);
    assert_eq!(r.summary.final_counters, Counters::default());
    let (_, c3) = r.state_at(&view, 3).unwrap();
    assert_eq!(c3.live_bytes, 96);
}

#[test]
fn zero_interval_keeps_only_the_initial_state() {
    let owned = sample_trace();
    let view = owned.view().unwrap();
    let policy = build("best-fit", &PolicyConfig::default(), &view).unwrap();
    let opts = ReplayOptions {
        checkpoint_every: 0,
        ..ReplayOptions::default()
    };
    let r = replay(&view, policy, &opts);
    assert_eq!(r.checkpoint_count(), 1);
    assert_eq!(r.checkpoint_every(), 6);
    let (_, c) = r.state_at(&view, 3).unwrap();
    assert_eq!(c.live_bytes, 250);
}

#[test]
fn checkpoint_budget_thins_checkpoints() {
    let mut t = OwnedTrace::new();
    for i in 0..1000 {
        t.alloc(i, 16);
    }
    let view = t.view().unwrap();
    let policy = build("first-fit", &PolicyConfig::default(), &view).unwrap();
    let opts = ReplayOptions {
        checkpoint_every: 10,
        // Room for a few thousand estimated bytes only.
        checkpoint_budget_bytes: 20_000,
        ..ReplayOptions::default()
    };
    let r = replay(&view, policy, &opts);
    assert!(r.checkpoint_every() > 10);
    let total: u64 = r.checkpoints.iter().map(|c| c.approx_bytes).sum();
    assert!(total <= 20_000, "{total}");
    for c in &r.checkpoints {
        assert_eq!(c.next_event % r.checkpoint_every(), 0);
    }
    let (_, c) = r.state_at(&view, 537).unwrap();
    assert_eq!(c.live_allocs, 538);
}

/// A heap too big for its budget still gets checkpoints when the caller asks for copies of it
/// (the explorers' floor), and never more than the default budget allows.
#[test]
fn a_copy_floor_raises_a_small_budget_up_to_the_default() {
    let mut t = OwnedTrace::new();
    for i in 0..1000 {
        t.alloc(i, 16);
    }
    let view = t.view().unwrap();
    let run = |min_copies| {
        let policy = build("first-fit", &PolicyConfig::default(), &view).unwrap();
        let opts = ReplayOptions {
            checkpoint_every: 10,
            // Less than one copy of the state at the end (64 bytes a block).
            checkpoint_budget_bytes: 20_000,
            checkpoint_min_copies: min_copies,
            ..ReplayOptions::default()
        };
        replay(&view, policy, &opts)
    };
    let thin = run(0);
    let floored = run(8);
    let largest = floored
        .checkpoints
        .iter()
        .map(|c| c.approx_bytes)
        .max()
        .unwrap();
    let total: u64 = floored.checkpoints.iter().map(|c| c.approx_bytes).sum();
    assert!(total > 20_000, "{total}");
    assert!(
        total <= 8 * largest.max(20_000 / 8),
        "{total} for copies of {largest}"
    );
    assert!(floored.checkpoints.len() > thin.checkpoints.len());
    assert!(floored.checkpoint_every() < thin.checkpoint_every());
    let (_, c) = floored.state_at(&view, 937).unwrap();
    assert_eq!(c.live_allocs, 938);
    // However many copies are asked for, the budget they make is the default at most.
    let policy = build("first-fit", &PolicyConfig::default(), &view).unwrap();
    let opts = ReplayOptions {
        checkpoint_every: 1,
        checkpoint_budget_bytes: 1,
        checkpoint_min_copies: u64::MAX,
        ..ReplayOptions::default()
    };
    let capped = replay(&view, policy, &opts);
    let total: u64 = capped.checkpoints.iter().map(|c| c.approx_bytes).sum();
    assert!(total <= DEFAULT_CHECKPOINT_BUDGET_BYTES, "{total}");
    assert!(capped.checkpoints.len() > 1);
}
