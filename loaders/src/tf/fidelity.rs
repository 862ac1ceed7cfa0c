//! The `bfc` policy against TensorFlow itself: replays a memory log through
//! [`allocview_sim::policy::bfc::Bfc`] and checks every allocation's address and chunk size
//! against the ones TensorFlow logged.
//!
//! BFC's allocation ids are its allocation counter, so ids missing from the log are
//! allocations it does not show: model variables (never logged as allocated, but a
//! `MemoryLogTensorOutput` gives their pointer and size) and temporaries of model building
//! (only their deallocation is logged). A replay from process start ([`replay_from_start`])
//! cannot put later chunks at TensorFlow's addresses. [`replay_checkpointed`] instead rebuilds
//! the allocator at the point where the last unknown allocation has been freed: live chunks from
//! the logged pointers and allocated bytes plus the revealed variables, regions from the
//! `Allocated memory at 0x... to 0x...` lines (later regions are queued at their logged bases),
//! free chunks in the gaps (BFC never leaves two free chunks side by side). From there it
//! replays pure BFC, with refinements decided from the log alone:
//! - raw allocations (`TF_NewTensor`) carry only the requested bytes; one live at the checkpoint
//!   either took exactly its rounded size (split) or the whole chunk it found (not split, when
//!   the gap after it is smaller than the rounded size): both are tried and the replay that
//!   matches more addresses wins (later raw allocations are sized by the replay's own split
//!   rule);
//! - allocations are replayed in BFC's id order: a thread logs an allocation after making it,
//!   so one logged after an allocation with a higher id really came first;
//! - a free is logged before it takes effect, so another thread's allocation logged after it
//!   may really have come first: when an allocation misses its logged pointer with frees of
//!   other threads pending, the most recent of them are held back until it matches;
//! - a variable allocated after the checkpoint (its id lies between logged ones, its output
//!   gives its pointer) is placed after the allocation before it in id order, at the first
//!   point before the next one where BFC puts it at its logged address.
//!
//! Cost: one replay (or a few, for raw chunks) of O(log n) BFC operations per event, plus a
//! clone of the allocator for each allocation that has other threads' frees pending.

use std::collections::HashMap;

use allocview_sim::policy::bfc::{
    Bfc, BfcOptions, BfcStateError, BfcStats, ChunkInfo, DEFAULT_LIMIT_BYTES,
    DEFAULT_MAX_INTERNAL_FRAGMENTATION_BYTES, INITIAL_GROWTH_REGION_BYTES, LiveChunk, RegionInfo,
    rounded_bytes,
};
use allocview_sim::policy::{AllocError, Counters, Policy};
use allocview_sim::trace::{EventKind, NO_ALLOC_ID};

use super::dump::BfcDump;
use super::memlog::{RecordKind, TfMemoryLog};

/// Replay options.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FidelityOptions {
    /// The BFC memory limit (default: the `Limit` of a dump in the log, else 1 TiB).
    pub limit_bytes: Option<u64>,
    /// Growth (default: true when the first logged region is 2 MiB or there is none).
    pub allow_growth: Option<bool>,
    /// End the replay at its first OOM (a search for the smallest working limit needs no
    /// more); the other figures then describe only the replayed prefix.
    pub stop_at_first_oom: bool,
}

/// How the replay started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayStart {
    /// From the rebuilt state at the checkpoint.
    Checkpoint,
    /// From an empty allocator at the first event.
    FromStart,
}

/// Where the checkpoint was taken and what the rebuilt state held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// First event replayed; the events before it are folded into the rebuilt state.
    pub event: usize,
    /// 1-based log line of the event that set the checkpoint (0 when none did).
    pub line: u64,
    /// Why there, in words.
    pub reason: String,
    /// Live chunks of the rebuilt state: logged allocations, variables, raw allocations.
    pub live_logged: u64,
    pub live_variables: u64,
    pub live_raw: u64,
    pub bytes_in_use: u64,
    pub regions: u64,
    pub region_bytes: u64,
    /// Allocation ids the log never shows (unknown temporaries and variables).
    pub unlogged_ids: u64,
    /// Unknown allocations still live at the checkpoint (their space is wrongly free).
    pub unknown_live: u64,
    /// Unknown allocations after the checkpoint (the replay cannot show them).
    pub unknown_after: u64,
    /// Chunk size chosen for each raw allocation live at the checkpoint: (pointer, bytes).
    pub raw_chunk_bytes: Vec<(u64, u64)>,
}

