//! `allocview predict FILE [--model NAME] [--order K] [--split FRACTION] [--train OTHER_FILE]
//! [--json]`: how predictable the allocation stream is, with the libtracemalloc article's tokens,
//! and how well the `predictive` policy's lifetime predictor does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use allocview_loaders::Loaded;
use allocview_loaders::analysis::site_stats::{EventSites, SiteKind};
use allocview_loaders::analysis::stats::thread_indices;
use allocview_sim::predict::eval::{
    Calls, Figures, InMemory, ModelReport, default_models, evaluate_calls, make_model,
};
use allocview_sim::predict::lifetime::{self, AllocFeatures, DEFAULT_SHORT_ALLOCS, LifetimeReport};
use allocview_sim::predict::tokens::TokenStream;
use allocview_sim::trace::TraceView;
use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::load::{InputArgs, load_input, require_events};
use super::sites::sites_of;
use crate::format;

/// Arguments of `allocview predict`.
#[derive(Debug, clap::Args)]
pub struct PredictArgs {
    /// The trace: anything with allocation events (a malloc trace, a TensorFlow memory log, a
    /// PyTorch snapshot).
    pub file: PathBuf,
    /// Models to run, comma-separated: `majority`, `last`, `period`, `order-1` ... `order-8`.
    /// Default: the three baselines and `order-1` to `order-K`.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Highest context order K of the default models (1 to 8).
    #[arg(long, default_value_t = 8, value_name = "K")]
    pub order: usize,
    /// Fraction of each thread's calls, in time order, learnt before the rest is predicted.
    #[arg(long, default_value_t = 0.8, value_name = "FRACTION")]
    pub split: f64,
    /// Another run of the program to learn from (cross-run figures: learn all of it, predict
    /// all of FILE).
    #[arg(long, value_name = "OTHER_FILE")]
    pub train: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub input: InputArgs,
    #[command(flatten)]
    pub stream: super::stream::StreamArgs,
}

/// A trace as `predict` describes it.
pub(super) struct Input {
    pub(super) calls: u64,
    pub(super) allocs: u64,
    /// Threads that made calls.
    pub(super) threads: usize,
    /// The file's id of each thread index.
    pub(super) tids: Vec<u64>,
    /// The lifetime predictor's score on this trace.
    pub(super) lifetime: LifetimeReport,
    /// Read block by block from the file (the lifetime predictor then runs without
    /// allocation sites).
    pub(super) streamed: bool,
}

impl Input {
    fn of(tokens: &TokenStream, tids: Vec<u64>, lifetime: LifetimeReport) -> Self {
        Self {
            calls: tokens.len() as u64,
            allocs: tokens.token.iter().filter(|&&x| x < 32).count() as u64,
            threads: tokens
                .per_thread_counts()
                .iter()
                .filter(|&&c| c > 0)
                .count(),
            tids,
            lifetime,
            streamed: false,
        }
    }
}

fn tids_of(loaded: &Loaded) -> Vec<u64> {
    super::load::events_of(loaded)
        .and_then(|ev| ev.threads.column("tid").ok()?.u64().ok().cloned())
        .map(|c| c.into_no_null_iter().collect())
        .unwrap_or_default()
}

/// The replay view and per-event thread indices of `loaded`'s events (`command` names the
/// command in the error for an input without events).
fn events_and_threads<'a>(
    loaded: &'a Loaded,
    path: &Path,
    command: &str,
) -> Result<(TraceView<'a>, Vec<u16>)> {
    let ev = require_events(loaded, path, command)?;
    let view = allocview_loaders::trace_view(ev.events, path)?;
    let threads = thread_indices(ev.events)
        .with_context(|| format!("reading the thread column of {}", path.display()))?;
    Ok((view, threads))
}

/// The token stream of `loaded` and what `predict` says of it.
fn input_of(loaded: &Loaded, path: &Path) -> Result<(TokenStream, Input)> {
    let (view, threads) = events_and_threads(loaded, path, "predict")?;
    let features = features_for(loaded, &view, &threads);
    let tokens = TokenStream::from_trace(&view, Some(&threads));
    let lifetime = lifetime::evaluate(&view, &features, DEFAULT_SHORT_ALLOCS);
    let input = Input::of(&tokens, tids_of(loaded), lifetime);
    Ok((tokens, input))
}

