//! `predictive`: best fit in two arenas, one for blocks predicted to die young and one for the
//! rest (lifetime-class segregation, as Google's LLAMA and TCMalloc's lifetime-based allocator).
//!
//! Each request is first classed *short* or *long* lived. Short means freed before 64 more
//! allocations are made (the allocation clock; `short_allocs=N` changes it); never-freed blocks
//! are long. The class comes from an online learner trained causally as the trace replays
//! ([`crate::predict::lifetime::LifetimeLearner`]): at allocation time it knows the size class,
//! the allocating thread's last two heap calls and the allocation site where the trace has one,
//! and it learns a block's class the moment it is known (its free, or the 64th allocation that
//! finds it still live). With `lifetimes=true` the class is the block's true one, read from the
//! trace's future as `oracle` does: the upper bound of what prediction can give.
//!
//! Short blocks go to a best-fit arena of their own, long ones to another (each a `best-fit`
//! heap: smallest fitting hole, lowest address on ties, coalescing, the top trimmed), so the
//! holes that short-lived blocks leave are not pinned by long-lived neighbours. A short block
//! that finds no hole in its arena borrows one of the long arena before its own grows (it will
//! leave soon, so the hole comes back); a long block never takes the short arena's holes. The
//! long arena starts at address 0 and the short one at [`SHORT_BASE`] (16 TiB, like glibc's
//! mmap area here); the footprint is the sum of the two heaps. Under a limit each arena may grow
//! only into what the other leaves, and a request that fits nowhere else tries the other arena
//! before failing. Costs: best fit's per operation, plus three hash look-ups to predict and O(1)
//! amortised learning.

use std::any::Any;
use std::sync::Arc;

use super::Policy;
use super::best_fit::BestFit;
use super::config::PolicyConfig;
use crate::heap::{Addr, AllocError, Block, Counters, FreeError, Placement, Request};
use crate::predict::lifetime::{AllocFeatures, LifetimeLearner, true_short};
use crate::predict::streamed::{StreamedFeatures, streamed_keys};
use crate::predict::truth_tap::StreamedTruth;
use crate::trace::TraceView;

/// Base address of the short-lived arena.
pub const SHORT_BASE: Addr = 1 << 44;

const LONG: usize = 0;
const SHORT: usize = 1;

/// Requests placed in each arena, by the class they were given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassCounts {
    pub short: u64,
    pub long: u64,
    /// Requests served by the other arena because theirs was full (under a limit).
    pub spilled: u64,
}

/// Where the features of the allocations come from.
#[derive(Clone, Debug)]
enum Features {
    /// Computed for the whole trace beforehand.
    Whole(Arc<AllocFeatures>),
    /// Queued as a streamed replay's events come (no sites). Clones share the queue and take
    /// from it: only the original may allocate (a streamed replay keeps no checkpoint it
    /// replays from, and its final and first-OOM states are only drawn).
    Streamed(Arc<StreamedFeatures>),
}

/// Where the true classes of `lifetimes=true` come from.
#[derive(Clone, Debug)]
enum Truth {
    /// Per allocation id, from the whole trace.
    Whole(Arc<Vec<bool>>),
    /// Queued as a streamed replay's events come ([`TruthTap`](crate::predict::truth_tap::TruthTap));
    /// only the original may allocate, as with streamed features.
    Streamed(Arc<StreamedTruth>),
}

/// The `predictive` policy; see the module docs.
#[derive(Clone, Debug)]
pub struct Predictive {
    arenas: [BestFit; 2],
    limit_bytes: Option<u64>,
    learner: LifetimeLearner,
    features: Features,
    /// Each allocation's true class (`lifetimes=true` only).
    truth: Option<Truth>,
    classes: ClassCounts,
}

impl Predictive {
    /// The policy for replaying `trace`: features from `config.alloc_features` when they
    /// describe this trace, else from the trace alone (one thread, no sites).
    ///
    /// # Errors
    /// When `align_bytes` is not a power of two or is too wide for best fit.
    pub fn new(trace: &TraceView<'_>, config: &PolicyConfig) -> Result<Self, String> {
        let features = match &config.alloc_features {
            Some(f) if f.recent.len() == trace.num_allocs as usize => Arc::clone(f),
            _ => Arc::new(AllocFeatures::from_trace(trace, None, None)),
        };
        let short_allocs = config.predictive_short_allocs;
        let truth = config
            .predictive_true_lifetimes
            .then(|| Truth::Whole(Arc::new(true_short(trace, short_allocs))));
        Self::with(config, Features::Whole(features), truth)
    }

    /// `lifetimes=true` for a replay that streams its trace through a
    /// [`TruthTap`](crate::predict::truth_tap::TruthTap) queueing the classes in `truth`.
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn streamed_true(config: &PolicyConfig, truth: Arc<StreamedTruth>) -> Result<Self, String> {
        // The learner's features are not used when the classes are known.
        let features = Features::Streamed(Arc::new(StreamedFeatures::default()));
        Self::with(config, features, Some(Truth::Streamed(truth)))
    }

