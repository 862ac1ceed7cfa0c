//! The baselines every context model must beat.
//!
//! - `majority`: the most frequent token so far (the article's 0.26 baseline); its distribution
//!   is the token frequencies with add-one smoothing.
//! - `last`: the thread's previous token again. For the log-loss it is given the probability
//!   with which "the same as the previous one" has been right so far (add-one smoothed), and the
//!   rest goes to the other tokens in proportion to their smoothed frequencies; the 2nd and 3rd
//!   guesses are the most frequent others, and the collapsed label is the guess's.
//! - `period`: the token one period ago, the period being the lag (1 to 64 tokens back in the
//!   thread) whose past guesses were right most often; distribution as for `last`. A thread with
//!   fewer tokens than any useful lag falls back to `majority`'s guess.
//!
//! Statistics are pooled over threads; each thread's own recent tokens are what is looked at.

use super::tokens::NUM_TOKENS;
use super::{Model, Prediction};

/// Longest lag `period` tries.
pub const MAX_LAG: usize = 64;

/// Token frequencies with add-one smoothing.
#[derive(Clone, Debug)]
struct Frequencies {
    counts: [u64; NUM_TOKENS],
    total: u64,
}

impl Default for Frequencies {
    fn default() -> Self {
        Self {
            counts: [0; NUM_TOKENS],
            total: 0,
        }
    }
}

impl Frequencies {
    fn add(&mut self, token: u8) {
        self.counts[usize::from(token) & (NUM_TOKENS - 1)] += 1;
        self.total += 1;
    }

    fn distribution(&self) -> [f64; NUM_TOKENS] {
        let denom = (self.total + NUM_TOKENS as u64) as f64;
        self.counts.map(|c| (c + 1) as f64 / denom)
    }

    /// The prediction of a rule that guesses `guess` and is right with probability `q`: the
    /// guess first, then the most frequent others; the guess's label; the others share `1 - q`
    /// in proportion to their smoothed frequencies.
    fn guessing(&self, guess: u8, q: f64, actual: u8) -> Prediction {
        let p = self.with_guess(guess, q);
        // Smoothed counts are at least 1, so every slot fills; ties keep the lower token.
        let mut top: [(u64, u8); 3] = [(0, 0); 3];
        for (tok, &c) in (0u8..).zip(self.counts.iter()) {
            if tok != guess {
                super::insert_top3(&mut top, c + 1, tok);
            }
        }
        Prediction::from_guesses(
            [guess, top[0].1, top[1].1],
            super::tokens::seed_label(guess),
            actual,
            p[usize::from(actual) & (NUM_TOKENS - 1)],
        )
    }

    /// `guess` gets `q`; the others share `1 - q` in proportion to their smoothed frequencies.
    fn with_guess(&self, guess: u8, q: f64) -> [f64; NUM_TOKENS] {
        let g = usize::from(guess) & (NUM_TOKENS - 1);
        let others = (self.total + NUM_TOKENS as u64 - (self.counts[g] + 1)) as f64;
        let mut p = self.counts.map(|c| (1.0 - q) * (c + 1) as f64 / others);
        p[g] = q;
        p
    }
}

/// Add-one smoothed rate of `hits` in `trials`.
fn rate(hits: u64, trials: u64) -> f64 {
    (hits + 1) as f64 / (trials + 2) as f64
}

/// `majority` (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Majority {
    freq: Frequencies,
}

impl Model for Majority {
    fn name(&self) -> String {
        "majority".to_owned()
    }

    fn predict(&mut self, _thread: u16, actual: u8) -> Prediction {
        Prediction::from_distribution(&self.freq.distribution(), actual)
    }

    fn observe(&mut self, _thread: u16, token: u8, learn: bool) {
        if learn {
            self.freq.add(token);
        }
    }

    fn reset_history(&mut self) {}
}

/// `last` (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Last {
    freq: Frequencies,
    previous: Vec<Option<u8>>,
    hits: u64,
    trials: u64,
}

impl Model for Last {
    fn name(&self) -> String {
        "last".to_owned()
    }

    fn predict(&mut self, thread: u16, actual: u8) -> Prediction {
        match self.previous.get(usize::from(thread)).copied().flatten() {
            Some(prev) => self
                .freq
                .guessing(prev, rate(self.hits, self.trials), actual),
            None => Prediction::from_distribution(&self.freq.distribution(), actual),
        }
    }

    fn observe(&mut self, thread: u16, token: u8, learn: bool) {
        let t = usize::from(thread);
        if t >= self.previous.len() {
            self.previous.resize(t + 1, None);
        }
        let Some(prev) = self.previous.get_mut(t) else {
            return;
        };
        if learn {
            self.freq.add(token);
            if let Some(p) = *prev {
                self.trials += 1;
                self.hits += u64::from(p == token);
            }
        }
        *prev = Some(token);
    }

    fn reset_history(&mut self) {
        self.previous.clear();
    }
}

/// A thread's last [`MAX_LAG`] tokens.
#[derive(Clone, Copy, Debug)]
struct Ring {
    tokens: [u8; MAX_LAG],
    len: usize,
}