/// The first allocation that did not land where TensorFlow put it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// Row in the event DataFrame.
    pub event: usize,
    pub line: u64,
    pub tf_alloc_id: i64,
    pub requested_bytes: u64,
    pub expected_addr: u64,
    /// TF's chunk size (tensor allocations only).
    pub expected_bytes: Option<u64>,
    /// Where the replay put it (`None`: the replay ran out of memory).
    pub got_addr: Option<u64>,
    pub got_bytes: Option<u64>,
}

/// The replay's first failed allocation and the allocator at that moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirstOom {
    pub event: usize,
    pub line: u64,
    /// True when TensorFlow's log says this very request failed (a dump's OOM request).
    pub logged: bool,
    pub request_bytes: u64,
    pub rounded_bytes: u64,
    pub in_use_chunks: u64,
    pub in_use_bytes: u64,
    pub free_chunks: u64,
    pub free_bytes: u64,
    pub regions: u64,
    pub region_bytes: u64,
    pub largest_free_chunk_bytes: u64,
    /// Every chunk in address order.
    pub chunks: Vec<ChunkInfo>,
    /// The chunk map against the log's dump of this OOM, when it has one.
    pub dump_comparison: Option<ChunkMapComparison>,
}

/// A replayed chunk map against a dump's chunk lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkMapComparison {
    pub dump_chunks: u64,
    pub replay_chunks: u64,
    /// Chunks with the same address, size and state in both.
    pub identical: u64,
    /// The first difference in address order, in words.
    pub first_difference: Option<String>,
}

impl ChunkMapComparison {
    /// True when both maps hold exactly the same chunks.
    #[must_use]
    pub fn all_identical(&self) -> bool {
        self.first_difference.is_none() && self.dump_chunks == self.replay_chunks
    }
}

/// A `MEMINFO` line against the replay at the same point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemInfoCheck {
    pub tag: String,
    pub line: u64,
    pub tf_current_bytes: u64,
    pub tf_peak_bytes: u64,
    pub replay_current_bytes: u64,
    /// The replay's peak since its start (a checkpointed replay does not see earlier peaks).
    pub replay_peak_bytes: u64,
}

/// The figures `allocview compare` reports for every policy, measured after each event of
/// this replay (the same definitions as the simulator's replay engine).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplayMetrics {
    /// Events of the log replayed (from the checkpoint, or from the start).
    pub events: u64,
    /// Highest total region bytes.
    pub peak_footprint_bytes: u64,
    pub final_footprint_bytes: u64,
    /// Highest sum of the requested sizes of live chunks.
    pub peak_live_bytes: u64,
    /// Highest sum of chunk sizes in use (TensorFlow's `bytes_in_use`).
    pub peak_allocated_bytes: u64,
    /// Lowest fragmentation (1 - live / footprint) while the footprint is at its peak.
    pub fragmentation_at_peak: f64,
    /// Event-weighted mean fragmentation.
    pub mean_fragmentation: f64,
    /// Wall-clock seconds of the replay.
    pub replay_seconds: f64,
}

impl ReplayMetrics {
    fn observe(&mut self, c: &Counters, frag_sum: &mut f64) {
        let frag = allocview_sim::metrics::fragmentation(c);
        self.events += 1;
        *frag_sum += frag;
        if c.footprint_bytes > self.peak_footprint_bytes || self.events == 1 {
            self.peak_footprint_bytes = c.footprint_bytes;
            self.fragmentation_at_peak = frag;
        } else if c.footprint_bytes == self.peak_footprint_bytes {
            self.fragmentation_at_peak = self.fragmentation_at_peak.min(frag);
        }
        self.peak_live_bytes = self.peak_live_bytes.max(c.live_bytes);
        self.peak_allocated_bytes = self.peak_allocated_bytes.max(c.allocated_bytes);
        self.final_footprint_bytes = c.footprint_bytes;
    }
}

