//! The order of one period's events from several threads without order keys: a search for
//! an order consistent with every pointer's life ([`search`]) and the fallback when there is
//! none ([`greedy`]). Both ask, at every step, for the least advanced runs whose next event
//! fits the live pointers; [`Heads`] answers in O(log threads), so a period costs
//! O(events log threads) however many threads share it (a scan of every thread at every
//! step took 100 s on a spool of 10,000 threads of 100 events).

use std::collections::BTreeSet;

use super::super::OP_FREE;
use super::SpoolEvent;
use crate::events::{PtrHasher, PtrMap, PtrSet};

/// Search steps allowed per event of a period before [`search`] gives up.
const SEARCH_STEPS_PER_EVENT: usize = 8;
const SEARCH_STEPS_MIN: usize = 50_000;
/// Alternatives kept per depth of the search (the least advanced runs that fit): the search
/// state is then O(events) however many threads share a period (it held every fitting run
/// per depth, O(events x threads): 1.6 GB for 2,000 threads of 100 events).
const MAX_CHOICES: usize = 8;

/// Applies an event to the live pointers; returns whether it changed them.
pub(super) fn apply(live: &mut PtrSet, ev: &SpoolEvent) -> bool {
    if ev.addr == 0 {
        false
    } else if ev.op & OP_FREE != 0 {
        live.remove(&ev.addr)
    } else {
        live.insert(ev.addr)
    }
}

/// Undoes an [`apply`] that changed the live pointers.
fn unapply(live: &mut PtrSet, ev: &SpoolEvent) {
    if ev.op & OP_FREE != 0 {
        live.insert(ev.addr);
    } else {
        live.remove(&ev.addr);
    }
}

/// How a run's next event fits the live pointers, in the order the merge prefers.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Class {
    /// A free of a live pointer, an allocation of a pointer that is not live, or an event on
    /// NULL.
    Fits = 0,
    /// A free of a pointer that is not live and that no run of the period allocates further
    /// on (allocated before tracing).
    FreeUnknown = 1,
    /// A free of a pointer that is not live and that a run of the period allocates further
    /// on: that allocation must come first.
    FreePending = 2,
    /// An allocation of a live pointer: its free must come first.
    Blocked = 3,
}

/// A run's place in the sets: least advanced first (threads are taken to progress evenly
/// through a period), then by run.
type Entry = (u64, u32);

/// The runs whose next event is on one address and of one kind (allocation or free): they
/// all have the same [`Class`], so only the least advanced is filed by class.
#[derive(Default)]
struct Group {
    members: BTreeSet<Entry>,
    filed: Option<(Class, Entry)>,
}

/// The next event of every run, filed by how it fits the live pointers.
pub(super) struct Heads<'r> {
    runs: &'r [Vec<SpoolEvent>],
    pos: Vec<u32>,
    /// Allocations still to come, per address: a free of a pointer that is not live must wait
    /// for one of them.
    pending: PtrMap<u32>,
    allocs: PtrMap<Group>,
    frees: PtrMap<Group>,
    /// Each non-empty group's least advanced run, by the group's class.
    by_class: [BTreeSet<Entry>; 4],
}

impl<'r> Heads<'r> {
    fn new(runs: &'r [Vec<SpoolEvent>], live: &PtrSet) -> Self {
        let mut pending: PtrMap<u32> = PtrMap::default();
        for ev in runs.iter().flatten() {
            if ev.op & OP_FREE == 0 && ev.addr != 0 {
                *pending.entry(ev.addr).or_default() += 1;
            }
        }
        let mut heads = Self {
            runs,
            pos: vec![0; runs.len()],
            pending,
            allocs: PtrMap::default(),
            frees: PtrMap::default(),
            by_class: Default::default(),
        };
        for r in 0..runs.len() {
            heads.file_head(r as u32, live);
        }
        heads
    }

