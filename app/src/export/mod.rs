//! What allocview knows, in other tools' formats: pprof's `profile.proto`, speedscope's
//! JSON, Chrome's Trace Event JSON (Perfetto) and DHAT's JSON. `export` writes them; what
//! each keeps and loses is in `docs/src/guide/other-tools.md`.
//!
//! pprof and speedscope hold the heap at one moment ([`moment`]); DHAT holds the whole run
//! (or window) by allocation site; Chrome's trace holds every policy's bucketed series, so
//! its size does not grow with the input's events.

pub mod chrome;
pub mod dhat;
pub mod moment;
pub mod pprof;
mod proto;
pub mod speedscope;

use std::path::Path;
use std::sync::atomic::AtomicU64;

use allocview_loaders::Loaded;
use allocview_loaders::analysis::profile_sites::ProfileMoment;
use allocview_loaders::profile::HeapProfile;
use anyhow::{Context as _, Result, bail};

use crate::answers::compare::{CompareOptions, evaluate};
use crate::answers::recorded_memory::samples_of;
use crate::answers::sites::resolve_at;
use crate::session::PolicyArgs;
use crate::session::input::sites_of;
use crate::session::policies::{events_and_threads, tids_of};

/// The formats `export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// pprof's `profile.proto`, gzipped (`go tool pprof`, Pyroscope, Parca, Perfetto).
    Pprof,
    /// speedscope's JSON file format.
    Speedscope,
    /// Chrome's Trace Event JSON (Perfetto's UI, `chrome://tracing`).
    Chrome,
    /// DHAT's JSON, version 2 (Valgrind's `dh_view.html`, the Firefox Profiler).
    Dhat,
}

impl Format {
    /// The format an output's name implies, where it implies one.
    #[must_use]
    pub fn from_output_name(path: &Path) -> Option<Self> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let ends = |s: &str| name.ends_with(s);
        if ends(".pb.gz") || ends(".pprof") || ends(".pb") || ends(".prof") {
            Some(Self::Pprof)
        } else if ends(".speedscope.json") {
            Some(Self::Speedscope)
        } else if ends(".dhat.json") || ends("dhat-heap.json") || ends(".dhat") {
            Some(Self::Dhat)
        } else if ends(".trace.json") || ends(".perfetto.json") || ends(".chrome.json") {
            Some(Self::Chrome)
        } else {
            None
        }
    }

    /// The name `--to` takes.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Pprof => "pprof",
            Self::Speedscope => "speedscope",
            Self::Chrome => "chrome",
            Self::Dhat => "dhat",
        }
    }
}

/// What an export is asked, besides the input.
#[derive(Clone, Debug)]
pub struct ExportQuery {
    pub format: Format,
    /// The moment (pprof, speedscope): `peak`, `end`, an event number or a time.
    pub at: String,
    /// The policies: one for pprof's and speedscope's allocated and pinned free bytes; those
    /// of the Chrome trace's tracks (default: `compare`'s).
    pub policies: PolicyArgs,
    /// The input was loaded as a window.
    pub windowed: bool,
    /// pprof: keep the frames inside each sample's site.
    pub all_frames: bool,
}

/// The exported file's bytes and a line saying what it holds.
pub struct Exported {
    pub bytes: Vec<u8>,
    pub summary: String,
}

