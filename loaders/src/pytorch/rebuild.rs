//! From one device's trace and final segments to allocview's events and the `pytorch` policy's
//! script.
//!
//! Snapshots are ring buffers: the trace rarely starts at process start, so blocks freed in the
//! trace may have been allocated before it, and segments the trace uses may predate it. The
//! state at the start is rebuilt (reference section 6):
//! - an allocation is *carried in* when the trace frees an address it never allocated (its size
//!   is `round_size` of the requested bytes the free names), or when the final segments hold an
//!   active block the trace never allocated;
//! - the start's segments are the final segments, walked back through the trace: a
//!   `segment_alloc` did not exist yet, a `segment_free` did (its pool from its size: small-pool
//!   segments are exactly 2 MiB), `segment_map`/`segment_unmap` shrink and grow the mapped
//!   ranges of expandable segments.
//!
//! Carried-in allocations become the first allocation events, at the trace's first time, in
//! address order, so every consumer of the event table (stats, every policy) sees the memory
//! that was live when the trace began.

use std::collections::BTreeMap;

use crate::events::{PtrMap, PtrSet};

use allocview_sim::policy::pytorch::{
    PytorchScript, PytorchSettings, ScriptSegment, SegmentOp, SegmentOpKind, round_size,
};
use allocview_sim::trace::{EventKind, NO_ALLOC_ID};

use super::model::{Action, RawBlock, RawEntry, RawSegment};
use crate::sites::NO_STACK;

/// One row of the event table, typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub t_ns: i64,
    /// Index into the streams table.
    pub stream_index: u16,
    pub kind: EventKind,
    /// Requested bytes (for a free, the allocation's).
    pub size_bytes: u64,
    /// The block size the caching allocator gives the request (`round_size`).
    pub rounded_bytes: u64,
    pub address: u64,
    pub alloc_id: u32,
    pub stack_id: u32,
    /// Index of the trace entry this row comes from; [`NO_ENTRY`] for carried-in
    /// allocations (a sentinel keeps an event at 48 bytes).
    pub entry: u32,
}

/// The event table's rows as columns, filled row by row: the columns move into the
/// DataFrame without a copy, so a 1 GB snapshot's 15 million rows never exist twice.
#[derive(Clone, Debug, Default)]
pub struct EventColumns {
    pub t_ns: Vec<i64>,
    pub stream_index: Vec<u16>,
    pub kind: Vec<EventKind>,
    pub size_bytes: Vec<u64>,
    pub rounded_bytes: Vec<u64>,
    pub address: Vec<u64>,
    pub alloc_id: Vec<u32>,
    pub stack_id: Vec<u32>,
    pub entry: Vec<u32>,
}

impl EventColumns {
    /// Columns with room for exactly `rows`: grown by doubling, the columns of a 1 GB
    /// snapshot held up to twice their size at the load's peak.
    fn with_capacity(rows: usize) -> Self {
        Self {
            t_ns: Vec::with_capacity(rows),
            stream_index: Vec::with_capacity(rows),
            kind: Vec::with_capacity(rows),
            size_bytes: Vec::with_capacity(rows),
            rounded_bytes: Vec::with_capacity(rows),
            address: Vec::with_capacity(rows),
            alloc_id: Vec::with_capacity(rows),
            stack_id: Vec::with_capacity(rows),
            entry: Vec::with_capacity(rows),
        }
    }

    fn push(&mut self, e: Event) {
        self.t_ns.push(e.t_ns);
        self.stream_index.push(e.stream_index);
        self.kind.push(e.kind);
        self.size_bytes.push(e.size_bytes);
        self.rounded_bytes.push(e.rounded_bytes);
        self.address.push(e.address);
        self.alloc_id.push(e.alloc_id);
        self.stack_id.push(e.stack_id);
        self.entry.push(e.entry);
    }

    /// Requested and rounded bytes of row `row`.
    fn sizes_at(&self, row: u32) -> (u64, u64) {
        let row = row as usize;
        (
            self.size_bytes.get(row).copied().unwrap_or(0),
            self.rounded_bytes.get(row).copied().unwrap_or(0),
        )
    }

