//! A static interval index: which of the intervals inserted so far intersect a query interval?
//!
//! All intervals are known up front (a planner places a known set one by one), so they are
//! sorted by `lower` once, and a segment tree over that order keeps, for each node, the largest
//! `upper` among the inserted intervals below it (0 when none). A query `[lo, hi)` wants
//! `lower < hi && upper > lo`: the first condition is a prefix of the sorted order (binary
//! search), and the descent skips every subtree whose largest `upper` is `<= lo`. Insertion is
//! O(log n), a query O((k + 1) log n) for k results. This is what keeps the greedy planners from
//! scanning every placed buffer (quadratic) on large inputs.

pub(crate) struct IntervalIndex {
    /// Interval ids in increasing `lower` order.
    by_lower: Vec<u32>,
    lowers: Vec<u64>,
    /// Position of each id in `by_lower`.
    pos_of: Vec<u32>,
    uppers: Vec<u64>,
    /// Segment tree, leaves at `leaves..2 * leaves`.
    max_upper: Vec<u64>,
    leaves: usize,
}

impl IntervalIndex {
    /// An index over `intervals` (`(lower, upper)` per id), with none inserted yet.
    pub fn new(intervals: &[(u64, u64)]) -> Self {
        let mut by_lower: Vec<u32> = (0..intervals.len())
            .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
            .collect();
        by_lower.sort_by_key(|&i| intervals.get(i as usize).map_or(0, |iv| iv.0));
        let lowers = by_lower
            .iter()
            .map(|&i| intervals.get(i as usize).map_or(0, |iv| iv.0))
            .collect();
        let mut pos_of = vec![0u32; intervals.len()];
        for (p, &i) in by_lower.iter().enumerate() {
            if let Some(slot) = pos_of.get_mut(i as usize) {
                *slot = u32::try_from(p).unwrap_or(u32::MAX);
            }
        }
        let leaves = intervals.len().next_power_of_two().max(1);
        Self {
            by_lower,
            lowers,
            pos_of,
            uppers: intervals.iter().map(|iv| iv.1).collect(),
            max_upper: vec![0; 2 * leaves],
            leaves,
        }
    }

    /// Marks interval `id` as present.
    pub fn insert(&mut self, id: usize) {
        let (Some(&pos), Some(&upper)) = (self.pos_of.get(id), self.uppers.get(id)) else {
            return;
        };
        let mut node = self.leaves + pos as usize;
        while node > 0 {
            match self.max_upper.get_mut(node) {
                Some(m) if *m < upper => *m = upper,
                _ => break,
            }
            node /= 2;
        }
    }

    /// Appends to `out` the ids of the present intervals that intersect `[lo, hi)`, in no
    /// particular order. `stack` is scratch space.
    pub fn overlapping(
        &self,
        lo: u64,
        hi: u64,
        out: &mut Vec<u32>,
        stack: &mut Vec<(usize, usize, usize)>,
    ) {
        let end = self.lowers.partition_point(|&l| l < hi);
        if end == 0 {
            return;
        }
        stack.clear();
        stack.push((1, 0, self.leaves));
        while let Some((node, from, to)) = stack.pop() {
            if from >= end || self.max_upper.get(node).is_none_or(|&m| m <= lo) {
                continue;
            }
            if to - from == 1 {
                if let Some(&id) = self.by_lower.get(from) {
                    out.push(id);
                }
                continue;
            }
            let mid = from + (to - from) / 2;
            stack.push((2 * node + 1, mid, to));
            stack.push((2 * node, from, mid));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_exactly_the_present_intersecting_intervals() {
        let ivs = [(0, 4), (2, 3), (3, 9), (5, 6), (8, 10), (0, 1)];
        let mut idx = IntervalIndex::new(&ivs);
        let (mut out, mut stack) = (Vec::new(), Vec::new());
        idx.overlapping(0, 100, &mut out, &mut stack);
        assert!(out.is_empty());
        for id in [0, 2, 3, 5] {
            idx.insert(id);
        }
        for (lo, hi) in [(0, 1), (1, 3), (3, 4), (4, 5), (6, 8), (9, 12), (10, 12)] {
            out.clear();
            idx.overlapping(lo, hi, &mut out, &mut stack);
            out.sort_unstable();
            let want: Vec<u32> = [0u32, 2, 3, 5]
                .into_iter()
                .filter(|&i| {
                    let (l, u) = ivs[i as usize];
                    l < hi && lo < u
                })
                .collect();
            assert_eq!(out, want, "query [{lo}, {hi})");
        }
    }
}
