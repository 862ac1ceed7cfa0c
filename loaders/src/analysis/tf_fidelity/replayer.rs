//! The replay itself: BFC driven by the log's events, each allocation checked against the
//! address and chunk size TensorFlow logged (see the module docs of [`super`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use allocview_sim::heap::{AllocError, Counters};
use allocview_sim::policy::Policy;
use allocview_sim::policy::bfc::{Bfc, RegionInfo, rounded_bytes};
use allocview_sim::trace::{EventKind, NO_ALLOC_ID};

use super::checkpoint::{Variable, revealed_variables};
use super::{
    Divergence, Fidelity, FidelityError, FirstOom, GuidedDecisions, MemInfoCheck, ReplayMetrics,
    ReplayStart, compare_chunk_maps,
};
use crate::tf::memlog::{RecordKind, TfMemoryLog};

/// A free waiting to be applied.
#[derive(Clone, Copy, Debug)]
pub(super) struct PendingFree {
    thread: u16,
    addr: u64,
}

pub(super) struct Replayer {
    pub(super) bfc: Bfc,
    pub(super) stop_at_first_oom: bool,
    /// See [`super::FidelityOptions::no_guidance`].
    pub(super) no_guidance: bool,
    pub(super) guided: GuidedDecisions,
    /// Address of each TF allocation id in the replay (live ones).
    pub(super) addr_of: HashMap<i64, u64>,
    pub(super) pending: Vec<PendingFree>,
    pub(super) checked: u64,
    pub(super) address_matches: u64,
    pub(super) size_matches: u64,
    pub(super) sizes_checked: u64,
    pub(super) first_divergence: Option<Divergence>,
    pub(super) held_back: u64,
    pub(super) ooms: u64,
    pub(super) first_oom: Option<FirstOom>,
    pub(super) logged_oom_reproduced: Option<bool>,
    pub(super) logged_oom_held_back_frees: Option<u64>,
    /// Other threads' frees the last [`Self::allocate`] held back to hit its target.
    pub(super) last_held_frees: u64,
    pub(super) meminfo: Vec<MemInfoCheck>,
    pub(super) next_meminfo: usize,
    /// TF's allocation counter where the replay starts.
    pub(super) first_tf_id: i64,
    pub(super) variables_replayed: u64,
    pub(super) metrics: ReplayMetrics,
    pub(super) frag_sum: f64,
    pub(super) started: std::time::Instant,
}

impl Replayer {
    pub(super) fn new(log: &TfMemoryLog, bfc: Bfc, start: usize) -> Self {
        let first_tf_id = i64::try_from(bfc.next_allocation_id()).unwrap_or(1);
        let mut addr_of = HashMap::new();
        for c in bfc.chunks() {
            if let Some(id) = c.allocation_id
                && let Ok(id) = i64::try_from(id)
            {
                addr_of.insert(id, c.addr);
            }
        }
        let next_meminfo = log
            .meminfo
            .iter()
            .position(|m| m.events_before >= start)
            .unwrap_or(log.meminfo.len());
        Self {
            stop_at_first_oom: false,
            no_guidance: false,
            guided: GuidedDecisions::default(),
            bfc,
            addr_of,
            pending: Vec::new(),
            checked: 0,
            address_matches: 0,
            size_matches: 0,
            sizes_checked: 0,
            first_divergence: None,
            held_back: 0,
            ooms: 0,
            first_oom: None,
            logged_oom_reproduced: None,
            logged_oom_held_back_frees: None,
            last_held_frees: 0,
            meminfo: Vec::new(),
            next_meminfo,
            first_tf_id,
            variables_replayed: 0,
            metrics: ReplayMetrics::default(),
            frag_sum: 0.0,
            started: std::time::Instant::now(),
        }
    }

