//! The count tables of the context models (see [`super::context`] for the model).
//!
//! Orders 0 to 2 have at most 1 + 64 + 4096 contexts: each has a [`Dense`] entry, indexed
//! directly, with 64 `u8` counts (128 bytes, two cache lines fetched as a pair). Orders 3 and
//! up are hashed: a context is kept as a [`Sparse`] context of up to [`SPARSE_SLOTS`]
//! (token, count) pairs and `n`; one that meets a 25th distinct successor drops its rarest one
//! for it (the model is then that of the kept counts). Counts are halved, rounding up so no
//! token is forgotten, when one reaches 255, which also lets old behaviour fade.
//!
//! Most high-order contexts have seen one to three distinct successors, and the tables of a
//! long trace are tens of MiB, far beyond the L2 cache, so the size of a context is what its
//! lookup costs. The hashed table's [`Slot`] is 16 bytes (four to a cache line) holding the
//! exact key (the k tokens of 6 bits and the order) and up to [`SMALL_SLOTS`] pairs (`n` is
//! their sum); the fourth distinct successor moves the context, pairs in the same order, to a
//! 64-byte [`Sparse`] line of its own in a side array, its slot keeping the line's index. The
//! moved context then learns exactly as if it had been a [`Sparse`] one from the start (the
//! same pairs, order, counts and halvings). The slots are open addressing with linear
//! probing at a load of at most 1/2, doubled when fuller; nothing is allocated per event but
//! a moved context's line.

use super::tokens::NUM_TOKENS;
use crate::hash::HASH_MUL;

const COUNT_MAX: u8 = 255;
/// Successors a hashed context keeps.
pub const SPARSE_SLOTS: usize = 24;

/// The 64 counts of a dense context.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Counts([u8; NUM_TOKENS]);

impl Default for Counts {
    fn default() -> Self {
        Self([0; NUM_TOKENS])
    }
}

/// A context of order 0 to 2: its summary, then its counts on the next cache line.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(128))]
pub struct Dense {
    /// Bit x set when `counts[x] > 0`.
    mask: u64,
    total: u32,
    distinct: u32,
    counts: Counts,
}

impl Dense {
    /// Learns one more `token` after this context.
    pub fn add(&mut self, token: u8) {
        let x = usize::from(token) & (NUM_TOKENS - 1);
        let c = &mut self.counts.0[x];
        if *c == 0 {
            self.mask |= 1 << x;
            self.distinct += 1;
        }
        *c += 1;
        self.total += 1;
        if *c == COUNT_MAX {
            self.total = 0;
            for c in &mut self.counts.0 {
                *c = c.div_ceil(2);
                self.total += u32::from(*c);
            }
        }
    }
}

/// A hashed context of order 3 and up that has seen more than [`SMALL_SLOTS`] distinct
/// successors, one cache line.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(64))]
pub struct Sparse {
    total: u16,
    distinct: u8,
    _pad: [u8; 13],
    tokens: [u8; SPARSE_SLOTS],
    counts: [u8; SPARSE_SLOTS],
}

impl Sparse {
    /// Learns one more `token` after this context.
    pub fn add(&mut self, token: u8) {
        let n = usize::from(self.distinct).min(SPARSE_SLOTS);
        let slot = match self.tokens[..n].iter().position(|&t| t == token) {
            Some(i) => i,
            None if n < SPARSE_SLOTS => {
                self.tokens[n] = token;
                self.counts[n] = 0;
                self.distinct += 1;
                n
            }
            None => {
                // Full: the rarest successor (the first of equals) makes room.
                let mut i = 0;
                for (j, &c) in self.counts.iter().enumerate() {
                    if c < self.counts[i] {
                        i = j;
                    }
                }
                self.total -= u16::from(self.counts[i]);
                self.tokens[i] = token;
                self.counts[i] = 0;
                i
            }
        };
        let i = slot % SPARSE_SLOTS;
        self.counts[i] += 1;
        self.total += 1;
        if self.counts[i] == COUNT_MAX {
            self.total = 0;
            let n = usize::from(self.distinct).min(SPARSE_SLOTS);
            for c in &mut self.counts[..n] {
                *c = c.div_ceil(2);
                self.total += u16::from(*c);
            }
        }
    }
}

