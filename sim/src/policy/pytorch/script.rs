//! Script mode: replaying a snapshot from its rebuilt start state and scoring the algorithm
//! against what the trace recorded (reference section 6).
//!
//! What a snapshot cannot tell (cudaMalloc addresses, VA reservations) comes from the trace's
//! segment events; everything else is the algorithm's own decision, compared with the trace at
//! each traced allocation. On a difference the recorded state wins, so one divergence does not
//! spoil every later comparison.

use std::sync::Arc;

use super::expandable::{is_whole_pages, page_bytes};
use super::heap::{Occupant, SegmentRec};
use super::malloc::Params;
use super::rounding::should_split;
use super::{
    DEVICE_BASE_ADDR, Divergence, Fidelity, Pytorch, PytorchScript, SEGMENT_ALIGN_BYTES,
    ScriptSegment, SegmentOp, SegmentOpKind,
};
use crate::heap::{Addr, AllocError, Placement, Request};

/// The replay's position in its script and what it has found so far.
#[derive(Clone, Debug)]
pub(super) struct ScriptState {
    script: Arc<PytorchScript>,
    /// Indices into `script.segment_ops`, stably sorted by tag.
    order: Arc<[usize]>,
    /// How many entries of `order` have been consumed.
    cursor: usize,
    /// Recorded addresses of the carried-in allocations, sorted.
    carried_addrs: Arc<[Addr]>,
    /// The trace's cudaMallocs and maps for the current request.
    trace_new: Vec<SegmentOp>,
    /// Those of them the policy has not taken.
    offered: Vec<SegmentOp>,
    /// What the policy itself did towards new memory for the current request (a cudaMalloc
    /// with the size it wanted, maps).
    made: Vec<SegmentOp>,
    /// Segments the policy cudaMalloc'd at an address of its own (the trace had none).
    own_segments: Vec<Addr>,
    fidelity: Fidelity,
}

impl ScriptState {
    pub(super) fn fidelity(&self) -> &Fidelity {
        &self.fidelity
    }
}

/// How far a block carved at a given address reaches.
#[derive(Clone, Copy, Debug)]
enum Extent {
    /// The split rule decides over the free space up to `bound` (or the free block's end).
    Split { bound: Option<Addr> },
    /// Exactly this many bytes.
    Exact(u64),
}

impl Pytorch {
    /// Builds the start state and the script cursor.
    pub(super) fn start_script(&mut self, script: Arc<PytorchScript>) -> Result<(), String> {
        self.build_start_segments(&script.start_segments)?;
        let high = script
            .segment_ops
            .iter()
            .map(|(_, op)| op.addr.saturating_add(op.size_bytes))
            .fold(self.heap.highest_end(), u64::max);
        // Segments the trace cannot place go above every address it mentions.
        self.device_base_addr = high
            .checked_next_multiple_of(SEGMENT_ALIGN_BYTES)
            .unwrap_or(high)
            .max(DEVICE_BASE_ADDR);
        let mut order: Vec<usize> = (0..script.segment_ops.len()).collect();
        order.sort_by_key(|&i| script.segment_ops.get(i).map_or(u32::MAX, |(tag, _)| *tag));
        let carried = script.carried_in as usize;
        let mut carried_addrs: Vec<Addr> =
            script.recorded_addr.iter().take(carried).copied().collect();
        carried_addrs.sort_unstable();
        self.script = Some(ScriptState {
            script,
            order: order.into(),
            cursor: 0,
            carried_addrs: carried_addrs.into(),
            trace_new: Vec::new(),
            offered: Vec::new(),
            made: Vec::new(),
            own_segments: Vec::new(),
            fidelity: Fidelity::default(),
        });
        Ok(())
    }

    /// The start segments, all free. Expandable ones sharing a stream and pool with no other
    /// segment between them form one reservation starting at the first; the reservation runs
    /// on to full size or up to the next segment.
    fn build_start_segments(&mut self, segments: &[ScriptSegment]) -> Result<(), String> {
        let mut sorted: Vec<&ScriptSegment> = segments.iter().collect();
        sorted.sort_by_key(|s| s.addr);
        for s in sorted.iter().filter(|s| !s.expandable) {
            let seg = SegmentRec {
                size_bytes: s.size_bytes,
                stream: s.stream,
                small_pool: s.small_pool,
                expandable: false,
            };
            if !self.heap.create_segment(s.addr, seg, Occupant::Free) {
                return Err(format!(
                    "start segment at {:#x} of {} B is empty or overlaps another",
                    s.addr, s.size_bytes
                ));
            }
        }
        let mut i = 0;
        while let Some(s) = sorted.get(i) {
            let mut j = i + 1;
            if s.expandable {
                while let Some(t) = sorted.get(j)
                    && t.expandable
                    && (t.stream, t.small_pool) == (s.stream, s.small_pool)
                {
                    j += 1;
                }
                let run = sorted.get(i..j).unwrap_or_default();
                self.add_start_reservation(run, sorted.get(j).map(|t| t.addr))?;
            }
            i = j;
        }
        Ok(())
    }

