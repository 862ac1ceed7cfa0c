//! A spool being read: the frames met so far, their segments gathered into one stream per
//! thread buffer, and the merge of the streams' events, emitted up to a time bound (while
//! the tracer still writes the file) or to the end.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::super::codec::Cursor;
use super::super::frames::parse_meta;
use super::super::stacks::{self, NativeModule, NativeStacks, Placer};
use super::super::{BinaryInfo, FRAME_META, FRAME_SEGMENT, FileKind, TimeBase, corrupt};
use super::merge::{Merge, Out, Timing};
use super::{FRAME_FLUSHED, FRAME_MODULE, SpoolEncoding, Stream, meta_i64};
use crate::error::LoadError;
use crate::events::{PtrSet, Record};

pub(super) struct SpoolState<'a> {
    path: PathBuf,
    base: TimeBase,
    info: BinaryInfo,
    modules: Vec<NativeModule>,
    /// The stack definitions met so far, placed in the modules.
    placer: Placer,
    streams: Vec<Stream<'a>>,
    by_id: HashMap<u32, usize>,
    /// The latest calibration point (tick, `CLOCK_MONOTONIC` ns) of the segment headers.
    calib_last: Option<(u64, i64)>,
    /// The times of the last two flush marks ([`FRAME_FLUSHED`]), the latest second.
    flushed: [Option<u64>; 2],
    /// The program's memory samples as read: `(tick, resident bytes, anonymous bytes)`.
    memory: Vec<(u64, u64, u64)>,
    /// The program's mapping calls as read, with their ticks.
    mappings: Vec<(u64, crate::binary::Mapping)>,
    /// The run's marks as read: `(tick, kind, name)`.
    marks: Vec<(u64, crate::binary::MarkKind, String)>,
    merge: Merge,
}

impl<'a> SpoolState<'a> {
    pub(super) fn new(path: &Path, base: TimeBase) -> Self {
        Self {
            path: path.to_path_buf(),
            base,
            info: BinaryInfo::empty(FileKind::Spool),
            modules: Vec::new(),
            placer: Placer::default(),
            streams: Vec::new(),
            by_id: HashMap::new(),
            calib_last: None,
            flushed: [None, None],
            memory: Vec::new(),
            mappings: Vec::new(),
            marks: Vec::new(),
            merge: Merge::new(),
        }
    }

    /// This state reads a spool the tracer still writes (see [`Merge::may_drop_live`]).
    pub(super) fn reading_live(&mut self) {
        self.merge.may_drop_live = true;
    }

    /// The live reading no longer keeps the live pointers.
    #[cfg(test)]
    pub(super) fn live_dropped(&self) -> bool {
        self.merge.live_dropped
    }

    pub(super) fn meta(&self) -> &[(String, String)] {
        &self.info.meta
    }

    /// Modules that a stack read since the last call uses and no earlier one did.
    pub(super) fn new_modules_in_use(&mut self) -> Vec<NativeModule> {
        self.place_stacks(false);
        let new = self.placer.take_newly_used();
        let placed = self.placer.stacks();
        new.into_iter()
            .filter_map(|m| placed.modules.get(m as usize).cloned())
            .collect()
    }

    /// The call stacks of the events read so far, as placed; `None` for a spool without
    /// stacks (or whose header is not read yet).
    pub(super) fn stacks_so_far(&mut self) -> Option<&NativeStacks> {
        if self.encoding().ok() != Some(SpoolEncoding::Stacked) {
            return None;
        }
        self.place_stacks(false);
        Some(self.placer.stacks())
    }

    /// Places the stack definitions met since the last call (see `stacks::Placer`): all
    /// when `last`, else those whose modules and Python codes are read.
    fn place_stacks(&mut self, last: bool) {
        self.placer.take_modules(&self.modules);
        // Every stream's codes first: a code object is named once, for all threads.
        let codes: Vec<_> = self
            .streams
            .iter_mut()
            .flat_map(|s| s.codes.drain(..))
            .collect();
        self.placer.take_codes(codes);
        let defs: Vec<_> = self
            .streams
            .iter_mut()
            .flat_map(|s| s.defs.drain(..))
            .collect();
        self.placer.place(defs, last);
    }

