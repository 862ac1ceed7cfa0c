//! The heaps a trace holds (`stats`' list): malloc's and those the program reported itself
//! (`allocview.h`, the `allocview-heap` crate, `otel_memory` USDT probes), each with its
//! events and peak of live bytes, so that a user finds the names `--heap` takes.

use std::path::Path;

use allocview_loaders::binary;
use anyhow::{Context as _, Result};
use serde::Serialize;

/// One heap of a trace, as `stats --json` prints it in `heaps`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct HeapAnswer {
    pub name: String,
    pub id: u32,
    pub events: u64,
    pub allocations: u64,
    pub frees: u64,
    pub peak_live_bytes: u64,
    pub final_live_bytes: u64,
}

/// The heaps of `path`, malloc's first, when it is a binary trace or spool that names heaps
/// of the program's own (`None` otherwise: it holds malloc's only, or is no longer there).
/// Reads every event once, for a trace with heaps only.
///
/// # Errors
/// When the file cannot be read.
pub fn heaps_of(path: &Path) -> Result<Option<Vec<HeapAnswer>>> {
    if !path.exists() {
        // Loaded, then removed (the fleet job's local copy of a trace it downloaded): the
        // figures describe what was loaded, which holds one heap only.
        return Ok(None);
    }
    let head =
        binary::file_head(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !binary::is_binary(&head) {
        return Ok(None);
    }
    let names = binary::heap_names(path).with_context(|| format!("reading {}", path.display()))?;
    if names.is_empty() {
        return Ok(None);
    }
    let figures =
        binary::heap_figures(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(
        figures
            .into_iter()
            .map(|f| HeapAnswer {
                name: f.name,
                id: f.id,
                events: f.events,
                allocations: f.allocations,
                frees: f.frees,
                peak_live_bytes: f.peak_live_bytes,
                final_live_bytes: f.final_live_bytes,
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `stats` of a trace loaded and then removed (the fleet job deletes its downloaded copy
    /// before asking) describes what was loaded, instead of failing to list the heaps.
    #[test]
    fn a_trace_no_longer_there_lists_no_heaps() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(heaps_of(&dir.path().join("gone.avt")).unwrap(), None);
    }
}
