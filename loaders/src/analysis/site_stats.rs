//! Memory by allocation site: live bytes at a moment, allocations over the run, growth over
//! time (leak or cache), folded stacks for flame graphs.
//!
//! Every input has sites of some kind ([`SiteKind`]): a PyTorch snapshot or a recorded trace
//! with stacks has call stacks; a TensorFlow memory log has the operation that allocated; a
//! trace without stacks has none, and its allocations are grouped by size class instead (said
//! in every report). [`EventSites`] gives every event a site id in one [`StackTable`], so the
//! commands and explorers treat all of them alike.
//!
//! A trace whose stacks were sampled (`record --stack-sample`) has a stack for some
//! allocations only: every figure by site weighs each allocation by
//! [`EventSites::alloc_weight`] (see [`super::sampling`]), and the rows are estimates.

use std::collections::HashMap;

use allocview_sim::heap::{Block, BlockState};
use allocview_sim::trace::{EventKind, NO_ALLOC_ID, TraceView, size_class};
use polars::prelude::*;

use super::sampling::{StackSampling, Weight};
use crate::sites::{Frame, NO_STACK, StackTable};

/// Where an input's sites come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SiteKind {
    /// Call stacks (a PyTorch snapshot's frames, a recorded trace's stacks).
    Stacks,
    /// A TensorFlow memory log's kernel or operation names (one-frame stacks).
    Operations,
    /// No sites in the input: size classes stand in for them.
    SizeClasses,
}

impl SiteKind {
    /// What the sites are, for reports.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::Stacks => "call stacks",
            Self::Operations => "TensorFlow operations",
            Self::SizeClasses => "size classes (this input records no call stacks)",
        }
    }
}

/// What the sites are, for reports, and, with sampled stacks, that their figures are
/// estimates ([`StackSampling::note`]).
#[must_use]
pub fn describe_sites(kind: SiteKind, sampling: Option<StackSampling>) -> String {
    match sampling {
        Some(s) if kind == SiteKind::Stacks => format!("{}; {}", kind.describe(), s.note()),
        _ => kind.describe().to_owned(),
    }
}

/// A site id for every event, and the stacks they refer to.
#[derive(Clone, Debug)]
pub struct EventSites {
    pub kind: SiteKind,
    pub stacks: StackTable,
    /// Per event; [`NO_STACK`] for an allocation without a recorded stack.
    pub event_stack: Vec<u32>,
}

impl EventSites {
    /// Sites from an event table: its `stack_id` column with `stacks` when both exist, else its
    /// `kernel` column (operations), else size classes.
    #[must_use]
    pub fn from_events(events: &DataFrame, stacks: Option<&StackTable>) -> Self {
        if let (Some(stacks), Ok(col)) = (stacks, events.column("stack_id"))
            && let Ok(ids) = col.u32()
        {
            return Self {
                kind: SiteKind::Stacks,
                stacks: stacks.clone(),
                event_stack: ids.iter().map(|v| v.unwrap_or(NO_STACK)).collect(),
            };
        }
        let mut table = StackTable::new();
        if let Ok(col) = events.column("kernel")
            && let Ok(names) = col.str()
        {
            let mut ids: HashMap<&str, u32> = HashMap::new();
            let event_stack = names
                .iter()
                .map(|name| match name.filter(|n| !n.is_empty()) {
                    Some(n) => *ids.entry(n).or_insert_with(|| {
                        let f = table.intern_frame(frame(n, ""));
                        table.intern_stack(vec![f])
                    }),
                    None => NO_STACK,
                })
                .collect();
            return Self {
                kind: SiteKind::Operations,
                stacks: table,
                event_stack,
            };
        }
        let sizes = events
            .column("size_bytes")
            .ok()
            .and_then(|c| c.u64().ok().cloned());
        let mut by_class: HashMap<u8, u32> = HashMap::new();
        let event_stack = sizes
            .iter()
            .flat_map(|c| c.iter())
            .map(|s| {
                let class = size_class(s.unwrap_or(0));
                *by_class.entry(class).or_insert_with(|| {
                    let f = table.intern_frame(frame(&format!("size class {class}"), ""));
                    table.intern_stack(vec![f])
                })
            })
            .collect();
        Self {
            kind: SiteKind::SizeClasses,
            stacks: table,
            event_stack,
        }
    }

