//! `allocview predict FILE [--model NAME] [--order K] [--split FRACTION] [--train OTHER_FILE]
//! [--json]`: how predictable the allocation stream is, with the libtracemalloc article's tokens,
//! and how well the `predictive` policy's lifetime predictor does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use allocview_loaders::Loaded;
use allocview_loaders::site_stats::SiteKind;
use allocview_loaders::stats::thread_indices;
use allocview_sim::predict::eval::{Figures, ModelReport, default_models, evaluate, make_model};
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
}

/// A loaded trace as `predict` uses it.
struct Input {
    tokens: TokenStream,
    /// The file's id of each thread index.
    tids: Vec<u64>,
    /// The lifetime predictor's score on this trace.
    lifetime: LifetimeReport,
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

fn input_of(loaded: &Loaded, path: &Path) -> Result<Input> {
    let (view, threads) = events_and_threads(loaded, path, "predict")?;
    let features = features_for(loaded, &view, &threads);
    Ok(Input {
        tokens: TokenStream::from_trace(&view, Some(&threads)),
        tids: tids_of(loaded),
        lifetime: lifetime::evaluate(&view, &features, DEFAULT_SHORT_ALLOCS),
    })
}

/// What the `predictive` policy knows at each allocation of `loaded`: each thread's recent
/// calls and, where the input has them, allocation sites (stacks or TensorFlow operations).
fn features_for(loaded: &Loaded, view: &TraceView<'_>, threads: &[u16]) -> AllocFeatures {
    // A malloc trace without stacks has no sites: skip building its size-class stand-ins.
    let sites = match loaded {
        Loaded::MallocTrace(t) if t.stacks.is_none() => None,
        _ => sites_of(loaded).filter(|s| s.kind != SiteKind::SizeClasses),
    };
    AllocFeatures::from_trace(
        view,
        Some(threads),
        sites.as_ref().map(|s| &s.event_stack[..]),
    )
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
    model_names(args)?;
    let loaded = load_input(&args.file, &args.input)?;
    let (input, reports) = evaluate_all(args, &loaded)?;
    let file = args.file.display().to_string();
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
    let input = input_of(loaded, &args.file)?;
    let other = match &args.train {
        Some(path) => {
            let l = load_input(path, &args.input)?;
            let (view, threads) = events_and_threads(&l, path, "predict --train")?;
            Some(TokenStream::from_trace(&view, Some(&threads)))
        }
        None => None,
    };
    let clock = thread_cpu_seconds;
    let reports: Vec<ModelReport> = names
        .iter()
        .filter_map(|n| evaluate(n, &input.tokens, args.split, other.as_ref(), &clock))
        .collect();
    Ok((input, reports))
}

/// CPU time of the calling thread, so the speeds are per core however busy the machine is.
fn thread_cpu_seconds() -> f64 {
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

fn lifetime_json(r: &LifetimeReport) -> Value {
    json!({
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
        "events": input.tokens.len(),
        "threads": input.tokens.per_thread_counts().iter().filter(|&&c| c > 0).count(),
        "split_fraction": args.split,
        "train_file": args.train.as_ref().map(|p| p.display().to_string()),
        "models": models,
        "lifetime": lifetime_json(&input.lifetime),
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
    let t = &input.tokens;
    let allocs = t.token.iter().filter(|&&x| x < 32).count() as u64;
    let threads = t.per_thread_counts().iter().filter(|&&c| c > 0).count();
    outln!(
        "{file}: {} heap calls ({} allocations, {} frees) in {threads} thread(s), 64 token classes",
        format::count(t.len() as u64),
        format::count(allocs),
        format::count(t.len() as u64 - allocs)
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
        "lifetime predictor of the `predictive` policy (short = freed within {} allocations): \
         {} allocations, {} short",
        l.short_threshold_allocs,
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
