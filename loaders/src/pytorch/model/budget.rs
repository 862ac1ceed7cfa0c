//! How much the typed snapshot may hold, in proportion to the decoded graph.
//!
//! The pickle memo lets a file name one container many times for a byte or two each: a
//! segment list of 7,000 references to one segment whose block list holds 7,000 references
//! to one block is a 30 KB file, and 49 million blocks once every reference is read (a
//! 220 KB file of this kind aborted, out of memory). The graph shares such a container
//! ([`crate::pytorch::pickle`]); the typed snapshot cannot, as every segment's blocks become
//! rows. So the reader counts the bytes it makes and refuses the file, naming the record,
//! past a budget no real snapshot comes near: its records take about half the file's size.

use crate::pytorch::pickle::Pickle;

/// Budget per byte of the decoded file (or of the graph's tables, when larger).
const BYTES_PER_INPUT_BYTE: u64 = 4;
/// Budget every file has, however small.
const FLOOR_BYTES: u64 = 16 << 20;

/// The bytes the reader may still make.
pub(super) struct Budget {
    limit_bytes: u64,
    used_bytes: u64,
    input_bytes: u64,
    /// The record that passed the limit, in words.
    exceeded_at: Option<String>,
}

impl Default for Budget {
    fn default() -> Self {
        Self::with_input(0)
    }
}

impl Budget {
    /// The budget for reading `pickle`.
    pub(super) fn of(pickle: &Pickle) -> Self {
        let graph_bytes = u64::try_from(pickle.heap_bytes()).unwrap_or(u64::MAX);
        Self::with_input(pickle.bytes_read().max(graph_bytes))
    }

    fn with_input(input_bytes: u64) -> Self {
        Self {
            limit_bytes: input_bytes
                .saturating_mul(BYTES_PER_INPUT_BYTE)
                .saturating_add(FLOOR_BYTES),
            used_bytes: 0,
            input_bytes,
            exceeded_at: None,
        }
    }

    /// Counts `bytes` made for the record `what` names; false (and the record kept) once the
    /// limit is passed.
    pub(super) fn charge(&mut self, bytes: usize, what: impl FnOnce() -> String) -> bool {
        if self.exceeded_at.is_some() {
            return false;
        }
        self.used_bytes = self
            .used_bytes
            .saturating_add(u64::try_from(bytes).unwrap_or(u64::MAX));
        if self.used_bytes > self.limit_bytes {
            self.exceeded_at = Some(what());
            return false;
        }
        true
    }

    /// True once the limit has been passed: readers stop walking.
    pub(super) fn exceeded(&self) -> bool {
        self.exceeded_at.is_some()
    }

    /// The error for a file that passed the limit.
    pub(super) fn error(&self) -> Option<String> {
        self.exceeded_at.as_ref().map(|at| {
            format!(
                "at {at}: the snapshot's records would take more than {} bytes, from a \
                 {}-byte pickle ({BYTES_PER_INPUT_BYTE} times its size plus {} MiB, far more \
                 than a real snapshot needs): its containers are shared through the pickle \
                 memo and read once per reference (a damaged or hostile file)",
                self.limit_bytes,
                self.input_bytes,
                FLOOR_BYTES >> 20
            )
        })
    }
}
