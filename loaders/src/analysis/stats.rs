//! Whole-trace statistics: what `allocview stats` prints. Computed in one pass over the
//! contiguous columns.

use std::collections::BTreeMap;

use allocview_sim::trace::{EventKind, NUM_SIZE_CLASSES, TraceView};

use crate::events::LoadSummary;

/// Statistics of a trace. Field meanings match the reference `<name>.stats.json` files: live
/// bytes are the sum of the requested sizes of allocations not yet freed, and a size's class is
/// its bit length. Class counts and bytes are over successful allocations.
/// Serialized as `stats --json` prints it (its keys in this order).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TraceStats {
    pub events: u64,
    pub mallocs: u64,
    pub frees: u64,
    pub frees_null: u64,
    /// Frees of pointers never allocated in the trace, where none was expected.
    pub frees_unknown: u64,
    /// Of a trace recorded from the middle of a run (`started_mid_run`), frees of blocks
    /// allocated before recording started: expected, not errors (nor in `frees_unknown`).
    pub frees_before_recording: u64,
    pub mallocs_failed: u64,
    pub mallocs_of_live_ptr: u64,
    pub mallocs_size_zero: u64,
    pub bad_lines: u64,
    pub threads: u64,
    /// Events per thread, in thread-index order (first appearance).
    pub events_per_thread: Vec<u64>,
    pub duration_s: f64,
    pub timestamps_non_monotonic: u64,
    pub malloc_bytes_total: u64,
    pub malloc_size_min: u64,
    pub malloc_size_max: u64,
    pub malloc_size_mean: f64,
    pub peak_live_bytes: u64,
    /// 0-based event (row) index where the peak is first reached.
    pub peak_live_event: u64,
    pub peak_live_time_s: f64,
    pub peak_live_blocks_at_peak_bytes: u64,
    pub max_live_blocks: u64,
    pub final_live_bytes: u64,
    pub final_live_blocks: u64,
    /// Class -> number of successful allocations.
    pub size_classes: BTreeMap<u8, u64>,
    /// Class -> bytes requested by successful allocations.
    pub bytes_by_class: BTreeMap<u8, u64>,
    /// Class -> (live allocations, live bytes) at the end of the trace.
    #[serde(skip)]
    pub final_live_by_class: BTreeMap<u8, (u64, u64)>,
}

impl TraceStats {
    /// Computes the statistics of a validated trace. `events_per_thread` comes from
    /// [`events_per_thread`], `summary` is the loader's counts.
    #[must_use]
    pub fn compute(
        view: &TraceView<'_>,
        events_per_thread: Vec<u64>,
        summary: &LoadSummary,
    ) -> Self {
        let mut acc = StatsAccumulator::default();
        acc.push_all(view.t_ns, view.kind, view.size_bytes);
        acc.finish(events_per_thread, summary)
    }
}

/// [`TraceStats`] computed over events that come in batches (a trace streamed from its file),
/// in one pass with constant memory.
#[derive(Clone, Debug)]
pub struct StatsAccumulator {
    events: u64,
    live_bytes: u64,
    live_blocks: u64,
    peak_live_bytes: u64,
    peak_event: u64,
    peak_t_ns: i64,
    peak_blocks: u64,
    max_blocks: u64,
    class_count: [u64; NUM_SIZE_CLASSES],
    class_bytes: [u64; NUM_SIZE_CLASSES],
    live_class_count: [u64; NUM_SIZE_CLASSES],
    live_class_bytes: [u64; NUM_SIZE_CLASSES],
    total: u64,
    min: u64,
    max: u64,
    allocs: u64,
    t_first_ns: Option<i64>,
    t_last_ns: i64,
}

impl Default for StatsAccumulator {
    fn default() -> Self {
        Self {
            events: 0,
            live_bytes: 0,
            live_blocks: 0,
            peak_live_bytes: 0,
            peak_event: 0,
            peak_t_ns: 0,
            peak_blocks: 0,
            max_blocks: 0,
            class_count: [0; NUM_SIZE_CLASSES],
            class_bytes: [0; NUM_SIZE_CLASSES],
            live_class_count: [0; NUM_SIZE_CLASSES],
            live_class_bytes: [0; NUM_SIZE_CLASSES],
            total: 0,
            min: u64::MAX,
            max: 0,
            allocs: 0,
            t_first_ns: None,
            t_last_ns: 0,
        }
    }
}

