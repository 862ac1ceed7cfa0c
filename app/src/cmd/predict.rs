//! `allocview predict FILE [--model NAME] [--order K] [--split FRACTION] [--train OTHER_FILE]
//! [--json]`: how predictable the allocation stream is, with the libtracemalloc article's tokens,
//! and how well the `predictive` policy's lifetime predictor does.

use std::path::PathBuf;

use allocview_sim::predict::eval::{Figures, ModelReport};
use anyhow::Result;

use crate::answers::predict::{Input, PredictOptions, evaluate, report_json};
use crate::format;
use crate::session::InputArgs;

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
    pub stream: crate::session::StreamArgs,
}

impl PredictArgs {
    /// What the answer is asked, besides the trace.
    #[must_use]
    pub fn options(&self) -> PredictOptions {
        PredictOptions {
            model: self.model.clone(),
            order: self.order,
            split: self.split,
            train: self.train.clone(),
            input: self.input.clone(),
            stream: self.stream.clone(),
        }
    }
}

/// Runs `allocview predict`.
pub fn run(args: &PredictArgs) -> Result<()> {
    let options = args.options();
    let file = args.file.display().to_string();
    let (input, reports) = evaluate(&args.file, &options)?;
    if args.json {
        outln!("{}", report_json(&file, &options, &input, &reports));
    } else {
        print_tables(&file, args, &input, &reports)?;
    }
    Ok(())
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