    /// Number of rows.
    #[must_use]
    pub fn len(&self) -> usize {
        self.t_ns.len()
    }

    /// Whether there are no rows.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.t_ns.is_empty()
    }
}

/// [`Event::entry`] of a carried-in allocation.
pub const NO_ENTRY: u32 = u32::MAX;

/// A trace entry that is not an allocation or a free: segments, `oom`, `snapshot`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentEvent {
    pub action: Action,
    pub address: u64,
    pub size_bytes: u64,
    pub stream: u64,
    pub t_ns: i64,
    /// Number of event-table rows before it (it happened between rows `before - 1` and
    /// `before`).
    pub before_event: u32,
    pub device_free_bytes: Option<u64>,
    pub stack_id: u32,
}

/// What the rebuild produced.
#[derive(Clone, Debug, Default)]
pub struct Rebuilt {
    pub events: EventColumns,
    /// Stream values (the `tid` of the threads table), in first-seen order.
    pub streams: Vec<u64>,
    pub segment_events: Vec<SegmentEvent>,
    pub script: PytorchScript,
    /// Unix-epoch microseconds of `t_ns == 0`.
    pub time_origin_us: i64,
    pub carried_in: u32,
    /// Bytes of segments at the start (rebuilt) and their count.
    pub start_reserved_bytes: u64,
    pub start_segments: usize,
    /// Times that went backwards (clamped), frees of addresses not live.
    pub times_clamped: u64,
    pub unknown_frees: u64,
    /// Notes on what the rebuild could not reconcile.
    pub notes: Vec<String>,
}

/// Rebuilds one device: `segments` are that device's final segments, `trace` its entries.
#[must_use]
pub fn rebuild(
    segments: &[RawSegment],
    blocks: &[RawBlock],
    trace: &[RawEntry],
    entry_streams: &[u64],
    settings: &PytorchSettings,
) -> Rebuilt {
    let carried = carried_in(segments, blocks, trace, entry_streams, settings);
    let start = start_segments(segments, trace, entry_streams);
    let mut walk = Walk::new(trace, carried.len(), entry_streams, settings);
    // Segment sizes are the file's: saturated, as the ranges they come from are.
    walk.out.start_reserved_bytes = start
        .iter()
        .map(|s| s.size_bytes)
        .fold(0, u64::saturating_add);
    walk.out.start_segments = start.len();
    if let Some(note) = carried_outside_start(&carried, &start) {
        walk.out.notes.push(note);
    }
    walk.push_carried(&carried);
    for (i, e) in trace.iter().enumerate() {
        walk.push_entry(i, e);
    }
    walk.finish(start)
}

/// A note on the first carried-in block that lies in no segment of the rebuilt start, if
/// any: the two halves of the start state are rebuilt separately, and a block outside every
/// segment says they disagree (one note is enough to say so).
fn carried_outside_start(
    carried: &BTreeMap<u64, Carried>,
    start: &[ScriptSegment],
) -> Option<String> {
    // `start` is in address order: the segment that could hold a block is the last one that
    // starts at or below it.
    for (addr, c) in carried {
        let i = start.partition_point(|s| s.addr <= *addr);
        let inside = i
            .checked_sub(1)
            .and_then(|i| start.get(i))
            .is_some_and(|s| addr.saturating_add(c.rounded) <= s.addr.saturating_add(s.size_bytes));
        if !inside {
            return Some(format!(
                "a block live at the trace's start ({addr:#x}, {} B) lies in no segment of the \
                 rebuilt start state",
                c.rounded
            ));
        }
    }
    None
}

/// When and where a trace entry happened, as its event row records it.
#[derive(Clone, Copy)]
struct At {
    t_ns: i64,
    stream_index: u16,
    entry: u32,
}

