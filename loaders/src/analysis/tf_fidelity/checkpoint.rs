//! The checkpoint of [`super::replay_checkpointed`]: where to take it, and the chunks live
//! there (logged allocations, variables revealed by tensor outputs, raw allocations).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use allocview_sim::policy::bfc::{LiveChunk, rounded_bytes};
use allocview_sim::trace::{EventKind, NO_ALLOC_ID};

use crate::tf::memlog::{RecordKind, TfMemoryLog};

/// A chunk of the rebuilt state.
#[derive(Clone, Copy, Debug)]
pub(super) struct StateChunk {
    pub(super) chunk: LiveChunk,
    pub(super) raw: bool,
    pub(super) variable: bool,
}

/// Where to take the checkpoint.
pub(super) struct CheckpointPlan {
    pub(super) event: usize,
    pub(super) line: u64,
    pub(super) reason: String,
    pub(super) next_tf_id: u64,
    pub(super) unlogged_ids: u64,
    pub(super) unknown_live: u64,
    pub(super) unknown_after: u64,
}

impl CheckpointPlan {
    pub(super) fn find(log: &TfMemoryLog) -> Self {
        let logged: HashMap<i64, usize> = log
            .records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.record.is_allocation())
            .map(|(i, r)| (r.tf_alloc_id, i))
            .collect();
        let revealed: HashMap<i64, usize> = log
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| !logged.contains_key(&o.tf_alloc_id))
            .map(|(i, o)| (o.tf_alloc_id, i))
            .collect();
        // Frees of ids the log never shows and no output reveals: unknown temporaries.
        let mut last_unknown: Option<usize> = None;
        let mut unknown_freed: HashMap<i64, usize> = HashMap::new();
        for (i, r) in log.records.iter().enumerate() {
            if r.kind == EventKind::FreeUnknown && !revealed.contains_key(&r.tf_alloc_id) {
                last_unknown = Some(i);
                unknown_freed.insert(r.tf_alloc_id, i);
            }
        }
        let max_id = logged
            .keys()
            .chain(revealed.keys())
            .chain(unknown_freed.keys())
            .copied()
            .max()
            .unwrap_or(0);
        let event = last_unknown.map_or(0, |i| i.saturating_add(1));
        // The allocation counter at the checkpoint: the first id allocated after it, since
        // every smaller id (variables whose outputs come later included) was allocated before.
        // Ids are the file's i64s: the arithmetic is done in i128, where `+ 1` cannot overflow.
        let seen_before = log
            .records
            .iter()
            .take(event)
            .map(|r| r.tf_alloc_id)
            .max()
            .unwrap_or(0);
        let next_tf_id = log
            .records
            .iter()
            .skip(event)
            .filter(|r| r.record.is_allocation())
            .map(|r| i128::from(r.tf_alloc_id))
            .min()
            .unwrap_or(i128::from(max_id) + 1)
            .max(i128::from(seen_before) + 1);
        let counts = IdCounts::of(&logged, &revealed, &unknown_freed, max_id, next_tf_id);
        let line = last_unknown
            .and_then(|i| log.records.get(i))
            .map_or(0, |r| r.line);
        let reason = match last_unknown {
            Some(i) => format!(
                "event {i} (line {line}) frees the last of {} allocations the log never shows \
                 (ids without an allocation record or a tensor output); from there every live \
                 chunk is known",
                unknown_freed.len()
            ),
            None => "the log shows every allocation: replaying from the first event".into(),
        };
        Self {
            event,
            line,
            reason,
            next_tf_id: u64::try_from(next_tf_id).unwrap_or(0),
            unlogged_ids: counts.unlogged,
            unknown_live: counts.unknown_live,
            unknown_after: counts.unknown_after,
        }
    }

    /// Live chunks at the checkpoint: logged allocations not yet freed, and revealed variables
    /// allocated before it and not yet freed.
    pub(super) fn live_chunks(&self, log: &TfMemoryLog) -> Vec<StateChunk> {
        let mut live: HashMap<i64, StateChunk> = HashMap::new();
        for r in log.records.iter().take(self.event) {
            match r.kind {
                EventKind::Alloc => {
                    let raw = r.record == RecordKind::RawAllocation;
                    let size = chunk_bytes(r.allocated_bytes, r.requested_bytes);
                    live.insert(
                        r.tf_alloc_id,
                        StateChunk {
                            chunk: LiveChunk {
                                addr: r.ptr,
                                size_bytes: size,
                                requested_bytes: r.requested_bytes.min(size),
                                allocation_id: u64::try_from(r.tf_alloc_id).unwrap_or(0),
                                request_id: r.alloc_id,
                            },
                            raw,
                            variable: false,
                        },
                    );
                }
                EventKind::Free | EventKind::FreeUnknown => {
                    live.remove(&r.tf_alloc_id);
                }
                _ => {}
            }
        }
        let freed_before: HashMap<i64, ()> = log
            .records
            .iter()
            .take(self.event)
            .filter(|r| r.kind == EventKind::FreeUnknown)
            .map(|r| (r.tf_alloc_id, ()))
            .collect();
        let logged: HashMap<i64, ()> = log
            .records
            .iter()
            .filter(|r| r.record.is_allocation())
            .map(|r| (r.tf_alloc_id, ()))
            .collect();
        for o in &log.outputs {
            let id = u64::try_from(o.tf_alloc_id).unwrap_or(0);
            if id == 0
                || id >= self.next_tf_id
                || logged.contains_key(&o.tf_alloc_id)
                || freed_before.contains_key(&o.tf_alloc_id)
                || live.contains_key(&o.tf_alloc_id)
            {
                continue;
            }
            let size = chunk_bytes(o.allocated_bytes, o.requested_bytes);
            live.insert(
                o.tf_alloc_id,
                StateChunk {
                    chunk: LiveChunk {
                        addr: o.ptr,
                        size_bytes: size,
                        requested_bytes: o.requested_bytes.min(size),
                        allocation_id: id,
                        request_id: NO_ALLOC_ID,
                    },
                    raw: false,
                    variable: true,
                },
            );
        }
        let mut out: Vec<StateChunk> = live.into_values().collect();
        out.sort_by_key(|c| c.chunk.addr);
        out
    }
}

