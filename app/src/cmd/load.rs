//! Loading an input for a command: progress bar, lenient mode, warnings on stderr.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use allocview_loaders::{LoadOptions, Loaded, Strictness};
use anyhow::{Context as _, Result};
use polars::prelude::*;

use crate::progress::ByteProgress;

/// Loader flags shared by every command that reads a trace.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct InputArgs {
    /// Skip malformed lines instead of stopping at the first one (they are counted and the
    /// first few are reported).
    #[arg(long)]
    pub lenient: bool,
}

/// Loads `path`, showing a progress bar on a terminal and printing load warnings to stderr.
pub fn load_input(path: &Path, args: &InputArgs) -> Result<Loaded> {
    let counter = Arc::new(AtomicU64::new(0));
    let file_bytes = std::fs::metadata(path)
        .with_context(|| format!("cannot open {}", path.display()))?
        .len();
    let opts = LoadOptions {
        strictness: if args.lenient {
            Strictness::Lenient
        } else {
            Strictness::Strict
        },
        progress: Some(Arc::clone(&counter)),
    };
    let bar = ByteProgress::start("loading", file_bytes, counter);
    let loaded = allocview_loaders::load(path, &opts)
        .with_context(|| format!("while loading {}", path.display()))?;
    drop(bar);
    match &loaded {
        Loaded::MallocTrace(t) => {
            for w in t.summary.warnings() {
                eprintln!("warning: {w}");
            }
        }
    }
    Ok(loaded)
}

/// The thread column widened to u16 (it is u8 for traces with few threads).
pub fn thread_column(events: &DataFrame) -> Result<Vec<u16>> {
    let col = events.column("thread")?;
    let widened = col.cast(&DataType::UInt16)?;
    Ok(widened.u16()?.into_no_null_iter().collect())
}