impl Default for Ring {
    fn default() -> Self {
        Self {
            tokens: [0; MAX_LAG],
            len: 0,
        }
    }
}

impl Ring {
    /// The token `lag` (1..=64) back, if the thread has that many.
    fn back(&self, lag: usize) -> Option<u8> {
        (lag >= 1 && lag <= self.len.min(MAX_LAG)).then(|| self.tokens[(self.len - lag) % MAX_LAG])
    }

    fn push(&mut self, token: u8) {
        self.tokens[self.len % MAX_LAG] = token;
        self.len += 1;
    }
}

/// `period` (see the module docs).
#[derive(Clone, Debug)]
pub struct Period {
    freq: Frequencies,
    rings: Vec<Ring>,
    /// Index lag-1: how often the token `lag` back was the next one, out of how many tries.
    hits: [u64; MAX_LAG],
    trials: [u64; MAX_LAG],
}

impl Default for Period {
    fn default() -> Self {
        Self {
            freq: Frequencies::default(),
            rings: Vec::new(),
            hits: [0; MAX_LAG],
            trials: [0; MAX_LAG],
        }
    }
}

impl Period {
    /// The detected period available to `ring` and its smoothed hit rate.
    fn best_lag(&self, ring: &Ring) -> Option<(usize, f64)> {
        let mut best: Option<(usize, f64)> = None;
        for lag in 1..=ring.len.min(MAX_LAG) {
            let r = rate(self.hits[lag - 1], self.trials[lag - 1]);
            if best.is_none_or(|(_, b)| r > b) {
                best = Some((lag, r));
            }
        }
        best
    }
}

impl Model for Period {
    fn name(&self) -> String {
        "period".to_owned()
    }

    fn predict(&mut self, thread: u16, actual: u8) -> Prediction {
        let ring = self
            .rings
            .get(usize::from(thread))
            .copied()
            .unwrap_or_default();
        let guess = self
            .best_lag(&ring)
            .and_then(|(lag, q)| ring.back(lag).map(|t| (t, q)));
        match guess {
            Some((token, q)) => self.freq.guessing(token, q, actual),
            None => Prediction::from_distribution(&self.freq.distribution(), actual),
        }
    }

    fn observe(&mut self, thread: u16, token: u8, learn: bool) {
        let t = usize::from(thread);
        if t >= self.rings.len() {
            self.rings.resize(t + 1, Ring::default());
        }
        let Some(ring) = self.rings.get_mut(t) else {
            return;
        };
        if learn {
            self.freq.add(token);
            for lag in 1..=ring.len.min(MAX_LAG) {
                self.trials[lag - 1] += 1;
                self.hits[lag - 1] += u64::from(ring.back(lag) == Some(token));
            }
        }
        ring.push(token);
    }

    fn reset_history(&mut self) {
        self.rings.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(m: &mut dyn Model, tokens: &[u8]) {
        for &t in tokens {
            m.observe(0, t, true);
        }
    }

    #[test]
    fn majority_guesses_the_most_frequent() {
        let mut m = Majority::default();
        feed(&mut m, &[5, 5, 7, 5, 9, 7]);
        let p = m.predict(0, 7);
        assert!(!p.top1_hit && p.top3_hit);
        assert!((p.p_actual - 3.0 / 70.0).abs() < 1e-12);
        assert!(m.predict(0, 5).top1_hit);
        assert!(m.predict(0, 9).top3_hit);
        assert!(!m.predict(0, 0).top3_hit);
    }

    #[test]
    fn last_repeats_and_knows_its_hit_rate() {
        let mut m = Last::default();
        feed(&mut m, &[1, 1, 1, 2, 2]);
        // 4 tries, 3 hits: q = 4/6.
        let p = m.predict(0, 2);
        assert!(p.top1_hit);
        assert!((p.p_actual - 4.0 / 6.0).abs() < 1e-12);
        // The other guesses are the most frequent others (1 three times).
        assert!(m.predict(0, 1).top3_hit);
        // A poor hit rate still guesses the previous token first, then 2 and 1.
        let mut poor = Last::default();
        feed(&mut poor, &[1, 2, 1, 2, 1, 2, 1, 2, 2, 2, 2, 3]);
        assert!(poor.predict(0, 3).top1_hit);
        assert!(poor.predict(0, 1).top3_hit);
        assert!(!poor.predict(0, 4).top3_hit);
        // Another thread has no previous token: majority's guess.
        assert!(m.predict(1, 1).top1_hit);
    }

    #[test]
    fn period_finds_the_cycle() {
        let mut m = Period::default();
        let cycle = [10u8, 40, 11, 43, 12];
        for _ in 0..20 {
            feed(&mut m, &cycle);
        }
        for &next in &cycle {
            let p = m.predict(0, next);
            assert!(p.top1_hit);
            m.observe(0, next, true);
        }
        assert!(m.best_lag(&m.rings[0]).is_some_and(|(lag, _)| lag % 5 == 0));
    }
}
