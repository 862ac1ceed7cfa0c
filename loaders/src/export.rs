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
//! | `call` | UInt8 | index into [`CALL_NAMES`](crate::malloc_trace::CALL_NAMES); inputs without call names get 0 (`malloc`) for allocations and 3 (`free`) for frees |
//! | `stack_id` | UInt32, nullable | the allocation's call stack (key of the stacks table); null when none was recorded |
//!
//! Columns particular to an input follow (a PyTorch snapshot's `rounded_bytes`, `pool`,
//! `entry`).

use allocview_sim::trace::{EventKind, NO_ALLOC_ID};
use polars::prelude::*;

use crate::malloc_trace::{Builder, CALL_FREE, CALL_MALLOC, Record};
use crate::sites::{NO_STACK, StackTable, stack_id_column};

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

/// The columns of a batch of exported events, before they become a DataFrame.
pub(crate) struct EventColumns {
    pub(crate) t_ns: Vec<i64>,
    pub(crate) thread: Vec<u16>,
    pub(crate) kind: Vec<u8>,
    pub(crate) size_bytes: Vec<u64>,
    pub(crate) address: Vec<u64>,
    /// [`NO_ALLOC_ID`] where null.
    pub(crate) alloc_id: Vec<u32>,
    pub(crate) size_class: Vec<u8>,
    pub(crate) call: Vec<u8>,
    /// [`NO_STACK`] where null.
    pub(crate) stack_id: Vec<u32>,
}

impl EventColumns {
    pub(crate) fn into_frame(self) -> PolarsResult<DataFrame> {
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

/// Pairs a malloc trace's records as the loader does and hands out the exported event table
/// in batches: memory is bounded by the batch and the live allocations, not by the trace.
pub struct EventBatcher {
    builder: Builder,
}

impl Default for EventBatcher {
    fn default() -> Self {
        Self {
            builder: Builder::with_capacity(0),
        }
    }
}

impl EventBatcher {
    /// Pairs and appends one record (times before 0 are clamped to 0, as the loader does).
    ///
    /// # Errors
    /// What the loader would refuse (too many threads or allocations, an unknown call code).
    pub fn push(&mut self, r: &Record) -> Result<(), &'static str> {
        self.builder.push(&crate::malloc_trace::Line::of_record(r))
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
    pub fn summary(&self) -> &crate::LoadSummary {
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