    fn head(&self, r: u32) -> Option<&'r SpoolEvent> {
        let runs = self.runs;
        runs.get(r as usize)?
            .get(*self.pos.get(r as usize)? as usize)
    }

    fn entry(&self, r: u32) -> Entry {
        let len = self.runs.get(r as usize).map_or(1, Vec::len);
        let p = self.pos.get(r as usize).copied().unwrap_or(0);
        // A non-negative float's bits sort as the float does.
        ((f64::from(p) / len as f64).to_bits(), r)
    }

    fn class(&self, addr: u64, is_free: bool, live: &PtrSet) -> Class {
        if addr == 0 {
            return Class::Fits;
        }
        match (is_free, live.contains(&addr)) {
            (true, true) | (false, false) => Class::Fits,
            (false, true) => Class::Blocked,
            (true, false) if self.pending.get(&addr).is_some_and(|&n| n > 0) => Class::FreePending,
            (true, false) => Class::FreeUnknown,
        }
    }

    fn groups(&mut self, is_free: bool) -> &mut PtrMap<Group> {
        if is_free {
            &mut self.frees
        } else {
            &mut self.allocs
        }
    }

    /// Files group (`addr`, `is_free`) anew under its least advanced run and its class (the
    /// live pointers or the pending allocations changed, or its members did).
    fn refile(&mut self, addr: u64, is_free: bool, live: &PtrSet) {
        let class = self.class(addr, is_free, live);
        let Some(group) = self.groups(is_free).get_mut(&addr) else {
            return;
        };
        let old = group.filed.take();
        let new = group.members.first().map(|&e| (class, e));
        group.filed = new;
        let empty = new.is_none();
        if empty {
            self.groups(is_free).remove(&addr);
        }
        if old == new {
            return;
        }
        if let Some((c, e)) = old
            && let Some(set) = self.by_class.get_mut(c as usize)
        {
            set.remove(&e);
        }
        if let Some((c, e)) = new
            && let Some(set) = self.by_class.get_mut(c as usize)
        {
            set.insert(e);
        }
    }

    fn file_head(&mut self, r: u32, live: &PtrSet) {
        let Some(ev) = self.head(r) else {
            return;
        };
        let (addr, is_free) = (ev.addr, ev.op & OP_FREE != 0);
        let e = self.entry(r);
        self.groups(is_free)
            .entry(addr)
            .or_default()
            .members
            .insert(e);
        self.refile(addr, is_free, live);
    }

    fn unfile_head(&mut self, r: u32, live: &PtrSet) {
        let Some(ev) = self.head(r) else {
            return;
        };
        let (addr, is_free) = (ev.addr, ev.op & OP_FREE != 0);
        let e = self.entry(r);
        if let Some(g) = self.groups(is_free).get_mut(&addr) {
            g.members.remove(&e);
        }
        self.refile(addr, is_free, live);
    }

    /// Both groups of `addr` (its live state or its pending allocations changed).
    fn refile_addr(&mut self, addr: u64, live: &PtrSet) {
        self.refile(addr, false, live);
        self.refile(addr, true, live);
    }

    /// Takes run `r`'s next event: returns whether it changed the live pointers.
    fn advance(&mut self, r: u32, live: &mut PtrSet) -> bool {
        let Some(ev) = self.head(r) else {
            return false;
        };
        self.unfile_head(r, live);
        let changed = apply(live, ev);
        if ev.op & OP_FREE == 0
            && ev.addr != 0
            && let Some(n) = self.pending.get_mut(&ev.addr)
        {
            *n = n.saturating_sub(1);
        }
        if let Some(p) = self.pos.get_mut(r as usize) {
            *p += 1;
        }
        if ev.addr != 0 {
            self.refile_addr(ev.addr, live);
        }
        self.file_head(r, live);
        changed
    }

    /// Undoes the [`Self::advance`] of run `r` that returned `changed`.
    fn retreat(&mut self, r: u32, changed: bool, live: &mut PtrSet) {
        self.unfile_head(r, live);
        let Some(p) = self.pos.get_mut(r as usize) else {
            return;
        };
        *p = p.saturating_sub(1);
        let Some(ev) = self.head(r) else {
            return;
        };
        if changed {
            unapply(live, ev);
        }
        if ev.op & OP_FREE == 0 && ev.addr != 0 {
            *self.pending.entry(ev.addr).or_default() += 1;
        }
        if ev.addr != 0 {
            self.refile_addr(ev.addr, live);
        }
        self.file_head(r, live);
    }

    /// The members of the first `n` groups of `class`.
    fn candidates(&self, class: Class, n: usize, out: &mut Vec<Entry>) {
        let Some(set) = self.by_class.get(class as usize) else {
            return;
        };
        for &(_, r) in set.iter().take(n) {
            let Some(ev) = self.head(r) else {
                continue;
            };
            let groups = if ev.op & OP_FREE != 0 {
                &self.frees
            } else {
                &self.allocs
            };
            if let Some(g) = groups.get(&ev.addr) {
                out.extend(g.members.iter().take(n));
            }
        }
    }

    /// The `n` least advanced runs whose next event fits (see [`search`]), least advanced
    /// first: they are among the first `n` members of the first `n` groups that fit.
    fn fitting(&self, n: usize) -> Vec<u32> {
        let mut c = Vec::new();
        self.candidates(Class::Fits, n, &mut c);
        self.candidates(Class::FreeUnknown, n, &mut c);
        c.sort_unstable();
        c.truncate(n);
        c.into_iter().map(|(_, r)| r).collect()
    }

    /// The least advanced run whose next event fits, else the least advanced whose next
    /// event frees a pointer that is not live, else the least advanced.
    fn best_effort(&self) -> Option<u32> {
        let first = |c: Class| self.by_class.get(c as usize).and_then(|s| s.first());
        first(Class::Fits)
            .or_else(
                || match (first(Class::FreeUnknown), first(Class::FreePending)) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
            )
            .or_else(|| first(Class::Blocked))
            .map(|&(_, r)| r)
    }
}

