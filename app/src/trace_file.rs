//! Malloc traces read and written record by record, in either form: the libtracemalloc text
//! form and allocview's binary form (and a tracer's spool, read only). `convert`, `record` and
//! `splice` write through [`RecordWriter`], which replaces its output only once it is finished.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use allocview_loaders::binary::{self, BinaryInfo, BinaryWriter, NativeStacks, TimeBase};
use allocview_loaders::events::{CALL_NAMES, MAX_THREADS, Record};
use allocview_loaders::malloc_trace;
use allocview_loaders::{LoadOptions, LoadSummary, Strictness};
use anyhow::{Context as _, Result};

use crate::safe_write::PendingFile;

/// The two forms a trace can be written in.
/// The two forms a trace can be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Form {
    /// libtracemalloc text (gzip when the file name ends in `.gz`).
    Text,
    /// allocview's binary form (zstd blocks).
    Binary,
}

/// Reads every record of a trace of either form, in file order.
pub fn read_any(
    input: &Path,
    lenient: bool,
    base: TimeBase,
    f: &mut dyn FnMut(&Record) -> io::Result<()>,
) -> Result<Option<BinaryInfo>> {
    // An I/O error of the writer is kept aside: the readers' callbacks only carry a static
    // reason, and the real error is what the user needs.
    let mut write_error: Option<io::Error> = None;
    let mut push = |r: &Record| match f(r) {
        Ok(()) => Ok(()),
        Err(e) => {
            write_error = Some(e);
            Err("a writable output")
        }
    };
    let strictness = if lenient {
        Strictness::Lenient
    } else {
        Strictness::Strict
    };
    let result = if binary::is_binary(&binary::file_head(input)?) {
        binary::read_records_with(input, base, strictness, &mut push).map(Some)
    } else {
        let opts = LoadOptions {
            strictness,
            ..LoadOptions::default()
        };
        malloc_trace::read_text_records(input, &opts, &mut push).map(|summary| {
            for w in summary.warnings() {
                eprintln!("warning: {w}");
            }
            None
        })
    };
    if let Some(e) = write_error {
        return Err(e).context("cannot write the output");
    }
    let info = result.with_context(|| format!("while reading {}", input.display()))?;
    if let Some(why) = info.as_ref().and_then(|i| i.truncated.as_ref()) {
        eprintln!(
            "warning: {} is incomplete ({why}); converted what was there",
            input.display()
        );
    }
    if let Some(info) = info.as_ref().filter(|i| !i.damaged.is_empty()) {
        // The loader's own wording: what was lost, and where.
        let summary = LoadSummary {
            events: info.records,
            damaged: info.damaged.clone(),
            events_lost: info.events_lost,
            ..LoadSummary::default()
        };
        for w in summary.warnings() {
            eprintln!("warning: {}: {w}", input.display());
        }
    }
    Ok(info)
}

/// Text output, gzipped or not.
pub enum TextOut {
    Plain(BufWriter<File>),
    Gzip(Box<flate2::write::GzEncoder<BufWriter<File>>>),
}

/// How often a recording in progress ends its events block and flushes its file for a reader
/// that follows it (`allocview FILE --follow`, `record --live`): a block of a quarter second
/// costs the file a few dozen bytes of framing and index.
pub const LIVE_FLUSH: std::time::Duration = std::time::Duration::from_millis(250);

/// The encoder of either form.
enum Sink {
    Text(TextOut),
    Binary(Box<BinaryWriter<BufWriter<File>>>),
}

/// A writer of either form into a temporary file that replaces the output only on
/// [`RecordWriter::finish`] (dropped before that, it leaves the output as it was).
pub struct RecordWriter {
    sink: Sink,
    pending: PendingFile,
    records: u64,
    path: PathBuf,
    /// The text form's threads, to say when allocview will not load the file (the binary
    /// writer refuses such a record instead).
    text_threads: HashSet<u64>,
    last_tid: Option<u64>,
    /// Records with a stack id.
    with_stack: u64,
    /// Records of the program's own heaps left out of the text form (which has malloc's only).
    other_heaps: u64,
}

impl RecordWriter {
    /// Starts writing `path` for records in form `form` (text is gzipped when the name ends in
    /// `.gz`); `inputs` are refused as the output.
    pub fn create(
        path: &Path,
        form: Form,
        meta: &[(String, String)],
        inputs: &[&Path],
    ) -> Result<Self> {
        let (pending, file) = PendingFile::create(path, inputs)?;
        let buffered = BufWriter::with_capacity(1 << 20, file);
        let sink = match form {
            Form::Text => {
                let gz = path.extension().is_some_and(|e| e == "gz");
                Sink::Text(if gz {
                    TextOut::Gzip(Box::new(flate2::write::GzEncoder::new(
                        buffered,
                        flate2::Compression::new(6),
                    )))
                } else {
                    TextOut::Plain(buffered)
                })
            }
            Form::Binary => Sink::Binary(Box::new(
                BinaryWriter::new(buffered, meta)
                    .with_context(|| format!("cannot write {}", path.display()))?,
            )),
        };
        Ok(Self {
            sink,
            pending,
            records: 0,
            path: path.to_path_buf(),
            text_threads: HashSet::new(),
            last_tid: None,
            with_stack: 0,
            other_heaps: 0,
        })
    }

