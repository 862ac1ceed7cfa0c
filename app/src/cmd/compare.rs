//! `allocview compare FILE --policy a,b,c [--limit X] [--json]`: one trace, several policies,
//! one table.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use allocview_loaders::Loaded;
use allocview_loaders::analysis::tf_fidelity::{self as fidelity, FidelityOptions};
use allocview_loaders::tf::memlog::TfMemoryLog;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::pytorch::{Pytorch, SegmentOpKind};
use allocview_sim::policy::registry::POLICY_NAMES;
use allocview_sim::policy::spec::{PolicySpec, split_specs};
use allocview_sim::replay::Replay;
use allocview_sim::trace::TraceView;
use anyhow::{Result, bail};
use polars::prelude::DataFrame;
use serde_json::{Map, Value, json};

use super::load::{InputArgs, load_input, require_events};
// The replay runner lives beside it; the other commands reach it through `compare`.
pub use super::runs::{PolicyRun, max_live_bytes, per_spec, run_policies, run_policies_counted};
use crate::format;

/// Policy selection and knobs shared by the commands that replay.
#[derive(Clone, Debug, clap::Args)]
pub struct PolicyArgs {
    /// Policies to replay, comma-separated (default: all). Known: first-fit, best-fit, bfc,
    /// buddy, pool, glibc, oracle, pytorch. A variant takes parameters after the name, e.g.
    /// `pytorch:max_split_size_mb=128`, `bfc:allow_growth=false`, `buddy:min_block=4096`
    /// (see the README for every key); each variant is its own row.
    #[arg(long, value_name = "NAMES")]
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
    /// The policies and variants to run, validated, in the order given (duplicates dropped).
    pub fn specs(&self) -> Result<Vec<PolicySpec>> {
        let written: Vec<&str> = self.policy.iter().flat_map(|p| split_specs(p)).collect();
        if written.is_empty() || written.contains(&"all") {
            let mut out: Vec<PolicySpec> =
                POLICY_NAMES.iter().map(|&n| PolicySpec::plain(n)).collect();
            // `all` plus variants: the variants follow the plain policies.
            for w in written.iter().filter(|&&w| w != "all") {
                let spec = PolicySpec::parse(w)?;
                if !out.contains(&spec) {
                    out.push(spec);
                }
            }
            return Ok(out);
        }
        let mut out = Vec::new();
        for w in written {
            let spec = PolicySpec::parse(w)?;
            if !out.contains(&spec) {
                out.push(spec);
            }
        }
        Ok(out)
    }

