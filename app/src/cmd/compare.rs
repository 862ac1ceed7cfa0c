//! `allocview compare FILE --policy a,b,c [--limit X] [--json]`: one trace, several policies,
//! one table.

use std::path::PathBuf;

use allocview_loaders::Loaded;
use allocview_sim::policy::registry::{self, POLICY_NAMES, PolicyConfig};
use allocview_sim::replay::{Replay, ReplayOptions, replay};
use allocview_sim::trace::TraceView;
use anyhow::{Result, bail};
use serde_json::{Map, Value, json};

use super::load::{InputArgs, load_input};
use crate::format;

/// Policy selection and knobs shared by the commands that replay.
#[derive(Clone, Debug, clap::Args)]
pub struct PolicyArgs {
    /// Policies to replay, comma-separated (default: all). Known: first-fit, best-fit, bfc,
    /// buddy, pool, glibc, oracle.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub policy: Vec<String>,
    /// Memory limit for every policy (e.g. 512MiB, 2GiB); allocations past it fail and are
    /// reported as OOM events.
    #[arg(long, value_parser = crate::units::parse_bytes, value_name = "BYTES")]
    pub limit: Option<u64>,
    /// Alignment of every request, in bytes (a power of two).
    #[arg(long, default_value_t = 16, value_name = "BYTES")]
    pub align: u64,
    /// Replay at most this many policies at once (default: one per core).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
}

impl PolicyArgs {
    /// The policy names to run, validated, in the order given.
    pub fn names(&self) -> Result<Vec<&'static str>> {
        if self.policy.is_empty() || self.policy.iter().any(|p| p == "all") {
            return Ok(POLICY_NAMES.to_vec());
        }
        let mut out = Vec::new();
        for p in &self.policy {
            let Some(&name) = POLICY_NAMES.iter().find(|&&n| n == p.trim()) else {
                bail!(
                    "unknown policy {p:?}; known policies: {}",
                    POLICY_NAMES.join(", ")
                );
            };
            if !out.contains(&name) {
                out.push(name);
            }
        }
        Ok(out)
    }

    /// The policy configuration these flags describe.
    pub fn config(&self) -> Result<PolicyConfig> {
        if !self.align.is_power_of_two() {
            bail!("--align must be a power of two, got {}", self.align);
        }
        Ok(PolicyConfig {
            align_bytes: self.align,
            limit_bytes: self.limit,
            ..PolicyConfig::default()
        })
    }
}

/// Arguments of `allocview compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The trace to replay.
    pub file: PathBuf,
    #[command(flatten)]
    pub policies: PolicyArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub input: InputArgs,
}

/// One policy's replay, or why it could not run.
pub struct PolicyRun {
    pub name: &'static str,
    pub result: Result<Replay, String>,
}

/// Replays `trace` through each named policy, `jobs` at a time, in the given order.
pub fn run_policies(
    trace: &TraceView<'_>,
    names: &[&'static str],
    config: &PolicyConfig,
    jobs: usize,
) -> Vec<PolicyRun> {
    let opts = ReplayOptions {
        align_bytes: config.align_bytes,
        ..ReplayOptions::default()
    };
    let mut results: Vec<Option<PolicyRun>> = names.iter().map(|_| None).collect();
    for (chunk_names, chunk_results) in names
        .chunks(jobs.max(1))
        .zip(results.chunks_mut(jobs.max(1)))
    {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk_names
                .iter()
                .map(|&name| {
                    let opts = &opts;
                    s.spawn(move || {
                        let result = registry::build(name, config, trace)
                            .map(|policy| replay(trace, policy, opts))
                            .map_err(|e| e.to_string());
                        PolicyRun { name, result }
                    })
                })
                .collect();
            for (slot, (h, &name)) in chunk_results
                .iter_mut()
                .zip(handles.into_iter().zip(chunk_names))
            {
                *slot = Some(h.join().unwrap_or_else(|_| PolicyRun {
                    name,
                    result: Err("the replay thread panicked".to_owned()),
                }));
            }
        });
    }
    results.into_iter().flatten().collect()
}

/// Max over time of live bytes: the bound every policy's footprint is measured against.
pub fn max_live_bytes(trace: &TraceView<'_>) -> u64 {
    let mut live = 0u64;
    let mut peak = 0u64;
    for (&k, &size) in trace.kind.iter().zip(trace.size_bytes) {
        if k == allocview_sim::trace::EventKind::Alloc.code() {
            live += size;
            peak = peak.max(live);
        } else if k == allocview_sim::trace::EventKind::Free.code() {
            live -= size;
        }
    }
    peak
}

