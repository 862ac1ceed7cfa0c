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
//! probing (load at most 1/2, doubled when fuller): a slot holds the key, a 64-bit mask of the
//! tokens seen, `n` and `u`; its 64 counts are one cache line of `u8`, halved (rounding up, so no
//! token is forgotten) when one reaches 255, which also lets old behaviour fade. Nothing is
//! allocated per event; the table grows by doubling.
//!
//! **Decisions.** The top-3 and the collapsed label come from the blend's full distribution, but
//! the blend is summed from the highest order down only until the mass still to come (the
//! product of the escapes so far) can no longer change them: no token can gain more than that
//! mass, so once the third token leads the fourth by more, and the first the second, the top-3
//! and the top-1 are final (the same for the label's sums). The probability of the actual token
//! is always summed over every order.

use super::tokens::{NUM_SEED_LABELS, NUM_TOKENS, seed_label};
use super::{Model, Prediction, insert_top3};

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

/// One context's statistics: its slot and counts.
#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    slot: Slot,
    counts: Counts,
}

impl Stats {
    fn add(slot: &mut Slot, counts: &mut Counts, token: u8) {
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
    slots: Vec<Slot>,
    counts: Vec<Counts>,
    /// `64 - log2(capacity)`, for multiplicative hashing.
    shift: u32,
    used: usize,
}

impl Table {
    const INITIAL_LOG2: u32 = 12;

