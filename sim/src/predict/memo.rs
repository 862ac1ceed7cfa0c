//! A frozen context model's answers, by context.
//!
//! Frozen, the model's prediction after a context depends on nothing else: the blend of its
//! orders is the same every time the context comes back. Held-out calls repeat their contexts
//! (git's 229,155 held-out calls have about 20,000 distinct order-8 histories), so the model
//! blends each context once, keeping its whole distribution, its three first tokens and its
//! heaviest collapsed label, and answers its returns from here: one probe of a small table
//! that stays in cache and one line of the distribution, instead of nine orders' lookups and
//! the blend. The answers are the blend's own numbers (see `ContextModel::answer`), so the
//! figures do not move by a bit.
//!
//! Learning changes the blends, so the model empties the memo when it learns. The memo holds at
//! most [`MAX_ANSWERS`] contexts (64 MiB of distributions); past that, a context it does not
//! hold is blended as without a memo (stopping as soon as the decisions are certain).

use super::tokens::NUM_TOKENS;
use crate::hash::HASH_MUL;

/// Contexts the memo answers at most.
pub(crate) const MAX_ANSWERS: usize = 1 << 17;
const INITIAL_LOG2: u32 = 10;
/// Distributions to a chunk (256 KiB).
const CHUNK: usize = 512;

/// One context's answer: its three first tokens (ties to the lower token), its heaviest
/// collapsed label, and where its distribution is.
#[derive(Clone, Copy, Debug, Default)]
pub struct Answer {
    pub top3: [u8; 3],
    pub label: u8,
    dist: u32,
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// The context's key (non-zero; 0 marks an empty slot).
    key: u64,
    answer: Answer,
}

/// The answers of a frozen model, by context key (open addressing, linear probing, load at most
/// a half).
#[derive(Clone, Debug)]
pub struct Memo {
    slots: Vec<Slot>,
    /// The distributions, [`CHUNK`] to a vector, so that growing never copies them.
    dists: Vec<Vec<[f64; NUM_TOKENS]>>,
    answers: usize,
    /// `64 - log2(slots)`, for multiplicative hashing.
    shift: u32,
}

impl Default for Memo {
    fn default() -> Self {
        Self {
            slots: vec![Slot::default(); 1 << INITIAL_LOG2],
            dists: Vec::new(),
            answers: 0,
            shift: 64 - INITIAL_LOG2,
        }
    }
}

impl Memo {
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(HASH_MUL) >> self.shift) as usize
    }

    /// Contexts answered.
    #[cfg(test)]
    #[must_use]
    pub fn len(&self) -> usize {
        self.answers
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.answers == 0
    }

    /// Whether it keeps no more answers.
    #[must_use]
    pub fn is_full(&self) -> bool {
        self.answers >= MAX_ANSWERS
    }

    /// Forgets every answer (the model has learnt).
    pub fn clear(&mut self) {
        if !self.is_empty() {
            *self = Self::default();
        }
    }

    /// The answer for `key` (non-zero), if kept.
    #[must_use]
    pub fn find(&self, key: u64) -> Option<Answer> {
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        loop {
            let slot = self.slots.get(i)?;
            if slot.key == key {
                return Some(slot.answer);
            }
            if slot.key == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// The probability `answer`'s context gives `token`.
    #[must_use]
    pub fn p(&self, answer: Answer, token: u8) -> f64 {
        self.dist(answer)
            .and_then(|d| d.get(usize::from(token)).copied())
            .unwrap_or(0.0)
    }

    fn dist(&self, answer: Answer) -> Option<&[f64; NUM_TOKENS]> {
        let i = answer.dist as usize;
        self.dists.get(i / CHUNK)?.get(i % CHUNK)
    }

    /// Starts fetching the line of `answer`'s distribution that holds `token`.
    pub fn prefetch_p(&self, answer: Answer, token: u8) {
        let line = usize::from(token) / 8;
        if let Some(d) = self.dist(answer) {
            prefetch_index::prefetch_index(d, line * 8);
        }
    }

    /// Keeps the answer for `key` (non-zero, not kept yet), unless the memo is full.
    pub fn insert(&mut self, key: u64, top3: [u8; 3], label: u8, dist: [f64; NUM_TOKENS]) {
        if self.is_full() {
            return;
        }
        if (self.answers + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let Ok(index) = u32::try_from(self.answers) else {
            return;
        };
        let answer = Answer {
            top3,
            label,
            dist: index,
        };
        if !self.place(key, answer) {
            return;
        }
        match self.dists.last_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push(dist),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(dist);
                self.dists.push(chunk);
            }
        }
        self.answers += 1;
    }

    /// Puts `answer` in `key`'s first free slot; false when `key` is kept already.
    fn place(&mut self, key: u64, answer: Answer) -> bool {
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        loop {
            let Some(slot) = self.slots.get_mut(i) else {
                return false;
            };
            if slot.key == key {
                return false;
            }
            if slot.key == 0 {
                *slot = Slot { key, answer };
                return true;
            }
            i = (i + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        self.slots = vec![Slot::default(); old.len() * 2];
        self.shift -= 1;
        for slot in old.into_iter().filter(|s| s.key != 0) {
            self.place(slot.key, slot.answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_survive_growth_and_the_cap_holds() {
        let mut memo = Memo::default();
        let key = |i: usize| (1u64 << 63) | i as u64;
        for i in 0..5000 {
            let mut dist = [0.0; NUM_TOKENS];
            dist[i % NUM_TOKENS] = i as f64;
            memo.insert(key(i), [(i % 64) as u8, 1, 2], (i % 7) as u8, dist);
        }
        assert_eq!(memo.len(), 5000);
        for i in [0, 1, 777, 4999] {
            let a = memo.find(key(i)).expect("kept");
            assert_eq!((a.top3[0], a.label), ((i % 64) as u8, (i % 7) as u8));
            assert_eq!(memo.p(a, (i % NUM_TOKENS) as u8), i as f64);
        }
        assert!(memo.find(key(5000)).is_none());
        // Keeping a key again changes nothing.
        memo.insert(key(3), [9, 9, 9], 0, [1.0; NUM_TOKENS]);
        assert_eq!(memo.len(), 5000);
        assert_eq!(memo.find(key(3)).expect("kept").top3, [3, 1, 2]);
        memo.clear();
        assert!(memo.is_empty() && memo.find(key(3)).is_none());
    }

    #[test]
    fn a_full_memo_keeps_no_more() {
        let mut memo = Memo::default();
        for i in 0..=MAX_ANSWERS {
            memo.insert((1u64 << 63) | i as u64, [0; 3], 0, [0.0; NUM_TOKENS]);
        }
        assert_eq!(memo.len(), MAX_ANSWERS);
        assert!(memo.find((1u64 << 63) | MAX_ANSWERS as u64).is_none());
    }
}
