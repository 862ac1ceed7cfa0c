//! The recorded program's own memory (`record` samples its resident set every 10 ms,
//! [`allocview_loaders::binary::memory`]): its peak beside the trace's peak of live bytes, for
//! `stats` and `compare`. Measured in the program, not modelled.

use std::path::Path;

use allocview_loaders::binary::memory::{MAPPING_FILE_BACKED, mapped_bytes};
use allocview_loaders::binary::{MapCall, Mapping, MemorySample};
use allocview_loaders::{Loaded, RecordedSeries};
use serde::Serialize;

/// What the samples say.
#[derive(Clone, Debug, Serialize)]
pub struct RecordedMemory {
    pub samples: usize,
    /// The largest resident set sampled, and when (seconds since the trace's first event, as
    /// every time `stats` gives).
    pub peak_rss_bytes: u64,
    pub peak_rss_t_s: f64,
    /// The largest anonymous resident set (heap, stacks, private mappings).
    pub peak_anon_bytes: u64,
    /// The anonymous resident set at the first sample: what the program held as the tracer
    /// started (the interpreter, the loader's data, the first allocations).
    pub first_anon_bytes: u64,
    /// The anonymous resident set at the sample closest to the peak of live bytes (when its
    /// time is known).
    pub anon_at_peak_live_bytes: Option<u64>,
    pub final_rss_bytes: u64,
    pub final_anon_bytes: u64,
    /// Calls to `mmap`, `munmap`, `mremap` and the break that the program made outside the
    /// allocator (the C library's allocator maps through entry points no tracer sees).
    pub mapping_calls: usize,
    /// The most anonymous memory (not files) the program had mapped so at once, and at the end.
    pub mapped_outside_allocator_peak_bytes: u64,
    pub mapped_outside_allocator_final_bytes: u64,
    /// The most file-backed memory it had mapped at once.
    pub mapped_files_peak_bytes: u64,
    /// What the samples are: `process_resident` (the program's resident set, sampled by
    /// `record`) or `allocator_reserved` (the bytes PyTorch's caching allocator held reserved
    /// on the device, as a profiler trace recorded them: the `_rss` and `_anon` figures then
    /// both hold it).
    pub series: &'static str,
    pub measured: &'static str,
}

impl RecordedMemory {
    /// The figures of the samples and the mapping calls (each in time order), on the events'
    /// time axis: the first event at `t0_ns`, the peak of live bytes at `peak_live_t_ns`;
    /// `None` without samples.
    #[must_use]
    pub fn of(
        (samples, mappings): (&[MemorySample], &[Mapping]),
        t0_ns: i64,
        peak_live_t_ns: Option<i64>,
    ) -> Option<Self> {
        let first = samples.first()?;
        let last = samples.last()?;
        let peak = samples.iter().max_by_key(|s| s.resident_bytes)?;
        let is_file = |m: &&Mapping| m.call == MapCall::Mmap && m.flags & MAPPING_FILE_BACKED != 0;
        // A `PROT_NONE` mapping reserves addresses that nothing uses until they are made
        // accessible (which is not recorded): it is left out, not counted whole.
        let reserved = |m: &&Mapping| m.call == MapCall::Mmap && m.prot == 0;
        let anon_calls: Vec<Mapping> = mappings
            .iter()
            .filter(|m| !is_file(m) && !reserved(m))
            .copied()
            .collect();
        // Unmaps and remaps count against the files' mappings too: a range never mapped takes
        // nothing away.
        let file_calls: Vec<Mapping> = mappings
            .iter()
            .filter(|m| is_file(m) || m.call != MapCall::Mmap)
            .copied()
            .collect();
        let (anon, files) = (mapped_bytes(&anon_calls), mapped_bytes(&file_calls));
        let peak_of = |v: &[(i64, u64)]| v.iter().map(|p| p.1).max().unwrap_or(0);
        let near_peak_live = peak_live_t_ns.and_then(|t| {
            samples
                .iter()
                .min_by_key(|s| s.t_ns.abs_diff(t))
                .map(|s| s.anon_bytes)
        });
        Some(Self {
            samples: samples.len(),
            peak_rss_bytes: peak.resident_bytes,
            peak_rss_t_s: peak.t_ns.saturating_sub(t0_ns) as f64 / 1e9,
            peak_anon_bytes: samples.iter().map(|s| s.anon_bytes).max().unwrap_or(0),
            first_anon_bytes: first.anon_bytes,
            anon_at_peak_live_bytes: near_peak_live,
            final_rss_bytes: last.resident_bytes,
            final_anon_bytes: last.anon_bytes,
            mapping_calls: mappings.len(),
            mapped_outside_allocator_peak_bytes: peak_of(&anon),
            mapped_outside_allocator_final_bytes: anon.last().map_or(0, |m| m.1),
            mapped_files_peak_bytes: peak_of(&files),
            series: "process_resident",
            measured: "the recorded process's resident memory (/proc/self/statm), sampled by \
                       record's clock thread about every 10 ms: a measurement, not a model",
        })
    }