/// What the `predictive` policy knows at each allocation of `loaded`: each thread's recent
/// calls and, where the input has them, allocation sites (stacks or TensorFlow operations).
fn features_for(loaded: &Loaded, view: &TraceView<'_>, threads: &[u16]) -> AllocFeatures {
    // A malloc trace without stacks has no sites: skip building its size-class stand-ins.
    let sites = match loaded {
        Loaded::MallocTrace(t) if t.stacks.is_none() => None,
        _ => sites_of(loaded),
    };
    features_with(view, threads, sites.as_ref())
}

/// [`features_for`] from the events' threads and sites (the size classes that stand in for
/// the sites of a trace without any are not sites): the one rule of `compare`, `report` and
/// the explorers.
#[must_use]
pub fn features_with(
    view: &TraceView<'_>,
    threads: &[u16],
    sites: Option<&EventSites>,
) -> AllocFeatures {
    let sites = sites.filter(|s| s.kind != SiteKind::SizeClasses);
    AllocFeatures::from_trace(view, Some(threads), sites.map(|s| &s.event_stack[..]))
}

/// `config` with `predictive`'s features for `loaded` when `specs` has it (other policies do
/// not read them).
///
/// # Errors
/// When the event table's thread column cannot be read.
pub fn with_predictive_features(
    mut config: allocview_sim::policy::config::PolicyConfig,
    specs: &[allocview_sim::policy::spec::PolicySpec],
    loaded: &Loaded,
    view: &TraceView<'_>,
    path: &Path,
) -> Result<allocview_sim::policy::config::PolicyConfig> {
    if specs.iter().any(|s| s.name == "predictive") {
        config.alloc_features = Some(alloc_features(loaded, view, path)?);
    }
    Ok(config)
}

/// The `predictive` policy's features for `loaded` (for `compare`).
///
/// # Errors
/// When the event table's thread column cannot be read.
pub fn alloc_features(
    loaded: &Loaded,
    view: &TraceView<'_>,
    path: &Path,
) -> Result<Arc<AllocFeatures>> {
    let (_, threads) = events_and_threads(loaded, path, "compare")?;
    Ok(Arc::new(features_for(loaded, view, &threads)))
}

fn model_names(args: &PredictArgs) -> Result<Vec<String>> {
    if !(1..=allocview_sim::predict::context::MAX_ORDER).contains(&args.order) {
        bail!("--order {}: expected 1 to 8", args.order);
    }
    if !(args.split > 0.0 && args.split < 1.0) {
        bail!(
            "--split {}: expected a fraction between 0 and 1",
            args.split
        );
    }
    let Some(list) = &args.model else {
        return Ok(default_models(args.order));
    };
    let names: Vec<String> = list.split(',').map(|s| s.trim().to_owned()).collect();
    for n in &names {
        if make_model(n).is_none() {
            bail!("--model {n:?}: expected majority, last, period or order-1 ... order-8");
        }
    }
    Ok(names)
}

/// Runs `allocview predict`.
pub fn run(args: &PredictArgs) -> Result<()> {
    let names = model_names(args)?;
    let file = args.file.display().to_string();
    let (input, reports) = if args.stream.applies(&args.file, &args.input)? {
        super::predict_stream::evaluate(args, &names)?
    } else {
        let loaded = load_input(&args.file, &args.input)?;
        evaluate_all(args, &loaded)?
    };
    if args.json {
        outln!("{}", report_json(&file, args, &input, &reports));
    } else {
        print_tables(&file, args, &input, &reports)?;
    }
    Ok(())
}

/// The object `predict --json` prints for `loaded` (read from `args.file`; `args.train`, if
/// any, is loaded here).
///
/// # Errors
/// When a model name, the order or the split is not understood, or an input has no events.
pub fn json(args: &PredictArgs, loaded: &Loaded) -> Result<Value> {
    let (input, reports) = evaluate_all(args, loaded)?;
    Ok(report_json(
        &args.file.display().to_string(),
        args,
        &input,
        &reports,
    ))
}

