//! `allocview sites`, `allocview leaks` and `allocview flamegraph`: memory attributed to the
//! code that asked for it.

mod flamegraph_svg;

use std::path::{Path, PathBuf};

use allocview_loaders::Loaded;
use allocview_loaders::analysis::site_stats::{self, SiteKind, SiteRow};
use anyhow::{Context as _, Result, bail};
use serde_json::json;

use crate::answers::sites::{
    SiteMoment, SiteView, SitesQuery, frames_json, parse_by, resolve_at, site_view, sites_json,
};
use crate::format;
use crate::session::InputArgs;
use crate::session::input::{load_input, require_events, sites_of};
use allocview_loaders::analysis::profile_sites::{ProfileMoment, profile_folded};

/// Arguments of `allocview sites`.
#[derive(Debug, clap::Args)]
pub struct SitesArgs {
    pub file: PathBuf,
    /// The moment: `peak` (of live bytes), `end`, an event number, or a time (`1.5s`).
    #[arg(long, default_value = "peak")]
    pub at: String,
    /// Group by the whole stack, by the site's function, or by its module (or source file).
    #[arg(long, default_value = "function", value_name = "stack|function|module")]
    pub by: String,
    /// Replay this policy to the moment and attribute its free holes to the sites whose live
    /// blocks pin them (`pinned_free_bytes`).
    #[arg(long, value_name = "POLICY")]
    pub policy: Option<String>,
    /// Rows to print (the JSON has every site).
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub input: InputArgs,
}

impl SitesArgs {
    /// What the answer is asked, besides the trace.
    #[must_use]
    pub fn query(&self) -> SitesQuery {
        SitesQuery {
            at: self.at.clone(),
            by: self.by.clone(),
            policy: self.policy.clone(),
        }
    }
}

/// Runs `allocview sites`.
pub fn run_sites(args: &SitesArgs) -> Result<()> {
    let loaded = load_input(&args.file, &args.input)?;
    if args.json {
        outln!("{}", sites_json(&args.file, &args.query(), &loaded)?);
        return Ok(());
    }
    let SiteView {
        rows,
        stacks,
        kind,
        moment,
        pinned,
    } = site_view(&args.file, &args.query(), &loaded)?;
    let pin = |i: usize| {
        pinned
            .as_ref()
            .map(|v: &Vec<u64>| v.get(i).copied().unwrap_or(0))
    };
    let live: u64 = rows.iter().map(|r| r.live_bytes).sum();
    let when = match moment {
        SiteMoment::Event { at, t_s } => format!(
            "at event {} (t = {})",
            format::count(at as u64),
            format::seconds_fixed(t_s)
        ),
        SiteMoment::Profile(ProfileMoment::Peak) => "at the profile's peak".to_owned(),
        SiteMoment::Profile(ProfileMoment::Live) => "at the profile's moment".to_owned(),
    };
    outln!(
        "{}: {} live in {} sites {when}; sites are {}",
        args.file.display(),
        format::bytes(live),
        format::count(rows.iter().filter(|r| r.live_bytes > 0).count() as u64),
        site_stats::describe_sites(kind, stacks.sampling())
    );
    outln!();
    outln!(
        "  {:>11} {:>7} {:>9} {:>11} {:>11}  site",
        "live",
        "blocks",
        "allocs",
        "allocated",
        if pinned.is_some() { "pins free" } else { "" }
    );
    for (i, r) in rows.iter().take(args.top).enumerate() {
        outln!(
            "  {:>11} {:>7} {:>9} {:>11} {:>11}  {}",
            format::bytes(r.live_bytes),
            format::count(r.live_blocks),
            format::count(r.alloc_count),
            format::bytes(r.alloc_bytes),
            pin(i).map_or_else(String::new, format::bytes),
            format::trace_text(&r.name)
        );
        if kind == SiteKind::Stacks {
            for l in stacks.site_lines(r.stack, 3, true).iter().skip(1) {
                outln!("  {:>55}  {}", "", format::trace_text(l));
            }
        }
    }
    if rows.len() > args.top {
        outln!(
            "  ... {} more sites (--top, or --json for all)",
            rows.len() - args.top
        );
    }
    Ok(())
}

