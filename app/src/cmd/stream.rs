//! `stats`, `compare`, `report` (`stream_report.rs`) and `predict` (`predict_stream.rs`) on a
//! binary trace too big for memory: the events are decoded block by
//! block from the file ([`BinaryEventStream`]) and replayed as they come
//! ([`allocview_sim::stream::replay_stream`]), so memory is bounded by a block, the live
//! allocations and each policy's heap, not by the trace. Chosen by `--stream`, or on its own
//! for a binary trace whose events would not fit in half the memory available (`stats`: for
//! every whole, finished binary trace, `StreamArgs::applies_to_stats`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use allocview_loaders::analysis::stats::StatsAccumulator;
use allocview_loaders::binary;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::predictive::Predictive;
use allocview_sim::policy::registry;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::predict::streamed::{StreamedFeatures, Tapped};
use allocview_sim::predict::truth_tap::{StreamedTruth, TruthTap};
use allocview_sim::replay::{Replay, ReplayOptions};
use allocview_sim::stream::{EventBatch, EventSource as _, Prefetched, replay_stream_until};
use allocview_sim::trace::OwnedTrace;
use anyhow::{Context as _, Result, bail};
use serde_json::json;

use super::compare::{CompareArgs, Row};
use super::load::InputArgs;
use super::stats::StatsArgs;
use super::stream_oracle::SpilledPlan;
pub(super) use super::stream_source::StreamInput;

/// The `--stream` flag of the commands that can stream.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct StreamArgs {
    /// Read a binary trace block by block instead of loading it (memory bounded by the live
    /// allocations, not the events); chosen on its own for a binary trace too big for memory.
    #[arg(long)]
    pub stream: bool,
    /// Load the trace even where the command would stream it on its own (`stats` streams every
    /// binary trace: the same figures, faster and in less memory).
    #[arg(long, conflicts_with = "stream")]
    pub no_stream: bool,
}

/// Bytes of memory an event takes once loaded (the event table's columns and what building
/// them costs at the peak), for the choice to stream.
const LOADED_BYTES_PER_EVENT: u64 = 40;
/// Most events a byte of a binary trace holds, for the estimate (its zstd blocks take 1.2 to 3
/// bytes an event on real traces).
const EVENTS_PER_FILE_BYTE_MAX: u64 = 1;

impl StreamArgs {
    /// Whether to stream `file`: asked for, or a binary trace whose events may not fit in half
    /// the available memory. A window (`--from/--to/--events`) streams too
    /// (`stream_source.rs`).
    pub fn applies(&self, file: &Path, input: &InputArgs) -> Result<bool> {
        if self.no_stream {
            return Ok(false);
        }
        let is_binary = binary::is_binary(&binary::file_head(file)?);
        if self.stream {
            if !is_binary {
                bail!(
                    "--stream reads allocview's binary traces; convert {} first \
                     (allocview convert {} OUT.avt)",
                    file.display(),
                    file.display()
                );
            }
            if input.lenient {
                bail!("--stream reads strictly: --lenient repairs damage in a loaded trace only");
            }
            return Ok(true);
        }
        if !is_binary || input.lenient {
            return Ok(false);
        }
        let file_bytes = std::fs::metadata(file)
            .with_context(|| format!("cannot open {}", file.display()))?
            .len();
        let loaded_bytes = file_bytes
            .saturating_mul(EVENTS_PER_FILE_BYTE_MAX)
            .saturating_mul(LOADED_BYTES_PER_EVENT);
        let big = available_memory_bytes().is_some_and(|avail| loaded_bytes > avail / 2);
        let stream = big && is_trace(file);
        if stream {
            eprintln!(
                "note: {} may not fit in memory once loaded: streaming it block by block",
                file.display()
            );
        }
        Ok(stream)
    }

    /// Whether `stats` streams `file`: as [`Self::applies`], and on its own for any whole,
    /// cleanly finished binary trace (one with its INDEX frame). Its figures need one pass and
    /// no column, so reading the blocks as they come is faster than loading them (the loaded
    /// trace's columns cost a page fault every 4 KiB) and takes a sixth of the memory, with the
    /// same output. A cut or damaged file, `--lenient` and a window load as before: the loader
    /// says what it found wrong in the whole file, where a stream stops at it.
    pub fn applies_to_stats(&self, file: &Path, input: &InputArgs) -> Result<bool> {
        if self.no_stream || self.applies(file, input)? {
            return Ok(!self.no_stream);
        }
        let whole = input.window.spec()?.is_none();
        let finished = binary::read_index_frame(file).is_ok_and(|index| index.is_some());
        Ok(whole && finished && !input.lenient && is_trace(file))
    }
}

