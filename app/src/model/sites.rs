//! The explorers' sites panel: memory by allocation site at the cursor, one site selected, its
//! blocks highlighted in the heap map and its live bytes drawn on the timeline.
//!
//! Sites come from [`allocview_loaders::analysis::site_stats`] (call stacks, a TensorFlow log's
//! operations, or size classes for a trace without stacks). The table at the cursor is one pass
//! over the events up to the end of the trace (allocations over the run are part of it), so it
//! is computed only while the panel is open and only when the cursor has moved.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use allocview_loaders::analysis::site_stats::{self, EventSites, GroupBy, SiteRow};
use allocview_sim::series::Bucketing;
use allocview_sim::trace::{EventKind, TraceView};

/// The panel's state.
#[derive(Clone, Default)]
pub struct SitesState {
    pub open: bool,
    /// Index into the table at the cursor.
    pub selected: usize,
    /// The table and the event it was computed at.
    rows: Option<(usize, Arc<Vec<SiteRow>>)>,
    /// The selected site's name and its live bytes per time bucket (maximum in the bucket).
    series: Option<(String, Arc<Vec<u64>>)>,
}

impl SitesState {
    /// Recomputes what is stale: the table when the cursor moved, the series (in the buckets
    /// of `bucketing`, those of the timeline it is drawn on) when the selected site changed.
    /// Nothing while the panel is closed.
    pub fn refresh(
        &mut self,
        view: &TraceView<'_>,
        sites: &EventSites,
        cursor: usize,
        bucketing: Bucketing,
    ) {
        if !self.open || view.is_empty() {
            return;
        }
        if self.rows.as_ref().is_none_or(|(at, _)| *at != cursor) {
            let rows = site_stats::by_site(view, sites, cursor, GroupBy::Function);
            self.rows = Some((cursor, Arc::new(rows)));
        }
        let rows = self.rows.as_ref().map(|(_, r)| Arc::clone(r));
        let count = rows.as_ref().map_or(0, |r| r.len());
        self.selected = self.selected.min(count.saturating_sub(1));
        let Some(row) = rows.as_ref().and_then(|r| r.get(self.selected)) else {
            return;
        };
        if self
            .series
            .as_ref()
            .is_none_or(|(name, _)| *name != row.name)
        {
            self.series = Some((
                row.name.clone(),
                Arc::new(live_series(view, sites, &row.name, bucketing)),
            ));
        }
    }

    /// Forgets the table and the series: the trace they were computed from has grown (a run
    /// followed while it is recorded).
    pub fn invalidate(&mut self) {
        self.rows = None;
        self.series = None;
    }

    /// The table at the cursor, once computed.
    #[must_use]
    pub fn rows(&self) -> Option<&Arc<Vec<SiteRow>>> {
        self.rows.as_ref().map(|(_, r)| r)
    }

    /// The selected site.
    #[must_use]
    pub fn selected_row(&self) -> Option<&SiteRow> {
        self.rows().and_then(|r| r.get(self.selected))
    }

    /// Allocation ids of the selected site live at the cursor (for the heap map).
    #[must_use]
    pub fn highlighted(&self) -> HashSet<u32> {
        if !self.open {
            return HashSet::new();
        }
        self.selected_row()
            .map(|r| r.live_ids.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The selected site's live bytes per bucket, with its name.
    #[must_use]
    pub fn series(&self) -> Option<(&str, &[u64])> {
        if !self.open {
            return None;
        }
        self.series
            .as_ref()
            .map(|(n, v)| (n.as_str(), v.as_slice()))
    }

    /// Moves the selection by `d` rows, wrapping.
    pub fn cycle(&mut self, d: i64) {
        let n = self.rows().map_or(0, |r| r.len()).max(1) as i64;
        self.selected = usize::try_from((self.selected as i64 + d).rem_euclid(n)).unwrap_or(0);
    }
}

/// Live bytes of the site called `name` (grouped by function), as the maximum in each bucket
/// (estimates with sampled stacks: [`EventSites::alloc_weight`]).
fn live_series(view: &TraceView<'_>, sites: &EventSites, name: &str, b: Bucketing) -> Vec<u64> {
    let mut out = vec![0u64; b.buckets];
    // The site's live allocations and the bytes each counts for.
    let mut mine: HashMap<u32, u64> = HashMap::new();
    let matches: Vec<bool> = (0..sites.stacks.num_stacks())
        .map(|s| site_stats::group_name(&sites.stacks, s as u32, GroupBy::Function) == name)
        .collect();
    let no_stack_matches = site_stats::group_name(
        &sites.stacks,
        allocview_loaders::sites::NO_STACK,
        GroupBy::Function,
    ) == name;
    let mut live = 0u64;
    // Buckets without events hold the live bytes carried into them.
    let mut filled = 0usize;
    for i in 0..view.len() {
        let t = view.t_ns.get(i).copied().unwrap_or(b.t0_ns);
        let bucket = b.bucket_of(t);
        while filled < bucket {
            if let Some(slot) = out.get_mut(filled + 1) {
                *slot = live;
            }
            filled += 1;
        }
        let id = view.alloc_id.get(i).copied().unwrap_or(u32::MAX);
        let size = view.size_bytes.get(i).copied().unwrap_or(0);
        match view.kind_at(i) {
            Some(EventKind::Alloc) => {
                let s = sites.stack_at(i);
                let hit = matches.get(s as usize).copied().unwrap_or(no_stack_matches);
                let bytes = sites.alloc_weight(i, size).whole_bytes();
                if hit && bytes > 0 {
                    mine.insert(id, bytes);
                    live = live.saturating_add(bytes);
                }
            }
            Some(EventKind::Free) => {
                if let Some(bytes) = mine.remove(&id) {
                    live = live.saturating_sub(bytes);
                }
            }
            _ => {}
        }
        if let Some(slot) = out.get_mut(bucket) {
            *slot = (*slot).max(live);
        }
    }
    for slot in out.iter_mut().skip(filled + 1) {
        *slot = live;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocview_loaders::analysis::site_stats::SiteKind;
    use allocview_loaders::sites::{Frame, StackTable};
    use allocview_sim::trace::OwnedTrace;

    #[test]
    fn a_sites_line_holds_its_live_bytes_through_quiet_buckets() {
        // 100 B live from t=0 to t=90, another site's churn in between.
        let mut tr = OwnedTrace::new();
        let a = tr.alloc(0, 100);
        let b = tr.alloc(10, 7);
        tr.free(11, b);
        tr.free(90, a);
        let view = tr.view().unwrap();
        let mut stacks = StackTable::new();
        let f = |name: &str, t: &mut StackTable| {
            let id = t.intern_frame(Frame {
                function: name.to_owned(),
                file: String::new(),
                line: 0,
                module: String::new(),
            });
            t.intern_stack(vec![id])
        };
        let sa = f("a", &mut stacks);
        let sb = f("b", &mut stacks);
        let sites = EventSites {
            kind: SiteKind::Stacks,
            stacks,
            event_stack: vec![sa, sb, sb, sa],
        };
        let b10 = Bucketing::for_trace(&view, 10);
        let series = live_series(&view, &sites, "a", b10);
        // Every bucket before the free holds the 100 bytes, not only those with events.
        assert_eq!(&series[..9], &[100; 9]);
        assert_eq!(series[9], 100, "the bucket of the free keeps its maximum");
    }
}