/// Arguments of `allocview leaks`.
#[derive(Debug, clap::Args)]
pub struct LeaksArgs {
    pub file: PathBuf,
    /// Group by the whole stack, by the site's function, or by its module.
    #[arg(long, default_value = "function", value_name = "stack|function|module")]
    pub by: String,
    /// Rows to print (the JSON has every site).
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub input: InputArgs,
}

/// Runs `allocview leaks`.
pub fn run_leaks(args: &LeaksArgs) -> Result<()> {
    let by = parse_by(&args.by)?;
    let loaded = load_input(&args.file, &args.input)?;
    let ev = require_events(&loaded, &args.file, "leaks")?;
    let view = allocview_loaders::trace_view(ev.events, &args.file)?;
    let sites = sites_of(&loaded).context("this input has no allocations")?;
    let end = view.len().saturating_sub(1);
    let rows: Vec<SiteRow> = site_stats::by_site(&view, &sites, end, by)
        .into_iter()
        .filter(|r| r.live_bytes > 0)
        .collect();
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    // Blocks allocated before recording last stopped may have been freed unseen.
    let stop_t_ns = crate::answers::marks::last_stop_t_ns(crate::answers::marks::marks_of(&loaded));
    let stopped_before = stop_t_ns.map(|t| view.t_ns.partition_point(|&e| e < t));
    let secs = |e: Option<usize>| {
        e.map_or(0.0, |e| {
            (view.t_ns.get(e).copied().unwrap_or(t0) - t0) as f64 / 1e9
        })
    };
    if args.json {
        let out = json!({
            "file": args.file.display().to_string(),
            "site_kind": sites.kind.describe(),
            "recording_last_stopped_s": stop_t_ns.map(|t| (t - t0) as f64 / 1e9),
            "stack_sample_bytes": sites.sampling().map(|s| s.mean_bytes),
            "estimated": sites.sampling().is_some(),
            "leaks": rows.iter().map(|r| json!({
                "name": r.name,
                "frames": frames_json(&sites.stacks, r.stack),
                "live_bytes": r.live_bytes,
                "live_blocks": r.live_blocks,
                "first_alloc_s": secs(r.first_alloc_event),
                "last_alloc_s": secs(r.last_alloc_event),
                "kind": site_stats::classify(r, view.len(), stopped_before).name(),
                "live_bytes_over_run": r.growth,
            })).collect::<Vec<_>>(),
        });
        outln!("{out}");
        return Ok(());
    }
    let total: u64 = rows.iter().map(|r| r.live_bytes).sum();
    outln!(
        "{}: {} live at the end in {} sites ({}); `leak`: still growing in the second half of \
         the run, `cache`: levelled off",
        args.file.display(),
        format::bytes(total),
        format::count(rows.len() as u64),
        site_stats::describe_sites(sites.kind, sites.sampling())
    );
    if let Some(t) = stop_t_ns {
        outln!(
            "recording last stopped at t = {}: `unknown`: every block the site holds was \
             allocated before then, and may have been freed while recording was stopped",
            format::seconds((t - t0) as f64 / 1e9)
        );
    }
    outln!();
    outln!(
        "  {:<7} {:>11} {:>7} {:>12} {:>12}  {:<20}  site",
        "kind",
        "live",
        "blocks",
        "first alloc",
        "last alloc",
        "live over the run"
    );
    for r in rows.iter().take(args.top) {
        outln!(
            "  {:<7} {:>11} {:>7} {:>12} {:>12}  {:<20}  {}",
            site_stats::classify(r, view.len(), stopped_before).name(),
            format::bytes(r.live_bytes),
            format::count(r.live_blocks),
            format::seconds_fixed(secs(r.first_alloc_event)),
            format::seconds_fixed(secs(r.last_alloc_event)),
            sparkline(&r.growth),
            format::trace_text(&r.name)
        );
    }
    if rows.len() > args.top {
        outln!(
            "  ... {} more sites (--top, or --json for all)",
            rows.len() - args.top
        );
    }
    Ok(())
}