    /// The stack of event `i`.
    #[must_use]
    pub fn stack_at(&self, i: usize) -> u32 {
        self.event_stack.get(i).copied().unwrap_or(NO_STACK)
    }

    /// How the stacks were sampled, when only some allocations have one (then every figure
    /// by site is an estimate: say so with [`StackSampling::note`]).
    #[must_use]
    pub fn sampling(&self) -> Option<StackSampling> {
        match self.kind {
            SiteKind::Stacks => self.stacks.sampling(),
            SiteKind::Operations | SiteKind::SizeClasses => None,
        }
    }

    /// What the allocation event `i` of `size_bytes` counts for in figures by site: itself,
    /// or, with sampled stacks, the allocations it stands for when it was sampled and
    /// nothing when it was not. The one place every reader of sites weighs allocations.
    #[must_use]
    pub fn alloc_weight(&self, i: usize, size_bytes: u64) -> Weight {
        match self.sampling() {
            None => Weight::exact(size_bytes),
            Some(_) if self.stack_at(i) == NO_STACK => Weight::NONE,
            Some(s) => s.weight(size_bytes),
        }
    }
}

fn frame(function: &str, file: &str) -> Frame {
    Frame {
        function: function.to_owned(),
        file: file.to_owned(),
        line: 0,
        module: String::new(),
    }
}

/// How sites are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    /// One group per distinct stack.
    Stack,
    /// Stacks with the same site function (and file) together.
    Function,
    /// Stacks whose site is in the same module (or source file) together.
    Module,
}

impl GroupBy {
    /// The `--by` value.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Stack => "stack",
            Self::Function => "function",
            Self::Module => "module",
        }
    }
}

/// Name of a group: the site frame's function (what called the allocator), its module, or
/// "(no stack recorded)".
#[must_use]
pub fn group_name(stacks: &StackTable, stack: u32, by: GroupBy) -> String {
    let Some(f) = stacks.site_frame(stack) else {
        return "(no stack recorded)".to_owned();
    };
    match by {
        GroupBy::Stack | GroupBy::Function => f.function.clone(),
        GroupBy::Module if !f.module.is_empty() => f.module.clone(),
        GroupBy::Module if !f.file.is_empty() && f.file != "??" => f.file.clone(),
        GroupBy::Module => f.function.clone(),
    }
}

/// The key a stack is grouped under.
pub(crate) fn group_key(stacks: &StackTable, stack: u32, by: GroupBy) -> String {
    match by {
        GroupBy::Stack => format!("{stack}"),
        GroupBy::Function => stacks
            .site_frame(stack)
            .map_or_else(String::new, |f| format!("{}\u{1}{}", f.function, f.file)),
        GroupBy::Module => group_name(stacks, stack, by),
    }
}

/// One site's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SiteRow {
    pub name: String,
    /// A representative stack of the group (the one with the most live bytes, else the most
    /// allocated bytes).
    pub stack: u32,
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub alloc_count: u64,
    pub alloc_bytes: u64,
    /// Allocation ids live at the moment (for pinning and highlighting).
    pub live_ids: Vec<u32>,
    pub first_alloc_event: Option<usize>,
    pub last_alloc_event: Option<usize>,
    /// Live bytes sampled at `growth_points` evenly spaced events of the run (the last is the
    /// end), for [`classify`].
    pub growth: Vec<u64>,
}

/// Points at which each site's live bytes are sampled over the run.
pub const GROWTH_POINTS: usize = 20;