/// What a replay found.
#[derive(Clone, Debug)]
pub struct Fidelity {
    pub start: ReplayStart,
    pub checkpoint: Option<Checkpoint>,
    pub limit_bytes: u64,
    pub allow_growth: bool,
    /// Allocations replayed that carry TensorFlow's pointer.
    pub checked: u64,
    pub address_matches: u64,
    /// Tensor allocations (TF logs their chunk size) whose chunk size matched.
    pub size_matches: u64,
    /// Tensor allocations checked for size.
    pub sizes_checked: u64,
    pub first_divergence: Option<Divergence>,
    /// Allocations that matched only once other threads' frees were held back.
    pub held_back: u64,
    /// Variables (known only from tensor outputs) allocated during the replay, at their place
    /// in id order; they count in `checked`.
    pub variables_replayed: u64,
    /// Failed allocations in the replay.
    pub ooms: u64,
    pub first_oom: Option<FirstOom>,
    /// For a log that records a failed request: whether the replay failed it too.
    pub logged_oom_reproduced: Option<bool>,
    /// BFC's `peak_bytes_in_use` over the replay.
    pub peak_bytes_in_use: u64,
    pub final_bytes_in_use: u64,
    pub meminfo: Vec<MemInfoCheck>,
    /// Regions TensorFlow logged, and the replay's, as (base, bytes) in creation order.
    pub regions_logged: Vec<(u64, u64)>,
    pub regions_replayed: Vec<(u64, u64)>,
    /// The allocator at the end of the replay (for heap maps).
    pub final_state: Bfc,
    /// The same figures `allocview compare` reports for every policy, measured on this replay.
    pub metrics: ReplayMetrics,
}

impl Fidelity {
    /// True when every checked allocation landed at TensorFlow's address.
    #[must_use]
    pub fn all_addresses_match(&self) -> bool {
        self.checked > 0 && self.address_matches == self.checked
    }

    /// True when the replay added exactly TensorFlow's regions.
    #[must_use]
    pub fn regions_match(&self) -> bool {
        self.regions_logged == self.regions_replayed
    }

    /// A few lines a person can read: where the replay started, how many allocations landed at
    /// TensorFlow's address, the first divergence and the first OOM.
    #[must_use]
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        match &self.checkpoint {
            Some(c) => out.push(format!(
                "checkpoint at event {}: {}; rebuilt {} live chunks ({} logged, {} variables, {} raw) \
                 holding {} bytes in {} regions",
                c.event,
                c.reason,
                c.live_logged + c.live_variables + c.live_raw,
                c.live_logged,
                c.live_variables,
                c.live_raw,
                c.bytes_in_use,
                c.regions
            )),
            None => out.push("replayed from process start".into()),
        }
        out.push(format!(
            "{} of {} allocations at TensorFlow's address, {} of {} with its chunk size{}",
            self.address_matches,
            self.checked,
            self.size_matches,
            self.sizes_checked,
            if self.held_back > 0 {
                format!(
                    " ({} needed another thread's free held back)",
                    self.held_back
                )
            } else {
                String::new()
            }
        ));
        if let Some(d) = &self.first_divergence {
            out.push(format!(
                "first divergence at event {} (line {}, TF id {}): TF put {} bytes at {:#x}, the \
                 replay at {}",
                d.event,
                d.line,
                d.tf_alloc_id,
                d.requested_bytes,
                d.expected_addr,
                d.got_addr
                    .map_or_else(|| "nothing (out of memory)".into(), |a| format!("{a:#x}"))
            ));
        }
        if let Some(o) = &self.first_oom {
            out.push(format!(
                "first OOM at event {}{}: {} bytes (rounded {}) with {} bytes free in {} chunks, \
                 largest {}",
                o.event,
                if o.logged { " (TF's own)" } else { "" },
                o.request_bytes,
                o.rounded_bytes,
                o.free_bytes,
                o.free_chunks,
                o.largest_free_chunk_bytes
            ));
            if let Some(c) = &o.dump_comparison {
                out.push(match &c.first_difference {
                    None if c.all_identical() => {
                        format!("chunk map identical to the dump's ({} chunks)", c.identical)
                    }
                    _ => format!(
                        "chunk map differs from the dump's: {} of {} chunks identical; {}",
                        c.identical,
                        c.dump_chunks,
                        c.first_difference.as_deref().unwrap_or("")
                    ),
                });
            }
        }
        out
    }
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum FidelityError {
    #[error("the log's state at the checkpoint is not a valid BFC state: {0}")]
    State(#[from] BfcStateError),
    #[error("the memory log has no allocation to replay")]
    Empty,
    #[error(
        "the log has no `Allocated memory at` lines, so the regions of the BFC state cannot be \
         rebuilt (log with TF_CPP_VMODULE=log_memory=2,bfc_allocator=1)"
    )]
    NoRegions,
    #[error("replay failed: {0}")]
    Replay(String),
}

