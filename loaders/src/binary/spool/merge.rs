//! The merge of a spool's streams into one ordered sequence: by time, then by order key, or
//! by causality where events have no key.

use std::collections::BinaryHeap;
use std::path::Path;

use super::super::block::call_of;
use super::super::{OP_FREE, corrupt};
use super::order::{apply, greedy, search};
use super::{SpoolEncoding, SpoolEvent, Stream};
use crate::error::LoadError;
use crate::events::{PtrSet, Record};

/// Merges the streams of a spool into one sequence: by time, and among events of one time
/// (the clock thread's period, so there are many) in an order consistent with the pointers'
/// lives, which the times alone cannot give. It can run in steps, each up to a time bound,
/// while the tracer still writes the spool.
pub(super) struct Merge {
    /// The pointers allocated and not yet freed, when there are (or may be) several streams.
    pub(super) live: Option<PtrSet>,
    pub(super) records: u64,
    /// Every event of an earlier time than this has been emitted.
    pub(super) emitted_below: u64,
    /// An event of such a time came in afterwards: the merge stopped.
    pub(super) late: bool,
    /// Reading while the tracer writes: the live pointers may be dropped a little after the
    /// first keyed event, or where threads own periods ([`Self::owners_ordered`]) a second
    /// thread's first event (the tracer keys events once several threads record, so keys
    /// order every later period shared, and causality is not needed); a period that then
    /// needs it stops the merge as [`Self::late`] does, and the file is read whole instead.
    pub(super) may_drop_live: bool,
    pub(super) live_dropped: bool,
    /// The time of the first group with a keyed stream.
    first_keyed_tick: Option<u64>,
    /// The spool's threads own clock periods once several record (events `5` or `6` with
    /// `order_keys`): from then on no period has events without keys from two threads, so
    /// the live pointers may also be dropped a little after a second thread's first event,
    /// though no period is ever shared (one thread allocates while the others wait).
    pub(super) owners_ordered: bool,
    /// The first thread emitted, and the time of the first event of another.
    first_tid: Option<u64>,
    second_thread_tick: Option<u64>,
    /// A step stops once [`Self::records`] reaches this, at the end of a time, and says so
    /// in [`Self::stopped`]: the next step goes on from there.
    pub(super) stop_at: Option<u64>,
    pub(super) stopped: bool,
}

/// How long after the first keyed event (or a second thread's first) the live pointers are
/// kept (the period in which keys start: events that read the flag before it was set may
/// still be written), in ticks (nanoseconds: a spool is read live only with a nanosecond
/// clock). A second thread's first event may carry a time read up to a buffer's mapping
/// before it set the flag; should that exceed this, a shared period without keys may follow
/// the drop, and the reading reports itself late (the file is then read whole).
const KEYS_STARTING_TICKS: u64 = 10_000_000;

/// Where a step of the merge sends its events, and how it reads them.
pub(super) struct Out<'p, 'f> {
    pub(super) path: &'p Path,
    pub(super) encoding: SpoolEncoding,
    pub(super) timing: Timing,
    /// The file was cut: a cut last event ends its stream instead of being an error.
    pub(super) truncated: bool,
    pub(super) f: &'f mut dyn FnMut(&Record) -> Result<(), &'static str>,
}

impl Merge {
    pub(super) fn new() -> Self {
        Self {
            live: None,
            records: 0,
            stop_at: None,
            stopped: false,
            emitted_below: 0,
            late: false,
            may_drop_live: false,
            live_dropped: false,
            first_keyed_tick: None,
            owners_ordered: false,
            first_tid: None,
            second_thread_tick: None,
        }
    }

    fn advance(s: &mut Stream<'_>, out: &Out<'_, '_>) -> Result<(), LoadError> {
        match s.advance(out.encoding) {
            Ok(()) => Ok(()),
            // A cut last event (the tracer was killed mid-write) ends the stream.
            Err(_) if out.truncated => {
                s.head = None;
                s.segments.clear();
                s.pos = 0;
                Ok(())
            }
            Err(e) => Err(corrupt(out.path, 0, e)),
        }
    }

    /// Emits an event and updates the live pointers.
    fn emit(&mut self, out: &mut Out<'_, '_>, tid: u64, ev: &SpoolEvent) -> Result<(), LoadError> {
        if let Some(live) = &mut self.live {
            apply(live, ev);
        }
        self.emit_record(out, tid, ev)
    }

