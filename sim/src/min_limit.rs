//! The smallest memory limit under which a policy serves every allocation of a trace.
//!
//! How it is found depends on whether the limit steers the policy or only stops it:
//!
//! - **The limit is only a gate** (`first-fit`, `best-fit`, `buddy`, `pool`, `oracle`, and
//!   `pytorch` replaying a snapshot's script, where the limit is not applied): before growing,
//!   the policy asks whether the footprint would pass the limit and, if so, fails the request;
//!   nothing else reads the limit. A run without a failure under a limit therefore makes
//!   exactly the decisions of the unlimited run, so the answer is the peak footprint of one
//!   unlimited replay ([`Method::UnlimitedPeak`]): at it every growth passes, one byte less
//!   refuses the growth that reached the peak. (The script replay of `pytorch` applies no
//!   limit at all, so every limit "works"; its peak, the memory the recorded run held, is the
//!   figure that answers "how much does it need".)
//! - **The limit steers the policy** (`bfc`: with `allow_growth` each new region is capped by
//!   what the limit leaves, without it the one region is the limit; `glibc`: an mmap the limit
//!   refuses falls back to the heap top, which may still have room; `pytorch`: a cudaMalloc the
//!   limit refuses releases cached segments and retries, and a garbage-collection threshold is
//!   a fraction of the limit): a search ([`Method::Search`]). Every limit below the trace's
//!   peak live bytes fails (a footprint holds at least the live bytes), and the unlimited run's
//!   peak footprint is the first upper guess (doubled until a run there succeeds). Bisection
//!   between the two finds a limit that works whose predecessor fails. Nothing in these
//!   policies promises monotonicity (a larger limit can make BFC take a larger region that
//!   later blocks another), so the search then probes evenly spaced limits below the answer
//!   (a probe that works restarts the bisection below it) and above it (a probe that fails is
//!   reported as [`MinLimit::larger_limit_failing`]). The tests compare the search with brute
//!   force on small traces.
//!
//! Where the policy's footprint only ever moves in whole units, the limit only matters in those
//! units and the answer is a multiple of one, so the search runs over multiples
//! ([`limit_granule_bytes`]): glibc's heap and mappings are whole 4 KiB pages, PyTorch's
//! cudaMalloc segments whole 2 MiB (without expandable segments or a garbage-collection
//! threshold, which read the limit itself). A failure ends a replay early, so a search costs a
//! few dozen partial replays.

use std::collections::BTreeMap;

use crate::policy::Policy;
use crate::policy::config::{PolicyConfig, RegistryError};
use crate::policy::registry;
use crate::replay::{FAILED, apply};
use crate::trace::TraceView;

/// How a minimum was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// The peak footprint of one unlimited replay.
    UnlimitedPeak,
    /// Bisection on the limit, with monotonicity probes.
    Search,
}

impl Method {
    /// Stable name for JSON and tables.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::UnlimitedPeak => "unlimited-peak",
            Self::Search => "search",
        }
    }
}

/// The smallest limit without a failed allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MinLimit {
    /// `None` when no limit works (requests the policy cannot serve at all).
    pub min_limit_bytes: Option<u64>,
    pub method: Method,
    /// Replays run (each stops at its first failure).
    pub replays: u32,
    /// A limit above the answer at which the policy fails all the same, if a probe found one.
    pub larger_limit_failing: Option<u64>,
}

/// The outcome of [`run_until_failure`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Index of the first failed allocation, if any.
    pub first_failure: Option<usize>,
    /// Highest footprint up to the end of the run (or the failure).
    pub peak_footprint_bytes: u64,
}