/// Sites with their live figures just after event `at`, and their allocations over the whole
/// run, sorted by live bytes then allocated bytes (largest first). With sampled stacks the
/// figures are estimates ([`EventSites::alloc_weight`]); `live_ids` then holds the sampled
/// allocations only.
#[must_use]
pub fn by_site(view: &TraceView<'_>, sites: &EventSites, at: usize, by: GroupBy) -> Vec<SiteRow> {
    let n = view.len();
    let mut acc = SiteAccum::new(view.num_allocs as usize, sites.sampling().is_some());
    let sample_at: Vec<usize> = (1..=GROWTH_POINTS)
        .map(|k| (n * k / GROWTH_POINTS).saturating_sub(1))
        .collect();
    let mut next_sample = 0;
    for i in 0..n {
        let id = view.alloc_id.get(i).copied().unwrap_or(NO_ALLOC_ID) as usize;
        match view.kind_at(i) {
            Some(EventKind::Alloc) => {
                let size = view.size_bytes.get(i).copied().unwrap_or(0);
                let w = sites.alloc_weight(i, size);
                if w.count > 0.0 {
                    acc.alloc(sites, by, i, id, w, i <= at);
                }
            }
            Some(EventKind::Free) => acc.free(id),
            _ => {}
        }
        if i == at {
            for (r, &l) in acc.rows.iter_mut().zip(&acc.live_now) {
                r.live_bytes = l;
            }
        }
        while sample_at.get(next_sample) == Some(&i) {
            for (r, &l) in acc.rows.iter_mut().zip(&acc.live_now) {
                r.growth.resize(next_sample, 0);
                r.growth.push(l);
            }
            next_sample += 1;
        }
    }
    acc.finish(view, at)
}

/// The running figures of [`by_site`].
struct SiteAccum {
    rows: Vec<SiteRow>,
    group_of_stack: HashMap<u32, usize>,
    key_index: HashMap<String, usize>,
    /// Per stack: its (weighted) bytes allocated up to the moment and still live then, to
    /// choose each group's representative.
    stack_live: HashMap<u32, u64>,
    /// Per allocation id: its group (`u32::MAX`: none) and the bytes it counts for.
    alloc_group: Vec<u32>,
    alloc_bytes: Vec<u64>,
    /// With sampled stacks: per allocation id, the allocations it stands for; per group,
    /// the allocations its samples stand for (the rows' counts are these, rounded).
    alloc_count: Vec<f64>,
    group_count: Vec<f64>,
    weighted: bool,
    live_now: Vec<u64>,
}

impl SiteAccum {
    fn new(num_allocs: usize, weighted: bool) -> Self {
        Self {
            rows: Vec::new(),
            group_of_stack: HashMap::new(),
            key_index: HashMap::new(),
            stack_live: HashMap::new(),
            alloc_group: vec![u32::MAX; num_allocs],
            alloc_bytes: vec![0; num_allocs],
            alloc_count: if weighted {
                vec![0.0; num_allocs]
            } else {
                Vec::new()
            },
            group_count: Vec::new(),
            weighted,
            live_now: Vec::new(),
        }
    }

    /// The allocation event `i` (allocation `id`), counting for `w`.
    fn alloc(
        &mut self,
        sites: &EventSites,
        by: GroupBy,
        i: usize,
        id: usize,
        w: Weight,
        by_moment: bool,
    ) {
        let stack = sites.stack_at(i);
        let (rows, live_now, group_count) =
            (&mut self.rows, &mut self.live_now, &mut self.group_count);
        let key_index = &mut self.key_index;
        let g = *self.group_of_stack.entry(stack).or_insert_with(|| {
            let key = group_key(&sites.stacks, stack, by);
            *key_index.entry(key).or_insert_with(|| {
                rows.push(SiteRow {
                    name: group_name(&sites.stacks, stack, by),
                    stack,
                    ..SiteRow::default()
                });
                live_now.push(0);
                group_count.push(0.0);
                rows.len() - 1
            })
        });
        let bytes = w.whole_bytes();
        if let Some(r) = self.rows.get_mut(g) {
            r.alloc_count += 1;
            r.alloc_bytes = r.alloc_bytes.saturating_add(bytes);
            r.first_alloc_event.get_or_insert(i);
            r.last_alloc_event = Some(i);
        }
        if let Some(c) = self.group_count.get_mut(g) {
            *c += w.count;
        }
        if let Some(l) = self.live_now.get_mut(g) {
            *l = l.saturating_add(bytes);
        }
        if let (Some(slot), Some(b)) = (self.alloc_group.get_mut(id), self.alloc_bytes.get_mut(id))
        {
            *slot = g as u32;
            *b = bytes;
        }
        if let Some(c) = self.alloc_count.get_mut(id) {
            *c = w.count;
        }
        if by_moment {
            *self.stack_live.entry(stack).or_insert(0) += bytes;
        }
    }

