//! Predicting, at allocation time, whether a block will be short- or long-lived.
//!
//! **Clock and classes.** Time is counted in allocations (what an allocator sees): a block's
//! lifetime is the number of allocations made while it was live. It is *short* when it is freed
//! before [`DEFAULT_SHORT_ALLOCS`] (64) more allocations, else *long* (blocks never freed are
//! long). On the shared traces 64 splits them about 80/20: most blocks die within a few dozen
//! allocations, and the rest live for thousands or to the end.
//!
//! **What is known at allocation time** ([`AllocFeatures`]): the request's size class, the
//! allocating thread's last two tokens (the article's classes, see [`super::tokens`]), and the
//! allocation site where the trace records one (a stack id, a TensorFlow kernel).
//!
//! **Learning, causally.** [`LifetimeLearner`] keeps short/long counts for three contexts, from
//! the most specific: (site, size class), (size class, recent tokens), (size class). A block's
//! label is learnt the moment it is known: *short* when it is freed in time, *long* when the
//! 64th allocation after it finds it still live. A prediction takes the most specific context
//! with at least [`MIN_EVIDENCE`] labelled blocks and says short when most of them were, else the
//! majority label so far.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;

use super::tokens::{alloc_token, token_of};
use crate::policy::pool::AddrHasher;
use crate::trace::{EventKind, NO_ALLOC_ID, TraceView};

/// Default threshold: shorter-lived than this many allocations is short.
pub const DEFAULT_SHORT_ALLOCS: u64 = 64;
/// Labelled blocks a context needs before it is trusted.
pub const MIN_EVIDENCE: u32 = 4;
/// Site of an allocation without one.
pub const NO_SITE: u32 = u32::MAX;

/// The learner's maps: integer keys, nothing adversarial, so a multiplicative hash (the
/// pool's) rather than SipHash.
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<AddrHasher>>;

/// What an allocator knows when allocation `id` is asked for, per dense allocation id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocFeatures {
    /// The allocating thread's last two tokens before the request (6 bits each), with bit 12
    /// set once the thread has two.
    pub recent: Vec<u16>,
    /// The allocation site, or [`NO_SITE`].
    pub site: Vec<u32>,
}

impl AllocFeatures {
    /// The features of every allocation of `trace`, from its past only. `thread` and `site`
    /// are per-event columns (`None`: one thread, no sites).
    #[must_use]
    pub fn from_trace(trace: &TraceView<'_>, thread: Option<&[u16]>, site: Option<&[u32]>) -> Self {
        let n = trace.num_allocs as usize;
        let mut f = Self {
            recent: Vec::with_capacity(n),
            site: Vec::with_capacity(n),
        };
        let mut history: Vec<(u16, u8)> = Vec::new();
        for (i, (&code, &size)) in trace.kind.iter().zip(trace.size_bytes).enumerate() {
            let Some(kind) = EventKind::from_code(code) else {
                continue;
            };
            let t = usize::from(thread.and_then(|th| th.get(i).copied()).unwrap_or(0));
            if t >= history.len() {
                history.resize(t + 1, (0, 0));
            }
            let Some(h) = history.get_mut(t) else {
                continue;
            };
            if kind == EventKind::Alloc {
                f.recent.push(if h.1 >= 2 { h.0 | 1 << 12 } else { h.0 });
                f.site
                    .push(site.and_then(|s| s.get(i).copied()).unwrap_or(NO_SITE));
            }
            if let Some(tok) = token_of(kind, size) {
                h.0 = ((h.0 << 6) | u16::from(tok)) & 0xfff;
                h.1 = h.1.saturating_add(1);
            }
        }
        f
    }

    /// The three context keys of allocation `id` of `size_bytes` (unknown ids: size only).
    #[must_use]
    pub fn keys(features: Option<&Self>, id: u32, size_bytes: u64) -> Keys {
        let class = u64::from(alloc_token(size_bytes));
        let i = id as usize;
        let site = features
            .and_then(|f| f.site.get(i).copied())
            .unwrap_or(NO_SITE);
        let recent = features.and_then(|f| f.recent.get(i).copied());
        Keys([
            (site != NO_SITE).then(|| 1 << 60 | u64::from(site) << 8 | class),
            recent.map(|r| 2 << 60 | u64::from(r) << 8 | class),
            Some(3 << 60 | class),
        ])
    }
}