/// Replays `trace` through `policy` and stops at the first allocation it fails.
#[must_use]
pub fn run_until_failure(
    trace: &TraceView<'_>,
    mut policy: Box<dyn Policy>,
    align_bytes: u64,
) -> Run {
    let mut addrs: Vec<u64> = vec![FAILED; trace.num_allocs as usize];
    let mut peak = policy.counters().footprint_bytes;
    let events = trace.kind.iter().zip(trace.alloc_id).zip(trace.size_bytes);
    for (i, ((&code, &id), &size)) in events.enumerate() {
        match apply(policy.as_mut(), code, id, id, size, align_bytes, &addrs[..]) {
            Ok(Some(placement)) => {
                if let Some(slot) = addrs.get_mut(id as usize) {
                    *slot = placement.addr;
                }
            }
            Ok(None) => {}
            // A rejected free is a policy bug, not memory running out: it counts as a failure
            // so that no limit is reported as working for a broken run.
            Err(_) => {
                return Run {
                    first_failure: Some(i),
                    peak_footprint_bytes: peak,
                };
            }
        }
        peak = peak.max(policy.counters().footprint_bytes);
    }
    Run {
        first_failure: None,
        peak_footprint_bytes: peak,
    }
}

/// Whether the limit steers `name`'s decisions (see the module docs) rather than only gating
/// its growth.
#[must_use]
pub fn limit_steers(name: &str, config: &PolicyConfig) -> bool {
    match name {
        "bfc" | "glibc" => true,
        "pytorch" => config.pytorch_script.is_none(),
        _ => false,
    }
}

/// The step in which `name`'s limit matters: its footprint and every growth it asks the limit
/// about are multiples of it, so a limit works exactly when its multiple below does.
#[must_use]
pub fn limit_granule_bytes(name: &str, config: &PolicyConfig) -> u64 {
    match name {
        "glibc" => crate::policy::glibc::PAGE_BYTES,
        "pytorch"
            if !config.pytorch.expandable_segments
                && config.pytorch.garbage_collection_threshold_ppm == 0 =>
        {
            // Segments are 2 MiB (small pool), 20 MiB, or a large request rounded up to 2 MiB.
            crate::policy::pytorch::constants::SMALL_BUFFER_BYTES
        }
        _ => 1,
    }
}

/// The smallest limit at which policy `name` (with `config`, whose own limit is ignored)
/// replays `trace` without a failed allocation.
///
/// # Errors
/// When the policy cannot be built even without a limit.
pub fn min_limit(
    trace: &TraceView<'_>,
    name: &str,
    config: &PolicyConfig,
) -> Result<MinLimit, RegistryError> {
    let align = config.align_bytes;
    let with_limit = |limit_bytes| PolicyConfig {
        limit_bytes,
        ..config.clone()
    };
    let unlimited = run_until_failure(
        trace,
        registry::build(name, &with_limit(None), trace)?,
        align,
    );
    if !limit_steers(name, config) {
        return Ok(MinLimit {
            min_limit_bytes: unlimited
                .first_failure
                .is_none()
                .then_some(unlimited.peak_footprint_bytes),
            method: Method::UnlimitedPeak,
            replays: 1,
            larger_limit_failing: None,
        });
    }
    let peak_live = trace.peak_live().0;
    let granule = limit_granule_bytes(name, config);
    // The search counts in granules: `k` stands for the limit `k × granule`.
    let works = |k: u64| -> Result<bool, RegistryError> {
        let Some(limit) = k.checked_mul(granule) else {
            return Ok(false);
        };
        // A limit the policy refuses outright does not work.
        Ok(registry::build(name, &with_limit(Some(limit)), trace)
            .is_ok_and(|p| run_until_failure(trace, p, align).first_failure.is_none()))
    };
    let found = search(
        peak_live.checked_sub(1).map(|f| f / granule),
        unlimited
            .peak_footprint_bytes
            .max(peak_live)
            .div_ceil(granule),
        works,
    )?;
    Ok(MinLimit {
        min_limit_bytes: found.min_limit_bytes.and_then(|k| k.checked_mul(granule)),
        method: Method::Search,
        replays: found.replays + 1,
        larger_limit_failing: found
            .larger_limit_failing
            .map(|k| k.saturating_mul(granule)),
    })
}

