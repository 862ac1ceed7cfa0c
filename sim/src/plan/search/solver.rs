//! The depth-first search of one decision problem ("do the units fit in `capacity`?"), after
//! minimalloc's `SolverImpl`; see the parent module for the algorithm.
//!
//! State (all undone on the way back, success included; the answer survives in `solution`):
//! `assigned`, `min_off` (lowest offset each unplaced unit can take given the placed ones),
//! `floor`/`total` per section (where the section's unplaced units can start at the lowest, and
//! how many bytes of them remain), and `cuts` (units crossing each section boundary that are
//! still unplaced). Changes to `min_off` and `floor` go on trails and are popped in reverse.

use std::time::Instant;

use super::SearchParams;
use super::sweep::Problem;
use crate::plan::align_up_saturating;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    Found,
    NotFound,
    /// Out of node budget (round-robin over heuristics).
    Aborted,
    Deadline,
}

/// A sub-problem being searched: its units in preorder, and its section range.
struct Part {
    preorder: Vec<u32>,
    sec_lo: u32,
    sec_hi: u32,
}

impl Part {
    fn unit(&self, i: u32) -> usize {
        self.preorder.get(i as usize).copied().unwrap_or(0) as usize
    }
}

pub(super) struct Solver<'a> {
    p: &'a Problem,
    params: &'a SearchParams,
    capacity: u64,
    deadline: Option<Instant>,
    heuristic: &'static str,
    assigned: Vec<bool>,
    min_off: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    cuts: Vec<u32>,
    pub solution: Vec<u64>,
    nodes_remaining: u64,
    pub nodes: u64,
    pub backtracks: u64,
    trail_min: Vec<(u32, u64)>,
    trail_floor: Vec<(u32, u64)>,
    stamp: Vec<u32>,
    epoch: u32,
    affected: Vec<u32>,
    pool: Vec<Vec<u32>>,
}

fn get<T: Copy + Default>(v: &[T], i: usize) -> T {
    v.get(i).copied().unwrap_or_default()
}

fn sections_of(span: (u32, u32)) -> std::ops::Range<usize> {
    span.0 as usize..span.1 as usize
}

impl<'a> Solver<'a> {
    pub fn new(
        p: &'a Problem,
        params: &'a SearchParams,
        capacity: u64,
        deadline: Option<Instant>,
    ) -> Self {
        let n = p.size.len();
        let s = p.sections.len();
        let total = p
            .sections
            .iter()
            .map(|m| {
                m.iter()
                    .fold(0u64, |acc, &b| acc.saturating_add(get(&p.size, b as usize)))
            })
            .collect();
        let mut cuts = vec![0u32; s];
        for &(lo, hi) in &p.span {
            for c in cuts
                .get_mut(lo as usize..(hi as usize).saturating_sub(1))
                .unwrap_or(&mut [])
            {
                *c += 1;
            }
        }
        Self {
            p,
            params,
            capacity,
            deadline,
            heuristic: params.heuristics.first().copied().unwrap_or("WAT"),
            assigned: vec![false; n],
            min_off: vec![0; n],
            floor: vec![0; s],
            total,
            cuts,
            solution: vec![0; n],
            nodes_remaining: u64::MAX,
            nodes: 0,
            backtracks: 0,
            trail_min: Vec::new(),
            trail_floor: Vec::new(),
            stamp: vec![0; s],
            epoch: 0,
            affected: Vec::new(),
            pool: Vec::new(),
        }
    }

    /// Solves every partition: one heuristic runs unbounded; several take turns with a node
    /// budget that doubles each round (minimalloc's round-robin with restarts).
    pub fn solve(&mut self) -> Status {
        let p = self.p;
        let parts = &p.partitions;
        let heuristics = self.params.heuristics;
        if heuristics.len() <= 1 {
            self.nodes_remaining = u64::MAX;
            for part in parts {
                let r = self.subsolve(&part.units, part.sec_lo, part.sec_hi);
                if r != Status::Found {
                    return r;
                }
            }
            return Status::Found;
        }
        let mut solved = vec![false; parts.len()];
        let mut limit = p.size.len() as u64;
        loop {
            limit = limit.saturating_mul(2).max(2);
            for &h in heuristics {
                self.heuristic = h;
                self.nodes_remaining = limit;
                let mut aborted = false;
                for (k, part) in parts.iter().enumerate() {
                    if get(&solved, k) {
                        continue;
                    }
                    match self.subsolve(&part.units, part.sec_lo, part.sec_hi) {
                        Status::Found => {
                            if let Some(s) = solved.get_mut(k) {
                                *s = true;
                            }
                        }
                        Status::Aborted => {
                            aborted = true;
                            break;
                        }
                        other => return other,
                    }
                }
                if !aborted {
                    return Status::Found;
                }
            }
        }
    }

