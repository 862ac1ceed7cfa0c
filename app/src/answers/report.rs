//! What `report` draws, replayed once for its CSVs and charts and for its HTML page (and the
//! Python package's notebook view of that page): every policy's replay, the real allocators'
//! rows, the size classes, and each policy's heap at the peak of live bytes.

use std::path::Path;

use allocview_loaders::Loaded;
use allocview_sim::classes::ClassSeries;
use allocview_sim::heap::Counters;
use allocview_sim::policy::Policy;
use allocview_sim::replay::Replay;
use allocview_sim::series::Series;
use allocview_sim::trace::TraceView;
use anyhow::{Result, anyhow};

use crate::answers::compare::Row;
use crate::session::PolicyArgs;
use crate::session::policies::{config_for_input, with_predictive_features};
use crate::session::runs::{PolicyRun, max_live_bytes, run_policies};

/// Time buckets of the report's series and size classes.
pub const BUCKETS: usize = 1024;

/// The replays of a report: borrowed by [`replayed`] and [`states_at`].
pub struct Replays {
    pub runs: Vec<PolicyRun>,
    /// The real allocators' rows and measured series (`real-glibc`, ...).
    pub real: Vec<(Row, Series)>,
    pub classes: ClassSeries,
    pub max_live: u64,
    /// The first event at the peak of live bytes, where the heap maps are drawn.
    pub peak_event: usize,
    /// How many replays or seeks run at once.
    pub jobs: usize,
}

/// Replays `loaded`'s events (`view`, read from `path`) through the policies `policies` names.
///
/// # Errors
/// When a policy named explicitly cannot run or a real allocator's replay fails.
pub fn replay(
    path: &Path,
    loaded: &Loaded,
    view: &TraceView<'_>,
    policies: &PolicyArgs,
) -> Result<Replays> {
    let (specs, real_specs) = policies.specs_and_real()?;
    let config = config_for_input(loaded, policies.config()?);
    // The features `compare` gives `predictive` (each thread's calls, the sites).
    let config = with_predictive_features(config, &specs, loaded, view, path)?;
    let jobs = policies.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let runs = run_policies(view, &specs, &config, jobs);
    let real = crate::answers::compare::real_rows(loaded, path, view, &real_specs)?;
    let bucketing = allocview_sim::series::Bucketing::for_trace(view, BUCKETS);
    Ok(Replays {
        runs,
        real,
        classes: ClassSeries::build(view, bucketing, 16_384),
        max_live: max_live_bytes(view),
        peak_event: view.peak_live().1,
        jobs,
    })
}

/// The policies that replayed (the others are noted on stderr); an error when none did and
/// no real allocator row (`others`) is to be drawn either.
///
/// # Errors
/// When nothing replayed.
pub fn replayed(runs: &[PolicyRun], others: bool) -> Result<Vec<(&str, &Replay)>> {
    let done: Vec<(&str, &Replay)> = runs
        .iter()
        .filter_map(|r| match &r.result {
            Ok(rep) => Some((r.name.as_str(), rep)),
            Err(e) => {
                eprintln!("note: skipping {}: {e}", r.name);
                None
            }
        })
        .collect();
    if done.is_empty() && !others {
        return Err(anyhow!("no policy could be replayed"));
    }
    Ok(done)
}

/// Each replay's state just after `event`, `jobs` at a time: the replays keep no checkpoints
/// but their first state (`run_policies`), so each seek replays from the start, and the seeks
/// share the cores as the replays did.
///
/// # Errors
/// When a replay cannot be sought to `event`.
pub fn states_at(
    done: &[(&str, &Replay)],
    view: &TraceView<'_>,
    event: usize,
    jobs: usize,
) -> Result<Vec<(Box<dyn Policy>, Counters)>> {
    let mut heaps = Vec::with_capacity(done.len());
    for chunk in done.chunks(jobs.max(1)) {
        let found: Vec<Result<_>> = std::thread::scope(|s| {
            let seeks: Vec<_> = chunk
                .iter()
                .map(|&(name, rep)| {
                    s.spawn(move || {
                        rep.state_at(view, event)
                            .map_err(|e| anyhow!("{name}: seeking to event {event}: {e}"))
                    })
                })
                .collect();
            seeks
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow!("a seek's thread panicked")))
                })
                .collect()
        });
        for heap in found {
            heaps.push(heap?);
        }
    }
    Ok(heaps)
}