/// The result of [`search`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Search {
    pub min_limit_bytes: Option<u64>,
    pub replays: u32,
    pub larger_limit_failing: Option<u64>,
}

/// Evenly spaced probes on each side of a bisection's answer.
const PROBES: u64 = 8;
/// Bisections restarted below a working probe before the search settles.
const MAX_ROUNDS: u32 = 4;

/// `works`, remembering every answer (a limit is never replayed twice).
struct Memo<F> {
    works: F,
    tried: BTreeMap<u64, bool>,
}

impl<E, F: FnMut(u64) -> Result<bool, E>> Memo<F> {
    fn test(&mut self, limit: u64) -> Result<bool, E> {
        if let Some(&r) = self.tried.get(&limit) {
            return Ok(r);
        }
        let r = (self.works)(limit)?;
        self.tried.insert(limit, r);
        Ok(r)
    }

    /// The highest limit below `hi` known to fail, if any.
    fn failing_below(&self, hi: u64) -> Option<u64> {
        self.tried
            .range(..hi)
            .rev()
            .find(|&(_, &ok)| !ok)
            .map(|(&l, _)| l)
    }

    /// Bisection between a failing limit (`None`: below 0) and the working `hi`: a working
    /// limit whose predecessor fails.
    fn bisect(&mut self, known_failing: Option<u64>, mut hi: u64) -> Result<u64, E> {
        let mut lo = self.failing_below(hi).max(known_failing);
        loop {
            let next = match lo {
                None if hi == 0 => return Ok(0),
                None => 0,
                Some(l) if hi - l <= 1 => return Ok(hi),
                Some(l) => l + (hi - l) / 2,
            };
            if self.test(next)? {
                hi = next;
            } else {
                lo = Some(next);
            }
        }
    }
}

/// `PROBES` limits spread evenly over `[from, to)`, lowest first.
fn spaced(from: u64, to: u64) -> Vec<u64> {
    if to <= from {
        return Vec::new();
    }
    let span = u128::from(to - from);
    let mut out: Vec<u64> = (0..PROBES)
        .filter_map(|k| u64::try_from(u128::from(k) * span / u128::from(PROBES)).ok())
        .map(|d| from + d)
        .collect();
    out.dedup();
    out
}

/// Finds the smallest limit for which `works` holds: `known_failing` is a limit known to fail
/// (`None`: even 0 is untested), `first_guess` the first upper bound to try. See the module
/// docs for the bisection and the probes.
///
/// # Errors
/// The first error of `works`.
pub fn search<E>(
    known_failing: Option<u64>,
    first_guess: u64,
    works: impl FnMut(u64) -> Result<bool, E>,
) -> Result<Search, E> {
    let mut memo = Memo {
        works,
        tried: BTreeMap::new(),
    };
    let floor = known_failing.map_or(0, |f| f.saturating_add(1));
    let mut hi = first_guess.max(floor);
    while !memo.test(hi)? {
        if hi == u64::MAX {
            return Ok(Search {
                min_limit_bytes: None,
                replays: memo.tried.len() as u32,
                larger_limit_failing: None,
            });
        }
        hi = hi.saturating_mul(2).max(1);
    }
    let top = hi;
    for _ in 0..MAX_ROUNDS {
        hi = memo.bisect(known_failing, hi)?;
        let mut lower = None;
        for p in spaced(floor, hi) {
            if memo.test(p)? {
                lower = Some(p);
                break;
            }
        }
        match lower {
            Some(p) => hi = p,
            None => break,
        }
    }
    // A working probe found in the last round still needs its own bisection.
    hi = memo.bisect(known_failing, hi)?;
    let mut larger_limit_failing = None;
    for p in spaced(hi.saturating_add(1), top) {
        if !memo.test(p)? {
            larger_limit_failing = Some(p);
            break;
        }
    }
    Ok(Search {
        min_limit_bytes: Some(hi),
        replays: memo.tried.len() as u32,
        larger_limit_failing,
    })
}