fn evaluate_all(args: &PredictArgs, loaded: &Loaded) -> Result<(Input, Vec<ModelReport>)> {
    let names = model_names(args)?;
    let (tokens, input) = input_of(loaded, &args.file)?;
    let mut other = other_calls(args)?;
    let reports = evaluate_calls(
        &names,
        &mut InMemory(&tokens),
        args.split,
        other.as_mut().map(|o| o.as_calls()),
        &thread_cpu_seconds,
    )
    .map_err(anyhow::Error::msg)?;
    Ok((input, reports))
}

/// `--train OTHER_FILE`'s calls: streamed where FILE would be, else loaded.
pub(super) enum OtherCalls {
    Loaded(TokenStream),
    Streamed(Box<super::predict_stream::StreamedCalls>),
}

impl OtherCalls {
    pub(super) fn as_calls(&mut self) -> &mut dyn Calls {
        match self {
            Self::Loaded(tokens) => tokens,
            Self::Streamed(s) => s.as_mut(),
        }
    }
}

pub(super) fn other_calls(args: &PredictArgs) -> Result<Option<OtherCalls>> {
    let Some(path) = &args.train else {
        return Ok(None);
    };
    if args.stream.applies(path, &args.input)? {
        // The window applies to both, as when they are loaded.
        let other = super::stream::StreamInput::new(path, &args.input.window)?;
        return Ok(Some(OtherCalls::Streamed(Box::new(
            super::predict_stream::StreamedCalls::new(other),
        ))));
    }
    let l = load_input(path, &args.input)?;
    let (view, threads) = events_and_threads(&l, path, "predict --train")?;
    Ok(Some(OtherCalls::Loaded(TokenStream::from_trace(
        &view,
        Some(&threads),
    ))))
}

/// CPU time of the calling thread, so the speeds are per core however busy the machine is.
pub(super) fn thread_cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

fn figures_json(f: &Figures) -> Value {
    json!({
        "top1": f.top1,
        "top3": f.top3,
        "log_loss_bits": f.log_loss_bits,
        "seed_label_top1": f.seed_label_top1,
        "alloc_top1": f.alloc_top1,
        "free_top1": f.free_top1,
        "byte_weighted_top1": f.byte_weighted_top1,
        "events": f.events,
    })
}

fn lifetime_json(r: &LifetimeReport, streamed: bool) -> Value {
    json!({
        "sites_used": !streamed,
        "short_threshold_allocs": r.short_threshold_allocs,
        "allocations": r.allocations,
        "true_short_fraction": (r.allocations > 0).then(|| r.true_short as f64 / r.allocations as f64),
        "predicted_short_fraction": (r.allocations > 0).then(|| r.predicted_short as f64 / r.allocations as f64),
        "accuracy": r.accuracy(),
        "short_precision": r.short_precision(),
        "short_recall": r.short_recall(),
        "baseline_accuracy": r.baseline_accuracy(),
    })
}

fn report_json(file: &str, args: &PredictArgs, input: &Input, reports: &[ModelReport]) -> Value {
    let models: Vec<Value> = reports
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "split": figures_json(&r.split),
                "online": figures_json(&r.online),
                "cross_run": r.cross_run.as_ref().map(figures_json),
                "per_thread": r.per_thread.iter().map(|t| json!({
                    "thread": t.thread,
                    "tid": input.tids.get(usize::from(t.thread)),
                    "events": t.events,
                    "online_top1": t.online_top1,
                })).collect::<Vec<_>>(),
                "train_events_per_s": r.train_events_per_s,
                "predict_events_per_s": r.predict_events_per_s,
                "online_events_per_s": r.online_events_per_s,
            })
        })
        .collect();
    json!({
        "file": file,
        "events": input.calls,
        "threads": input.threads,
        "streamed": input.streamed,
        "split_fraction": args.split,
        "train_file": args.train.as_ref().map(|p| p.display().to_string()),
        "models": models,
        "lifetime": lifetime_json(&input.lifetime, input.streamed),
    })
}

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_owned(), |v| format!("{:.1}%", v * 100.0))
}

