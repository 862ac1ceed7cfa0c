//! `allocview convert IN OUT`: between the libtracemalloc text form and allocview's binary form
//! (Parquet output: [`parquet`]).
//!
//! The conversion is lossless at the record level: every record's time (nanoseconds), thread
//! id, size (or free), pointer and call name (or its absence) survives a round trip in either
//! direction, in file order, including records the loader would clamp or flag (times going
//! backwards, frees of unknown pointers). Text is written with six fractional digits when the
//! time is a whole microsecond and nine otherwise.
//!
//! Call stacks (traces recorded with stacks) are carried into the binary form, symbolized when
//! the input is a spool; the text form has no place for them, so converting to text says how
//! many allocations lose their stack.

mod parquet;

use std::path::{Path, PathBuf};

use allocview_loaders::binary::{self, FileKind, TimeBase};
use anyhow::Result;

use crate::safe_write;
use crate::trace_file::{Form, RecordWriter, read_any};

/// What `convert --to` names: a trace form, or Parquet tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// libtracemalloc text (gzip when the file name ends in `.gz`).
    Text,
    /// allocview's binary form (zstd blocks).
    Binary,
    /// Parquet tables: the events in OUT, the threads, stacks and frames (and a PyTorch
    /// snapshot's segments and blocks) in OUT.<table>.parquet beside it.
    Parquet,
}

/// Arguments of `allocview convert`.
#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// The trace to read: text (plain or gzip), binary, or a tracer spool left by an interrupted
    /// `allocview record`.
    pub input: PathBuf,
    /// Where to write.
    pub output: PathBuf,
    /// What to write (`text`, `binary` or `parquet`; by default Parquet when OUTPUT ends in
    /// `.parquet`, else the other trace form than the input's), or, as in every command, the
    /// end of the window to convert (a time: see `--from`).
    #[arg(long, value_name = "FORM|TIME")]
    pub to: Option<String>,
    /// Convert only the events from this time on (Parquet output): see `allocview stats
    /// --help` for times, and `--to`.
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// Convert only these events (Parquet output): `A..B`, `A..` or `..B`.
    #[arg(long, value_name = "A..B")]
    pub events: Option<String>,
    /// Parquet output: most events in one row group, and in memory at once while a malloc
    /// trace is streamed.
    #[arg(long, value_name = "N", default_value_t = crate::parquet_out::ROW_GROUP_ROWS)]
    pub row_group_rows: usize,
    /// Skip malformed lines instead of stopping at the first one (they are counted and the
    /// first few are reported).
    #[arg(long)]
    pub lenient: bool,
}

impl ConvertArgs {
    /// The `--to` value when it names an output form.
    fn target(&self) -> Option<Target> {
        use clap::ValueEnum as _;
        let to = self.to.as_deref()?;
        Target::from_str(to, true).ok()
    }

    /// The window flags, `--to` among them when it is a time.
    pub fn window(&self) -> crate::session::WindowArgs {
        crate::session::WindowArgs {
            from: self.from.clone(),
            to: self.to.clone().filter(|_| self.target().is_none()),
            events: self.events.clone(),
        }
    }
}

/// Runs `allocview convert`.
pub fn run(args: &ConvertArgs) -> Result<()> {
    check_distinct(&args.input, &args.output)?;
    if let Some(to) = &args.to
        && args.target().is_none()
        && crate::session::window::parse_time_ns(to).is_err()
    {
        anyhow::bail!(
            "--to {to}: expected an output form (text, binary or parquet) or the end of a window \
             (a time such as 1.5s or 200ms)"
        );
    }
    let parquet_name = args.output.extension().is_some_and(|e| e == "parquet");
    let to = match args.target() {
        Some(Target::Parquet) => None,
        Some(Target::Text) => Some(Form::Text),
        Some(Target::Binary) => Some(Form::Binary),
        None if parquet_name => None,
        None => Some(if binary::is_binary(&binary::file_head(&args.input)?) {
            Form::Text
        } else {
            Form::Binary
        }),
    };
    let Some(to) = to else {
        return parquet::run(parquet::ToParquet {
            input: &args.input,
            output: &args.output,
            window: args.window(),
            lenient: args.lenient,
            row_group_rows: args.row_group_rows,
        });
    };
    if args.window().is_set() {
        anyhow::bail!(
            "a window (`--from`, `--to TIME`, `--events`) applies to Parquet output only in `convert`: the \
             text and binary forms are copied record for record"
        );
    }
    refuse_other_inputs(&args.input, args.lenient)?;
    let count = convert(&args.input, &args.output, to, args.lenient)?;
    eprintln!(
        "wrote {} records to {} ({} form)",
        crate::format::count(count),
        args.output.display(),
        match to {
            Form::Text => "text",
            Form::Binary => "binary",
        }
    );
    Ok(())
}