    /// [`Self::of`] the samples of `loaded`, named for what they measure.
    #[must_use]
    pub fn of_loaded(loaded: &Loaded, t0_ns: i64, peak_live_t_ns: Option<i64>) -> Option<Self> {
        let mut m = Self::of(samples_of(loaded), t0_ns, peak_live_t_ns)?;
        if let Loaded::MallocTrace(t) = loaded {
            match t.memory_series {
                RecordedSeries::AllocatorReserved => {
                    m.series = "allocator_reserved";
                    m.measured = "the bytes PyTorch's caching allocator held reserved on the \
                                  device (Total Reserved), as the profiler recorded them with \
                                  each memory event: a measurement, not a model";
                }
                RecordedSeries::ResidentOnly => {
                    m.series = "resident_only";
                    m.measured = "the recorded process's whole resident set, as the recording \
                                  tool sampled it (heaptrack: every 10 ms): a measurement, not a \
                                  model; its anonymous part and the mappings made outside the \
                                  allocator were not recorded";
                }
                RecordedSeries::ProcessResident => {}
            }
        }
        Some(m)
    }

    /// The samples are an allocator's reserved bytes, not the program's resident set.
    #[must_use]
    pub fn is_reserved(&self) -> bool {
        self.series == "allocator_reserved"
    }

    /// The samples are the whole resident set only: no anonymous part, no mapping calls.
    #[must_use]
    pub fn is_resident_only(&self) -> bool {
        self.series == "resident_only"
    }

    /// The anonymous memory the program grew by at its peak: what an allocator's footprint is
    /// compared with (it also holds what the program mapped outside the allocator, and its
    /// threads' stacks).
    #[must_use]
    pub fn anon_growth_bytes(&self) -> u64 {
        self.peak_anon_bytes.saturating_sub(self.first_anon_bytes)
    }
}

/// The time of the first event of the binary trace at `path` (its first block's), read from
/// its index; 0 when it cannot be read.
#[must_use]
pub fn first_event_t_ns(path: &Path) -> i64 {
    allocview_loaders::binary::read_index(path)
        .ok()
        .and_then(|i| i.blocks.first().map(|b| b.first_t_ns))
        .unwrap_or(0)
}

/// The memory samples and the mapping calls of `loaded` (a trace made by `record`; none for
/// other inputs).
#[must_use]
pub fn samples_of(loaded: &Loaded) -> (&[MemorySample], &[Mapping]) {
    match loaded {
        Loaded::MallocTrace(t) => (&t.memory, &t.mappings),
        _ => (&[], &[]),
    }
}

/// The memory samples of the binary trace at `path`, read without its events (a streamed
/// command); none when it has none. A damaged MEMORY frame is said on stderr, and the command
/// goes on without the samples (the events are whole).
#[must_use]
pub fn samples_in_file(path: &Path) -> (Vec<MemorySample>, Vec<Mapping>) {
    let read = allocview_loaders::binary::read_memory(path)
        .and_then(|s| Ok((s, allocview_loaders::binary::read_mappings(path)?)));
    match read {
        Ok(both) => both,
        Err(e) => {
            eprintln!("warning: {e}: the program's memory samples are left out");
            (Vec::new(), Vec::new())
        }
    }
}