/// The rebuild while it walks the trace, one event row (or segment event) per entry.
struct Walk<'a> {
    out: Rebuilt,
    entry_streams: &'a [u64],
    settings: &'a PytorchSettings,
    streams: StreamIndex,
    /// The event row of each live allocation's `alloc`, where its id and sizes are: a 1 GB
    /// snapshot has millions live at the end, and a map of them all is the load's peak.
    live: PtrMap<u32>,
    /// Each allocation's stream, by id (the script's `stream`).
    alloc_stream: Vec<u64>,
    /// Segment operations since the last allocation: the script performs them just before
    /// the next one, where the caching allocator did.
    pending_ops: Vec<SegmentOp>,
    prev_t_ns: i64,
}

impl<'a> Walk<'a> {
    /// An empty rebuild with room for exactly the rows to come, counted ahead: grown by
    /// doubling, the columns of a large snapshot would peak at twice their size.
    fn new(
        trace: &[RawEntry],
        carried: usize,
        entry_streams: &'a [u64],
        settings: &'a PytorchSettings,
    ) -> Self {
        let mut out = Rebuilt {
            time_origin_us: trace.iter().find_map(RawEntry::time).unwrap_or(0),
            ..Rebuilt::default()
        };
        let allocs = carried + trace.iter().filter(|e| e.action == Action::Alloc).count();
        let frees = trace
            .iter()
            .filter(|e| matches!(e.action, Action::FreeRequested | Action::FreeCompleted))
            .count();
        out.events = EventColumns::with_capacity(allocs + frees);
        out.script.recorded_addr.reserve_exact(allocs);
        Self {
            out,
            entry_streams,
            settings,
            streams: StreamIndex::default(),
            live: PtrMap::default(),
            alloc_stream: Vec::with_capacity(allocs),
            pending_ops: Vec::new(),
            prev_t_ns: 0,
        }
    }

    /// Gives the allocation at `addr` the next id and remembers its row (the next one), where
    /// its free will find its id and sizes.
    fn start_alloc(&mut self, addr: u64, stream: u64) -> u32 {
        let id = self.out.script.recorded_addr.len() as u32;
        self.out.script.recorded_addr.push(addr);
        self.alloc_stream.push(stream);
        self.live.insert(addr, self.out.events.len() as u32);
        id
    }

    /// Carried-in allocations first, in address order, at the trace's first moment, so every
    /// consumer sees the memory that was live when the trace began.
    fn push_carried(&mut self, carried: &BTreeMap<u64, Carried>) {
        for (&addr, c) in carried {
            let id = self.start_alloc(addr, c.stream);
            let stream_index = self.streams.index(c.stream);
            self.out.events.push(Event {
                t_ns: 0,
                stream_index,
                kind: EventKind::Alloc,
                size_bytes: c.requested,
                rounded_bytes: c.rounded,
                address: addr,
                alloc_id: id,
                stack_id: c.stack_id,
                entry: NO_ENTRY,
            });
        }
        self.out.carried_in = self.out.events.len() as u32;
    }

    /// Entry `i`'s time from the trace's first, in nanoseconds, never before the previous
    /// entry's: the events must be in time order, and a clock that stepped back is counted.
    fn entry_time_ns(&mut self, i: usize, e: &RawEntry) -> i64 {
        let t_ns = match e.time() {
            Some(us) => us
                .saturating_sub(self.out.time_origin_us)
                .saturating_mul(1000),
            // No times: one microsecond per entry keeps the order visible on a timeline.
            None => (i as i64).saturating_mul(1000),
        };
        let t_ns = if t_ns < self.prev_t_ns {
            self.out.times_clamped += 1;
            self.prev_t_ns
        } else {
            t_ns
        };
        self.prev_t_ns = t_ns;
        t_ns
    }

    /// Turns trace entry `i` into its event row, or its segment event.
    fn push_entry(&mut self, i: usize, e: &RawEntry) {
        let t_ns = self.entry_time_ns(i, e);
        let at = At {
            t_ns,
            stream_index: self.streams.index(e.stream(self.entry_streams)),
            entry: i as u32,
        };
        match e.action {
            Action::Alloc => self.push_alloc(at, e),
            Action::FreeRequested => self.push_free_requested(at, e),
            Action::FreeCompleted => self.push_free_completed(at, e),
            action => self.push_segment_event(at, e, action),
        }
    }