/// Replays the log from the checkpoint (see the module docs).
///
/// # Errors
/// When the log has no allocation or the rebuilt state is inconsistent.
pub fn replay_checkpointed(
    log: &TfMemoryLog,
    opts: &FidelityOptions,
) -> Result<Fidelity, FidelityError> {
    let setup = Setup::new(log, opts)?;
    let plan = CheckpointPlan::find(log);
    let live = plan.live_chunks(log);
    if !live.is_empty() && setup.regions_at(plan.event).is_empty() {
        return Err(FidelityError::NoRegions);
    }
    // Each live raw allocation may hold its rounded size or the whole chunk it found.
    let raw: Vec<usize> = live
        .iter()
        .enumerate()
        .filter(|(_, c)| c.raw)
        .map(|(i, _)| i)
        .take(4)
        .collect();
    let mut best: Option<(Fidelity, Vec<(u64, u64)>)> = None;
    for mask in 0u32..(1 << raw.len()) {
        let mut chunks: Vec<LiveChunk> = live.iter().map(|c| c.chunk).collect();
        let regions = setup.regions_at(plan.event);
        let mut possible = true;
        for (bit, &i) in raw.iter().enumerate() {
            if mask & (1 << bit) == 0 {
                continue;
            }
            let Some(slot) = chunks.get(i).copied() else {
                continue;
            };
            // Not split: the chunk found was under twice the rounded size and its leftover
            // under the 128 MiB split threshold.
            let gap = gap_after(&chunks, &regions, slot);
            if gap > 0 && gap < slot.size_bytes && gap < DEFAULT_MAX_INTERNAL_FRAGMENTATION_BYTES {
                if let Some(c) = chunks.get_mut(i) {
                    c.size_bytes += gap;
                }
            } else {
                possible = false;
                break;
            }
        }
        if !possible {
            continue;
        }
        let raw_sizes: Vec<(u64, u64)> = raw
            .iter()
            .filter_map(|&i| chunks.get(i).map(|c| (c.addr, c.size_bytes)))
            .collect();
        let bfc = setup.rebuild(&plan, &chunks, &regions)?;
        let f = setup.run(log, bfc, plan.event, ReplayStart::Checkpoint)?;
        let better = best.as_ref().is_none_or(|(b, _)| {
            (f.address_matches, divergence_event(&f)) > (b.address_matches, divergence_event(b))
        });
        if better {
            best = Some((f, raw_sizes));
        }
    }
    let (mut f, raw_sizes) = best.ok_or(FidelityError::Empty)?;
    let regions = setup.regions_at(plan.event);
    f.checkpoint = Some(Checkpoint {
        event: plan.event,
        line: plan.line,
        reason: plan.reason.clone(),
        live_logged: live.iter().filter(|c| !c.raw && !c.variable).count() as u64,
        live_variables: live.iter().filter(|c| c.variable).count() as u64,
        live_raw: live.iter().filter(|c| c.raw).count() as u64,
        bytes_in_use: raw_sizes.iter().map(|&(_, b)| b).sum::<u64>()
            + live
                .iter()
                .filter(|c| !c.raw)
                .map(|c| c.chunk.size_bytes)
                .sum::<u64>(),
        regions: regions.len() as u64,
        region_bytes: regions.iter().map(|r| r.size_bytes).sum(),
        unlogged_ids: plan.unlogged_ids,
        unknown_live: plan.unknown_live,
        unknown_after: plan.unknown_after,
        raw_chunk_bytes: raw_sizes,
    });
    Ok(f)
}

