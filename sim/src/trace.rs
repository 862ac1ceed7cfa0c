//! The trace vocabulary shared by the loaders and the replay engine.
//!
//! A trace is a structure of arrays, one entry per event, in file order. The loaders build these
//! arrays as polars columns and hand the simulator borrowed slices ([`TraceView`]), so a replay
//! reads contiguous memory with no per-row conversion.

/// What an event does. Stored as a `u8` in the `kind` column; the numeric codes are part of the
/// documented DataFrame schema and must not change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum EventKind {
    /// A successful allocation (malloc, calloc, realloc's new block, memalign, ...).
    Alloc = 0,
    /// A free that ends a known live allocation.
    Free = 1,
    /// `free(NULL)`: a no-op, kept because it is in the trace.
    FreeNull = 2,
    /// A free of a pointer that is not live (allocated by an untraced call, or a double free).
    FreeUnknown = 3,
    /// An allocation that returned NULL (size > 0). It creates no live allocation.
    AllocFailed = 4,
    /// A free that was asked for but completes later (PyTorch's `free_requested`: the block
    /// waits for outstanding CUDA events). Informational: the matching `Free` ends the
    /// allocation, so this kind never reaches a policy.
    FreeRequested = 5,
}

impl EventKind {
    /// All kinds in code order.
    pub const ALL: [Self; 6] = [
        Self::Alloc,
        Self::Free,
        Self::FreeNull,
        Self::FreeUnknown,
        Self::AllocFailed,
        Self::FreeRequested,
    ];

    /// Decodes a `kind` column value.
    #[must_use]
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(usize::from(code)).copied()
    }

    /// The code stored in the `kind` column.
    #[must_use]
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Stable lower-case name used in JSON, CSV and the frontends.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Alloc => "alloc",
            Self::Free => "free",
            Self::FreeNull => "free_null",
            Self::FreeUnknown => "free_unknown",
            Self::AllocFailed => "alloc_failed",
            Self::FreeRequested => "free_requested",
        }
    }

    /// True for the kinds that are calls to a free function.
    #[must_use]
    pub fn is_free(self) -> bool {
        matches!(self, Self::Free | Self::FreeNull | Self::FreeUnknown)
    }
}

/// Value of `alloc_id` for events that belong to no allocation (free of NULL or of an unknown
/// pointer, failed allocation). In the DataFrame these rows are null; the underlying buffer holds
/// this sentinel so the simulator can read the raw slice.
pub const NO_ALLOC_ID: u32 = u32::MAX;

/// Size class of a request: the bit length of the size (0 -> 0, 1 -> 1, 2..=3 -> 2, 4..=7 -> 3,
/// ...), as in the libtracemalloc article.
#[must_use]
pub fn size_class(size_bytes: u64) -> u8 {
    // bit length is at most 64, so the cast cannot truncate.
    (u64::BITS - size_bytes.leading_zeros()) as u8
}

/// Number of size classes (0..=64).
pub const NUM_SIZE_CLASSES: usize = 65;

/// Borrowed, validated columns of a trace. Built by the loaders from a DataFrame.
///
/// Invariants (checked by [`TraceView::new`]):
/// - all slices have the same length;
/// - every `Alloc` event has a fresh `alloc_id` equal to the number of `Alloc` events before it
///   (ids are dense, 0-based, in allocation order);
/// - every `Free` event names an allocation that is live at that point; other kinds carry
///   [`NO_ALLOC_ID`];
/// - `t_ns` never decreases.
#[derive(Clone, Copy, Debug)]
pub struct TraceView<'a> {
    /// Event time, nanoseconds from the start of the trace.
    pub t_ns: &'a [i64],
    /// [`EventKind`] codes.
    pub kind: &'a [u8],
    /// Requested bytes; for a `Free`, the size of the allocation it ends.
    pub size_bytes: &'a [u64],
    /// Dense allocation id, or [`NO_ALLOC_ID`].
    pub alloc_id: &'a [u32],
    /// Number of distinct allocations (`Alloc` events).
    pub num_allocs: u32,
}