    /// Pushes the event row of trace entry `e`.
    fn push_row(
        &mut self,
        at: At,
        e: &RawEntry,
        kind: EventKind,
        (size_bytes, rounded_bytes): (u64, u64),
        alloc_id: u32,
    ) {
        self.out.events.push(Event {
            t_ns: at.t_ns,
            stream_index: at.stream_index,
            kind,
            size_bytes,
            rounded_bytes,
            address: e.addr,
            alloc_id,
            stack_id: e.stack_id,
            entry: at.entry,
        });
    }

    /// An allocation, which takes the segment operations pending since the previous one: the
    /// caching allocator grew or shrank its segments to serve this request.
    fn push_alloc(&mut self, at: At, e: &RawEntry) {
        let id = self.start_alloc(e.addr, e.stream(self.entry_streams));
        let rounded = round_size(e.size_bytes, self.settings);
        for op in self.pending_ops.drain(..) {
            self.out.script.segment_ops.push((id, op));
        }
        self.push_row(at, e, EventKind::Alloc, (e.size_bytes, rounded), id);
    }

    /// A free requested (the block waits for its stream's work): the allocation stays live
    /// until the free completes, and its sizes are the allocation's when it is known.
    fn push_free_requested(&mut self, at: At, e: &RawEntry) {
        let sizes = match self.live.get(&e.addr) {
            Some(&row) => self.out.events.sizes_at(row),
            None => (e.size_bytes, round_size(e.size_bytes, self.settings)),
        };
        self.push_row(at, e, EventKind::FreeRequested, sizes, NO_ALLOC_ID);
    }

    /// A completed free, which ends the allocation; a free of an address not live is kept as
    /// `FreeUnknown` and counted, with the sizes the free names.
    fn push_free_completed(&mut self, at: At, e: &RawEntry) {
        let (kind, id, sizes) = match self.live.remove(&e.addr) {
            Some(row) => {
                let sizes = self.out.events.sizes_at(row);
                let id = self.out.events.alloc_id.get(row as usize).copied();
                (EventKind::Free, id.unwrap_or(NO_ALLOC_ID), sizes)
            }
            None => {
                self.out.unknown_frees += 1;
                let sizes = (e.size_bytes, round_size(e.size_bytes, self.settings));
                (EventKind::FreeUnknown, NO_ALLOC_ID, sizes)
            }
        };
        self.push_row(at, e, kind, sizes, id);
    }

    /// An entry that is not an allocation or a free: a segment event between rows, and for
    /// the segment actions an operation the script performs before the next allocation.
    fn push_segment_event(&mut self, at: At, e: &RawEntry, action: Action) {
        let op_kind = match action {
            Action::SegmentAlloc => Some(SegmentOpKind::Alloc),
            Action::SegmentFree => Some(SegmentOpKind::Free),
            Action::SegmentMap => Some(SegmentOpKind::Map),
            Action::SegmentUnmap => Some(SegmentOpKind::Unmap),
            _ => None,
        };
        if let Some(kind) = op_kind {
            self.pending_ops.push(SegmentOp {
                kind,
                addr: e.addr,
                size_bytes: e.size_bytes,
            });
        }
        self.out.segment_events.push(SegmentEvent {
            action,
            address: e.address(),
            size_bytes: e.size_bytes,
            stream: e.stream(self.entry_streams),
            t_ns: at.t_ns,
            before_event: self.out.events.len() as u32,
            device_free_bytes: e.device_free(),
            stack_id: e.stack_id,
        });
    }

    /// Completes the script with the start's segments and the allocations' streams.
    fn finish(mut self, start: Vec<ScriptSegment>) -> Rebuilt {
        // Segment events after the last allocation (an emptyCache at the end) precede no alloc.
        for op in self.pending_ops {
            self.out.script.segment_ops.push((u32::MAX, op));
        }
        self.out.script.start_segments = start;
        self.out.script.stream = self.alloc_stream;
        self.out.script.carried_in = self.out.carried_in;
        self.out.streams = self.streams.values;
        self.out
    }
}

