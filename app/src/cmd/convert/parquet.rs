//! `allocview convert FILE OUT.parquet`: an input's tables as Parquet.
//!
//! The events go to `OUT.parquet` in the exported schema (`allocview_loaders::export`); the
//! other tables to `OUT.<table>.parquet` beside it ([`crate::parquet_out::companion`]). A malloc
//! trace (text, binary or spool) is streamed: records are paired as the loader pairs them and
//! written a row group at a time, so memory holds one row group and the live allocations,
//! never the trace. Other inputs are loaded (their loaders build the whole table) and written
//! a row group at a time from it.

use std::path::Path;

use allocview_loaders::binary::{FileKind, TimeBase};
use allocview_loaders::export::{EventBatcher, keyed_stacks_frame};
use allocview_loaders::{InputKind, Loaded};
use anyhow::{Context as _, Result};

use crate::answers::tables::tables_of;
use crate::parquet_out::{self, ParquetFile, companion};
use crate::session::InputArgs;
use crate::session::WindowArgs;
use crate::session::input::load_input;

/// What `convert` to Parquet reads and writes.
pub(super) struct ToParquet<'a> {
    pub input: &'a Path,
    pub output: &'a Path,
    pub window: WindowArgs,
    pub lenient: bool,
    pub row_group_rows: usize,
}

/// Runs `convert` with Parquet output.
pub(super) fn run(args: ToParquet<'_>) -> Result<()> {
    let window = args.window;
    let kind = allocview_loaders::detect(args.input).ok();
    let streamable = matches!(kind, Some(InputKind::MallocTrace | InputKind::BinaryTrace));
    let noun = if matches!(kind, Some(InputKind::Plan(_))) {
        "buffers"
    } else {
        "events"
    };
    let (rows, tables) = if streamable && !window.is_set() {
        stream(args.input, args.output, args.lenient, args.row_group_rows)?
    } else {
        let input = InputArgs {
            lenient: args.lenient,
            requests: None,
            device: None,
            heap: None,
            window,
        };
        let loaded = load_input(args.input, &input)?;
        write_loaded(&loaded, args.input, args.output, args.row_group_rows)?
    };
    eprintln!(
        "wrote {} {noun} to {}{}",
        crate::format::count(rows),
        args.output.display(),
        if tables.is_empty() {
            String::new()
        } else {
            format!(" and {} beside it", tables.join(", "))
        }
    );
    Ok(())
}

/// Streams a malloc trace's records into `output`; returns the events written and the
/// companion tables' names.
fn stream(
    input: &Path,
    output: &Path,
    lenient: bool,
    row_group_rows: usize,
) -> Result<(u64, Vec<String>)> {
    let mut batcher = EventBatcher::default();
    // The schema of an empty batch is every batch's.
    let schema = batcher.take_batch()?.schema().clone();
    let mut out = ParquetFile::create(
        output,
        &schema,
        &[input],
        row_group_rows,
        events_metadata(input),
    )?;
    let info = crate::trace_file::read_any(input, lenient, TimeBase::default(), &mut |r| {
        batcher.push(r).map_err(|why| {
            std::io::Error::other(format!("allocview does not load this record: {why}"))
        })?;
        if batcher.pending_rows() >= row_group_rows {
            let batch = batcher.take_batch().map_err(std::io::Error::other)?;
            out.write(&batch)
                .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
        }
        Ok(())
    })?;
    out.write(&batcher.take_batch()?)?;
    let mut tables = vec![];
    let threads = companion(output, "threads");
    parquet_out::write_frame(
        &threads,
        &batcher.threads()?,
        &[input],
        parquet_out::metadata("threads", Some(input)),
    )?;
    tables.push("threads".to_owned());
    if let Some(info) = info
        && let Some(mut stacks) = info.stacks
    {
        if info.kind == FileKind::Spool {
            crate::symbolize::Symbolizer::default()
                .symbolize_stacks(&mut stacks)
                .print_summary();
        }
        let (table, map) = stacks.to_table();
        parquet_out::write_frame(
            &companion(output, "stacks"),
            &keyed_stacks_frame(&table, &map)?,
            &[input],
            parquet_out::metadata("stacks", Some(input)),
        )?;
        parquet_out::write_frame(
            &companion(output, "frames"),
            &table.frames_frame()?,
            &[input],
            parquet_out::metadata("frames", Some(input)),
        )?;
        tables.extend(["stacks".to_owned(), "frames".to_owned()]);
    }
    // The events file last: once it is in place, its companions are too.
    let rows = out.finish()?;
    Ok((rows, tables))
}

/// Writes a loaded input's tables; returns the rows of the main table and the companions'
/// names.
fn write_loaded(
    loaded: &Loaded,
    input: &Path,
    output: &Path,
    row_group_rows: usize,
) -> Result<(u64, Vec<String>)> {
    let (main, others) = tables_of(loaded, input)?;
    let mut names = Vec::new();
    for (name, table) in &others {
        let meta = parquet_out::metadata(name, Some(input));
        parquet_out::write_frame(&companion(output, name), table, &[input], meta)
            .with_context(|| format!("the {name} table"))?;
        names.push((*name).to_owned());
    }
    let meta = match loaded {
        Loaded::Plan(_) => parquet_out::metadata("buffers", Some(input)),
        _ => events_metadata(input),
    };
    let mut out = ParquetFile::create(output, main.schema(), &[input], row_group_rows, meta)?;
    out.write(&main)?;
    let rows = out.finish()?;
    Ok((rows, names))
}

/// The events file's metadata: what its codes mean, so a reader needs no other document.
fn events_metadata(input: &Path) -> Vec<(String, String)> {
    let mut meta = parquet_out::metadata("events", Some(input));
    meta.push((
        "allocview.kind_codes".to_owned(),
        "0=alloc,1=free,2=free_null,3=free_unknown,4=alloc_failed".to_owned(),
    ));
    meta.push((
        "allocview.call_names".to_owned(),
        allocview_loaders::events::CALL_NAMES.join(","),
    ));
    meta
}
