//! The event table of another tool's recording: what every reader of a foreign format
//! (heaptrack, memray, the PyTorch profiler's traces) hands over, built into a
//! [`MallocTrace`] by the same pairing as allocview's own traces.
//!
//! A reader turns its file into [`ForeignEvents`]: calls in recorded order as [`Record`]s
//! (allocations with their size and address, frees with the address they end; a format
//! whose frees name no address gives each allocation an address of its own and its free the
//! same one), the call stacks as a [`StackTable`] that the records' `stack` ids index, and
//! what the reader must tell the user about what the format keeps (an approximation, a field
//! it could not read): [`LoadSummary::notes`]. The pairing, the thread numbering, the
//! loader's limits and its counts are then the same as for every other malloc trace.

use std::path::Path;
use std::time::Instant;

use crate::binary::MemorySample;
use crate::error::LoadError;
use crate::events::{Builder, Line, MallocTrace, Record, RecordedSeries, Strictness};
use crate::sites::{NO_STACK, StackTable, stack_id_column};

/// What a reader of another tool's format read.
#[derive(Default)]
pub struct ForeignEvents {
    /// The calls, in the order they happened (times need not be distinct, and a time that
    /// goes backwards is clamped and counted, as in a text trace).
    pub records: Vec<Record>,
    /// The stacks the records' `stack` ids index (empty when the format has none).
    pub stacks: StackTable,
    /// The program's resident memory over time, where the format recorded it: a
    /// measurement, on the records' time axis.
    pub memory: Vec<MemorySample>,
    /// What the user must know about this input's fidelity, said once on every load.
    pub notes: Vec<String>,
    /// What `memory` measures.
    pub memory_series: RecordedSeries,
}

/// Builds the event table of `events`, read from `path`, and counts what the pairing did.
///
/// # Errors
/// When a record breaks a loader limit (more than 65,536 threads, an unknown call code): in
/// strict mode the error names the record; in lenient mode the records after it are dropped
/// and the load is marked truncated.
pub fn into_trace(
    path: &Path,
    events: ForeignEvents,
    strictness: Strictness,
    started: Instant,
) -> Result<MallocTrace, LoadError> {
    let ForeignEvents {
        records,
        stacks,
        memory,
        notes,
        memory_series,
    } = events;
    let mut b = Builder::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        let line = Line {
            t_ns: r.t_ns.max(0),
            tid: r.tid,
            size_bytes: r.size_bytes,
            addr: r.addr,
            call: r.call,
            stack: r.stack.filter(|&s| s != NO_STACK),
            python: false,
        };
        if let Err(limit) = b.push(&line) {
            let msg = format!("call {i} of the file breaks a loader limit: expected {limit}");
            match strictness {
                Strictness::Strict => return Err(LoadError::format(path, msg)),
                Strictness::Lenient => {
                    b.summary.truncated = Some(msg);
                    break;
                }
            }
        }
    }
    b.summary.notes = notes;
    let ids = b.take_stacks();
    let (mut events_frame, threads, summary) = b.finish()?;
    let stacks = match ids {
        Some(ids) if stacks.num_stacks() > 0 => {
            events_frame
                .with_column(stack_id_column("stack_id", ids))
                .map_err(|e| LoadError::format(path, e.to_string()))?;
            Some(stacks)
        }
        _ => None,
    };
    Ok(MallocTrace {
        events: events_frame,
        threads,
        summary,
        load_seconds: started.elapsed().as_secs_f64(),
        stacks,
        memory,
        memory_series,
        mappings: Vec::new(),
        marks: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sites::Frame;

    fn record(t_ns: i64, size: Option<u64>, addr: u64, stack: Option<u32>) -> Record {
        Record {
            t_ns,
            tid: 7,
            size_bytes: size,
            addr,
            call: None,
            stack,
            heap: 0,
        }
    }

    #[test]
    fn records_pair_by_address_and_keep_their_stacks_and_notes() {
        let mut stacks = StackTable::new();
        let f = stacks.intern_frame(Frame {
            function: "make_buffer".into(),
            file: "a.c".into(),
            line: 3,
            module: String::new(),
        });
        let s = stacks.intern_stack(vec![f]);
        let events = ForeignEvents {
            records: vec![
                record(0, Some(100), 0x1000, Some(s)),
                record(5, Some(50), 0x2000, None),
                record(9, None, 0x1000, None),
            ],
            stacks,
            memory: Vec::new(),
            notes: vec!["lifetimes are approximate".into()],
            memory_series: RecordedSeries::ProcessResident,
        };
        let t = into_trace(Path::new("x"), events, Strictness::Strict, Instant::now()).unwrap();
        assert_eq!(t.events.height(), 3);
        assert_eq!(t.summary.mallocs, 2);
        assert_eq!(t.summary.frees, 1);
        let ids: Vec<Option<u32>> = t.events["alloc_id"].u32().unwrap().iter().collect();
        assert_eq!(ids, [Some(0), Some(1), Some(0)]);
        let st: Vec<Option<u32>> = t.events["stack_id"].u32().unwrap().iter().collect();
        assert_eq!(st, [Some(s), None, None]);
        assert!(t.stacks.is_some());
        assert!(
            t.summary
                .warnings()
                .iter()
                .any(|w| w.contains("lifetimes are approximate"))
        );
    }
}
