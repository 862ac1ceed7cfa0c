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

use allocview_sim::heap::Counters;
use allocview_sim::policy::bfc::{
    Bfc, BfcOptions, BfcStateError, BfcStats, ChunkInfo, DEFAULT_LIMIT_BYTES,
    DEFAULT_MAX_INTERNAL_FRAGMENTATION_BYTES, INITIAL_GROWTH_REGION_BYTES, LiveChunk, RegionInfo,
    rounded_bytes,
};
use allocview_sim::trace::EventKind;

use crate::tf::dump::BfcDump;
use crate::tf::memlog::TfMemoryLog;

mod checkpoint;
mod replayer;

use checkpoint::CheckpointPlan;
use replayer::Replayer;

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
    /// Replay without consulting TensorFlow's logged addresses for any decision: every
    /// pending free applied before the next allocation, each variable placed right after the
    /// allocation before it in id order, and every raw chunk at its rounded size. The log's
    /// addresses are then only what the replay is measured against.
    pub no_guidance: bool,
}

/// The decisions of a replay that consulted TensorFlow's logged addresses: where the log
/// leaves a choice open (races between threads, variables it shows only through their
/// outputs, raw chunk sizes), the replay picks what puts the allocation at the logged address.
/// All zero with [`FidelityOptions::no_guidance`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuidedDecisions {
    /// Allocations that missed their logged address with other threads' frees pending, and so
    /// were tried again with some of those frees held back.
    pub placements_retried: u64,
    /// Of those, the ones that then matched and were kept (`held_back` of [`Fidelity`]).
    pub held_back_frees: u64,
    /// Variables placed at the first point where BFC puts them at their logged address.
    pub variables_placed_by_address: u64,
    /// Raw chunks live at the checkpoint whose size (rounded, or the whole chunk found) was
    /// chosen by which replay matches more addresses.
    pub raw_chunk_sizes_chosen: u64,
}

