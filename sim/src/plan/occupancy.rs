//! Which offsets are taken, at some moment of a time window, by the buffers placed so far?
//!
//! Best fit (greedy-by-size) only needs the *union* of the offset ranges of the placed buffers
//! whose lifetimes meet the new buffer's, not the buffers themselves: the candidate holes are
//! the gaps of that union. On a malloc trace a long-lived buffer meets hundreds of thousands of
//! others (the shared git trace has 3.9e9 overlapping pairs), but their union is a handful of
//! ranges, so this index stores unions.
//!
//! Time is ranked by the distinct start times (two lifetimes meet iff each starts before the
//! other's end, which ranks preserve), and ranks are grouped into buckets of [`BUCKET`]. A
//! segment tree over buckets keeps, per node, `full` (the union of the buffers whose bucket range
//! is canonically decomposed onto that node: they cover all of it) and `any` (the union of every
//! buffer that meets the node's time range). A buffer that covers a bucket only in part is listed
//! in that bucket if it starts there (at most one buffer a start time, on a malloc trace), and
//! otherwise (it ends there) goes to the bucket's `ending` unions, one per rank of the bucket,
//! nested: any number of buffers may end in one bucket (a burst of frees), and scanning them for
//! every query was quadratic. A buffer that reaches the last start time covers the last bucket
//! whole (no rank follows it), so the buffers live to the end of a trace are never partial there.
//! A query unions `any` of its canonical nodes, `full` of the nodes above them and above its
//! partly covered end buckets, one `ending` union of each of those buckets, and the exactly
//! checked listed buffers of those buckets. An insertion touches O(log n) node unions and at
//! most a bucket's `ending` unions, and stops climbing as soon as a node's `any` already holds
//! the range (every ancestor's does too). Unions are sorted vectors of disjoint, non-touching
//! ranges.
//!
//! Long-lived buffers land in `full` of the top nodes, one node each, so a path's `full` sets
//! hold many ranges that only merge across nodes. Each node of the top [`CACHE_DEPTH`] levels
//! therefore also keeps `up`: the union of `full` over its whole path to the root, updated when a
//! `full` set above it grows (skipping subtrees whose `up` already holds the range). A query reads
//! one `up` set where its path enters those levels.

/// Ranks per bucket.
const BUCKET: usize = 128;
/// Levels of the tree (from the root) whose nodes keep an `up` union.
const CACHE_DEPTH: u32 = 8;

/// A union of byte ranges, sorted, disjoint and non-touching.
#[derive(Clone, Debug, Default)]
struct RangeSet(Vec<(u64, u64)>);

impl RangeSet {
    fn covers(&self, a: u64, b: u64) -> bool {
        let i = self.0.partition_point(|&(s, _)| s <= a);
        i > 0 && self.0.get(i - 1).is_some_and(|&(_, e)| e >= b)
    }

    fn insert(&mut self, a: u64, b: u64) {
        let lo = self.0.partition_point(|&(_, e)| e < a);
        let hi = self.0.partition_point(|&(s, _)| s <= b);
        if lo < hi {
            let s = self.0.get(lo).map_or(a, |r| r.0.min(a));
            let e = self.0.get(hi - 1).map_or(b, |r| r.1.max(b));
            self.0.drain(lo + 1..hi);
            if let Some(r) = self.0.get_mut(lo) {
                *r = (s, e);
            }
        } else {
            self.0.insert(lo, (a, b));
        }
    }
}

pub(crate) struct Occupancy {
    /// Ranks per bucket.
    bucket: usize,
    /// Rank range `[a, b)` of each interval.
    ranks: Vec<(usize, usize)>,
    /// Byte range of each placed interval.
    placed: Vec<Option<(u64, u64)>>,
    leaves: usize,
    full: Vec<RangeSet>,
    any: Vec<RangeSet>,
    /// Nodes of depth <= `cache_depth` keep `up`.
    cache_depth: u32,
    up: Vec<RangeSet>,
    /// Scratch space of `place`.
    scratch: Vec<usize>,
    /// Per bucket: placed intervals that start in it and cover it only in part, in the order
    /// of their offsets (so a query's loose ranges come as two sorted runs, merged without a
    /// sort).
    listed: Vec<Vec<u32>>,
    /// Per bucket, the placed intervals that start before it and end inside it: entry `j` is
    /// the union of those that reach past its `j`-th rank (so entry `j` holds entry `j + 1`),
    /// as long as the furthest-reaching one. Any number of intervals may end in one bucket
    /// (a burst of frees), so they are not listed: listed, every query scanned them all.
    ending: Vec<Vec<RangeSet>>,
    /// Steps taken so far: range-set updates, listed entries read or shifted. What a plan costs,
    /// counted rather than timed, so that tests can hold its growth.
    work: u64,
}