    /// Emits an event whose effect on the live pointers is already applied.
    fn emit_record(
        &mut self,
        out: &mut Out<'_, '_>,
        tid: u64,
        ev: &SpoolEvent,
    ) -> Result<(), LoadError> {
        let call = call_of(ev.op).ok_or_else(|| corrupt(out.path, 0, "unknown call code"))?;
        let is_free = ev.op & OP_FREE != 0;
        (out.f)(&Record {
            t_ns: out.timing.to_ns(ev.tick),
            tid,
            size_bytes: (!is_free).then_some(ev.size),
            addr: super::merge_addr(ev.heap, ev.addr),
            call,
            stack: ev.stack,
            heap: ev.heap,
        })
        .map_err(|e| corrupt(out.path, 0, e))?;
        if ev.key.is_some() && self.first_keyed_tick.is_none() {
            self.first_keyed_tick = Some(ev.tick);
        }
        if self.second_thread_tick.is_none() {
            match self.first_tid {
                None => self.first_tid = Some(tid),
                Some(first) if first != tid => self.second_thread_tick = Some(ev.tick),
                Some(_) => {}
            }
        }
        self.records += 1;
        Ok(())
    }

    /// Emits, in order, the events of every time before `bound` (all of them when `None`),
    /// from the streams' segments so far. Marks the merge late, and stops, on meeting an
    /// event of a time before an earlier step's bound.
    pub(super) fn run(
        &mut self,
        streams: &mut [Stream<'_>],
        bound: Option<u64>,
        out: &mut Out<'_, '_>,
    ) -> Result<(), LoadError> {
        let mut heap: BinaryHeap<std::cmp::Reverse<(u64, usize)>> =
            BinaryHeap::with_capacity(streams.len());
        for (i, s) in streams.iter_mut().enumerate() {
            if s.head.is_none() {
                Self::advance(s, out)?;
            }
            if let Some(ev) = &s.head {
                heap.push(std::cmp::Reverse((ev.tick, i)));
            }
        }
        let mut group: Vec<usize> = Vec::new();
        let mut runs: Vec<Vec<SpoolEvent>> = Vec::new();
        self.stopped = false;
        while let Some(&std::cmp::Reverse((tick, first))) = heap.peek() {
            if bound.is_some_and(|b| tick >= b) {
                break;
            }
            if tick < self.emitted_below {
                self.late = true;
                return Ok(());
            }
            heap.pop();
            // Every stream whose next event has this time, in the streams' order.
            group.clear();
            group.push(first);
            while let Some(&std::cmp::Reverse((t, i))) = heap.peek()
                && t == tick
            {
                heap.pop();
                group.push(i);
            }
            if let [i] = group[..] {
                let Some(s) = streams.get_mut(i) else {
                    continue;
                };
                while let Some(ev) = s.head.filter(|ev| ev.tick == tick) {
                    self.emit(out, s.tid, &ev)?;
                    Self::advance(s, out)?;
                }
            } else {
                group.sort_unstable_by_key(|&i| streams.get(i).map_or(0, |s| s.id));
                self.emit_group(streams, &group, &mut runs, tick, out)?;
            }
            if self.late {
                return Ok(());
            }
            for &i in &group {
                if let Some(ev) = streams.get(i).and_then(|s| s.head.as_ref()) {
                    heap.push(std::cmp::Reverse((ev.tick, i)));
                }
            }
            if self.may_drop_live && self.live.is_some() {
                self.maybe_drop_live(tick);
            }
            if self.stop_at.is_some_and(|n| self.records >= n) {
                // Every event of this time and before is out: an event of such a time that
                // comes in later is late, as for a bound.
                self.emitted_below = self.emitted_below.max(tick.saturating_add(1));
                self.stopped = true;
                return Ok(());
            }
        }
        if let Some(b) = bound {
            self.emitted_below = self.emitted_below.max(b);
        }
        Ok(())
    }

    /// Drops the live pointers once the period in which keys start is over (see
    /// [`Self::may_drop_live`]); `tick` is the time just emitted.
    fn maybe_drop_live(&mut self, tick: u64) {
        // The first keyed event emitted (or, where threads own periods, the first event of a
        // second thread: keys start as it takes its buffer), not the streams' states: a
        // stream's state is that of its next event, which may lie far ahead of what is
        // emitted (a thread started later, read in a segment the reading has not reached),
        // and the period in which keys start (the first thread besides the main one: both
        // without keys) comes after this tick.
        let second = self.second_thread_tick.filter(|_| self.owners_ordered);
        let start = match (self.first_keyed_tick, second) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(first) = start
            && tick >= first.saturating_add(KEYS_STARTING_TICKS)
        {
            self.live = None;
            self.live_dropped = true;
        }
    }

    /// Emits the events of time `tick` of several streams (`group`, in the streams' order).
    fn emit_group(
        &mut self,
        streams: &mut [Stream<'_>],
        group: &[usize],
        runs: &mut Vec<Vec<SpoolEvent>>,
        tick: u64,
        out: &mut Out<'_, '_>,
    ) -> Result<(), LoadError> {
        runs.resize_with(group.len(), Vec::new);
        for (run, &i) in runs.iter_mut().zip(group) {
            run.clear();
            let Some(s) = streams.get_mut(i) else {
                continue;
            };
            while let Some(ev) = s.head.filter(|ev| ev.tick == tick) {
                run.push(ev);
                Self::advance(s, out)?;
            }
        }
        let tids: Vec<u64> = group
            .iter()
            .map(|&i| streams.get(i).map_or(0, |s| s.tid))
            .collect();
        let runs = &mut runs[..group.len()];
        if runs.iter().flatten().all(|ev| ev.key.is_some()) {
            self.merge_by_key(out, runs, &tids)
        } else if runs.iter().flatten().all(|ev| ev.key.is_none()) {
            self.interleave(out, runs, &tids)
        } else {
            // The period in which a second thread started recording: each thread's events
            // without a key come first (the tracer read the flag that adds keys before the
            // call of each of them, and found it unset, while every keyed event read it set,
            // so none of the former can depend on one of the latter), ordered by causality;
            // then the keyed ones, by key.
            let mut keyed = Vec::with_capacity(runs.len());
            for run in runs.iter_mut() {
                let first_keyed = run.iter().position(|ev| ev.key.is_some());
                keyed.push(run.split_off(first_keyed.unwrap_or(run.len())));
            }
            self.interleave(out, runs, &tids)?;
            self.merge_by_key(out, &keyed, &tids)
        }
    }

    /// Emits the runs of events of one time from several threads when every event has an
    /// order key: each run in its order, the runs merged by key (the tracer reads an
    /// allocation's key after its real call and a free's before, so an allocation that
    /// reuses an address has a larger key than the free that released it, and a free a larger
    /// key than the allocation whose block it was handed).
    fn merge_by_key(
        &mut self,
        out: &mut Out<'_, '_>,
        runs: &[Vec<SpoolEvent>],
        tids: &[u64],
    ) -> Result<(), LoadError> {
        let mut next = vec![0usize; runs.len()];
        loop {
            // Few runs (one per thread active in the period): a scan of the heads is enough.
            let best = runs
                .iter()
                .zip(&next)
                .enumerate()
                // An event without a key after keyed ones of its time cannot come from the
                // tracer (a period shared stays shared); it is kept, where its thread has
                // reached.
                .filter_map(|(r, (run, &n))| Some((run.get(n)?.key.unwrap_or(0), r)))
                .min();
            let Some((_, r)) = best else {
                return Ok(());
            };
            let (Some(n), Some(run), Some(&tid)) = (next.get_mut(r), runs.get(r), tids.get(r))
            else {
                return Ok(());
            };
            if let Some(ev) = run.get(*n) {
                self.emit(out, tid, ev)?;
            }
            *n += 1;
        }
    }

    /// Emits the runs of events of one time from several threads, some without an order key
    /// (the period in which a second thread started recording, spools of earlier tracers,
    /// machines without usable keys): each run in its order, interleaved so that no allocation comes before the free of its address, nor a free
    /// before its allocation (see [`search`]; when its budget runs out, [`greedy`]).
    fn interleave(
        &mut self,
        out: &mut Out<'_, '_>,
        runs: &[Vec<SpoolEvent>],
        tids: &[u64],
    ) -> Result<(), LoadError> {
        if runs.iter().filter(|run| !run.is_empty()).count() <= 1 {
            // One thread's events alone (the owner of a period, before its keyed ones): its
            // order is the order.
            for (run, &tid) in runs.iter().zip(tids) {
                for ev in run {
                    self.emit(out, tid, ev)?;
                }
            }
            return Ok(());
        }
        let Some(live) = &mut self.live else {
            if self.live_dropped {
                self.late = true;
            }
            return Ok(());
        };
        let order = match search(runs, live) {
            Some(order) => order,
            None => greedy(runs, live),
        };
        let mut next = vec![0usize; runs.len()];
        for r in order {
            let r = r as usize;
            let (Some(n), Some(run), Some(&tid)) = (next.get_mut(r), runs.get(r), tids.get(r))
            else {
                continue;
            };
            if let Some(ev) = run.get(*n) {
                self.emit_record(out, tid, ev)?;
            }
            *n += 1;
        }
        Ok(())
    }
}

/// How the spool's ticks become trace nanoseconds.
#[derive(Clone, Copy)]
pub(super) struct Timing {
    pub(super) tick0: u64,
    pub(super) ns_per_tick: f64,
    pub(super) offset_ns: i64,
}

impl Timing {
    pub(super) fn to_ns(self, tick: u64) -> i64 {
        let dt = tick.wrapping_sub(self.tick0) as i64;
        if self.ns_per_tick == 1.0 {
            dt.wrapping_add(self.offset_ns)
        } else {
            (dt as f64 * self.ns_per_tick).round() as i64 + self.offset_ns
        }
    }
}
