//! `allocview spill FILE --limit BYTES [--policy P] [--evict lru,furthest,largest,executor]
//! [--unit block|executor] [--bandwidth 500MB/s] [--latency 100us] [--json] [--sweep]`: what an
//! out-of-core runtime would spill to disk and read back to run the trace under a limit, per
//! eviction policy, against the OS swap baseline and the lower bound (the model is
//! [`allocview_sim::spill`]'s).

mod plot;
mod units;

use std::path::PathBuf;

use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::spill::{
    self, Evict, IoModel, OsSwapStats, SpillStats, Units, lower_bound_bytes,
};
use allocview_sim::trace::TraceView;
use allocview_sim::units::{parse_bandwidth, parse_duration_ns};
use anyhow::{Context as _, Result, anyhow, bail};
use serde_json::{Value, json};

use crate::format;
use crate::session::InputArgs;
use crate::session::input::{load_input, require_events};
use crate::session::policies::config_for_input;
use plot::Point;

/// What a unit of data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UnitArg {
    /// Each allocation, used at its allocation and at its free.
    Block,
    /// Threads (malloc trace), operations (TensorFlow log), phases (PyTorch snapshot): a
    /// unit's data is used whenever the unit has an event.
    Executor,
}

/// Arguments of `allocview spill`.
#[derive(Debug, clap::Args)]
pub struct SpillArgs {
    /// The trace to replay.
    pub file: PathBuf,
    /// Memory limit (e.g. 512MiB).
    #[arg(long, value_parser = crate::units::parse_bytes, value_name = "BYTES",
          required_unless_present = "sweep", conflicts_with = "sweep")]
    pub limit: Option<u64>,
    /// The allocator policy (a registered name or variant, e.g. `bfc:allow_growth=false`).
    #[arg(long, default_value = "best-fit", value_name = "P")]
    pub policy: String,
    /// Eviction policies, comma-separated.
    #[arg(
        long,
        default_value = "lru,furthest,largest,executor",
        value_name = "NAMES"
    )]
    pub evict: String,
    /// What a unit of data is.
    #[arg(long, value_enum, default_value_t = UnitArg::Block)]
    pub unit: UnitArg,
    /// Disk bandwidth, for the time estimates.
    #[arg(long, default_value = "500MB/s", value_name = "RATE")]
    pub bandwidth: String,
    /// Latency of one I/O operation.
    #[arg(long, default_value = "100us", value_name = "TIME")]
    pub latency: String,
    /// Alignment of every request, in bytes (a power of two).
    #[arg(long, default_value_t = 16, value_name = "BYTES")]
    pub align: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Run limits from the peak live bytes down (100%, 90%, ...) until nothing works, print
    /// the curve and plot it.
    #[arg(long)]
    pub sweep: bool,
    /// Where `--sweep` writes its plot (default: `<file name>.spill.png` here).
    #[arg(long, value_name = "PATH")]
    pub png: Option<PathBuf>,
    #[command(flatten)]
    pub input: InputArgs,
}

/// Everything one limit needs.
struct Setup<'a> {
    view: TraceView<'a>,
    units: Units<'a>,
    policy_name: &'static str,
    config: PolicyConfig,
    evicts: Vec<Evict>,
    io: IoModel,
}