/// Node range `[from, to)` in buckets, for a heap-ordered node over `leaves` leaves.
fn node_range(node: usize, leaves: usize) -> (usize, usize) {
    let level = leaves.trailing_zeros() - depth(node);
    ((node << level) - leaves, ((node + 1) << level) - leaves)
}

/// Depth of a heap-ordered node (the root, node 1, has depth 0).
fn depth(node: usize) -> u32 {
    usize::BITS - 1 - node.leading_zeros()
}

impl Occupancy {
    /// An empty index over `intervals` (`(lower, upper)` per id, `lower < upper`).
    pub fn new(intervals: &[(u64, u64)]) -> Self {
        Self::with_shape(intervals, BUCKET, CACHE_DEPTH)
    }

    /// [`Occupancy::new`] with `bucket` ranks per bucket and `up` unions on the top
    /// `cache_depth` levels only.
    pub fn with_shape(intervals: &[(u64, u64)], bucket: usize, cache_depth: u32) -> Self {
        let bucket = bucket.max(1);
        let mut starts: Vec<u64> = intervals.iter().map(|iv| iv.0).collect();
        starts.sort_unstable();
        starts.dedup();
        let buckets = starts.len().div_ceil(bucket).max(1);
        let ranks = intervals
            .iter()
            .map(|&(lo, hi)| {
                let a = starts.partition_point(|&s| s < lo);
                let b = starts.partition_point(|&s| s < hi).max(a + 1);
                // No interval starts past the last start: one that reaches it meets every rank
                // to the end of the last bucket, which it thus covers whole. (Buffers live to
                // the end of a malloc trace would otherwise all cover the last bucket in part.)
                let b = if b >= starts.len() {
                    buckets * bucket
                } else {
                    b
                };
                (a, b)
            })
            .collect();
        let leaves = buckets.next_power_of_two();
        let cache_depth = cache_depth.min(leaves.trailing_zeros());
        Self {
            bucket,
            cache_depth,
            up: vec![RangeSet::default(); 2usize << cache_depth],
            scratch: Vec::new(),
            ranks,
            placed: vec![None; intervals.len()],
            leaves,
            full: vec![RangeSet::default(); 2 * leaves],
            any: vec![RangeSet::default(); 2 * leaves],
            listed: vec![Vec::new(); buckets],
            ending: vec![Vec::new(); buckets],
            work: 0,
        }
    }

    /// Steps taken so far (see the field).
    pub fn work(&self) -> u64 {
        self.work
    }

    /// Buckets wholly inside ranks `[a, b)`, and the (at most two) buckets it covers in part.
    fn split(&self, a: usize, b: usize) -> ((usize, usize), [Option<usize>; 2]) {
        let bucket = self.bucket;
        let first_full = a.div_ceil(bucket);
        let end_full = b / bucket;
        if first_full >= end_full {
            let (qa, qb) = (a / bucket, (b - 1) / bucket);
            return ((0, 0), [Some(qa), (qb != qa).then_some(qb)]);
        }
        let head = (!a.is_multiple_of(bucket)).then_some(a / bucket);
        let tail = (!b.is_multiple_of(bucket)).then_some(end_full);
        ((first_full, end_full), [head, tail])
    }

    /// Writes the canonical nodes of the bucket range `[from, to)` to `out`; returns how many.
    fn canonical(&self, from: usize, to: usize, out: &mut [usize]) -> usize {
        let (mut l, mut r) = (from + self.leaves, to + self.leaves);
        let mut count = 0;
        let mut push = |node: usize| {
            if let Some(slot) = out.get_mut(count) {
                *slot = node;
                count += 1;
            }
        };
        while l < r {
            if l & 1 == 1 {
                push(l);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                push(r);
            }
            l >>= 1;
            r >>= 1;
        }
        count
    }

    /// Adds `[off, end)` to `any` of `node` and its ancestors, until one already holds it.
    fn add_any(&mut self, mut node: usize, off: u64, end: u64) {
        while node > 0 {
            let Some(set) = self.any.get_mut(node) else {
                break;
            };
            self.work += 1;
            if set.covers(off, end) {
                break;
            }
            set.insert(off, end);
            node /= 2;
        }
    }

    /// Adds `[off, end)` to `up` of `node` and of its descendants in the cached levels, skipping
    /// subtrees that already hold it (a child's `up` contains its parent's).
    fn add_up(&mut self, node: usize, off: u64, end: u64) {
        if depth(node) > self.cache_depth {
            return;
        }
        let mut stack = std::mem::take(&mut self.scratch);
        stack.clear();
        stack.push(node);
        while let Some(x) = stack.pop() {
            let Some(set) = self.up.get_mut(x) else {
                continue;
            };
            self.work += 1;
            if set.covers(off, end) {
                continue;
            }
            set.insert(off, end);
            if depth(x) < self.cache_depth {
                stack.push(2 * x);
                stack.push(2 * x + 1);
            }
        }
        self.scratch = stack;
    }

