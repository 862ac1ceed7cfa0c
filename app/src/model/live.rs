//! What the explorers know of a run followed while it is recorded (`--follow`, `record
//! --live`), and what the follower ([`super::follow`]) reports to them each round.

use std::sync::Arc;

use allocview_sim::classes::ClassSeries;
use allocview_sim::replay::Replay;
use allocview_sim::series::Bucketing;

use super::trace_data::TraceData;

/// What the explorers know of a followed run (`AppState::live`).
#[derive(Clone, Debug, Default)]
pub struct Live {
    /// Whether the cursor follows the newest event (`F`); a cursor moved by hand stops it.
    pub at_head: bool,
    /// The bucketing of the series shown: they grow with the run.
    pub bucketing: Option<Bucketing>,
    /// Whether the recording has ended (the file is finished).
    pub ended: bool,
    /// Why there is nothing to show yet (no file, or one not readable yet).
    pub waiting: Option<String>,
    /// Where the recording comes from.
    pub from: Follow,
}

/// What an explorer launched to follow a run knows of its recording.
#[derive(Clone, Debug, Default)]
pub struct Follow {
    /// Only a recording made from this moment on: `record --live` shows its own run, never an
    /// earlier trace of that name.
    pub since: Option<std::time::SystemTime>,
    /// The `allocview record` writing it, when the explorer's command started it, and where
    /// its output and the command's go.
    pub recorder_pid: Option<u32>,
    pub log: Option<std::path::PathBuf>,
    /// Wakes the frontend when a round has reported (the desktop explorer draws a frame only
    /// when something changed, rather than polling).
    pub wake: Option<Wake>,
}

/// A frontend's wake-up call, for a thread that has sent it a message.
#[derive(Clone)]
pub struct Wake(pub Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Wake")
    }
}

/// Refuses what `--follow` cannot show: a window of the run (it shows the whole run as it
/// grows).
///
/// # Errors
/// When `input` asks for a window.
pub fn check_follow(input: &crate::session::InputArgs) -> Result<(), String> {
    if input.window.is_set() {
        return Err(
            "--follow shows the whole run as it grows: it takes no window (--from, --to, \
             --events)"
                .to_owned(),
        );
    }
    Ok(())
}

/// Lowers the explorer's priority to the lowest (nice 19), before its threads start, which
/// inherit it: on a machine whose cores the program and `record` keep busy, the view lags
/// behind the run instead of slowing it (at nice 10 the Python workload of
/// `scripts/bench-live.sh` still ran about 9% slower watched).
pub fn yield_to_the_program() {
    // Not being allowed to (a seccomp filter, say) leaves the priority as it was: the view
    // works the same.
    rustix::process::nice(19).ok();
}

/// One round of the follower: the trace as far as it was written, and every policy's replay
/// of it (`None`: not replayed this round).
#[derive(Clone)]
pub struct Grown {
    pub data: Arc<TraceData>,
    pub replays: Vec<Option<Result<Arc<Replay>, String>>>,
    pub classes: Arc<ClassSeries>,
    pub bucketing: Bucketing,
    pub ended: bool,
    /// The file is another recording than the one shown so far.
    pub restarted: bool,
}
