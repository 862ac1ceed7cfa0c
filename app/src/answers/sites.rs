//! `sites`'s answer: the memory live at a moment attributed to the code that asked for it
//! (stacks, functions or modules), and with a policy, the free holes its live blocks pin; with
//! the parsing of `--at` and `--by` that `sites`, `leaks`, `flamegraph` and `diff` share.

use std::path::Path;

use allocview_loaders::Loaded;
use allocview_loaders::analysis::profile_sites::{ProfileMoment, profile_rows};
use allocview_loaders::analysis::site_stats::{self, GroupBy, SiteKind, SiteRow};
use allocview_loaders::sites::StackTable;
use allocview_sim::heap::Block;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::replay::{ReplayOptions, replay};
use allocview_sim::trace::TraceView;
use anyhow::{Context as _, Result, anyhow, bail};
use serde_json::{Value, json};

use crate::session::input::{require_events, sites_of};
use crate::session::policies::config_for_input;

/// What `sites` is asked, besides the trace.
#[derive(Clone, Debug)]
pub struct SitesQuery {
    /// The moment: `peak` (of live bytes), `end`, an event number, or a time (`1.5s`).
    pub at: String,
    /// `stack`, `function` or `module`.
    pub by: String,
    /// A policy to replay to the moment, for the free bytes each site's blocks pin.
    pub policy: Option<String>,
}

/// `--at`: `peak` (of live bytes), `end`, an event number, or a time (`1.5s`, `20ms`).
pub fn resolve_at(text: &str, view: &TraceView<'_>) -> Result<usize> {
    let last = view.len().saturating_sub(1);
    let t = text.trim();
    match t {
        "peak" => return Ok(view.peak_live().1),
        "end" => return Ok(last),
        _ => {}
    }
    if let Ok(event) = t.replace([',', '_'], "").parse::<usize>() {
        if event > last {
            bail!("--at {event}: the trace has events 0 to {last}");
        }
        return Ok(event);
    }
    let t_ns = allocview_sim::units::parse_duration_ns(t)
        .map_err(|e| anyhow!("--at expects peak, end, an event number or a time: {e}"))?;
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    let target = t0 as f64 + t_ns;
    // The last event at or before that time.
    Ok(view
        .t_ns
        .partition_point(|&x| (x as f64) <= target)
        .saturating_sub(1))
}

/// `--by`: `stack`, `function` or `module`.
pub fn parse_by(text: &str) -> Result<GroupBy> {
    Ok(match text {
        "stack" => GroupBy::Stack,
        "function" => GroupBy::Function,
        "module" => GroupBy::Module,
        other => bail!("--by {other:?}: expected stack, function or module"),
    })
}

/// A stack's frames, as `sites --json` gives them.
#[must_use]
pub fn frames_json(stacks: &StackTable, stack: u32) -> Value {
    json!(
        stacks
            .frames_of(stack)
            .map(|f| {
                json!({"function": f.function, "file": f.file, "line": f.line, "module": f.module,
                       "python": f.is_python()})
            })
            .collect::<Vec<_>>()
    )
}

/// The object `sites --json` prints for `loaded` (read from `path`).
///
/// # Errors
/// When the input has no allocations, `--at` or `--by` is not understood, or the policy
/// cannot replay the trace.
pub fn sites_json(path: &Path, args: &SitesQuery, loaded: &Loaded) -> Result<Value> {
    let by = parse_by(&args.by)?;
    let SiteView {
        rows,
        stacks,
        kind,
        moment,
        pinned,
    } = site_view(path, args, loaded)?;
    let at_event = match moment {
        SiteMoment::Event { at, .. } => json!(at),
        SiteMoment::Profile(_) => Value::Null,
    };
    let pin = |i: usize| {
        pinned
            .as_ref()
            .map(|v: &Vec<u64>| v.get(i).copied().unwrap_or(0))
    };
    Ok(json!({
        "file": path.display().to_string(),
        "at_event": at_event,
        "at_profile_moment": match moment {
            SiteMoment::Profile(ProfileMoment::Peak) => json!("peak"),
            SiteMoment::Profile(ProfileMoment::Live) => json!("live"),
            SiteMoment::Event { .. } => Value::Null,
        },
        "by": by.name(),
        "site_kind": match kind {
            SiteKind::Stacks => "stacks",
            SiteKind::Operations => "operations",
            SiteKind::SizeClasses => "size_classes",
        },
        "policy": args.policy,
        // Set when the stacks were sampled (`record --stack-sample`): the figures by site
        // are then estimates.
        "stack_sample_bytes": stacks.sampling().map(|s| s.mean_bytes),
        "estimated": stacks.sampling().is_some(),
        "sites": rows.iter().enumerate().map(|(i, r)| json!({
            "name": r.name,
            "frames": frames_json(&stacks, r.stack),
            "live_bytes": r.live_bytes,
            "live_blocks": r.live_blocks,
            "alloc_count": r.alloc_count,
            "alloc_bytes": r.alloc_bytes,
            "pinned_free_bytes": pin(i),
        })).collect::<Vec<_>>(),
    }))
}

