//! The loaders' pairing of frees with allocations ([`Pairing`]) and the event columns built
//! from it ([`Builder`]), whole or in batches of the export schema.

use std::collections::hash_map::Entry;

use allocview_sim::trace::{EventKind, NO_ALLOC_ID, size_class};
use polars_arrow::bitmap::MutableBitmap;

use super::*;
use crate::error::LoadError;
use crate::sites::{NO_STACK, stack_id_column};

/// The thread column starts as `u8` and widens to `u16` only for traces with more than 256
/// threads: a byte per event matters at tens of millions of events.
pub(super) enum ThreadColumn {
    Narrow(Vec<u8>),
    Wide(Vec<u16>),
}

impl ThreadColumn {
    fn push(&mut self, index: u16) {
        match self {
            Self::Narrow(v) => {
                if let Ok(b) = u8::try_from(index) {
                    v.push(b);
                } else {
                    let mut wide: Vec<u16> = Vec::with_capacity(v.capacity());
                    wide.extend(v.iter().map(|&b| u16::from(b)));
                    wide.push(index);
                    *self = Self::Wide(wide);
                }
            }
            Self::Wide(v) => v.push(index),
        }
    }

    fn into_column(self) -> Column {
        match self {
            Self::Narrow(v) => UInt8Chunked::from_vec("thread".into(), v).into_column(),
            Self::Wide(v) => UInt16Chunked::from_vec("thread".into(), v).into_column(),
        }
    }
}

/// The columns being built, plus the state needed to pair frees with allocations.
pub(crate) struct Builder {
    t_ns: Vec<i64>,
    thread: ThreadColumn,
    kind: Vec<u8>,
    size_bytes: Vec<u64>,
    address: Vec<u64>,
    alloc_id: Vec<u32>,
    size_class: Vec<u8>,
    /// Created on the first line with a call column, back-filled with defaults.
    call: Option<Vec<u8>>,
    /// The file's stack ids, created on the first line with one, back-filled with
    /// [`NO_STACK`].
    stack: Option<Vec<u32>>,
    maker: RowMaker,
    pub(crate) summary: LoadSummary,
}

/// Pairs frees with allocations, as the loader does for every record: the state both the
/// [`Builder`] and a recording's summary (`crate::analysis::stats::RecordingStats`) keep.
#[derive(Clone)]
pub(crate) struct Pairing {
    live: PtrMap<LiveAlloc>,
    next_alloc_id: u32,
    /// Slots freed and not yet reused, and the next never used: a live allocation's slot is
    /// unique among the live ones, so tables indexed by slot stay as small as the live set
    /// (the streaming replay's address table).
    free_slots: Vec<u32>,
    next_slot: u32,
    prev_t_ns: i64,
    /// Bytes of the live allocations, and of every allocation so far: what the statistics and
    /// the replay add up, checked here so that a file whose sizes add up past 2^64 - 1 is
    /// refused at the line that does it instead of wrapping later.
    live_bytes: u64,
    total_bytes: u64,
}

/// Why a record whose sizes cannot be added up is refused (the `expected` of its line error).
const LIVE_OVERFLOW: &str = "a size that keeps the live allocations' bytes below 2^64 (16 EiB)";
const TOTAL_OVERFLOW: &str = "a size that keeps the bytes allocated so far below 2^64 (16 EiB)";

/// A live allocation: its id, slot and size.
#[derive(Clone, Copy)]
struct LiveAlloc {
    id: u32,
    slot: u32,
    size: u64,
}

/// What a record becomes: its event, after the clamped time, and the free of a block the
/// allocation found live (a missed free), which comes first.
pub(crate) struct Paired {
    pub(crate) t_ns: i64,
    pub(crate) kind: EventKind,
    pub(crate) size: u64,
    pub(crate) id: u32,
    /// The allocation's slot (see [`Pairing`]); [`NO_ALLOC_ID`] when `id` is.
    pub(crate) slot: u32,
    /// The alloc id, size and slot of the displaced block.
    pub(crate) displaced: Option<(u32, u64, u32)>,
}

