//! Pairing the chosen allocator's records into events ([`Builder`]), and the events as
//! DataFrames.

use std::collections::HashMap;

use allocview_sim::trace::{EventKind, NO_ALLOC_ID, size_class};
use polars::prelude::*;
use polars_arrow::bitmap::MutableBitmap;

use super::lines::Item;
use super::{
    LogRecord, MemInfo, MemlogSummary, ParseError, RecordKind, RegionGrowth, TensorOutput,
};
use crate::tf::dump::{col_u64, df_from};
use crate::tf::human::ByteCount;

/// A live allocation while pairing.
#[derive(Clone, Copy)]
struct Live {
    alloc_id: u32,
    ptr: u64,
    requested: u64,
    allocated: Option<u64>,
}

/// The chosen allocator's records being paired into events, with the regions, `MEMINFO` lines
/// and revealed outputs placed among them.
pub(super) struct Builder {
    allocator: String,
    pub(super) summary: MemlogSummary,
    pub(super) records: Vec<LogRecord>,
    pub(super) outputs: Vec<TensorOutput>,
    pub(super) regions: Vec<RegionGrowth>,
    pub(super) meminfo: Vec<MemInfo>,
    live: HashMap<i64, Live>,
    ever_allocated: HashMap<i64, ()>,
    revealed: HashMap<i64, (u64, u64)>,
    tids: HashMap<u64, u16>,
    tid_order: Vec<u64>,
    next_alloc_id: u32,
    prev_t_ns: i64,
    pending_extend: Option<(Option<ByteCount>, String)>,
}

impl Builder {
    pub(super) fn new(allocator: String, summary: MemlogSummary) -> Self {
        Self {
            allocator,
            summary,
            records: Vec::new(),
            outputs: Vec::new(),
            regions: Vec::new(),
            meminfo: Vec::new(),
            live: HashMap::new(),
            ever_allocated: HashMap::new(),
            revealed: HashMap::new(),
            tids: HashMap::new(),
            tid_order: Vec::new(),
            next_alloc_id: 0,
            prev_t_ns: i64::MIN,
            pending_extend: None,
        }
    }

    fn thread(&mut self, tid: Option<u64>) -> Result<u16, ParseError> {
        let tid = tid.unwrap_or(0);
        if let Some(&t) = self.tids.get(&tid) {
            return Ok(t);
        }
        let t = u16::try_from(self.tid_order.len())
            .map_err(|_| ParseError::Format("more than 65536 threads".into()))?;
        self.tids.insert(tid, t);
        self.tid_order.push(tid);
        Ok(t)
    }

    fn time(&mut self, t_ns: Option<i64>, line: u64) -> i64 {
        // Without a timestamp the line index orders the events.
        let t = t_ns.unwrap_or(i64::try_from(line).unwrap_or(i64::MAX));
        if t < self.prev_t_ns {
            self.summary.timestamps_non_monotonic += 1;
            return self.prev_t_ns;
        }
        self.prev_t_ns = t;
        t
    }

    pub(super) fn push(
        &mut self,
        line: u64,
        t_ns: Option<i64>,
        tid: Option<u64>,
        item: Item,
        chosen: usize,
        chosen_name: &str,
    ) -> Result<(), ParseError> {
        let events_before = self.records.len();
        match item {
            Item::Record(record, d) => {
                if d.allocator != chosen {
                    return Ok(());
                }
                let thread = self.thread(tid)?;
                let t = self.time(t_ns, line);
                self.pair(LogRecord {
                    record,
                    kind: EventKind::Alloc,
                    line,
                    t_ns: t,
                    thread,
                    tf_alloc_id: d.tf_id,
                    alloc_id: NO_ALLOC_ID,
                    ptr: d.ptr,
                    requested_bytes: d.requested,
                    allocated_bytes: d.allocated,
                    step: d.step,
                    kernel: d.kernel,
                })?;
            }
            Item::Output(d) => {
                if d.allocator == chosen {
                    self.reveal(TensorOutput {
                        line,
                        tf_alloc_id: d.tf_id,
                        ptr: d.ptr,
                        requested_bytes: d.requested,
                        allocated_bytes: d.allocated,
                        kernel: d.kernel,
                        step: d.step,
                        thread: self.tids.get(&tid.unwrap_or(0)).copied(),
                        events_before,
                    });
                }
            }
            Item::Extend { by, allocator } => self.pending_extend = Some((by, allocator)),
            Item::Region { base, end } => self.region(line, base, end, events_before, chosen_name),
            Item::MemInfo { tag, current, peak } => self.meminfo(MemInfo {
                line,
                tag,
                current_bytes: current,
                peak_bytes: peak,
                events_before,
            }),
            Item::Oom {
                rounded,
                allocator,
                op,
            } => {
                if allocator.as_deref().is_none_or(|a| a == chosen_name) {
                    self.oom(line, t_ns, tid, rounded, op)?;
                }
            }
        }
        Ok(())
    }

