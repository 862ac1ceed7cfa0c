//! The recorded program's own memory (`record` samples its resident set every 10 ms,
//! [`allocview_loaders::binary::memory`]): its peak beside the trace's peak of live bytes, for
//! `stats` and `compare`. Measured in the program, not modelled.

use std::path::Path;

use allocview_loaders::Loaded;
use allocview_loaders::binary::MemorySample;
use serde::Serialize;

/// What the samples say.
#[derive(Clone, Debug, Serialize)]
pub struct RecordedMemory {
    pub samples: usize,
    /// The largest resident set sampled, and when (seconds on the trace's time axis).
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
    pub measured: &'static str,
}

impl RecordedMemory {
    /// The figures of `samples` (in time order), the peak of live bytes at `peak_live_t_ns`;
    /// `None` without samples.
    #[must_use]
    pub fn of(samples: &[MemorySample], peak_live_t_ns: Option<i64>) -> Option<Self> {
        let first = samples.first()?;
        let last = samples.last()?;
        let peak = samples.iter().max_by_key(|s| s.resident_bytes)?;
        let near_peak_live = peak_live_t_ns.and_then(|t| {
            samples
                .iter()
                .min_by_key(|s| s.t_ns.abs_diff(t))
                .map(|s| s.anon_bytes)
        });
        Some(Self {
            samples: samples.len(),
            peak_rss_bytes: peak.resident_bytes,
            peak_rss_t_s: peak.t_ns as f64 / 1e9,
            peak_anon_bytes: samples.iter().map(|s| s.anon_bytes).max().unwrap_or(0),
            first_anon_bytes: first.anon_bytes,
            anon_at_peak_live_bytes: near_peak_live,
            final_rss_bytes: last.resident_bytes,
            final_anon_bytes: last.anon_bytes,
            measured: "the recorded process's resident memory (/proc/self/statm), sampled by \
                       record's clock thread about every 10 ms: a measurement, not a model",
        })
    }

    /// The anonymous memory the program grew by at its peak: what an allocator's footprint is
    /// compared with (it also holds what the program mapped outside the allocator, and its
    /// threads' stacks).
    #[must_use]
    pub fn anon_growth_bytes(&self) -> u64 {
        self.peak_anon_bytes.saturating_sub(self.first_anon_bytes)
    }
}

/// The memory samples of `loaded` (a trace made by `record`; none for other inputs).
#[must_use]
pub fn samples_of(loaded: &Loaded) -> &[MemorySample] {
    match loaded {
        Loaded::MallocTrace(t) => &t.memory,
        _ => &[],
    }
}

/// The memory samples of the binary trace at `path`, read without its events (a streamed
/// command); none when it has none. A damaged MEMORY frame is said on stderr, and the command
/// goes on without the samples (the events are whole).
#[must_use]
pub fn samples_in_file(path: &Path) -> Vec<MemorySample> {
    match allocview_loaders::binary::read_memory(path) {
        Ok(samples) => samples,
        Err(e) => {
            eprintln!("warning: {e}: the program's memory samples are left out");
            Vec::new()
        }
    }
}