/// What `convert` reads, for its refusals.
const CONVERT_READS: &str = "`allocview convert` converts malloc traces between the \
                             libtracemalloc text form (plain or gzip) and allocview's binary \
                             form (and finishes tracer spools)";

/// `convert` reads malloc traces only: any other input recognised by content gets a message
/// that says what it is and what reads it, rather than a parse error on its first line. A file
/// of no known kind is refused too, unless `--lenient` asks to skip bad lines (a trace whose
/// first line is damaged is of no known kind).
fn refuse_other_inputs(input: &Path, lenient: bool) -> Result<()> {
    use allocview_loaders::{InputKind, LoadError};
    let what = match allocview_loaders::detect(input) {
        Ok(InputKind::MallocTrace | InputKind::BinaryTrace) => return Ok(()),
        Err(e @ LoadError::Io { .. }) => return Err(e.into()),
        Err(_) if lenient => return Ok(()),
        Err(e) => anyhow::bail!("{CONVERT_READS}; {e}"),
        Ok(InputKind::PytorchSnapshot) => {
            "a PyTorch memory snapshot (every other command reads it as it is)"
        }
        Ok(InputKind::KinetoTrace) => {
            "a PyTorch profiler trace (every other command reads it as it is)"
        }
        Ok(InputKind::TfMemoryLog) => "a TensorFlow memory log (every other command reads it)",
        Ok(InputKind::TfBfcDump) => "a TensorFlow BFC dump (`allocview stats` reads it)",
        Ok(InputKind::Plan(_)) => "a memory plan (`allocview plan` reads it)",
        Ok(InputKind::HeapProfile(_)) => {
            "a heap profile (`allocview sites`, `flamegraph`, `diff` and `export` read it)"
        }
        Ok(InputKind::Heaptrack) => {
            "a heaptrack data file (every other command reads it as it is, and `convert \
             --to parquet` writes its tables)"
        }
        Ok(InputKind::Memray) => "a memray capture (every other command reads it as it is)",
    };
    anyhow::bail!("{CONVERT_READS}; {} is {what}", input.display())
}

/// Converts `input` (any form, detected by content) into `output` in form `to`; returns the
/// number of records written.
pub fn convert(input: &Path, output: &Path, to: Form, lenient: bool) -> Result<u64> {
    let meta = vec![
        ("source".to_owned(), "allocview convert".to_owned()),
        ("converted_from".to_owned(), input.display().to_string()),
    ];
    let mut sink = RecordWriter::create(output, to, &meta, &[input])?;
    let info = read_any(input, lenient, TimeBase::default(), &mut |r| sink.push(r))?;
    if let Some(info) = &info {
        sink.write_memory(&info.memory)?;
        sink.write_mappings(&info.mappings)?;
        sink.write_heap_names(&info.heaps)?;
    }
    if let Some(info) = info
        && let Some(mut stacks) = info.stacks
    {
        if info.kind == FileKind::Spool && to == Form::Binary {
            crate::symbolize::Symbolizer::default()
                .symbolize_stacks(&mut stacks)
                .print_summary();
        }
        sink.write_stacks(&stacks)?;
    }
    sink.finish()
}

/// Fails early with a clear message when the output is the input (compared as files: a hard
/// link, a symbolic link or another spelling of the input's path is refused too).
pub fn check_distinct(input: &Path, output: &Path) -> Result<()> {
    Ok(safe_write::refuse_if_same_file(input, output)?)
}