/// Successors a hashed context keeps in its [`Slot`] before it moves to a [`Sparse`] line.
pub const SMALL_SLOTS: usize = 3;
/// [`Slot::distinct`] of a context moved to a [`Sparse`] line.
const MOVED: u8 = u8::MAX;

/// A hashed context of order 3 and up: the key and, while it has seen at most
/// [`SMALL_SLOTS`] distinct successors, their counts; then the index of its [`Sparse`] line.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(16))]
pub struct Slot {
    /// 0 for an empty slot.
    key: u64,
    /// Pairs kept here (at most [`SMALL_SLOTS`]), or [`MOVED`].
    distinct: u8,
    /// Moved: the line's index, little-endian in `tokens` then `counts[0]`.
    tokens: [u8; SMALL_SLOTS],
    counts: [u8; SMALL_SLOTS],
    _pad: u8,
}

impl Slot {
    /// The index of the context's [`Sparse`] line, if it has moved.
    fn line(&self) -> Option<usize> {
        (self.distinct == MOVED).then(|| {
            let t = self.tokens;
            u32::from_le_bytes([t[0], t[1], t[2], self.counts[0]]) as usize
        })
    }

    /// The pairs as the [`Sparse`] line the context moves to.
    fn to_sparse(self) -> Sparse {
        let mut s = Sparse {
            distinct: self.distinct,
            ..Sparse::default()
        };
        s.tokens[..SMALL_SLOTS].copy_from_slice(&self.tokens);
        s.counts[..SMALL_SLOTS].copy_from_slice(&self.counts);
        s.total = self.counts.iter().map(|&c| u16::from(c)).sum();
        s
    }

    /// Learns one more `token`, as [`Sparse::add`] would, if it still fits; `false` when it
    /// is a new successor and the slot is full.
    fn add(&mut self, token: u8) -> bool {
        let n = usize::from(self.distinct).min(SMALL_SLOTS);
        let i = match self.tokens[..n].iter().position(|&t| t == token) {
            Some(i) => i,
            None if n < SMALL_SLOTS => {
                self.tokens[n] = token;
                self.distinct += 1;
                n
            }
            None => return false,
        };
        let i = i % SMALL_SLOTS;
        self.counts[i] += 1;
        if self.counts[i] == COUNT_MAX {
            for c in &mut self.counts[..n.max(i + 1)] {
                *c = c.div_ceil(2);
            }
        }
        true
    }
}

