//! Preprocessing for the search (minimalloc's `sweeper`, without gaps): sections, spans,
//! overlaps and partitions.
//!
//! Every unit contributes a start point and an end point, sorted by (time, ends first, index).
//! At each end time the set of live units is recorded as a *section*: section `k` holds the units
//! live just before the k-th distinct end time, so its members pairwise collide and must stack.
//! Every moment's live set is inside some section. A unit's *span* is the range of sections it
//! belongs to (contiguous). Units live at the same time are *overlaps* of each other (both
//! directions, ascending). A *partition* is a maximal stretch during which something is live:
//! partitions share nothing and are solved independently. O(n log n + pairs + total section
//! size); `None` when the overlap pairs exceed the given cap (the search would not pay off).

use super::super::units::Unit;

pub(super) struct Partition {
    /// Its units, in sweep order.
    pub units: Vec<u32>,
    pub sec_lo: u32,
    pub sec_hi: u32,
}

pub(super) struct Problem {
    pub size: Vec<u64>,
    pub align: Vec<u64>,
    pub lower: Vec<u64>,
    pub upper: Vec<u64>,
    pub overlaps: Vec<Vec<u32>>,
    /// Section range `[lo, hi)` of each unit.
    pub span: Vec<(u32, u32)>,
    /// Members of each section, ascending.
    pub sections: Vec<Vec<u32>>,
    pub partitions: Vec<Partition>,
}

fn idx(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

pub(super) fn sweep(units: &[Unit], max_pairs: usize) -> Option<Problem> {
    let n = units.len();
    if u32::try_from(n).is_err() {
        return None;
    }
    // (time, is_start, unit): ends sort before starts at equal times.
    let mut points: Vec<(u64, bool, u32)> = Vec::with_capacity(2 * n);
    for (i, u) in units.iter().enumerate() {
        points.push((u.lower, true, idx(i)));
        points.push((u.upper, false, idx(i)));
    }
    points.sort_unstable();

    let mut overlaps: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut span = vec![(0u32, 0u32); n];
    let mut sections: Vec<Vec<u32>> = Vec::new();
    let mut partitions: Vec<Partition> = Vec::new();
    let mut actives: Vec<u32> = Vec::new();
    let mut pos_in_actives = vec![usize::MAX; n];
    let mut section_start = vec![0u32; n];
    let mut last_time = points.first().map_or(0, |p| p.0);
    let mut current: Option<Partition> = None;
    let mut pairs = 0usize;
    for (t, is_start, b) in points {
        let bu = b as usize;
        if is_start {
            if actives.is_empty() {
                current = Some(Partition {
                    units: Vec::new(),
                    sec_lo: idx(sections.len()),
                    sec_hi: idx(sections.len()),
                });
            }
            if let Some(p) = current.as_mut() {
                p.units.push(b);
            }
            pairs += actives.len();
            if pairs > max_pairs {
                return None;
            }
            for &a in &actives {
                if let Some(list) = overlaps.get_mut(a as usize) {
                    list.push(b);
                }
            }
            if let Some(list) = overlaps.get_mut(bu) {
                list.extend_from_slice(&actives);
            }
            if let Some(p) = pos_in_actives.get_mut(bu) {
                *p = actives.len();
            }
            actives.push(b);
            if let Some(s) = section_start.get_mut(bu) {
                *s = idx(sections.len());
            }
        } else {
            if t > last_time {
                let mut members = actives.clone();
                members.sort_unstable();
                sections.push(members);
                last_time = t;
            }
            // Swap-remove `b` from the actives.
            let at = pos_in_actives.get(bu).copied().unwrap_or(usize::MAX);
            if at < actives.len() {
                actives.swap_remove(at);
                if let Some(&moved) = actives.get(at)
                    && let Some(p) = pos_in_actives.get_mut(moved as usize)
                {
                    *p = at;
                }
            }
            if let Some(s) = span.get_mut(bu) {
                *s = (
                    section_start.get(bu).copied().unwrap_or(0),
                    idx(sections.len()),
                );
            }
            if actives.is_empty()
                && let Some(mut p) = current.take()
            {
                p.sec_hi = idx(sections.len());
                partitions.push(p);
            }
        }
    }
    for list in &mut overlaps {
        list.sort_unstable();
    }
    Some(Problem {
        size: units.iter().map(|u| u.size_bytes).collect(),
        align: units.iter().map(|u| u.align_bytes).collect(),
        lower: units.iter().map(|u| u.lower).collect(),
        upper: units.iter().map(|u| u.upper).collect(),
        overlaps,
        span,
        sections,
        partitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(size_bytes: u64, lower: u64, upper: u64) -> Unit {
        Unit {
            size_bytes,
            lower,
            upper,
            align_bytes: 1,
        }
    }

    #[test]
    fn readme_example_sections_and_partitions() {
        // minimalloc's README example: b1 [0,3), b2 [3,9), b3 [0,9), b4 [9,21), b5 [0,21).
        let units = [
            unit(4, 0, 3),
            unit(4, 3, 9),
            unit(4, 0, 9),
            unit(4, 9, 21),
            unit(4, 0, 21),
        ];
        let p = sweep(&units, usize::MAX).unwrap();
        assert_eq!(p.sections, vec![vec![0, 2, 4], vec![1, 2, 4], vec![3, 4]]);
        assert_eq!(p.span, vec![(0, 1), (1, 2), (0, 2), (2, 3), (0, 3)]);
        assert_eq!(p.overlaps[0], vec![2, 4]);
        assert_eq!(p.overlaps[3], vec![4]);
        assert_eq!(p.partitions.len(), 1);

        let apart = [unit(1, 0, 2), unit(1, 2, 4), unit(1, 3, 5)];
        let p = sweep(&apart, usize::MAX).unwrap();
        let ranges: Vec<_> = p.partitions.iter().map(|q| (q.sec_lo, q.sec_hi)).collect();
        assert_eq!(ranges, vec![(0, 1), (1, 3)]);
        assert!(sweep(&units, 3).is_none(), "6 pairs exceed a cap of 3");
    }
}