    /// The policies for an explorer on `file`: as [`Self::specs`], but with no `--policy` a
    /// PyTorch snapshot opens on `pytorch` (its recorded heap), the others after it.
    pub fn explorer_specs(&self, file: Option<&std::path::Path>) -> Result<Vec<PolicySpec>> {
        let mut specs = self.specs()?;
        let is_snapshot = file.is_some_and(|f| {
            matches!(
                allocview_loaders::detect(f),
                Ok(allocview_loaders::InputKind::PytorchSnapshot)
            )
        });
        if self.policy.is_empty() && is_snapshot {
            specs.sort_by_key(|s| s.name != "pytorch");
        }
        Ok(specs)
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

/// The configuration for replaying `loaded`: a PyTorch snapshot's own allocator settings and
/// rebuilt start state go to the `pytorch` policy.
#[must_use]
pub fn config_for_input(loaded: &Loaded, mut config: PolicyConfig) -> PolicyConfig {
    if let Loaded::PytorchSnapshot(snap) = loaded {
        config.pytorch = snap.settings.policy.clone();
        config.pytorch_script = Some(Arc::new(snap.script.clone()));
    }
    config
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
    /// For a TensorFlow memory log: replay `bfc` from process start instead of from the
    /// checkpoint rebuilt from the log (it then diverges from TensorFlow's addresses early, as
    /// the log does not show every allocation).
    #[arg(long)]
    pub from_start: bool,
    /// For a TensorFlow memory log: replay `bfc` without consulting TensorFlow's logged
    /// addresses for any choice the log leaves open (which other thread's free came first,
    /// where a variable goes, a raw chunk's size); its match rate is then its own.
    #[arg(long)]
    pub no_guidance: bool,
    /// Find, for each policy, the smallest `--limit` at which the replay has no OOM, and print
    /// it beside the peak live bytes (`min_limit_bytes` in the JSON).
    #[arg(long, conflicts_with = "limit")]
    pub min_limit: bool,
    /// Also write every policy's series (the `timeline.csv` of `report`: one row per policy
    /// and time bucket, with a `policy` column) to this Parquet file.
    #[arg(long, value_name = "OUT")]
    pub parquet: Option<PathBuf>,
    #[command(flatten)]
    pub stream: super::stream::StreamArgs,
    #[command(flatten)]
    pub input: InputArgs,
}

/// What `compare` found for one input: the rows of its table and JSON, and the series.
pub struct Compared {
    pub format: &'static str,
    pub events: usize,
    pub max_live_bytes: u64,
    pub limit_bytes: Option<u64>,
    rows: Vec<Row>,
    minima: Vec<(String, allocview_sim::min_limit::MinLimit)>,
    /// Every replayed policy's series (`report`'s `timeline.csv`), when asked for.
    pub series: Option<DataFrame>,
}

impl Compared {
    /// The object `compare --json` prints (`path` names the trace).
    #[must_use]
    pub fn json(&self, path: &Path) -> Value {
        json!({
            "trace": path.display().to_string(),
            "format": self.format,
            "events": self.events,
            "max_live_bytes": self.max_live_bytes,
            "limit_bytes": self.limit_bytes,
            "policies": self.rows.iter().map(|r| r.json(self.max_live_bytes)).collect::<Vec<_>>(),
        })
    }
}

/// Runs `allocview compare`.
pub fn run(args: &CompareArgs) -> Result<()> {
    let specs = args.policies.specs()?;
    // --min-limit and --parquet need the events in memory: a window of a trace too big to load
    // is loaded (read block by block, only the window kept) unless --stream is asked for.
    let needs_loaded = args.min_limit || args.parquet.is_some();
    let windowed_load = needs_loaded && !args.stream.stream && args.input.window.is_set();
    if !windowed_load && args.stream.applies(&args.file, &args.input)? {
        return super::stream::compare(args, &specs);
    }
    let loaded = load_input(&args.file, &args.input)?;
    let out = evaluate(args, &loaded, args.parquet.is_some(), &AtomicU64::new(0))?;
    if let (Some(path), Some(series)) = (&args.parquet, &out.series) {
        let meta = crate::parquet_out::metadata("series", Some(&args.file));
        crate::parquet_out::write_frame(path, series, &[&args.file], meta)?;
        let policies = series
            .column("policy")
            .and_then(|c| c.n_unique())
            .unwrap_or(0);
        eprintln!(
            "wrote the series of {policies} policies to {}",
            path.display()
        );
    }
    if args.json {
        outln!("{}", out.json(&args.file));
    } else {
        print_table(
            &args.file.display().to_string(),
            out.events,
            out.max_live_bytes,
            &out.rows,
        )?;
        if args.min_limit {
            super::min_limit::print_table(&out.minima, out.max_live_bytes)?;
        }
    }
    Ok(())
}

/// Replays `loaded` (read from `args.file`) through the policies `args` name, with each
/// policy's series when `with_series`, adding one to `replayed` as each replay ends.
///
/// # Errors
/// When a policy named explicitly cannot run, or the input has no events.
pub fn evaluate(
    args: &CompareArgs,
    loaded: &Loaded,
    with_series: bool,
    replayed: &AtomicU64,
) -> Result<Compared> {
    let specs = args.policies.specs()?;
    let config = config_for_input(loaded, args.policies.config()?);
    let ev = require_events(loaded, &args.file, "compare")?;
    let view = allocview_loaders::trace_view(ev.events, &args.file)?;
    let config =
        super::predict::with_predictive_features(config, &specs, loaded, &view, &args.file)?;
    let jobs = args.policies.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let explicit = !args.policies.policy.is_empty();
    // A TensorFlow memory log: plain `bfc` is replayed against TensorFlow's own addresses,
    // from a checkpoint rebuilt from the log (or from process start with --from-start).
    // A window of the log has no rebuilt checkpoint at its start: `bfc` is then simulated like
    // every other policy, over the window.
    let memlog = match loaded {
        Loaded::TfMemoryLog(log) if !args.input.window.is_set() => Some(log.as_ref()),
        _ => None,
    };
    let is_tf_bfc = |s: &PolicySpec| memlog.is_some() && s.name == "bfc" && s.is_plain();
    let sim_specs: Vec<PolicySpec> = specs.iter().filter(|s| !is_tf_bfc(s)).cloned().collect();
    let runs = run_policies_counted(&view, &sim_specs, &config, jobs, replayed);
    let max_live = max_live_bytes(&view);
    let mut rows: Vec<Row> = Vec::new();
    for spec in &specs {
        if is_tf_bfc(spec)
            && let Some(log) = memlog
        {
            rows.push(tf_bfc_row(log, &config, args.from_start, args.no_guidance)?);
            continue;
        }
        let label = spec.label();
        let Some(run) = runs.iter().find(|r| r.name == label) else {
            continue;
        };
        match &run.result {
            Ok(rep) => {
                let mut row = Row::from_replay(&label, rep);
                note_unsupported(&mut row, rep);
                pytorch_fidelity(&mut row, rep);
                rows.push(row);
            }
            Err(e) if explicit => bail!("policy {label}: {e}"),
            Err(e) => eprintln!("note: skipping {label}: {e}"),
        }
    }
    let series = if with_series {
        let done: Vec<(&str, &Replay)> = runs
            .iter()
            .filter_map(|r| r.result.as_ref().ok().map(|rep| (r.name.as_str(), rep)))
            .collect();
        Some(super::report::timeline_frame(&done)?)
    } else {
        None
    };
    let minima = if args.min_limit {
        min_limits(args, &view, &sim_specs, &config, jobs, memlog, &mut rows)
    } else {
        Vec::new()
    };
    Ok(Compared {
        format: ev.format,
        events: view.len(),
        max_live_bytes: max_live,
        limit_bytes: config.limit_bytes,
        rows,
        minima,
        series,
    })
}

/// `--min-limit`: each row's smallest limit without OOM, added to its JSON; the rows for the
/// table, in row order.
fn min_limits(
    args: &CompareArgs,
    view: &TraceView<'_>,
    sim_specs: &[PolicySpec],
    config: &PolicyConfig,
    jobs: usize,
    memlog: Option<&TfMemoryLog>,
    rows: &mut [Row],
) -> Vec<(String, allocview_sim::min_limit::MinLimit)> {
    let runs = super::min_limit::for_specs(view, sim_specs, config, jobs);
    let mut out = Vec::new();
    for row in rows.iter_mut() {
        let found = match runs.iter().find(|r| r.label == row.name) {
            Some(run) => match &run.result {
                Ok(m) => m.clone(),
                Err(e) => {
                    row.notes.push(format!("no minimum limit: {e}"));
                    continue;
                }
            },
            // The one row not in `sim_specs`: bfc at TensorFlow's addresses.
            None => match memlog {
                Some(log) => super::min_limit::tf_bfc(
                    log,
                    args.from_start,
                    max_live_bytes(view),
                    row.peak_footprint_bytes,
                ),
                None => continue,
            },
        };
        super::min_limit::insert_json(&mut row.extra, &found);
        out.push((row.name.clone(), found));
    }
    out
}

/// Requests the policy cannot serve at all (an alignment it does not support, a size past
/// what it can model) count among its OOMs; say how many and why, in the table and the JSON
/// (`unsupported`, `unsupported_reason`), so they are not read as memory running out.
pub(super) fn note_unsupported(row: &mut Row, rep: &Replay) {
    use allocview_sim::heap::AllocError;
    let mut reasons = rep.ooms.iter().filter_map(|o| match &o.error {
        AllocError::Unsupported(why) => Some(why),
        AllocError::OutOfMemory { .. } => None,
    });
    let Some(first) = reasons.next() else {
        row.extra.insert("unsupported".into(), json!(0));
        return;
    };
    let count = 1 + reasons.count() as u64;
    row.extra.insert("unsupported".into(), json!(count));
    row.extra
        .insert("unsupported_reason".into(), json!(first.to_string()));
    row.notes.push(format!(
        "{} of its {} OOMs are requests it cannot serve at all, not memory running out: {first}",
        format::count(count),
        format::count(row.ooms)
    ));
}

/// For `pytorch` replaying a snapshot from its rebuilt start: the addresses it chose against
/// the recorded ones (`fidelity`), and its cudaMalloc/cudaFree counts.
pub(super) fn pytorch_fidelity(row: &mut Row, rep: &Replay) {
    let Some(p) = rep.final_state.as_any().downcast_ref::<Pytorch>() else {
        return;
    };
    let segs = p.segment_events();
    let count = |k: SegmentOpKind| segs.iter().filter(|e| e.op.kind == k).count();
    row.extra.insert(
        "segments".into(),
        json!({
            "segment_alloc": count(SegmentOpKind::Alloc),
            "segment_free": count(SegmentOpKind::Free),
            "segment_map": count(SegmentOpKind::Map),
            "segment_unmap": count(SegmentOpKind::Unmap),
        }),
    );
    let Some(f) = p.fidelity() else {
        return;
    };
    row.extra.insert(
        "fidelity".into(),
        json!({
            "checked": f.checked,
            "address_matches": f.address_matches,
            "segment_allocs_checked": f.segment_allocs_checked,
            "segment_alloc_matches": f.segment_alloc_matches,
            "first_divergence": f.first_divergence.as_ref().map(|d| json!({
                "alloc_id": d.alloc_id,
                "requested_bytes": d.requested_bytes,
                "recorded_addr": d.recorded_addr,
                "policy_addr": d.policy_addr,
                "what": d.what,
            })),
            "divergences": f.divergences,
        }),
    );
    row.notes.push(format!(
        "replayed from the snapshot's rebuilt start state: {} of {} allocations at their \
         recorded address, {} of {} new segments where and as large as the trace has them, \
         {} divergences",
        format::count(f.address_matches),
        format::count(f.checked),
        format::count(f.segment_alloc_matches),
        format::count(f.segment_allocs_checked),
        format::count(f.divergences)
    ));
    if let Some(d) = &f.first_divergence {
        row.notes.push(format!(
            "first divergence at allocation {} ({}): recorded {:#x}, policy {}: {}",
            d.alloc_id,
            format::bytes(d.requested_bytes),
            d.recorded_addr,
            d.policy_addr
                .map_or_else(|| "none".to_owned(), |a| format!("{a:#x}")),
            d.what
        ));
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// One policy's line of the comparison, from the simulator's replay or from the checkpointed
/// TensorFlow replay.
pub struct Row {
    pub name: String,
    pub peak_footprint_bytes: u64,
    pub peak_footprint_event: Option<usize>,
    pub final_footprint_bytes: u64,
    pub peak_live_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub fragmentation_at_peak: f64,
    pub mean_fragmentation: f64,
    pub ooms: u64,
    pub events_per_second: f64,
    pub first_oom: Option<Map<String, Value>>,
    /// The first OOM in words, for the table.
    pub first_oom_text: Option<String>,
    /// Extra keys (`fidelity`, `replay`) and lines for the table.
    pub extra: Map<String, Value>,
    pub notes: Vec<String>,
}

impl Row {
    pub(super) fn from_replay(name: &str, r: &Replay) -> Self {
        let s = &r.summary;
        let first_oom = r.ooms.first().map(|oom| {
            let c = &oom.counters_at_failure;
            let mut m = Map::new();
            m.insert("event".into(), json!(oom.event));
            m.insert("t_ns".into(), json!(oom.t_ns));
            m.insert("request_bytes".into(), json!(oom.request.size_bytes));
            m.insert("live_bytes".into(), json!(c.live_bytes));
            m.insert("in_use_chunks".into(), json!(c.live_allocs));
            m.insert("in_use_bytes".into(), json!(c.allocated_bytes));
            m.insert("free_chunks".into(), json!(c.free_blocks));
            m.insert("free_bytes".into(), json!(c.free_bytes));
            m.insert("largest_free_bytes".into(), json!(c.largest_free_bytes));
            m.insert("footprint_bytes".into(), json!(c.footprint_bytes));
            m.insert("error".into(), json!(oom.error.to_string()));
            if let Some(bfc) = r.first_oom_state.as_ref().and_then(|st| {
                st.as_any()
                    .downcast_ref::<allocview_sim::policy::bfc::Bfc>()
            }) {
                m.insert(
                    "rounded_bytes".into(),
                    json!(allocview_sim::policy::bfc::rounded_bytes(
                        oom.request.size_bytes
                    )),
                );
                m.insert("regions".into(), json!(bfc.regions().len()));
                m.insert(
                    "region_bytes".into(),
                    json!(bfc.total_region_allocated_bytes()),
                );
            }
            m
        });
        let first_oom_text = r.ooms.first().map(|oom| {
            let c = &oom.counters_at_failure;
            format!(
                "first OOM at event {} requesting {}: {} live in {} blocks, {} free in {} blocks \
                 (largest {}), footprint {}",
                format::count(oom.event as u64),
                format::bytes(oom.request.size_bytes),
                format::bytes(c.live_bytes),
                format::count(c.live_allocs),
                format::bytes(c.free_bytes),
                format::count(c.free_blocks),
                format::bytes(c.largest_free_bytes),
                format::bytes(c.footprint_bytes)
            )
        });
        Self {
            name: name.to_owned(),
            peak_footprint_bytes: s.peak_footprint_bytes,
            peak_footprint_event: s.peak_footprint_event,
            final_footprint_bytes: s.final_footprint_bytes,
            peak_live_bytes: s.peak_live_bytes,
            peak_allocated_bytes: s.peak_allocated_bytes,
            fragmentation_at_peak: s.fragmentation_at_peak,
            mean_fragmentation: s.mean_fragmentation,
            ooms: s.oom_count,
            events_per_second: s.events_per_second,
            first_oom,
            first_oom_text,
            extra: Map::new(),
            notes: Vec::new(),
        }
    }

    /// The `compare --json` object of this policy.
    pub(super) fn json(&self, max_live: u64) -> Value {
        let mut m = Map::new();
        m.insert("name".into(), json!(self.name));
        m.insert(
            "peak_footprint_bytes".into(),
            json!(self.peak_footprint_bytes),
        );
        m.insert(
            "peak_footprint_event".into(),
            json!(self.peak_footprint_event),
        );
        m.insert(
            "final_footprint_bytes".into(),
            json!(self.final_footprint_bytes),
        );
        m.insert("peak_live_bytes".into(), json!(self.peak_live_bytes));
        m.insert(
            "peak_allocated_bytes".into(),
            json!(self.peak_allocated_bytes),
        );
        m.insert(
            "fragmentation_at_peak".into(),
            json!(self.fragmentation_at_peak),
        );
        m.insert("mean_fragmentation".into(), json!(self.mean_fragmentation));
        m.insert(
            "footprint_over_max_live".into(),
            json!(ratio(self.peak_footprint_bytes, max_live)),
        );
        m.insert("ooms".into(), json!(self.ooms));
        m.insert("first_oom".into(), json!(self.first_oom));
        m.insert("events_per_second".into(), json!(self.events_per_second));
        for (k, v) in &self.extra {
            m.insert(k.clone(), v.clone());
        }
        Value::Object(m)
    }
}

/// `bfc` on a TensorFlow memory log: the replay at TensorFlow's own addresses.
fn tf_bfc_row(
    log: &TfMemoryLog,
    config: &PolicyConfig,
    from_start: bool,
    no_guidance: bool,
) -> Result<Row> {
    let opts = FidelityOptions {
        limit_bytes: config.limit_bytes,
        allow_growth: None,
        no_guidance,
        ..FidelityOptions::default()
    };
    let f = if from_start {
        fidelity::replay_from_start(log, &opts)
    } else {
        fidelity::replay_checkpointed(log, &opts)
    }
    .map_err(|e| anyhow::anyhow!("replaying bfc against the log: {e}"))?;
    let m = &f.metrics;
    let first_oom = f.first_oom.as_ref().map(|o| {
        let mut j = Map::new();
        j.insert("event".into(), json!(o.event));
        j.insert("line".into(), json!(o.line));
        j.insert("logged".into(), json!(o.logged));
        j.insert("request_bytes".into(), json!(o.request_bytes));
        j.insert("rounded_bytes".into(), json!(o.rounded_bytes));
        j.insert("in_use_chunks".into(), json!(o.in_use_chunks));
        j.insert("in_use_bytes".into(), json!(o.in_use_bytes));
        j.insert("free_chunks".into(), json!(o.free_chunks));
        j.insert("free_bytes".into(), json!(o.free_bytes));
        j.insert("regions".into(), json!(o.regions));
        j.insert("region_bytes".into(), json!(o.region_bytes));
        j.insert(
            "largest_free_chunk_bytes".into(),
            json!(o.largest_free_chunk_bytes),
        );
        j.insert(
            "dump_comparison".into(),
            json!(o.dump_comparison.as_ref().map(|d| json!({
                "dump_chunks": d.dump_chunks,
                "replay_chunks": d.replay_chunks,
                "identical": d.identical,
                "all_identical": d.all_identical(),
                "first_difference": d.first_difference,
            }))),
        );
        j
    });
    let first_oom_text = f.first_oom.as_ref().map(|o| {
        format!(
            "first OOM at event {} (log line {}) requesting {} (rounded to {}): {} in use in {} \
             chunks, {} free in {} chunks (largest {}), {} regions of {}{}",
            format::count(o.event as u64),
            o.line,
            format::bytes(o.request_bytes),
            o.rounded_bytes,
            format::bytes(o.in_use_bytes),
            format::count(o.in_use_chunks),
            format::bytes(o.free_bytes),
            format::count(o.free_chunks),
            format::bytes(o.largest_free_chunk_bytes),
            o.regions,
            format::bytes(o.region_bytes),
            o.dump_comparison
                .as_ref()
                .map_or_else(String::new, |d| format!(
                    "; chunk map vs the log's dump: {} of {} identical",
                    d.identical, d.dump_chunks
                ))
        )
    });
    let mut extra = Map::new();
    extra.insert(
        "replay".into(),
        json!(match f.start {
            fidelity::ReplayStart::Checkpoint => "checkpoint",
            fidelity::ReplayStart::FromStart => "process-start",
        }),
    );
    extra.insert(
        "checkpoint".into(),
        json!(f.checkpoint.as_ref().map(|c| json!({
            "event": c.event,
            "line": c.line,
            "reason": c.reason,
            "live_chunks": c.live_logged + c.live_variables + c.live_raw,
            "bytes_in_use": c.bytes_in_use,
            "regions": c.regions,
            "region_bytes": c.region_bytes,
        }))),
    );
    extra.insert(
        "fidelity".into(),
        json!({
            "checked": f.checked,
            "address_matches": f.address_matches,
            "size_matches": f.size_matches,
            "sizes_checked": f.sizes_checked,
            "first_divergence": f.first_divergence.as_ref().map(|d| json!({
                "event": d.event,
                "line": d.line,
                "tf_alloc_id": d.tf_alloc_id,
                "requested_bytes": d.requested_bytes,
                "expected_addr": d.expected_addr,
                "expected_bytes": d.expected_bytes,
                "got_addr": d.got_addr,
                "got_bytes": d.got_bytes,
            })),
            "held_back_frees": f.held_back,
            "guidance": f.guided,
            "guided_decisions": {
                "total": f.guided_decisions.total(),
                "placements_retried": f.guided_decisions.placements_retried,
                "held_back_frees": f.guided_decisions.held_back_frees,
                "variables_placed_by_address": f.guided_decisions.variables_placed_by_address,
                "raw_chunk_sizes_chosen": f.guided_decisions.raw_chunk_sizes_chosen,
            },
            "variables_replayed": f.variables_replayed,
            "logged_oom_reproduced": f.logged_oom_reproduced,
            "peak_bytes_in_use": f.peak_bytes_in_use,
            "meminfo": f.meminfo.iter().map(|mi| json!({
                "tag": mi.tag,
                "line": mi.line,
                "tf_current_bytes": mi.tf_current_bytes,
                "tf_peak_bytes": mi.tf_peak_bytes,
                "replay_current_bytes": mi.replay_current_bytes,
                "replay_peak_bytes": mi.replay_peak_bytes,
            })).collect::<Vec<_>>(),
            "regions_match": f.regions_match(),
            "regions_logged": f.regions_logged.len(),
            "regions_replayed": f.regions_replayed.len(),
        }),
    );
    Ok(Row {
        name: "bfc".to_owned(),
        peak_footprint_bytes: m.peak_footprint_bytes,
        peak_footprint_event: None,
        final_footprint_bytes: m.final_footprint_bytes,
        peak_live_bytes: m.peak_live_bytes,
        peak_allocated_bytes: m.peak_allocated_bytes,
        fragmentation_at_peak: m.fragmentation_at_peak,
        mean_fragmentation: m.mean_fragmentation,
        ooms: f.ooms,
        events_per_second: if m.replay_seconds > 0.0 {
            m.events as f64 / m.replay_seconds
        } else {
            0.0
        },
        first_oom,
        first_oom_text,
        extra,
        notes: f.describe(),
    })
}

pub(super) fn print_table(file: &str, events: usize, max_live: u64, rows: &[Row]) -> Result<()> {
    use format::{bytes, count};
    outln!(
        "{file}: {} events, max live {}",
        count(events as u64),
        bytes(max_live)
    );
    outln!();
    // Variants' labels (`pytorch:max_split_size_mb=128`) widen the first column.
    let w = rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(10);
    outln!(
        "  {:<w$} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>9} {:>6} {:>12}",
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
    for r in rows {
        outln!(
            "  {:<w$} {:>11} {:>11} {:>11} {:>11} {:>8.1}% {:>8.1}% {:>9.3} {:>6} {:>12}",
            r.name,
            bytes(r.peak_footprint_bytes),
            bytes(r.final_footprint_bytes),
            bytes(r.peak_live_bytes),
            bytes(r.peak_allocated_bytes),
            100.0 * r.fragmentation_at_peak,
            100.0 * r.mean_fragmentation,
            ratio(r.peak_footprint_bytes, max_live),
            count(r.ooms),
            format::rate(r.events_per_second)
        );
    }
    for r in rows {
        if !r.notes.is_empty() {
            outln!();
            for n in &r.notes {
                outln!("  {}: {n}", r.name);
            }
        }
        if let Some(t) = &r.first_oom_text {
            outln!("\n  {}: {t}", r.name);
        }
    }
    Ok(())
}