    fn note_meminfo(&mut self, log: &TfMemoryLog, before_event: usize) {
        while let Some(m) = log.meminfo.get(self.next_meminfo) {
            if m.events_before > before_event {
                break;
            }
            // Frees logged before this point have taken effect by the time Python asks.
            let pending = std::mem::take(&mut self.pending);
            Self::apply_frees(&mut self.bfc, &pending);
            let s = self.bfc.stats();
            self.meminfo.push(MemInfoCheck {
                tag: m.tag.clone(),
                line: m.line,
                tf_current_bytes: m.current_bytes,
                tf_peak_bytes: m.peak_bytes,
                replay_current_bytes: s.bytes_in_use,
                replay_peak_bytes: s.peak_bytes_in_use,
            });
            self.next_meminfo += 1;
        }
    }

    fn apply_frees(bfc: &mut Bfc, frees: &[PendingFree]) {
        for f in frees {
            // A chunk the replay never placed (it failed) has nothing to free.
            bfc.deallocate(f.addr).ok();
        }
    }

    /// Allocates with all pending frees applied; when the result misses `expected` and other
    /// threads' frees are pending, retries holding back the most recent of them.
    fn allocate(
        &mut self,
        thread: u16,
        size: u64,
        request_id: u32,
        expected: Option<u64>,
        expect_failure: bool,
    ) -> Result<Result<(u64, u64), AllocError>, FidelityError> {
        self.last_held_frees = 0;
        let others = self.pending.iter().filter(|f| f.thread != thread).count();
        let hit = |res: &Result<allocview_sim::policy::bfc::BfcAllocation, AllocError>| match res {
            Ok(a) => !expect_failure && expected.is_none_or(|e| e == a.addr),
            Err(_) => expect_failure,
        };
        if others == 0 || self.no_guidance {
            let pending = std::mem::take(&mut self.pending);
            Self::apply_frees(&mut self.bfc, &pending);
            return Ok(self
                .bfc
                .allocate(size, request_id)
                .map(|a| (a.addr, a.chunk_bytes)));
        }
        let backup = self.bfc.clone();
        let pending = std::mem::take(&mut self.pending);
        Self::apply_frees(&mut self.bfc, &pending);
        let first = self.bfc.allocate(size, request_id);
        if hit(&first) {
            return Ok(first.map(|a| (a.addr, a.chunk_bytes)));
        }
        self.guided.placements_retried += 1;
        let other_positions: Vec<usize> = pending
            .iter()
            .enumerate()
            .filter(|(_, f)| f.thread != thread)
            .map(|(i, _)| i)
            .collect();
        for k in 1..=other_positions.len() {
            let held: Vec<usize> = other_positions.iter().rev().take(k).copied().collect();
            let mut trial = backup.clone();
            let applied: Vec<PendingFree> = pending
                .iter()
                .enumerate()
                .filter(|(i, _)| !held.contains(i))
                .map(|(_, f)| *f)
                .collect();
            Self::apply_frees(&mut trial, &applied);
            let res = trial.allocate(size, request_id);
            if hit(&res) {
                self.bfc = trial;
                self.held_back += 1;
                self.guided.held_back_frees += 1;
                self.last_held_frees = held.len() as u64;
                let mut keep: Vec<PendingFree> = pending
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| held.contains(i))
                    .map(|(_, f)| *f)
                    .collect();
                self.pending.append(&mut keep);
                return Ok(res.map(|a| (a.addr, a.chunk_bytes)));
            }
        }
        Ok(first.map(|a| (a.addr, a.chunk_bytes)))
    }

    pub(super) fn run(&mut self, log: &TfMemoryLog, start: usize) -> Result<(), FidelityError> {
        // BFC's ids are its allocation order, but threads log an allocation after making it:
        // an allocation logged after one with a higher id really came first.
        // Ordered, so the ids between two allocations are found by a range over the ids that
        // occur, not by counting through the gap (a file's id may be 10^18).
        let alloc_at: BTreeMap<i64, usize> = log
            .records
            .iter()
            .enumerate()
            .skip(start)
            .filter(|(_, r)| r.kind == EventKind::Alloc)
            .map(|(i, r)| (r.tf_alloc_id, i))
            .collect();
        let mut done = vec![false; log.records.len()];
        let mut variables = revealed_variables(log);
        let mut due: Vec<(i64, Variable)> = Vec::new();
        let mut max_id = self.first_tf_id.saturating_sub(1);
        for (event, r) in log.records.iter().enumerate().skip(start) {
            self.note_meminfo(log, event);
            match r.kind {
                EventKind::Free | EventKind::FreeUnknown => {
                    if let Some(addr) = self.addr_of.remove(&r.tf_alloc_id) {
                        self.pending.push(PendingFree {
                            thread: r.thread,
                            addr,
                        });
                    }
                    self.try_due_variables(log, event, &mut due)?;
                }
                EventKind::Alloc => {
                    if done.get(event).copied().unwrap_or(true) {
                        continue;
                    }
                    // Variables allocated before this one that never found their address.
                    for (id, v) in std::mem::take(&mut due) {
                        self.replay_variable(log, event, id, v)?;
                    }
                    for id in ids_between(&alloc_at, &variables, max_id, r.tf_alloc_id) {
                        if let Some(&later) = alloc_at.get(&id) {
                            if later > event
                                && let Some(d) = done.get_mut(later)
                                && !*d
                            {
                                *d = true;
                                self.replay_alloc(log, later)?;
                            }
                        } else if let Some(v) = variables.remove(&id) {
                            self.replay_variable(log, event, id, v)?;
                        }
                    }
                    if let Some(d) = done.get_mut(event) {
                        *d = true;
                    }
                    max_id = max_id.max(r.tf_alloc_id);
                    self.replay_alloc(log, event)?;
                    // A variable the log shows only through its outputs was allocated after
                    // the id before it and before the next logged id: it is placed at the
                    // first point in between where BFC puts it at its logged address.
                    let mut id = r.tf_alloc_id;
                    while let Some(next) = id.checked_add(1)
                        && let Some(v) = variables.remove(&next)
                    {
                        due.push((next, v));
                        max_id = max_id.max(next);
                        id = next;
                    }
                    self.try_due_variables(log, event, &mut due)?;
                }
                EventKind::AllocFailed => {
                    for (id, v) in std::mem::take(&mut due) {
                        self.replay_variable(log, event, id, v)?;
                    }
                    let res =
                        self.allocate(r.thread, r.requested_bytes, NO_ALLOC_ID, None, true)?;
                    match res {
                        Ok((addr, _)) => {
                            // TF could not serve it: give it back so the state stays TF's.
                            self.bfc.deallocate(addr).map_err(|e| {
                                FidelityError::Replay(format!("undoing event {event}: {e}"))
                            })?;
                            self.logged_oom_reproduced.get_or_insert(false);
                        }
                        Err(_) => {
                            self.ooms += 1;
                            if self.logged_oom_reproduced.is_none() {
                                self.logged_oom_reproduced = Some(true);
                                self.logged_oom_held_back_frees = Some(self.last_held_frees);
                            }
                            self.record_oom(log, event, r.requested_bytes, true);
                        }
                    }
                }
                EventKind::FreeNull | EventKind::FreeRequested => {}
            }
            let c = self.bfc.counters();
            self.metrics.observe(&c, &mut self.frag_sum);
            if self.stop_at_first_oom && self.ooms > 0 {
                return Ok(());
            }
        }
        let last = log.records.len().saturating_sub(1);
        for (id, v) in std::mem::take(&mut due) {
            self.replay_variable(log, last, id, v)?;
        }
        let pending = std::mem::take(&mut self.pending);
        Self::apply_frees(&mut self.bfc, &pending);
        self.note_meminfo(log, usize::MAX);
        Ok(())
    }

    /// Allocates the due variables, in id order, while each lands at its logged address;
    /// the first that would not stays due (with the rest) until the next event.
    fn try_due_variables(
        &mut self,
        log: &TfMemoryLog,
        event: usize,
        due: &mut Vec<(i64, Variable)>,
    ) -> Result<(), FidelityError> {
        if self.no_guidance {
            // Right after the allocation before it in id order, wherever BFC puts it.
            for (id, v) in std::mem::take(due) {
                self.replay_variable(log, event, id, v)?;
            }
            return Ok(());
        }
        while let Some(&(id, v)) = due.first() {
            let saved = (
                self.bfc.clone(),
                self.pending.clone(),
                self.held_back,
                self.guided,
            );
            match self.allocate(v.thread, v.requested_bytes, NO_ALLOC_ID, Some(v.ptr), false)? {
                Ok((addr, _)) if addr == v.ptr => {
                    (self.bfc, self.pending, self.held_back, self.guided) = saved;
                    due.remove(0);
                    self.guided.variables_placed_by_address += 1;
                    self.replay_variable(log, event, id, v)?;
                }
                _ => {
                    (self.bfc, self.pending, self.held_back, self.guided) = saved;
                    break;
                }
            }
        }
        Ok(())
    }

    /// Allocates a revealed variable (tensor output) at its place in id order.
    fn replay_variable(
        &mut self,
        log: &TfMemoryLog,
        event: usize,
        tf_id: i64,
        v: Variable,
    ) -> Result<(), FidelityError> {
        let line = log.records.get(event).map_or(0, |r| r.line);
        let res = self.allocate(v.thread, v.requested_bytes, NO_ALLOC_ID, Some(v.ptr), false)?;
        let got = match res {
            Ok((a, b)) => {
                self.addr_of.insert(tf_id, a);
                Some((a, b))
            }
            Err(_) => {
                self.ooms += 1;
                self.record_oom(log, event, v.requested_bytes, false);
                None
            }
        };
        self.variables_replayed += 1;
        self.check(
            event,
            line,
            tf_id,
            v.requested_bytes,
            v.ptr,
            v.allocated_bytes,
            got,
        );
        Ok(())
    }

    /// Replays the allocation of event `event` and checks it against the log.
    fn replay_alloc(&mut self, log: &TfMemoryLog, event: usize) -> Result<(), FidelityError> {
        let Some(r) = log.records.get(event) else {
            return Ok(());
        };
        let expected = (r.ptr != 0).then_some(r.ptr);
        let res = self.allocate(r.thread, r.requested_bytes, r.alloc_id, expected, false)?;
        let (got_addr, got_bytes) = match res {
            Ok((a, b)) => {
                self.addr_of.insert(r.tf_alloc_id, a);
                (Some(a), Some(b))
            }
            Err(_) => {
                self.ooms += 1;
                self.record_oom(log, event, r.requested_bytes, false);
                (None, None)
            }
        };
        let Some(expected) = expected else {
            return Ok(());
        };
        let tf_bytes = r
            .allocated_bytes
            .filter(|_| r.record == RecordKind::TensorAllocation);
        self.check(
            event,
            r.line,
            r.tf_alloc_id,
            r.requested_bytes,
            expected,
            tf_bytes,
            got_addr.zip(got_bytes),
        );
        Ok(())
    }

    /// Counts one allocation with TF's pointer (and chunk size, when logged).
    #[allow(clippy::too_many_arguments)]
    fn check(
        &mut self,
        event: usize,
        line: u64,
        tf_alloc_id: i64,
        requested_bytes: u64,
        expected_addr: u64,
        expected_bytes: Option<u64>,
        got: Option<(u64, u64)>,
    ) {
        self.checked += 1;
        let addr_ok = got.is_some_and(|(a, _)| a == expected_addr);
        if addr_ok {
            self.address_matches += 1;
        }
        let size_ok = match expected_bytes {
            Some(tf) => {
                self.sizes_checked += 1;
                let ok = got.is_some_and(|(_, b)| b == tf);
                if ok {
                    self.size_matches += 1;
                }
                ok
            }
            None => true,
        };
        if (!addr_ok || !size_ok) && self.first_divergence.is_none() {
            self.first_divergence = Some(Divergence {
                event,
                line,
                tf_alloc_id,
                requested_bytes,
                expected_addr,
                expected_bytes,
                got_addr: got.map(|(a, _)| a),
                got_bytes: got.map(|(_, b)| b),
            });
        }
    }

    fn record_oom(&mut self, log: &TfMemoryLog, event: usize, request: u64, logged: bool) {
        if self.first_oom.is_some() {
            return;
        }
        let c: Counters = self.bfc.counters();
        let chunks = self.bfc.chunks();
        let line = log.records.get(event).map_or(0, |r| r.line);
        let dump = log
            .dumps
            .iter()
            .find(|d| d.first_line >= line && !d.chunks.is_empty());
        let dump_comparison = dump.map(|d| compare_chunk_maps(d, &chunks));
        self.first_oom = Some(FirstOom {
            event,
            line,
            logged,
            request_bytes: request,
            rounded_bytes: rounded_bytes(request),
            in_use_chunks: c.live_allocs,
            in_use_bytes: self.bfc.stats().bytes_in_use,
            free_chunks: c.free_blocks,
            free_bytes: c.free_bytes,
            regions: self.bfc.regions().len() as u64,
            region_bytes: self.bfc.total_region_allocated_bytes(),
            largest_free_chunk_bytes: c.largest_free_bytes,
            chunks,
            dump_comparison,
        });
    }

    pub(super) fn finish(mut self, log: &TfMemoryLog, start: ReplayStart) -> Fidelity {
        let s = self.bfc.stats();
        // The frees still held back at the end are applied by `run`: count the final state.
        let c = self.bfc.counters();
        self.metrics.final_footprint_bytes = c.footprint_bytes;
        self.metrics.mean_fragmentation = if self.metrics.events == 0 {
            0.0
        } else {
            self.frag_sum / self.metrics.events as f64
        };
        self.metrics.replay_seconds = self.started.elapsed().as_secs_f64();
        let mut replayed: Vec<RegionInfo> = self.bfc.regions();
        // Creation order: the logged bases are consumed in order, so sort by the logged order.
        let order: HashMap<u64, usize> = log
            .regions
            .iter()
            .enumerate()
            .map(|(i, r)| (r.base, i))
            .collect();
        replayed.sort_by_key(|r| order.get(&r.base).copied().unwrap_or(usize::MAX));
        Fidelity {
            start,
            checkpoint: None,
            limit_bytes: self.bfc.options().limit_bytes,
            allow_growth: self.bfc.options().allow_growth,
            checked: self.checked,
            address_matches: self.address_matches,
            size_matches: self.size_matches,
            sizes_checked: self.sizes_checked,
            first_divergence: self.first_divergence,
            held_back: self.held_back,
            guided: !self.no_guidance,
            guided_decisions: self.guided,
            variables_replayed: self.variables_replayed,
            ooms: self.ooms,
            first_oom: self.first_oom,
            logged_oom_reproduced: self.logged_oom_reproduced,
            logged_oom_held_back_frees: self.logged_oom_held_back_frees,
            peak_bytes_in_use: s.peak_bytes_in_use,
            final_bytes_in_use: s.bytes_in_use,
            meminfo: self.meminfo,
            regions_logged: log.regions.iter().map(|r| (r.base, r.size_bytes)).collect(),
            regions_replayed: replayed.iter().map(|r| (r.base, r.size_bytes)).collect(),
            final_state: self.bfc,
            metrics: self.metrics,
        }
    }
}

/// The ids strictly between `after` and `before` that are logged allocations or revealed
/// variables, in order.
fn ids_between(
    alloc_at: &BTreeMap<i64, usize>,
    variables: &BTreeMap<i64, Variable>,
    after: i64,
    before: i64,
) -> BTreeSet<i64> {
    use std::ops::Bound::Excluded;
    // A range whose ends are equal and excluded, or reversed, would panic: it is empty.
    if after >= before {
        return BTreeSet::new();
    }
    let range = (Excluded(after), Excluded(before));
    alloc_at
        .range(range)
        .map(|(&id, _)| id)
        .chain(variables.range(range).map(|(&id, _)| id))
        .collect()
}
