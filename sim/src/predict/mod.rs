//! How predictable is a program's allocation stream? The libtracemalloc article's question,
//! answered with context models on a CPU.
//!
//! - [`tokens`]: the article's 64-class token stream, per thread, and its collapsed 7-class label;
//! - [`context`]: order-K context models (an interpolated blend with PPM escapes over flat
//!   hashed count tables), whose answers a frozen model keeps by context (`memo`);
//! - [`baselines`]: majority class, last token, one period ago;
//! - [`eval`]: the time-ordered split, online (prequential) and cross-run evaluations and their
//!   figures;
//! - [`lifetime`]: the online short/long lifetime predictor the `predictive` policy uses.

pub mod baselines;
pub mod context;
pub mod eval;
pub mod lifetime;
mod memo;
pub mod streamed;
mod table;
pub mod tokens;
pub mod truth_tap;

use tokens::{NUM_SEED_LABELS, NUM_TOKENS, seed_label};

/// What a model's prediction of a thread's next token scored against the actual token.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Prediction {
    /// The actual token was the most probable one (ties go to the lower token).
    pub top1_hit: bool,
    /// The actual token was among the three most probable.
    pub top3_hit: bool,
    /// The actual token's collapsed label was the label with the most probability mass.
    pub seed_label_hit: bool,
    /// The probability the model gave the actual token.
    pub p_actual: f64,
}

impl Prediction {
    /// The score of guesses `top3` (best first) and collapsed label `label`.
    #[must_use]
    pub fn from_guesses(top3: [u8; 3], label: u8, actual: u8, p_actual: f64) -> Self {
        Self {
            top1_hit: top3[0] == actual,
            top3_hit: top3.contains(&actual),
            seed_label_hit: label == seed_label(actual),
            p_actual,
        }
    }

    /// The score of a full distribution `p` (non-negative, summing to 1).
    #[must_use]
    pub fn from_distribution(p: &[f64; NUM_TOKENS], actual: u8) -> Self {
        let mut top: [(f64, u8); 3] = [(-1.0, 0); 3];
        let mut labels = [0.0f64; NUM_SEED_LABELS];
        for (tok, &q) in (0u8..).zip(p.iter()) {
            insert_top3(&mut top, q, tok);
            if let Some(l) = labels.get_mut(usize::from(seed_label(tok))) {
                *l += q;
            }
        }
        let p_actual = p.get(usize::from(actual)).copied().unwrap_or(0.0);
        Self::from_guesses(top.map(|(_, t)| t), argmax(&labels), actual, p_actual)
    }
}

/// Keeps `top` the three largest `(value, token)` seen, visiting tokens in increasing order
/// (so a later token needs a strictly larger value to pass an earlier one).
pub(crate) fn insert_top3<T: PartialOrd + Copy>(top: &mut [(T, u8); 3], q: T, tok: u8) {
    if q > top[2].0 {
        if q > top[1].0 {
            top[2] = top[1];
            if q > top[0].0 {
                top[1] = top[0];
                top[0] = (q, tok);
            } else {
                top[1] = (q, tok);
            }
        } else {
            top[2] = (q, tok);
        }
    }
}

/// Index of the largest value (lowest index on ties).
pub(crate) fn argmax(values: &[f64]) -> u8 {
    let mut best = 0usize;
    for (i, &v) in values.iter().enumerate() {
        if v > values.get(best).copied().unwrap_or(f64::MIN) {
            best = i;
        }
    }
    u8::try_from(best).unwrap_or(0)
}

/// A next-token model. Each thread's tokens are one sequence: `predict` looks at the thread's
/// history, `observe` appends a token to it and, when `learn`, updates the statistics (a frozen
/// model reads its test data with `learn = false`).
pub trait Model {
    /// The model's name in tables and JSON (`order-3`, `majority`, ...).
    fn name(&self) -> String;
    /// The prediction for `thread`'s next token, scored against `actual` (which the decision
    /// never looks at: it only reads off the probability given to it).
    fn predict(&mut self, thread: u16, actual: u8) -> Prediction;
    /// Appends `token` to `thread`'s history, learning from it when `learn`.
    fn observe(&mut self, thread: u16, token: u8, learn: bool);
    /// Announces a call still to come (`thread` will see `token`), in the order the calls will
    /// be predicted or observed, so the model can start fetching the statistics it will read
    /// then. Changes no result; the default ignores it.
    fn lookahead(&mut self, thread: u16, token: u8) {
        let _ = (thread, token);
    }
    /// Forgets every thread's history but keeps what was learnt (a new run of the program),
    /// and any calls announced ahead.
    fn reset_history(&mut self);
}
