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
//! **Tables** ([`super::table`]). Orders 0 to 2 are indexed directly (64 `u8` counts a
//! context); orders 3 and up are hashed by their exact key (k tokens of 6 bits and the order,
//! no collisions), one table per order, keeping up to 24 (token, count) pairs a context (16-byte
//! slots for up to 3 successors, a cache line of its own beyond), the rarest dropped for a 25th
//! successor. Counts are halved at 255. The evaluations announce each call some calls ahead
//! ([`Model::lookahead`]): the model follows each thread's history that far ahead and
//! prefetches the lines of those contexts, so their cache misses overlap with the work on the
//! calls before; nothing is allocated per event but a context's line when it first needs one.
//!
//! **Decisions.** Top-1, top-3 and the collapsed label are those of the blend's full
//! distribution (ties to the lower token), but the blend is summed from the highest order down
//! only until the mass still to come (the product of the escapes so far) can no longer change
//! whether the actual token is first, among the first three, or of the heaviest label: no token
//! can gain more than that mass. In a confident context that is after the first order. The
//! probability of the actual token is always summed over every order.
//!
//! **Frozen.** A model that moves a history on without learning answers each context once,
//! with the whole blend, and keeps the answer for the context's returns ([`super::memo`]).

use super::memo::Memo;
use super::table::{Ctx, Dense, Table};
use super::tokens::{NUM_SEED_LABELS, NUM_TOKENS, seed_label};
use super::{Model, Prediction, insert_top3};

/// Highest supported order: 8 tokens of 6 bits fill the 48 bits of a key.
pub const MAX_ORDER: usize = 8;

const TOKEN_BITS: u32 = 6;
const HISTORY_MASK: u64 = (1 << (TOKEN_BITS * MAX_ORDER as u32)) - 1;
/// Marks a slot as used (an empty slot's key is 0).
const USED: u64 = 1 << 63;
const NONE: u32 = u32::MAX;
/// Dense contexts: order 0, then the 64 of order 1, then the 4096 of order 2.
const DENSE_ORDERS: usize = 2;
const DENSE_CONTEXTS: usize = 1 + 64 + 4096;

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

    /// The index of this history's context of order `k` (0..=2) among the dense ones.
    fn dense_index(self, k: usize) -> usize {
        match k {
            0 => 0,
            1 => 1 + (self.bits & 63) as usize,
            _ => 65 + (self.bits & 4095) as usize,
        }
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
    /// Orders 0 to 2, indexed by [`History::dense_index`].
    dense: Vec<Dense>,
    /// Orders 3 and up, one table each (so the small low-order tables stay in cache while the
    /// large high-order ones miss), `tables[k - 3]`.
    tables: Vec<Table>,
    threads: Vec<History>,
    /// Slots `predict` found for `(cached_thread, cached_bits)`, per order, so the `observe`
    /// that follows it in online use does not probe again.
    cached: [u32; MAX_ORDER + 1],
    cached_for: Option<(u16, u64, u8)>,
    /// Each thread's history as it will be when the calls announced by
    /// [`Model::lookahead`] so far come (the lines of those contexts are being fetched).
    ahead: Vec<History>,
    /// Whether calls are announced ahead, so `predict` and `observe` need not fetch.
    looking_ahead: bool,
    /// Whether the model has moved a history on without learning since it last learnt: it is
    /// frozen, and answers from [`Self::memo`].
    frozen: bool,
    /// A frozen model's answers by context ([`super::memo`]).
    memo: Memo,
    /// Off only in tests, which compare the memo's answers with the blend's.
    #[cfg(test)]
    use_memo: bool,
}

impl ContextModel {
    /// A model of order `order`, clamped to 1..=[`MAX_ORDER`].
    #[must_use]
    pub fn new(order: usize) -> Self {
        Self {
            order: order.clamp(1, MAX_ORDER),
            dense: vec![Dense::default(); DENSE_CONTEXTS],
            tables: vec![Table::default(); MAX_ORDER - DENSE_ORDERS],
            threads: Vec::new(),
            cached: [NONE; MAX_ORDER + 1],
            cached_for: None,
            ahead: Vec::new(),
            looking_ahead: false,
            frozen: false,
            memo: Memo::default(),
            #[cfg(test)]
            use_memo: true,
        }
    }

