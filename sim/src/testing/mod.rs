//! Helpers for testing policies: a [`Shadow`] model independent of every policy, and a driver
//! that feeds a trace to a policy and checks it after every operation.
//!
//! This is a plain public module (not `cfg(test)`) so that the integration tests in `sim/tests`
//! and other crates can use it. It never panics: every check returns a `Result` whose error
//! says what broke and at which event.

pub mod shadow;

pub use shadow::{LiveRange, Promises, Shadow, check_block_list, promises_for};

use crate::heap::{AllocError, Block, Placement, Request};
use crate::policy::Policy;
use crate::policy::config::PolicyConfig;
use crate::policy::registry::build;
use crate::replay::Replay;
use crate::trace::{EventKind, OwnedTrace, TraceView};

/// One step of a generated workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size_bytes`.
    Alloc { size_bytes: u64 },
    /// Free the live allocation at position `victim % live` of the live list (skipped when
    /// nothing is live).
    Free { victim: usize },
}

/// Turns generated ops into a valid trace (one event per nanosecond).
#[must_use]
pub fn ops_to_trace(ops: &[Op]) -> OwnedTrace {
    let mut trace = OwnedTrace::new();
    let mut live: Vec<u32> = Vec::new();
    for (t_ns, op) in (0i64..).zip(ops) {
        match *op {
            Op::Alloc { size_bytes } => live.push(trace.alloc(t_ns, size_bytes)),
            Op::Free { victim } => {
                if !live.is_empty() {
                    let id = live.swap_remove(victim % live.len());
                    trace.free(t_ns, id);
                }
            }
        }
    }
    trace
}

/// Builds policy `name` for `trace`. Always `Some` on success (the `Option` lets a suite skip a
/// policy by name without changing its callers; none is skipped: every registered policy must
/// build, so a suite cannot pass by skipping).
///
/// # Errors
/// Any registry error, as text.
pub fn build_available(
    name: &str,
    config: &PolicyConfig,
    trace: &TraceView<'_>,
) -> Result<Option<Box<dyn Policy>>, String> {
    build(name, config, trace)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// How [`drive_checked`] feeds and checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriveOptions {
    /// Alignment of every request.
    pub align_bytes: u64,
    /// Run the full [`Shadow::check`] after every `check_every`-th event (1 = every event) and
    /// after the last one.
    pub check_every: usize,
    pub promises: Promises,
    /// Every this many events, go on with the policy's `clone_box` (a replay checkpoint's
    /// copy, compacted) instead of the policy itself, so the checks cover the copies too.
    pub swap_for_clone_every: Option<usize>,
    /// The policy's memory limit: the footprint never passes it, and (with the promise
    /// `oom_only_without_room`) an allocation may fail as out of memory only when the policy
    /// could neither grow by the request within the limit nor held a free block of its size.
    pub limit_bytes: Option<u64>,
}

impl DriveOptions {
    /// Checks after every event, with the promises of policy `name`.
    #[must_use]
    pub fn strict(name: &str, align_bytes: u64) -> Self {
        Self {
            align_bytes,
            check_every: 1,
            promises: promises_for(name),
            swap_for_clone_every: None,
            limit_bytes: None,
        }
    }
}

/// What a checked drive produced.
#[derive(Debug)]
pub struct Driven {
    /// Placement of each allocation id (`None` when it failed).
    pub placements: Vec<Option<Placement>>,
    /// Every failed allocation: `(event, error)`.
    pub failures: Vec<(usize, AllocError)>,
    /// The policy after the last event.
    pub policy: Box<dyn Policy>,
    /// The shadow after the last event.
    pub shadow: Shadow,
}