/// Runs `allocview spill`.
pub fn run(args: &SpillArgs) -> Result<()> {
    let evicts = args
        .evict
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(Evict::parse)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("--evict: {e}"))?;
    if evicts.is_empty() {
        bail!("--evict: name at least one of lru, furthest, largest, executor");
    }
    let io = IoModel {
        bandwidth_bytes_per_s: parse_bandwidth(&args.bandwidth)
            .map_err(|e| anyhow!("--bandwidth: {e}"))?,
        latency_s: parse_duration_ns(&args.latency).map_err(|e| anyhow!("--latency: {e}"))? / 1e9,
    };
    if !args.align.is_power_of_two() {
        bail!("--align must be a power of two, got {}", args.align);
    }
    let spec = PolicySpec::parse(&args.policy)?;
    if spec.name == "oracle" {
        bail!(
            "--policy oracle places every allocation at an offset planned for the whole trace, \
             so it cannot take evicted data back elsewhere; pick an online policy"
        );
    }
    let loaded = load_input(&args.file, &args.input)?;
    let mut base = config_for_input(
        &loaded,
        PolicyConfig {
            align_bytes: args.align,
            ..PolicyConfig::default()
        },
    );
    // A snapshot's recorded segments do not follow a limit: `pytorch` runs its algorithm from
    // an empty allocator, with the snapshot's settings.
    base.pytorch_script = None;
    let config = spec.apply(&base)?;
    let ev = require_events(&loaded, &args.file, "spill")?;
    let view = allocview_loaders::trace_view(ev.events, &args.file)?;
    let unit_table = match args.unit {
        UnitArg::Block => None,
        UnitArg::Executor => Some(units::executor_units(&loaded, ev.events)?),
    };
    let setup = Setup {
        view,
        units: unit_table
            .as_ref()
            .map_or(Units::Blocks, |u| Units::Executors(&u.unit_of_event)),
        policy_name: spec.name,
        config,
        evicts,
        io,
    };
    let unit_text = match &unit_table {
        None => "block".to_owned(),
        Some(u) => format!("executor ({} {})", u.names.len(), u.what),
    };
    let file = args.file.display().to_string();
    let label = spec.label();
    if args.sweep {
        return sweep(args, &setup, &file, &label, &unit_text);
    }
    let limit = args.limit.context("--limit is required without --sweep")?;
    let p = point(&setup, limit)?;
    if args.json {
        let mut v = point_json(&p);
        if let Some(m) = v.as_object_mut() {
            m.insert("file".into(), json!(file));
            m.insert("policy".into(), json!(label));
            m.insert("unit".into(), json!(unit_name(args.unit)));
        }
        outln!("{v}");
        return Ok(());
    }
    let peak_live = setup.view.peak_live().0;
    outln!(
        "{file}: policy {label}, unit {unit_text}, limit {} ({:.0}% of peak live {}); lower \
         bound on spilled bytes {}",
        format::bytes(limit),
        pct(limit, peak_live),
        format::bytes(peak_live),
        format::bytes(p.lower_bound_bytes)
    );
    outln!();
    print_header()?;
    print_point(&p, None)?;
    Ok(())
}

fn unit_name(u: UnitArg) -> &'static str {
    match u {
        UnitArg::Block => "block",
        UnitArg::Executor => "executor",
    }
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        100.0 * a as f64 / b as f64
    }
}

/// Every eviction policy and the OS swap baseline at `limit_bytes`, in parallel.
fn point(s: &Setup<'_>, limit_bytes: u64) -> Result<Point> {
    let limited = PolicyConfig {
        limit_bytes: Some(limit_bytes),
        ..s.config.clone()
    };
    let unlimited = PolicyConfig {
        limit_bytes: None,
        ..s.config.clone()
    };
    let align = s.config.align_bytes;
    let (evictions, os) = std::thread::scope(|scope| {
        let handles: Vec<_> = s
            .evicts
            .iter()
            .map(|&evict| {
                let limited = &limited;
                scope.spawn(move || -> Result<SpillStats> {
                    let policy = registry::build(s.policy_name, limited, &s.view)?;
                    Ok(spill::simulate(
                        &s.view, s.units, policy, align, evict, &s.io,
                    )?)
                })
            })
            .collect();
        let os = (|| -> Result<OsSwapStats> {
            let policy = registry::build(s.policy_name, &unlimited, &s.view)?;
            Ok(spill::os_swap(
                &s.view,
                s.units,
                policy,
                align,
                limit_bytes,
                &s.io,
            )?)
        })();
        let evictions: Vec<Result<SpillStats>> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a spill thread panicked")))
            })
            .collect();
        (evictions, os)
    });
    Ok(Point {
        limit_bytes,
        lower_bound_bytes: lower_bound_bytes(&s.view, limit_bytes),
        evictions: evictions.into_iter().collect::<Result<Vec<_>>>()?,
        os_swap: os?,
    })
}

