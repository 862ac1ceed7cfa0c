//! The heap at one moment, by allocation site, thread and size class: what a pprof or a
//! speedscope export holds. Allocations are counted from the start of the (windowed) input
//! to the moment; the live ones at it are `inuse`, as Go's heap profiles count them. With
//! sampled stacks the figures are estimates (`EventSites::alloc_weight`).

use allocview_loaders::analysis::sampling::Weight;
use allocview_loaders::analysis::site_stats::{self, EventSites, SiteRow};
use allocview_sim::heap::BlockState;
use allocview_sim::trace::{EventKind, NO_ALLOC_ID, TraceView, size_class};
use anyhow::Result;

use crate::answers::sites::policy_blocks_at;
use allocview_loaders::Loaded;

/// What a sample is keyed by: the allocation's stack, its thread and its size class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleKey {
    pub stack: u32,
    pub thread: u16,
    pub size_class: u8,
}

/// One sample's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub alloc_objects: u64,
    pub alloc_bytes: u64,
    pub inuse_objects: u64,
    pub inuse_bytes: u64,
    /// With a policy: the bytes its heap gives the live blocks (after its rounding).
    pub allocated_bytes: u64,
    /// With a policy: the free bytes of its heap that the live blocks pin
    /// ([`site_stats::pinned_free`]).
    pub pinned_free_bytes: u64,
}

/// The heap just after event `at`.
pub struct Moment {
    pub at: usize,
    /// Time from the input's first event to the moment.
    pub since_start_ns: i64,
    /// Samples in key order; only keys that allocated before the moment.
    pub samples: Vec<(SampleKey, Totals)>,
    /// The policy the `allocated` and `pinned_free` figures come from.
    pub policy: Option<String>,
    /// Whether the keys' threads and size classes are known (not for a heap profile's
    /// samples, which are by stack only).
    pub labelled: bool,
}

/// The samples of the heap just after `at`: every allocation up to it by key, and the live
/// ones; with `policy`, replayed to the moment for its allocated and pinned free bytes.
///
/// # Errors
/// When the policy cannot replay the trace to `at`.
pub fn moment_at(
    loaded: &Loaded,
    view: &TraceView<'_>,
    sites: &EventSites,
    threads: &[u16],
    at: usize,
    policy: Option<&str>,
) -> Result<Moment> {
    let mut index: std::collections::HashMap<SampleKey, usize> = Default::default();
    let mut samples: Vec<(SampleKey, Totals)> = Vec::new();
    // Per sample: allocated objects and bytes, live objects and bytes (fractional with
    // sampled stacks, where each allocation counts for its weight).
    let mut figures: Vec<[f64; 4]> = Vec::new();
    // Per allocation id: its sample and weight while live.
    let mut live: Vec<Option<(usize, Weight)>> = vec![None; view.num_allocs as usize];
    let n = view.len();
    let end = at.min(n.saturating_sub(1));
    for i in 0..n.min(end + 1) {
        let id = view.alloc_id.get(i).copied().unwrap_or(NO_ALLOC_ID);
        let size = view.size_bytes.get(i).copied().unwrap_or(0);
        match view.kind_at(i) {
            Some(EventKind::Alloc) => {
                let w = sites.alloc_weight(i, size);
                if w.count == 0.0 {
                    continue;
                }
                let key = SampleKey {
                    stack: sites.stack_at(i),
                    thread: threads.get(i).copied().unwrap_or(0),
                    size_class: size_class(size),
                };
                let s = *index.entry(key).or_insert_with(|| {
                    samples.push((key, Totals::default()));
                    figures.push([0.0; 4]);
                    samples.len() - 1
                });
                if let Some(f) = figures.get_mut(s) {
                    f[0] += w.count;
                    f[1] += w.bytes;
                    f[2] += w.count;
                    f[3] += w.bytes;
                }
                if let Some(slot) = live.get_mut(id as usize) {
                    *slot = Some((s, w));
                }
            }
            Some(EventKind::Free) => {
                if let Some((s, w)) = live.get_mut(id as usize).and_then(Option::take)
                    && let Some(f) = figures.get_mut(s)
                {
                    f[2] = (f[2] - w.count).max(0.0);
                    f[3] = (f[3] - w.bytes).max(0.0);
                }
            }
            _ => {}
        }
    }
    for ((_, t), f) in samples.iter_mut().zip(&figures) {
        let n = |v: f64| v.round() as u64;
        (t.alloc_objects, t.alloc_bytes) = (n(f[0]), n(f[1]));
        (t.inuse_objects, t.inuse_bytes) = (n(f[2]), n(f[3]));
    }
    if let Some(policy) = policy {
        add_policy(loaded, view, policy, end, &live, &mut samples)?;
    }
    let t0 = view.t_ns.first().copied().unwrap_or(0);
    let mut order: Vec<usize> = (0..samples.len()).collect();
    order.sort_by_key(|&i| samples.get(i).map(|(k, _)| *k));
    let samples = order
        .into_iter()
        .filter_map(|i| samples.get(i).copied())
        .collect();
    Ok(Moment {
        at: end,
        since_start_ns: view.t_ns.get(end).copied().unwrap_or(t0) - t0,
        samples,
        policy: policy.map(str::to_owned),
        labelled: true,
    })
}