    /// Takes in one frame (`at`: its file offset, for errors).
    pub(super) fn frame(
        &mut self,
        tag: u8,
        payload: Cow<'a, [u8]>,
        at: u64,
    ) -> Result<(), LoadError> {
        match tag {
            FRAME_META => self.info.meta.extend(parse_meta(&payload)),
            FRAME_MODULE => {
                let m = stacks::read_module_frame(&payload)
                    .ok_or_else(|| corrupt(&self.path, at, "a module frame"))?;
                self.modules.push(m);
            }
            FRAME_FLUSHED => {
                let tick = Cursor::new(&payload)
                    .u64()
                    .ok_or_else(|| corrupt(&self.path, at, "a flush mark"))?;
                self.flushed = [self.flushed[1], Some(tick)];
            }
            FRAME_SEGMENT => self.segment(payload, at)?,
            crate::binary::heaps::SPOOL_FRAME_HEAPS => {
                crate::binary::heaps::decode_spool_name(&payload, &mut self.info.heaps)
                    .ok_or_else(|| corrupt(&self.path, at, "a heap name"))?;
            }
            crate::binary::memory::FRAME_MEMORY_SAMPLE => {
                let sample = crate::binary::memory::decode_spool_sample(&payload)
                    .ok_or_else(|| corrupt(&self.path, at, "a memory sample"))?;
                self.memory.push(sample);
            }
            crate::binary::memory::FRAME_MAPPING => {
                let call = crate::binary::memory::decode_spool_mapping(&payload)
                    .ok_or_else(|| corrupt(&self.path, at, "a mapping call"))?;
                self.mappings.push(call);
            }
            crate::binary::marks::FRAME_MARK => {
                let mark = crate::binary::marks::decode_spool_mark(&payload)
                    .ok_or_else(|| corrupt(&self.path, at, "a mark"))?;
                self.marks.push(mark);
            }
            _ => {}
        }
        Ok(())
    }

    fn segment(&mut self, payload: Cow<'a, [u8]>, at: u64) -> Result<(), LoadError> {
        let mut c = Cursor::new(&payload);
        let (Some(stream), Some(tid), Some(tick), Some(ns)) = (c.u32(), c.u64(), c.u64(), c.u64())
        else {
            return Err(corrupt(&self.path, at, "segment header"));
        };
        let header = c.pos;
        if self.calib_last.is_none_or(|(t, _)| tick > t) {
            self.calib_last = Some((tick, ns as i64));
        }
        let events = match payload {
            Cow::Borrowed(b) => Cow::Borrowed(b.get(header..).unwrap_or(&[])),
            Cow::Owned(mut v) => {
                v.drain(..header.min(v.len()));
                Cow::Owned(v)
            }
        };
        let idx = *self.by_id.entry(stream).or_insert_with(|| {
            self.streams.push(Stream::new(stream, tid));
            self.streams.len() - 1
        });
        if let Some(s) = self.streams.get_mut(idx) {
            s.segments.push_back(super::Segment {
                events,
                modules_before: u32::try_from(self.modules.len()).unwrap_or(u32::MAX),
            });
        }
        Ok(())
    }

    /// The file ends with a cut frame: what was there is read.
    pub(super) fn cut(&mut self, why: String) {
        self.info.truncated = Some(why);
    }

    fn encoding(&self) -> Result<SpoolEncoding, LoadError> {
        match meta_i64(&self.info.meta, "events") {
            None | Some(1) => Ok(SpoolEncoding::Varints),
            Some(2) => Ok(SpoolEncoding::Compact),
            // 5 and 6 are 3 and 4 with streams that may switch back to events without keys
            // (their op is no call code, so the same decoder reads all four).
            Some(3 | 5) => Ok(SpoolEncoding::Keyed),
            Some(4 | 6) => Ok(SpoolEncoding::Stacked),
            Some(_) => Err(LoadError::format(
                &self.path,
                "a spool event encoding this build does not know (written by a newer tracer)",
            )),
        }
    }

    fn tsc(&self) -> bool {
        self.info
            .meta
            .iter()
            .any(|(k, v)| k == "clock" && v == "tsc")
    }

    fn timing(&self) -> Result<Timing, LoadError> {
        let meta = &self.info.meta;
        let path = &self.path;
        let tick0 = meta_i64(meta, "tick0")
            .ok_or_else(|| corrupt(path, 10, "no tick0 in the spool header"))?;
        let mono0 = meta_i64(meta, "mono_ns0").ok_or_else(|| corrupt(path, 10, "no mono_ns0"))?;
        let wall0 =
            meta_i64(meta, "realtime_ns0").ok_or_else(|| corrupt(path, 10, "no realtime_ns0"))?;
        let tick0 = tick0 as u64;
        // Nanoseconds per tick: exactly 1 for a nanosecond clock; for the TSC, the slope from
        // the start to the latest calibration point (short runs fall back to 1 GHz until a
        // point exists).
        let ns_per_tick = match self.calib_last {
            Some((t, ns)) if self.tsc() && t > tick0 => (ns - mono0) as f64 / (t - tick0) as f64,
            _ => 1.0,
        };
        Ok(Timing {
            tick0,
            ns_per_tick,
            offset_ns: wall0 - self.base.realtime_ns.unwrap_or(wall0),
        })
    }

    /// The memory samples read and not taken yet, on the trace's clock, in time order.
    fn take_memory(&mut self) -> Result<Vec<crate::binary::MemorySample>, LoadError> {
        if self.memory.is_empty() {
            return Ok(Vec::new());
        }
        let timing = self.timing()?;
        let mut memory: Vec<crate::binary::MemorySample> = self
            .memory
            .drain(..)
            .map(
                |(tick, resident_bytes, anon_bytes)| crate::binary::MemorySample {
                    t_ns: timing.to_ns(tick),
                    resident_bytes,
                    anon_bytes,
                },
            )
            .collect();
        memory.sort_by_key(|m| m.t_ns);
        Ok(memory)
    }