/// An allocation live when the trace starts.
#[derive(Clone, Copy, Debug)]
struct Carried {
    requested: u64,
    rounded: u64,
    stream: u64,
    stack_id: u32,
}

/// Allocations live at the start, by address.
fn carried_in(
    segments: &[RawSegment],
    blocks: &[RawBlock],
    trace: &[RawEntry],
    entry_streams: &[u64],
    settings: &PytorchSettings,
) -> BTreeMap<u64, Carried> {
    let mut carried = BTreeMap::new();
    let mut live = PtrSet::default();
    let mut allocated_in_trace = PtrSet::default();
    for e in trace {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr);
                allocated_in_trace.insert(e.addr);
            }
            Action::FreeCompleted => {
                let was_live = live.remove(&e.addr);
                if !was_live
                    && !allocated_in_trace.contains(&e.addr)
                    && !carried.contains_key(&e.addr)
                {
                    // The free's frames are where it was freed, not allocated: no stack.
                    carried.insert(
                        e.addr,
                        Carried {
                            requested: e.size_bytes,
                            rounded: round_size(e.size_bytes, settings),
                            stream: e.stream(entry_streams),
                            stack_id: NO_STACK,
                        },
                    );
                }
            }
            _ => {}
        }
    }
    for s in segments {
        let seg_blocks = blocks.get(s.blocks.clone()).unwrap_or_default();
        for b in seg_blocks.iter().filter(|b| b.state.is_active()) {
            if !live.contains(&b.address) && !allocated_in_trace.contains(&b.address) {
                carried.entry(b.address).or_insert(Carried {
                    requested: b.requested_bytes,
                    rounded: b.size_bytes,
                    stream: s.stream,
                    stack_id: b.stack_id,
                });
            }
        }
    }
    carried
}

/// The segments (mapped ranges) present when the trace starts, in address order.
fn start_segments(
    segments: &[RawSegment],
    trace: &[RawEntry],
    entry_streams: &[u64],
) -> Vec<ScriptSegment> {
    let mut by_addr: BTreeMap<u64, ScriptSegment> = segments
        .iter()
        .map(|s| {
            (
                s.address,
                ScriptSegment {
                    addr: s.address,
                    size_bytes: s.total_bytes,
                    small_pool: s.small_pool,
                    stream: s.stream,
                    expandable: s.expandable,
                },
            )
        })
        .collect();
    for e in trace.iter().rev() {
        match e.action {
            Action::SegmentAlloc => {
                by_addr.remove(&e.addr);
            }
            Action::SegmentFree => {
                by_addr.insert(
                    e.addr,
                    ScriptSegment {
                        addr: e.addr,
                        size_bytes: e.size_bytes,
                        small_pool: e.size_bytes == 2 << 20,
                        stream: e.stream(entry_streams),
                        expandable: false,
                    },
                );
            }
            // Walking back, a map did not happen yet: cut the range out.
            Action::SegmentMap => cut_range(&mut by_addr, e.addr, e.size_bytes),
            // Walking back, an unmapped range was still mapped: put it back, merged.
            Action::SegmentUnmap => add_range(&mut by_addr, e, entry_streams),
            _ => {}
        }
    }
    by_addr.into_values().collect()
}

fn cut_range(by_addr: &mut BTreeMap<u64, ScriptSegment>, addr: u64, size_bytes: u64) {
    let end = addr.saturating_add(size_bytes);
    let Some((&start, seg)) = by_addr.range(..=addr).next_back() else {
        return;
    };
    let seg = seg.clone();
    let seg_end = seg.addr.saturating_add(seg.size_bytes);
    if addr >= seg_end {
        return;
    }
    by_addr.remove(&start);
    if addr > seg.addr {
        by_addr.insert(
            seg.addr,
            ScriptSegment {
                size_bytes: addr - seg.addr,
                ..seg.clone()
            },
        );
    }
    if end < seg_end {
        by_addr.insert(
            end,
            ScriptSegment {
                addr: end,
                size_bytes: seg_end - end,
                ..seg
            },
        );
    }
}