impl GuidedDecisions {
    /// Decisions that consulted the log, of every kind.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.placements_retried + self.variables_placed_by_address + self.raw_chunk_sizes_chosen
    }
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
    /// Whether the replay consulted the logged addresses (not [`FidelityOptions::no_guidance`]).
    pub guided: bool,
    /// What it consulted them for.
    pub guided_decisions: GuidedDecisions,
    /// Variables (known only from tensor outputs) allocated during the replay, at their place
    /// in id order; they count in `checked`.
    pub variables_replayed: u64,
    /// Failed allocations in the replay.
    pub ooms: u64,
    pub first_oom: Option<FirstOom>,
    /// For a log that records a failed request: whether the replay failed it too.
    pub logged_oom_reproduced: Option<bool>,
    /// When the replay failed that request: how many of other threads' frees it held back to
    /// fail it (0 when it failed with every logged free applied). Holding frees back is
    /// guidance: without it the request may fit.
    pub logged_oom_held_back_frees: Option<u64>,
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

    /// True when the replay reproduced TensorFlow's failed request only with the help of the
    /// logged addresses: frees held back at the request, or other guided decisions before it.
    #[must_use]
    pub fn logged_oom_reproduced_with_guidance(&self) -> bool {
        self.logged_oom_reproduced == Some(true)
            && self.guided
            && (self.logged_oom_held_back_frees.unwrap_or(0) > 0
                || self.guided_decisions.total() > 0)
    }

    /// Whether TensorFlow's own OOM was reproduced, and how: a reproduction that needed frees
    /// held back (or other guidance) says so, as it is not BFC's result alone.
    fn describe_logged_oom(&self) -> Option<String> {
        let reproduced = self.logged_oom_reproduced?;
        if !reproduced {
            return Some(
                "TensorFlow's OOM not reproduced: the replay served the request TensorFlow failed"
                    .to_owned(),
            );
        }
        let held = self.logged_oom_held_back_frees.unwrap_or(0);
        Some(if held > 0 {
            format!(
                "TensorFlow's OOM reproduced only with guidance: {held} other thread's free{} \
                 held back at the failed request (--no-guidance applies every free)",
                if held == 1 { "" } else { "s" }
            )
        } else if self.logged_oom_reproduced_with_guidance() {
            format!(
                "TensorFlow's OOM reproduced with guidance (no free held back at the failed \
                 request; {} guided decisions in the replay)",
                self.guided_decisions.total()
            )
        } else {
            "TensorFlow's OOM reproduced without guidance".to_owned()
        })
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
        let g = &self.guided_decisions;
        out.push(if self.guided {
            format!(
                "guided by TensorFlow's addresses: {} decisions ({} allocations retried with \
                 other threads' frees held back, {} kept; {} variables placed where BFC puts \
                 them at their logged address; {} raw chunk sizes chosen by matches); \
                 --no-guidance replays without",
                g.total(),
                g.placements_retried,
                g.held_back_frees,
                g.variables_placed_by_address,
                g.raw_chunk_sizes_chosen
            )
        } else {
            "no guidance: no decision consulted TensorFlow's addresses".to_owned()
        });
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
        out.extend(self.describe_logged_oom());
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
    // Without guidance every raw chunk keeps its rounded size (mask 0): no comparison.
    let masks = if opts.no_guidance {
        1
    } else {
        1u32 << raw.len()
    };
    for mask in 0u32..masks {
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
                    c.size_bytes = c.size_bytes.saturating_add(gap);
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
    if !opts.no_guidance {
        f.guided_decisions.raw_chunk_sizes_chosen = raw.len() as u64;
    }
    let regions = setup.regions_at(plan.event);
    f.checkpoint = Some(Checkpoint {
        event: plan.event,
        line: plan.line,
        reason: plan.reason.clone(),
        live_logged: live.iter().filter(|c| !c.raw && !c.variable).count() as u64,
        live_variables: live.iter().filter(|c| c.variable).count() as u64,
        live_raw: live.iter().filter(|c| c.raw).count() as u64,
        bytes_in_use: saturating_sum(raw_sizes.iter().map(|&(_, b)| b)).saturating_add(
            saturating_sum(live.iter().filter(|c| !c.raw).map(|c| c.chunk.size_bytes)),
        ),
        regions: regions.len() as u64,
        region_bytes: saturating_sum(regions.iter().map(|r| r.size_bytes)),
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
    // The log's pointers and sizes may run past the address space: ends saturate, and
    // `Bfc::from_state` refuses a chunk that does not fit its region, naming it.
    let end = c.addr.saturating_add(c.size_bytes);
    let region_end = regions
        .iter()
        .map(|r| (r.base, r.base.saturating_add(r.size_bytes)))
        .find(|&(base, end)| base <= c.addr && c.addr < end)
        .map_or(end, |(_, end)| end);
    let next = chunks
        .iter()
        .filter(|o| o.addr >= end && o.addr < region_end)
        .map(|o| o.addr)
        .min()
        .unwrap_or(region_end);
    next.saturating_sub(end)
}

/// The sum of sizes read from the log, saturated at 2^64 - 1 (`Bfc::from_state` refuses a
/// state whose chunks overlap or leave their regions, which such sizes do).
fn saturating_sum(sizes: impl Iterator<Item = u64>) -> u64 {
    sizes.fold(0, u64::saturating_add)
}

/// Limit, growth and regions, shared by both replays.
struct Setup {
    bfc_options: BfcOptions,
    stop_at_first_oom: bool,
    no_guidance: bool,
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
            no_guidance: opts.no_guidance,
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
        let bytes_in_use = saturating_sum(chunks.iter().map(|c| c.size_bytes));
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
        r.no_guidance = self.no_guidance;
        r.run(log, start)?;
        Ok(r.finish(log, kind))
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
    // The chunks both maps hold, whatever their position: zipping the sorted lists would
    // count one extra chunk early as a difference at every later position.
    let identical = sorted_intersection_len(&d, &r);
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

/// How many items two sorted lists have in common, as multisets.
fn sorted_intersection_len<T: Ord>(a: &[T], b: &[T]) -> u64 {
    let (mut i, mut j, mut n) = (0, 0, 0u64);
    while let (Some(x), Some(y)) = (a.get(i), b.get(j)) {
        match x.cmp(y) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
}
