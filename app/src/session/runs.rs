//! Replaying one trace through several policies on threads, loaded ([`run_policies`], for
//! `compare`, `report`, `diff` and the minimum limits) or streamed from the file, each policy
//! reading its own stream ([`replay_one`], with the offline oracle's plans made once per
//! command in [`OraclePlans`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::predictive::Predictive;
use allocview_sim::policy::registry;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::predict::streamed::{StreamedFeatures, Tapped};
use allocview_sim::predict::truth_tap::{StreamedTruth, TruthTap};
use allocview_sim::replay::{Replay, ReplayOptions, replay};
use allocview_sim::stream::{Prefetched, replay_stream_until};
use allocview_sim::trace::{OwnedTrace, TraceView};
use anyhow::{Context as _, Result, bail};

use super::mode::available_memory_bytes;
use super::oracle::{self, SpilledPlan, max_piece_allocations};
use super::source::StreamInput;

/// One policy's replay, or why it could not run.
pub struct PolicyRun {
    /// The row's label: the policy name, with its parameters for a variant.
    pub name: String,
    pub result: Result<Replay, String>,
}

/// Replays `trace` through each policy variant, `jobs` at a time, in the given order.
pub fn run_policies(
    trace: &TraceView<'_>,
    specs: &[PolicySpec],
    config: &PolicyConfig,
    jobs: usize,
) -> Vec<PolicyRun> {
    run_policies_counted(trace, specs, config, jobs, &AtomicU64::new(0))
}

/// [`run_policies`], adding one to `done` as each replay ends (for a progress display).
pub fn run_policies_counted(
    trace: &TraceView<'_>,
    specs: &[PolicySpec],
    config: &PolicyConfig,
    jobs: usize,
    done: &AtomicU64,
) -> Vec<PolicyRun> {
    per_spec(specs, jobs, |spec| {
        let result = spec
            .apply(config)
            .and_then(|cfg| {
                let opts = ReplayOptions {
                    align_bytes: cfg.align_bytes,
                    // These commands seek at most once (`report`'s heap at the peak), so the
                    // initial state is the only checkpoint: copying the heap every 16,384
                    // events made best fit's replay of the python trace 1.8 times slower,
                    // while the one seek replays from the start (at most one more replay).
                    checkpoint_every: 0,
                    ..ReplayOptions::default()
                };
                registry::build(spec.name, &cfg, trace).map(|policy| replay(trace, policy, &opts))
            })
            .map_err(|e| e.to_string());
        done.fetch_add(1, Ordering::Relaxed);
        result
    })
    .into_iter()
    .map(|(name, result)| PolicyRun { name, result })
    .collect()
}

/// Runs `work` on each spec, `jobs` at a time, and returns each spec's label and result in the
/// given order (a run that panics gives an error).
pub fn per_spec<T: Send>(
    specs: &[PolicySpec],
    jobs: usize,
    work: impl Fn(&PolicySpec) -> Result<T, String> + Sync,
) -> Vec<(String, Result<T, String>)> {
    let mut out = Vec::with_capacity(specs.len());
    let work = &work;
    for chunk in specs.chunks(jobs.max(1)) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|spec| s.spawn(move || work(spec)))
                .collect();
            for (h, spec) in handles.into_iter().zip(chunk) {
                let result = h
                    .join()
                    .unwrap_or_else(|_| Err("the replay thread panicked".to_owned()));
                out.push((spec.label(), result));
            }
        });
    }
    out
}

/// Max over time of live bytes: the bound every policy's footprint is measured against.
pub fn max_live_bytes(trace: &TraceView<'_>) -> u64 {
    trace.peak_live().0
}

/// The oracle plans made for a streamed command, by policy label (`report` replays each policy
/// twice and plans once), each on `jobs` threads.
pub struct OraclePlans {
    made: Mutex<HashMap<String, Arc<SpilledPlan>>>,
    jobs: usize,
}

impl OraclePlans {
    #[must_use]
    pub fn new(jobs: usize) -> Self {
        Self {
            made: Mutex::default(),
            jobs: jobs.max(1),
        }
    }

