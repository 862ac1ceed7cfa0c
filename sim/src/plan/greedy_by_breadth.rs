//! `greedy-by-breadth`: TFLite's shared-object planner `GreedyByBreadthAssignment` (Pisarchyk &
//! Lee 2020).
//!
//! The *breadth* of a moment is the sum of the sizes live then. Moments are visited from the
//! broadest down (ties in time order); at each, its still unassigned buffers are taken largest
//! first (ties in input order). A buffer goes into the existing object that suits its size best
//! among those holding nothing live at the same time as it: the smallest object at least as large
//! as the buffer, else the largest smaller one (which then grows to the buffer's size); ties go
//! to the lowest object id. With no such object it opens a new one. The objects are then laid end
//! to end, so the pool is the sum of the object sizes.
//!
//! Moments are the elementary stretches between consecutive distinct start/end times (the
//! integer tasks of TFLite's closed intervals give the same order). Each object keeps its
//! members' lifetimes in an ordered map, so a compatibility test is O(log n); the live buffers of
//! a moment come from an interval index, and the visit stops once every buffer is placed.
//! O(n log n + sum over visited moments of live count * log n + n * objects * log n).

use std::collections::BTreeMap;

use super::interval_index::IntervalIndex;
use super::units::{Unit, prepare};
use super::{Buffer, Plan, PlanError, SharedObjects, objects_plan};

/// Plans `buffers` as shared objects; `align_bytes` is the minimum alignment of each object.
///
/// # Errors
/// An input error of the buffers ([`super::validate()`]'s rules), or a bad alignment option.
pub fn plan(buffers: &[Buffer], align_bytes: u64) -> Result<(Plan, SharedObjects), PlanError> {
    let units = prepare(buffers, align_bytes)?;
    let (unit_object, sizes) = assign(&units.units);
    objects_plan(&units, &unit_object, sizes)
}

/// An object's members' lifetimes, `lower -> upper`, pairwise disjoint.
#[derive(Default)]
pub(crate) struct Schedule(BTreeMap<u64, u64>);

impl Schedule {
    /// True when `[lower, upper)` meets no member.
    pub fn is_free(&self, lower: u64, upper: u64) -> bool {
        // Members are disjoint, so the last one starting before `upper` ends last among them.
        self.0
            .range(..upper)
            .next_back()
            .is_none_or(|(_, &end)| end <= lower)
    }

    pub fn insert(&mut self, lower: u64, upper: u64) {
        self.0.insert(lower, upper);
    }

    /// Smallest gap between `[lower, upper)` and a member, `None` when one intersects it.
    pub fn distance(&self, lower: u64, upper: u64) -> Option<u64> {
        if !self.is_free(lower, upper) {
            return None;
        }
        let before = self
            .0
            .range(..upper)
            .next_back()
            .map(|(_, &end)| lower - end);
        let after = self
            .0
            .range(upper..)
            .next()
            .map(|(&start, _)| start - upper);
        match (before, after) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

fn assign(units: &[Unit]) -> (Vec<usize>, Vec<u64>) {
    // Breadth of every elementary stretch, by sweeping starts and ends (ends first).
    let mut events: Vec<(u64, bool, u64)> = Vec::with_capacity(units.len() * 2);
    for u in units {
        events.push((u.lower, true, u.size_bytes));
        events.push((u.upper, false, u.size_bytes));
    }
    events.sort_unstable();
    let mut moments: Vec<(u64, u64)> = Vec::new(); // (breadth, start time)
    let mut live: u64 = 0;
    let mut k = 0;
    while let Some(&(t, _, _)) = events.get(k) {
        while let Some(&(et, is_start, size)) = events.get(k) {
            if et != t {
                break;
            }
            live = if is_start {
                live.saturating_add(size)
            } else {
                live.saturating_sub(size)
            };
            k += 1;
        }
        if live > 0 {
            moments.push((live, t));
        }
    }
    moments.sort_by_key(|m| std::cmp::Reverse(m.0));

    let spans: Vec<(u64, u64)> = units.iter().map(|u| (u.lower, u.upper)).collect();
    let mut index = IntervalIndex::new(&spans);
    for i in 0..units.len() {
        index.insert(i);
    }
    let mut unit_object: Vec<Option<usize>> = vec![None; units.len()];
    let mut sizes: Vec<u64> = Vec::new();
    let mut schedules: Vec<Schedule> = Vec::new();
    let mut remaining = units.len();
    let (mut hits, mut stack) = (Vec::new(), Vec::new());
    for (_, t) in moments {
        if remaining == 0 {
            break;
        }
        hits.clear();
        index.overlapping(t, t.saturating_add(1), &mut hits, &mut stack);
        hits.retain(|&i| unit_object.get(i as usize).is_some_and(Option::is_none));
        hits.sort_by(|&a, &b| {
            let size = |i: u32| units.get(i as usize).map_or(0, |u| u.size_bytes);
            size(b).cmp(&size(a)).then(a.cmp(&b))
        });
        for &i in &hits {
            let Some(u) = units.get(i as usize) else {
                continue;
            };
            let mut best: Option<usize> = None;
            for (o, (schedule, &cur)) in schedules.iter().zip(&sizes).enumerate() {
                if let Some(b) = best {
                    let best_size = sizes.get(b).copied().unwrap_or(0);
                    let better = if best_size < u.size_bytes {
                        cur > best_size
                    } else {
                        cur >= u.size_bytes && cur < best_size
                    };
                    if !better {
                        continue;
                    }
                }
                if schedule.is_free(u.lower, u.upper) {
                    best = Some(o);
                }
            }
            let o = match best {
                Some(o) => {
                    if let Some(s) = sizes.get_mut(o) {
                        *s = (*s).max(u.size_bytes);
                    }
                    o
                }
                None => {
                    sizes.push(u.size_bytes);
                    schedules.push(Schedule::default());
                    sizes.len() - 1
                }
            };
            if let Some(s) = schedules.get_mut(o) {
                s.insert(u.lower, u.upper);
            }
            if let Some(slot) = unit_object.get_mut(i as usize) {
                *slot = Some(o);
            }
            remaining -= 1;
        }
    }
    (
        unit_object.into_iter().map(|o| o.unwrap_or(0)).collect(),
        sizes,
    )
}