impl StatsAccumulator {
    /// Counts the next events (columns of equal length, in trace order).
    pub fn push_all(&mut self, t_ns: &[i64], kind: &[u8], size_bytes: &[u64]) {
        if let (None, Some(&t)) = (self.t_first_ns, t_ns.first()) {
            self.t_first_ns = Some(t);
        }
        if let Some(&t) = t_ns.last() {
            self.t_last_ns = t;
        }
        for ((&kind, &size), &t) in kind.iter().zip(size_bytes).zip(t_ns) {
            self.push(kind, size, t);
        }
    }

    #[inline]
    fn push(&mut self, kind: u8, size: u64, t_ns: i64) {
        let class = usize::from(allocview_sim::trace::size_class(size));
        match EventKind::from_code(kind) {
            Some(EventKind::Alloc) => {
                self.live_bytes += size;
                self.live_blocks += 1;
                self.allocs += 1;
                self.total += size;
                self.min = self.min.min(size);
                self.max = self.max.max(size);
                for table in [&mut self.class_count, &mut self.live_class_count] {
                    if let Some(c) = table.get_mut(class) {
                        *c += 1;
                    }
                }
                for table in [&mut self.class_bytes, &mut self.live_class_bytes] {
                    if let Some(c) = table.get_mut(class) {
                        *c += size;
                    }
                }
                if self.live_bytes > self.peak_live_bytes {
                    self.peak_live_bytes = self.live_bytes;
                    self.peak_event = self.events;
                    self.peak_t_ns = t_ns;
                    self.peak_blocks = self.live_blocks;
                }
                self.max_blocks = self.max_blocks.max(self.live_blocks);
            }
            Some(EventKind::Free) => {
                self.live_bytes -= size;
                self.live_blocks -= 1;
                if let Some(c) = self.live_class_count.get_mut(class) {
                    *c -= 1;
                }
                if let Some(c) = self.live_class_bytes.get_mut(class) {
                    *c -= size;
                }
            }
            _ => {}
        }
        self.events += 1;
    }

    /// The statistics of the events pushed. `events_per_thread` and `summary` as for
    /// [`TraceStats::compute`].
    #[must_use]
    pub fn finish(self, events_per_thread: Vec<u64>, summary: &LoadSummary) -> TraceStats {
        let to_map = |a: &[u64; NUM_SIZE_CLASSES]| -> BTreeMap<u8, u64> {
            (0u8..)
                .zip(a.iter())
                .filter(|&(_, &v)| v > 0)
                .map(|(c, &v)| (c, v))
                .collect()
        };
        let final_live_by_class = (0u8..)
            .zip(self.live_class_count.iter().zip(&self.live_class_bytes))
            .filter(|&(_, (&n, _))| n > 0)
            .map(|(c, (&n, &b))| (c, (n, b)))
            .collect();
        let t0 = self.t_first_ns.unwrap_or(0);
        let secs = |ns: i64| ns as f64 / 1e9;
        let allocs = self.allocs;
        TraceStats {
            events: self.events,
            mallocs: summary.mallocs,
            frees: summary.frees,
            frees_null: summary.frees_null,
            frees_unknown: summary.frees_unknown,
            frees_before_recording: summary.frees_before_recording,
            mallocs_failed: summary.mallocs_failed,
            mallocs_of_live_ptr: summary.mallocs_of_live_ptr,
            mallocs_size_zero: summary.mallocs_size_zero,
            bad_lines: summary.bad_lines,
            threads: events_per_thread.len() as u64,
            events_per_thread,
            duration_s: secs(self.t_last_ns - t0),
            timestamps_non_monotonic: summary.timestamps_non_monotonic,
            malloc_bytes_total: self.total,
            malloc_size_min: if allocs == 0 { 0 } else { self.min },
            malloc_size_max: self.max,
            malloc_size_mean: if allocs == 0 {
                0.0
            } else {
                self.total as f64 / allocs as f64
            },
            peak_live_bytes: self.peak_live_bytes,
            peak_live_event: self.peak_event,
            peak_live_time_s: if self.peak_live_bytes == 0 {
                0.0
            } else {
                secs(self.peak_t_ns - t0)
            },
            peak_live_blocks_at_peak_bytes: self.peak_blocks,
            max_live_blocks: self.max_blocks,
            final_live_bytes: self.live_bytes,
            final_live_blocks: self.live_blocks,
            size_classes: to_map(&self.class_count),
            bytes_by_class: to_map(&self.class_bytes),
            final_live_by_class,
        }
    }
}