/// Finds an order of the runs' events (as run indices) in which every event fits: a free
/// of a live pointer, an allocation of a pointer that is not live, an event on NULL, or a
/// free of a pointer not live that no run of this period allocates (allocated before
/// tracing). Depth-first, trying first the run least far through (threads are taken to
/// progress evenly through a period; at most [`MAX_CHOICES`] runs per depth), and never twice
/// from the same positions in the runs (they determine the live pointers); `None` when the
/// step budget runs out first. On success `live` holds the pointers live after the period,
/// else it is as it was.
///
/// The times alone cannot give this order: many events share each time, and a greedy choice
/// among those that fit can take an address for one thread that another thread, in
/// reality, freed and reused first, and then find nothing that fits further on.
pub(super) fn search(runs: &[Vec<SpoolEvent>], live: &mut PtrSet) -> Option<Vec<u32>> {
    let total: usize = runs.iter().map(Vec::len).sum();
    let budget = total
        .saturating_mul(SEARCH_STEPS_PER_EVENT)
        .max(SEARCH_STEPS_MIN);
    let mut heads = Heads::new(runs, live);
    // The positions' hash, kept up to date as one run advances or backs up.
    let mut pos_hash = PositionsHash::default();
    let mut seen: std::collections::HashSet<u64, std::hash::BuildHasherDefault<PtrHasher>> =
        Default::default();
    // The path: the run of each step, and whether it changed the live pointers.
    let mut path: Vec<(u32, bool)> = Vec::with_capacity(total);
    // Per depth, how many of its choices were tried. The choices themselves are asked for
    // again when needed (the state at a depth is the same each time it is reached): a list
    // per depth took 80 bytes an event.
    let mut tried: Vec<u8> = vec![0];
    let mut steps = 0usize;
    while path.len() < total && steps < budget {
        steps += 1;
        let Some(t) = tried.last_mut() else {
            break;
        };
        let Some(&r) = heads.fitting(MAX_CHOICES).get(usize::from(*t)) else {
            // Nothing more to try here: back up one step.
            tried.pop();
            let Some((r, changed)) = path.pop() else {
                break;
            };
            heads.retreat(r, changed, live);
            pos_hash.step(r, heads.pos_of(r), -1);
            continue;
        };
        *t += 1;
        let changed = heads.advance(r, live);
        pos_hash.step(r, heads.pos_of(r), 1);
        if !seen.insert(pos_hash.0) {
            heads.retreat(r, changed, live);
            pos_hash.step(r, heads.pos_of(r), -1);
            continue;
        }
        path.push((r, changed));
        tried.push(0);
    }
    if path.len() == total {
        return Some(path.into_iter().map(|(r, _)| r).collect());
    }
    while let Some((r, changed)) = path.pop() {
        heads.retreat(r, changed, live);
    }
    None
}

