//! Order-K context models: the next token from the thread's last 1..K tokens, with backoff.
//!
//! **Blend.** An interpolated blend with PPM method-C escapes (Witten–Bell smoothing). A context
//! of order k that has been followed `n_k` times by `u_k` distinct tokens, `c_k(x)` times by `x`,
//! predicts
//!
//! ```text
//! P_k(x) = (c_k(x) + u_k · P_{k-1}(x)) / (n_k + u_k)
//! ```
//!
//! down to order 0 (the pooled token frequencies) and then the uniform 1/64, so every token has
//! a probability and the log-loss is finite. A context never seen defers wholly to the order
//! below (`P_k = P_{k-1}`). Contexts are each thread's own last tokens; the counts are pooled
//! over threads (threads of one program run the same code). Every order is updated with every
//! learnt token (no update exclusion).
//!
//! **Tables.** A context of order k is its k tokens of 6 bits packed into 48 bits plus the order,
//! so keys are exact (no hash collisions). All orders share one open-addressed table with linear
//! probing (load at most 1/2, doubled when fuller). An entry is 128 bytes: a cache line with the
//! key, a 64-bit mask of the tokens seen, `n` and `u`, and one with the 64 counts as `u8`, halved
//! (rounding up, so no token is forgotten) when one reaches 255, which also lets old behaviour
//! fade. A lookup first reads the home entries of all its orders, so their cache misses overlap.
//! Nothing is allocated per event; the table grows by doubling.
//!
//! **Decisions.** Top-1, top-3 and the collapsed label are those of the blend's full
//! distribution (ties to the lower token), but the blend is summed from the highest order down
//! only until the mass still to come (the product of the escapes so far) can no longer change
//! whether the actual token is first, among the first three, or of the heaviest label: no token
//! can gain more than that mass. In a confident context that is after the first order. The
//! probability of the actual token is always summed over every order.

use super::tokens::{NUM_SEED_LABELS, NUM_TOKENS, seed_label};
use super::{Model, Prediction};

/// Highest supported order: 8 tokens of 6 bits fill the 48 bits of a key.
pub const MAX_ORDER: usize = 8;

const TOKEN_BITS: u32 = 6;
const HISTORY_MASK: u64 = (1 << (TOKEN_BITS * MAX_ORDER as u32)) - 1;
/// Marks a slot as used (an empty slot's key is 0).
const USED: u64 = 1 << 63;
const NONE: u32 = u32::MAX;
const COUNT_MAX: u8 = 255;

/// The 64 counts of one context, one cache line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Counts([u8; NUM_TOKENS]);

impl Default for Counts {
    fn default() -> Self {
        Self([0; NUM_TOKENS])
    }
}

/// A context's summary beside its counts.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    key: u64,
    /// Bit x set when `counts[x] > 0`.
    mask: u64,
    total: u32,
    distinct: u32,
}

/// One context's statistics: its summary, then its counts on the next cache line; aligned so
/// the pair is one 128-byte block (the adjacent-line prefetcher brings both in one miss).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(128))]
struct Stats {
    slot: Slot,
    counts: Counts,
}

impl Stats {
    fn add(&mut self, token: u8) {
        let Self { slot, counts } = self;
        let x = usize::from(token) & (NUM_TOKENS - 1);
        let c = &mut counts.0[x];
        if *c == 0 {
            slot.mask |= 1 << x;
            slot.distinct += 1;
        }
        *c += 1;
        slot.total += 1;
        if *c == COUNT_MAX {
            slot.total = 0;
            for c in &mut counts.0 {
                *c = c.div_ceil(2);
                slot.total += u32::from(*c);
            }
        }
    }
}

/// Open addressing with linear probing over exact keys (see the module docs).
#[derive(Clone, Debug)]
struct Table {
    entries: Vec<Stats>,
    /// `64 - log2(capacity)`, for multiplicative hashing.
    shift: u32,
    used: usize,
}

