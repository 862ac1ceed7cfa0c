//! Loader errors. Every error names the file; parse errors also name the line, the column and
//! what was expected. The path goes last in the message, as paths can be long.

use std::io;
use std::path::{Path, PathBuf};

use allocview_sim::trace::TraceError;

/// Where and why a line could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line number in the decompressed text.
    pub line: u64,
    /// 1-based byte column where the offending field starts.
    pub column: usize,
    /// Which field (e.g. "size").
    pub field: &'static str,
    /// What a valid value looks like.
    pub expected: &'static str,
    /// What was there (shortened).
    pub found: String,
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {}, column {}: expected {} in the {} field, found {:?}",
            self.line, self.column, self.expected, self.field, self.found
        )
    }
}

/// Why a file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The OS error is in the message and not a `source`, so an error chain printed with its
    /// causes (`{:#}`) says it once.
    #[error("cannot read {}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error("{detail} (use --lenient to skip bad lines) in {}", path.display())]
    Parse { path: PathBuf, detail: LineError },
    #[error("{message} in {}", path.display())]
    Format { path: PathBuf, message: String },
    #[error("invalid trace: {source} in {}", path.display())]
    Trace {
        path: PathBuf,
        #[source]
        source: TraceError,
    },
    #[error("DataFrame error: {0}")]
    Polars(#[from] polars::error::PolarsError),
}

impl LoadError {
    pub(crate) fn io(path: &Path, source: io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            error: source,
        }
    }

    pub(crate) fn format(path: &Path, message: impl Into<String>) -> Self {
        Self::Format {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }
}