    /// The policy for a replay that streams its trace, its features queued in `features` as
    /// the events come ([`crate::predict::streamed::Tapped`]).
    ///
    /// # Errors
    /// `lifetimes=true`, which reads the trace's future; as [`Self::new`].
    pub fn streamed(
        config: &PolicyConfig,
        features: Arc<StreamedFeatures>,
    ) -> Result<Self, String> {
        if config.predictive_true_lifetimes {
            return Err(
                "lifetimes=true needs the classes of a TruthTap: use Predictive::streamed_true"
                    .to_owned(),
            );
        }
        Self::with(config, Features::Streamed(features), None)
    }

    fn with(
        config: &PolicyConfig,
        features: Features,
        truth: Option<Truth>,
    ) -> Result<Self, String> {
        Ok(Self {
            arenas: [BestFit::new(config)?, BestFit::new(config)?],
            limit_bytes: config.limit_bytes,
            learner: LifetimeLearner::new(config.predictive_short_allocs),
            features,
            truth,
            classes: ClassCounts::default(),
        })
    }

    /// How many requests went to each class so far.
    #[must_use]
    pub fn classes(&self) -> ClassCounts {
        self.classes
    }

    fn base(arena: usize) -> Addr {
        if arena == SHORT { SHORT_BASE } else { 0 }
    }

    fn footprint(&self, arena: usize) -> u64 {
        self.arenas
            .get(arena)
            .map_or(0, |a| a.counters().footprint_bytes)
    }

    /// Lets `arena` grow into what the other one leaves of the limit (the long arena also
    /// stops short of the short one's addresses), or not grow at all.
    fn set_room(&mut self, arena: usize, grow: bool) {
        let other = self.footprint(1 - arena);
        let mut room = self.limit_bytes.map(|l| l.saturating_sub(other));
        if arena == LONG {
            room = Some(room.map_or(SHORT_BASE, |r| r.min(SHORT_BASE)));
        }
        if !grow {
            let top = self.footprint(arena);
            room = Some(room.map_or(top, |r| r.min(top)));
        }
        if let Some(a) = self.arenas.get_mut(arena) {
            a.set_limit(room);
        }
    }
}

