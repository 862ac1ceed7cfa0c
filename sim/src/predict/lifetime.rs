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

use std::collections::VecDeque;

use super::tokens::{alloc_token, token_of};
use crate::hash::FastMap;
use crate::trace::{EventKind, NO_ALLOC_ID, TraceView};

/// Default threshold: shorter-lived than this many allocations is short.
pub const DEFAULT_SHORT_ALLOCS: u64 = 64;
/// Labelled blocks a context needs before it is trusted.
pub const MIN_EVIDENCE: u32 = 4;
/// Site of an allocation without one.
pub const NO_SITE: u32 = u32::MAX;

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
        let mut recent = RecentCalls::default();
        for (i, (&code, &size)) in trace.kind.iter().zip(trace.size_bytes).enumerate() {
            let t = thread.and_then(|th| th.get(i).copied()).unwrap_or(0);
            if let Some(r) = recent.note(code, size, t) {
                f.recent.push(r);
                f.site
                    .push(site.and_then(|s| s.get(i).copied()).unwrap_or(NO_SITE));
            }
        }
        f
    }

    /// The three context keys of an allocation of `size_bytes` from `site` (or [`NO_SITE`])
    /// after the thread's `recent` calls.
    #[must_use]
    pub fn keys_of(site: u32, recent: Option<u16>, size_bytes: u64) -> Keys {
        let class = u64::from(alloc_token(size_bytes));
        Keys([
            (site != NO_SITE).then(|| 1 << 60 | u64::from(site) << 8 | class),
            recent.map(|r| 2 << 60 | u64::from(r) << 8 | class),
            Some(3 << 60 | class),
        ])
    }

    /// The three context keys of allocation `id` of `size_bytes` (unknown ids: size only).
    #[must_use]
    pub fn keys(features: Option<&Self>, id: u32, size_bytes: u64) -> Keys {
        let i = id as usize;
        let site = features
            .and_then(|f| f.site.get(i).copied())
            .unwrap_or(NO_SITE);
        let recent = features.and_then(|f| f.recent.get(i).copied());
        Self::keys_of(site, recent, size_bytes)
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
        self.admit_reporting(handle, keys, &mut |_| {});
    }

    /// [`Self::admit`], calling `labelled_long` with each block it labels long.
    pub fn admit_reporting(&mut self, handle: u64, keys: Keys, labelled_long: &mut dyn FnMut(u64)) {
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
                labelled_long(h);
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

    /// Block `handle` is freed: short unless it was already labelled long. Returns whether it
    /// was labelled short now.
    pub fn release(&mut self, handle: u64) -> bool {
        if let Some(p) = self.live.remove(&handle)
            && !p.labelled
        {
            self.label(p.keys, true);
            return true;
        }
        false
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
    let mut scorer = LifetimeScorer::new(short_allocs);
    for ((&code, &id), &size) in trace.kind.iter().zip(trace.alloc_id).zip(trace.size_bytes) {
        if code == EventKind::Alloc as u8 {
            scorer.alloc(id, AllocFeatures::keys(Some(features), id, size));
        } else if code == EventKind::Free as u8 {
            scorer.free(id);
        }
    }
    scorer.finish()
}

/// The learner scored as it goes, in one pass and bounded memory (the blocks still waiting for
/// their label), so a trace too big for memory can be scored block by block. A guess is scored
/// the moment its block's label is known: short at a free in time, long when the threshold
/// passes or at the end.
#[derive(Clone, Debug)]
pub struct LifetimeScorer {
    learner: LifetimeLearner,
    /// The guess and the baseline's guess for each block not labelled yet.
    guesses: FastMap<u64, (bool, bool)>,
    report: LifetimeReport,
}

impl LifetimeScorer {
    /// A scorer with threshold `short_allocs`.
    #[must_use]
    pub fn new(short_allocs: u64) -> Self {
        let learner = LifetimeLearner::new(short_allocs);
        Self {
            report: LifetimeReport {
                short_threshold_allocs: learner.short_allocs(),
                ..LifetimeReport::default()
            },
            learner,
            guesses: FastMap::default(),
        }
    }

    fn score(report: &mut LifetimeReport, (guess, baseline): (bool, bool), is_short: bool) {
        report.true_short += u64::from(is_short);
        report.correct += u64::from(guess == is_short);
        report.short_correct += u64::from(guess && is_short);
        report.baseline_correct += u64::from(baseline == is_short);
    }

    /// Allocation `id` with contexts `keys`.
    pub fn alloc(&mut self, id: u32, keys: Keys) {
        let baseline = self.learner.totals[0] > self.learner.totals[1];
        let guess = self.learner.predict_short(keys);
        self.report.allocations += 1;
        self.report.predicted_short += u64::from(guess);
        self.guesses.insert(u64::from(id), (guess, baseline));
        let (guesses, report) = (&mut self.guesses, &mut self.report);
        self.learner
            .admit_reporting(u64::from(id), keys, &mut |handle| {
                if let Some(g) = guesses.remove(&handle) {
                    Self::score(report, g, false);
                }
            });
    }

    /// The free of allocation `id`.
    pub fn free(&mut self, id: u32) {
        if self.learner.release(u64::from(id))
            && let Some(g) = self.guesses.remove(&u64::from(id))
        {
            Self::score(&mut self.report, g, true);
        }
    }

    /// The report, once every block still waiting is scored long (never freed in time).
    #[must_use]
    pub fn finish(mut self) -> LifetimeReport {
        for (_, g) in self.guesses.drain() {
            Self::score(&mut self.report, g, false);
        }
        self.report
    }
}

/// Each thread's last two tokens, as [`AllocFeatures::recent`] records them.
#[derive(Clone, Debug, Default)]
pub struct RecentCalls(Vec<(u16, u8)>);

impl RecentCalls {
    /// Thread `thread`'s last two tokens (bit 12 set once it has two).
    #[must_use]
    pub fn get(&self, thread: u16) -> u16 {
        let (bits, n) = self.0.get(usize::from(thread)).copied().unwrap_or((0, 0));
        if n >= 2 { bits | 1 << 12 } else { bits }
    }

    /// Takes in an event of kind `code`, `size_bytes`, made by `thread`: for an allocation,
    /// the thread's last two tokens before it (its feature); then the event's own token, if it
    /// has one, becomes the thread's latest.
    pub fn note(&mut self, code: u8, size_bytes: u64, thread: u16) -> Option<u16> {
        let kind = EventKind::from_code(code)?;
        let feature = (kind == EventKind::Alloc).then(|| self.get(thread));
        if let Some(tok) = token_of(kind, size_bytes) {
            self.push(thread, tok);
        }
        feature
    }

    /// Thread `thread` made a call of token `token`.
    pub fn push(&mut self, thread: u16, token: u8) {
        let t = usize::from(thread);
        if t >= self.0.len() {
            self.0.resize(t + 1, (0, 0));
        }
        if let Some(h) = self.0.get_mut(t) {
            h.0 = ((h.0 << 6) | u16::from(token)) & 0xfff;
            h.1 = h.1.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::OwnedTrace;

    /// The score as it was computed before it streamed: the truth of every allocation first
    /// (`true_short`), then each guess checked against it.
    fn scored_against_the_truth(trace: &TraceView<'_>, f: &AllocFeatures) -> LifetimeReport {
        let truth = true_short(trace, DEFAULT_SHORT_ALLOCS);
        let mut learner = LifetimeLearner::new(DEFAULT_SHORT_ALLOCS);
        let mut r = LifetimeReport {
            short_threshold_allocs: DEFAULT_SHORT_ALLOCS,
            ..LifetimeReport::default()
        };
        for ((&code, &id), &size) in trace.kind.iter().zip(trace.alloc_id).zip(trace.size_bytes) {
            if code == EventKind::Alloc as u8 {
                let keys = AllocFeatures::keys(Some(f), id, size);
                let baseline = learner.totals[0] > learner.totals[1];
                let guess = learner.predict_short(keys);
                let is_short = truth[id as usize];
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

    /// Scored as it goes (each guess when its label is known), the report is the one scored
    /// against the whole trace's truth.
    #[test]
    fn scoring_as_it_goes_matches_scoring_against_the_truth() {
        use crate::testing::{Op, ops_to_trace};
        let mut x = 5u64;
        let ops: Vec<Op> = (0..4000)
            .map(|i| {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                if (x >> 33) % 5 < 3 {
                    Op::Alloc {
                        size_bytes: if i % 7 == 0 { 4096 } else { 16 + (x >> 60) * 8 },
                    }
                } else {
                    // Mostly the newest blocks, sometimes an old one.
                    let live_guess = if (x >> 20).is_multiple_of(4) {
                        (x >> 24) as usize
                    } else {
                        usize::MAX - (x >> 62) as usize
                    };
                    Op::Free { victim: live_guess }
                }
            })
            .collect();
        let trace = ops_to_trace(&ops);
        let view = trace.view().unwrap();
        let f = AllocFeatures::from_trace(&view, None, None);
        let streamed = evaluate(&view, &f, DEFAULT_SHORT_ALLOCS);
        assert_eq!(streamed, scored_against_the_truth(&view, &f));
        assert!(streamed.true_short > 100 && streamed.true_short < streamed.allocations - 100);
    }

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