    /// Pairs a record of the chosen allocator (its `kind` still `Alloc`) with the allocation
    /// it ends, or makes it live, and keeps it.
    fn pair(&mut self, mut rec: LogRecord) -> Result<(), ParseError> {
        let tf_id = rec.tf_alloc_id;
        if rec.record.is_allocation() {
            if let Some(old) = self.live.remove(&tf_id) {
                self.summary.duplicate_allocation_ids += 1;
                self.records.push(LogRecord {
                    record: RecordKind::TensorDeallocation,
                    kind: EventKind::Free,
                    alloc_id: old.alloc_id,
                    ptr: old.ptr,
                    requested_bytes: old.requested,
                    allocated_bytes: old.allocated,
                    step: None,
                    kernel: None,
                    ..rec.clone()
                });
            }
            let id = self.next_alloc_id;
            if id == NO_ALLOC_ID - 1 {
                return Err(ParseError::Format("too many allocations".into()));
            }
            self.next_alloc_id += 1;
            self.live.insert(
                tf_id,
                Live {
                    alloc_id: id,
                    ptr: rec.ptr,
                    requested: rec.requested_bytes,
                    allocated: rec.allocated_bytes,
                },
            );
            self.ever_allocated.insert(tf_id, ());
            rec.alloc_id = id;
        } else if let Some(l) = self.live.remove(&tf_id) {
            rec.kind = EventKind::Free;
            rec.alloc_id = l.alloc_id;
            rec.ptr = l.ptr;
            rec.requested_bytes = l.requested;
            rec.allocated_bytes = l.allocated;
        } else {
            self.summary.frees_unknown += 1;
            rec.kind = EventKind::FreeUnknown;
            if let Some(&(p, r)) = self.revealed.get(&tf_id) {
                rec.ptr = p;
                rec.requested_bytes = r;
            }
        }
        self.records.push(rec);
        Ok(())
    }

    /// Keeps a tensor output of the chosen allocator when it is the first sign of an
    /// allocation the log never showed.
    fn reveal(&mut self, out: TensorOutput) {
        if self.ever_allocated.contains_key(&out.tf_alloc_id) {
            return;
        }
        if self
            .revealed
            .insert(out.tf_alloc_id, (out.ptr, out.requested_bytes))
            .is_none()
        {
            self.outputs.push(out);
        }
    }

    /// A region the BFC added, with the `Extending allocation by` line before it; kept unless
    /// that line names another allocator.
    fn region(&mut self, line: u64, base: u64, end: u64, events_before: usize, chosen_name: &str) {
        let (extend_by, allocator) = match self.pending_extend.take() {
            Some((by, a)) => (by, Some(a)),
            None => (None, None),
        };
        if allocator.as_deref().is_none_or(|a| a == chosen_name) {
            self.regions.push(RegionGrowth {
                line,
                base,
                size_bytes: end - base,
                extend_by,
                allocator,
                events_before,
            });
        }
    }

    /// Keeps a `MEMINFO` line unless it repeats the one before (the workload prints each to
    /// stdout and stderr).
    fn meminfo(&mut self, info: MemInfo) {
        let dup = self.meminfo.last().is_some_and(|m| {
            m.tag == info.tag
                && m.current_bytes == info.current_bytes
                && m.peak_bytes == info.peak_bytes
                && m.events_before == info.events_before
        });
        if !dup {
            self.meminfo.push(info);
        }
    }