/// Feeds `trace` to `policy` and checks it against a [`Shadow`] as it goes: every placement is
/// aligned and overlaps nothing live, a failed allocation leaves the policy unchanged, every free
/// of a served allocation succeeds, and the full [`Shadow::check`] passes at each check step.
///
/// # Errors
/// The first broken rule, with its event index.
pub fn drive_checked(
    mut policy: Box<dyn Policy>,
    trace: &TraceView<'_>,
    opts: &DriveOptions,
) -> Result<Driven, String> {
    let mut shadow = Shadow::new();
    let mut placements: Vec<Option<Placement>> = vec![None; trace.num_allocs as usize];
    let mut failures = Vec::new();
    let every = opts.check_every.max(1);
    let last = trace.len().saturating_sub(1);
    for i in 0..trace.len() {
        let at = |e: String| format!("event {i}: {e}");
        let check_now = i % every == 0 || i == last;
        let id = trace.alloc_id.get(i).copied().unwrap_or_default();
        let size_bytes = trace.size_bytes.get(i).copied().unwrap_or_default();
        match trace.kind_at(i) {
            Some(EventKind::Alloc) => {
                let req = Request {
                    id,
                    size_bytes,
                    align_bytes: opts.align_bytes,
                };
                let before = policy.counters();
                let mut before_blocks: Vec<Block> = Vec::new();
                if check_now {
                    policy.blocks(&mut before_blocks);
                }
                match policy.alloc(req) {
                    Ok(p) => {
                        shadow.on_alloc(&req, &p).map_err(at)?;
                        if let Some(slot) = placements.get_mut(id as usize) {
                            *slot = Some(p);
                        }
                    }
                    Err(e) => {
                        if let (Some(limit), AllocError::OutOfMemory { .. }) =
                            (opts.limit_bytes, &e)
                            && opts.promises.oom_only_without_room
                            && before.footprint_bytes.saturating_add(size_bytes) <= limit
                            && before.largest_free_bytes >= size_bytes
                        {
                            return Err(at(format!(
                                "out of memory under the limit of {limit} B with room to grow by \
                                 the {size_bytes} B asked and a free block of {} B: {e}",
                                before.largest_free_bytes
                            )));
                        }
                        if policy.counters() != before {
                            return Err(at(format!("failed allocation changed counters: {e}")));
                        }
                        if check_now {
                            let mut after = Vec::new();
                            policy.blocks(&mut after);
                            if after != before_blocks {
                                return Err(at(format!("failed allocation changed blocks: {e}")));
                            }
                        }
                        failures.push((i, e));
                    }
                }
            }
            Some(EventKind::Free) => {
                if let Some(p) = placements.get(id as usize).copied().flatten() {
                    policy
                        .free(p.addr)
                        .map_err(|e| at(format!("free of allocation {id}: {e}")))?;
                    let r = shadow.on_free(p.addr).map_err(at)?;
                    if r.id != id {
                        return Err(at(format!(
                            "freed {:#x} held allocation {}, not {id}",
                            p.addr, r.id
                        )));
                    }
                }
            }
            _ => {}
        }
        if opts
            .swap_for_clone_every
            .is_some_and(|n| n > 0 && (i + 1) % n == 0)
        {
            policy = policy.clone_box();
            policy
                .check_invariants()
                .map_err(|e| at(format!("clone: {e}")))?;
        }
        if let Some(limit) = opts.limit_bytes {
            let footprint = policy.counters().footprint_bytes;
            if footprint > limit {
                return Err(at(format!(
                    "footprint {footprint} B is past the limit of {limit} B"
                )));
            }
        }
        if check_now {
            shadow.check(policy.as_ref(), opts.promises).map_err(at)?;
        }
    }
    Ok(Driven {
        placements,
        failures,
        policy,
        shadow,
    })
}

/// Checks that the layout index of `replay` (of `trace`) gives, just after `event`, the block
/// list and counters of the policy itself (from a checkpoint replay), on one thread and split
/// over two however small the heap.
///
/// # Errors
/// What differs, or that the replay has no index or could not seek.
pub fn check_layout_at(replay: &Replay, trace: &TraceView<'_>, event: usize) -> Result<(), String> {
    let (policy, counters) = replay
        .state_at(trace, event)
        .map_err(|e| format!("seek to event {event}: {e}"))?;
    let mut blocks = Vec::new();
    policy.blocks(&mut blocks);
    let index = replay
        .layout_index()
        .ok_or("the replay keeps no layout index")?;
    let mut indexed = Vec::new();
    let indexed_counters = replay
        .blocks_at(event, &mut indexed)
        .ok_or_else(|| format!("no block list from the index after event {event}"))?;
    let mut split = Vec::new();
    let split_counters = index
        .blocks_at_split_above(event, &mut split, 0)
        .ok_or_else(|| format!("no two-thread block list after event {event}"))?;
    if indexed != blocks {
        let at = indexed.iter().zip(&blocks).position(|(a, b)| a != b);
        return Err(format!(
            "after event {event}: the index gives {} blocks, the policy {}; first difference \
             at block {at:?}",
            indexed.len(),
            blocks.len()
        ));
    }
    if indexed_counters != counters {
        return Err(format!(
            "after event {event}: counters {indexed_counters:?} from the index, {counters:?} \
             from the policy"
        ));
    }
    if split != indexed || split_counters != indexed_counters {
        return Err(format!(
            "after event {event}: the two-thread lookup differs"
        ));
    }
    check_fold_and_offsets(index, event, &blocks, &counters)
}

/// A sink that remembers the held offset it was made for.
struct OffsetSink {
    from: u64,
    blocks: Vec<Block>,
}

impl crate::layout::BlockSink for OffsetSink {
    fn block(&mut self, b: Block) {
        self.blocks.push(b);
    }
}