    /// The plan of `spec` for `input`, made on first use.
    fn get(
        &self,
        input: &StreamInput,
        spec: &PolicySpec,
        config: &PolicyConfig,
    ) -> Result<Arc<SpilledPlan>> {
        let label = spec.label();
        let known = self
            .made
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&label)
            .cloned();
        if let Some(plan) = known {
            return Ok(plan);
        }
        let max_piece = max_piece_allocations(self.jobs, available_memory_bytes());
        let plan = Arc::new(oracle::plan(input, config, self.jobs, max_piece)?);
        self.made
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(label, Arc::clone(&plan));
        Ok(plan)
    }
}

/// `specs`, said on stderr where a streamed replay differs from a loaded one: every policy
/// streams (`oracle` plans the file in a first pass, `predictive` learns as the events come or,
/// with `lifetimes=true`, looks a bounded distance ahead for the true classes).
pub fn stream_specs(specs: &[PolicySpec]) -> Result<Vec<PolicySpec>> {
    let mut online = Vec::new();
    for spec in specs {
        // A spec that does not apply is reported with its replay.
        let knows_lifetimes = spec
            .apply(&PolicyConfig::default())
            .is_ok_and(|c| c.predictive_true_lifetimes);
        if spec.name == "predictive" && !knows_lifetimes {
            eprintln!(
                "note: {} streamed learns without allocation sites (a stream carries no call \
                 stacks); loaded, it also uses a recorded trace's stacks",
                spec.label()
            );
        }
        online.push(spec.clone());
    }
    Ok(online)
}

/// Replays `spec` from its own stream of `input`, up to event `last_event` included: the
/// replay, and the trace's peak live bytes over the events read.
pub fn replay_one(
    input: &StreamInput,
    spec: &PolicySpec,
    config: &PolicyConfig,
    plans: &OraclePlans,
    last_event: usize,
) -> Result<(Replay, u64)> {
    let cfg = spec.apply(config)?;
    let opts = ReplayOptions {
        align_bytes: cfg.align_bytes,
        ..ReplayOptions::default()
    };
    // Planned before the replay's own read of the file starts.
    let (oracle, feed_error) = if spec.name == "oracle" {
        let (oracle, error) = plans.get(input, spec, &cfg)?.oracle(&cfg)?;
        (Some(oracle), Some(error))
    } else {
        (None, None)
    };
    let mut stream = Prefetched::start(input.open()?);
    let replayed = if let Some(oracle) = oracle {
        replay_stream_until(&mut stream, Box::new(oracle), &opts, None, last_event)
    } else if spec.name == "predictive" && cfg.predictive_true_lifetimes {
        // Each allocation's true class, known a bounded distance ahead.
        let truth = Arc::new(StreamedTruth::default());
        let policy =
            Predictive::streamed_true(&cfg, Arc::clone(&truth)).map_err(anyhow::Error::msg)?;
        let mut tapped = TruthTap::new(&mut stream, cfg.predictive_short_allocs, truth);
        replay_stream_until(&mut tapped, Box::new(policy), &opts, None, last_event)
    } else if spec.name == "predictive" {
        // Its features come from the events as the replay reads them.
        let features = Arc::new(StreamedFeatures::default());
        let policy =
            Predictive::streamed(&cfg, Arc::clone(&features)).map_err(anyhow::Error::msg)?;
        let mut tapped = Tapped::new(&mut stream, features);
        replay_stream_until(&mut tapped, Box::new(policy), &opts, None, last_event)
    } else {
        // Online policies never look at the trace they are built for.
        let empty = OwnedTrace::new();
        let policy = registry::build(spec.name, &cfg, &empty.view()?)?;
        replay_stream_until(&mut stream, policy, &opts, None, last_event)
    };
    let replay = replayed
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("while replaying {}", input.file.display()))?;
    if let Some(error) = feed_error
        && let Some(e) = error.lock().unwrap_or_else(PoisonError::into_inner).take()
    {
        bail!("{e} (while replaying {})", input.file.display());
    }
    let stream = stream
        .finish()
        .context("the thread reading the trace failed")?;
    Ok((replay, stream.peak_live_bytes()))
}