    /// Appends one record.
    pub fn push(&mut self, r: &Record) -> io::Result<()> {
        if r.heap != 0 && matches!(self.sink, Sink::Text(_)) {
            self.other_heaps += 1;
            return Ok(());
        }
        if matches!(self.sink, Sink::Text(_)) && self.last_tid != Some(r.tid) {
            self.last_tid = Some(r.tid);
            self.text_threads.insert(r.tid);
        }
        match &mut self.sink {
            Sink::Text(TextOut::Plain(w)) => write_text_record(w, r)?,
            Sink::Text(TextOut::Gzip(w)) => write_text_record(w.as_mut(), r)?,
            Sink::Binary(w) => w.push(r)?,
        }
        self.records += 1;
        self.with_stack += u64::from(r.stack.is_some());
        Ok(())
    }

    /// Writes the memory samples and marks a recording in progress has read so far (binary
    /// form: its frames add up; the text form has neither, and says so once, at the end).
    ///
    /// # Errors
    /// On write errors.
    pub fn write_live_tables(
        &mut self,
        memory: &[allocview_loaders::binary::MemorySample],
        marks: &[allocview_loaders::binary::Mark],
    ) -> Result<()> {
        if let Sink::Binary(w) = &mut self.sink {
            if !memory.is_empty() {
                w.write_memory(memory)?;
            }
            if !marks.is_empty() {
                w.write_marks(marks)?;
            }
        }
        Ok(())
    }

    /// Ends the events block in progress and flushes the file, so that a reader following the
    /// recording (`allocview FILE --follow`) sees the records so far.
    ///
    /// # Errors
    /// On write errors.
    pub fn flush_live(&mut self) -> io::Result<()> {
        match &mut self.sink {
            Sink::Text(TextOut::Plain(w)) => w.flush(),
            Sink::Text(TextOut::Gzip(w)) => w.flush(),
            Sink::Binary(w) => w.flush(),
        }
    }

    /// Writes the recorded program's memory samples (binary form; the text form has none,
    /// and says what is left out).
    ///
    /// # Errors
    /// On write errors.
    fn write_memory(&mut self, samples: &[allocview_loaders::binary::MemorySample]) -> Result<()> {
        match &mut self.sink {
            Sink::Binary(w) => w
                .write_memory(samples)
                .with_context(|| format!("cannot write {}", self.path.display())),
            Sink::Text(_) => {
                if !samples.is_empty() {
                    eprintln!(
                        "note: the text form has no memory samples: the {} samples of the \
                         program's resident memory are left out of {} (the binary form keeps \
                         them)",
                        crate::format::count(samples.len() as u64),
                        self.path.display()
                    );
                }
                Ok(())
            }
        }
    }

    /// Writes the mapping calls the recorded program made outside the allocator (binary form;
    /// the text form has none, and says what is left out).
    ///
    /// # Errors
    /// On write errors.
    fn write_mappings(&mut self, calls: &[allocview_loaders::binary::Mapping]) -> Result<()> {
        match &mut self.sink {
            Sink::Binary(w) => w
                .write_mappings(calls)
                .with_context(|| format!("cannot write {}", self.path.display())),
            Sink::Text(_) => {
                if !calls.is_empty() {
                    eprintln!(
                        "note: the text form has no mapping calls: the program's {} calls to \
                         mmap, munmap, mremap and brk are left out of {}",
                        crate::format::count(calls.len() as u64),
                        self.path.display()
                    );
                }
                Ok(())
            }
        }
    }

    /// Writes the run's marks (binary form; the text form has none, and says what is left
    /// out).
    ///
    /// # Errors
    /// On write errors.
    fn write_marks(&mut self, marks: &[allocview_loaders::binary::Mark]) -> Result<()> {
        match &mut self.sink {
            Sink::Binary(w) => w
                .write_marks(marks)
                .with_context(|| format!("cannot write {}", self.path.display())),
            Sink::Text(_) => {
                if !marks.is_empty() {
                    eprintln!(
                        "note: the text form has no marks: the run's {} marks (named moments, \
                         and where recording stopped and started) are left out of {}",
                        crate::format::count(marks.len() as u64),
                        self.path.display()
                    );
                }
                Ok(())
            }
        }
    }

    /// Names the program's own heaps (binary form; the text form holds malloc's heap only, and
    /// says what it left out).
    ///
    /// # Errors
    /// On write errors.
    fn write_heap_names(&mut self, names: &[allocview_loaders::binary::HeapName]) -> Result<()> {
        match &mut self.sink {
            Sink::Binary(w) => w
                .write_heap_names(names)
                .with_context(|| format!("cannot write {}", self.path.display())),
            Sink::Text(_) => {
                if self.other_heaps > 0 {
                    eprintln!(
                        "note: the text form holds malloc's heap only: {} events of the \
                         program's own heaps are left out of {} (the binary form keeps them)",
                        crate::format::count(self.other_heaps),
                        self.path.display()
                    );
                }
                Ok(())
            }
        }
    }

