//! `tune --policy real-jemalloc` (or `real-glibc`, `real-mimalloc`, `real-tcmalloc`): the
//! search of [`super`] over a real allocator's settings, each candidate a real replay
//! ([`crate::real`]) whose peak RSS is its footprint. A real allocator does not fail under a
//! limit: a setting fits when its peak RSS stays under it, and the limit it needs is its peak
//! RSS. Measurements differ a little run to run, so a key whose values all stay within
//! [`SAME_FRACTION`] of the default's peak is one that changes nothing.

use std::path::Path;

use allocview_loaders::Loaded;
use allocview_sim::trace::TraceView;
use anyhow::{Context as _, Result};

use super::{Candidate, MinLimitOf, Searched, TuneOptions, Tuned, drive};
use crate::real::RealSpec;

/// Peaks within this fraction of each other are the same measurement.
const SAME_FRACTION: f64 = 0.01;
/// Most combinations of a real allocator's keys (each a replay of its own process).
const MAX_REAL_COMBINATIONS: usize = 64;

/// The keys of a real allocator the search tries, with their values (the defaults left out).
#[must_use]
pub fn space(family: &str) -> Vec<(&'static str, Vec<&'static str>)> {
    match family {
        "real-glibc" => vec![
            ("arena_max", vec!["1", "2", "4"]),
            ("mmap_threshold", vec!["131072", "1048576", "33554432"]),
            ("trim_threshold", vec!["131072", "33554432"]),
        ],
        "real-jemalloc" => vec![
            ("dirty_decay_ms", vec!["0", "1000"]),
            ("muzzy_decay_ms", vec!["0"]),
            ("narenas", vec!["1", "2"]),
        ],
        "real-mimalloc" => vec![
            ("eager_commit", vec!["0"]),
            ("reset_delay", vec!["0", "1000"]),
        ],
        "real-tcmalloc" => vec![
            ("release_rate", vec!["0", "10"]),
            ("aggressive_decommit", vec!["1"]),
        ],
        _ => Vec::new(),
    }
}

/// The search over `family`'s settings on `loaded` (a malloc trace).
///
/// # Errors
/// A library that is not installed, or a replay that failed.
pub fn search(
    loaded: &Loaded,
    path: &Path,
    view: &TraceView<'_>,
    family: &'static str,
    opts: &TuneOptions,
) -> Result<Tuned> {
    let (threads, calls) = crate::answers::compare::threads_and_calls(loaded, path)?;
    // The calls are written once, for every candidate.
    let prepared = crate::real::prepare(
        &[RealSpec::parse(family)?],
        view,
        &threads,
        calls.as_deref(),
    )?;
    let mut replays = 0;
    let mut run = |sets: &[Vec<(String, String)>]| -> Result<Vec<Candidate>> {
        replays += sets.len();
        sets.iter()
            .map(|changed| {
                let text = std::iter::once(family.to_owned())
                    .chain(changed.iter().map(|(k, v)| format!("{k}={v}")))
                    .collect::<Vec<_>>()
                    .join(":");
                let spec = RealSpec::parse(&text)?;
                let r = crate::real::run_prepared(&spec, view, &prepared)
                    .with_context(|| format!("while replaying {}", path.display()))?;
                let fits = opts.limit_bytes.is_none_or(|l| r.peak_rss_bytes <= l);
                if let Some(c) = &opts.replayed {
                    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(Candidate {
                    policy: spec.label,
                    changed: changed.clone(),
                    env: if r.env_line.is_empty() {
                        "(the C library's defaults: nothing to set)".to_owned()
                    } else {
                        r.env_line
                    },
                    fits,
                    first_oom_event: None,
                    ooms: 0,
                    peak_footprint_bytes: r.peak_rss_bytes,
                    headroom_bytes: opts
                        .limit_bytes
                        .filter(|_| fits)
                        .map(|l| l.saturating_sub(r.peak_rss_bytes)),
                })
            })
            .collect()
    };
    let same = |c: &Candidate, d: &Candidate| {
        let (a, b) = (c.peak_footprint_bytes as f64, d.peak_footprint_bytes as f64);
        (a - b).abs() <= SAME_FRACTION * b.max(1.0)
    };
    let Searched {
        default,
        candidates,
        pruned,
    } = drive(
        &space(family),
        &mut run,
        &same,
        MAX_REAL_COMBINATIONS,
        opts.limit_bytes.is_some(),
    )?;
    let best = candidates.iter().find(|c| c.fits).cloned();
    // A real allocator needs its peak RSS: the closest ones, when nothing fits.
    let min_limits = if best.is_none() {
        let mut by_peak: Vec<&Candidate> = candidates.iter().collect();
        by_peak.sort_by_key(|c| c.peak_footprint_bytes);
        by_peak
            .into_iter()
            .take(4)
            .map(|c| MinLimitOf {
                policy: c.policy.clone(),
                env: c.env.clone(),
                min_limit_bytes: Some(c.peak_footprint_bytes),
            })
            .collect()
    } else {
        Vec::new()
    };
    Ok(Tuned {
        family: family.to_owned(),
        limit_bytes: opts.limit_bytes,
        peak_live_bytes: view.peak_live().0,
        fits: best.is_some(),
        best,
        default,
        candidates,
        replays,
        pruned_keys: pruned,
        min_limits,
        shrink: None,
    })
}
