//! The free blocks of one buddy order: a bitmap over block positions (address >> shift) with
//! two summary levels, so the lowest free block is found in three word scans.
//!
//! The bitmap and its first summary are dense for their first 2^23 positions' words (1 MiB:
//! every real heap here fits, and pays no page lookup) and paged beyond: a page of words
//! exists only while one of its words is not zero. A heap's free blocks are few beside its
//! positions (a footprint of terabytes, which a trace's sizes can ask for, has billions of
//! order-0 positions), so memory follows the free blocks, not the footprint; only the second
//! summary is dense, one bit per 2^18 positions.

use crate::heap::Addr;

/// Words in a page: 4 KiB, 32,768 positions of the bitmap.
const PAGE_WORDS: usize = 512;

/// A page of words and how many of them are not zero.
#[derive(Clone, Debug)]
struct Page {
    words: Box<[u64; PAGE_WORDS]>,
    nonzero: u32,
}

/// Empty pages kept for reuse: a free block that comes and goes at a page's edge would
/// otherwise allocate and zero a page each time.
const SPARE_PAGES: usize = 16;

/// Words held in one dense vector before pages take over: 1 MiB, 2 GiB of order-0 positions
/// of 256 B. A heap that small (every real one here) pays no page lookups.
const DENSE_WORDS: usize = 1 << 17;

/// A vector of words read as zero where nothing holds them: dense up to [`DENSE_WORDS`], then
/// in pages.
#[derive(Clone, Debug, Default)]
struct PagedWords {
    dense: Vec<u64>,
    /// Pages of the words from [`DENSE_WORDS`] on.
    pages: Vec<Option<Page>>,
    /// Dropped pages, all zero, for the next page made.
    spare: Vec<Box<[u64; PAGE_WORDS]>>,
}

impl PagedWords {
    fn get(&self, w: usize) -> u64 {
        if w < DENSE_WORDS {
            return self.dense.get(w).copied().unwrap_or(0);
        }
        let w = w - DENSE_WORDS;
        self.pages
            .get(w / PAGE_WORDS)
            .and_then(Option::as_ref)
            .and_then(|p| p.words.get(w % PAGE_WORDS))
            .copied()
            .unwrap_or(0)
    }

    /// Word `w` changed by `f`: the word before. One lookup of a dense word.
    #[inline]
    fn update(&mut self, w: usize, f: impl FnOnce(u64) -> u64) -> u64 {
        if let Some(word) = self.dense.get_mut(w) {
            let old = *word;
            *word = f(old);
            return old;
        }
        let old = self.get(w);
        self.set(w, f(old));
        old
    }

    /// Sets word `w` to `value`, making its page when it was none and dropping the page when
    /// its last non-zero word becomes zero.
    fn set(&mut self, w: usize, value: u64) {
        if w < DENSE_WORDS {
            if w >= self.dense.len() {
                if value == 0 {
                    return;
                }
                self.dense.resize(w + 1, 0);
            }
            if let Some(word) = self.dense.get_mut(w) {
                *word = value;
            }
            return;
        }
        let w = w - DENSE_WORDS;
        let p = w / PAGE_WORDS;
        if self.pages.len() <= p {
            if value == 0 {
                return;
            }
            self.pages.resize(p + 1, None);
        }
        let Some(slot) = self.pages.get_mut(p) else {
            return;
        };
        let spare = &mut self.spare;
        let page = slot.get_or_insert_with(|| Page {
            words: spare.pop().unwrap_or_else(|| Box::new([0; PAGE_WORDS])),
            nonzero: 0,
        });
        let Some(word) = page.words.get_mut(w % PAGE_WORDS) else {
            return;
        };
        match (*word != 0, value != 0) {
            (false, true) => page.nonzero += 1,
            (true, false) => page.nonzero -= 1,
            _ => {}
        }
        *word = value;
        if page.nonzero == 0
            && let Some(empty) = slot.take()
            && self.spare.len() < SPARE_PAGES
        {
            self.spare.push(empty.words);
        }
    }

    /// The non-zero words with their indices, in increasing order.
    fn nonzero(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        let dense = self
            .dense
            .iter()
            .enumerate()
            .filter(|&(_, &w)| w != 0)
            .map(|(i, &w)| (i, w));
        let paged = self.pages.iter().enumerate().flat_map(|(p, page)| {
            page.iter().flat_map(move |page| {
                page.words
                    .iter()
                    .enumerate()
                    .filter(|&(_, &w)| w != 0)
                    .map(move |(i, &w)| (DENSE_WORDS + p * PAGE_WORDS + i, w))
            })
        });
        dense.chain(paged)
    }
}

/// The free blocks of one order.
#[derive(Clone, Debug)]
pub(super) struct BlockSet {
    shift: u32,
    bits: PagedWords,
    /// Bit j: `bits[j] != 0`.
    words: PagedWords,
    /// Bit m: `words[m] != 0`.
    groups: Vec<u64>,
    len: usize,
}

