//! How the explorers replay a policy: the buckets, the layout index for the heap maps, and the
//! checkpoints seeking needs; shared by the loading workers and the follower of a live run.

use allocview_sim::replay::{DEFAULT_CHECKPOINT_BUDGET_BYTES, ReplayOptions};

use super::state::BUCKETS;

/// How an explorer replays a policy on a trace of `events` events: its buckets, the layout
/// index for the heap maps, and the checkpoints seeking needs.
pub(super) fn explorer_options(align_bytes: u64, events: usize) -> ReplayOptions {
    ReplayOptions {
        align_bytes,
        buckets: BUCKETS,
        layout_index: true,
        checkpoint_budget_bytes: checkpoint_budget_bytes(events),
        checkpoint_min_copies: CHECKPOINT_MIN_COPIES,
        ..ReplayOptions::default()
    }
}

/// The checkpoint budget an explorer gives one policy's replay on a trace of `events` events:
/// 6 bytes an event, at least 64 MiB and at most the replay's default 512 MiB; the replay
/// raises it to hold [`CHECKPOINT_MIN_COPIES`] copies of the policy's state (up to 512 MiB
/// again). Only a policy without a layout index (`glibc`, `pool`) seeks from checkpoints; the
/// others keep a 64th, and no floor. Checkpoints of a fixed number of bytes an event lie a
/// fixed number of events apart whatever the trace's length, so on a long trace a seek replays
/// about as far as on a short one with the same heap, and resident memory stays near 40 bytes
/// an event: on the 29.8-million-event Python recording the fixed 512 MiB held glibc's at 51
/// bytes an event (seek + redraw p99 4.5 ms), 8 bytes an event at 40.3 (8.0 ms), 6 at 38.2
/// (12.7 ms); with no checkpoint it is 31.
pub fn checkpoint_budget_bytes(events: usize) -> u64 {
    const BYTES_PER_EVENT: u64 = 6;
    (events as u64)
        .saturating_mul(BYTES_PER_EVENT)
        .clamp(64 << 20, DEFAULT_CHECKPOINT_BUDGET_BYTES)
}

/// Copies of its state a replay's checkpoint budget holds at least (up to 512 MiB): without
/// it, a heap that is large for its trace (a million live blocks in 8 million events) would
/// get one checkpoint in a 64 MiB budget, and every seek would replay from the first event.
pub const CHECKPOINT_MIN_COPIES: u64 = 8;
