//! `allocview tune`: the settings of one allocator family that replay the whole input under a
//! limit, best first, each with the line a user sets; found by a search, proved by the replay.
//!
//! The search: the family's keys and values ([`space`]) are first replayed one key at a time
//! (each replay stops at its first OOM); a key none of whose values changes the replay's
//! outcome (its first OOM and its peak footprint) is dropped, since it cannot help; the keys
//! left are then replayed in every combination (at most [`MAX_COMBINATIONS`]; past that, each
//! key keeps its two best values alone). The candidates are ranked: those that fit first, then
//! the fewest keys changed from the recorded or default settings, then the lowest peak
//! footprint. Without a limit, every replay fits, and the lowest peak footprint comes first.
//! A real allocator's settings (`--policy real-jemalloc`) are searched the same way, each
//! candidate a replay through the library itself ([`real`]).

use std::path::Path;

use allocview_loaders::Loaded;
use allocview_sim::min_limit::run_until_failure;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::trace::TraceView;
use anyhow::{Result, bail};
use serde::Serialize;

mod real;

use crate::session::input::require_events;
use crate::session::policies::config_for_input;
use crate::session::runs::per_spec;

/// Most combinations of the keys left after the one-key replays.
pub const MAX_COMBINATIONS: usize = 1024;

/// What `tune` is asked.
#[derive(Clone, Debug, Default)]
pub struct TuneOptions {
    pub limit_bytes: Option<u64>,
    /// The family (`pytorch`, `bfc`, `glibc`); by default the one the input's allocator is.
    pub family: Option<String>,
    pub jobs: usize,
    /// Counts the replays as they end (a progress display).
    pub replayed: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

/// One setting replayed.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// The variant `compare --policy` takes.
    pub policy: String,
    /// The keys changed from the recorded or default settings.
    pub changed: Vec<(String, String)>,
    /// The line a user sets.
    pub env: String,
    pub fits: bool,
    /// The event of the first OOM (none when it fits).
    pub first_oom_event: Option<usize>,
    /// 0 when it fits; 1 when it failed (the replay stops at its first OOM).
    pub ooms: u64,
    /// The highest footprint up to the end (or the first OOM).
    pub peak_footprint_bytes: u64,
    /// The limit less the peak footprint, when it fits under one.
    pub headroom_bytes: Option<u64>,
}

/// What `tune` found.
#[derive(Clone, Debug, Serialize)]
pub struct Tuned {
    pub family: String,
    pub limit_bytes: Option<u64>,
    pub peak_live_bytes: u64,
    /// Whether any setting replays the whole input with no OOM.
    pub fits: bool,
    pub best: Option<Candidate>,
    /// The recorded or default settings.
    pub default: Candidate,
    /// Every setting replayed, best first.
    pub candidates: Vec<Candidate>,
    pub replays: usize,
    /// Keys dropped because none of their values changed the replay.
    pub pruned_keys: Vec<String>,
    /// When nothing fits: the smallest limit the default and the closest candidates need
    /// (`None`: no limit works).
    pub min_limits: Vec<MinLimitOf>,
    /// When nothing fits under a limit: what the live bytes at the peak would have to lose for
    /// the setting that needs the least to fit, and the sites that hold the most of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shrink: Option<Shrink>,
}

/// How much the peak's live bytes would have to shrink, and where they are.
#[derive(Clone, Debug, Serialize)]
pub struct Shrink {
    /// The setting that needs the smallest limit.
    pub policy: String,
    /// Its smallest limit less the limit asked for.
    pub bytes: u64,
    /// The sites with the most live bytes at the peak of live bytes (by function), most first,
    /// as many as hold `bytes` between them (at most ten).
    pub sites: Vec<ShrinkSite>,
}

/// One site's live bytes at the peak, and what it would lose: the sites with the most give
/// up to all of theirs, in turn, until the total is reached.
#[derive(Clone, Debug, Serialize)]
pub struct ShrinkSite {
    pub site: String,
    pub live_bytes: u64,
    pub shrink_bytes: u64,
}