impl Default for Pairing {
    fn default() -> Self {
        Self {
            live: PtrMap::default(),
            next_alloc_id: 0,
            free_slots: Vec::new(),
            next_slot: 0,
            prev_t_ns: i64::MIN,
            live_bytes: 0,
            total_bytes: 0,
        }
    }
}

impl Pairing {
    /// This without its live allocations and free slots, and those packed as varints (by
    /// address, each address as the step from the one before; the free slots in their order,
    /// which decides which slot the next allocation takes): what a resume point keeps.
    pub(crate) fn pack(&self) -> (Self, Box<[u8]>) {
        use allocview_sim::stream::packed::{delta, put};
        let mut live: Vec<(u64, LiveAlloc)> = self.live.iter().map(|(&p, &a)| (p, a)).collect();
        live.sort_unstable_by_key(|&(p, _)| p);
        let mut out = Vec::with_capacity(live.len() * 12 + self.free_slots.len() * 3 + 8);
        put(&mut out, live.len() as u64);
        let mut prev = 0;
        for (addr, a) in live {
            put(&mut out, delta(prev, addr));
            put(&mut out, u64::from(a.id));
            put(&mut out, u64::from(a.slot));
            put(&mut out, a.size);
            prev = addr;
        }
        put(&mut out, self.free_slots.len() as u64);
        for &slot in &self.free_slots {
            put(&mut out, u64::from(slot));
        }
        let rest = Self {
            live: PtrMap::default(),
            free_slots: Vec::new(),
            ..*self
        };
        (rest, out.into_boxed_slice())
    }

    /// `rest` with the live allocations and free slots [`Self::pack`] packed into `bytes`;
    /// `None` if they do not hold what it wrote.
    pub(crate) fn unpack(rest: &Self, bytes: &[u8]) -> Option<Self> {
        use allocview_sim::stream::packed::{get, undelta};
        let mut bytes = bytes;
        let n = usize::try_from(get(&mut bytes)?).ok()?;
        let mut live = PtrMap::default();
        // Each entry takes four bytes at least: damaged bytes cannot ask for more room.
        live.reserve(n.min(bytes.len() / 4));
        let mut addr = 0;
        for _ in 0..n {
            addr = undelta(addr, get(&mut bytes)?);
            let id = u32::try_from(get(&mut bytes)?).ok()?;
            let slot = u32::try_from(get(&mut bytes)?).ok()?;
            let size = get(&mut bytes)?;
            live.insert(addr, LiveAlloc { id, slot, size });
        }
        let n_free = usize::try_from(get(&mut bytes)?).ok()?;
        let free_slots = (0..n_free)
            .map(|_| u32::try_from(get(&mut bytes)?).ok())
            .collect::<Option<Vec<u32>>>()?;
        bytes.is_empty().then_some(Self {
            live,
            free_slots,
            ..*rest
        })
    }