/// A site's live bytes over the run as block characters.
fn sparkline(values: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    values
        .iter()
        .map(|&v| {
            let i = (v as f64 / max as f64 * 7.0).round() as usize;
            BARS.get(i).copied().unwrap_or('█')
        })
        .collect()
}

/// Arguments of `allocview flamegraph`.
#[derive(Debug, clap::Args)]
pub struct FlamegraphArgs {
    pub file: PathBuf,
    /// The moment for `--metric live`: `peak`, `end`, an event number or a time.
    #[arg(long, default_value = "peak")]
    pub at: String,
    /// `live` (bytes live at the moment), `allocated` (bytes over the run) or `count`.
    #[arg(long, default_value = "live", value_name = "live|allocated|count")]
    pub metric: String,
    /// Write folded stacks (`outer;...;inner value`, as flamegraph.pl and inferno read them)
    /// instead of an SVG.
    #[arg(long)]
    pub folded: bool,
    /// Output file (`-` or absent with --folded: standard output).
    #[arg(short = 'o', long = "out", value_name = "OUT")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub input: InputArgs,
}

/// Runs `allocview flamegraph`.
pub fn run_flamegraph(args: &FlamegraphArgs) -> Result<()> {
    if !matches!(args.metric.as_str(), "live" | "allocated" | "count") {
        bail!(
            "--metric {:?}: expected live, allocated or count",
            args.metric
        );
    }
    let loaded = load_input(&args.file, &args.input)?;
    let (lines, what, kind, sampling) = match &loaded {
        Loaded::HeapProfile(p) => {
            let moment = ProfileMoment::parse(&args.at, p).map_err(|e| anyhow::anyhow!(e))?;
            let lines = profile_folded(p, moment, &args.metric, &format::folded_frame);
            let when = match moment {
                ProfileMoment::Peak => "live at the profile's peak",
                ProfileMoment::Live => "live at the profile's moment",
            };
            (lines, when.to_owned(), SiteKind::Stacks, None)
        }
        _ => {
            let ev = require_events(&loaded, &args.file, "flamegraph")?;
            let view = allocview_loaders::trace_view(ev.events, &args.file)?;
            let sites = sites_of(&loaded).context("this input has no allocations")?;
            let at = resolve_at(&args.at, &view)?;
            let lines = site_stats::folded(&view, &sites, at, &args.metric, &format::folded_frame);
            (
                lines,
                format!("live at event {at}"),
                sites.kind,
                sites.sampling(),
            )
        }
    };
    let to_stdout = args.out.as_deref().is_none_or(|p| p == Path::new("-"));
    if let Some(s) = sampling.filter(|_| args.folded) {
        // Not in the folded lines, which tools read as they are.
        eprintln!("note: {}", s.note());
    }
    if args.folded {
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        if to_stdout {
            outln!("{}", text.trim_end());
        } else if let Some(out) = &args.out {
            crate::safe_write::write_bytes(out, text.as_bytes(), &[args.file.as_path()])
                .with_context(|| format!("writing {}", out.display()))?;
            outln!("wrote {} ({} stacks)", out.display(), lines.len());
        }
        return Ok(());
    }
    let Some(out) = args.out.as_ref().filter(|_| !to_stdout) else {
        bail!("an SVG flame graph needs -o OUT.svg (or --folded for text)");
    };
    let title = format!(
        "{}: {} ({})",
        args.file
            .file_name()
            .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
        match args.metric.as_str() {
            "live" => format!("bytes {what}"),
            "allocated" => "bytes allocated over the run".to_owned(),
            _ => "allocations over the run".to_owned(),
        },
        site_stats::describe_sites(kind, sampling)
    );
    let svg = flamegraph_svg::render(&lines, &title, args.metric != "count");
    crate::safe_write::write_bytes(out, svg.as_bytes(), &[args.file.as_path()])
        .with_context(|| format!("writing {}", out.display()))?;
    outln!("wrote {} ({} stacks)", out.display(), lines.len());
    Ok(())
}