    /// The model's order.
    #[must_use]
    pub fn order(&self) -> usize {
        self.order
    }

    /// Distinct contexts seen (all orders above 0).
    #[must_use]
    pub fn contexts(&self) -> usize {
        let dense = self.dense.iter().skip(1);
        dense.filter(|d| Ctx::Dense(d).total() > 0).count()
            + self.tables.iter().map(Table::contexts).sum::<usize>()
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

    /// The statistics of context order `k` of `h` (a table index for the hashed orders), if
    /// it has been seen.
    #[inline(always)] // a call per order in `predict`'s hot loop: out of line, 5% of online
    fn ctx(&self, h: History, k: usize) -> Option<(u32, Ctx<'_>)> {
        if k <= DENSE_ORDERS {
            let d = self.dense.get(h.dense_index(k))?;
            return Some((NONE, Ctx::Dense(d)));
        }
        let table = self.tables.get(k - DENSE_ORDERS - 1)?;
        let i = table.find(h.key(k))?;
        Some((i as u32, table.ctx(i)?))
    }

    /// Starts fetching the entries of `h`'s contexts up to order `kmax` (the dense ones of
    /// order 2 too: 512 KiB of them do not all stay in cache).
    fn prefetch(&self, h: History, kmax: usize) {
        if kmax >= DENSE_ORDERS {
            prefetch_index::prefetch_index(&self.dense, h.dense_index(DENSE_ORDERS));
        }
        let orders = DENSE_ORDERS + 1..=kmax;
        for (k, table) in orders.zip(&self.tables) {
            table.prefetch(h.key(k));
        }
    }

    /// Whether `predict` answers from the memo: when frozen (tests can turn the memo off).
    fn answers_from_memo(&self) -> bool {
        #[cfg(test)]
        if !self.use_memo {
            return false;
        }
        self.frozen
    }

    /// The key of `h`'s context of order `kmax`, under which the memo keeps its answer (order 0
    /// too: its key is the order's alone).
    fn memo_key(h: History, kmax: usize) -> u64 {
        USED | ((kmax as u64) << 48) | (h.bits & ((1u64 << (TOKEN_BITS * kmax as u32)) - 1))
    }

    /// The whole blend of `h`'s contexts up to order `kmax`: its three first tokens, its
    /// heaviest label and every token's probability. Each is the number `predict` finds for
    /// it: the probabilities are summed order by order in `predict`'s order, and the tokens
    /// and label are ranked as [`Blend::final_verdict`] ranks them.
    fn answer(&self, h: History, kmax: usize) -> ([u8; 3], u8, [f64; NUM_TOKENS]) {
        let mut blend = Blend::new();
        let mut rest = 1.0f64;
        for k in (0..=kmax).rev() {
            let Some((_, ctx)) = self.ctx(h, k) else {
                continue;
            };
            let (total, distinct) = (ctx.total(), ctx.distinct());
            if total == 0 {
                continue;
            }
            let inv = 1.0 / f64::from(total + distinct);
            blend.add(rest * inv, ctx);
            rest *= f64::from(distinct) * inv;
        }
        let mut top: [(f64, u8); 3] = [(-1.0, 0); 3];
        for (tok, &q) in (0u8..).zip(blend.acc.iter()) {
            insert_top3(&mut top, q, tok);
        }
        let uniform = rest / NUM_TOKENS as f64;
        (
            top.map(|(_, t)| t),
            blend.best_label(rest),
            blend.acc.map(|a| a + uniform),
        )
    }

    /// `predict` by the blend of `h`'s contexts, stopping as soon as the decisions are certain
    /// (see the module docs). Inlined: it is the online pass's hot path.
    #[inline(always)]
    fn predict_blend(&mut self, thread: u16, h: History, kmax: usize, actual: u8) -> Prediction {
        let mut blend = Blend::new();
        let mut rest = 1.0f64;
        let mut p_actual = 0.0f64;
        let mut settled = None;
        let actual = usize::from(actual) & (NUM_TOKENS - 1);
        let mut cached = [NONE; MAX_ORDER + 1];
        if !self.looking_ahead {
            self.prefetch(h, kmax);
        }
        for k in (0..=kmax).rev() {
            let Some((i, ctx)) = self.ctx(h, k) else {
                continue;
            };
            cached[k] = i;
            let (total, distinct) = (ctx.total(), ctx.distinct());
            if total == 0 {
                continue;
            }
            let inv = 1.0 / f64::from(total + distinct);
            let coef = rest * inv;
            p_actual += coef * f64::from(ctx.count(actual as u8));
            rest *= f64::from(distinct) * inv;
            if settled.is_none() {
                blend.add(coef, ctx);
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

    /// [`Self::predict_blend`] for a context the full memo does not hold: rare, and kept out of
    /// the memo's path (inlined there, it slowed the memo's answers by 4%).
    #[cold]
    #[inline(never)]
    fn predict_past_memo(
        &mut self,
        thread: u16,
        h: History,
        kmax: usize,
        actual: u8,
    ) -> Prediction {
        self.predict_blend(thread, h, kmax, actual)
    }

    /// `predict`'s answer from the memo, blending `h`'s context there first if it is new (once
    /// the memo is full, a new context is blended as without it: the blend that stops early
    /// is then cheaper than the whole one). Out of line, so the online pass's `predict` stays
    /// as it was.
    #[inline(never)]
    fn predict_frozen(&mut self, thread: u16, h: History, kmax: usize, actual: u8) -> Prediction {
        let key = Self::memo_key(h, kmax);
        if let Some(a) = self.memo.find(key) {
            let p_actual = self.memo.p(a, actual);
            return Prediction::from_guesses(a.top3, a.label, actual, p_actual);
        }
        if self.memo.is_full() {
            return self.predict_past_memo(thread, h, kmax, actual);
        }
        if !self.looking_ahead {
            self.prefetch(h, kmax);
        }
        let (top3, label, dist) = self.answer(h, kmax);
        let p_actual = dist.get(usize::from(actual)).copied().unwrap_or(0.0);
        self.memo.insert(key, top3, label, dist);
        Prediction::from_guesses(top3, label, actual, p_actual)
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
    fn new() -> Self {
        Self {
            acc: [0.0; NUM_TOKENS],
            touched: 0,
            labels: [0.0; 8],
        }
    }

    fn add(&mut self, coef: f64, ctx: Ctx<'_>) {
        let Self {
            acc,
            touched,
            labels,
        } = self;
        ctx.for_each(|x, c| {
            let v = coef * f64::from(c);
            acc[x] += v;
            labels[usize::from(seed_label(x as u8)) & 7] += v;
            *touched |= 1 << x;
        });
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
        (
            beaten_by == 0,
            beaten_by < 3,
            self.best_label(rest) == seed_label(actual as u8),
        )
    }

    /// The heaviest collapsed label once `rest` is spread uniformly (ties to the lower label).
    fn best_label(&self, rest: f64) -> u8 {
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
        super::argmax(labels.get(..NUM_SEED_LABELS).unwrap_or_default())
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
        if self.answers_from_memo() {
            return self.predict_frozen(thread, h, kmax, actual);
        }
        self.predict_blend(thread, h, kmax, actual)
    }

    fn observe(&mut self, thread: u16, token: u8, learn: bool) {
        let h = self.history(thread);
        if learn {
            if self.frozen {
                self.frozen = false;
                self.memo.clear();
            }
            let kmax = self.order.min(usize::from(h.len));
            // A table that grows only invalidates its own cached index, which is not used.
            let cache_valid = self.cached_for == Some((thread, h.bits, h.len));
            if !cache_valid && !self.looking_ahead {
                self.prefetch(h, kmax);
            }
            for k in 0..=kmax.min(DENSE_ORDERS) {
                if let Some(d) = self.dense.get_mut(h.dense_index(k)) {
                    d.add(token);
                }
            }
            for (k, table) in (DENSE_ORDERS + 1..=kmax).zip(&mut self.tables) {
                let cached = self.cached[k];
                let i = if cache_valid && cached != NONE {
                    cached as usize
                } else {
                    table.find_or_insert(h.key(k))
                };
                table.add(i, token);
            }
        } else {
            self.frozen = true;
        }
        self.cached_for = None;
        self.history_mut(thread).push(token);
    }

    fn lookahead(&mut self, thread: u16, token: u8) {
        let t = usize::from(thread);
        if t >= self.ahead.len() {
            self.ahead.resize(t + 1, History::default());
        }
        let Some(h) = self.ahead.get_mut(t) else {
            return;
        };
        let before = *h;
        h.push(token);
        let kmax = self.order.min(usize::from(before.len));
        self.looking_ahead = true;
        // Frozen, a context answered before needs only its answer's line; a new one its blend.
        if self.answers_from_memo()
            && let Some(a) = self.memo.find(Self::memo_key(before, kmax))
        {
            self.memo.prefetch_p(a, token);
            return;
        }
        self.prefetch(before, kmax);
    }

    fn reset_history(&mut self) {
        self.threads.clear();
        self.cached_for = None;
        self.ahead.clear();
        self.looking_ahead = false;
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
        let order0 = Ctx::Dense(&m.dense[0]);
        assert!(order0.total() < 600);
        assert_eq!(order0.distinct(), 3);
        assert!(order0.count(5) >= 1);
        let mut sum = 0;
        order0.for_each(|_, c| sum += u32::from(c));
        assert_eq!(order0.total(), sum);
    }

    /// Frozen, the memo's answers are the blend's: for every token after every context of a
    /// held-out stream, hit or miss, and after the model learns again.
    #[test]
    fn the_memo_answers_as_the_blend_does() {
        let mut x = 11u64;
        let mut next = |i: u32| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            if i.is_multiple_of(4) {
                (x >> 59) as u8
            } else {
                (i % 5) as u8 * 9
            }
        };
        let mut memo = ContextModel::new(6);
        for i in 0..4000u32 {
            memo.observe((i % 3) as u16, next(i), true);
        }
        let mut blend = memo.clone();
        blend.use_memo = false;
        let mut compared = 0;
        for round in 0..2u32 {
            for i in 0..600u32 {
                let (thread, tok) = ((i % 3) as u16, next(i));
                for t in 0..64u8 {
                    let (a, b) = (memo.predict(thread, t), blend.predict(thread, t));
                    assert_eq!(a, b, "round {round}, call {i}, token {t}");
                    compared += 1;
                }
                memo.observe(thread, tok, false);
                blend.observe(thread, tok, false);
            }
            assert!(
                memo.memo.len() > 50,
                "{} contexts answered",
                memo.memo.len()
            );
            assert!(memo.memo.len() < 600, "contexts came back");
            for i in 0..500u32 {
                let tok = next(i);
                memo.observe(0, tok, true);
                blend.observe(0, tok, true);
            }
            assert!(memo.memo.is_empty(), "learning empties the memo");
        }
        assert_eq!(compared, 2 * 600 * 64);
    }

    /// Past its cap the memo keeps no more contexts, and the contexts it does not hold are
    /// still answered as the blend answers them.
    #[test]
    fn a_full_memo_still_answers_as_the_blend_does() {
        let mut x = 5u64;
        let mut next = || {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (x >> 58) as u8
        };
        let mut memo = ContextModel::new(3);
        for _ in 0..20_000 {
            let tok = next();
            memo.observe(0, tok, true);
        }
        let mut blend = memo.clone();
        blend.use_memo = false;
        let calls = super::super::memo::MAX_ANSWERS * 2;
        for i in 0..calls {
            let tok = next();
            let (a, b) = (memo.predict(0, tok), blend.predict(0, tok));
            assert_eq!(a, b, "call {i}");
            memo.observe(0, tok, false);
            blend.observe(0, tok, false);
        }
        assert!(memo.memo.is_full());
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