/// The smallest limit one setting needs.
#[derive(Clone, Debug, Serialize)]
pub struct MinLimitOf {
    pub policy: String,
    pub env: String,
    pub min_limit_bytes: Option<u64>,
}

/// The keys of `family` the search tries, with their values (the defaults left out).
#[must_use]
pub fn space(family: &str) -> Vec<(&'static str, Vec<&'static str>)> {
    match family {
        "pytorch" => vec![
            ("expandable_segments", vec!["true"]),
            ("max_split_size_mb", vec!["512", "256", "128", "64", "32"]),
            ("roundup_power2_divisions", vec!["2", "4", "8", "16"]),
            ("garbage_collection_threshold", vec!["0.6", "0.8"]),
            ("max_non_split_rounding_mb", vec!["64", "256"]),
        ],
        "bfc" => vec![
            ("allow_growth", vec!["false", "true"]),
            ("garbage_collection", vec!["true"]),
        ],
        "glibc" => vec![(
            "mmap_threshold",
            vec!["32768", "65536", "262144", "1048576", "4194304", "33554432"],
        )],
        _ => Vec::new(),
    }
}

/// The families `tune` knows.
pub const FAMILIES: &[&str] = &["pytorch", "bfc", "glibc"];

/// The line a user sets for `changed` in `family`.
#[must_use]
pub fn env_line(family: &str, changed: &[(String, String)]) -> String {
    if changed.is_empty() {
        return "(the recorded or default settings: nothing to set)".to_owned();
    }
    match family {
        "pytorch" => {
            let parts: Vec<String> = changed
                .iter()
                .map(|(k, v)| {
                    let v = match v.as_str() {
                        "true" => "True",
                        "false" => "False",
                        other => other,
                    };
                    format!("{k}:{v}")
                })
                .collect();
            format!("PYTORCH_CUDA_ALLOC_CONF={}", parts.join(","))
        }
        "bfc" => changed
            .iter()
            .map(|(k, v)| match k.as_str() {
                "allow_growth" => format!("TF_FORCE_GPU_ALLOW_GROWTH={v}"),
                "garbage_collection" => format!("TF_ENABLE_GPU_GARBAGE_COLLECTION={v}"),
                other => format!("{other}={v}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        "glibc" => format!(
            "GLIBC_TUNABLES={}",
            changed
                .iter()
                .map(|(k, v)| format!("glibc.malloc.{k}={v}"))
                .collect::<Vec<_>>()
                .join(":")
        ),
        _ => String::new(),
    }
}

/// The family of `loaded`'s allocator: a snapshot's is PyTorch's, a TensorFlow log's BFC, a
/// malloc trace's the C library's.
fn family_of(loaded: &Loaded) -> &'static str {
    match loaded {
        Loaded::PytorchSnapshot(_) => "pytorch",
        Loaded::MallocTrace(t) if t.summary.gpu_device.is_some() => "pytorch",
        Loaded::TfMemoryLog(_) | Loaded::TfBfcDump(_) => "bfc",
        _ => "glibc",
    }
}

/// The settings every candidate starts from: a snapshot's allocator replayed from empty (the
/// recorded run's replay follows its own releases and applies no limit).
fn base_params(family: &str, loaded: &Loaded) -> Vec<(String, String)> {
    base_params_of(family, matches!(loaded, Loaded::PytorchSnapshot(_)))
}

/// [`base_params`] for an input that is (or is not) a PyTorch snapshot.
#[must_use]
pub fn base_params_of(family: &str, snapshot: bool) -> Vec<(String, String)> {
    if family == "pytorch" && snapshot {
        vec![("start".into(), "empty".into())]
    } else {
        Vec::new()
    }
}

/// Searches `loaded`'s family for the settings that fit under the limit.
///
/// # Errors
/// An input without events, an unknown family, or a setting the family refuses.
pub fn tune(loaded: &Loaded, path: &Path, opts: &TuneOptions) -> Result<Tuned> {
    let ev = require_events(loaded, path, "tune")?;
    let view = allocview_loaders::trace_view(ev.events, path)?;
    let family = match &opts.family {
        Some(f) if f.starts_with("real-") => {
            let Some(&name) = crate::real::REAL_NAMES.iter().find(|&&n| n == f) else {
                bail!(
                    "unknown real allocator {f:?}; known: {}",
                    crate::real::REAL_NAMES.join(", ")
                );
            };
            if !matches!(loaded, Loaded::MallocTrace(_)) {
                bail!(
                    "{name} replays malloc traces; {} is not one",
                    path.display()
                );
            }
            return real::search(loaded, path, &view, name, opts);
        }
        Some(f) => family_named(f)?,
        None => family_of(loaded),
    };
    let config = config_for_input(loaded, PolicyConfig::default());
    let mut tuned = search(&view, family, &base_params(family, loaded), &config, opts)?;
    if let Some(limit) = opts.limit_bytes
        && tuned.best.is_none()
    {
        tuned.shrink = shrink_for(loaded, &view, &tuned.min_limits, limit);
    }
    Ok(tuned)
}

/// The family called `name`.
///
/// # Errors
/// A name `tune` does not search.
pub fn family_named(name: &str) -> Result<&'static str> {
    match FAMILIES.iter().find(|&&k| k == name) {
        Some(&k) => Ok(k),
        None => bail!(
            "tune searches the settings of {} and of the real allocators ({}); not {name:?}",
            FAMILIES.join(", "),
            crate::real::REAL_NAMES.join(", ")
        ),
    }
}