impl Heads<'_> {
    fn pos_of(&self, r: u32) -> u32 {
        self.pos.get(r as usize).copied().unwrap_or(0)
    }
}

/// A hash of the runs' positions: the wrapping sum of one mixed word per (run, position), so
/// that moving one run updates it in O(1) (it was recomputed over every run at every step).
#[derive(Default)]
struct PositionsHash(u64);

impl PositionsHash {
    fn word(run: u32, p: u32) -> u64 {
        let mut x = (u64::from(run) << 32 | u64::from(p)) ^ 0x243f_6a88_85a3_08d3;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    /// Run `run` moved by one (`dir` = 1 forward, -1 back) and is now at `now`.
    fn step(&mut self, run: u32, now: u32, dir: i8) {
        let from = if dir > 0 {
            now.saturating_sub(1)
        } else {
            now + 1
        };
        self.0 = self
            .0
            .wrapping_sub(Self::word(run, from))
            .wrapping_add(Self::word(run, now));
    }
}

/// The fallback when [`search`] gives up (the recording itself may be inconsistent, e.g. a
/// free made in a signal handler during a record, which is not traced): always the least
/// advanced event that fits (see [`search`]); failing that, the least advanced free of a
/// pointer not live; and when nothing fits, the least advanced event anyway. Applies the
/// events to `live`.
pub(super) fn greedy(runs: &[Vec<SpoolEvent>], live: &mut PtrSet) -> Vec<u32> {
    let mut heads = Heads::new(runs, live);
    let total: usize = runs.iter().map(Vec::len).sum();
    let mut order = Vec::with_capacity(total);
    while let Some(r) = heads.best_effort() {
        heads.advance(r, live);
        order.push(r);
    }
    order
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ev(op: u8, addr: u64) -> SpoolEvent {
        SpoolEvent {
            tick: 0,
            op,
            size: 16,
            addr,
            key: None,
            stack: None,
            heap: 0,
        }
    }

    /// The class of run `r`'s next event, counted the slow way: 0 fits, 1 a free of a
    /// pointer not live that nothing still to come allocates, 2 one that something does, 3
    /// an allocation of a live pointer.
    fn naive_class(runs: &[Vec<SpoolEvent>], pos: &[u32], live: &PtrSet, r: usize) -> Option<u8> {
        let e = runs[r].get(pos[r] as usize)?;
        let is_free = e.op & OP_FREE != 0;
        let pending = runs
            .iter()
            .zip(pos)
            .flat_map(|(run, &p)| &run[p as usize..])
            .any(|x| x.op & OP_FREE == 0 && x.addr == e.addr);
        Some(match (e.addr == 0, is_free, live.contains(&e.addr)) {
            (true, _, _) | (false, true, true) | (false, false, false) => 0,
            (false, true, false) if pending => 2,
            (false, true, false) => 1,
            (false, false, true) => 3,
        })
    }

    fn key(runs: &[Vec<SpoolEvent>], pos: &[u32], r: usize) -> (f64, usize) {
        (f64::from(pos[r]) / runs[r].len() as f64, r)
    }

    /// What a scan of every run gives for [`Heads::fitting`] and [`Heads::best_effort`].
    fn naive(runs: &[Vec<SpoolEvent>], pos: &[u32], live: &PtrSet) -> (Vec<u32>, Option<u32>) {
        let order = |a: &(f64, usize), b: &(f64, usize)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        let mut fits: Vec<(f64, usize)> = (0..runs.len())
            .filter(|&r| naive_class(runs, pos, live, r).is_some_and(|c| c <= 1))
            .map(|r| key(runs, pos, r))
            .collect();
        fits.sort_by(order);
        let fitting = fits
            .iter()
            .take(MAX_CHOICES)
            .map(|&(_, r)| r as u32)
            .collect();
        let rank = |c: u8| match c {
            0 => 0,
            1 | 2 => 1,
            _ => 2,
        };
        let best = (0..runs.len())
            .filter_map(|r| Some((rank(naive_class(runs, pos, live, r)?), key(runs, pos, r))))
            .min_by(|a, b| a.0.cmp(&b.0).then(order(&a.1, &b.1)))
            .map(|(_, (_, r))| r as u32);
        (fitting, best)
    }

    fn runs_strategy() -> impl Strategy<Value = Vec<Vec<SpoolEvent>>> {
        // Few addresses, so runs wait on each other's pointers.
        let event = (any::<bool>(), 0u64..6)
            .prop_map(|(free, a)| ev(if free { 3 | OP_FREE } else { 0 }, a * 0x10));
        prop::collection::vec(prop::collection::vec(event, 1..8), 1..24)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Heads, advanced and backed up at random, answer as a scan of every run does.
        #[test]
        fn heads_answer_as_a_scan_does(
            runs in runs_strategy(),
            live0 in prop::collection::vec(0u64..6, 0..4),
            moves in prop::collection::vec((any::<bool>(), any::<prop::sample::Index>()), 0..120),
        ) {
            let mut live: PtrSet = live0.iter().map(|a| a * 0x10).filter(|&a| a != 0).collect();
            let mut heads = Heads::new(&runs, &live);
            let mut path: Vec<(u32, bool)> = Vec::new();
            for (back, pick) in moves {
                let (fitting, best) = naive(&runs, &heads.pos, &live);
                prop_assert_eq!(heads.fitting(MAX_CHOICES), fitting);
                prop_assert_eq!(heads.best_effort(), best);
                if back && let Some((r, changed)) = path.pop() {
                    heads.retreat(r, changed, &mut live);
                    continue;
                }
                let open: Vec<u32> = (0..runs.len() as u32)
                    .filter(|&r| (heads.pos[r as usize] as usize) < runs[r as usize].len())
                    .collect();
                if open.is_empty() {
                    break;
                }
                let r = open[pick.index(open.len())];
                let changed = heads.advance(r, &mut live);
                path.push((r, changed));
            }
        }
    }

    /// A period no order makes consistent (every thread allocates one shared pointer nobody
    /// frees) still orders every event, each run in its order.
    #[test]
    fn greedy_orders_an_inconsistent_period_whole() {
        let runs: Vec<Vec<SpoolEvent>> = (0..50u64)
            .map(|t| {
                let own = 0x1000 + t * 0x100;
                vec![ev(0, 0x50), ev(0, own), ev(3 | OP_FREE, own)]
            })
            .collect();
        let mut live = PtrSet::default();
        assert_eq!(search(&runs, &mut live), None);
        assert!(
            live.is_empty(),
            "a failed search leaves the live pointers as they were"
        );
        let order = greedy(&runs, &mut live);
        assert_eq!(order.len(), 150);
        for r in 0..50u32 {
            assert_eq!(order.iter().filter(|&&x| x == r).count(), 3);
        }
        // Each run's own block is allocated and freed right after the shared pointer.
        assert_eq!(&order[..3], &[0, 0, 0]);
        assert_eq!(live.iter().copied().collect::<Vec<_>>(), vec![0x50]);
    }
}