    /// One field of the preordering heuristic, compared descending.
    fn key(&self, letter: u8, b: usize) -> u128 {
        let p = self.p;
        let (lower, upper) = (get(&p.lower, b), get(&p.upper, b));
        let size = get(&p.size, b);
        let span = get(&p.span, b);
        match letter {
            b'A' => u128::from(size) * u128::from(upper - lower),
            b'C' => u128::from(span.1 - span.0),
            b'L' => u128::from(lower),
            b'O' => p.overlaps.get(b).map_or(0, |o| o.len() as u128),
            b'T' => u128::from(
                self.total
                    .get(sections_of(span))
                    .unwrap_or(&[])
                    .iter()
                    .copied()
                    .max()
                    .unwrap_or(0),
            ),
            b'U' => u128::from(upper),
            b'W' => u128::from(upper - lower),
            b'Z' => u128::from(size),
            _ => 0,
        }
    }

    fn subsolve(&mut self, units: &[u32], sec_lo: u32, sec_hi: u32) -> Status {
        let letters = self.heuristic.as_bytes();
        let mut keyed: Vec<(Vec<u128>, u32)> = units
            .iter()
            .map(|&b| {
                let k = letters.iter().map(|&l| self.key(l, b as usize)).collect();
                (k, b)
            })
            .collect();
        keyed.sort_by(|(ka, a), (kb, b)| kb.cmp(ka).then(a.cmp(b)));
        let part = Part {
            preorder: keyed.into_iter().map(|(_, b)| b).collect(),
            sec_lo,
            sec_hi,
        };
        let root: Vec<u32> = (0..u32::try_from(part.preorder.len()).unwrap_or(u32::MAX)).collect();
        self.dfs(&part, &root, (0, 0))
    }

    fn dfs(&mut self, part: &Part, prev: &[u32], last: (u64, u32)) -> Status {
        if self.nodes_remaining == 0 {
            return Status::Aborted;
        }
        self.nodes_remaining -= 1;
        self.nodes += 1;
        // The clock is read at the first node and every 64th after it.
        if self.nodes % 64 == 1
            && let Some(d) = self.deadline
            && Instant::now() >= d
        {
            return Status::Deadline;
        }
        let mut cands = self.pool.pop().unwrap_or_default();
        cands.clear();
        cands.extend(
            prev.iter()
                .copied()
                .filter(|&i| !get(&self.assigned, part.unit(i))),
        );
        if cands.is_empty() {
            self.pool.push(cands);
            return Status::Found;
        }
        let min_off = &self.min_off;
        cands.sort_unstable_by_key(|&i| (get(min_off, part.unit(i)), i));
        let size = &self.p.size;
        let min_height = cands
            .iter()
            .map(|&i| {
                let b = part.unit(i);
                get(min_off, b).saturating_add(get(size, b))
            })
            .min()
            .unwrap_or(u64::MAX);
        let params = self.params;
        let mut result = Status::NotFound;
        for k in 0..cands.len() {
            let i = get(&cands, k);
            let b = part.unit(i);
            let o = get(&self.min_off, b);
            if params.canonical_only && (o, i) < last {
                continue;
            }
            if params.check_dominance && o >= min_height {
                // Candidates are sorted by offset: every later one is dominated too.
                break;
            }
            let marks = (self.trail_min.len(), self.trail_floor.len());
            let (ok, hat) = self.place(b, o, part);
            let r = if ok {
                self.descend(part, &cands, b, o, i)
            } else {
                Status::NotFound
            };
            self.unplace(b, marks);
            if r != Status::NotFound {
                result = r;
                break;
            }
            if params.hatless_pruning && !hat {
                // Nothing unplaced sat above `b`: choosing another unit first cannot help.
                break;
            }
        }
        if result == Status::NotFound {
            self.backtracks += 1;
        }
        self.pool.push(cands);
        result
    }