    fn free(&mut self, id: usize) {
        let g = self.alloc_group.get(id).copied().unwrap_or(u32::MAX);
        let bytes = self.alloc_bytes.get(id).copied().unwrap_or(0);
        if let Some(l) = self.live_now.get_mut(g as usize) {
            *l = l.saturating_sub(bytes);
        }
    }

    /// The rows: live blocks at `at`, the representatives, the estimated counts, sorted.
    fn finish(mut self, view: &TraceView<'_>, at: usize) -> Vec<SiteRow> {
        let n = view.len();
        // Live ids at `at`: replay alive-ness up to it.
        let mut alive = vec![false; view.num_allocs as usize];
        for i in 0..=at.min(n.saturating_sub(1)) {
            let id = view.alloc_id.get(i).copied().unwrap_or(NO_ALLOC_ID);
            if let Some(a) = alive.get_mut(id as usize) {
                match view.kind_at(i) {
                    Some(EventKind::Alloc) => *a = true,
                    Some(EventKind::Free) => *a = false,
                    _ => {}
                }
            }
        }
        let mut live_count = vec![0f64; self.rows.len()];
        for (id, _) in alive.iter().enumerate().filter(|(_, a)| **a) {
            let g = self.alloc_group.get(id).copied().unwrap_or(u32::MAX) as usize;
            if let (Some(r), Some(c)) = (self.rows.get_mut(g), live_count.get_mut(g)) {
                r.live_blocks += 1;
                r.live_ids.push(id as u32);
                *c += self.alloc_count.get(id).copied().unwrap_or(1.0);
            }
        }
        for (g, r) in self.rows.iter_mut().enumerate() {
            r.growth.resize(GROWTH_POINTS, 0);
            if self.weighted {
                r.alloc_count = self.group_count.get(g).map_or(0, |c| c.round() as u64);
                r.live_blocks = live_count.get(g).map_or(0, |c| c.round() as u64);
            }
        }
        // Each group's representative stack: its stack with the most live bytes at `at`.
        for (&stack, &g) in &self.group_of_stack {
            if let Some(r) = self.rows.get_mut(g) {
                let live = self.stack_live.get(&stack).copied().unwrap_or(0);
                let cur = self.stack_live.get(&r.stack).copied().unwrap_or(0);
                if live > cur || (live == cur && stack < r.stack) {
                    r.stack = stack;
                }
            }
        }
        let mut rows = self.rows;
        rows.sort_by(|a, b| {
            (b.live_bytes, b.alloc_bytes, &a.name).cmp(&(a.live_bytes, a.alloc_bytes, &b.name))
        });
        rows
    }
}

/// For each row: the free bytes of a heap (`blocks`, address order) that the row's live blocks
/// pin. A free block between two live blocks of one site is that site's; between two sites',
/// half each; next to one live block (the other side a segment's edge, dead space or nothing),
/// that block's site's. Fragmentation traced to code.
#[must_use]
pub fn pinned_free(blocks: &[Block], rows: &[SiteRow]) -> Vec<u64> {
    let mut row_of: HashMap<u32, usize> = HashMap::new();
    for (i, row) in rows.iter().enumerate() {
        for &id in &row.live_ids {
            row_of.insert(id, i);
        }
    }
    let owner = |b: Option<&Block>, adjacent: bool| -> Option<usize> {
        match b?.state {
            BlockState::Used { id, .. } if adjacent => row_of.get(&id).copied(),
            _ => None,
        }
    };
    let mut pinned = vec![0u64; rows.len()];
    for (i, b) in blocks.iter().enumerate() {
        if b.state != BlockState::Free {
            continue;
        }
        let prev = i.checked_sub(1).and_then(|j| blocks.get(j));
        let next = blocks.get(i + 1);
        let left = owner(prev, prev.is_some_and(|p| p.end() == b.addr));
        let right = owner(next, next.is_some_and(|n| n.addr == b.end()));
        let mut add = |row: usize, bytes: u64| {
            if let Some(p) = pinned.get_mut(row) {
                *p += bytes;
            }
        };
        match (left, right) {
            (Some(l), Some(r)) if l != r => {
                add(l, b.len_bytes / 2);
                add(r, b.len_bytes - b.len_bytes / 2);
            }
            (Some(s), _) | (None, Some(s)) => add(s, b.len_bytes),
            (None, None) => {}
        }
    }
    pinned
}