    fn add_start_reservation(
        &mut self,
        run: &[&ScriptSegment],
        next_start: Option<Addr>,
    ) -> Result<(), String> {
        let (Some(first), Some(last)) = (run.first(), run.last()) else {
            return Ok(());
        };
        let page = page_bytes(first.small_pool);
        let base = first.addr;
        if let Some(s) = run
            .iter()
            .find(|s| !(s.addr - base).is_multiple_of(page) || !s.size_bytes.is_multiple_of(page))
        {
            return Err(format!(
                "expandable start segment at {:#x} of {} B is not whole {page} B pages from \
                 {base:#x}",
                s.addr, s.size_bytes
            ));
        }
        let last_end = last.addr.saturating_add(last.size_bytes);
        let mut size_bytes = self.reservation_bytes(first.small_pool);
        if let Some(next) = next_start {
            size_bytes = size_bytes.min((next.saturating_sub(base)) / page * page);
        }
        let seg = SegmentRec {
            size_bytes: size_bytes.max(last_end - base),
            stream: first.stream,
            small_pool: first.small_pool,
            expandable: true,
        };
        if !self.heap.create_segment(base, seg, Occupant::Unmapped) {
            return Err(format!(
                "expandable start segment at {base:#x} overlaps another"
            ));
        }
        for s in run {
            self.map_exact(s.addr, s.size_bytes);
        }
        Ok(())
    }

    /// Maps `[addr, addr + size_bytes)` inside one unmapped range (whole pages), without an
    /// event; false when it is not such a range.
    fn map_exact(&mut self, addr: Addr, size_bytes: u64) -> bool {
        let Some((a, rec)) = self.heap.containing(addr) else {
            return false;
        };
        let end = addr.saturating_add(size_bytes);
        if rec.occupant != Occupant::Unmapped
            || !is_whole_pages(&rec, addr, size_bytes)
            || size_bytes == 0
            || end > a + rec.size_bytes
        {
            return false;
        }
        self.heap.take(a);
        if addr > a {
            self.heap.add(a, rec.with(addr - a, Occupant::Unmapped));
        }
        if end < a + rec.size_bytes {
            self.heap
                .add(end, rec.with(a + rec.size_bytes - end, Occupant::Unmapped));
        }
        self.heap.add(addr, rec.with(size_bytes, Occupant::Free));
        self.heap.coalesce(addr);
        true
    }

    /// One allocation of a script-mode replay.
    pub(super) fn script_alloc(&mut self, req: Request) -> Result<Placement, AllocError> {
        let Some(st) = &self.script else {
            return Err(self.out_of_memory(req.size_bytes));
        };
        let s = &st.script;
        let index = req.id as usize;
        let carried = req.id < s.carried_in;
        let recorded = s.recorded_addr.get(index).copied();
        let stream = s.stream.get(index).copied().unwrap_or(0);
        let p = self
            .params(req.id, req.size_bytes, stream)
            .ok_or_else(|| self.out_of_memory(req.size_bytes))?;
        let placement = if carried {
            self.carry_in(&p, recorded)
        } else {
            self.traced_alloc(&p, recorded)
        };
        placement.ok_or_else(|| self.out_of_memory(req.size_bytes))
    }

    /// A carried-in allocation goes exactly where the rebuild found it, keeping the slack up
    /// to the next carried-in block that the split rule would not have cut off.
    fn carry_in(&mut self, p: &Params, recorded: Option<Addr>) -> Option<Placement> {
        if let Some(addr) = recorded {
            let bound = self.script.as_ref().and_then(|st| {
                let i = st.carried_addrs.partition_point(|&a| a <= addr);
                st.carried_addrs.get(i).copied()
            });
            if let Some(pl) = self.carve(p, addr, Extent::Split { bound }) {
                return Some(pl);
            }
        }
        let placement = self.malloc(p);
        self.diverge(
            p,
            recorded.unwrap_or(0),
            placement.map(|pl| pl.addr),
            "a carried-in allocation does not fit the start segments' free space at its \
             recorded address; placed by the algorithm instead"
                .to_owned(),
        );
        placement
    }