    /// Pairs one line, as [`Self::pair`], and counts a free of a pointer never allocated in
    /// the trace ([`LoadSummary::add_frees_unknown`]: of a Python object, or of a block
    /// allocated before a recording started mid-run, counted apart).
    #[inline(always)]
    pub(crate) fn pair_line(
        &mut self,
        summary: &mut LoadSummary,
        line: &Line,
    ) -> Result<Paired, &'static str> {
        let p = self.pair(summary, line.t_ns, line.size_bytes, line.addr)?;
        if p.kind == EventKind::FreeUnknown {
            summary.add_frees_unknown(1, u64::from(line.python));
        }
        Ok(p)
    }

    /// Pairs one record (`size_bytes` `None` for a free), counting in `summary` (all but a
    /// free of an unknown pointer: [`Self::pair_line`] counts those).
    pub(crate) fn pair(
        &mut self,
        summary: &mut LoadSummary,
        t_ns: i64,
        size_bytes: Option<u64>,
        addr: u64,
    ) -> Result<Paired, &'static str> {
        // An allocation's entry in the live map, looked up once (the map is the loader's and
        // `record`'s hottest structure).
        let mut entry = None;
        if let Some(size) = size_bytes
            && addr != 0
        {
            // Checked before anything is counted: a refused line (skipped in lenient mode)
            // leaves no trace in the counts. A live block at `addr` is freed by this record.
            let e = self.live.entry(addr);
            let displaced = match &e {
                Entry::Occupied(o) => o.get().size,
                Entry::Vacant(_) => 0,
            };
            self.live_bytes
                .saturating_sub(displaced)
                .checked_add(size)
                .ok_or(LIVE_OVERFLOW)?;
            self.total_bytes.checked_add(size).ok_or(TOTAL_OVERFLOW)?;
            entry = Some(e);
        }
        let mut t_ns = t_ns;
        if t_ns < self.prev_t_ns {
            summary.timestamps_non_monotonic += 1;
            t_ns = self.prev_t_ns;
        }
        self.prev_t_ns = t_ns;
        let mut displaced = None;
        let (kind, size, id, slot) = match size_bytes {
            Some(size) => {
                summary.mallocs += 1;
                if size == 0 {
                    summary.mallocs_size_zero += 1;
                }
                if let Some(e) = entry {
                    let id = self.next_alloc_id;
                    if id == NO_ALLOC_ID {
                        return Err("at most 4294967294 allocations");
                    }
                    self.next_alloc_id += 1;
                    let slot = match e {
                        // The displaced block's implied free gives back its slot, which this
                        // allocation takes at once.
                        Entry::Occupied(mut o) => {
                            let old = o.insert(LiveAlloc {
                                id,
                                slot: o.get().slot,
                                size,
                            });
                            summary.mallocs_of_live_ptr += 1;
                            self.live_bytes = self.live_bytes.saturating_sub(old.size);
                            displaced = Some((old.id, old.size, old.slot));
                            old.slot
                        }
                        Entry::Vacant(v) => {
                            let slot = take_slot(&mut self.free_slots, &mut self.next_slot);
                            v.insert(LiveAlloc { id, slot, size });
                            slot
                        }
                    };
                    // Both checked above.
                    self.live_bytes = self.live_bytes.saturating_add(size);
                    self.total_bytes = self.total_bytes.saturating_add(size);
                    (EventKind::Alloc, size, id, slot)
                } else {
                    if size > 0 {
                        summary.mallocs_failed += 1;
                    }
                    (EventKind::AllocFailed, size, NO_ALLOC_ID, NO_ALLOC_ID)
                }
            }
            None => {
                summary.frees += 1;
                if addr == 0 {
                    summary.frees_null += 1;
                    (EventKind::FreeNull, 0, NO_ALLOC_ID, NO_ALLOC_ID)
                } else if let Some(old) = self.live.remove(&addr) {
                    self.live_bytes = self.live_bytes.saturating_sub(old.size);
                    self.free_slots.push(old.slot);
                    (EventKind::Free, old.size, old.id, old.slot)
                } else {
                    (EventKind::FreeUnknown, 0, NO_ALLOC_ID, NO_ALLOC_ID)
                }
            }
        };
        Ok(Paired {
            t_ns,
            kind,
            size,
            id,
            slot,
            displaced,
        })
    }

    /// Allocations live now.
    pub(crate) fn live_allocations(&self) -> usize {
        self.live.len()
    }

    /// Slots freed and not reused yet.
    pub(crate) fn free_slots(&self) -> usize {
        self.free_slots.len()
    }

    /// Bytes of the allocations live now.
    pub(crate) fn live_bytes(&self) -> u64 {
        self.live_bytes
    }
}

/// A slot for a new live allocation: the last one freed, else the next never used.
fn take_slot(free_slots: &mut Vec<u32>, next_slot: &mut u32) -> u32 {
    free_slots.pop().unwrap_or_else(|| {
        // Fewer live allocations than ids: the count cannot pass `NO_ALLOC_ID`.
        let slot = *next_slot;
        *next_slot += 1;
        slot
    })
}