/// Whether a site's memory at the end looks like a leak or a cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeakKind {
    /// Still growing in the second half of the run: more than 10% of its final live bytes
    /// were added after the midpoint, and it allocated in the last quarter.
    Leak,
    /// Levelled off: held by the midpoint, no real growth since.
    Cache,
    /// Every block the site holds at the end was allocated before recording last stopped
    /// (`allocview ctl PID stop`): they may have been freed while it was stopped, unseen.
    Unknown,
}

impl LeakKind {
    /// `leak`, `cache` or `unknown`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Leak => "leak",
            Self::Cache => "cache",
            Self::Unknown => "unknown",
        }
    }
}

/// Classifies a site live at the end from its growth samples (see [`LeakKind`]);
/// `stopped_before` is the first event after recording last stopped, when it did.
#[must_use]
pub fn classify(row: &SiteRow, events: usize, stopped_before: Option<usize>) -> LeakKind {
    if let (Some(stop), Some(last)) = (stopped_before, row.last_alloc_event)
        && last < stop
    {
        return LeakKind::Unknown;
    }
    let end = row.growth.last().copied().unwrap_or(0);
    let mid = row.growth.get(GROWTH_POINTS / 2 - 1).copied().unwrap_or(0);
    let grew_late = end.saturating_sub(mid) > end / 10;
    let allocates_late = row
        .last_alloc_event
        .is_some_and(|e| e * 4 >= events.saturating_mul(3));
    if grew_late && allocates_late {
        LeakKind::Leak
    } else {
        LeakKind::Cache
    }
}

/// Folded stacks (`outer;...;inner value` per line, as flamegraph tools read them) of the
/// allocations live just after event `at` (`live`), of every allocation (`allocated`, bytes),
/// or of allocation counts (`count`). `frame` writes each function name as a frame: the
/// caller's escaping, which must leave no `;` (the frame separator) and no line break (a
/// name from a trace can hold any character). With sampled stacks the values are estimates
/// ([`EventSites::alloc_weight`]).
#[must_use]
pub fn folded(
    view: &TraceView<'_>,
    sites: &EventSites,
    at: usize,
    metric: &str,
    frame: &dyn Fn(&str) -> String,
) -> Vec<String> {
    let mut by_stack: HashMap<u32, f64> = HashMap::new();
    let mut alive: Vec<Option<(u32, f64)>> = vec![None; view.num_allocs as usize];
    let end = if metric == "live" {
        at
    } else {
        view.len().saturating_sub(1)
    };
    for i in 0..=end.min(view.len().saturating_sub(1)) {
        let id = view.alloc_id.get(i).copied().unwrap_or(NO_ALLOC_ID);
        let size = view.size_bytes.get(i).copied().unwrap_or(0);
        match view.kind_at(i) {
            Some(EventKind::Alloc) => {
                let stack = sites.stack_at(i);
                let w = sites.alloc_weight(i, size);
                if w.count == 0.0 {
                    continue;
                }
                match metric {
                    "live" => {
                        if let Some(slot) = alive.get_mut(id as usize) {
                            *slot = Some((stack, w.bytes));
                        }
                    }
                    "count" => *by_stack.entry(stack).or_insert(0.0) += w.count,
                    _ => *by_stack.entry(stack).or_insert(0.0) += w.bytes,
                }
            }
            Some(EventKind::Free) if metric == "live" => {
                if let Some(slot) = alive.get_mut(id as usize) {
                    *slot = None;
                }
            }
            _ => {}
        }
    }
    for (stack, bytes) in alive.into_iter().flatten() {
        *by_stack.entry(stack).or_insert(0.0) += bytes;
    }
    let by_stack = by_stack
        .into_iter()
        .map(|(stack, v)| (stack, v.round() as u64))
        .collect();
    fold_lines(&sites.stacks, by_stack, frame)
}