    /// Adds `[off, end)`, of an interval that ends at rank `local_end` of bucket `q` (counted
    /// from the bucket's first), to `ending` of `q`: to entry `local_end - 1` and below, until
    /// one already holds it (every entry below holds it too).
    fn add_ending(&mut self, q: usize, local_end: usize, off: u64, end: u64) {
        let Some(sets) = self.ending.get_mut(q) else {
            return;
        };
        if sets.len() < local_end {
            sets.resize(local_end, RangeSet::default());
        }
        for set in sets.iter_mut().take(local_end).rev() {
            self.work += 1;
            if set.covers(off, end) {
                break;
            }
            set.insert(off, end);
        }
    }

    /// Records that interval `id` now occupies `[off, end)`.
    pub fn place(&mut self, id: usize, off: u64, end: u64) {
        let Some(&(a, b)) = self.ranks.get(id) else {
            return;
        };
        if let Some(p) = self.placed.get_mut(id) {
            *p = Some((off, end));
        }
        let ((from, to), parts) = self.split(a, b);
        // At most two canonical nodes per level.
        let mut nodes = [0usize; 2 * usize::BITS as usize];
        let count = self.canonical(from, to, &mut nodes);
        for &node in nodes.get(..count).unwrap_or(&[]) {
            if let Some(set) = self.full.get_mut(node) {
                set.insert(off, end);
            }
            self.add_any(node, off, end);
            self.add_up(node, off, end);
        }
        for q in parts.into_iter().flatten() {
            let bucket_start = q * self.bucket;
            if a < bucket_start {
                self.add_ending(q, b - bucket_start, off, end);
            } else if let Some(list) = self.listed.get_mut(q) {
                let placed = &self.placed;
                let offset_of = |o: &u32| placed.get(*o as usize).copied().flatten().map(|r| r.0);
                let at = list.partition_point(|o| offset_of(o) <= Some(off));
                self.work += (list.len() - at) as u64 + 1;
                list.insert(at, u32::try_from(id).unwrap_or(u32::MAX));
            }
            self.add_any(q + self.leaves, off, end);
        }
    }

    /// Lists the sorted range sets (`sources`) and loose ranges (`loose`, appended) whose union
    /// is exactly the union of the placed intervals meeting interval `id`'s lifetime. The loose
    /// ranges come in two runs, each sorted by offset: the returned index is where the second
    /// starts.
    pub fn taken(
        &mut self,
        id: usize,
        sources: &mut Vec<Source>,
        loose: &mut Vec<(u64, u64)>,
    ) -> usize {
        sources.clear();
        let Some(&(a, b)) = self.ranks.get(id) else {
            return loose.len();
        };
        let ((from, to), parts) = self.split(a, b);
        let mut canonical = [0usize; 2 * usize::BITS as usize];
        let count = self.canonical(from, to, &mut canonical);
        sources.extend(
            canonical
                .get(..count)
                .unwrap_or(&[])
                .iter()
                .map(|&c| Source::Any(c)),
        );
        // Nodes above the canonical ones, and above the partly covered buckets: their `full`
        // buffers cover all of them, so they meet the window. Each node is visited once.
        let mut leaves: [Option<usize>; 4] = [None; 4];
        if from < to {
            leaves[0] = Some(from + self.leaves);
            leaves[1] = Some(to - 1 + self.leaves);
        }
        leaves[2] = parts[0].map(|q| q + self.leaves);
        leaves[3] = parts[1].map(|q| q + self.leaves);
        // The paths share their upper parts: a walk stops at a node another walk has visited.
        let mut seen = [0usize; 4 * usize::BITS as usize];
        let mut seen_count = 0;
        for leaf in leaves.into_iter().flatten() {
            let mut node = leaf;
            while node > 0 && !seen.get(..seen_count).unwrap_or(&[]).contains(&node) {
                if let Some(slot) = seen.get_mut(seen_count) {
                    *slot = node;
                    seen_count += 1;
                }
                if depth(node) <= self.cache_depth {
                    // `up` holds `full` of this node and of everything above it. Any buffer in
                    // it covers a bucket the window meets, so it meets the window too.
                    if self.up.get(node).is_some_and(|s| !s.0.is_empty()) {
                        sources.push(Source::Up(node));
                    }
                    break;
                }
                let (lo, hi) = node_range(node, self.leaves);
                // Nodes inside the full range are canonical or below one: `any` covered them.
                if !(from <= lo && hi <= to) && self.full.get(node).is_some_and(|s| !s.0.is_empty())
                {
                    sources.push(Source::Full(node));
                }
                node /= 2;
            }
        }
        let mut second_run = loose.len();
        for (k, q) in parts.into_iter().enumerate() {
            if k == 1 {
                second_run = loose.len();
            }
            let Some(q) = q else { continue };
            // The intervals that end in the bucket and reach past the query's first rank in it.
            let local_start = a.saturating_sub(q * self.bucket);
            if self
                .ending
                .get(q)
                .and_then(|sets| sets.get(local_start))
                .is_some_and(|set| !set.0.is_empty())
            {
                sources.push(Source::Ending(q, local_start));
            }
            let listed = self.listed.get(q).map_or(&[][..], Vec::as_slice);
            self.work += listed.len() as u64;
            for &other in listed {
                let o = other as usize;
                let Some(&(oa, ob)) = self.ranks.get(o) else {
                    continue;
                };
                if oa < b
                    && a < ob
                    && let Some(Some(r)) = self.placed.get(o)
                {
                    loose.push(*r);
                }
            }
        }
        second_run
    }