/// Why a set of columns is not a valid trace.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("column lengths differ: {0}")]
    LengthMismatch(String),
    #[error("event {event}: unknown kind code {code}")]
    BadKind { event: usize, code: u8 },
    #[error("event {event}: allocation id {got} out of order (expected {expected})")]
    BadAllocId {
        event: usize,
        got: u32,
        expected: u32,
    },
    #[error("event {event}: free of allocation {id}, which is not live")]
    FreeNotLive { event: usize, id: u32 },
    #[error("event {event}: time goes backwards ({t_ns} ns after {prev_t_ns} ns)")]
    TimeBackwards {
        event: usize,
        t_ns: i64,
        prev_t_ns: i64,
    },
    #[error("trace has more than {} allocations", u32::MAX - 1)]
    TooManyAllocs,
}

impl<'a> TraceView<'a> {
    /// Validates the columns once, so the replay engine can trust them.
    ///
    /// # Errors
    /// Returns the first violated invariant.
    pub fn new(
        t_ns: &'a [i64],
        kind: &'a [u8],
        size_bytes: &'a [u64],
        alloc_id: &'a [u32],
    ) -> Result<Self, TraceError> {
        let n = t_ns.len();
        if kind.len() != n || size_bytes.len() != n || alloc_id.len() != n {
            return Err(TraceError::LengthMismatch(format!(
                "t_ns {n}, kind {}, size_bytes {}, alloc_id {}",
                kind.len(),
                size_bytes.len(),
                alloc_id.len()
            )));
        }
        let mut live: Vec<bool> = Vec::new();
        let mut next_id: u32 = 0;
        let mut prev_t = i64::MIN;
        for (event, ((&code, &id), &t)) in kind.iter().zip(alloc_id).zip(t_ns).enumerate() {
            if t < prev_t {
                return Err(TraceError::TimeBackwards {
                    event,
                    t_ns: t,
                    prev_t_ns: prev_t,
                });
            }
            prev_t = t;
            match EventKind::from_code(code) {
                Some(EventKind::Alloc) => {
                    if id != next_id {
                        return Err(TraceError::BadAllocId {
                            event,
                            got: id,
                            expected: next_id,
                        });
                    }
                    next_id = next_id.checked_add(1).ok_or(TraceError::TooManyAllocs)?;
                    if next_id == NO_ALLOC_ID {
                        return Err(TraceError::TooManyAllocs);
                    }
                    live.push(true);
                }
                Some(EventKind::Free) => match live.get_mut(id as usize) {
                    Some(slot) if *slot => *slot = false,
                    _ => return Err(TraceError::FreeNotLive { event, id }),
                },
                Some(_) => {}
                None => return Err(TraceError::BadKind { event, code }),
            }
        }
        Ok(Self {
            t_ns,
            kind,
            size_bytes,
            alloc_id,
            num_allocs: next_id,
        })
    }

    /// Rebuilds a view over columns that [`TraceView::new`] has already accepted, without
    /// checking them again (an O(n) pass a frontend cannot afford every frame). Columns that
    /// were never validated give wrong replays, never undefined behaviour: every access in
    /// this crate is bounds-checked.
    #[must_use]
    pub fn revalidated(
        t_ns: &'a [i64],
        kind: &'a [u8],
        size_bytes: &'a [u64],
        alloc_id: &'a [u32],
        num_allocs: u32,
    ) -> Self {
        Self {
            t_ns,
            kind,
            size_bytes,
            alloc_id,
            num_allocs,
        }
    }