/// The ids in `1..=max_id` the log never shows, counted from the ids that occur (a file's
/// id may be 10^18: a walk over every id in the range would run for years).
struct IdCounts {
    /// Ids without an allocation record.
    unlogged: u64,
    /// Of those, ids below the checkpoint's counter that no output reveals and no free names.
    unknown_live: u64,
    /// Of those, ids from the checkpoint's counter on that no output reveals.
    unknown_after: u64,
}

impl IdCounts {
    fn of(
        logged: &HashMap<i64, usize>,
        revealed: &HashMap<i64, usize>,
        unknown_freed: &HashMap<i64, usize>,
        max_id: i64,
        next_tf_id: i128,
    ) -> Self {
        let max_id = i128::from(max_id);
        // How many ids lie in `lo..=hi`, and how many of `ids` do (each id counted once).
        let span = |lo: i128, hi: i128| u64::try_from(hi - lo + 1).unwrap_or(0);
        let within = |ids: &BTreeSet<i64>, lo: i128, hi: i128| {
            ids.iter()
                .filter(|&&id| (lo..=hi).contains(&i128::from(id)))
                .count() as u64
        };
        let logged_ids: BTreeSet<i64> = logged.keys().copied().collect();
        let known: BTreeSet<i64> = logged_ids
            .union(&revealed.keys().copied().collect())
            .copied()
            .collect();
        let known_or_freed: BTreeSet<i64> = known
            .union(&unknown_freed.keys().copied().collect())
            .copied()
            .collect();
        let before_hi = max_id.min(next_tf_id - 1);
        let after_lo = next_tf_id.max(1);
        Self {
            unlogged: span(1, max_id).saturating_sub(within(&logged_ids, 1, max_id)),
            unknown_live: span(1, before_hi).saturating_sub(within(&known_or_freed, 1, before_hi)),
            unknown_after: span(after_lo, max_id).saturating_sub(within(&known, after_lo, max_id)),
        }
    }
}

/// A variable seen only through a tensor output.
#[derive(Clone, Copy, Debug)]
pub(super) struct Variable {
    pub(super) ptr: u64,
    pub(super) requested_bytes: u64,
    pub(super) allocated_bytes: Option<u64>,
    pub(super) thread: u16,
}

/// Variables (tensor outputs of ids never logged as allocated), by TF id.
pub(super) fn revealed_variables(log: &TfMemoryLog) -> BTreeMap<i64, Variable> {
    let logged: HashMap<i64, ()> = log
        .records
        .iter()
        .filter(|r| r.record.is_allocation())
        .map(|r| (r.tf_alloc_id, ()))
        .collect();
    log.outputs
        .iter()
        .filter(|o| o.tf_alloc_id > 0 && !logged.contains_key(&o.tf_alloc_id))
        .map(|o| {
            let thread = o
                .thread
                .or_else(|| log.records.get(o.events_before).map(|r| r.thread))
                .unwrap_or(0);
            (
                o.tf_alloc_id,
                Variable {
                    ptr: o.ptr,
                    requested_bytes: o.requested_bytes,
                    allocated_bytes: o.allocated_bytes,
                    thread,
                },
            )
        })
        .collect()
}

/// A logged allocation's chunk: the size the log gives, else the request rounded as BFC does.
fn chunk_bytes(allocated_bytes: Option<u64>, requested_bytes: u64) -> u64 {
    allocated_bytes
        .filter(|&b| b > 0)
        .unwrap_or_else(|| rounded_bytes(requested_bytes.max(1)))
}
