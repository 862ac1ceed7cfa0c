//! What a `pytorch` replay is told besides the trace: the caching allocator's options
//! ([`PytorchSettings`]) and, for a snapshot, its recorded facts ([`PytorchScript`]).

use super::constants::LARGE_BUFFER_BYTES;

/// The caching allocator's options (`PYTORCH_CUDA_ALLOC_CONF`, or a snapshot's
/// `allocator_settings`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PytorchSettings {
    /// None = unlimited (PyTorch's -1 / SIZE_MAX). Must be > 20 MiB when set.
    pub max_split_size_bytes: Option<u64>,
    /// Divisions per power-of-two interval (index = clamp(floor(log2(size)) - 20, 0, 15)); 0 or 1 = off.
    pub roundup_power2_divisions: [u32; 16],
    /// garbage_collection_threshold in millionths (0 = off); only acts when a limit is set (PyTorch's set_fraction).
    pub garbage_collection_threshold_ppm: u32,
    /// Map pages into one growing segment per (stream, pool) instead of cudaMalloc'ing
    /// segments.
    pub expandable_segments: bool,
    /// max_non_split_rounding_size, default 20 MiB.
    pub max_non_split_rounding_bytes: u64,
}

impl Default for PytorchSettings {
    fn default() -> Self {
        Self {
            max_split_size_bytes: None,
            roundup_power2_divisions: [0; 16],
            garbage_collection_threshold_ppm: 0,
            expandable_segments: false,
            max_non_split_rounding_bytes: LARGE_BUFFER_BYTES,
        }
    }
}

impl PytorchSettings {
    /// Checks the options as PyTorch's parser does.
    ///
    /// # Errors
    /// `max_split_size` of 20 MiB or less, `max_non_split_rounding` under 20 MiB, a division
    /// count that is neither 0 nor a power of two, or a GC threshold of 1 or more.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(mss) = self.max_split_size_bytes
            && mss <= LARGE_BUFFER_BYTES
        {
            return Err(format!("max_split_size must be above 20 MiB, got {mss} B"));
        }
        if self.max_non_split_rounding_bytes < LARGE_BUFFER_BYTES {
            return Err(format!(
                "max_non_split_rounding must be at least 20 MiB, got {} B",
                self.max_non_split_rounding_bytes
            ));
        }
        if let Some(d) = self
            .roundup_power2_divisions
            .iter()
            .find(|&&d| d != 0 && !d.is_power_of_two())
        {
            return Err(format!(
                "roundup_power2_divisions must be 0 or powers of two, got {d}"
            ));
        }
        if self.garbage_collection_threshold_ppm >= 1_000_000 {
            return Err(format!(
                "garbage_collection_threshold must be below 1, got {} ppm",
                self.garbage_collection_threshold_ppm
            ));
        }
        Ok(())
    }
}

/// What the trace says about one segment existing at the start of a replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptSegment {
    pub addr: u64,
    pub size_bytes: u64,
    pub small_pool: bool,
    pub stream: u64,
    pub expandable: bool,
}

/// What a segment event did to device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentOpKind {
    /// cudaMalloc (`segment_alloc`).
    Alloc,
    /// cudaFree (`segment_free`).
    Free,
    /// Pages mapped into an expandable segment (`segment_map`).
    Map,
    /// Pages unmapped from an expandable segment (`segment_unmap`).
    Unmap,
}

/// One segment event: its kind and the device range it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentOp {
    pub kind: SegmentOpKind,
    pub addr: u64,
    pub size_bytes: u64,
}

/// A snapshot's recorded facts, so the policy can replay it faithfully (reference section 6).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PytorchScript {
    /// Segments present when the trace starts (rebuilt from the final segments by the loader).
    pub start_segments: Vec<ScriptSegment>,
    /// Recorded address of every allocation, indexed by trace alloc id (the first `carried_in` ids are
    /// allocations live at the start of the trace, at their rebuilt addresses; the rest are the trace's `alloc`s).
    pub recorded_addr: Vec<u64>,
    /// Stream of every allocation, indexed by alloc id (0 = default stream).
    pub stream: Vec<u64>,
    /// How many of the first alloc ids are carried in.
    pub carried_in: u32,
    /// Segment events in trace order, each tagged with the alloc id of the first `alloc` that follows it
    /// (u32::MAX when no alloc follows). segment_alloc is recorded just before the alloc that needed it.
    pub segment_ops: Vec<(u32, SegmentOp)>,
}