impl BlockSet {
    pub(super) fn new(shift: u32) -> Self {
        Self {
            shift,
            bits: PagedWords::default(),
            words: PagedWords::default(),
            groups: Vec::new(),
            len: 0,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Word index and bit mask of `addr`'s position.
    fn slot(&self, addr: Addr) -> (usize, u64) {
        let i = addr >> self.shift;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    pub(super) fn contains(&self, addr: Addr) -> bool {
        let (w, bit) = self.slot(addr);
        self.bits.get(w) & bit != 0
    }

    pub(super) fn insert(&mut self, addr: Addr) {
        let (w, bit) = self.slot(addr);
        let b = self.bits.update(w, |b| b | bit);
        if b & bit != 0 {
            return;
        }
        self.len += 1;
        if b == 0 {
            let s = w / 64;
            self.words.update(s, |x| x | 1 << (w % 64));
            let m = w / 4096;
            if self.groups.len() <= m {
                self.groups.resize(m + 1, 0);
            }
            if let Some(g) = self.groups.get_mut(m) {
                *g |= 1 << (s % 64);
            }
        }
    }

    /// Removes `addr`; false when it was not there.
    pub(super) fn remove(&mut self, addr: Addr) -> bool {
        let (w, bit) = self.slot(addr);
        let b = self.bits.update(w, |b| b & !bit);
        if b & bit == 0 {
            return false;
        }
        self.len -= 1;
        if b & !bit == 0 {
            let s = w / 64;
            let summary = self.words.update(s, |x| x & !(1 << (w % 64))) & !(1 << (w % 64));
            if summary == 0
                && let Some(g) = self.groups.get_mut(w / 4096)
            {
                *g &= !(1 << (s % 64));
            }
        }
        true
    }

    /// The lowest address in the set.
    pub(super) fn first(&self) -> Option<Addr> {
        let (m, g) = self.groups.iter().enumerate().find(|&(_, &g)| g != 0)?;
        let s = m * 64 + g.trailing_zeros() as usize;
        let w = s * 64 + self.words.get(s).trailing_zeros() as usize;
        let i = w as u64 * 64 + u64::from(self.bits.get(w).trailing_zeros());
        Some(i << self.shift)
    }

    /// Self-check of the summary levels and the count.
    pub(super) fn check(&self) -> Result<(), String> {
        let mut count = 0usize;
        for (w, word) in self.bits.nonzero() {
            count += word.count_ones() as usize;
            if self.words.get(w / 64) & (1 << (w % 64)) == 0 {
                return Err(format!("summary bit of word {w} not set"));
            }
        }
        for (s, summary) in self.words.nonzero() {
            for bit in 0..64 {
                if summary & (1 << bit) != 0 && self.bits.get(s * 64 + bit) == 0 {
                    return Err(format!(
                        "summary bit of word {} set, word empty",
                        s * 64 + bit
                    ));
                }
            }
            let marked = self
                .groups
                .get(s / 64)
                .is_some_and(|g| g & (1 << (s % 64)) != 0);
            if !marked {
                return Err(format!("group bit of summary word {s} not set"));
            }
        }
        for (m, &g) in self.groups.iter().enumerate() {
            for bit in 0..64 {
                if g & (1 << bit) != 0 && self.words.get(m * 64 + bit) == 0 {
                    return Err(format!(
                        "group bit of summary word {} set, word empty",
                        m * 64 + bit
                    ));
                }
            }
        }
        if count != self.len {
            return Err(format!("{count} bits set, len says {}", self.len));
        }
        Ok(())
    }

    /// Every address in the set, in increasing order.
    pub(super) fn iter(&self) -> impl Iterator<Item = Addr> + '_ {
        self.bits.nonzero().flat_map(move |(w, word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let b = u64::from(rest.trailing_zeros());
                rest &= rest - 1;
                Some(((w as u64) * 64 + b) << self.shift)
            })
        })
    }

    /// Bytes the set holds beyond its own struct (its pages and group words).
    pub(super) fn heap_bytes(&self) -> usize {
        let pages = |p: &PagedWords| {
            p.dense.capacity() * 8
                + p.pages.len() * std::mem::size_of::<Option<Page>>()
                + (p.pages.iter().flatten().count() + p.spare.len()) * PAGE_WORDS * 8
        };
        pages(&self.bits) + pages(&self.words) + self.groups.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_blocks_far_apart_cost_pages_not_the_span_between_them() {
        // Order-0 blocks of 256 B, one near 0 and one past 4 TiB: a dense bitmap would be
        // 2 GiB; the pages are a few KiB, with an index of the pages between.
        let mut s = BlockSet::new(8);
        s.insert(256);
        s.insert(4 << 40);
        assert!(s.heap_bytes() < 16 << 20, "{} bytes", s.heap_bytes());
        assert_eq!(s.first(), Some(256));
        assert_eq!(s.iter().collect::<Vec<_>>(), [256, 4 << 40]);
        s.check().unwrap();
        assert!(s.remove(256));
        assert_eq!(s.first(), Some(4 << 40));
        assert!(s.remove(4 << 40));
        assert!(s.is_empty() && s.first().is_none());
        s.check().unwrap();
        assert!(!s.contains(4 << 40) && !s.remove(4 << 40));
    }
}