impl Table {
    const INITIAL_LOG2: u32 = 12;

    fn new() -> Self {
        Self {
            entries: vec![Stats::default(); 1 << Self::INITIAL_LOG2],
            shift: 64 - Self::INITIAL_LOG2,
            used: 0,
        }
    }

    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// Reads the home entries of `keys` so their cache misses overlap, before the lookups
    /// that depend on each other's branches.
    fn warm(&self, keys: &[u64]) {
        let mut x = 0u64;
        for &k in keys {
            if let Some(e) = self.entries.get(self.home(k)) {
                x ^= e.slot.key ^ u64::from(e.counts.0[0]);
            }
        }
        std::hint::black_box(x);
    }

    fn find(&self, key: u64) -> Option<usize> {
        let mask = self.entries.len() - 1;
        let mut i = self.home(key);
        loop {
            let k = self.entries.get(i)?.slot.key;
            if k == key {
                return Some(i);
            }
            if k == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// The entry of `key`, inserting an empty one; `grew` is set when the table was rebuilt
    /// (earlier entry indices are then stale).
    fn find_or_insert(&mut self, key: u64, grew: &mut bool) -> usize {
        if (self.used + 1) * 2 > self.entries.len() {
            self.grow();
            *grew = true;
        }
        let mask = self.entries.len() - 1;
        let mut i = self.home(key);
        loop {
            let Some(e) = self.entries.get_mut(i) else {
                return i;
            };
            if e.slot.key == key {
                return i;
            }
            if e.slot.key == 0 {
                e.slot.key = key;
                self.used += 1;
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let cap = self.entries.len() * 2;
        let old = std::mem::replace(&mut self.entries, vec![Stats::default(); cap]);
        self.shift -= 1;
        let mask = cap - 1;
        for e in old {
            if e.slot.key == 0 {
                continue;
            }
            let mut i = self.home(e.slot.key);
            while self.entries.get(i).is_some_and(|t| t.slot.key != 0) {
                i = (i + 1) & mask;
            }
            if let Some(slot) = self.entries.get_mut(i) {
                *slot = e;
            }
        }
    }
}

/// A thread's last tokens, newest in the low bits.
#[derive(Clone, Copy, Debug, Default)]
struct History {
    bits: u64,
    len: u8,
}

impl History {
    fn push(&mut self, token: u8) {
        self.bits = ((self.bits << TOKEN_BITS) | u64::from(token)) & HISTORY_MASK;
        self.len = self.len.saturating_add(1).min(MAX_ORDER as u8);
    }

    /// The key of this history's context of order `k` (1..=8).
    fn key(self, k: usize) -> u64 {
        let bits = self.bits & ((1u64 << (TOKEN_BITS * k as u32)) - 1);
        USED | ((k as u64) << 48) | bits
    }
}

/// The order-K context model (see the module docs).
#[derive(Clone, Debug)]
pub struct ContextModel {
    order: usize,
    order0: Stats,
    table: Table,
    threads: Vec<History>,
    /// Slots `predict` found for `(cached_thread, cached_bits)`, per order, so the `observe`
    /// that follows it in online use does not probe again.
    cached: [u32; MAX_ORDER + 1],
    cached_for: Option<(u16, u64, u8)>,
}

impl ContextModel {
    /// A model of order `order`, clamped to 1..=[`MAX_ORDER`].
    #[must_use]
    pub fn new(order: usize) -> Self {
        Self {
            order: order.clamp(1, MAX_ORDER),
            order0: Stats::default(),
            table: Table::new(),
            threads: Vec::new(),
            cached: [NONE; MAX_ORDER + 1],
            cached_for: None,
        }
    }

    /// The model's order.
    #[must_use]
    pub fn order(&self) -> usize {
        self.order
    }

    /// Distinct contexts stored (all orders above 0).
    #[must_use]
    pub fn contexts(&self) -> usize {
        self.table.used
    }

    fn history(&self, thread: u16) -> History {
        self.threads
            .get(usize::from(thread))
            .copied()
            .unwrap_or_default()
    }

    fn history_mut(&mut self, thread: u16) -> &mut History {
        let t = usize::from(thread);
        if t >= self.threads.len() {
            self.threads.resize(t + 1, History::default());
        }
        &mut self.threads[t]
    }

    /// The statistics of context order `k` of `h`, if it has been seen.
    fn stats(&self, h: History, k: usize) -> Option<(usize, &Stats)> {
        if k == 0 {
            return Some((0, &self.order0));
        }
        let i = self.table.find(h.key(k))?;
        Some((i, self.table.entries.get(i)?))
    }

    /// Warms the entries of `h`'s contexts of orders 1..=`kmax`.
    fn warm(&self, h: History, kmax: usize) {
        let mut keys = [0u64; MAX_ORDER];
        for (k, key) in keys.iter_mut().enumerate().take(kmax) {
            *key = h.key(k + 1);
        }
        self.table.warm(keys.get(..kmax).unwrap_or_default());
    }
}

/// The running sums of the blend while the decisions are still open.
struct Blend {
    acc: [f64; NUM_TOKENS],
    touched: u64,
    /// Per collapsed label (8 slots so a label indexes with `& 7`; the eighth stays 0).
    labels: [f64; 8],
}

impl Blend {
    fn add(&mut self, coef: f64, stats: &Stats) {
        let Stats { slot, counts } = stats;
        let mut m = slot.mask;
        while m != 0 {
            let x = m.trailing_zeros() as usize & (NUM_TOKENS - 1);
            m &= m - 1;
            let v = coef * f64::from(counts.0[x]);
            self.acc[x] += v;
            self.labels[usize::from(seed_label(x as u8)) & 7] += v;
        }
        self.touched |= slot.mask;
    }

    /// The score once it can no longer change when `rest` more mass arrives (no token or
    /// label can gain more than `rest`), else `None`.
    fn verdict(&self, actual: usize, rest: f64) -> Option<(bool, bool, bool)> {
        // Nothing is certain while the mass still to come is half of the whole.
        if rest >= 0.5 {
            return None;
        }
        let a = self.acc[actual & (NUM_TOKENS - 1)];
        let others = self.touched & !(1u64 << (actual & 63));
        // Others that beat the actual token whatever comes, and that might beat it.
        let (mut surely, mut maybe) = (0u32, 0u32);
        let mut m = others;
        while m != 0 {
            let x = m.trailing_zeros() as usize & (NUM_TOKENS - 1);
            m &= m - 1;
            let v = self.acc[x];
            surely += u32::from(v > a + rest);
            maybe += u32::from(v + rest >= a);
        }
        // Untouched tokens hold 0 so far.
        if rest >= a {
            maybe += 63 - others.count_ones();
        }
        let top1 = decide(maybe == 0, surely > 0)?;
        let top3 = decide(maybe < 3, surely >= 3)?;
        let la = self.labels[usize::from(seed_label(actual as u8)) & 7];
        let (mut l_surely, mut l_maybe) = (false, false);
        for (l, &v) in self.labels.iter().enumerate().take(NUM_SEED_LABELS) {
            if l != usize::from(seed_label(actual as u8)) {
                l_surely |= v > la + rest;
                l_maybe |= v + rest >= la;
            }
        }
        let label = decide(!l_maybe, l_surely)?;
        Some((top1, top3, label))
    }

    /// The exact score once `rest` is spread uniformly (ties go to the lower token or label).
    fn final_verdict(&self, actual: usize, rest: f64) -> (bool, bool, bool) {
        let actual = actual & (NUM_TOKENS - 1);
        let a = self.acc[actual];
        let beaten_by = (0..NUM_TOKENS)
            .filter(|&x| x != actual)
            .filter(|&x| self.acc[x] > a || (self.acc[x] == a && x < actual))
            .count();
        let mut labels = self.labels;
        for (l, v) in labels.iter_mut().enumerate().take(NUM_SEED_LABELS) {
            // Label l holds 2^(l-1) tokens (label 0 one).
            let tokens = if l == 0 { 1.0 } else { f64::from(1u16 << (l - 1)) };
            *v += rest * tokens / NUM_TOKENS as f64;
        }
        let best = super::argmax(labels.get(..NUM_SEED_LABELS).unwrap_or_default());
        (
            beaten_by == 0,
            beaten_by < 3,
            best == seed_label(actual as u8),
        )
    }
}

/// `Some(true)` when `yes` is certain, `Some(false)` when `no` is, else `None`.
fn decide(yes: bool, no: bool) -> Option<bool> {
    if yes {
        Some(true)
    } else if no {
        Some(false)
    } else {
        None
    }
}

impl Model for ContextModel {
    fn name(&self) -> String {
        format!("order-{}", self.order)
    }

    fn predict(&mut self, thread: u16, actual: u8) -> Prediction {
        let h = self.history(thread);
        let kmax = self.order.min(usize::from(h.len));
        let mut blend = Blend {
            acc: [0.0; NUM_TOKENS],
            touched: 0,
            labels: [0.0; 8],
        };
        let mut rest = 1.0f64;
        let mut p_actual = 0.0f64;
        let mut settled = None;
        let actual = usize::from(actual) & (NUM_TOKENS - 1);
        let mut cached = [NONE; MAX_ORDER + 1];
        self.warm(h, kmax);
        for k in (0..=kmax).rev() {
            let Some((i, stats)) = self.stats(h, k) else {
                continue;
            };
            cached[k] = i as u32;
            let slot = &stats.slot;
            if slot.total == 0 {
                continue;
            }
            let inv = 1.0 / f64::from(slot.total + slot.distinct);
            let coef = rest * inv;
            p_actual += coef * f64::from(stats.counts.0[actual]);
            rest *= f64::from(slot.distinct) * inv;
            if settled.is_none() {
                blend.add(coef, stats);
                settled = blend.verdict(actual, rest);
            }
        }
        self.cached = cached;
        self.cached_for = Some((thread, h.bits, h.len));
        p_actual += rest / NUM_TOKENS as f64;
        let (top1_hit, top3_hit, seed_label_hit) =
            settled.unwrap_or_else(|| blend.final_verdict(actual, rest));
        Prediction {
            top1_hit,
            top3_hit,
            seed_label_hit,
            p_actual,
        }
    }

    fn observe(&mut self, thread: u16, token: u8, learn: bool) {
        let h = self.history(thread);
        if learn {
            let kmax = self.order.min(usize::from(h.len));
            let mut cache_valid = self.cached_for == Some((thread, h.bits, h.len));
            if !cache_valid {
                self.warm(h, kmax);
            }
            self.order0.add(token);
            for k in 1..=kmax {
                let cached = self.cached[k];
                let i = if cache_valid && cached != NONE {
                    cached as usize
                } else {
                    let mut grew = false;
                    let i = self.table.find_or_insert(h.key(k), &mut grew);
                    cache_valid &= !grew;
                    i
                };
                if let Some(e) = self.table.entries.get_mut(i) {
                    e.add(token);
                }
            }
        }
        self.cached_for = None;
        self.history_mut(thread).push(token);
    }

    fn reset_history(&mut self) {
        self.threads.clear();
        self.cached_for = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The blend of a model that has seen `a b a b a` (thread 0) by hand: order-2 context
    /// `(b, a)` -> b once; order-1 `a` -> b twice; order 0: a 3, b 2.
    #[test]
    fn blend_matches_the_formula() {
        let (a, b) = (3u8, 40u8);
        let mut m = ContextModel::new(2);
        for &t in &[a, b, a, b, a] {
            m.observe(0, t, true);
        }
        // Next after history (..., b, a): orders 2 (n=1,u=1), 1 (n=2,u=1), 0 (n=5,u=2).
        let p = m.predict(0, b);
        let uniform = 1.0 / 64.0;
        let p0 = |c: f64| (c + 2.0 * uniform) / 7.0;
        let p1 = |c1: f64, c0: f64| (c1 + p0(c0)) / 3.0;
        let p2 = |c2: f64, c1: f64, c0: f64| (c2 + p1(c1, c0)) / 2.0;
        let expect_b = p2(1.0, 2.0, 2.0);
        assert!(
            (p.p_actual - expect_b).abs() < 1e-12,
            "{} vs {expect_b}",
            p.p_actual
        );
        assert!(p.top1_hit);
        let pa = m.predict(0, a);
        assert!(!pa.top1_hit && pa.top3_hit);
        // The third is the lowest of the equal others.
        assert!(m.predict(0, 0).top3_hit);
        assert!(!m.predict(0, 1).top3_hit);
        // Labels: b (40) is label 6 with 32 tokens' share of the uniform mass.
        assert!(p.seed_label_hit);
        let pa = m.predict(0, a).p_actual;
        assert!((pa - p2(0.0, 0.0, 3.0)).abs() < 1e-12);
    }

    #[test]
    fn probabilities_sum_to_one_and_decisions_match_the_full_blend() {
        let mut m = ContextModel::new(4);
        let mut x = 7u64;
        let (mut checked, mut differ) = (0, 0);
        for i in 0..5000u32 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let tok = if i % 3 == 0 {
                (x >> 60) as u8
            } else {
                (i % 7) as u8 + 30
            };
            let thread = (i % 2) as u16;
            if i % 97 == 0 {
                let mut dist = [0.0f64; 64];
                for (t, d) in dist.iter_mut().enumerate() {
                    *d = m.predict(thread, t as u8).p_actual;
                }
                let sum: f64 = dist.iter().sum();
                assert!((sum - 1.0).abs() < 1e-9, "sum {sum}");
                for t in 0..64u8 {
                    let full = Prediction::from_distribution(&dist, t);
                    let fast = m.predict(thread, t);
                    checked += 1;
                    differ += usize::from(
                        (fast.top1_hit, fast.top3_hit, fast.seed_label_hit)
                            != (full.top1_hit, full.top3_hit, full.seed_label_hit),
                    );
                }
            }
            m.observe(thread, tok, true);
        }
        // The early stop is exact: not one score differs from the full blend's.
        assert_eq!((differ, checked), (0, 52 * 64));
        assert!(m.contexts() > 10);
    }

    #[test]
    fn counts_halve_without_forgetting_a_token() {
        let mut m = ContextModel::new(1);
        m.observe(0, 5, true);
        for _ in 0..600 {
            m.observe(0, 9, true);
        }
        m.observe(0, 1, true);
        let s = m.order0.slot;
        assert!(s.total < 600);
        assert_eq!(s.distinct, 3);
        assert!(m.order0.counts.0[5] >= 1);
        assert_eq!(
            s.total,
            m.order0.counts.0.iter().map(|&c| u32::from(c)).sum::<u32>()
        );
    }

    #[test]
    fn a_frozen_model_does_not_learn() {
        let mut m = ContextModel::new(3);
        for t in [1u8, 2, 3, 1, 2, 3] {
            m.observe(0, t, true);
        }
        let before = m.predict(0, 1).p_actual;
        m.observe(0, 1, false);
        m.observe(0, 9, false);
        m.reset_history();
        for t in [1u8, 2, 3] {
            m.observe(0, t, false);
        }
        assert_eq!(
            m.contexts(),
            9,
            "3 contexts of each order, none added frozen"
        );
        assert!((m.predict(0, 1).p_actual - before).abs() < 1e-12);
    }
}