    /// A traced allocation: the trace's releases, the algorithm's choice, the comparisons.
    fn traced_alloc(&mut self, p: &Params, recorded: Option<Addr>) -> Option<Placement> {
        let mut notes = Vec::new();
        self.take_ops_up_to(p.id, &mut notes);
        let events_before = self.heap.events().len();
        let placement = self.malloc(p);
        self.settle_offered(p, &mut notes);
        self.compare_segments(&mut notes);
        let result = match recorded {
            Some(addr) => self.compare_address(p, placement, addr, &mut notes),
            None => placement,
        };
        self.drop_unused_own_segments(events_before);
        if !notes.is_empty() {
            let policy_addr = placement.map(|pl| pl.addr);
            self.diverge(p, recorded.unwrap_or(0), policy_addr, notes.join("; "));
        }
        result
    }

    /// Consumes the segment ops tagged up to `id`: releases are applied now, cudaMallocs and
    /// maps are offered to the algorithm.
    fn take_ops_up_to(&mut self, id: u32, notes: &mut Vec<String>) {
        let mut releases = Vec::new();
        let Some(st) = self.script.as_mut() else {
            return;
        };
        st.trace_new.clear();
        st.offered.clear();
        st.made.clear();
        st.own_segments.clear();
        while let Some(&i) = st.order.get(st.cursor) {
            let Some(&(tag, op)) = st.script.segment_ops.get(i) else {
                break;
            };
            if tag > id {
                break;
            }
            st.cursor += 1;
            match op.kind {
                SegmentOpKind::Alloc | SegmentOpKind::Map => {
                    st.trace_new.push(op);
                    st.offered.push(op);
                }
                SegmentOpKind::Free | SegmentOpKind::Unmap => releases.push(op),
            }
        }
        for op in releases {
            self.apply_release(op, id, notes);
        }
    }

    /// A recorded `segment_free` or `segment_unmap`.
    fn apply_release(&mut self, op: SegmentOp, id: u32, notes: &mut Vec<String>) {
        match op.kind {
            SegmentOpKind::Free => match self.heap.block(op.addr) {
                Some(rec) if self.release_block(op.addr, id) => {
                    if rec.size_bytes != op.size_bytes {
                        notes.push(format!(
                            "segment_free of {:#x}: {} B in the trace, {} B here",
                            op.addr, op.size_bytes, rec.size_bytes
                        ));
                    }
                }
                _ => notes.push(format!(
                    "segment_free of {:#x}: not a wholly free segment here",
                    op.addr
                )),
            },
            SegmentOpKind::Unmap => {
                if !self.apply_unmap(op, id) {
                    notes.push(format!(
                        "segment_unmap of {} B at {:#x}: not free mapped pages here",
                        op.size_bytes, op.addr
                    ));
                }
            }
            SegmentOpKind::Alloc | SegmentOpKind::Map => {}
        }
    }

    /// A recorded `segment_unmap`: the range must be whole free pages of one block; a
    /// reservation left with nothing mapped is dropped.
    fn apply_unmap(&mut self, op: SegmentOp, id: u32) -> bool {
        let Some((a, rec)) = self.heap.containing(op.addr) else {
            return false;
        };
        let end = op.addr.saturating_add(op.size_bytes);
        if !rec.expandable
            || rec.occupant != Occupant::Free
            || op.size_bytes == 0
            || end > a + rec.size_bytes
            || !is_whole_pages(&rec, op.addr, op.size_bytes)
        {
            return false;
        }
        let unmapped = self.unmap_range(a, rec, op.addr, end, id);
        if let Some(r) = self.heap.block(unmapped)
            && self.heap.is_whole_segment(unmapped, &r)
        {
            self.heap.remove_segment(unmapped);
        }
        true
    }