    /// The sorted ranges of one source.
    pub fn ranges(&self, source: Source) -> &[(u64, u64)] {
        let set = match source {
            Source::Any(node) => self.any.get(node),
            Source::Full(node) => self.full.get(node),
            Source::Up(node) => self.up.get(node),
            Source::Ending(q, j) => self.ending.get(q).and_then(|sets| sets.get(j)),
        };
        set.map_or(&[][..], |s| s.0.as_slice())
    }
}

/// A node's range set, as listed by [`Occupancy::taken`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Any(usize),
    Full(usize),
    Up(usize),
    /// `ending` of a bucket, from a rank of it on.
    Ending(usize, usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_set_coalesces_touching_and_overlapping_ranges() {
        let mut s = RangeSet::default();
        s.insert(10, 20);
        s.insert(30, 40);
        s.insert(20, 25);
        assert_eq!(s.0, vec![(10, 25), (30, 40)]);
        s.insert(5, 35);
        assert_eq!(s.0, vec![(5, 40)]);
        assert!(s.covers(6, 40));
        assert!(!s.covers(4, 6));
        s.insert(50, 60);
        assert!(!s.covers(35, 55));
    }

    #[test]
    fn taken_is_the_union_of_the_meeting_placed_intervals() {
        // Deterministic pseudo-random lifetimes over ~300 ranks, placed in random order; after
        // each placement, every query must equal the brute-force union.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let ivs: Vec<(u64, u64)> = (0..300)
            .map(|_| {
                let lo = next(300);
                let len = if next(4) == 0 {
                    next(300) + 1
                } else {
                    next(20) + 1
                };
                (lo, lo + len)
            })
            .collect();
        for bucket in [1, 3, 8, BUCKET] {
            for cache_depth in [0, 1, 2, CACHE_DEPTH] {
                check_against_brute_force(&ivs, bucket, cache_depth, &mut next);
            }
        }
    }

    fn check_against_brute_force(
        ivs: &[(u64, u64)],
        bucket: usize,
        cache_depth: u32,
        next: &mut impl FnMut(u64) -> u64,
    ) {
        let mut occ = Occupancy::with_shape(ivs, bucket, cache_depth);
        let mut placed: Vec<(usize, u64, u64)> = Vec::new();
        let (mut sources, mut out) = (Vec::new(), Vec::new());
        let union = |mut v: Vec<(u64, u64)>| {
            v.sort_unstable();
            let mut s = RangeSet::default();
            for (a, b) in v {
                s.insert(a, b);
            }
            s.0
        };
        for step in 0..300 {
            let id = step * 7 % 300;
            let off = next(1000);
            let end = off + next(50) + 1;
            occ.place(id, off, end);
            placed.push((id, off, end));
            if step % 10 != 9 {
                continue;
            }
            for q in 0..ivs.len() {
                out.clear();
                let second = occ.taken(q, &mut sources, &mut out);
                let (first_run, second_run) = out.split_at(second.min(out.len()));
                assert!(first_run.is_sorted_by_key(|r| r.0), "loose runs are sorted");
                assert!(
                    second_run.is_sorted_by_key(|r| r.0),
                    "loose runs are sorted"
                );
                out.sort_unstable();
                let mut merged = out.clone();
                for &src in &sources {
                    let r = occ.ranges(src);
                    assert!(r.is_sorted(), "node sets are sorted");
                    merged.extend_from_slice(r);
                }
                let (lo, hi) = ivs[q];
                let want: Vec<(u64, u64)> = placed
                    .iter()
                    .filter(|&&(p, _, _)| ivs[p].0 < hi && lo < ivs[p].1)
                    .map(|&(_, o, e)| (o, e))
                    .collect();
                assert_eq!(
                    union(merged),
                    union(want),
                    "query {q} after {step}, bucket {bucket}, cache depth {cache_depth}"
                );
            }
        }
    }
}