    /// The peak of live bytes (the sum of the requested sizes of live allocations) and the
    /// first event at which it is reached: the bound every policy's footprint is measured
    /// against. `(0, 0)` for a trace without allocations.
    #[must_use]
    pub fn peak_live(&self) -> (u64, usize) {
        let (mut live, mut peak, mut at) = (0u64, 0u64, 0usize);
        for (i, (&k, &size)) in self.kind.iter().zip(self.size_bytes).enumerate() {
            if k == EventKind::Alloc as u8 {
                live = live.saturating_add(size);
                if live > peak {
                    peak = live;
                    at = i;
                }
            } else if k == EventKind::Free as u8 {
                live = live.saturating_sub(size);
            }
        }
        (peak, at)
    }

    /// Number of events.
    #[must_use]
    pub fn len(&self) -> usize {
        self.kind.len()
    }

    /// True when the trace has no events.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.kind.is_empty()
    }

    /// The kind of event `i` (codes are validated at construction).
    #[must_use]
    pub fn kind_at(&self, i: usize) -> Option<EventKind> {
        self.kind.get(i).copied().and_then(EventKind::from_code)
    }
}

/// Owned trace columns, for tests and synthetic traces.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedTrace {
    pub t_ns: Vec<i64>,
    pub kind: Vec<u8>,
    pub size_bytes: Vec<u64>,
    pub alloc_id: Vec<u32>,
    sizes_by_id: Vec<u64>,
}

impl OwnedTrace {
    /// An empty trace.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an allocation of `size_bytes` at `t_ns` and returns its id.
    pub fn alloc(&mut self, t_ns: i64, size_bytes: u64) -> u32 {
        let id = u32::try_from(self.sizes_by_id.len()).unwrap_or(NO_ALLOC_ID);
        self.sizes_by_id.push(size_bytes);
        self.push(t_ns, EventKind::Alloc, size_bytes, id);
        id
    }

    /// Appends the free of allocation `id` (its size is filled in).
    pub fn free(&mut self, t_ns: i64, id: u32) {
        let size = self.sizes_by_id.get(id as usize).copied().unwrap_or(0);
        self.push(t_ns, EventKind::Free, size, id);
    }

    fn push(&mut self, t_ns: i64, kind: EventKind, size_bytes: u64, id: u32) {
        self.t_ns.push(t_ns);
        self.kind.push(kind.code());
        self.size_bytes.push(size_bytes);
        self.alloc_id.push(id);
    }

    /// A validated view of the columns.
    ///
    /// # Errors
    /// When the events built so far violate a [`TraceView`] invariant (e.g. a double free).
    pub fn view(&self) -> Result<TraceView<'_>, TraceError> {
        TraceView::new(&self.t_ns, &self.kind, &self.size_bytes, &self.alloc_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_class_is_bit_length() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(1), 1);
        assert_eq!(size_class(2), 2);
        assert_eq!(size_class(3), 2);
        assert_eq!(size_class(4), 3);
        assert_eq!(size_class(7), 3);
        assert_eq!(size_class(8), 4);
        assert_eq!(size_class(67_108_872), 27);
        assert_eq!(size_class(u64::MAX), 64);
    }

    #[test]
    fn view_rejects_double_free_and_bad_ids() {
        let mut t = OwnedTrace::new();
        let a = t.alloc(0, 10);
        t.free(1, a);
        assert!(t.view().is_ok());
        t.free(2, a);
        assert_eq!(
            t.view().unwrap_err(),
            TraceError::FreeNotLive { event: 2, id: a }
        );

        let err = TraceView::new(&[0], &[0], &[1], &[5]).unwrap_err();
        assert!(matches!(err, TraceError::BadAllocId { got: 5, .. }));
        let err = TraceView::new(&[5, 4], &[2, 2], &[0, 0], &[NO_ALLOC_ID; 2]).unwrap_err();
        assert!(matches!(err, TraceError::TimeBackwards { event: 1, .. }));
        let err = TraceView::new(&[0], &[9], &[0], &[NO_ALLOC_ID]).unwrap_err();
        assert_eq!(err, TraceError::BadKind { event: 0, code: 9 });
    }
}
