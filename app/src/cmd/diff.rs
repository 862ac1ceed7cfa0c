//! `allocview diff A B`: what changed between two runs, attributed to code: peak live bytes,
//! each policy's footprint, allocations, and bytes by site; a CI gate on peak growth.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use allocview_loaders::analysis::site_stats::{self, GroupBy};
use anyhow::{Context as _, Result, bail};
use serde_json::json;

use crate::answers::sites::resolve_at;
use crate::format;
use crate::session::InputArgs;
use crate::session::PolicyArgs;
use crate::session::input::sites_of;
use crate::session::input::{load_input, require_events};
use crate::session::policies::config_for_input;
use crate::session::runs::run_policies;

/// Arguments of `allocview diff`.
#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// The baseline run.
    pub a: PathBuf,
    /// The run compared with it.
    pub b: PathBuf,
    /// The moment whose live bytes are compared by site: `peak` (each run's own peak of live
    /// bytes) or `end`.
    #[arg(long, default_value = "peak", value_name = "peak|end")]
    pub at: String,
    /// Exit with status 1 when B's peak live bytes exceed A's by more than this percentage
    /// (any growth from a peak of 0 bytes exceeds it).
    #[arg(long, value_name = "PCT", value_parser = parse_pct)]
    pub fail_on_increase: Option<f64>,
    /// Rows of the site table to print (the JSON has every site).
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    #[arg(long)]
    pub json: bool,
    /// Also write one self-contained HTML page: both runs' summaries, their timelines
    /// overlaid and the sites table.
    #[arg(long, value_name = "OUT.html")]
    pub html: Option<PathBuf>,
    #[command(flatten)]
    pub policies: PolicyArgs,
    #[command(flatten)]
    pub input: InputArgs,
}

/// A site's figures in one run: bytes live at the moment, allocations, bytes allocated.
type SiteFigures = (u64, u64, u64);
/// A row of the site table: the name and its figures in A and in B.
type DiffRow<'a> = (&'a String, SiteFigures, SiteFigures);

/// One run's figures.
struct Side {
    peak_live: u64,
    allocs: u64,
    alloc_bytes: u64,
    /// Site name -> (bytes live at the moment, allocations, bytes allocated).
    sites: BTreeMap<String, SiteFigures>,
    /// Policy label -> peak footprint.
    footprints: Vec<(String, u64)>,
    site_kind: String,
    /// The run's part of the `--html` page.
    page: Option<crate::html::Run>,
}

fn side(path: &Path, args: &DiffArgs) -> Result<Side> {
    let loaded = load_input(path, &args.input)?;
    if let allocview_loaders::Loaded::HeapProfile(p) = &loaded {
        return profile_side(path, p, args);
    }
    let ev = require_events(&loaded, path, "diff")?;
    let view = allocview_loaders::trace_view(ev.events, path)?;
    let sites = sites_of(&loaded).context("this input has no allocations")?;
    let at = resolve_at(&args.at, &view)?;
    let rows = site_stats::by_site(&view, &sites, at, GroupBy::Function);
    let mut by_name: BTreeMap<String, SiteFigures> = BTreeMap::new();
    for r in &rows {
        let e = by_name.entry(r.name.clone()).or_default();
        e.0 += r.live_bytes;
        e.1 += r.alloc_count;
        e.2 += r.alloc_bytes;
    }
    let (specs, real_specs) = args.policies.specs_and_real()?;
    let config = config_for_input(&loaded, args.policies.config()?);
    let jobs = args.policies.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let runs = run_policies(&view, &specs, &config, jobs);
    let replays: Vec<(&str, &allocview_sim::replay::Replay)> = runs
        .iter()
        .filter_map(|r| r.result.as_ref().ok().map(|rep| (r.name.as_str(), rep)))
        .collect();
    let mut footprints: Vec<(String, u64)> = replays
        .iter()
        .map(|&(name, rep)| (name.to_owned(), rep.summary.peak_footprint_bytes))
        .collect();
    let page = args
        .html
        .as_ref()
        .map(|_| crate::html::diff_run(path, &loaded, &view, &replays));
    // A real allocator's footprint is the peak RSS its replay measured.
    for (row, _) in crate::answers::compare::real_rows(&loaded, path, &view, &real_specs)? {
        footprints.push((row.name, row.peak_footprint_bytes));
    }
    Ok(Side {
        peak_live: view.peak_live().0,
        // From the events, not the rows: exact even when the rows are estimates (sampled
        // stacks).
        allocs: view.num_allocs.into(),
        alloc_bytes: (0..view.len())
            .filter(|&i| view.kind_at(i) == Some(allocview_sim::trace::EventKind::Alloc))
            .map(|i| view.size_bytes.get(i).copied().unwrap_or(0))
            .sum(),
        sites: by_name,
        footprints,
        site_kind: site_stats::describe_sites(sites.kind, sites.sampling()),
        page,
    })
}