/// One row of the event columns, as [`RowMaker::make`] makes it from a record.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row {
    t_ns: i64,
    size: u64,
    addr: u64,
    id: u32,
    stack: u32,
    thread: u16,
    kind: EventKind,
    call: u8,
    /// The record named its call: the call column is kept.
    named_call: bool,
}

/// The sequential part of building the event columns: each thread's index and the pairing.
#[derive(Default)]
pub(crate) struct RowMaker {
    pairing: Pairing,
    threads: ThreadIds,
}

impl RowMaker {
    /// The rows of one record, counted in `summary`, handed to `emit`: the free of a block the
    /// allocation found live (a missed free) first, then the record's own event. On a refusal
    /// after the pairing, the missed free has been handed out (what came before a refused
    /// record is loaded).
    #[inline(always)] // the loaders' per-record path: `emit` must inline into it
    pub(crate) fn make(
        &mut self,
        summary: &mut LoadSummary,
        line: &Line,
        mut emit: impl FnMut(Row),
    ) -> Result<(), &'static str> {
        let thread = self.threads.index(line.tid)?;
        let Paired {
            t_ns,
            kind,
            size,
            id,
            displaced,
            ..
        } = self.pairing.pair_line(summary, line)?;
        if let Some((old_id, old_size, _)) = displaced {
            summary.events += 1;
            emit(Row {
                t_ns,
                size: old_size,
                addr: line.addr,
                id: old_id,
                stack: NO_STACK,
                thread,
                kind: EventKind::Free,
                call: CALL_FREE,
                named_call: false,
            });
        }
        let call = match line.call {
            Some(code) => {
                if usize::from(code) >= CALL_NAMES.len() {
                    return Err("a known call code");
                }
                summary.has_call_column = true;
                code
            }
            None if kind.is_free() => CALL_FREE,
            None => CALL_MALLOC,
        };
        summary.events += 1;
        emit(Row {
            t_ns,
            size,
            addr: line.addr,
            id,
            stack: line.stack.unwrap_or(NO_STACK),
            thread,
            kind,
            call,
            named_call: line.call.is_some(),
        });
        Ok(())
    }

    /// The thread ids in the order of their indices.
    pub(crate) fn thread_order(&self) -> &[u64] {
        &self.threads.order
    }
}

/// Thread ids numbered in the order of their first event: the `thread` column's indices.
#[derive(Clone, Default)]
pub(crate) struct ThreadIds {
    tids: PtrMap<u16>,
    pub(crate) order: Vec<u64>,
    last: Option<(u64, u16)>,
}

impl ThreadIds {
    pub(crate) fn index(&mut self, tid: u64) -> Result<u16, &'static str> {
        if let Some((last, idx)) = self.last
            && last == tid
        {
            return Ok(idx);
        }
        let idx = if let Some(&idx) = self.tids.get(&tid) {
            idx
        } else {
            let idx = u16::try_from(self.order.len())
                .map_err(|_| "more threads than allocview loads (65,536)")?;
            self.tids.insert(tid, idx);
            self.order.push(tid);
            idx
        };
        self.last = Some((tid, idx));
        Ok(idx)
    }
}

impl Builder {
    pub(crate) fn with_capacity(events: usize) -> Self {
        Self {
            t_ns: Vec::with_capacity(events),
            thread: ThreadColumn::Narrow(Vec::with_capacity(events)),
            kind: Vec::with_capacity(events),
            size_bytes: Vec::with_capacity(events),
            address: Vec::with_capacity(events),
            alloc_id: Vec::with_capacity(events),
            size_class: Vec::with_capacity(events),
            call: None,
            stack: None,
            maker: RowMaker::default(),
            summary: LoadSummary::default(),
        }
    }