/// One context's statistics, whichever table holds them.
#[derive(Clone, Copy, Debug)]
pub enum Ctx<'a> {
    Dense(&'a Dense),
    Sparse(&'a Sparse),
    Small(&'a Slot),
}

impl<'a> Ctx<'a> {
    /// A hashed context's kept tokens and their counts (`None` for a dense one).
    fn pairs(self) -> Option<(&'a [u8], &'a [u8])> {
        let (tokens, counts, distinct): (&[u8], &[u8], u8) = match self {
            Self::Dense(_) => return None,
            Self::Sparse(s) => (&s.tokens, &s.counts, s.distinct),
            Self::Small(s) => (&s.tokens, &s.counts, s.distinct),
        };
        let n = usize::from(distinct).min(tokens.len());
        Some((tokens.get(..n)?, counts.get(..n)?))
    }

    /// Times the context was followed by a token (`n`).
    #[must_use]
    pub fn total(self) -> u32 {
        match self {
            Self::Dense(d) => d.total,
            Self::Sparse(s) => u32::from(s.total),
            // Each count was added once to `n`, and halving recomputes it as their sum.
            Self::Small(s) => s.counts.iter().map(|&c| u32::from(c)).sum(),
        }
    }

    /// Distinct tokens that followed it (`u`).
    #[must_use]
    pub fn distinct(self) -> u32 {
        match self {
            Self::Dense(d) => d.distinct,
            Self::Sparse(s) => u32::from(s.distinct),
            Self::Small(s) => u32::from(s.distinct).min(SMALL_SLOTS as u32),
        }
    }

    /// Times `token` followed it.
    #[must_use]
    pub fn count(self, token: u8) -> u8 {
        if let Self::Dense(d) = self {
            return d.counts.0[usize::from(token) & (NUM_TOKENS - 1)];
        }
        let Some((tokens, counts)) = self.pairs() else {
            return 0;
        };
        tokens
            .iter()
            .position(|&t| t == token)
            .and_then(|i| counts.get(i).copied())
            .unwrap_or(0)
    }

    /// Calls `f(token, count)` for every token that followed it.
    pub fn for_each(self, mut f: impl FnMut(usize, u8)) {
        match self {
            Self::Dense(d) => {
                let mut m = d.mask;
                while m != 0 {
                    let x = m.trailing_zeros() as usize & (NUM_TOKENS - 1);
                    m &= m - 1;
                    f(x, d.counts.0[x]);
                }
            }
            Self::Sparse(_) | Self::Small(_) => {
                let (tokens, counts) = self.pairs().unwrap_or_default();
                for (&t, &c) in tokens.iter().zip(counts) {
                    f(usize::from(t) & (NUM_TOKENS - 1), c);
                }
            }
        }
    }
}

/// The hashed table of one order: [`Slot`]s, and the [`Sparse`] lines of moved contexts.
#[derive(Clone, Debug)]
pub struct Table {
    entries: Vec<Slot>,
    lines: Vec<Sparse>,
    /// `64 - log2(capacity)`, for multiplicative hashing.
    shift: u32,
    used: usize,
}

impl Default for Table {
    fn default() -> Self {
        const INITIAL_LOG2: u32 = 12;
        Self {
            entries: vec![Slot::default(); 1 << INITIAL_LOG2],
            lines: Vec::new(),
            shift: 64 - INITIAL_LOG2,
            used: 0,
        }
    }
}

impl Table {
    /// Contexts stored.
    #[must_use]
    pub fn contexts(&self) -> usize {
        self.used
    }

    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(HASH_MUL) >> self.shift) as usize
    }

    /// Starts fetching the home entry of `key` into the cache, so that the misses of several
    /// tables, and of calls still to come, overlap with other work.
    pub fn prefetch(&self, key: u64) {
        prefetch_index::prefetch_index(&self.entries, self.home(key));
    }

    /// The entry index of `key` (non-zero), if stored.
    #[must_use]
    pub fn find(&self, key: u64) -> Option<usize> {
        let mask = self.entries.len() - 1;
        let mut i = self.home(key);
        loop {
            let k = self.entries.get(i)?.key;
            if k == key {
                return Some(i);
            }
            if k == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// The entry of `key` (non-zero), inserting an empty one (growing the table, which makes
    /// earlier entry indices stale).
    pub fn find_or_insert(&mut self, key: u64) -> usize {
        if (self.used + 1) * 2 > self.entries.len() {
            self.grow();
        }
        let mask = self.entries.len() - 1;
        let mut i = self.home(key);
        loop {
            let Some(e) = self.entries.get_mut(i) else {
                return i;
            };
            if e.key == key {
                return i;
            }
            if e.key == 0 {
                e.key = key;
                self.used += 1;
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// The context in entry `i`.
    #[must_use]
    pub fn ctx(&self, i: usize) -> Option<Ctx<'_>> {
        let slot = self.entries.get(i)?;
        match slot.line() {
            Some(line) => self.lines.get(line).map(Ctx::Sparse),
            None => Some(Ctx::Small(slot)),
        }
    }

    /// Learns one more `token` after the context in entry `i`.
    pub fn add(&mut self, i: usize, token: u8) {
        let Some(slot) = self.entries.get_mut(i) else {
            return;
        };
        if let Some(line) = slot.line() {
            if let Some(s) = self.lines.get_mut(line) {
                s.add(token);
            }
            return;
        }
        if slot.add(token) {
            return;
        }
        let Ok(line) = u32::try_from(self.lines.len()) else {
            return;
        };
        let mut s = slot.to_sparse();
        s.add(token);
        self.lines.push(s);
        let [a, b, c, d] = line.to_le_bytes();
        slot.distinct = MOVED;
        slot.tokens[..3].copy_from_slice(&[a, b, c]);
        slot.counts[0] = d;
    }

    fn grow(&mut self) {
        let cap = self.entries.len() * 2;
        let old = std::mem::replace(&mut self.entries, vec![Slot::default(); cap]);
        self.shift -= 1;
        let mask = cap - 1;
        for e in old {
            if e.key == 0 {
                continue;
            }
            let mut i = self.home(e.key);
            while self.entries.get(i).is_some_and(|t| t.key != 0) {
                i = (i + 1) & mask;
            }
            if let Some(slot) = self.entries.get_mut(i) {
                *slot = e;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_a_quarter_line_and_a_sparse_context_a_line() {
        assert_eq!(size_of::<Slot>(), 16);
        assert_eq!(size_of::<Sparse>(), 64);
    }

    #[test]
    fn a_full_sparse_context_drops_its_rarest_successor() {
        let mut s = Sparse::default();
        for t in 0..SPARSE_SLOTS as u8 {
            for _ in 0..=t {
                s.add(t);
            }
        }
        let before = Ctx::Sparse(&s).total();
        s.add(60);
        let c = Ctx::Sparse(&s);
        assert_eq!(c.distinct(), SPARSE_SLOTS as u32);
        assert_eq!(c.count(0), 0, "token 0 (seen once) made room");
        assert_eq!(c.count(60), 1);
        assert_eq!(c.total(), before);
        let mut sum = 0u32;
        c.for_each(|_, n| sum += u32::from(n));
        assert_eq!(sum, c.total());
    }

    /// A context that moves from its slot to a line learns exactly as a line from the start.
    #[test]
    fn a_small_context_moves_to_a_line_without_changing_a_count() {
        let mut table = Table::default();
        let key = (1 << 63) | 12_345;
        let mut reference = Sparse::default();
        let mut x = 3u32;
        for step in 0..5000u32 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            // Three tokens for a while (halving in the slot), then more and more of them.
            let spread = if step < 1500 { 3 } else { 3 + step / 100 };
            let t = ((x >> 16) % spread) as u8;
            let i = table.find_or_insert(key);
            table.add(i, t);
            reference.add(t);
            let c = table.find(key).and_then(|i| table.ctx(i)).unwrap();
            let r = Ctx::Sparse(&reference);
            assert_eq!(
                (c.total(), c.distinct()),
                (r.total(), r.distinct()),
                "step {step}"
            );
            let (mut got, mut want) = (Vec::new(), Vec::new());
            c.for_each(|t, n| got.push((t, n)));
            r.for_each(|t, n| want.push((t, n)));
            assert_eq!(got, want, "step {step}");
            assert!(step >= 1500 || matches!(c, Ctx::Small(_)));
        }
        assert!(matches!(
            table.ctx(table.find(key).unwrap()).unwrap(),
            Ctx::Sparse(_)
        ));
        assert_eq!(table.contexts(), 1);
    }

    #[test]
    fn sparse_and_dense_count_alike() {
        let (mut s, mut d) = (Sparse::default(), Dense::default());
        for i in 0..2000u32 {
            let t = (i * 7 % 11) as u8 + 3 * u8::from(i % 5 == 0);
            s.add(t);
            d.add(t);
        }
        let (cs, cd) = (Ctx::Sparse(&s), Ctx::Dense(&d));
        assert_eq!(cs.total(), cd.total());
        assert_eq!(cs.distinct(), cd.distinct());
        for t in 0..64 {
            assert_eq!(cs.count(t), cd.count(t));
        }
    }
}