impl Policy for Predictive {
    fn name(&self) -> &'static str {
        "predictive"
    }

    fn alloc(&mut self, req: Request) -> Result<Placement, AllocError> {
        let keys = match &self.features {
            Features::Whole(f) => AllocFeatures::keys(Some(f), req.id, req.size_bytes),
            Features::Streamed(f) => streamed_keys(f, req.id, req.size_bytes),
        };
        let short = match &self.truth {
            Some(Truth::Whole(t)) => t.get(req.id as usize).copied().unwrap_or(false),
            Some(Truth::Streamed(t)) => t.take(req.id),
            None => self.learner.predict_short(keys),
        };
        let preferred = if short { SHORT } else { LONG };
        // (arena, may it grow): a short-lived block may borrow a hole of the long arena before
        // its own grows (it leaves soon); a long-lived one never pins a hole of the short arena
        // unless the limit leaves nothing else.
        let attempts: &[(usize, bool)] = if short {
            &[(SHORT, false), (LONG, false), (SHORT, true), (LONG, true)]
        } else {
            &[(LONG, true), (SHORT, true)]
        };
        for &(arena, grow) in attempts {
            self.set_room(arena, grow);
            let Some(heap) = self.arenas.get_mut(arena) else {
                continue;
            };
            match heap.alloc(req) {
                Ok(p) => {
                    let addr = p.addr + Self::base(arena);
                    if self.truth.is_none() {
                        self.learner.admit(addr, keys);
                    }
                    if short {
                        self.classes.short += 1;
                    } else {
                        self.classes.long += 1;
                    }
                    self.classes.spilled += u64::from(arena != preferred);
                    return Ok(Placement {
                        addr,
                        reserved_bytes: p.reserved_bytes,
                    });
                }
                Err(AllocError::OutOfMemory { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let c = self.counters();
        Err(AllocError::OutOfMemory {
            requested_bytes: req.size_bytes,
            largest_free_bytes: c.largest_free_bytes,
            footprint_bytes: c.footprint_bytes,
            limit_bytes: self.limit_bytes,
        })
    }

    fn free(&mut self, addr: Addr) -> Result<(), FreeError> {
        let arena = if addr >= SHORT_BASE { SHORT } else { LONG };
        let heap = self
            .arenas
            .get_mut(arena)
            .ok_or(FreeError::UnknownAddr(addr))?;
        heap.free(addr - Self::base(arena))
            .map_err(|_| FreeError::UnknownAddr(addr))?;
        if self.truth.is_none() {
            self.learner.release(addr);
        }
        Ok(())
    }

    fn counters(&self) -> Counters {
        let [a, b] = [self.arenas[LONG].counters(), self.arenas[SHORT].counters()];
        Counters {
            live_allocs: a.live_allocs + b.live_allocs,
            // Each arena's figures fit in 64 bits, their sums need not.
            live_bytes: a.live_bytes.saturating_add(b.live_bytes),
            allocated_bytes: a.allocated_bytes.saturating_add(b.allocated_bytes),
            footprint_bytes: a.footprint_bytes.saturating_add(b.footprint_bytes),
            free_bytes: a.free_bytes.saturating_add(b.free_bytes),
            free_blocks: a.free_blocks + b.free_blocks,
            largest_free_bytes: a.largest_free_bytes.max(b.largest_free_bytes),
        }
    }

    fn blocks(&self, out: &mut Vec<Block>) {
        self.arenas[LONG].blocks(out);
        let from = out.len();
        self.arenas[SHORT].blocks(out);
        for b in out.iter_mut().skip(from) {
            b.addr += SHORT_BASE;
        }
    }

    fn held_up_to_tops(&self, bases: &mut Vec<Addr>) -> bool {
        // Two best-fit heaps, each tiling [its base, its top).
        bases.extend([0, SHORT_BASE]);
        true
    }

    fn shrink_to_fit(&mut self) {
        for a in &mut self.arenas {
            a.shrink_to_fit();
        }
    }

    fn clone_box(&self) -> Box<dyn Policy> {
        Box::new(self.clone())
    }

    fn check_invariants(&self) -> Result<(), String> {
        for (name, a) in [("long", &self.arenas[LONG]), ("short", &self.arenas[SHORT])] {
            a.check_invariants()
                .map_err(|e| format!("{name} arena: {e}"))?;
        }
        if self.footprint(LONG) > SHORT_BASE {
            return Err("the long arena reaches the short one".to_owned());
        }
        let total = self.counters().footprint_bytes;
        if self.limit_bytes.is_some_and(|l| total > l) {
            return Err(format!("footprint {total} B above the limit"));
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::{ReplayOptions, replay};
    use crate::trace::OwnedTrace;

    /// Short-lived blocks of growing size, each followed by a long-lived 10000 B block and
    /// then freed: in one heap the long block lands above the short one (no hole fits it) and
    /// pins its hole, which no later, larger short block fits; apart, the short arena reuses
    /// one range.
    fn interleaved() -> OwnedTrace {
        let mut t = OwnedTrace::new();
        let mut time = 0;
        for i in 0..400 {
            let s = t.alloc(time, 2000 + i * 16);
            t.alloc(time + 1, 10_000);
            t.free(time + 2, s);
            time += 3;
        }
        t
    }

    fn peak(name: &str, config: &PolicyConfig, t: &OwnedTrace) -> u64 {
        let view = t.view().unwrap();
        let policy = crate::policy::registry::build(name, config, &view).unwrap();
        let r = replay(&view, policy, &ReplayOptions::default());
        assert!(r.ooms.is_empty());
        r.summary.peak_footprint_bytes
    }

    #[test]
    fn segregation_beats_best_fit_when_lifetimes_interleave() {
        let t = interleaved();
        let config = PolicyConfig {
            predictive_short_allocs: 4,
            ..PolicyConfig::default()
        };
        let best = peak("best-fit", &config, &t);
        let predicted = peak("predictive", &config, &t);
        let truth = peak(
            "predictive",
            &PolicyConfig {
                predictive_true_lifetimes: true,
                ..config.clone()
            },
            &t,
        );
        // 400 long blocks of 10000 B must stay; the short ones need one range of the largest.
        assert_eq!(truth, 400 * 10_000 + 2000 + 399 * 16);
        assert!(best > truth + 1_000_000, "best fit {best}");
        // Only short blocks met before enough evidence (a few per size class) are misplaced.
        assert!(
            predicted < truth + 100_000,
            "predicted {predicted}, truth {truth}"
        );
    }

    #[test]
    fn short_blocks_live_in_their_own_arena() {
        let t = interleaved();
        let view = t.view().unwrap();
        let config = PolicyConfig {
            predictive_true_lifetimes: true,
            predictive_short_allocs: 4,
            ..PolicyConfig::default()
        };
        let mut p = Predictive::new(&view, &config).unwrap();
        let short = p
            .alloc(Request {
                id: 0,
                size_bytes: 2000,
                align_bytes: 16,
            })
            .unwrap();
        let long = p
            .alloc(Request {
                id: 1,
                size_bytes: 10_000,
                align_bytes: 16,
            })
            .unwrap();
        assert_eq!(short.addr, SHORT_BASE);
        assert_eq!(long.addr, 0);
        assert_eq!(p.counters().footprint_bytes, 2000 + 10_000);
        assert_eq!(
            p.free(SHORT_BASE + 16),
            Err(FreeError::UnknownAddr(SHORT_BASE + 16))
        );
        p.free(short.addr).unwrap();
        assert_eq!(p.counters().footprint_bytes, 10_000);
        p.check_invariants().unwrap();
    }
}