/// A heap profile's samples at `moment` as a moment of the export (by stack only).
#[must_use]
pub fn of_profile(
    p: &allocview_loaders::profile::HeapProfile,
    moment: allocview_loaders::analysis::profile_sites::ProfileMoment,
) -> Moment {
    let samples = p
        .samples
        .iter()
        .map(|s| {
            let (live_bytes, live_objects) = moment.live(s);
            (
                SampleKey {
                    stack: s.stack,
                    thread: 0,
                    size_class: 0,
                },
                Totals {
                    alloc_objects: s.alloc_objects,
                    alloc_bytes: s.alloc_bytes,
                    inuse_objects: live_objects,
                    inuse_bytes: live_bytes,
                    ..Totals::default()
                },
            )
        })
        .collect();
    Moment {
        at: 0,
        since_start_ns: p
            .duration_ns
            .map_or(0, |d| i64::try_from(d).unwrap_or(i64::MAX)),
        samples,
        policy: None,
        labelled: false,
    }
}

/// Adds `policy`'s allocated and pinned free bytes at `at` to the samples of the blocks live
/// then (`live`: each allocation id's sample while live).
fn add_policy(
    loaded: &Loaded,
    view: &TraceView<'_>,
    policy: &str,
    at: usize,
    live: &[Option<(usize, Weight)>],
    samples: &mut [(SampleKey, Totals)],
) -> Result<()> {
    let blocks = policy_blocks_at(loaded, view, policy, at)?;
    for b in &blocks {
        if let BlockState::Used { id, .. } = b.state
            && let Some(Some((s, _))) = live.get(id as usize)
            && let Some((_, t)) = samples.get_mut(*s)
        {
            t.allocated_bytes = t.allocated_bytes.saturating_add(b.len_bytes);
        }
    }
    // One row per sample, holding its live blocks: the pinning rule is the one `sites`
    // applies to its rows.
    let mut rows: Vec<SiteRow> = vec![SiteRow::default(); samples.len()];
    for (id, slot) in live.iter().enumerate() {
        if let Some((s, _)) = slot
            && let Some(row) = rows.get_mut(*s)
        {
            row.live_ids.push(id as u32);
        }
    }
    for (i, pinned) in site_stats::pinned_free(&blocks, &rows)
        .into_iter()
        .enumerate()
    {
        if let Some((_, t)) = samples.get_mut(i) {
            t.pinned_free_bytes = pinned;
        }
    }
    Ok(())
}

/// The size class a sample's label names: the range of request sizes it holds,
/// `[low, high)` in powers of two.
#[must_use]
pub fn size_class_label(class: u8) -> String {
    if class == 0 {
        return "0B".to_owned();
    }
    let low = 1u64 << (class - 1).min(63);
    format!(
        "{}..{}",
        power_of_two(low),
        power_of_two(low.saturating_mul(2))
    )
}

/// A power of two of bytes, exactly, in the largest binary unit that divides it.
fn power_of_two(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes;
    let mut unit = 0;
    while v >= 1024 && v.is_multiple_of(1024) && unit + 1 < UNITS.len() {
        v /= 1024;
        unit += 1;
    }
    format!("{v}{}", UNITS.get(unit).copied().unwrap_or("B"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_class_label_names_its_range() {
        assert_eq!(size_class_label(0), "0B");
        assert_eq!(size_class_label(1), "1B..2B");
        assert_eq!(size_class_label(11), "1KiB..2KiB");
        assert_eq!(size_class_label(30), "512MiB..1GiB");
    }
}