    /// Places `b` at `o`, propagates, and runs the cross-section check. Returns (check passed,
    /// `b` had an unplaced partner).
    fn place(&mut self, b: usize, o: u64, part: &Part) -> (bool, bool) {
        let p = self.p;
        if let Some(a) = self.assigned.get_mut(b) {
            *a = true;
        }
        let size = get(&p.size, b);
        let end = o.saturating_add(size);
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.stamp.iter_mut().for_each(|s| *s = 0);
            self.epoch = 1;
        }
        let mut affected = std::mem::take(&mut self.affected);
        affected.clear();
        let mut hat = false;
        for &j in p.overlaps.get(b).map_or(&[][..], Vec::as_slice) {
            let ju = j as usize;
            if get(&self.assigned, ju) {
                continue;
            }
            hat = true;
            let need = align_up_saturating(end, get(&p.align, ju));
            if let Some(m) = self.min_off.get_mut(ju)
                && *m < need
            {
                self.trail_min.push((j, *m));
                *m = need;
                if self.params.unallocated_floor {
                    for s in sections_of(get(&p.span, ju)) {
                        if let Some(st) = self.stamp.get_mut(s)
                            && *st != self.epoch
                        {
                            *st = self.epoch;
                            affected.push(u32::try_from(s).unwrap_or(u32::MAX));
                        }
                    }
                }
            }
        }
        for s in sections_of(get(&p.span, b)) {
            if let (Some(f), Some(t)) = (self.floor.get_mut(s), self.total.get_mut(s)) {
                self.trail_floor
                    .push((u32::try_from(s).unwrap_or(u32::MAX), *f));
                *f = (*f).max(end);
                *t = t.saturating_sub(size);
            }
        }
        for &s in &affected {
            let lowest = p
                .sections
                .get(s as usize)
                .map_or(&[][..], Vec::as_slice)
                .iter()
                .filter(|&&m| !get(&self.assigned, m as usize))
                .map(|&m| get(&self.min_off, m as usize))
                .min();
            if let (Some(m), Some(f)) = (lowest, self.floor.get_mut(s as usize))
                && *f < m
            {
                self.trail_floor.push((s, *f));
                *f = m;
            }
        }
        self.affected = affected;

        // Cross-section inference: the unplaced units of a section stack above its floor (and
        // above `o`, since later placements never go lower), so they must fit below capacity.
        let range = part.sec_lo as usize..part.sec_hi as usize;
        let floors = self.floor.get(range.clone()).unwrap_or(&[]);
        let totals = self.total.get(range).unwrap_or(&[]);
        let (mono, infer) = (self.params.monotonic_floor, self.params.section_inference);
        let cap = self.capacity;
        let ok = floors.iter().zip(totals).all(|(&f, &t)| {
            let f = if mono { f.max(o) } else { f };
            let f = if infer { f.saturating_add(t) } else { f };
            f <= cap
        });
        (ok, hat)
    }

    fn unplace(&mut self, b: usize, (trail_min, trail_floor): (usize, usize)) {
        while self.trail_floor.len() > trail_floor {
            if let Some((s, old)) = self.trail_floor.pop()
                && let Some(f) = self.floor.get_mut(s as usize)
            {
                *f = old;
            }
        }
        let size = get(&self.p.size, b);
        for s in sections_of(get(&self.p.span, b)) {
            if let Some(t) = self.total.get_mut(s) {
                *t = t.saturating_add(size);
            }
        }
        while self.trail_min.len() > trail_min {
            if let Some((j, old)) = self.trail_min.pop()
                && let Some(m) = self.min_off.get_mut(j as usize)
            {
                *m = old;
            }
        }
        if let Some(a) = self.assigned.get_mut(b) {
            *a = false;
        }
    }

    /// After placing `b` at `o`: split the part where `b` was the last unplaced unit crossing a
    /// section boundary (dynamic decomposition), else go on with the same candidates.
    fn descend(&mut self, part: &Part, cands: &[u32], b: usize, o: u64, i: u32) -> Status {
        if let Some(s) = self.solution.get_mut(b) {
            *s = o;
        }
        if !self.params.dynamic_decomposition {
            return self.dfs(part, cands, (o, i));
        }
        let span = get(&self.p.span, b);
        let boundaries = span.0 as usize..(span.1 as usize).saturating_sub(1);
        let mut cut_at = self.pool.pop().unwrap_or_default();
        cut_at.clear();
        for s in boundaries.clone() {
            if let Some(c) = self.cuts.get_mut(s) {
                *c = c.saturating_sub(1);
                if *c == 0 {
                    cut_at.push(u32::try_from(s + 1).unwrap_or(u32::MAX));
                }
            }
        }
        let r = if cut_at.is_empty() {
            self.dfs(part, cands, (o, i))
        } else {
            let mut r = Status::Found;
            let mut from = part.sec_lo;
            for to in cut_at.iter().copied().chain([part.sec_hi]) {
                let span_of = &self.p.span;
                let assigned = &self.assigned;
                let sub: Vec<u32> = part
                    .preorder
                    .iter()
                    .copied()
                    .filter(|&u| {
                        let (lo, hi) = get(span_of, u as usize);
                        !get(assigned, u as usize) && lo < to && hi > from
                    })
                    .collect();
                if !sub.is_empty() {
                    r = self.subsolve(&sub, from, to);
                    if r != Status::Found {
                        break;
                    }
                }
                from = to;
            }
            r
        };
        for s in boundaries {
            if let Some(c) = self.cuts.get_mut(s) {
                *c += 1;
            }
        }
        self.pool.push(cut_at);
        r
    }
}
