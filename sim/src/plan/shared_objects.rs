//! `shared-objects`: TFLite's shared-object greedy by size (`GreedyBySizeDistPriorityAssignment`,
//! Pisarchyk & Lee 2020), the strategy TFLite's GPU delegate calls `GREEDY_BY_SIZE` for objects.
//!
//! First the positional maximums ([`super::bounds`]): `posmax[k]` is the largest k-th largest
//! live size over time, a lower bound on the k-th object. A buffer's *position* is the last `k`
//! with `posmax[k] >= size`, so large buffers get small positions. Each buffer also tracks its
//! *best distance*: the smallest time gap to a member of an object it is compatible with (no
//! member live at the same time), and that object. Then, n times: take the unassigned buffer of
//! smallest position, then smallest best distance, then largest size (then lowest index); put it
//! into its best object (which grows to its size if needed), or into a new object if it has
//! none; and update every unassigned buffer's distances to that object, recomputing the best
//! object of those that just became incompatible with their best one. Ties between objects go to
//! the lowest id, and a best object changes only for a strictly smaller distance, as in TFLite.
//! The objects are laid end to end: the pool is the sum of the object sizes.
//!
//! Like TFLite this is quadratic: O(n^2 log n) with objects' members in ordered maps (TFLite
//! keeps an n x objects distance matrix instead). It is meant for graph plans (hundreds to
//! thousands of tensors), not for whole malloc traces.

use super::bounds::positional_maximums;
use super::greedy_by_breadth::Schedule;
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

/// `a < b` where `None` is infinitely far.
fn closer(a: Option<u64>, b: Option<u64>) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => x < y,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Time gap between two disjoint lifetimes, `None` when they intersect.
fn gap(a: &Unit, b: &Unit) -> Option<u64> {
    if a.upper <= b.lower {
        Some(b.lower - a.upper)
    } else if b.upper <= a.lower {
        Some(a.lower - b.upper)
    } else {
        None
    }
}

#[derive(Clone, Copy)]
struct Priority {
    position: usize,
    best_dist: Option<u64>,
    best_object: usize,
}

fn assign(units: &[Unit]) -> (Vec<usize>, Vec<u64>) {
    let posmax = positional_maximums(units.iter().map(|u| (u.lower, u.upper, u.size_bytes)));
    let mut info: Vec<Priority> = units
        .iter()
        .map(|u| Priority {
            position: posmax
                .partition_point(|&p| p >= u.size_bytes)
                .saturating_sub(1),
            best_dist: None,
            best_object: 0,
        })
        .collect();
    let mut unit_object: Vec<Option<usize>> = vec![None; units.len()];
    let mut sizes: Vec<u64> = Vec::new();
    let mut schedules: Vec<Schedule> = Vec::new();
    let mut was_compatible = vec![false; units.len()];
    for _ in 0..units.len() {
        let mut pick: Option<usize> = None;
        for (i, (p, u)) in info.iter().zip(units).enumerate() {
            if unit_object.get(i).is_some_and(Option::is_some) {
                continue;
            }
            let better = match pick.and_then(|b| Some((info.get(b)?, units.get(b)?))) {
                None => true,
                Some((bp, bu)) => {
                    p.position < bp.position
                        || (p.position == bp.position
                            && (closer(p.best_dist, bp.best_dist)
                                || (p.best_dist == bp.best_dist && u.size_bytes > bu.size_bytes)))
                }
            };
            if better {
                pick = Some(i);
            }
        }
        let (Some(t), Some(tu)) = (pick, pick.and_then(|t| units.get(t))) else {
            break;
        };
        let chosen = info.get(t).copied();
        let (obj, new_object) = match chosen {
            Some(Priority {
                best_dist: Some(_),
                best_object,
                ..
            }) => (best_object, false),
            _ => {
                sizes.push(0);
                schedules.push(Schedule::default());
                (sizes.len() - 1, true)
            }
        };
        if let Some(slot) = unit_object.get_mut(t) {
            *slot = Some(obj);
        }
        if let Some(s) = sizes.get_mut(obj) {
            *s = (*s).max(tu.size_bytes);
        }
        // Which unassigned buffers could still join `obj` before `t` went in.
        for (r, (flag, u)) in was_compatible.iter_mut().zip(units).enumerate() {
            *flag = unit_object.get(r).is_some_and(Option::is_none)
                && (new_object
                    || schedules
                        .get(obj)
                        .is_some_and(|s| s.is_free(u.lower, u.upper)));
        }
        if let Some(s) = schedules.get_mut(obj) {
            s.insert(tu.lower, tu.upper);
        }
        for (r, u) in units.iter().enumerate() {
            if !was_compatible.get(r).copied().unwrap_or(false) {
                continue;
            }
            let Some(p) = info.get_mut(r) else { continue };
            let dist = gap(u, tu);
            if dist.is_none() && !new_object && p.best_object == obj {
                // Its best object is now out of reach: look again over all objects.
                p.best_dist = None;
                for (o, s) in schedules.iter().enumerate() {
                    let d = s.distance(u.lower, u.upper);
                    if closer(d, p.best_dist) {
                        p.best_dist = d;
                        p.best_object = o;
                    }
                }
            }
            if closer(dist, p.best_dist) {
                p.best_dist = dist;
                p.best_object = obj;
            }
        }
    }
    (
        unit_object.into_iter().map(|o| o.unwrap_or(0)).collect(),
        sizes,
    )
}