/// Replays the log from an empty allocator, every logged region base queued in order: the
/// temporaries the log does not show are left out (so later addresses drift), the variables
/// are placed by their ids as in [`replay_checkpointed`].
///
/// # Errors
/// When the log has no allocation.
pub fn replay_from_start(
    log: &TfMemoryLog,
    opts: &FidelityOptions,
) -> Result<Fidelity, FidelityError> {
    let setup = Setup::new(log, opts)?;
    let mut bfc = Bfc::new(setup.bfc_options);
    bfc.queue_region_bases(log.regions.iter().map(|r| r.base));
    setup.run(log, bfc, 0, ReplayStart::FromStart)
}

fn divergence_event(f: &Fidelity) -> usize {
    f.first_divergence.map_or(usize::MAX, |d| d.event)
}

/// Free bytes right after `c` up to the next live chunk or its region's end.
fn gap_after(chunks: &[LiveChunk], regions: &[RegionInfo], c: LiveChunk) -> u64 {
    let end = c.addr + c.size_bytes;
    let region_end = regions
        .iter()
        .find(|r| r.base <= c.addr && c.addr < r.base + r.size_bytes)
        .map_or(end, |r| r.base + r.size_bytes);
    let next = chunks
        .iter()
        .filter(|o| o.addr >= end && o.addr < region_end)
        .map(|o| o.addr)
        .min()
        .unwrap_or(region_end);
    next.saturating_sub(end)
}

/// Limit, growth and regions, shared by both replays.
struct Setup {
    bfc_options: BfcOptions,
    stop_at_first_oom: bool,
    regions: Vec<(usize, RegionInfo)>,
}

impl Setup {
    fn new(log: &TfMemoryLog, opts: &FidelityOptions) -> Result<Self, FidelityError> {
        if !log.records.iter().any(|r| r.kind == EventKind::Alloc) {
            return Err(FidelityError::Empty);
        }
        let dump_limit = log
            .dumps
            .iter()
            .find_map(|d| d.stat("bytes_limit").map(|s| s.value.bytes));
        let allow_growth = opts.allow_growth.unwrap_or_else(|| {
            log.regions
                .first()
                .is_none_or(|r| r.size_bytes <= INITIAL_GROWTH_REGION_BYTES)
        });
        Ok(Self {
            bfc_options: BfcOptions {
                limit_bytes: opts
                    .limit_bytes
                    .or(dump_limit)
                    .unwrap_or(DEFAULT_LIMIT_BYTES),
                allow_growth,
                ..BfcOptions::default()
            },
            stop_at_first_oom: opts.stop_at_first_oom,
            regions: log
                .regions
                .iter()
                .map(|r| {
                    (
                        r.events_before,
                        RegionInfo {
                            base: r.base,
                            size_bytes: r.size_bytes,
                        },
                    )
                })
                .collect(),
        })
    }

    /// Regions that exist before event `event`.
    fn regions_at(&self, event: usize) -> Vec<RegionInfo> {
        self.regions
            .iter()
            .filter(|(before, _)| *before <= event)
            .map(|&(_, r)| r)
            .collect()
    }

    fn rebuild(
        &self,
        plan: &CheckpointPlan,
        chunks: &[LiveChunk],
        regions: &[RegionInfo],
    ) -> Result<Bfc, FidelityError> {
        // TF's region size target after these regions: double each time, or grow to fit.
        let mut curr = if self.bfc_options.allow_growth {
            rounded_bytes(
                self.bfc_options
                    .limit_bytes
                    .min(INITIAL_GROWTH_REGION_BYTES),
            )
        } else {
            rounded_bytes(self.bfc_options.limit_bytes)
        };
        for r in regions {
            if r.size_bytes > curr {
                while r.size_bytes > curr {
                    curr = curr.saturating_mul(2);
                }
            } else {
                curr = curr.saturating_mul(2);
            }
        }
        let bytes_in_use = chunks.iter().map(|c| c.size_bytes).sum();
        let stats = BfcStats {
            num_allocs: plan.next_tf_id.saturating_sub(1),
            bytes_in_use,
            peak_bytes_in_use: bytes_in_use,
            largest_alloc_size: chunks.iter().map(|c| c.size_bytes).max().unwrap_or(0),
            bytes_limit: self.bfc_options.limit_bytes,
        };
        let mut bfc = Bfc::from_state(self.bfc_options, regions, chunks, curr, stats)?;
        bfc.queue_region_bases(
            self.regions
                .iter()
                .filter(|(before, _)| *before > plan.event)
                .map(|(_, r)| r.base),
        );
        Ok(bfc)
    }