    fn new() -> Self {
        let cap = 1usize << Self::INITIAL_LOG2;
        Self {
            slots: vec![Slot::default(); cap],
            counts: vec![Counts::default(); cap],
            shift: 64 - Self::INITIAL_LOG2,
            used: 0,
        }
    }

    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    fn find(&self, key: u64) -> Option<usize> {
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        loop {
            let k = self.slots.get(i)?.key;
            if k == key {
                return Some(i);
            }
            if k == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// The slot of `key`, inserting an empty one; `grew` is set when the table was rebuilt
    /// (earlier slot indices are then stale).
    fn find_or_insert(&mut self, key: u64, grew: &mut bool) -> usize {
        if (self.used + 1) * 2 > self.slots.len() {
            self.grow();
            *grew = true;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        loop {
            let Some(s) = self.slots.get_mut(i) else {
                return i;
            };
            if s.key == key {
                return i;
            }
            if s.key == 0 {
                s.key = key;
                self.used += 1;
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let cap = self.slots.len() * 2;
        let old_slots = std::mem::replace(&mut self.slots, vec![Slot::default(); cap]);
        let old_counts = std::mem::replace(&mut self.counts, vec![Counts::default(); cap]);
        self.shift -= 1;
        let mask = cap - 1;
        for (s, c) in old_slots.into_iter().zip(old_counts) {
            if s.key == 0 {
                continue;
            }
            let mut i = self.home(s.key);
            while self.slots.get(i).is_some_and(|t| t.key != 0) {
                i = (i + 1) & mask;
            }
            if let (Some(slot), Some(counts)) = (self.slots.get_mut(i), self.counts.get_mut(i)) {
                *slot = s;
                *counts = c;
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

    /// The slot and counts of context order `k` of `h`, if it has been seen.
    fn stats(&self, h: History, k: usize) -> Option<(usize, &Slot, &Counts)> {
        if k == 0 {
            return Some((0, &self.order0.slot, &self.order0.counts));
        }
        let i = self.table.find(h.key(k))?;
        Some((i, self.table.slots.get(i)?, self.table.counts.get(i)?))
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
    fn add(&mut self, coef: f64, slot: &Slot, counts: &Counts) {
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

    /// The top-3 and label if no token or label can change rank once `rest` more mass arrives.
    fn settled(&self, rest: f64) -> Option<([u8; 3], u8)> {
        if self.touched.count_ones() < 3 {
            return None;
        }
        let mut top: [(f64, u8); 3] = [(-1.0, 0); 3];
        let mut fourth = 0.0f64;
        let mut m = self.touched;
        while m != 0 {
            let x = m.trailing_zeros() as u8 & 63;
            m &= m - 1;
            let v = self.acc[usize::from(x)];
            let dropped = top[2].0;
            insert_top3(&mut top, v, x);
            fourth = fourth.max(if v > dropped { dropped } else { v });
        }
        let (l1, l2, label) = top2_labels(&self.labels);
        if top[0].0 - top[1].0 > rest && top[2].0 - fourth > rest && l1 - l2 > rest {
            Some((top.map(|(_, t)| t), label))
        } else {
            None
        }
    }

    /// The final decisions once `rest` has been spread uniformly.
    fn finish(&self, rest: f64) -> ([u8; 3], u8) {
        let mut top: [(f64, u8); 3] = [(-1.0, 0); 3];
        for (x, &v) in (0u8..).zip(self.acc.iter()) {
            insert_top3(&mut top, v, x);
        }
        let mut labels = self.labels;
        for (l, v) in labels.iter_mut().enumerate().take(NUM_SEED_LABELS) {
            // Label l holds 2^(l-1) tokens (label 0 one).
            let tokens = if l == 0 {
                1.0
            } else {
                f64::from(1u16 << (l - 1))
            };
            *v += rest * tokens / NUM_TOKENS as f64;
        }
        (top.map(|(_, t)| t), top2_labels(&labels).2)
    }
}

/// The largest label sum, the second largest, and the largest's label (lowest on ties).
fn top2_labels(labels: &[f64; 8]) -> (f64, f64, u8) {
    let (mut b1, mut b2, mut at) = (-1.0f64, -1.0f64, 0u8);
    for (l, &v) in (0u8..).zip(labels.iter().take(NUM_SEED_LABELS)) {
        if v > b1 {
            b2 = b1;
            b1 = v;
            at = l;
        } else if v > b2 {
            b2 = v;
        }
    }
    (b1, b2, at)
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
        for k in (0..=kmax).rev() {
            let Some((i, slot, counts)) = self.stats(h, k) else {
                continue;
            };
            cached[k] = i as u32;
            if slot.total == 0 {
                continue;
            }
            let denom = f64::from(slot.total + slot.distinct);
            let coef = rest / denom;
            p_actual += coef * f64::from(counts.0[actual]);
            rest *= f64::from(slot.distinct) / denom;
            if settled.is_none() {
                blend.add(coef, slot, counts);
                settled = blend.settled(rest);
            }
        }
        self.cached = cached;
        self.cached_for = Some((thread, h.bits, h.len));
        p_actual += rest / NUM_TOKENS as f64;
        let (top3, seed_label) = settled.unwrap_or_else(|| blend.finish(rest));
        Prediction {
            top3,
            seed_label,
            p_actual,
        }
    }

    fn observe(&mut self, thread: u16, token: u8, learn: bool) {
        let h = self.history(thread);
        if learn {
            let kmax = self.order.min(usize::from(h.len));
            let mut cache_valid = self.cached_for == Some((thread, h.bits, h.len));
            Stats::add(&mut self.order0.slot, &mut self.order0.counts, token);
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
                if let (Some(slot), Some(counts)) =
                    (self.table.slots.get_mut(i), self.table.counts.get_mut(i))
                {
                    Stats::add(slot, counts, token);
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
        assert_eq!(p.top3[0], b);
        assert_eq!(p.top3[1], a);
        // The third is the lowest of the equal others.
        assert_eq!(p.top3[2], 0);
        let pa = m.predict(0, a).p_actual;
        assert!((pa - p2(0.0, 0.0, 3.0)).abs() < 1e-12);
    }

    #[test]
    fn probabilities_sum_to_one_and_decisions_match_the_full_blend() {
        let mut m = ContextModel::new(4);
        let mut x = 7u64;
        let mut exact = 0;
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
                let full = Prediction::from_distribution(&dist, tok);
                let fast = m.predict(thread, tok);
                // The same top-1 and the same top-3 set, up to ties that only rounding separates
                // (the order of the 2nd and 3rd is not promised).
                let probs = |p: &Prediction| {
                    let mut v: Vec<f64> = p.top3.iter().map(|&t| dist[usize::from(t)]).collect();
                    v.sort_by(f64::total_cmp);
                    v
                };
                let (ta, tb) = (
                    dist[usize::from(fast.top3[0])],
                    dist[usize::from(full.top3[0])],
                );
                assert!((ta - tb).abs() < 1e-12, "event {i}: {fast:?} vs {full:?}");
                for (a, b) in probs(&fast).iter().zip(probs(&full)) {
                    assert!((a - b).abs() < 1e-12, "event {i}: {fast:?} vs {full:?}");
                }
                let label_mass = |l: u8| -> f64 {
                    (0..64u8)
                        .filter(|&t| seed_label(t) == l)
                        .map(|t| dist[usize::from(t)])
                        .sum()
                };
                let (la, lb) = (label_mass(fast.seed_label), label_mass(full.seed_label));
                assert!(
                    (la - lb).abs() < 1e-12,
                    "event {i}: label {fast:?} vs {full:?}"
                );
                exact += usize::from(fast.top3[0] == full.top3[0]);
            }
            m.observe(thread, tok, true);
        }
        assert!(exact >= 45, "{exact} of 52 identical");
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
