//! The event table as allocview exports it (Parquet, through the app), with one schema for
//! every input, and [`EventBatcher`], which builds it in batches of bounded size while a trace
//! is read, so that a trace larger than memory can be exported.
//!
//! # The exported event table
//!
//! The loader's event DataFrame (see the crate docs) with a fixed schema, whatever the input:
//!
//! | column | dtype | meaning |
//! |---|---|---|
//! | `t_ns` | Int64 | time in nanoseconds, as in the file (never decreasing) |
//! | `thread` | UInt16 | index into the threads table |
//! | `kind` | UInt8 | 0 `alloc`, 1 `free`, 2 `free_null`, 3 `free_unknown`, 4 `alloc_failed` |
//! | `size_bytes` | UInt64 | requested bytes; for a `free`, the size of the allocation it ends |
//! | `address` | UInt64 | the pointer (0 for NULL) |
//! | `alloc_id` | UInt32, nullable | dense 0-based allocation id; a `free` carries the id it ends |
//! | `size_class` | UInt8 | bit length of `size_bytes` |
//! | `call` | UInt8 | index into [`CALL_NAMES`](crate::events::CALL_NAMES); inputs without call names get 0 (`malloc`) for allocations and 3 (`free`) for frees |
//! | `stack_id` | UInt32, nullable | the allocation's call stack (key of the stacks table); null when none was recorded |
//!
//! Columns particular to an input follow (a PyTorch snapshot's `rounded_bytes`, `pool`,
//! `entry`).

use allocview_sim::trace::EventKind;
use polars::prelude::*;

use crate::events::{Builder, CALL_FREE, CALL_MALLOC, Record, Requests};
use crate::sites::StackTable;

/// The exported columns, first in this order.
pub const EVENT_COLUMNS: [&str; 9] = [
    "t_ns",
    "thread",
    "kind",
    "size_bytes",
    "address",
    "alloc_id",
    "size_class",
    "call",
    "stack_id",
];

/// Pairs a malloc trace's records as the loader does and hands out the exported event table
/// in batches: memory is bounded by the batch and the live allocations, not by the trace.
pub struct EventBatcher {
    builder: Builder,
    requests: Requests,
    /// Which heap's records it reads (0: malloc's).
    heap: u32,
}

impl Default for EventBatcher {
    fn default() -> Self {
        Self {
            builder: Builder::with_capacity(0),
            requests: Requests::default(),
            heap: 0,
        }
    }
}

impl EventBatcher {
    /// Reads the requests `requests` of a trace recorded in a CPython interpreter.
    #[must_use]
    pub fn with_requests(self, requests: Requests) -> Self {
        Self { requests, ..self }
    }

    /// Reads heap `heap`'s records (0, the default: the malloc family's).
    #[must_use]
    pub fn with_heap(self, heap: u32) -> Self {
        Self { heap, ..self }
    }

    /// Pairs and appends one record (times before 0 are clamped to 0, as the loader does).
    ///
    /// # Errors
    /// What the loader would refuse (too many threads or allocations, an unknown call code).
    pub fn push(&mut self, r: &Record) -> Result<(), &'static str> {
        match crate::events::Line::of_record(r, self.requests, self.heap, &mut self.builder.summary)
        {
            Some(line) => self.builder.push(&line),
            None => Ok(()),
        }
    }

    /// Rows appended since the last batch (a displaced allocation adds a free row).
    #[must_use]
    pub fn pending_rows(&self) -> usize {
        self.builder.pending_rows()
    }

    /// The rows appended since the last batch, as exported events.
    ///
    /// # Errors
    /// Only when polars fails to assemble the columns.
    pub fn take_batch(&mut self) -> PolarsResult<DataFrame> {
        self.builder.take_batch()
    }

    /// The threads table so far: `thread` (UInt16) and `tid` (UInt64).
    ///
    /// # Errors
    /// Only when polars fails to assemble the columns.
    pub fn threads(&self) -> PolarsResult<DataFrame> {
        self.builder.threads_frame()
    }

    /// What the pairing counted so far.
    #[must_use]
    pub fn summary(&self) -> &crate::events::LoadSummary {
        &self.builder.summary
    }
}

/// A loaded event table in the exported schema: `thread` widened to UInt16, `call` and
/// `stack_id` added where the input has none, the input's own columns after these.
///
/// # Errors
/// When a standard column is missing or has the wrong dtype.
pub fn export_events(events: &DataFrame) -> PolarsResult<DataFrame> {
    let height = events.height();
    let mut columns: Vec<Column> = Vec::with_capacity(events.width() + 2);
    for name in EVENT_COLUMNS {
        let col = match (name, events.column(name)) {
            ("thread", Ok(c)) => c.cast(&DataType::UInt16)?,
            (_, Ok(c)) => c.clone(),
            ("call", Err(_)) => {
                let kinds = events.column("kind")?.u8()?;
                let calls: Vec<u8> = kinds
                    .into_no_null_iter()
                    .map(|k| {
                        if EventKind::from_code(k).is_some_and(EventKind::is_free) {
                            CALL_FREE
                        } else {
                            CALL_MALLOC
                        }
                    })
                    .collect();
                UInt8Chunked::from_vec("call".into(), calls).into_column()
            }
            ("stack_id", Err(_)) => Column::full_null("stack_id".into(), height, &DataType::UInt32),
            (_, Err(e)) => return Err(e),
        };
        columns.push(col);
    }
    columns.extend(
        events
            .columns()
            .iter()
            .filter(|c| !EVENT_COLUMNS.contains(&c.name().as_str()))
            .cloned(),
    );
    DataFrame::new(height, columns)
}

/// The stacks table keyed by the file's own stack ids (as a streamed export's `stack_id`
/// column carries them): `map` takes a file id to its stack in `table`.
///
/// # Errors
/// Only when polars fails to assemble the columns.
pub fn keyed_stacks_frame(
    table: &StackTable,
    map: &std::collections::HashMap<u32, u32>,
) -> PolarsResult<DataFrame> {
    let mut keys: Vec<(u32, u32)> = map.iter().map(|(&k, &id)| (k, id)).collect();
    keys.sort_unstable();
    table.stacks_frame_keyed(keys.into_iter())
}
