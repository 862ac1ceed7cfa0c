//! Writing tables as Parquet, for DuckDB, pyarrow, polars and the rest.
//!
//! [`ParquetFile`] takes a table in batches and writes each as it comes, in row groups of at
//! most [`ROW_GROUP_ROWS`] rows, so a producer that hands over bounded batches (the streamed
//! `convert`) writes in bounded memory. Like every output, the file is written into a
//! temporary file beside it and renamed over the output only when complete.
//!
//! Files are zstd-compressed (pyarrow, DuckDB and polars read it; the default of polars'
//! writer), with column statistics, so engines skip row groups by `t_ns` range.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context as _, Result};
use polars::io::parquet::write::{BatchedWriter, KeyValueMetadata};
use polars::prelude::{DataFrame, ParquetWriter, Schema};

use crate::safe_write::PendingFile;

/// Most rows in one row group: 1 Mi rows of the event table is about 31 MiB before encoding.
pub const ROW_GROUP_ROWS: usize = 1 << 20;

/// The buffered temporary file, shared with polars' writer (which owns its writer) so that it
/// can be flushed, and its errors seen, once the writer is done.
#[derive(Clone)]
struct SharedFile(Arc<Mutex<BufWriter<File>>>);

impl Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flush()
    }
}

/// A Parquet file being written, a batch at a time.
pub struct ParquetFile {
    writer: BatchedWriter<SharedFile>,
    file: SharedFile,
    pending: PendingFile,
    path: PathBuf,
    rows: u64,
    row_group_rows: usize,
}

impl ParquetFile {
    /// Starts `path` for tables of `schema`, in row groups of at most `row_group_rows`, with
    /// file-level `meta`data (see [`metadata`]); `inputs` are refused as the output.
    ///
    /// # Errors
    /// The refusal, or when the temporary file cannot be created.
    pub fn create(
        path: &Path,
        schema: &Schema,
        inputs: &[&Path],
        row_group_rows: usize,
        meta: Vec<(String, String)>,
    ) -> Result<Self> {
        let row_group_rows = row_group_rows.max(1);
        let (pending, file) = PendingFile::create(path, inputs)?;
        let file = SharedFile(Arc::new(Mutex::new(BufWriter::with_capacity(
            1 << 20,
            file,
        ))));
        let writer = ParquetWriter::new(file.clone())
            .with_row_group_size(Some(row_group_rows))
            .with_key_value_metadata(Some(KeyValueMetadata::from_static(meta)))
            .batched(schema)
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Self {
            writer,
            file,
            pending,
            path: path.to_path_buf(),
            rows: 0,
            row_group_rows,
        })
    }

    /// Appends `df`'s rows (of the schema given at creation), in row groups of at most the
    /// size given at creation.
    ///
    /// # Errors
    /// When the schema differs or the file cannot be written.
    pub fn write(&mut self, df: &DataFrame) -> Result<()> {
        let mut offset = 0;
        while offset < df.height() {
            let len = self.row_group_rows.min(df.height() - offset);
            let mut group = df.slice(i64::try_from(offset)?, len);
            // A slice of single-chunk columns is single-chunk already: nothing is copied then.
            group.align_chunks();
            self.writer
                .write_batch(&group)
                .with_context(|| format!("cannot write {}", self.path.display()))?;
            offset += len;
        }
        self.rows += df.height() as u64;
        Ok(())
    }

    /// Writes the footer and puts the file in place of the output; returns the rows written.
    ///
    /// # Errors
    /// When the file cannot be written, flushed or renamed.
    pub fn finish(self) -> Result<u64> {
        let context = || format!("cannot write {}", self.path.display());
        self.writer.finish().with_context(context)?;
        drop(self.writer);
        let shared = Arc::try_unwrap(self.file.0)
            .map_err(|_| anyhow::anyhow!("the Parquet writer still holds the file"))
            .with_context(context)?;
        let file = shared
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .into_inner()
            .map_err(io::IntoInnerError::into_error)
            .with_context(context)?;
        self.pending.commit(Some(file))?;
        Ok(self.rows)
    }
}

/// File-level metadata every file carries: `allocview.table` (which table it is),
/// `allocview.source` (the input, when there is one) and `allocview.version`.
#[must_use]
pub fn metadata(table: &str, source: Option<&Path>) -> Vec<(String, String)> {
    let mut meta = vec![
        ("allocview.table".to_owned(), table.to_owned()),
        (
            "allocview.version".to_owned(),
            env!("CARGO_PKG_VERSION").to_owned(),
        ),
    ];
    if let Some(source) = source {
        meta.push(("allocview.source".to_owned(), source.display().to_string()));
    }
    meta
}

/// Writes `df` to `path` as Parquet (row groups of at most [`ROW_GROUP_ROWS`]), with `meta`.
///
/// # Errors
/// As [`ParquetFile`].
pub fn write_frame(
    path: &Path,
    df: &DataFrame,
    inputs: &[&Path],
    meta: Vec<(String, String)>,
) -> Result<u64> {
    let mut out = ParquetFile::create(path, df.schema(), inputs, ROW_GROUP_ROWS, meta)?;
    out.write(df)?;
    out.finish()
}

/// Writes `df` into `file`, the open temporary file of the output `path` (named in errors),
/// which a caller's [`PendingFile`] puts in place (for a command that replaces several
/// outputs together).
///
/// # Errors
/// When the file cannot be written.
pub fn write_to_temporary(
    file: File,
    path: &Path,
    df: &DataFrame,
    meta: Vec<(String, String)>,
) -> Result<()> {
    let context = || format!("cannot write {}", path.display());
    let mut out = BufWriter::with_capacity(1 << 20, file);
    ParquetWriter::new(&mut out)
        .with_row_group_size(Some(ROW_GROUP_ROWS))
        .with_key_value_metadata(Some(KeyValueMetadata::from_static(meta)))
        .finish(&mut df.clone())
        .with_context(context)?;
    out.flush().with_context(context)?;
    Ok(())
}

/// `OUT.parquet`'s companion table `name`: `OUT.name.parquet` (`OUT.name.parquet` too when
/// `OUT` does not end in `.parquet`).
#[must_use]
pub fn companion(path: &Path, name: &str) -> PathBuf {
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = file.strip_suffix(".parquet").unwrap_or(&file);
    path.with_file_name(format!("{stem}.{name}.parquet"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn companions_sit_beside_the_events_file() {
        assert_eq!(
            companion(Path::new("out/run.parquet"), "stacks"),
            Path::new("out/run.stacks.parquet")
        );
        assert_eq!(
            companion(Path::new("run"), "threads"),
            Path::new("run.threads.parquet")
        );
    }
}
