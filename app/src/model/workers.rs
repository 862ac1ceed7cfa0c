//! The explorers' worker threads: loading the input, the size-class series and each policy's
//! replay, reported to the model as messages, so the window opens at once and the cursor moves
//! while policies replay.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;

use allocview_sim::classes::ClassSeries;
use allocview_sim::plan::greedy_by_size::Progress;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::replay::{Replay, replay_cancellable};
use allocview_sim::series::Bucketing;

use super::options::explorer_options;
use super::state::{AppState, BUCKETS};
use super::trace_data::TraceData;
use super::update::{Msg, update};

/// Starts loading the trace, then the size-class series and every policy's replay, on worker
/// threads that report through `tx`.
pub fn start_workers(state: &AppState, lenient: bool, jobs: usize, tx: &Sender<Msg>) {
    if state.live.is_some() {
        // A run still being recorded: read as it grows, replayed as it goes.
        super::follow::start_follow(state, lenient, tx);
        return;
    }
    let path = state.path.clone();
    let progress = Arc::clone(&state.load_progress);
    let window = state.window.clone();
    let device = state.device;
    let heap = state.heap.clone();
    let replays = Replays::of(state);
    let real: Vec<crate::real::RealSpec> = state.real.iter().map(|r| r.spec.clone()).collect();
    let cancel = Arc::clone(&state.cancel);
    let tx = tx.clone();
    std::thread::spawn(move || {
        let keep_calls = !real.is_empty();
        let heap = match crate::session::input::heap_id(&path, heap.as_deref()) {
            Ok(id) => id,
            Err(e) => {
                tx.send(Msg::Loaded(Err(format!("{e:#}")))).ok();
                return;
            }
        };
        let opening = super::trace_data::Opening {
            lenient,
            device,
            heap,
            keep_calls,
        };
        let data = match TraceData::load_with(&path, &opening, &window, progress) {
            Ok(d) => Arc::new(d),
            Err(e) => {
                tx.send(Msg::Loaded(Err(e))).ok();
                return;
            }
        };
        tx.send(Msg::Loaded(Ok(Arc::clone(&data)))).ok();
        if data.is_empty() {
            // A BFC dump or a plan: nothing to replay.
            for i in 0..replays.specs.len() {
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
        replays.run(&data, jobs, &tx);
        // After the policies: each measures its own process, one at a time, on the calls
        // written once for all.
        let prepared = (!real.is_empty()).then(|| prepare_real(&data, &real));
        for (i, spec) in real.iter().enumerate() {
            // The frontend moved on (another part of the trace): its rows are nobody's.
            if cancel.load(Ordering::Relaxed) {
                break;
            }
            let row = match &prepared {
                Some(Ok(p)) => real_row(&data, spec, p),
                Some(Err(e)) => Err(format!("{}: {e}", spec.label)),
                None => break,
            };
            if tx.send(Msg::RealReplayed(i, row)).is_err() {
                break;
            }
        }
    });
}

/// Starts `tune` on the loaded input, on a thread of its own: the search under the session's
/// limit ([`crate::answers::tune::search`]), then the replay of its best setting, reported as
/// [`Msg::Tuned`] (a policy to add). Without a limit, the setting with the lowest peak
/// footprint.
pub fn start_tune(state: &AppState, jobs: usize, tx: &Sender<Msg>) {
    let Some(data) = state.data.clone() else {
        tx.send(Msg::Tuned(Err("the input is not loaded yet".to_owned())))
            .ok();
        return;
    };
    let config = data.policy_config(state.config.clone());
    let limit = state.config.limit_bytes;
    let cancel = Arc::clone(&state.cancel);
    let tx = tx.clone();
    std::thread::spawn(move || {
        let result = tuned(&data, config, limit, jobs, &cancel);
        tx.send(Msg::Tuned(result)).ok();
    });
}

/// The search and the replay of [`start_tune`].
fn tuned(
    data: &TraceData,
    config: PolicyConfig,
    limit: Option<u64>,
    jobs: usize,
    cancel: &AtomicBool,
) -> Result<super::update::TunedPolicies, String> {
    use crate::answers::tune::{TuneOptions, base_params_of, search};
    let family = match data.format {
        "pytorch-snapshot" | "pytorch-profiler" => "pytorch",
        "tf-memory-log" => "bfc",
        "malloc-trace" => "glibc",
        other => return Err(format!("a {other} has no allocator settings to search")),
    };
    let view = data.view();
    let opts = TuneOptions {
        limit_bytes: limit,
        family: None,
        jobs: jobs.max(1),
        replayed: None,
    };
    let base = base_params_of(family, data.format == "pytorch-snapshot");
    let t = search(&view, family, &base, &config, &opts).map_err(|e| format!("{e:#}"))?;
    let Some(best) = t.best else {
        let needs = t
            .min_limits
            .iter()
            .filter_map(|m| m.min_limit_bytes)
            .min()
            .map_or_else(|| "no limit works".to_owned(), crate::format::bytes);
        return Err(format!(
            "no {family} setting fits under the limit ({} replays); the least any needs: {needs}",
            t.replays
        ));
    };
    let config = PolicyConfig {
        limit_bytes: limit,
        ..config
    };
    // The default beside the best, as the search replayed them.
    let mut replayed = Vec::new();
    for policy in [&t.default.policy, &best.policy] {
        let spec = PolicySpec::parse(policy).map_err(|e| e.to_string())?;
        let cfg = spec.apply(&config).map_err(|e| e.to_string())?;
        let opts = explorer_options(cfg.align_bytes, view.len());
        let built = registry::build(spec.name, &cfg, &view).map_err(|e| e.to_string())?;
        let (replay, cancelled) = replay_cancellable(&view, built, &opts, None, cancel);
        if cancelled {
            return Err("cancelled".to_owned());
        }
        replayed.push((spec, Arc::new(replay)));
    }
    let said = format!(
        "tune: {} (peak {}{}; {} replays), added as {}",
        best.env,
        crate::format::bytes(best.peak_footprint_bytes),
        best.headroom_bytes
            .map(|h| format!(", {} to spare", crate::format::bytes(h)))
            .unwrap_or_default(),
        t.replays,
        best.policy
    );
    Ok(super::update::TunedPolicies { replayed, said })
}

/// The calls of `data` (a malloc trace; others have no C library calls) written for its
/// real-allocator rows.
fn prepare_real(
    data: &TraceData,
    real: &[crate::real::RealSpec],
) -> Result<crate::real::Prepared, String> {
    if data.format != "malloc-trace" {
        return Err(format!(
            "a real allocator replays malloc traces; this is a {}",
            data.format
        ));
    }
    let threads = allocview_loaders::analysis::stats::thread_indices(&data.events)
        .map_err(|e| e.to_string())?;
    let calls: Option<Vec<u8>> = data.events.column("call").ok().and_then(|c| {
        c.u8()
            .ok()
            .map(|c| c.iter().map(|v| v.unwrap_or(0)).collect())
    });
    crate::real::prepare(real, &data.view(), &threads, calls.as_deref())
        .map_err(|e| format!("{e:#}"))
}

/// A real-allocator row's series on `data`, replayed from its `prepared` calls.
fn real_row(
    data: &TraceData,
    spec: &crate::real::RealSpec,
    prepared: &crate::real::Prepared,
) -> Result<Arc<allocview_sim::series::Series>, String> {
    let view = data.view();
    let run = crate::real::run_prepared(spec, &view, prepared).map_err(|e| format!("{e:#}"))?;
    Ok(Arc::new(run.series(&view, BUCKETS)))
}

/// What the replays take of the state: each policy with where it reports its progress, the
/// configuration, and the flag that stops them.
struct Replays {
    specs: Vec<PolicySpec>,
    progress_of: Vec<Arc<AtomicUsize>>,
    preparing_of: Vec<Arc<Progress>>,
    config: PolicyConfig,
    cancel: Arc<AtomicBool>,
}

impl Replays {
    /// What the replays of `state`'s policies take of it.
    fn of(state: &AppState) -> Self {
        Self {
            specs: state.policies.iter().map(|p| p.spec.clone()).collect(),
            progress_of: state
                .policies
                .iter()
                .map(|p| Arc::clone(&p.progress))
                .collect(),
            preparing_of: state
                .policies
                .iter()
                .map(|p| Arc::clone(&p.preparing))
                .collect(),
            config: state.config.clone(),
            cancel: Arc::clone(&state.cancel),
        }
    }

    /// Replays every policy on `data`, in order of the list, `jobs` at a time, each reported
    /// through `tx` as soon as it is done; returns once all are, or the frontend moved on.
    fn run(mut self, data: &Arc<TraceData>, jobs: usize, tx: &Sender<Msg>) {
        // A PyTorch snapshot's own settings and rebuilt start state go to `pytorch`.
        self.config = data.policy_config(self.config);
        // `predictive` learns from what `compare` gives it (each thread's calls, the sites).
        if self.specs.iter().any(|s| s.name == "predictive") {
            self.config = data.with_predictive_features(self.config);
        }
        let replays = Arc::new(self);
        let next = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..jobs.max(1))
            .map(|_| {
                let (replays, data, next, tx) = (
                    Arc::clone(&replays),
                    Arc::clone(data),
                    Arc::clone(&next),
                    tx.clone(),
                );
                std::thread::spawn(move || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(result) = replays.replay(i, &data) else {
                            break;
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
    }

    /// Replays policy `i` on `data`; `None` past the last policy, or when the frontend moved
    /// on (the partial replay is nobody's).
    fn replay(&self, i: usize, data: &TraceData) -> Option<Result<Arc<Replay>, String>> {
        let spec = self.specs.get(i)?;
        let view = data.view();
        let progress = self.progress_of.get(i).map(AsRef::as_ref);
        let preparing = self.preparing_of.get(i).map(AsRef::as_ref);
        let result = spec
            .apply(&self.config)
            .and_then(|cfg| {
                let opts = explorer_options(cfg.align_bytes, view.len());
                registry::build_observed(spec.name, &cfg, &view, preparing)
                    .map(|p| replay_cancellable(&view, p, &opts, progress, &self.cancel))
            })
            .map_err(|e| e.to_string());
        match result {
            Ok((_, true)) => None,
            Ok((replay, false)) => Some(Ok(Arc::new(replay))),
            Err(e) => Some(Err(e)),
        }
    }
}

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