/// A binary trace whose events would take more memory than is available once loaded: its
/// events, the memory they would take, and the memory available (from its INDEX frame, one
/// read at the end of the file; `None` for any other file, or one that fits).
fn too_big(file: &Path) -> Option<(u64, u64, u64)> {
    let records = binary::read_index_frame(file).ok()??.records();
    let need = records.saturating_mul(LOADED_BYTES_PER_EVENT);
    let avail = available_memory_bytes()?;
    (need > avail).then_some((records, need, avail))
}

/// Refuses to load a binary trace whose events would take more memory than is available (the
/// load would be killed, or abort on its first reservation), and says which commands stream it.
pub fn refuse_if_too_big(file: &Path) -> Result<()> {
    if let Some((records, need, avail)) = too_big(file) {
        bail!(
            "{} holds {} events, about {} once loaded, more than the {} of memory available: \
             `allocview stats`, `compare`, `report` and `predict` stream it block by block, whole or \
             a window of it, and the explorers open a window of it (--from/--to/--events) \
             (README: Traces larger than memory); this command needs the trace loaded",
            file.display(),
            crate::format::count(records),
            crate::format::bytes(need),
            crate::format::bytes(avail)
        );
    }
    Ok(())
}

/// What an event of an explorer's part takes once replayed (the event table, a replay's
/// addresses and index, with room).
const EXPLORER_BYTES_PER_EVENT: u64 = 64;

/// Events of the parts an explorer shows of a trace too big to load, at most: a part, and so
/// each move to another one (`g #N`, `{`, `}`), is read from the nearest resume point, replayed
/// by one policy and drawn in under 100 ms (`allocview bench hops`, bfc: p99 86 to 88 ms on
/// the 2-billion-event trace), where parts of 33.5 million events took 3 to 5 s.
const EXPLORER_PART_EVENTS_MAX: u64 = 1 << 18;

/// For a binary trace too big to load whole: its events, and how many of them an explorer
/// opens by default, from its start ([`default_part_events`]). `None` when the trace can be
/// loaded.
#[must_use]
pub fn explorer_default_window(file: &Path) -> Option<(u64, u64)> {
    let (records, _, avail) = too_big(file)?;
    Some((records, default_part_events(records, avail)))
}

/// Events of an explorer's part of a trace of `records` events with `avail_bytes` of memory:
/// [`EXPLORER_PART_EVENTS_MAX`], or fewer where they would not fit in a quarter of the memory
/// at [`EXPLORER_BYTES_PER_EVENT`]; one at least, the trace's at most.
fn default_part_events(records: u64, avail_bytes: u64) -> u64 {
    (avail_bytes / 4 / EXPLORER_BYTES_PER_EVENT)
        .min(EXPLORER_PART_EVENTS_MAX)
        .clamp(1, records.max(1))
}

/// True for a binary trace (a spool is loaded: its threads are merged in memory).
fn is_trace(file: &Path) -> bool {
    // Byte 9 is the file's kind: 0 a trace, 1 a spool.
    binary::file_head(file).is_ok_and(|head| binary::is_binary(&head) && head.get(9) == Some(&0))
}

