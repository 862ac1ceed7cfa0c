//! The explorers' worker threads: loading the input, the size-class series and each policy's
//! replay, reported to the model as messages, so the window opens at once and the cursor moves
//! while policies replay.

use std::sync::Arc;
use std::sync::mpsc::Sender;

use allocview_sim::classes::ClassSeries;
use allocview_sim::policy::registry;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::replay::{DEFAULT_CHECKPOINT_BUDGET_BYTES, ReplayOptions, replay_cancellable};
use allocview_sim::series::Bucketing;

use super::state::{AppState, BUCKETS};
use super::trace_data::TraceData;
use super::update::{Msg, update};

/// Starts loading the trace, then the size-class series and every policy's replay, on worker
/// threads that report through `tx`.
pub fn start_workers(state: &AppState, lenient: bool, jobs: usize, tx: &Sender<Msg>) {
    let path = state.path.clone();
    let progress = Arc::clone(&state.load_progress);
    let specs: Vec<PolicySpec> = state.policies.iter().map(|p| p.spec.clone()).collect();
    let progress_of: Vec<Arc<std::sync::atomic::AtomicUsize>> = state
        .policies
        .iter()
        .map(|p| Arc::clone(&p.progress))
        .collect();
    let preparing_of: Vec<_> = state
        .policies
        .iter()
        .map(|p| Arc::clone(&p.preparing))
        .collect();
    let config = state.config.clone();
    let window = state.window.clone();
    let cancel = Arc::clone(&state.cancel);
    let tx = tx.clone();
    std::thread::spawn(move || {
        let data = match TraceData::load(&path, lenient, &window, progress) {
            Ok(d) => Arc::new(d),
            Err(e) => {
                tx.send(Msg::Loaded(Err(e))).ok();
                return;
            }
        };
        tx.send(Msg::Loaded(Ok(Arc::clone(&data)))).ok();
        if data.is_empty() {
            // A BFC dump or a plan: nothing to replay.
            for i in 0..specs.len() {
                tx.send(Msg::Replayed(
                    i,
                    Err("this input has no events to replay".to_owned()),
                ))
                .ok();
            }
            return;
        }
        {
            let view = data.view();
            let classes = ClassSeries::build(&view, Bucketing::for_trace(&view, BUCKETS), 16_384);
            tx.send(Msg::Classes(Arc::new(classes))).ok();
        }
        // A PyTorch snapshot's own settings and rebuilt start state go to `pytorch`.
        let config = data.policy_config(config);
        // `predictive` learns from what `compare` gives it (each thread's calls, the sites).
        let config = if specs.iter().any(|s| s.name == "predictive") {
            data.with_predictive_features(config)
        } else {
            config
        };
        // Replays in order of the list, `jobs` at a time, each reported as soon as it is done.
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..jobs.max(1))
            .map(|_| {
                let data = Arc::clone(&data);
                let specs = specs.clone();
                let progress_of = progress_of.clone();
                let preparing_of = preparing_of.clone();
                let config = config.clone();
                let next = Arc::clone(&next);
                let tx = tx.clone();
                let cancel = Arc::clone(&cancel);
                std::thread::spawn(move || {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(spec) = specs.get(i) else { break };
                        let view = data.view();
                        let progress = progress_of.get(i).map(AsRef::as_ref);
                        let preparing = preparing_of.get(i).map(AsRef::as_ref);
                        let result = spec
                            .apply(&config)
                            .and_then(|cfg| {
                                let opts = ReplayOptions {
                                    align_bytes: cfg.align_bytes,
                                    buckets: BUCKETS,
                                    layout_index: true,
                                    checkpoint_budget_bytes: checkpoint_budget_bytes(view.len()),
                                    checkpoint_min_copies: CHECKPOINT_MIN_COPIES,
                                    ..ReplayOptions::default()
                                };
                                registry::build_observed(spec.name, &cfg, &view, preparing)
                                    .map(|p| replay_cancellable(&view, p, &opts, progress, &cancel))
                            })
                            .map_err(|e| e.to_string());
                        let result = match result {
                            // The frontend moved on: the partial replay is nobody's.
                            Ok((_, true)) => break,
                            Ok((replay, false)) => Ok(Arc::new(replay)),
                            Err(e) => Err(e),
                        };
                        if tx.send(Msg::Replayed(i, result)).is_err() {
                            break;
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().ok();
        }
    });
}

/// The checkpoint budget an explorer gives one policy's replay on a trace of `events` events:
/// 6 bytes an event, at least 64 MiB and at most the replay's default 512 MiB; the replay
/// raises it to hold [`CHECKPOINT_MIN_COPIES`] copies of the policy's state (up to 512 MiB
/// again). Only a policy without a layout index (`glibc`, `pool`) seeks from checkpoints; the
/// others keep a 64th, and no floor. Checkpoints of a fixed number of bytes an event lie a
/// fixed number of events apart whatever the trace's length, so on a long trace a seek replays
/// about as far as on a short one with the same heap, and resident memory stays near 40 bytes
/// an event: on the 29.8-million-event Python recording the fixed 512 MiB held glibc's at 51
/// bytes an event (seek + redraw p99 4.5 ms), 8 bytes an event at 40.3 (8.0 ms), 6 at 38.2
/// (12.7 ms); with no checkpoint it is 31.
pub fn checkpoint_budget_bytes(events: usize) -> u64 {
    const BYTES_PER_EVENT: u64 = 6;
    (events as u64)
        .saturating_mul(BYTES_PER_EVENT)
        .clamp(64 << 20, DEFAULT_CHECKPOINT_BUDGET_BYTES)
}

/// Copies of its state a replay's checkpoint budget holds at least (up to 512 MiB): without
/// it, a heap that is large for its trace (a million live blocks in 8 million events) would
/// get one checkpoint in a 64 MiB budget, and every seek would replay from the first event.
pub const CHECKPOINT_MIN_COPIES: u64 = 8;

/// Loads and replays everything on worker threads and waits for them: for tests, benchmarks
/// and headless use.
///
/// # Errors
/// The load error, if the trace could not be loaded.
pub fn load_blocking(state: &mut AppState, lenient: bool, jobs: usize) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    start_workers(state, lenient, jobs, &tx);
    drop(tx);
    for msg in rx {
        if let Msg::Loaded(Err(e)) = &msg {
            return Err(e.clone());
        }
        update(state, msg);
    }
    Ok(())
}