/// The JSON object of one limit (without `file`, `policy`, `unit`).
fn point_json(p: &Point) -> Value {
    json!({
        "limit_bytes": p.limit_bytes,
        "lower_bound_bytes": p.lower_bound_bytes,
        "evictions": p.evictions.iter().map(|s| json!({
            "evict": s.evict.name(),
            "spilled_bytes": s.spilled_bytes,
            "reloaded_bytes": s.reloaded_bytes,
            "evictions": s.evictions,
            "stalls": s.stalls,
            "estimated_io_seconds": s.estimated_io_seconds,
            "failed": s.failed,
            "reloads": s.reloads,
            "reload_failures": s.reload_failures,
            "peak_spilled_bytes": s.peak_spilled_bytes,
        })).collect::<Vec<_>>(),
        "os_swap": {
            "spilled_bytes": p.os_swap.spilled_bytes,
            "reloaded_bytes": p.os_swap.reloaded_bytes,
            "estimated_io_seconds": p.os_swap.estimated_io_seconds,
            "page_outs": p.os_swap.page_outs,
            "page_ins": p.os_swap.page_ins,
        },
    })
}

fn print_header() -> Result<()> {
    outln!(
        "  {:>10} {:>10} {:>11} {:>11} {:>10} {:>10} {:>12} {:>8}",
        "limit",
        "evict",
        "spilled",
        "reloaded",
        "evictions",
        "stalls",
        "est. I/O s",
        "failed"
    );
    Ok(())
}

/// One limit's rows: each eviction policy, the OS swap baseline, the lower bound.
fn print_point(p: &Point, limit_text: Option<String>) -> Result<()> {
    use format::{bytes, count};
    let limit = limit_text.unwrap_or_else(|| bytes(p.limit_bytes));
    for s in &p.evictions {
        outln!(
            "  {:>10} {:>10} {:>11} {:>11} {:>10} {:>10} {:>12.3} {:>8}",
            limit,
            s.evict.name(),
            bytes(s.spilled_bytes),
            bytes(s.reloaded_bytes),
            count(s.evictions),
            count(s.stalls),
            s.estimated_io_seconds,
            count(s.failed)
        );
    }
    outln!(
        "  {:>10} {:>10} {:>11} {:>11} {:>10} {:>10} {:>12.3} {:>8}",
        limit,
        "os-swap",
        bytes(p.os_swap.spilled_bytes),
        bytes(p.os_swap.reloaded_bytes),
        format!("{} pg", count(p.os_swap.page_outs)),
        "-",
        p.os_swap.estimated_io_seconds,
        "-"
    );
    outln!(
        "  {:>10} {:>10} {:>11}",
        limit,
        "lower bnd",
        bytes(p.lower_bound_bytes)
    );
    Ok(())
}

/// Limits tried by `--sweep`, in percent of the peak live bytes.
const SWEEP_PERCENT: [u64; 10] = [100, 90, 80, 70, 60, 50, 40, 30, 20, 10];

fn sweep(args: &SpillArgs, s: &Setup<'_>, file: &str, label: &str, unit_text: &str) -> Result<()> {
    let peak_live = s.view.peak_live().0;
    let mut points: Vec<(u64, Point)> = Vec::new();
    if !args.json {
        outln!(
            "{file}: policy {label}, unit {unit_text}, peak live {}",
            format::bytes(peak_live)
        );
        outln!();
        print_header()?;
    }
    for percent in SWEEP_PERCENT {
        let limit = peak_live * percent / 100;
        let p = point(s, limit)?;
        let nothing_works = p.evictions.iter().all(|e| e.failed > 0);
        if !args.json {
            print_point(&p, Some(format!("{percent}%")))?;
        }
        points.push((percent, p));
        if nothing_works {
            break;
        }
    }
    let png = args.png.clone().unwrap_or_else(|| {
        let name = args
            .file
            .file_name()
            .map_or_else(|| "trace".into(), |n| n.to_string_lossy().into_owned());
        PathBuf::from(format!("{name}.spill.png"))
    });
    plot::draw(&png, &format!("{file} ({label})"), peak_live, &points)?;
    if args.json {
        let out = json!({
            "file": file,
            "policy": label,
            "unit": unit_name(args.unit),
            "peak_live_bytes": peak_live,
            "png": png.display().to_string(),
            "sweep": points.iter().map(|(pc, p)| {
                let mut v = point_json(p);
                if let Some(m) = v.as_object_mut() {
                    m.insert("percent_of_peak_live".into(), json!(pc));
                }
                v
            }).collect::<Vec<_>>(),
        });
        outln!("{out}");
    } else {
        outln!();
        outln!("  plot: {}", png.display());
    }
    Ok(())
}