/// One side that is a heap profile: its sites at the moment `--at` names (a profile has no
/// events to replay, so no policy's footprint).
fn profile_side(
    path: &Path,
    p: &allocview_loaders::profile::HeapProfile,
    args: &DiffArgs,
) -> Result<Side> {
    use allocview_loaders::analysis::profile_sites::{ProfileMoment, profile_rows};
    if !args.policies.policy.is_empty() {
        bail!(
            "--policy: {} is a heap profile, a moment with no events to replay through a policy",
            path.display()
        );
    }
    let moment = ProfileMoment::parse(&args.at, p).map_err(|e| anyhow::anyhow!(e))?;
    let rows = profile_rows(p, moment, GroupBy::Function);
    let mut by_name: BTreeMap<String, SiteFigures> = BTreeMap::new();
    for r in &rows {
        let e = by_name.entry(r.name.clone()).or_default();
        e.0 += r.live_bytes;
        e.1 += r.alloc_count;
        e.2 += r.alloc_bytes;
    }
    let peak_live = rows.iter().map(|r| r.live_bytes).sum();
    let page = args.html.as_ref().map(|_| crate::html::Run {
        file: crate::html::file_label(path),
        format: "heap-profile".to_owned(),
        peak_live_bytes: peak_live,
        ..crate::html::Run::default()
    });
    Ok(Side {
        peak_live,
        allocs: rows.iter().map(|r| r.alloc_count).sum(),
        alloc_bytes: rows.iter().map(|r| r.alloc_bytes).sum(),
        sites: by_name,
        footprints: Vec::new(),
        site_kind: "call stacks".to_owned(),
        page,
    })
}

/// Sites in the page's table, largest change first (the JSON has every site).
const HTML_SITES: usize = 500;

/// Writes `diff`'s page to `out`: both runs and the sites table; returns its size in bytes.
fn write_html(
    out: &Path,
    args: &DiffArgs,
    pages: [Option<crate::html::Run>; 2],
    rows: &[DiffRow<'_>],
) -> Result<u64> {
    let runs = pages.into_iter().flatten().collect();
    let title = format!(
        "allocview diff: {} against {}",
        crate::html::file_label(&args.b),
        crate::html::file_label(&args.a)
    );
    let mut page = crate::html::Page::new("diff", title, runs);
    page.sites_diff = Some(
        rows.iter()
            .take(HTML_SITES)
            .map(|(n, x, y)| crate::html::SiteDiff {
                name: (*n).clone(),
                a: [x.0, x.1, x.2],
                b: [y.0, y.1, y.2],
            })
            .collect(),
    );
    page.diff_at = Some(args.at.clone());
    crate::html::write(out, &page, &[&args.a, &args.b])
}

/// `--fail-on-increase`: a finite percentage. A CI gate must fail closed, and `nan`, `inf` or
/// `1e309` (which parses as infinity) would let every growth pass.
fn parse_pct(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err(format!("{text:?} is not a finite percentage")),
        Err(e) => Err(format!("{text:?}: {e}")),
    }
}

/// Whether B's peak of live bytes exceeds A's by more than `limit_pct` percent. Growth from a
/// peak of 0 bytes has no percentage, and is more than any limit.
fn exceeds(a_peak_bytes: u64, b_peak_bytes: u64, limit_pct: f64) -> bool {
    match pct(a_peak_bytes, b_peak_bytes) {
        Some(change_pct) => change_pct > limit_pct,
        None => b_peak_bytes > a_peak_bytes,
    }
}

fn pct(a: u64, b: u64) -> Option<f64> {
    (a > 0).then(|| 100.0 * (b as f64 - a as f64) / a as f64)
}