    /// Writes what a recording keeps beside its events (call after the last record): the
    /// program's memory samples, its mapping calls, the run's marks and the names of its own
    /// heaps.
    ///
    /// # Errors
    /// On write errors.
    pub fn write_run_tables(&mut self, info: &allocview_loaders::binary::BinaryInfo) -> Result<()> {
        self.write_memory(&info.memory)?;
        self.write_mappings(&info.mappings)?;
        self.write_marks(&info.marks)?;
        self.write_heap_names(&info.heaps)
    }

    /// Writes the call stacks the records' stack ids refer to (call after the last record):
    /// into the binary form; the text form cannot hold them, so it says what is lost.
    ///
    /// # Errors
    /// On write errors.
    pub fn write_stacks(&mut self, stacks: &NativeStacks) -> Result<()> {
        match &mut self.sink {
            Sink::Binary(w) => w
                .write_stacks(stacks)
                .with_context(|| format!("cannot write {}", self.path.display())),
            Sink::Text(_) => {
                if self.with_stack > 0 {
                    eprintln!(
                        "warning: the text form has no call stacks: {} allocations in {} lose \
                         their stack ({} distinct stacks); the binary form keeps them",
                        crate::format::count(self.with_stack),
                        self.path.display(),
                        crate::format::count(stacks.stacks.len() as u64),
                    );
                }
                Ok(())
            }
        }
    }

    /// Writes what the growing stack tables `stacks` add to what `written` says this trace was
    /// given, and `symbols` (frames by location index): a recording's stacks as they are
    /// placed. Nothing in the text form, which has no place for them ([`Self::write_stacks`]
    /// says what is lost).
    ///
    /// # Errors
    /// On write errors.
    pub fn append_stacks(
        &mut self,
        stacks: &NativeStacks,
        symbols: &[(usize, Vec<allocview_loaders::binary::SourceFrame>)],
        written: &mut allocview_loaders::binary::StacksWritten,
    ) -> Result<()> {
        match &mut self.sink {
            Sink::Binary(w) => w
                .append_stacks(stacks, symbols, written)
                .with_context(|| format!("cannot write {}", self.path.display())),
            Sink::Text(_) => Ok(()),
        }
    }

    /// Makes the finished file `path` instead (in the same directory; `inputs` refused).
    pub fn retarget(&mut self, path: &Path, inputs: &[&Path]) -> Result<()> {
        self.pending.retarget(path, inputs)?;
        self.path = path.to_path_buf();
        Ok(())
    }

    /// Finishes the file and puts it in place of the output; returns the number of records
    /// written.
    pub fn finish(self) -> Result<u64> {
        let buffered = match self.sink {
            Sink::Text(TextOut::Plain(w)) => w,
            Sink::Text(TextOut::Gzip(w)) => w.finish().context("cannot write the output")?,
            Sink::Binary(w) => w.finish().context("cannot write the output")?,
        };
        let file = buffered
            .into_inner()
            .map_err(io::IntoInnerError::into_error)
            .context("cannot write the output")?;
        self.pending.commit(Some(file))?;
        if self.text_threads.len() > MAX_THREADS {
            eprintln!(
                "note: {} has {} threads; allocview loads at most {MAX_THREADS}, so it will not \
                 load this file (other libtracemalloc tools may)",
                self.path.display(),
                self.text_threads.len()
            );
        }
        Ok(self.records)
    }
}

/// One record as a libtracemalloc text line (with the call column when the record has one).
pub fn write_text_record(out: &mut dyn Write, r: &Record) -> io::Result<()> {
    if r.t_ns < 0 {
        return Err(io::Error::other(format!(
            "a time of {} ns cannot be written in the text form (it has no negative times)",
            r.t_ns
        )));
    }
    let secs = r.t_ns / 1_000_000_000;
    let frac_ns = r.t_ns % 1_000_000_000;
    if frac_ns % 1000 == 0 {
        write!(out, "{secs}.{:06}\t{}\t", frac_ns / 1000, r.tid)?;
    } else {
        write!(out, "{secs}.{frac_ns:09}\t{}\t", r.tid)?;
    }
    match r.size_bytes {
        Some(size) => write!(out, "{size}\t")?,
        None => out.write_all(b"-1\t")?,
    }
    if r.addr == 0 {
        out.write_all(b"(nil)")?;
    } else {
        write!(out, "0x{:x}", r.addr)?;
    }
    if let Some(name) = r.call.and_then(|c| CALL_NAMES.get(usize::from(c))) {
        write!(out, "\t{name}")?;
    }
    out.write_all(b"\n")
}