fn bits(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"))
}

fn speed(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_owned(), format::rate)
}

fn print_mode(
    title: &str,
    reports: &[ModelReport],
    pick: impl Fn(&ModelReport) -> Option<&Figures>,
) -> Result<()> {
    outln!();
    outln!("{title}");
    outln!(
        "  {:<10} {:>7} {:>7} {:>9} {:>8} {:>7} {:>7} {:>9}",
        "model",
        "top-1",
        "top-3",
        "bits/call",
        "label-7",
        "alloc",
        "free",
        "byte-wtd"
    );
    for r in reports {
        let Some(f) = pick(r) else { continue };
        outln!(
            "  {:<10} {:>7} {:>7} {:>9} {:>8} {:>7} {:>7} {:>9}",
            r.name,
            pct(f.top1),
            pct(f.top3),
            bits(f.log_loss_bits),
            pct(f.seed_label_top1),
            pct(f.alloc_top1),
            pct(f.free_top1),
            pct(f.byte_weighted_top1)
        );
    }
    Ok(())
}

fn print_tables(
    file: &str,
    args: &PredictArgs,
    input: &Input,
    reports: &[ModelReport],
) -> Result<()> {
    let threads = input.threads;
    outln!(
        "{file}: {} heap calls ({} allocations, {} frees) in {threads} thread(s), 64 token classes{}",
        format::count(input.calls),
        format::count(input.allocs),
        format::count(input.calls - input.allocs),
        if input.streamed {
            " (streamed block by block)"
        } else {
            ""
        }
    );
    let split_pct = args.split * 100.0;
    print_mode(
        &format!(
            "time-ordered split: each thread's first {split_pct:.0}% learnt, the rest predicted by the frozen model"
        ),
        reports,
        |r| Some(&r.split),
    )?;
    print_mode("online (each call predicted, then learnt)", reports, |r| {
        Some(&r.online)
    })?;
    if let Some(other) = &args.train {
        print_mode(
            &format!(
                "cross-run (learnt on all of {}, all of this trace predicted)",
                other.display()
            ),
            reports,
            |r| r.cross_run.as_ref(),
        )?;
    }
    outln!();
    outln!("speed (calls per CPU second of one core)");
    outln!(
        "  {:<10} {:>9} {:>9} {:>9}",
        "model",
        "train",
        "predict",
        "online"
    );
    for r in reports {
        outln!(
            "  {:<10} {:>9} {:>9} {:>9}",
            r.name,
            speed(r.train_events_per_s),
            speed(r.predict_events_per_s),
            speed(r.online_events_per_s)
        );
    }
    if threads > 1
        && let Some(best) = reports.iter().max_by(|a, b| {
            a.online
                .top1
                .unwrap_or(0.0)
                .total_cmp(&b.online.top1.unwrap_or(0.0))
        })
    {
        outln!();
        outln!("per thread, online top-1 of {}", best.name);
        for th in &best.per_thread {
            let tid = input.tids.get(usize::from(th.thread)).copied().unwrap_or(0);
            outln!(
                "  thread {tid:<20} {:>12} calls {:>7}",
                format::count(th.events),
                pct(th.online_top1)
            );
        }
    }
    let l = &input.lifetime;
    outln!();
    outln!(
        "lifetime predictor of the `predictive` policy (short = freed within {} allocations{}): \
         {} allocations, {} short",
        l.short_threshold_allocs,
        if input.streamed {
            "; streamed, so without allocation sites"
        } else {
            ""
        },
        format::count(l.allocations),
        pct((l.allocations > 0).then(|| l.true_short as f64 / l.allocations as f64))
    );
    outln!(
        "  accuracy {} (majority-so-far {}), short precision {}, short recall {}",
        pct(l.accuracy()),
        pct(l.baseline_accuracy()),
        pct(l.short_precision()),
        pct(l.short_recall())
    );
    Ok(())
}