    fn run(
        &self,
        log: &TfMemoryLog,
        bfc: Bfc,
        start: usize,
        kind: ReplayStart,
    ) -> Result<Fidelity, FidelityError> {
        let mut r = Replayer::new(log, bfc, start);
        r.stop_at_first_oom = self.stop_at_first_oom;
        r.run(log, start)?;
        Ok(r.finish(log, kind))
    }
}

/// A chunk of the rebuilt state.
#[derive(Clone, Copy, Debug)]
struct StateChunk {
    chunk: LiveChunk,
    raw: bool,
    variable: bool,
}

/// Where to take the checkpoint.
struct CheckpointPlan {
    event: usize,
    line: u64,
    reason: String,
    next_tf_id: u64,
    unlogged_ids: u64,
    unknown_live: u64,
    unknown_after: u64,
}

impl CheckpointPlan {
    fn find(log: &TfMemoryLog) -> Self {
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
        let event = last_unknown.map_or(0, |i| i + 1);
        // The allocation counter at the checkpoint: the first id allocated after it, since
        // every smaller id (variables whose outputs come later included) was allocated before.
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
            .map(|r| r.tf_alloc_id)
            .min()
            .unwrap_or(max_id + 1)
            .max(seen_before + 1);
        let (mut unlogged, mut unknown_live, mut unknown_after) = (0u64, 0u64, 0u64);
        for id in 1..=max_id {
            if logged.contains_key(&id) {
                continue;
            }
            unlogged += 1;
            if revealed.contains_key(&id) {
                continue;
            }
            match unknown_freed.get(&id) {
                Some(_) if id >= next_tf_id => unknown_after += 1,
                Some(_) => {}
                None if id >= next_tf_id => unknown_after += 1,
                None => unknown_live += 1,
            }
        }
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
            unlogged_ids: unlogged,
            unknown_live,
            unknown_after,
        }
    }

    /// Live chunks at the checkpoint: logged allocations not yet freed, and revealed variables
    /// allocated before it and not yet freed.
    fn live_chunks(&self, log: &TfMemoryLog) -> Vec<StateChunk> {
        let mut live: HashMap<i64, StateChunk> = HashMap::new();
        for r in log.records.iter().take(self.event) {
            match r.kind {
                EventKind::Alloc => {
                    let raw = r.record == RecordKind::RawAllocation;
                    let size = r
                        .allocated_bytes
                        .filter(|&b| b > 0)
                        .unwrap_or_else(|| rounded_bytes(r.requested_bytes.max(1)));
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
            let size = o
                .allocated_bytes
                .filter(|&b| b > 0)
                .unwrap_or_else(|| rounded_bytes(o.requested_bytes.max(1)));
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

/// A variable seen only through a tensor output.
#[derive(Clone, Copy, Debug)]
struct Variable {
    ptr: u64,
    requested_bytes: u64,
    allocated_bytes: Option<u64>,
    thread: u16,
}

/// Variables (tensor outputs of ids never logged as allocated), by TF id.
fn revealed_variables(log: &TfMemoryLog) -> HashMap<i64, Variable> {
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

/// A free waiting to be applied.
#[derive(Clone, Copy, Debug)]
struct PendingFree {
    thread: u16,
    addr: u64,
}

struct Replayer {
    bfc: Bfc,
    stop_at_first_oom: bool,
    /// Address of each TF allocation id in the replay (live ones).
    addr_of: HashMap<i64, u64>,
    pending: Vec<PendingFree>,
    checked: u64,
    address_matches: u64,
    size_matches: u64,
    sizes_checked: u64,
    first_divergence: Option<Divergence>,
    held_back: u64,
    ooms: u64,
    first_oom: Option<FirstOom>,
    logged_oom_reproduced: Option<bool>,
    meminfo: Vec<MemInfoCheck>,
    next_meminfo: usize,
    /// TF's allocation counter where the replay starts.
    first_tf_id: i64,
    variables_replayed: u64,
    metrics: ReplayMetrics,
    frag_sum: f64,
    started: std::time::Instant,
}

impl Replayer {
    fn new(log: &TfMemoryLog, bfc: Bfc, start: usize) -> Self {
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
        let others = self.pending.iter().filter(|f| f.thread != thread).count();
        let hit = |res: &Result<allocview_sim::policy::bfc::BfcAllocation, AllocError>| match res {
            Ok(a) => !expect_failure && expected.is_none_or(|e| e == a.addr),
            Err(_) => expect_failure,
        };
        if others == 0 {
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

    fn run(&mut self, log: &TfMemoryLog, start: usize) -> Result<(), FidelityError> {
        // BFC's ids are its allocation order, but threads log an allocation after making it:
        // an allocation logged after one with a higher id really came first.
        let alloc_at: HashMap<i64, usize> = log
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
        let mut max_id = self.first_tf_id - 1;
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
                    for id in (max_id + 1)..r.tf_alloc_id {
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
                    let mut id = r.tf_alloc_id + 1;
                    while let Some(v) = variables.remove(&id) {
                        due.push((id, v));
                        max_id = max_id.max(id);
                        id += 1;
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
                            self.logged_oom_reproduced.get_or_insert(true);
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
        while let Some(&(id, v)) = due.first() {
            let saved = (self.bfc.clone(), self.pending.clone(), self.held_back);
            match self.allocate(v.thread, v.requested_bytes, NO_ALLOC_ID, Some(v.ptr), false)? {
                Ok((addr, _)) if addr == v.ptr => {
                    (self.bfc, self.pending, self.held_back) = saved;
                    due.remove(0);
                    self.replay_variable(log, event, id, v)?;
                }
                _ => {
                    (self.bfc, self.pending, self.held_back) = saved;
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

    fn finish(mut self, log: &TfMemoryLog, start: ReplayStart) -> Fidelity {
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
            variables_replayed: self.variables_replayed,
            ooms: self.ooms,
            first_oom: self.first_oom,
            logged_oom_reproduced: self.logged_oom_reproduced,
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

/// Compares a replayed chunk map with a dump's chunk lines (address, size, in use).
#[must_use]
pub fn compare_chunk_maps(dump: &BfcDump, chunks: &[ChunkInfo]) -> ChunkMapComparison {
    let mut d: Vec<(u64, u64, bool)> = dump
        .chunks
        .iter()
        .map(|c| (c.address, c.size_bytes, c.in_use))
        .collect();
    d.sort_unstable();
    let mut r: Vec<(u64, u64, bool)> = chunks
        .iter()
        .map(|c| (c.addr, c.size_bytes, c.in_use))
        .collect();
    r.sort_unstable();
    let identical = d.iter().zip(&r).filter(|(a, b)| a == b).count() as u64;
    let first_difference = d
        .iter()
        .map(Some)
        .chain(std::iter::repeat(None))
        .zip(r.iter().map(Some).chain(std::iter::repeat(None)))
        .take(d.len().max(r.len()))
        .find(|(a, b)| a != b)
        .map(|(a, b)| {
            let show = |c: Option<&(u64, u64, bool)>| match c {
                Some(&(addr, size, in_use)) => format!(
                    "{} chunk at {addr:#x} of {size} bytes",
                    if in_use { "in-use" } else { "free" }
                ),
                None => "nothing".to_owned(),
            };
            format!("the dump has {}, the replay {}", show(a), show(b))
        });
    ChunkMapComparison {
        dump_chunks: d.len() as u64,
        replay_chunks: r.len() as u64,
        identical,
        first_difference,
    }
}