/// The contexts of one allocation, most specific first (`None`: not available).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Keys(pub [Option<u64>; 3]);

/// A block the learner waits on.
#[derive(Clone, Copy, Debug)]
struct Pending {
    born: u64,
    keys: Keys,
    labelled: bool,
}

/// The online lifetime learner (see the module docs). Blocks are named by a caller's handle
/// (an address in a policy, an allocation id in an evaluation).
#[derive(Clone, Debug)]
pub struct LifetimeLearner {
    short_allocs: u64,
    clock: u64,
    /// `[short, long]` per context key.
    counts: FastMap<u64, [u32; 2]>,
    totals: [u64; 2],
    live: FastMap<u64, Pending>,
    /// Blocks younger than the threshold, oldest first: `(born, handle)`.
    young: VecDeque<(u64, u64)>,
}

impl LifetimeLearner {
    /// A learner with threshold `short_allocs` (at least 1).
    #[must_use]
    pub fn new(short_allocs: u64) -> Self {
        Self {
            short_allocs: short_allocs.max(1),
            clock: 0,
            counts: FastMap::default(),
            totals: [0; 2],
            live: FastMap::default(),
            young: VecDeque::new(),
        }
    }

    /// The threshold in allocations.
    #[must_use]
    pub fn short_allocs(&self) -> u64 {
        self.short_allocs
    }

    /// Whether a block with contexts `keys` is predicted short-lived.
    #[must_use]
    pub fn predict_short(&self, keys: Keys) -> bool {
        for key in keys.0.into_iter().flatten() {
            if let Some(&[s, l]) = self.counts.get(&key)
                && s + l >= MIN_EVIDENCE
            {
                return s > l;
            }
        }
        self.totals[0] > self.totals[1]
    }

    fn label(&mut self, keys: Keys, short: bool) {
        let which = usize::from(!short);
        self.totals[which] += 1;
        for key in keys.0.into_iter().flatten() {
            let c = self.counts.entry(key).or_insert([0, 0]);
            c[which] = c[which].saturating_add(1);
            if c[which] == u32::MAX {
                c[0] /= 2;
                c[1] /= 2;
            }
        }
    }

    /// An allocation happens: blocks that have now lived through the threshold are labelled
    /// long, then the new block `handle` starts its life.
    pub fn admit(&mut self, handle: u64, keys: Keys) {
        while let Some(&(born, h)) = self.young.front() {
            if born + self.short_allocs > self.clock {
                break;
            }
            self.young.pop_front();
            if let Some(p) = self.live.get_mut(&h)
                && p.born == born
                && !p.labelled
            {
                p.labelled = true;
                let k = p.keys;
                self.label(k, false);
            }
        }
        self.live.insert(
            handle,
            Pending {
                born: self.clock,
                keys,
                labelled: false,
            },
        );
        self.young.push_back((self.clock, handle));
        self.clock += 1;
    }

    /// Block `handle` is freed: short unless it was already labelled long.
    pub fn release(&mut self, handle: u64) {
        if let Some(p) = self.live.remove(&handle)
            && !p.labelled
        {
            self.label(p.keys, true);
        }
    }
}

/// Whether each allocation of `trace` is short-lived: freed before `short_allocs` more
/// allocations (the truth the `lifetimes=true` variant is fed, and the predictor is scored on).
#[must_use]
pub fn true_short(trace: &TraceView<'_>, short_allocs: u64) -> Vec<bool> {
    let mut short = vec![false; trace.num_allocs as usize];
    let mut allocs = 0u64;
    for (&code, &id) in trace.kind.iter().zip(trace.alloc_id) {
        if code == EventKind::Alloc as u8 {
            allocs += 1;
        } else if code == EventKind::Free as u8 && id != NO_ALLOC_ID {
            // Allocations made while `id` was live: those after it, up to now.
            let lived = allocs.saturating_sub(u64::from(id) + 1);
            if let Some(s) = short.get_mut(id as usize) {
                *s = lived < short_allocs;
            }
        }
    }
    short
}

/// How well the online learner predicted the trace's lifetimes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LifetimeReport {
    pub short_threshold_allocs: u64,
    pub allocations: u64,
    pub true_short: u64,
    pub predicted_short: u64,
    pub correct: u64,
    pub short_correct: u64,
    /// Right guesses of the causal "majority label so far" rule, for comparison.
    pub baseline_correct: u64,
}