/// The `thread` column (UInt8 or UInt16) widened to one `u16` per event, for consumers that
/// walk the events per thread (`allocview predict`).
///
/// # Errors
/// When the column is missing, of another type, or not one contiguous chunk.
pub fn thread_indices(
    events: &polars::prelude::DataFrame,
) -> Result<Vec<u16>, polars::prelude::PolarsError> {
    let col = events.column("thread")?;
    if col.dtype() == &polars::prelude::DataType::UInt8 {
        Ok(col
            .u8()?
            .cont_slice()?
            .iter()
            .map(|&t| u16::from(t))
            .collect())
    } else {
        Ok(col.u16()?.cont_slice()?.to_vec())
    }
}

/// Events per thread index, counted straight from the `thread` column (UInt8 or UInt16)
/// without widening a copy of it: a copy would cost two bytes an event at the peak.
///
/// # Errors
/// When the column is missing, of another type, or not one contiguous chunk.
pub fn events_per_thread(
    events: &polars::prelude::DataFrame,
    n_threads: usize,
) -> Result<Vec<u64>, polars::prelude::PolarsError> {
    let col = events.column("thread")?;
    let mut counts = vec![0u64; n_threads];
    let mut add = |t: usize| {
        if let Some(c) = counts.get_mut(t) {
            *c += 1;
        }
    };
    if col.dtype() == &polars::prelude::DataType::UInt8 {
        col.u8()?
            .cont_slice()?
            .iter()
            .for_each(|&t| add(usize::from(t)));
    } else {
        col.u16()?
            .cont_slice()?
            .iter()
            .for_each(|&t| add(usize::from(t)));
    }
    Ok(counts)
}

/// The figures `allocview record` reports of a trace it writes, counted from the records on
/// their way into the file (so the trace need not be read back): the loader's pairing of
/// frees with allocations, and [`TraceStats`]' live-byte figures, over the same events.
#[derive(Default)]
pub struct RecordingStats {
    pairing: crate::events::Pairing,
    summary: LoadSummary,
    tids: crate::events::PtrSet,
    last_tid: Option<u64>,
    events: u64,
    live_bytes: u64,
    peak_live_bytes: u64,
    peak_t_ns: i64,
    first_t_ns: Option<i64>,
}

/// What [`RecordingStats`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordingSummary {
    /// Events as loaded (a missed free the loader adds counts).
    pub events: u64,
    pub threads: u64,
    pub peak_live_bytes: u64,
    /// Seconds from the first event to the one that first reached the peak.
    pub peak_live_time_s: f64,
    pub final_live_bytes: u64,
    /// The loader's counts, for its warnings.
    pub summary: LoadSummary,
}

impl RecordingStats {
    /// Counts as for a recording that began in the middle of the run (META
    /// `started_mid_run=1`): frees of blocks it never saw allocated are expected.
    pub fn mark_started_mid_run(&mut self) {
        self.summary.mark_started_mid_run();
    }

    /// Counts one record, as the binary loader would take it.
    ///
    /// # Errors
    /// When the loader would refuse the record (more allocations than it numbers).
    pub fn push(&mut self, r: &crate::events::Record) -> Result<(), &'static str> {
        if self.last_tid != Some(r.tid) {
            self.last_tid = Some(r.tid);
            self.tids.insert(r.tid);
        }
        // What the program asked for, as the loader reads by default.
        let Some(line) = crate::events::Line::of_record(
            r,
            crate::events::Requests::Objects,
            0,
            &mut self.summary,
        ) else {
            return Ok(());
        };
        let p = self.pairing.pair_line(&mut self.summary, &line)?;
        self.first_t_ns.get_or_insert(p.t_ns);
        if let Some((_, old_size, _)) = p.displaced {
            self.live_bytes -= old_size;
            self.events += 1;
        }
        match p.kind {
            EventKind::Alloc => {
                self.live_bytes += p.size;
                if self.live_bytes > self.peak_live_bytes {
                    self.peak_live_bytes = self.live_bytes;
                    self.peak_t_ns = p.t_ns;
                }
            }
            EventKind::Free => self.live_bytes -= p.size,
            _ => {}
        }
        self.events += 1;
        Ok(())
    }

    #[must_use]
    pub fn finish(self) -> RecordingSummary {
        let mut summary = self.summary;
        summary.events = self.events;
        RecordingSummary {
            events: self.events,
            threads: self.tids.len() as u64,
            peak_live_bytes: self.peak_live_bytes,
            peak_live_time_s: if self.peak_live_bytes == 0 {
                0.0
            } else {
                (self.peak_t_ns - self.first_t_ns.unwrap_or(0)) as f64 / 1e9
            },
            final_live_bytes: self.live_bytes,
            summary,
        }
    }
}