    /// Where a cudaMalloc of the current request goes: the trace's own `segment_alloc` when it
    /// can hold the request, else an address of the policy's choosing.
    pub(super) fn script_segment_place(&mut self, p: &Params) -> Option<(Addr, u64)> {
        let heap = &self.heap;
        let st = self.script.as_mut()?;
        let usable = |op: &SegmentOp| {
            op.kind == SegmentOpKind::Alloc
                && op.size_bytes >= p.size_bytes
                && heap.range_is_unused(op.addr, op.size_bytes)
        };
        if let Some(pos) = st.offered.iter().position(usable) {
            let op = st.offered.remove(pos);
            st.made.push(SegmentOp {
                size_bytes: p.alloc_size_bytes,
                ..op
            });
            return Some((op.addr, op.size_bytes));
        }
        let addr = heap.lowest_fit(
            self.device_base_addr,
            p.alloc_size_bytes,
            SEGMENT_ALIGN_BYTES,
        )?;
        st.made.push(SegmentOp {
            kind: SegmentOpKind::Alloc,
            addr,
            size_bytes: p.alloc_size_bytes,
        });
        st.own_segments.push(addr);
        Some((addr, p.alloc_size_bytes))
    }

    /// Where a new VA reservation goes in script mode: at the first of the trace's maps for
    /// the current request that lies outside every segment (a fresh reservation is mapped from
    /// its start). `None` in generic mode or when there is none.
    pub(super) fn script_reservation_base(&self, _p: &Params) -> Option<Addr> {
        let st = self.script.as_ref()?;
        st.offered
            .iter()
            .find(|op| {
                op.kind == SegmentOpKind::Map && self.heap.range_is_unused(op.addr, op.size_bytes)
            })
            .map(|op| op.addr)
    }

    /// Records a map the algorithm did, for the comparison with the trace's.
    pub(super) fn note_policy_op(&mut self, kind: SegmentOpKind, addr: Addr, size_bytes: u64) {
        if let Some(st) = self.script.as_mut() {
            st.made.push(SegmentOp {
                kind,
                addr,
                size_bytes,
            });
        }
    }

    /// The trace's cudaMallocs and maps the algorithm did not do happened all the same: their
    /// segments and pages are added, free.
    fn settle_offered(&mut self, p: &Params, notes: &mut Vec<String>) {
        let Some(st) = self.script.as_mut() else {
            return;
        };
        let mut leftover = std::mem::take(&mut st.offered);
        for made in &st.made {
            if let Some(pos) = leftover.iter().position(|op| op == made) {
                leftover.remove(pos);
            }
        }
        for op in leftover {
            let done = match op.kind {
                SegmentOpKind::Alloc => {
                    let seg = SegmentRec {
                        size_bytes: op.size_bytes,
                        stream: p.stream,
                        small_pool: p.small_pool,
                        expandable: false,
                    };
                    self.heap.create_segment(op.addr, seg, Occupant::Free)
                }
                SegmentOpKind::Map => self.map_exact(op.addr, op.size_bytes),
                SegmentOpKind::Free | SegmentOpKind::Unmap => true,
            };
            if done {
                self.heap.log(p.id, op.kind, op.addr, op.size_bytes);
            } else {
                notes.push(format!(
                    "the trace's {:?} of {} B at {:#x} does not fit the state here",
                    op.kind, op.size_bytes, op.addr
                ));
            }
        }
    }

    /// Did the algorithm make new memory exactly when, where and as much as the trace did?
    fn compare_segments(&mut self, notes: &mut Vec<String>) {
        let Some(st) = self.script.as_mut() else {
            return;
        };
        if st.trace_new.is_empty() && st.made.is_empty() {
            return;
        }
        st.fidelity.segment_allocs_checked += 1;
        if st.trace_new == st.made {
            st.fidelity.segment_alloc_matches += 1;
        } else {
            notes.push(format!(
                "new memory: the trace made {}, the policy {}",
                describe_ops(&st.trace_new),
                describe_ops(&st.made)
            ));
        }
    }

    /// Compares the algorithm's placement with the recorded one; on a difference the block
    /// moves to the recorded address when that is free.
    fn compare_address(
        &mut self,
        p: &Params,
        placement: Option<Placement>,
        recorded: Addr,
        notes: &mut Vec<String>,
    ) -> Option<Placement> {
        if let Some(st) = self.script.as_mut() {
            st.fidelity.checked += 1;
        }
        match placement {
            Some(pl) if pl.addr == recorded => {
                if let Some(st) = self.script.as_mut() {
                    st.fidelity.address_matches += 1;
                }
                Some(pl)
            }
            Some(pl) => {
                let moved = self.relocate(p, pl, recorded);
                let how = if moved.addr == recorded {
                    "went on from the recorded placement"
                } else {
                    "the recorded address is not free here, so went on from the policy's"
                };
                notes.push(format!(
                    "the policy chose {:#x}, the trace {recorded:#x}; {how}",
                    pl.addr
                ));
                Some(moved)
            }
            None => {
                let carved = self.carve(p, recorded, Extent::Split { bound: None });
                let how = if carved.is_some() {
                    "went on from the recorded placement"
                } else {
                    "and that address is not free here"
                };
                notes.push(format!(
                    "the policy could not place it, the trace has {recorded:#x}; {how}"
                ));
                carved
            }
        }
    }