/// The moment an input's sites are read at.
#[derive(Clone, Copy, Debug)]
pub enum SiteMoment {
    /// Just after an event of the input's events, `t_s` seconds after the first.
    Event { at: usize, t_s: f64 },
    /// One of a heap profile's moments.
    Profile(ProfileMoment),
}

/// An input's sites at a moment: from its events, or from a heap profile's samples.
pub struct SiteView {
    pub rows: Vec<SiteRow>,
    pub stacks: StackTable,
    pub kind: SiteKind,
    pub moment: SiteMoment,
    /// With a policy: the free bytes each row's blocks pin in its heap.
    pub pinned: Option<Vec<u64>>,
}

/// The sites `args` asks for of `loaded` (read from `path`).
///
/// # Errors
/// When the input has no allocations, `--at` or `--by` is not understood, the policy cannot
/// replay it, or a policy is asked of a heap profile (it has no events to replay).
pub fn site_view(path: &Path, args: &SitesQuery, loaded: &Loaded) -> Result<SiteView> {
    let by = parse_by(&args.by)?;
    if let Loaded::HeapProfile(p) = loaded {
        if args.policy.is_some() {
            bail!(
                "--policy: {} is a heap profile, a moment with no events to replay through a policy",
                path.display()
            );
        }
        let moment = ProfileMoment::parse(&args.at, p).map_err(|e| anyhow!(e))?;
        return Ok(SiteView {
            rows: profile_rows(p, moment, by),
            stacks: p.stacks.clone(),
            kind: SiteKind::Stacks,
            moment: SiteMoment::Profile(moment),
            pinned: None,
        });
    }
    let ev = require_events(loaded, path, "sites")?;
    let view = allocview_loaders::trace_view(ev.events, path)?;
    let sites = sites_of(loaded).context("this input has no allocations")?;
    let at = resolve_at(&args.at, &view)?;
    let rows = site_stats::by_site(&view, &sites, at, by);
    let pinned = match &args.policy {
        Some(p) => Some(pinned_free(loaded, &view, p, at, &rows)?),
        None => None,
    };
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    Ok(SiteView {
        rows,
        stacks: sites.stacks,
        kind: sites.kind,
        moment: SiteMoment::Event {
            at,
            t_s: (view.t_ns.get(at).copied().unwrap_or(t0) - t0) as f64 / 1e9,
        },
        pinned,
    })
}

/// For each site row: the free bytes of `policy`'s heap at `at` that its live blocks pin
/// ([`site_stats::pinned_free`]).
pub fn pinned_free(
    loaded: &Loaded,
    view: &TraceView<'_>,
    policy: &str,
    at: usize,
    rows: &[SiteRow],
) -> Result<Vec<u64>> {
    let blocks = policy_blocks_at(loaded, view, policy, at)?;
    Ok(site_stats::pinned_free(&blocks, rows))
}

/// The blocks of `policy`'s heap just after event `at`, in address order.
///
/// # Errors
/// When the policy is not understood or cannot replay the trace to `at`.
pub fn policy_blocks_at(
    loaded: &Loaded,
    view: &TraceView<'_>,
    policy: &str,
    at: usize,
) -> Result<Vec<Block>> {
    let spec = PolicySpec::parse(policy)?;
    let config = spec.apply(&config_for_input(
        loaded,
        allocview_sim::policy::config::PolicyConfig::default(),
    ))?;
    let p = allocview_sim::policy::registry::build(spec.name, &config, view)?;
    let opts = ReplayOptions {
        align_bytes: config.align_bytes,
        // One seek: it replays from the first state rather than from copies made all along.
        checkpoint_every: 0,
        ..ReplayOptions::default()
    };
    let r = replay(view, p, &opts);
    let (state, _) = r
        .state_at(view, at)
        .map_err(|e| anyhow!("replaying {policy} to event {at}: {e}"))?;
    let mut blocks: Vec<Block> = Vec::new();
    state.blocks(&mut blocks);
    Ok(blocks)
}