/// `MemAvailable` of `/proc/meminfo`, in bytes, or `ALLOCVIEW_AVAILABLE_MEMORY` (bytes) where
/// it is set: what allocview may count on, to try the big-trace paths on a small trace or to
/// keep allocview smaller than the machine.
fn available_memory_bytes() -> Option<u64> {
    if let Some(v) = std::env::var_os("ALLOCVIEW_AVAILABLE_MEMORY")
        && let Some(bytes) = v.to_str().and_then(|s| s.trim().parse::<u64>().ok())
    {
        return Some(bytes);
    }
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `stats --stream`.
pub fn stats(args: &StatsArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let input = StreamInput::new(&args.file, &args.input.window)?;
    let mut prefetched = Prefetched::start(input.open()?);
    let mut acc = StatsAccumulator::default();
    let mut batch = EventBatch::default();
    while prefetched
        .next_batch(&mut batch)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("while reading {}", args.file.display()))?
    {
        acc.push_all(&batch.t_ns, &batch.kind, &batch.size_bytes);
    }
    let stream = prefetched
        .finish()
        .context("the thread reading the trace failed")?;
    let summary = stream.summary();
    for w in summary.warnings() {
        eprintln!("warning: {w}");
    }
    let stats = acc.finish(stream.events_per_thread(), &summary);
    let file = args.file.display().to_string();
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        let mut obj = super::stats::stats_json(&stats);
        obj.insert("file".into(), json!(file));
        obj.insert("format".into(), json!("malloc-trace"));
        obj.insert("load_seconds".into(), json!(seconds));
        obj.insert("truncated".into(), json!(summary.truncated.is_some()));
        obj.insert("streamed".into(), json!(true));
        outln!("{}", serde_json::Value::Object(obj));
    } else {
        super::stats::print_table(&file, &stats, seconds)?;
    }
    Ok(())
}

/// The oracle plans made for a streamed command, by policy label (`report` replays each policy
/// twice and plans once), each on `jobs` threads.
pub(super) struct OraclePlans {
    made: Mutex<HashMap<String, Arc<SpilledPlan>>>,
    jobs: usize,
}

impl OraclePlans {
    pub(super) fn new(jobs: usize) -> Self {
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
        let max_piece =
            super::stream_oracle::max_piece_allocations(self.jobs, available_memory_bytes());
        let plan = Arc::new(super::stream_oracle::plan(
            input, config, self.jobs, max_piece,
        )?);
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
pub(super) fn stream_specs(specs: &[PolicySpec]) -> Result<Vec<PolicySpec>> {
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
pub(super) fn replay_one(
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

/// `compare --stream`: each policy streams the file on its own (`--jobs` at a time).
pub fn compare(args: &CompareArgs, specs: &[PolicySpec]) -> Result<()> {
    if args.min_limit || args.parquet.is_some() {
        bail!("--stream replays each policy once: --min-limit and --parquet need the trace loaded");
    }
    let config = args.policies.config()?;
    let explicit = !args.policies.policy.is_empty();
    let jobs = args.policies.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let online = stream_specs(specs)?;
    let input = StreamInput::new(&args.file, &args.input.window)?;
    let plans = OraclePlans::new(jobs);
    let runs = super::compare::per_spec(&online, jobs, |spec| {
        replay_one(&input, spec, &config, &plans, usize::MAX).map_err(|e| format!("{e:#}"))
    });
    let mut rows = Vec::new();
    let mut max_live = 0;
    let mut events = 0;
    for (label, result) in &runs {
        match result {
            Ok((rep, peak_live)) => {
                max_live = *peak_live;
                events = rep.summary.events;
                let mut row = Row::from_replay(label, rep);
                super::compare::note_unsupported(&mut row, rep);
                super::compare::pytorch_fidelity(&mut row, rep);
                rows.push(row);
            }
            Err(e) if explicit => bail!("policy {label}: {e}"),
            Err(e) => eprintln!("note: skipping {label}: {e}"),
        }
    }
    if args.json {
        let out = json!({
            "trace": args.file.display().to_string(),
            "format": "malloc-trace",
            "events": events,
            "max_live_bytes": max_live,
            "limit_bytes": config.limit_bytes,
            "streamed": true,
            "policies": rows.iter().map(|r| r.json(max_live)).collect::<Vec<_>>(),
        });
        outln!("{out}");
    } else {
        super::compare::print_table(&args.file.display().to_string(), events, max_live, &rows)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts are capped at 262,144 events, narrowed where memory is short, and never empty
    /// or longer than the trace.
    #[test]
    fn an_explorers_part_is_capped_and_fits_the_memory() {
        let gib = 1u64 << 30;
        assert_eq!(default_part_events(2_000_000_000, 20 * gib), 1 << 18);
        // A quarter of 20 MB at 64 bytes an event.
        assert_eq!(default_part_events(2_000_000_000, 20_000_000), 78_125);
        assert_eq!(default_part_events(2_000_000_000, 0), 1);
        assert_eq!(default_part_events(1000, 20 * gib), 1000);
        assert_eq!(default_part_events(0, 20 * gib), 1);
    }
}
