//! `predict`'s answer: how predictable the allocation stream is, with the libtracemalloc
//! article's tokens, and how well the `predictive` policy's lifetime predictor does, for a
//! loaded trace or one read block by block ([`streamed`]).

mod streamed;

use std::path::{Path, PathBuf};

use allocview_loaders::Loaded;
use allocview_sim::predict::eval::{
    Calls, Figures, InMemory, ModelReport, default_models, evaluate_calls, make_model,
};
use allocview_sim::predict::lifetime::{self, DEFAULT_SHORT_ALLOCS, LifetimeReport};
use allocview_sim::predict::tokens::TokenStream;
use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::session::InputArgs;
use crate::session::StreamArgs;
use crate::session::input::load_input;
use crate::session::policies::{events_and_threads, features_for, tids_of};
use streamed::StreamedCalls;

/// What `predict` is asked, besides the trace.
#[derive(Clone, Debug)]
pub struct PredictOptions {
    /// Models to run, comma-separated (`majority`, `last`, `period`, `order-1` ...
    /// `order-8`); `None` for the baselines and `order-1` to `order-K`.
    pub model: Option<String>,
    /// Highest context order K of the default models (1 to 8).
    pub order: usize,
    /// Fraction of each thread's calls, in time order, learnt before the rest is predicted.
    pub split: f64,
    /// Another run of the program to learn from (cross-run figures).
    pub train: Option<PathBuf>,
    /// How both traces are opened.
    pub input: InputArgs,
    /// Whether they are read block by block.
    pub stream: StreamArgs,
}

/// A trace as `predict` describes it.
pub struct Input {
    pub calls: u64,
    pub allocs: u64,
    /// Threads that made calls.
    pub threads: usize,
    /// The file's id of each thread index.
    pub tids: Vec<u64>,
    /// The lifetime predictor's score on this trace.
    pub lifetime: LifetimeReport,
    /// Read block by block from the file (the lifetime predictor then runs without
    /// allocation sites).
    pub streamed: bool,
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

/// The token stream of `loaded` and what `predict` says of it.
fn input_of(loaded: &Loaded, path: &Path) -> Result<(TokenStream, Input)> {
    let (view, threads) = events_and_threads(loaded, path, "predict")?;
    let features = features_for(loaded, &view, &threads);
    let tokens = TokenStream::from_trace(&view, Some(&threads));
    let lifetime = lifetime::evaluate(&view, &features, DEFAULT_SHORT_ALLOCS);
    let input = Input::of(&tokens, tids_of(loaded), lifetime);
    Ok((tokens, input))
}

pub fn model_names(args: &PredictOptions) -> Result<Vec<String>> {
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

/// The object `predict --json` prints for `loaded` (read from `path`; `args.train`, if any, is
/// read here).
///
/// # Errors
/// When a model name, the order or the split is not understood, or an input has no events.
pub fn json(path: &Path, args: &PredictOptions, loaded: &Loaded) -> Result<Value> {
    let (input, reports) = evaluate_loaded(path, args, loaded)?;
    Ok(report_json(
        &path.display().to_string(),
        args,
        &input,
        &reports,
    ))
}

/// `predict` on the trace at `path`: streamed where `args.stream` says so, else loaded.
///
/// # Errors
/// As [`json`], and when the trace cannot be read.
pub fn evaluate(path: &Path, args: &PredictOptions) -> Result<(Input, Vec<ModelReport>)> {
    // A model name that is not understood is refused before the trace is read.
    let names = model_names(args)?;
    if args.stream.applies(path, &args.input)? {
        return streamed::evaluate(path, args, &names);
    }
    let loaded = load_input(path, &args.input)?;
    evaluate_loaded(path, args, &loaded)
}

fn evaluate_loaded(
    path: &Path,
    args: &PredictOptions,
    loaded: &Loaded,
) -> Result<(Input, Vec<ModelReport>)> {
    let names = model_names(args)?;
    let (tokens, input) = input_of(loaded, path)?;
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
enum OtherCalls {
    Loaded(TokenStream),
    Streamed(Box<StreamedCalls>),
}

impl OtherCalls {
    pub fn as_calls(&mut self) -> &mut dyn Calls {
        match self {
            Self::Loaded(tokens) => tokens,
            Self::Streamed(s) => s.as_mut(),
        }
    }
}

fn other_calls(args: &PredictOptions) -> Result<Option<OtherCalls>> {
    let Some(path) = &args.train else {
        return Ok(None);
    };
    if args.stream.applies(path, &args.input)? {
        // The window applies to both, as when they are loaded.
        let other = crate::session::source::StreamInput::new(
            path,
            &args.input.window,
            args.input.requests_or(allocview_loaders::Requests::Objects),
            args.input.heap_id(path)?,
        )?;
        return Ok(Some(OtherCalls::Streamed(Box::new(StreamedCalls::new(
            other,
        )))));
    }
    let l = load_input(path, &args.input)?;
    let (view, threads) = events_and_threads(&l, path, "predict --train")?;
    Ok(Some(OtherCalls::Loaded(TokenStream::from_trace(
        &view,
        Some(&threads),
    ))))
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

/// The object `predict --json` prints.
#[must_use]
pub fn report_json(
    file: &str,
    args: &PredictOptions,
    input: &Input,
    reports: &[ModelReport],
) -> Value {
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