/// The folded lines of a value by stack, sorted (stacks of value 0 left out).
pub(crate) fn fold_lines(
    stacks: &StackTable,
    by_stack: HashMap<u32, u64>,
    frame: &dyn Fn(&str) -> String,
) -> Vec<String> {
    let mut lines: Vec<String> = by_stack
        .into_iter()
        .filter(|&(_, v)| v > 0)
        .map(|(stack, v)| {
            let mut names: Vec<String> = stacks
                .frames_of(stack)
                .map(|f| frame(&f.function))
                .collect();
            if names.is_empty() {
                names.push("(no stack recorded)".to_owned());
            }
            names.reverse();
            format!("{} {v}", names.join(";"))
        })
        .collect();
    lines.sort();
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocview_sim::trace::OwnedTrace;

    fn sites_for(stacks: &[u32]) -> EventSites {
        let mut t = StackTable::new();
        let a = t.intern_frame(frame("alpha", "a.c"));
        let b = t.intern_frame(frame("beta", "b.c"));
        let m = t.intern_frame(frame("main", "m.c"));
        t.intern_stack(vec![a, m]);
        t.intern_stack(vec![b, m]);
        EventSites {
            kind: SiteKind::Stacks,
            stacks: t,
            event_stack: stacks.to_vec(),
        }
    }

    #[test]
    fn live_and_allocated_bytes_by_site() {
        let mut tr = OwnedTrace::new();
        let x = tr.alloc(0, 100); // alpha
        let _y = tr.alloc(1, 50); // beta
        tr.free(2, x);
        let _z = tr.alloc(3, 30); // alpha
        let view = tr.view().unwrap();
        let sites = sites_for(&[0, 1, NO_STACK, 0]);
        // Just after event 1: alpha 100 live, beta 50.
        let rows = by_site(&view, &sites, 1, GroupBy::Function);
        assert_eq!(rows[0].name, "alpha");
        assert_eq!((rows[0].live_bytes, rows[0].live_blocks), (100, 1));
        assert_eq!((rows[0].alloc_count, rows[0].alloc_bytes), (2, 130));
        assert_eq!((rows[1].name.as_str(), rows[1].live_bytes), ("beta", 50));
        // At the end: beta 50, alpha 30.
        let rows = by_site(&view, &sites, 3, GroupBy::Function);
        assert_eq!(rows[0].name, "beta");
        assert_eq!(rows[1].live_bytes, 30);
        assert_eq!(rows[1].live_ids, vec![2]);
        let f = folded(&view, &sites, 3, "live", &|f| f.replace(';', ":"));
        assert_eq!(f, ["main;alpha 30", "main;beta 50"]);
        let f = folded(&view, &sites, 3, "count", &|f| f.replace(';', ":"));
        assert_eq!(f, ["main;alpha 2", "main;beta 1"]);
    }

    #[test]
    fn sampled_allocations_stand_for_what_their_probability_says() {
        let mut tr = OwnedTrace::new();
        let x = tr.alloc(0, 1024); // alpha, sampled
        tr.alloc(1, 1024); // not sampled: no stack
        tr.alloc(2, 1 << 20); // beta, at least the interval: always sampled
        tr.free(3, x);
        let view = tr.view().unwrap();
        let mut sites = sites_for(&[0, NO_STACK, 1, NO_STACK]);
        sites.stacks.set_sampling(Some(StackSampling {
            mean_bytes: 512 << 10,
        }));
        // 1 KiB at 512 KiB: sampled with p = 1 - exp(-1/512), so it stands for 1/p.
        let w = 1.0 / -(-1.0f64 / 512.0).exp_m1();
        let rows = by_site(&view, &sites, 2, GroupBy::Function);
        assert_eq!(rows.len(), 2, "no row for the allocation not sampled");
        let alpha = rows.iter().find(|r| r.name == "alpha").unwrap();
        assert_eq!(alpha.alloc_count, w.round() as u64);
        assert_eq!(alpha.alloc_bytes, (1024.0 * w).round() as u64);
        assert_eq!(alpha.live_bytes, (1024.0 * w).round() as u64);
        assert_eq!(alpha.live_blocks, w.round() as u64);
        let beta = rows.iter().find(|r| r.name == "beta").unwrap();
        assert_eq!((beta.alloc_count, beta.alloc_bytes), (1, 1 << 20));
        // Freed: alpha's weighted bytes leave with it.
        let rows = by_site(&view, &sites, 3, GroupBy::Function);
        let alpha = rows.iter().find(|r| r.name == "alpha").unwrap();
        assert_eq!(alpha.live_bytes, 0);
        let f = folded(&view, &sites, 3, "count", &|f| f.to_owned());
        assert_eq!(
            f,
            [format!("main;alpha {}", w.round()), "main;beta 1".into()]
        );
        assert!(describe_sites(sites.kind, sites.sampling()).contains("estimates"));
    }

    #[test]
    fn free_holes_are_pinned_by_their_live_neighbours() {
        let used = |addr, id| Block {
            addr,
            len_bytes: 16,
            state: BlockState::Used {
                id,
                requested_bytes: 16,
            },
        };
        let free = |addr, len_bytes| Block {
            addr,
            len_bytes,
            state: BlockState::Free,
        };
        // [a0][free 32][a1][free 10][b2][free 8] then, apart, [free 100][b3]
        let blocks = [
            used(0, 0),
            free(16, 32),
            used(48, 1),
            free(64, 10),
            used(74, 2),
            free(90, 8),
            free(200, 100),
            used(300, 3),
        ];
        let row = |ids: Vec<u32>| SiteRow {
            live_ids: ids,
            ..SiteRow::default()
        };
        let rows = [row(vec![0, 1]), row(vec![2, 3])];
        // a: all of the hole between its own blocks, half of the one it shares with b;
        // b: the other half, the hole after it, and the hole before its block at 300.
        assert_eq!(pinned_free(&blocks, &rows), [32 + 5, 5 + 8 + 100]);
    }

    #[test]
    fn a_growing_site_is_a_leak_and_a_levelled_one_a_cache() {
        let mut tr = OwnedTrace::new();
        let mut stacks = Vec::new();
        // Site 0 fills a cache of 10 blocks early and keeps it; site 1 allocates without
        // freeing all the way through.
        for i in 0..10 {
            tr.alloc(i, 64);
            stacks.push(0);
        }
        for i in 10..200 {
            tr.alloc(i, 16);
            stacks.push(1);
        }
        let view = tr.view().unwrap();
        let sites = sites_for(&stacks);
        let rows = by_site(&view, &sites, view.len() - 1, GroupBy::Stack);
        let kind = |name: &str| {
            let r = rows.iter().find(|r| r.name == name).unwrap();
            classify(r, view.len(), None)
        };
        assert_eq!(kind("alpha"), LeakKind::Cache);
        assert_eq!(kind("beta"), LeakKind::Leak);
        // Recording stopped after alpha's blocks and before beta's last: alpha's may have been
        // freed unseen; beta still allocates after the stop.
        let after_stop = |name: &str| {
            let r = rows.iter().find(|r| r.name == name).unwrap();
            classify(r, view.len(), Some(100))
        };
        assert_eq!(after_stop("alpha"), LeakKind::Unknown);
        assert_eq!(after_stop("beta"), LeakKind::Leak);
    }

    #[test]
    fn without_stacks_sizes_stand_in() {
        let events = df!(
            "size_bytes" => [10u64, 1000, 12],
        )
        .unwrap();
        let s = EventSites::from_events(&events, None);
        assert_eq!(s.kind, SiteKind::SizeClasses);
        assert_eq!(s.event_stack[0], s.event_stack[2]);
        assert_ne!(s.event_stack[0], s.event_stack[1]);
        assert_eq!(
            s.stacks
                .frames_of(s.event_stack[1])
                .next()
                .unwrap()
                .function,
            "size class 10"
        );
    }
}
