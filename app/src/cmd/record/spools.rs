//! The tracer's spools of a recording, one per process (and per exec of it), and the names
//! and META lines of the traces written from them.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

/// One spool the tracer wrote: a process image (a pid, and the exec generation within it).
#[derive(Debug)]
pub(super) struct Spool {
    pub(super) path: PathBuf,
    pub(super) pid: u32,
    pub(super) generation: u32,
}

/// `trace.avt` -> `trace.<pid>.avt` (`trace.<pid>-<n>.avt` for the n-th exec of the pid).
pub(super) fn per_process_name(output: &Path, pid: u32, generation: u32) -> PathBuf {
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tag = if generation > 0 {
        format!("{pid}-{generation}")
    } else {
        pid.to_string()
    };
    let (stem, ext) = match name.find('.') {
        Some(dot) if dot > 0 => (&name[..dot], &name[dot..]),
        _ => (name.as_str(), ""),
    };
    output.with_file_name(format!("{stem}.{tag}{ext}"))
}

/// The spools in `dir`: `p.<pid>.spool` and `p.<pid>.<n>.spool`.
pub(super) fn list_spools(dir: &Path) -> Result<Vec<Spool>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(middle) = name
            .strip_prefix("p.")
            .and_then(|n| n.strip_suffix(".spool"))
        else {
            continue;
        };
        let mut parts = middle.split('.');
        let pid = parts.next().and_then(|p| p.parse().ok());
        let generation = match parts.next() {
            None => Some(0),
            Some(g) => g.parse().ok(),
        };
        if let (Some(pid), Some(generation)) = (pid, generation) {
            out.push(Spool {
                path: entry.path(),
                pid,
                generation,
            });
        }
    }
    Ok(out)
}