/// Puts an expandable segment's range back, merged with the ranges beside it.
fn add_range(by_addr: &mut BTreeMap<u64, ScriptSegment>, e: &RawEntry, entry_streams: &[u64]) {
    let mut seg = ScriptSegment {
        addr: e.addr,
        size_bytes: e.size_bytes,
        small_pool: e.size_bytes == 2 << 20,
        stream: e.stream(entry_streams),
        expandable: true,
    };
    if let Some((&prev_addr, prev)) = by_addr.range(..e.addr).next_back()
        && prev.addr.saturating_add(prev.size_bytes) == seg.addr
        && prev.expandable
    {
        seg = ScriptSegment {
            addr: prev_addr,
            size_bytes: prev.size_bytes.saturating_add(seg.size_bytes),
            small_pool: prev.small_pool,
            ..seg
        };
        by_addr.remove(&prev_addr);
    }
    let end = seg.addr.saturating_add(seg.size_bytes);
    if let Some(next) = by_addr.get(&end).cloned()
        && next.expandable
    {
        by_addr.remove(&end);
        seg.size_bytes = seg.size_bytes.saturating_add(next.size_bytes);
    }
    by_addr.insert(seg.addr, seg);
}

/// Streams numbered in first-seen order (the event table's `thread` column).
#[derive(Default)]
struct StreamIndex {
    values: Vec<u64>,
    index: PtrMap<u16>,
}

impl StreamIndex {
    fn index(&mut self, stream: u64) -> u16 {
        if let Some(&i) = self.index.get(&stream) {
            return i;
        }
        let i = u16::try_from(self.values.len()).unwrap_or(u16::MAX);
        self.values.push(stream);
        self.index.insert(stream, i);
        i
    }
}

/// Highest reserved, allocated (rounded) and requested bytes over the trace, carried-in
/// allocations included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peaks {
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub requested_bytes: u64,
    /// Event-table row at which each peak is first reached (reserved: the row before which
    /// the segment event happened).
    pub reserved_event: usize,
    pub allocated_event: usize,
    pub requested_event: usize,
}

impl Rebuilt {
    /// The peaks of the rebuilt history.
    #[must_use]
    pub fn peaks(&self) -> Peaks {
        let mut p = Peaks {
            reserved_bytes: self.start_reserved_bytes,
            ..Peaks::default()
        };
        let mut reserved = self.start_reserved_bytes;
        let (mut allocated, mut requested) = (0u64, 0u64);
        let mut seg = self.segment_events.iter().peekable();
        let ev = &self.events;
        let rows = ev.kind.iter().zip(&ev.rounded_bytes).zip(&ev.size_bytes);
        for (i, ((&kind, &rounded_bytes), &size_bytes)) in rows.enumerate() {
            while let Some(s) = seg.next_if(|s| s.before_event as usize <= i) {
                match s.action {
                    Action::SegmentAlloc | Action::SegmentMap => {
                        reserved = reserved.saturating_add(s.size_bytes);
                    }
                    Action::SegmentFree | Action::SegmentUnmap => {
                        reserved = reserved.saturating_sub(s.size_bytes);
                    }
                    _ => {}
                }
                if reserved > p.reserved_bytes {
                    p.reserved_bytes = reserved;
                    p.reserved_event = i;
                }
            }
            match kind {
                EventKind::Alloc => {
                    allocated = allocated.saturating_add(rounded_bytes);
                    requested = requested.saturating_add(size_bytes);
                }
                EventKind::Free => {
                    allocated = allocated.saturating_sub(rounded_bytes);
                    requested = requested.saturating_sub(size_bytes);
                }
                _ => {}
            }
            if allocated > p.allocated_bytes {
                p.allocated_bytes = allocated;
                p.allocated_event = i;
            }
            if requested > p.requested_bytes {
                p.requested_bytes = requested;
                p.requested_event = i;
            }
        }
        p
    }
}