/// The folded halves concatenate to the policy's list, the second starting at the held offset
/// it was told; the block at a few held offsets is the one a walk of the list finds.
fn check_fold_and_offsets(
    index: &crate::layout::LayoutIndex,
    event: usize,
    blocks: &[Block],
    counters: &crate::heap::Counters,
) -> Result<(), String> {
    let mut first = Vec::new();
    let (second, folded) = index
        .fold_blocks_at_split_above(
            event,
            &mut first,
            |from| OffsetSink {
                from,
                blocks: Vec::new(),
            },
            0,
        )
        .ok_or_else(|| format!("no folded blocks after event {event}"))?;
    let first_len: u64 = first.iter().map(|b| b.len_bytes).sum();
    if let Some(second) = second {
        if second.from != first_len {
            return Err(format!(
                "after event {event}: second half told offset {}, first half holds {first_len}",
                second.from
            ));
        }
        first.extend(second.blocks);
    }
    if first != blocks || folded != *counters {
        return Err(format!("after event {event}: the folded blocks differ"));
    }
    // A sink that drops the blocks: the counters alone.
    let summed = index
        .fold_blocks_at_split_above(event, &mut (), |_| (), 0)
        .map(|(_, c)| c);
    if summed != Some(*counters) {
        return Err(format!(
            "after event {event}: counters {summed:?} without blocks, {counters:?} from the policy"
        ));
    }
    let held: u64 = blocks.iter().map(|b| b.len_bytes).sum();
    for offset in [0, held / 3, held / 2 + 1, held.saturating_sub(1), held] {
        let mut pos = 0u64;
        let want = blocks.iter().copied().find(|b| {
            pos += b.len_bytes;
            offset < pos
        });
        let got = index.block_at_offset(event, offset);
        if got != want {
            return Err(format!(
                "after event {event}: block at held offset {offset} is {got:?}, want {want:?}"
            ));
        }
    }
    Ok(())
}

/// Live bytes (requested sizes of live allocations) just after each event of `trace`, from the
/// events alone: the reference a replay or a cut of the trace is compared with.
#[must_use]
pub fn live_bytes_after_each(trace: &TraceView<'_>) -> Vec<u64> {
    let mut live = 0u64;
    trace
        .kind
        .iter()
        .zip(trace.size_bytes)
        .map(|(&k, &size)| {
            if k == EventKind::Alloc as u8 {
                live = live.saturating_add(size);
            } else if k == EventKind::Free as u8 {
                live = live.saturating_sub(size);
            }
            live
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_to_trace_frees_by_index_modulo_live() {
        let ops = [
            Op::Free { victim: 3 },
            Op::Alloc { size_bytes: 10 },
            Op::Alloc { size_bytes: 20 },
            Op::Free { victim: 5 },
            Op::Alloc { size_bytes: 30 },
        ];
        let t = ops_to_trace(&ops);
        let view = t.view().unwrap();
        // The leading free is dropped; victim 5 % 2 = 1 frees the second allocation.
        assert_eq!(view.len(), 4);
        assert_eq!(view.kind_at(2), Some(EventKind::Free));
        assert_eq!(view.alloc_id[2], 1);
        assert_eq!(view.size_bytes[2], 20);
    }

    #[test]
    fn driver_catches_a_policy_that_lies_about_live_bytes() {
        #[derive(Clone, Debug)]
        struct Liar(Box<dyn Policy>);
        impl Policy for Liar {
            fn name(&self) -> &'static str {
                "liar"
            }
            fn alloc(&mut self, req: Request) -> Result<Placement, AllocError> {
                self.0.alloc(req)
            }
            fn free(&mut self, addr: u64) -> Result<(), crate::heap::FreeError> {
                self.0.free(addr)
            }
            fn counters(&self) -> crate::heap::Counters {
                let mut c = self.0.counters();
                c.live_bytes += 1;
                c
            }
            fn blocks(&self, out: &mut Vec<Block>) {
                self.0.blocks(out);
            }
            fn clone_box(&self) -> Box<dyn Policy> {
                Box::new(self.clone())
            }
            fn check_invariants(&self) -> Result<(), String> {
                Ok(())
            }
            fn as_any(&self) -> &dyn std::any::Any {
                self
            }
        }
        let t = ops_to_trace(&[Op::Alloc { size_bytes: 8 }]);
        let view = t.view().unwrap();
        let inner = build("first-fit", &PolicyConfig::default(), &view).unwrap();
        let err = drive_checked(
            Box::new(Liar(inner)),
            &view,
            &DriveOptions::strict("first-fit", 16),
        )
        .unwrap_err();
        assert!(err.contains("event 0"), "{err}");
    }
}