    /// Gives the algorithm's block back and carves the request at `recorded` instead; if that
    /// range is not free, puts the algorithm's block back exactly.
    fn relocate(&mut self, p: &Params, pl: Placement, recorded: Addr) -> Placement {
        if self.free_block(pl.addr).is_err() {
            return pl;
        }
        if let Some(moved) = self.carve(p, recorded, Extent::Split { bound: None }) {
            return moved;
        }
        self.carve(p, pl.addr, Extent::Exact(pl.reserved_bytes))
            .unwrap_or(pl)
    }

    /// Allocates the request at `addr` inside the free block there (the space before `addr`
    /// stays free); `None` when that block is not free or too short.
    fn carve(&mut self, p: &Params, addr: Addr, extent: Extent) -> Option<Placement> {
        let (fa, f) = self.heap.containing(addr)?;
        let f_end = fa + f.size_bytes;
        let need_end = addr.checked_add(p.size_bytes)?;
        if f.occupant != Occupant::Free || need_end > f_end {
            return None;
        }
        let used_bytes = match extent {
            Extent::Exact(len) => {
                if addr.checked_add(len)? > f_end || len < p.size_bytes {
                    return None;
                }
                len
            }
            Extent::Split { bound } => {
                let region_end = bound.map_or(f_end, |b| b.clamp(need_end, f_end));
                if should_split(
                    region_end - addr,
                    p.size_bytes,
                    f.small_pool,
                    &self.settings,
                ) {
                    p.size_bytes
                } else {
                    region_end - addr
                }
            }
        };
        self.heap.take(fa);
        if addr > fa {
            self.heap.add(fa, f.with(addr - fa, Occupant::Free));
        }
        let used = Occupant::Used {
            id: p.id,
            requested_bytes: p.orig_bytes,
        };
        self.heap.add(addr, f.with(used_bytes, used));
        let used_end = addr + used_bytes;
        if used_end < f_end {
            self.heap
                .add(used_end, f.with(f_end - used_end, Occupant::Free));
        }
        Some(Placement {
            addr,
            reserved_bytes: used_bytes,
        })
    }

    /// Segments the policy made at its own addresses and then did not use are taken back,
    /// events and all.
    fn drop_unused_own_segments(&mut self, events_before: usize) {
        let Some(st) = self.script.as_mut() else {
            return;
        };
        for addr in std::mem::take(&mut st.own_segments) {
            if let Some(rec) = self.heap.block(addr)
                && rec.occupant == Occupant::Free
                && self.heap.remove_segment(addr).is_some()
            {
                self.heap.forget_events(events_before, |e| {
                    e.op.kind == SegmentOpKind::Alloc && e.op.addr == addr
                });
            }
        }
    }

    fn diverge(
        &mut self,
        p: &Params,
        recorded_addr: Addr,
        policy_addr: Option<Addr>,
        what: String,
    ) {
        let Some(st) = self.script.as_mut() else {
            return;
        };
        st.fidelity.divergences += 1;
        if st.fidelity.first_divergence.is_none() {
            st.fidelity.first_divergence = Some(Divergence {
                alloc_id: p.id,
                requested_bytes: p.orig_bytes,
                recorded_addr,
                policy_addr,
                what,
            });
        }
    }
}

/// "cudaMalloc of 2097152 B at 0x..., map of ..." or "nothing".
fn describe_ops(ops: &[SegmentOp]) -> String {
    if ops.is_empty() {
        return "nothing".to_owned();
    }
    ops.iter()
        .map(|op| {
            let what = match op.kind {
                SegmentOpKind::Alloc => "cudaMalloc",
                SegmentOpKind::Free => "cudaFree",
                SegmentOpKind::Map => "map",
                SegmentOpKind::Unmap => "unmap",
            };
            format!("{what} of {} B at {:#x}", op.size_bytes, op.addr)
        })
        .collect::<Vec<_>>()
        .join(", ")
}
