//! The run's marks (`allocview ctl PID mark NAME`, and where recording stopped and started:
//! `ctl PID stop|start`, `record --paused`) as the commands show them, in seconds from the
//! trace's first event.

use std::path::Path;

use allocview_loaders::Loaded;
use allocview_loaders::binary::{Mark, MarkKind};
use serde::Serialize;

/// One mark, for `stats` and `--json`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MarkAnswer {
    /// Seconds from the trace's first event (negative: before it, e.g. a mark put while
    /// recording was stopped at the start).
    pub t_s: f64,
    /// `mark`, `recording stopped` or `recording started`.
    pub kind: &'static str,
    /// The user's name (empty for a stop or a start).
    pub name: String,
}

/// The marks of `loaded` (a trace made by `record`; none for other inputs).
#[must_use]
pub fn marks_of(loaded: &Loaded) -> &[Mark] {
    match loaded {
        Loaded::MallocTrace(t) => &t.marks,
        _ => &[],
    }
}

/// The marks of the binary trace at `path`, read without its events (a streamed command);
/// a damaged MARKS frame is said on stderr, and the command goes on without them.
#[must_use]
pub fn marks_in_file(path: &Path) -> Vec<Mark> {
    allocview_loaders::binary::read_marks(path).unwrap_or_else(|e| {
        eprintln!("warning: {e}: the run's marks are left out");
        Vec::new()
    })
}

/// `marks` for `stats`, timed from `first_t_ns` (the trace's first event).
#[must_use]
pub fn answers(marks: &[Mark], first_t_ns: i64) -> Vec<MarkAnswer> {
    marks
        .iter()
        .map(|m| MarkAnswer {
            t_s: m.t_ns.saturating_sub(first_t_ns) as f64 / 1e9,
            kind: m.kind.label(),
            name: m.name.clone(),
        })
        .collect()
}

/// When recording last stopped (`None`: it never did): a block allocated before then and
/// live at the end may have been freed while recording was stopped, so its fate is unknown,
/// which is not a leak.
#[must_use]
pub fn last_stop_t_ns(marks: &[Mark]) -> Option<i64> {
    marks
        .iter()
        .filter(|m| m.kind == MarkKind::Stopped)
        .map(|m| m.t_ns)
        .max()
}