/// Runs `allocview diff`; `Ok(true)` when `--fail-on-increase` is exceeded.
pub fn run(args: &DiffArgs) -> Result<bool> {
    if !matches!(args.at.as_str(), "peak" | "end") {
        bail!("--at {:?}: diff compares `peak` or `end`", args.at);
    }
    let mut a = side(&args.a, args)?;
    let mut b = side(&args.b, args)?;
    let pages = [a.page.take(), b.page.take()];
    let mut names: Vec<&String> = a.sites.keys().chain(b.sites.keys()).collect();
    names.sort();
    names.dedup();
    let get = |s: &Side, n: &str| s.sites.get(n).copied().unwrap_or_default();
    let mut rows: Vec<DiffRow<'_>> = names
        .into_iter()
        .map(|n| (n, get(&a, n), get(&b, n)))
        .collect();
    let change = |(_, x, y): &DiffRow<'_>| i128::from(y.0) - i128::from(x.0);
    rows.sort_by(|p, q| {
        change(q)
            .abs()
            .cmp(&change(p).abs())
            .then_with(|| p.0.cmp(q.0))
    });
    if let Some(out) = &args.html {
        let size_bytes = write_html(out, args, pages, &rows)?;
        if !args.json {
            outln!("wrote {} ({})", out.display(), format::bytes(size_bytes));
        }
    }
    let peak_pct = pct(a.peak_live, b.peak_live);
    let failed = args
        .fail_on_increase
        .is_some_and(|limit| exceeds(a.peak_live, b.peak_live, limit));
    if args.json {
        let policies: Vec<_> = a
            .footprints
            .iter()
            .map(|(name, fa)| {
                let fb = b.footprints.iter().find(|(n, _)| n == name).map(|x| x.1);
                json!({
                    "name": name,
                    "a_peak_footprint_bytes": fa,
                    "b_peak_footprint_bytes": fb,
                    "change_pct": fb.and_then(|fb| pct(*fa, fb)),
                })
            })
            .collect();
        let out = json!({
            "a": args.a.display().to_string(),
            "b": args.b.display().to_string(),
            "at": args.at,
            "peak_live_bytes": {"a": a.peak_live, "b": b.peak_live, "change_pct": peak_pct},
            "allocations": {
                "a_count": a.allocs, "b_count": b.allocs,
                "a_bytes": a.alloc_bytes, "b_bytes": b.alloc_bytes,
            },
            "policies": policies,
            "site_kind": [a.site_kind, b.site_kind],
            "sites": rows.iter().map(|(n, x, y)| json!({
                "name": n,
                "a_bytes": x.0,
                "b_bytes": y.0,
                "change_bytes": i128::from(y.0) - i128::from(x.0),
                "a_alloc_count": x.1,
                "b_alloc_count": y.1,
                "a_alloc_bytes": x.2,
                "b_alloc_bytes": y.2,
            })).collect::<Vec<_>>(),
            "fail_on_increase_pct": args.fail_on_increase,
            "failed": failed,
        });
        outln!("{out}");
        return Ok(failed);
    }
    let signed = |d: i128| {
        let s = format::bytes(u64::try_from(d.unsigned_abs()).unwrap_or(u64::MAX));
        if d < 0 {
            format!("-{s}")
        } else {
            format!("+{s}")
        }
    };
    let pct_text = |p: Option<f64>| p.map_or_else(|| "-".to_owned(), |p| format!("{p:+.1}%"));
    outln!("A = {}\nB = {}", args.a.display(), args.b.display());
    outln!();
    outln!(
        "  peak live      {:>12} -> {:>12}  {}",
        format::bytes(a.peak_live),
        format::bytes(b.peak_live),
        pct_text(peak_pct)
    );
    outln!(
        "  allocations    {:>12} -> {:>12}  ({} -> {} allocated)",
        format::count(a.allocs),
        format::count(b.allocs),
        format::bytes(a.alloc_bytes),
        format::bytes(b.alloc_bytes)
    );
    for (name, fa) in &a.footprints {
        if let Some((_, fb)) = b.footprints.iter().find(|(n, _)| n == name) {
            outln!(
                "  {:<14} {:>12} -> {:>12}  {}  (peak footprint)",
                name,
                format::bytes(*fa),
                format::bytes(*fb),
                pct_text(pct(*fa, *fb))
            );
        }
    }
    outln!();
    outln!(
        "  live at {} by site ({}), largest change first:",
        args.at,
        a.site_kind
    );
    outln!("  {:>12} {:>12} {:>12}  site", "A", "B", "change");
    for (n, x, y) in rows.iter().take(args.top) {
        outln!(
            "  {:>12} {:>12} {:>12}  {}",
            format::bytes(x.0),
            format::bytes(y.0),
            signed(i128::from(y.0) - i128::from(x.0)),
            format::trace_text(n)
        );
    }
    if let Some(limit) = args.fail_on_increase {
        outln!();
        if failed {
            // From a peak of 0 bytes there is no percentage: say the bytes.
            let grew = peak_pct.map_or_else(
                || {
                    format!(
                        "from {} to {}",
                        format::bytes(a.peak_live),
                        format::bytes(b.peak_live)
                    )
                },
                |p| format!("{p:+.1}%"),
            );
            outln!("FAIL: peak live bytes grew {grew} (limit {limit:+.1}%)");
        } else {
            outln!(
                "ok: peak live bytes changed {} (limit {limit:+.1}%)",
                pct_text(peak_pct)
            );
        }
    }
    Ok(failed)
}