impl LifetimeReport {
    /// Fraction of allocations classed right.
    #[must_use]
    pub fn accuracy(&self) -> Option<f64> {
        (self.allocations > 0).then(|| self.correct as f64 / self.allocations as f64)
    }
    /// Of the blocks predicted short, the fraction that were.
    #[must_use]
    pub fn short_precision(&self) -> Option<f64> {
        (self.predicted_short > 0).then(|| self.short_correct as f64 / self.predicted_short as f64)
    }
    /// Of the short blocks, the fraction predicted short.
    #[must_use]
    pub fn short_recall(&self) -> Option<f64> {
        (self.true_short > 0).then(|| self.short_correct as f64 / self.true_short as f64)
    }
    /// Accuracy of the majority-so-far rule.
    #[must_use]
    pub fn baseline_accuracy(&self) -> Option<f64> {
        (self.allocations > 0).then(|| self.baseline_correct as f64 / self.allocations as f64)
    }
}

/// Runs the learner over `trace` as the `predictive` policy does (allocation ids as handles)
/// and scores each prediction against the truth.
#[must_use]
pub fn evaluate(
    trace: &TraceView<'_>,
    features: &AllocFeatures,
    short_allocs: u64,
) -> LifetimeReport {
    let truth = true_short(trace, short_allocs);
    let mut learner = LifetimeLearner::new(short_allocs);
    let mut r = LifetimeReport {
        short_threshold_allocs: learner.short_allocs(),
        ..LifetimeReport::default()
    };
    for ((&code, &id), &size) in trace.kind.iter().zip(trace.alloc_id).zip(trace.size_bytes) {
        if code == EventKind::Alloc as u8 {
            let keys = AllocFeatures::keys(Some(features), id, size);
            let baseline = learner.totals[0] > learner.totals[1];
            let guess = learner.predict_short(keys);
            let is_short = truth.get(id as usize).copied().unwrap_or(false);
            r.allocations += 1;
            r.true_short += u64::from(is_short);
            r.predicted_short += u64::from(guess);
            r.correct += u64::from(guess == is_short);
            r.short_correct += u64::from(guess && is_short);
            r.baseline_correct += u64::from(baseline == is_short);
            learner.admit(u64::from(id), keys);
        } else if code == EventKind::Free as u8 {
            learner.release(u64::from(id));
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::OwnedTrace;

    /// Size 16 is always freed at once, size 4096 never: after a few of each the learner
    /// knows, and the truth agrees with the threshold's definition.
    #[test]
    fn learns_lifetimes_by_size_class() {
        let mut t = OwnedTrace::new();
        let mut time = 0;
        for _ in 0..100 {
            let a = t.alloc(time, 16);
            t.alloc(time + 1, 4096);
            t.free(time + 2, a);
            time += 3;
        }
        let view = t.view().unwrap();
        let truth = true_short(&view, 4);
        assert!(truth.iter().step_by(2).all(|&s| s));
        assert!(truth.iter().skip(1).step_by(2).all(|&s| !s));
        let features = AllocFeatures::from_trace(&view, None, None);
        assert_eq!(features.recent.len(), 200);
        // Before allocation 2 (the second 16 B) the thread did: alloc 16 (5), alloc 4096 (13),
        // free 16 (32 + 5).
        assert_eq!(features.recent[2], (13 << 6 | 37) | 1 << 12);
        let r = evaluate(&view, &features, 4);
        assert_eq!(r.allocations, 200);
        assert_eq!(r.true_short, 100);
        // Only the first few of each size can be wrong.
        assert!(r.correct >= 190, "{r:?}");
        assert!(r.short_precision().unwrap() > 0.95);
        // Majority-so-far cannot tell the sizes apart: about half.
        assert!(r.baseline_accuracy().unwrap() < 0.6);
    }

    #[test]
    fn a_block_is_long_once_the_threshold_passes() {
        let mut l = LifetimeLearner::new(2);
        let k = AllocFeatures::keys(None, 0, 100);
        l.admit(1, k);
        l.admit(2, k); // block 1 has seen 1 allocation
        l.admit(3, k); // 2 allocations: block 1 is long
        assert_eq!(l.totals, [0, 1]);
        l.release(1); // already labelled
        l.release(3); // freed young: short
        assert_eq!(l.totals, [1, 1]);
    }
}