/// Exports `loaded`, read from `path`, as `query` asks.
///
/// # Errors
/// When the input has no events, the moment or a policy is not understood, or a policy
/// cannot replay the input.
pub fn export(path: &Path, loaded: &Loaded, query: &ExportQuery) -> Result<Exported> {
    if let Loaded::HeapProfile(p) = loaded {
        return export_profile(path, p, query);
    }
    let (view, threads) = events_and_threads(loaded, path, "export")?;
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    match query.format {
        Format::Pprof | Format::Speedscope => {
            let policy = match query.policies.policy.as_slice() {
                [] => None,
                [one] if !one.contains(',') => Some(one.as_str()),
                _ => bail!(
                    "--policy: a {} export holds one policy's allocated and pinned free bytes; \
                     name one",
                    query.format.name()
                ),
            };
            let sites = sites_of(loaded).context("this input has no allocations")?;
            let at = resolve_at(&query.at, &view)?;
            let m = moment::moment_at(loaded, &view, &sites, &threads, at, policy)?;
            let when = format!(
                "event {} (t = {})",
                crate::format::count(m.at as u64),
                crate::format::seconds_fixed(m.since_start_ns as f64 / 1e9)
            );
            let live: u64 = m.samples.iter().map(|(_, t)| t.inuse_bytes).sum();
            // Sampled stacks: the samples' figures are estimates; the summary and the
            // profile's comment say so.
            let estimated = sites
                .sampling()
                .map_or_else(String::new, |s| format!("; {}", s.note()));
            let summary = format!(
                "{} samples, {} live at {when}{estimated}",
                crate::format::count(m.samples.len() as u64),
                crate::format::bytes(live)
            );
            let bytes = if query.format == Format::Pprof {
                let tids = tids_of(loaded);
                let input = pprof::PprofInput {
                    stacks: &sites.stacks,
                    thread_ids: &tids,
                    comment: format!("allocview export of {name} at {when}{estimated}"),
                    all_frames: query.all_frames,
                };
                pprof::write(&m, &input)?
            } else {
                let doc =
                    speedscope::write(&m, &sites.stacks, &format!("{name} at {when}{estimated}"));
                serde_json::to_vec(&doc)?
            };
            Ok(Exported { bytes, summary })
        }
        Format::Dhat => {
            let sites = sites_of(loaded).context("this input has no allocations")?;
            let doc = dhat::write(&view, &sites, &name);
            let points = doc["pps"].as_array().map_or(0, Vec::len);
            Ok(Exported {
                bytes: serde_json::to_vec(&doc)?,
                summary: format!(
                    "{} program points over {} events",
                    crate::format::count(points as u64),
                    crate::format::count(view.len() as u64)
                ),
            })
        }
        Format::Chrome => {
            let opts = CompareOptions {
                policies: query.policies.clone(),
                from_start: false,
                no_guidance: false,
                min_limit: false,
                windowed: query.windowed,
            };
            let compared = evaluate(path, &opts, loaded, true, &AtomicU64::new(0))?;
            let (memory, _) = samples_of(loaded);
            let doc = chrome::write(&compared, loaded, &view, memory, &name)?;
            let n = doc["traceEvents"].as_array().map_or(0, Vec::len);
            Ok(Exported {
                bytes: serde_json::to_vec(&doc)?,
                summary: format!(
                    "{} trace events for {} policies",
                    crate::format::count(n as u64),
                    compared.rows.len()
                ),
            })
        }
    }
}

/// Exports a heap profile: its moment as pprof or speedscope, its sites as DHAT's; a Chrome
/// trace needs a timeline it does not have.
fn export_profile(path: &Path, p: &HeapProfile, query: &ExportQuery) -> Result<Exported> {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    if !query.policies.policy.is_empty() {
        bail!(
            "--policy: {} is a heap profile, a moment with no events to replay through a policy",
            path.display()
        );
    }
    let moment = ProfileMoment::parse(&query.at, p).map_err(|e| anyhow::anyhow!(e))?;
    let m = moment::of_profile(p, moment);
    let summary = format!(
        "{} samples, {} live at the profile's {}",
        crate::format::count(m.samples.len() as u64),
        crate::format::bytes(m.samples.iter().map(|(_, t)| t.inuse_bytes).sum()),
        if moment == ProfileMoment::Peak {
            "peak"
        } else {
            "moment"
        }
    );
    let bytes = match query.format {
        Format::Pprof => pprof::write(
            &m,
            &pprof::PprofInput {
                stacks: &p.stacks,
                thread_ids: &[],
                comment: format!("allocview export of the {} profile {name}", p.format.name()),
                all_frames: query.all_frames,
            },
        )?,
        Format::Speedscope => serde_json::to_vec(&speedscope::write(&m, &p.stacks, &name))?,
        Format::Dhat => serde_json::to_vec(&dhat::of_profile(p, &name))?,
        Format::Chrome => bail!(
            "{} is a heap profile, a moment without a timeline: a Chrome trace has nothing to \
             draw (pprof, speedscope and dhat hold a moment)",
            path.display()
        ),
    };
    Ok(Exported { bytes, summary })
}