    pub(crate) fn push(&mut self, line: &Line) -> Result<(), &'static str> {
        // At most two rows: the rows are pushed once the maker is done with `self`.
        let mut rows = [None, None];
        let mut n = 0;
        let made = self.maker.make(&mut self.summary, line, |row| {
            if let Some(slot) = rows.get_mut(n) {
                *slot = Some(row);
            }
            n += 1;
        });
        for row in rows.iter().flatten() {
            self.push_row(row);
        }
        made
    }

    /// Splits off the sequential part of [`Self::push`] (threads, pairing and the summary's
    /// counts), so that it can run on another thread while this builder takes its rows with
    /// [`Self::push_row`]; [`Self::rejoin`] puts it back.
    pub(crate) fn split(&mut self) -> (RowMaker, LoadSummary) {
        (
            std::mem::take(&mut self.maker),
            std::mem::take(&mut self.summary),
        )
    }

    /// Puts back what [`Self::split`] took, with what it counted.
    pub(crate) fn rejoin(&mut self, maker: RowMaker, summary: LoadSummary) {
        self.maker = maker;
        self.summary = summary;
    }

    /// Appends one row made by [`RowMaker::make`] (counted there).
    #[inline]
    pub(crate) fn push_row(&mut self, row: &Row) {
        if row.named_call && self.call.is_none() {
            self.call = Some(default_calls(&self.kind));
        }
        if let Some(calls) = self.call.as_mut() {
            calls.push(row.call);
        }
        if row.stack != NO_STACK && self.stack.is_none() {
            self.stack = Some(vec![NO_STACK; self.kind.len()]);
        }
        if let Some(stacks) = self.stack.as_mut() {
            stacks.push(row.stack);
        }
        self.t_ns.push(row.t_ns);
        self.thread.push(row.thread);
        self.kind.push(row.kind.code());
        self.size_bytes.push(row.size);
        self.address.push(row.addr);
        self.alloc_id.push(row.id);
        self.size_class.push(size_class(row.size));
    }

    /// The file's stack id of every row so far ([`NO_STACK`] where
    /// none), `None` when no row had one; taken before [`Self::finish`].
    pub(crate) fn take_stacks(&mut self) -> Option<Vec<u32>> {
        self.stack.take()
    }

    /// Rows pushed since the last [`Self::take_batch`].
    pub(crate) fn pending_rows(&self) -> usize {
        self.kind.len()
    }

    /// Drains the rows pushed so far into a DataFrame of the export schema
    /// ([`crate::export`]), keeping the pairing and thread state: a trace is then written in
    /// batches of bounded size, each batch's columns being dropped once written.
    pub(crate) fn take_batch(&mut self) -> PolarsResult<DataFrame> {
        let kind = std::mem::take(&mut self.kind);
        // A trace without the call column gets the codes the loader's own default gives.
        let call = match self.call.as_mut() {
            Some(calls) => std::mem::take(calls),
            None => default_calls(&kind),
        };
        let stack = match self.stack.as_mut() {
            Some(stacks) => std::mem::take(stacks),
            None => vec![NO_STACK; kind.len()],
        };
        let thread: Vec<u16> = match &mut self.thread {
            ThreadColumn::Narrow(v) => std::mem::take(v).into_iter().map(u16::from).collect(),
            ThreadColumn::Wide(v) => std::mem::take(v),
        };
        EventColumns {
            t_ns: std::mem::take(&mut self.t_ns),
            thread,
            kind,
            size_bytes: std::mem::take(&mut self.size_bytes),
            address: std::mem::take(&mut self.address),
            alloc_id: std::mem::take(&mut self.alloc_id),
            size_class: std::mem::take(&mut self.size_class),
            call,
            stack_id: stack,
        }
        .into_frame()
    }

    /// The threads table of the threads seen so far.
    pub(crate) fn threads_frame(&self) -> PolarsResult<DataFrame> {
        threads_frame(self.maker.thread_order().to_vec())
    }

    pub(crate) fn finish(self) -> Result<(DataFrame, DataFrame, LoadSummary), LoadError> {
        let Self {
            t_ns,
            thread,
            kind,
            size_bytes,
            address,
            alloc_id,
            size_class,
            call,
            maker,
            summary,
            ..
        } = self;
        let tid_order = maker.threads.order;
        let height = kind.len();
        let alloc_id_col = alloc_id_column(alloc_id);
        let mut columns = vec![
            Int64Chunked::from_vec("t_ns".into(), t_ns).into_column(),
            thread.into_column(),
            UInt8Chunked::from_vec("kind".into(), kind).into_column(),
            UInt64Chunked::from_vec("size_bytes".into(), size_bytes).into_column(),
            UInt64Chunked::from_vec("address".into(), address).into_column(),
            alloc_id_col.into_column(),
            UInt8Chunked::from_vec("size_class".into(), size_class).into_column(),
        ];
        if let Some(call) = call {
            columns.push(UInt8Chunked::from_vec("call".into(), call).into_column());
        }
        let events = DataFrame::new(height, columns)?;
        let threads = threads_frame(tid_order)?;
        Ok((events, threads, summary))
    }
}