    /// The failed request of a dump's OOM header, as an `alloc_failed` event.
    fn oom(
        &mut self,
        line: u64,
        t_ns: Option<i64>,
        tid: Option<u64>,
        rounded: u64,
        op: Option<String>,
    ) -> Result<(), ParseError> {
        let thread = self.thread(tid)?;
        let t = self.time(t_ns, line);
        self.records.push(LogRecord {
            record: RecordKind::OomRequest,
            kind: EventKind::AllocFailed,
            line,
            t_ns: t,
            thread,
            tf_alloc_id: 0,
            alloc_id: NO_ALLOC_ID,
            ptr: 0,
            requested_bytes: rounded,
            allocated_bytes: None,
            step: None,
            kernel: op,
        });
        Ok(())
    }

    pub(super) fn frames(&self) -> Result<(DataFrame, DataFrame), ParseError> {
        let r = &self.records;
        let n = r.len();
        let alloc_ids: Vec<u32> = r.iter().map(|x| x.alloc_id).collect();
        let alloc_id = if alloc_ids.contains(&NO_ALLOC_ID) {
            let mut validity = MutableBitmap::with_capacity(n);
            for &id in &alloc_ids {
                validity.push(id != NO_ALLOC_ID);
            }
            UInt32Chunked::from_vec_validity("alloc_id".into(), alloc_ids, Some(validity.into()))
        } else {
            UInt32Chunked::from_vec("alloc_id".into(), alloc_ids)
        };
        let size: Vec<u64> = r
            .iter()
            .map(|x| match x.kind {
                EventKind::Alloc | EventKind::Free | EventKind::AllocFailed => x.requested_bytes,
                _ => 0,
            })
            .collect();
        let thread = if self.tid_order.len() <= 256 {
            UInt8Chunked::from_vec(
                "thread".into(),
                r.iter()
                    .map(|x| u8::try_from(x.thread).unwrap_or(u8::MAX))
                    .collect(),
            )
            .into_column()
        } else {
            UInt16Chunked::from_vec("thread".into(), r.iter().map(|x| x.thread).collect())
                .into_column()
        };
        let events = df_from(vec![
            Int64Chunked::from_vec("t_ns".into(), r.iter().map(|x| x.t_ns).collect()).into_column(),
            thread,
            UInt8Chunked::from_vec("kind".into(), r.iter().map(|x| x.kind.code()).collect())
                .into_column(),
            UInt64Chunked::from_vec("size_bytes".into(), size.clone()).into_column(),
            UInt64Chunked::from_vec("address".into(), r.iter().map(|x| x.ptr).collect())
                .into_column(),
            alloc_id.into_column(),
            UInt8Chunked::from_vec(
                "size_class".into(),
                size.iter().map(|&s| size_class(s)).collect(),
            )
            .into_column(),
            UInt8Chunked::from_vec("record".into(), r.iter().map(|x| x.record.code()).collect())
                .into_column(),
            UInt64Chunked::from_vec("line".into(), r.iter().map(|x| x.line).collect())
                .into_column(),
            Column::new("allocator".into(), vec![self.allocator.as_str(); n]),
            Int64Chunked::from_iter_options("step".into(), r.iter().map(|x| x.step)).into_column(),
            StringChunked::from_iter_options(
                "kernel".into(),
                r.iter().map(|x| x.kernel.as_deref()),
            )
            .into_column(),
            UInt64Chunked::from_vec(
                "requested_bytes".into(),
                r.iter().map(|x| x.requested_bytes).collect(),
            )
            .into_column(),
            col_u64(
                "allocated_bytes",
                r.iter().map(|x| x.allocated_bytes).collect(),
            ),
            Int64Chunked::from_iter_options(
                "tf_alloc_id".into(),
                r.iter()
                    .map(|x| (x.record != RecordKind::OomRequest).then_some(x.tf_alloc_id)),
            )
            .into_column(),
        ])?;
        let threads = df_from(vec![
            UInt16Chunked::from_vec(
                "thread".into(),
                (0..self.tid_order.len())
                    .map(|i| u16::try_from(i).unwrap_or(u16::MAX))
                    .collect(),
            )
            .into_column(),
            UInt64Chunked::from_vec("tid".into(), self.tid_order.clone()).into_column(),
        ])?;
        Ok((events, threads))
    }
}