/// Runs `allocview compare`.
pub fn run(args: &CompareArgs) -> Result<()> {
    let names = args.policies.names()?;
    let config = args.policies.config()?;
    let loaded = load_input(&args.file, &args.input)?;
    let Loaded::MallocTrace(trace) = loaded;
    let view = allocview_loaders::trace_view(&trace.events, &args.file)?;
    let jobs = args.policies.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let runs = run_policies(&view, &names, &config, jobs);
    let max_live = max_live_bytes(&view);
    let explicit = !args.policies.policy.is_empty();
    for run in &runs {
        if let Err(e) = &run.result {
            if explicit {
                bail!("policy {}: {e}", run.name);
            }
            eprintln!("note: skipping {}: {e}", run.name);
        }
    }
    if args.json {
        let policies: Vec<Value> = runs
            .iter()
            .filter_map(|r| {
                r.result
                    .as_ref()
                    .ok()
                    .map(|rep| policy_json(r.name, rep, &view, max_live))
            })
            .collect();
        let out = json!({
            "trace": args.file.display().to_string(),
            "events": view.len(),
            "max_live_bytes": max_live,
            "limit_bytes": config.limit_bytes,
            "policies": policies,
        });
        outln!("{out}");
    } else {
        print_table(&args.file.display().to_string(), &view, max_live, &runs)?;
    }
    Ok(())
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The `compare --json` object of one policy.
pub fn policy_json(name: &str, r: &Replay, trace: &TraceView<'_>, max_live: u64) -> Value {
    let s = &r.summary;
    let first_oom = r.ooms.first().map(|oom| {
        let c = &oom.counters_at_failure;
        let mut m = Map::new();
        m.insert("event".into(), json!(oom.event));
        m.insert("t_ns".into(), json!(trace.t_ns.get(oom.event)));
        m.insert("request_bytes".into(), json!(oom.request.size_bytes));
        m.insert("live_bytes".into(), json!(c.live_bytes));
        m.insert("in_use_chunks".into(), json!(c.live_allocs));
        m.insert("in_use_bytes".into(), json!(c.allocated_bytes));
        m.insert("free_chunks".into(), json!(c.free_blocks));
        m.insert("free_bytes".into(), json!(c.free_bytes));
        m.insert("largest_free_bytes".into(), json!(c.largest_free_bytes));
        m.insert("footprint_bytes".into(), json!(c.footprint_bytes));
        m.insert("error".into(), json!(oom.error.to_string()));
        if let Some(state) = &r.first_oom_state {
            if let Some(bfc) = state
                .as_any()
                .downcast_ref::<allocview_sim::policy::bfc::Bfc>()
            {
                m.insert(
                    "rounded_bytes".into(),
                    json!(allocview_sim::policy::bfc::rounded_bytes(
                        oom.request.size_bytes
                    )),
                );
                let regions = bfc.regions();
                m.insert("regions".into(), json!(regions.len()));
                m.insert(
                    "region_bytes".into(),
                    json!(bfc.total_region_allocated_bytes()),
                );
            }
        }
        Value::Object(m)
    });
    json!({
        "name": name,
        "peak_footprint_bytes": s.peak_footprint_bytes,
        "peak_footprint_event": s.peak_footprint_event,
        "final_footprint_bytes": s.final_footprint_bytes,
        "peak_live_bytes": s.peak_live_bytes,
        "peak_allocated_bytes": s.peak_allocated_bytes,
        "fragmentation_at_peak": s.fragmentation_at_peak,
        "mean_fragmentation": s.mean_fragmentation,
        "footprint_over_max_live": ratio(s.peak_footprint_bytes, max_live),
        "ooms": s.oom_count,
        "first_oom": first_oom,
        "events_per_second": s.events_per_second,
    })
}

fn print_table(file: &str, trace: &TraceView<'_>, max_live: u64, runs: &[PolicyRun]) -> Result<()> {
    use format::{bytes, count};
    outln!(
        "{file}: {} events, max live {}",
        count(trace.len() as u64),
        bytes(max_live)
    );
    outln!();
    outln!(
        "  {:<10} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>9} {:>6} {:>12}",
        "policy",
        "peak foot",
        "final foot",
        "peak live",
        "peak alloc",
        "frag@peak",
        "mean frag",
        "foot/live",
        "OOMs",
        "events/s"
    );
    for run in runs {
        match &run.result {
            Ok(r) => {
                let s = &r.summary;
                outln!(
                    "  {:<10} {:>11} {:>11} {:>11} {:>11} {:>8.1}% {:>8.1}% {:>9.3} {:>6} {:>12}",
                    run.name,
                    bytes(s.peak_footprint_bytes),
                    bytes(s.final_footprint_bytes),
                    bytes(s.peak_live_bytes),
                    bytes(s.peak_allocated_bytes),
                    100.0 * s.fragmentation_at_peak,
                    100.0 * s.mean_fragmentation,
                    ratio(s.peak_footprint_bytes, max_live),
                    count(s.oom_count),
                    format::rate(s.events_per_second)
                );
            }
            Err(e) => outln!("  {:<10} not run: {e}", run.name),
        }
    }
    for run in runs {
        if let Ok(r) = &run.result {
            if let Some(oom) = r.ooms.first() {
                let c = &oom.counters_at_failure;
                outln!(
                    "\n  {}: first OOM at event {} requesting {}: {} live in {} blocks, {} free in {} \
                     blocks (largest {}), footprint {}",
                    run.name,
                    count(oom.event as u64),
                    bytes(oom.request.size_bytes),
                    bytes(c.live_bytes),
                    count(c.live_allocs),
                    bytes(c.free_bytes),
                    count(c.free_blocks),
                    bytes(c.largest_free_bytes),
                    bytes(c.footprint_bytes)
                );
            }
        }
    }
    Ok(())
}