/// The event table's `alloc_id` column from dense ids: null where an event belongs to no
/// allocation ([`NO_ALLOC_ID`]), without a validity mask when none is.
#[must_use]
pub fn alloc_id_column(alloc_id: Vec<u32>) -> UInt32Chunked {
    if !alloc_id.contains(&NO_ALLOC_ID) {
        return UInt32Chunked::from_vec("alloc_id".into(), alloc_id);
    }
    let mut validity = MutableBitmap::with_capacity(alloc_id.len());
    for &id in &alloc_id {
        validity.push(id != NO_ALLOC_ID);
    }
    UInt32Chunked::from_vec_validity("alloc_id".into(), alloc_id, Some(validity.into()))
}

/// The columns of a batch of exported events ([`crate::export`]'s schema, which
/// [`Builder::take_batch`] gives), before they become a DataFrame.
struct EventColumns {
    t_ns: Vec<i64>,
    thread: Vec<u16>,
    kind: Vec<u8>,
    size_bytes: Vec<u64>,
    address: Vec<u64>,
    /// [`NO_ALLOC_ID`] where null.
    alloc_id: Vec<u32>,
    size_class: Vec<u8>,
    call: Vec<u8>,
    /// [`NO_STACK`] where null.
    stack_id: Vec<u32>,
}

impl EventColumns {
    fn into_frame(self) -> PolarsResult<DataFrame> {
        let height = self.kind.len();
        DataFrame::new(
            height,
            vec![
                Int64Chunked::from_vec("t_ns".into(), self.t_ns).into_column(),
                UInt16Chunked::from_vec("thread".into(), self.thread).into_column(),
                UInt8Chunked::from_vec("kind".into(), self.kind).into_column(),
                UInt64Chunked::from_vec("size_bytes".into(), self.size_bytes).into_column(),
                UInt64Chunked::from_vec("address".into(), self.address).into_column(),
                // The sentinels are the same value, so one null-making helper serves both.
                stack_id_column("alloc_id", self.alloc_id),
                UInt8Chunked::from_vec("size_class".into(), self.size_class).into_column(),
                UInt8Chunked::from_vec("call".into(), self.call).into_column(),
                stack_id_column("stack_id", self.stack_id),
            ],
        )
    }
}

const _: () = assert!(NO_ALLOC_ID == NO_STACK);

/// The threads table: `thread` (the index used in the events) and `tid` (the id in the file).
fn threads_frame(tid_order: Vec<u64>) -> PolarsResult<DataFrame> {
    let n_threads = tid_order.len();
    DataFrame::new(
        n_threads,
        vec![
            UInt16Chunked::from_vec(
                "thread".into(),
                (0..n_threads)
                    .map(|i| u16::try_from(i).unwrap_or(u16::MAX))
                    .collect(),
            )
            .into_column(),
            UInt64Chunked::from_vec("tid".into(), tid_order).into_column(),
        ],
    )
}

pub(super) fn default_calls(kinds: &Vec<u8>) -> Vec<u8> {
    let mut calls = Vec::with_capacity(kinds.capacity());
    calls.extend(kinds.iter().map(|&k| {
        if EventKind::from_code(k).is_some_and(EventKind::is_free) {
            CALL_FREE
        } else {
            CALL_MALLOC
        }
    }));
    calls
}