    /// The marks read and not taken yet, on the trace's clock, in time order.
    fn take_marks(&mut self) -> Result<Vec<crate::binary::Mark>, LoadError> {
        if self.marks.is_empty() {
            return Ok(Vec::new());
        }
        let timing = self.timing()?;
        let mut marks: Vec<crate::binary::Mark> = self
            .marks
            .drain(..)
            .map(|(tick, kind, name)| crate::binary::Mark {
                t_ns: timing.to_ns(tick),
                kind,
                name,
            })
            .collect();
        marks.sort_by_key(|m| m.t_ns);
        Ok(marks)
    }

    /// While the tracer still writes: the memory samples and marks read since the last call
    /// (both written by the clock thread in time order, so each call's follow the last's);
    /// none with a TSC clock, whose tick length is known only at the end. What is taken here
    /// is not in [`Self::finish`]'s tables.
    pub(super) fn take_run_tables_so_far(
        &mut self,
    ) -> Result<(Vec<crate::binary::MemorySample>, Vec<crate::binary::Mark>), LoadError> {
        if self.tsc() {
            return Ok((Vec::new(), Vec::new()));
        }
        Ok((self.take_memory()?, self.take_marks()?))
    }

    /// While the tracer still writes: emits the events every thread has written out for
    /// certain, those before the next-to-last flush mark (the last one leaves a period for
    /// calls that read the time before the mark and wrote their event after it), at most
    /// about `max_records` of them (whole times); returns whether the step stopped there.
    /// Nothing with a TSC clock, whose tick length is known only at the end.
    pub(super) fn emit_written(
        &mut self,
        f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
        max_records: Option<u64>,
    ) -> Result<bool, LoadError> {
        let Some(bound) = self.flushed[0] else {
            return Ok(false);
        };
        // A bound met before still runs the merge: it finds a late event among the new ones.
        if self.tsc() || self.merge.late {
            return Ok(false);
        }
        // The live set is kept from the first event: a second thread may start any time. Once
        // dropped it stays dropped: a new, empty one would merge a shared period against no
        // pointers instead of reporting it.
        if !self.merge.live_dropped {
            self.merge.live.get_or_insert_with(PtrSet::default);
        }
        self.merge.owners_ordered = matches!(meta_i64(&self.info.meta, "events"), Some(5 | 6))
            && self.info.meta_value("order_keys") == Some("tsc");
        self.merge.stop_at = max_records.map(|n| self.merge.records.saturating_add(n));
        let emitted = self.emit(Some(bound), f);
        self.merge.stop_at = None;
        emitted?;
        Ok(self.merge.stopped)
    }

    fn emit(
        &mut self,
        bound: Option<u64>,
        f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
    ) -> Result<(), LoadError> {
        let mut out = Out {
            path: &self.path,
            encoding: self.encoding()?,
            timing: self.timing()?,
            truncated: self.info.truncated.is_some(),
            f,
        };
        self.merge.run(&mut self.streams, bound, &mut out)
    }

    /// An event came in, after the events of its time were emitted, that belongs before
    /// them (a call that read the time long before it wrote its event): this reading is no
    /// good, the file's is.
    pub(super) fn is_late(&self) -> bool {
        self.merge.late
    }

    /// Emits every event left and returns what was read.
    pub(super) fn finish(
        mut self,
        f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
    ) -> Result<BinaryInfo, LoadError> {
        if self.merge.live.is_none() && !self.merge.live_dropped && self.streams.len() > 1 {
            // One thread alone needs no ordering by causality, so no live set either.
            self.merge.live = Some(PtrSet::default());
        }
        self.emit(None, f)?;
        if self.merge.late {
            return Err(LoadError::format(
                &self.path,
                "an event came after the events of its time were emitted (read the whole file \
                 instead)",
            ));
        }
        self.info.records = self.merge.records;
        self.info.memory = self.take_memory()?;
        if !self.mappings.is_empty() {
            let timing = self.timing()?;
            let mut calls: Vec<crate::binary::Mapping> = self
                .mappings
                .iter()
                .map(|&(tick, m)| crate::binary::Mapping {
                    t_ns: timing.to_ns(tick),
                    ..m
                })
                .collect();
            // Stable: calls of one time keep the order they were written in.
            calls.sort_by_key(|m| m.t_ns);
            self.info.mappings = calls;
        }
        self.info.marks = self.take_marks()?;
        if self.encoding()? == SpoolEncoding::Stacked {
            self.place_stacks(true);
            self.info.stacks = Some(std::mem::take(&mut self.placer).finish());
        }
        Ok(self.info)
    }
}