/// The search of [`tune`] on `view`, every candidate starting from `base` on `config` (the
/// input's own allocator settings), under `opts.limit_bytes`: what the explorers run too.
///
/// # Errors
/// A setting the family refuses.
pub fn search(
    view: &TraceView<'_>,
    family: &'static str,
    base: &[(String, String)],
    config: &PolicyConfig,
    opts: &TuneOptions,
) -> Result<Tuned> {
    let config = PolicyConfig {
        limit_bytes: opts.limit_bytes,
        ..config.clone()
    };
    let view = *view;
    let jobs = opts.jobs.max(1);
    let mut replays = 0;
    let mut run = |sets: &[Vec<(String, String)>]| -> Result<Vec<Candidate>> {
        replays += sets.len();
        let done = replay_all(&view, family, base, sets, &config, jobs);
        if let Some(c) = &opts.replayed {
            c.fetch_add(sets.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        done
    };
    // A key none of whose values changes the outcome cannot help.
    let same = |c: &Candidate, d: &Candidate| {
        (c.first_oom_event, c.peak_footprint_bytes) == (d.first_oom_event, d.peak_footprint_bytes)
    };
    let Searched {
        default,
        candidates,
        pruned,
    } = drive(
        &space(family),
        &mut run,
        &same,
        MAX_COMBINATIONS,
        opts.limit_bytes.is_some(),
    )?;
    let best = candidates.iter().find(|c| c.fits).cloned();
    let min_limits = if best.is_none() {
        // The default, and the three that came closest (the latest first OOM).
        let mut closest: Vec<&Candidate> = candidates.iter().collect();
        closest.sort_by_key(|c| std::cmp::Reverse(c.first_oom_event.unwrap_or(usize::MAX)));
        let chosen: Vec<&Candidate> = std::iter::once(&default)
            .chain(
                closest
                    .into_iter()
                    .filter(|c| c.policy != default.policy)
                    .take(3),
            )
            .collect();
        let specs: Vec<PolicySpec> = chosen
            .iter()
            .map(|c| PolicySpec::parse(&c.policy))
            .collect::<std::result::Result<_, _>>()?;
        let unlimited = PolicyConfig {
            limit_bytes: None,
            ..config.clone()
        };
        let runs = crate::answers::compare::for_specs(&view, &specs, &unlimited, jobs);
        replays += runs
            .iter()
            .filter_map(|r| r.result.as_ref().ok())
            .map(|m| m.replays as usize)
            .sum::<usize>();
        chosen
            .iter()
            .zip(runs)
            .map(|(c, r)| MinLimitOf {
                policy: c.policy.clone(),
                env: c.env.clone(),
                min_limit_bytes: r.result.ok().and_then(|m| m.min_limit_bytes),
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

/// What the peak's live bytes would have to lose for the setting with the smallest limit to
/// fit under `limit`, and the sites (by function, at the peak of live bytes) that hold them.
fn shrink_for(
    loaded: &Loaded,
    view: &TraceView<'_>,
    min_limits: &[MinLimitOf],
    limit: u64,
) -> Option<Shrink> {
    use allocview_loaders::analysis::site_stats::{GroupBy, by_site};
    let least = min_limits
        .iter()
        .filter_map(|m| Some((m, m.min_limit_bytes?)))
        .min_by_key(|&(_, b)| b)?;
    let bytes = least.1.saturating_sub(limit);
    let sites = crate::session::input::sites_of(loaded)?;
    let (_, peak) = view.peak_live();
    let mut rows = by_site(view, &sites, peak, GroupBy::Function);
    rows.sort_by_key(|r| std::cmp::Reverse(r.live_bytes));
    let mut held = 0u64;
    let mut chosen = Vec::new();
    for r in rows.into_iter().take(10) {
        if held >= bytes {
            break;
        }
        let shrink_bytes = r.live_bytes.min(bytes - held);
        held += r.live_bytes;
        chosen.push(ShrinkSite {
            site: r.name,
            live_bytes: r.live_bytes,
            shrink_bytes,
        });
    }
    Some(Shrink {
        policy: least.0.policy.clone(),
        bytes,
        sites: chosen,
    })
}

/// The keys a candidate changes, with their values.
pub(super) type Changes = Vec<(String, String)>;

/// What [`drive`] found: the default's replay, every candidate best first, the keys left out.
pub(super) struct Searched {
    pub(super) default: Candidate,
    pub(super) candidates: Vec<Candidate>,
    pub(super) pruned: Vec<String>,
}

/// The search both kinds of family share: the default, then each of `keys`' values alone
/// (`run` replays sets of changed keys), the keys whose values are all `same` as the default
/// left out, the rest in every combination (at most `max_combinations`), ranked.
pub(super) fn drive(
    keys: &[(&'static str, Vec<&'static str>)],
    run: &mut dyn FnMut(&[Changes]) -> Result<Vec<Candidate>>,
    same: &dyn Fn(&Candidate, &Candidate) -> bool,
    max_combinations: usize,
    limited: bool,
) -> Result<Searched> {
    let default = run(&[Vec::new()])?.remove(0);
    let singles: Vec<Vec<(String, String)>> = keys
        .iter()
        .flat_map(|(k, vs)| vs.iter().map(|v| vec![((*k).to_owned(), (*v).to_owned())]))
        .collect();
    let single_runs = run(&singles)?;
    let (mut kept, mut pruned) = (Vec::new(), Vec::new());
    for (k, vs) in keys {
        let runs: Vec<&Candidate> = single_runs
            .iter()
            .filter(|c| c.changed.first().is_some_and(|(ck, _)| ck == k))
            .collect();
        if runs.iter().all(|c| same(c, &default)) {
            pruned.push((*k).to_owned());
        } else {
            kept.push((*k, best_values(vs, &runs)));
        }
    }
    let mut combos: Vec<Vec<(String, String)>> = combinations(&kept)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    combos.truncate(max_combinations);
    let combo_runs = run(&combos)?;
    let mut candidates: Vec<Candidate> = std::iter::once(default.clone())
        .chain(single_runs)
        .chain(combo_runs)
        .collect();
    rank(&mut candidates, limited);
    Ok(Searched {
        default,
        candidates,
        pruned,
    })
}

/// How well a one-key replay did, least best: failed, its first OOM's event (later is
/// better), its peak footprint.
type Score = (bool, std::cmp::Reverse<usize>, u64);

/// A key's values, best first by how their one-key replays did ([`combinations`] keeps the
/// first two when every value of every key would make too many).
fn best_values(values: &[&'static str], runs: &[&Candidate]) -> Vec<&'static str> {
    let mut ranked: Vec<(&'static str, Score)> = values
        .iter()
        .map(|&v| {
            let c = runs
                .iter()
                .find(|c| c.changed.first().is_some_and(|(_, cv)| cv == v));
            let score = c.map_or((false, std::cmp::Reverse(0), u64::MAX), |c| {
                (
                    !c.fits,
                    std::cmp::Reverse(c.first_oom_event.unwrap_or(usize::MAX)),
                    c.peak_footprint_bytes,
                )
            });
            (v, score)
        })
        .collect();
    ranked.sort_by_key(|(_, s)| *s);
    ranked.into_iter().map(|(v, _)| v).collect()
}

/// Every combination of the kept keys (each set or left at its default), cut to at most
/// [`MAX_COMBINATIONS`] by keeping each key's best values first.
fn combinations(kept: &[(&'static str, Vec<&'static str>)]) -> Vec<Vec<(String, String)>> {
    let total: usize = kept
        .iter()
        .map(|(_, vs)| vs.len() + 1)
        .try_fold(1usize, usize::checked_mul)
        .unwrap_or(usize::MAX);
    let per_key: Vec<(&str, &[&str])> = kept
        .iter()
        .map(|(k, vs)| {
            let n = if total > MAX_COMBINATIONS {
                vs.len().min(2)
            } else {
                vs.len()
            };
            (*k, vs.get(..n).unwrap_or(vs))
        })
        .collect();
    let mut out: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (k, vs) in per_key {
        let mut next = Vec::with_capacity(out.len() * (vs.len() + 1));
        for c in &out {
            next.push(c.clone());
            for v in vs {
                let mut with = c.clone();
                with.push((k.to_owned(), (*v).to_owned()));
                next.push(with);
            }
        }
        out = next;
        out.truncate(MAX_COMBINATIONS);
    }
    out
}

/// Replays every set of changed keys (`jobs` at a time), each stopping at its first OOM.
fn replay_all(
    view: &TraceView<'_>,
    family: &'static str,
    base: &[(String, String)],
    sets: &[Vec<(String, String)>],
    config: &PolicyConfig,
    jobs: usize,
) -> Result<Vec<Candidate>> {
    let specs: Vec<PolicySpec> = sets
        .iter()
        .map(|changed| {
            let text = std::iter::once(family.to_owned())
                .chain(base.iter().chain(changed).map(|(k, v)| format!("{k}={v}")))
                .collect::<Vec<_>>()
                .join(":");
            PolicySpec::parse(&text).map_err(anyhow::Error::from)
        })
        .collect::<Result<_>>()?;
    let results = per_spec(&specs, jobs, |spec| {
        let cfg = spec.apply(config).map_err(|e| e.to_string())?;
        let policy = registry::build(spec.name, &cfg, view).map_err(|e| e.to_string())?;
        Ok(run_until_failure(view, policy, cfg.align_bytes))
    });
    sets.iter()
        .zip(specs.iter().zip(results))
        .map(|(changed, (spec, (_, result)))| {
            let run = result.map_err(anyhow::Error::msg)?;
            let fits = run.first_failure.is_none();
            Ok(Candidate {
                policy: spec.label(),
                changed: changed.clone(),
                env: env_line(family, changed),
                fits,
                first_oom_event: run.first_failure,
                ooms: u64::from(!fits),
                peak_footprint_bytes: run.peak_footprint_bytes,
                headroom_bytes: config
                    .limit_bytes
                    .filter(|_| fits)
                    .map(|l| l.saturating_sub(run.peak_footprint_bytes)),
            })
        })
        .collect()
}

/// Best first: those that fit; then, under a limit, the fewest keys changed; then the lowest
/// peak footprint (and, among those that fail, the latest first OOM).
fn rank(candidates: &mut [Candidate], limited: bool) {
    candidates.sort_by_key(|c| {
        (
            !c.fits,
            if limited { c.changed.len() } else { 0 },
            std::cmp::Reverse(c.first_oom_event.unwrap_or(usize::MAX)),
            c.peak_footprint_bytes,
            c.changed.len(),
            c.policy.clone(),
        )
    });
}
