//! Converting spools while the command runs: each spool the tracer writes is read as it
//! grows ([`LiveSpool`]) and its events, once no thread can add to their time, go straight
//! into the trace being written, so that little is left to convert when the command ends.
//! A step converts at most [`step_records`] before the converter looks again whether the
//! command has exited; once it has, the rest is converted on two threads ([`super::pipe`]).
//! Anything unusual (an event that came in late, a damaged frame, an error writing) drops
//! that spool's live conversion: it is converted from the finished file instead, as before.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use allocview_loaders::analysis::stats::{RecordingStats, RecordingSummary};
use allocview_loaders::binary::{LivePoll, LiveSpool, TimeBase};
use anyhow::{Context as _, Result};

use super::pipe::{Pipe, Written};
use super::spools::{list_spools, per_process_name};
use crate::recording::{AddStacks, trace_meta};
use crate::symbolize::{ModuleFeed, Symbolized, TraceStacks};
use crate::trace_file::{Form, LIVE_FLUSH, RecordWriter};

/// How long the converter waits between looks at the spools.
const POLL: Duration = Duration::from_millis(10);
/// Records a step converts at most, for each spool it looks at (at least 2^16, some 4 ms of
/// work; at most 2^20), before the converter looks whether the command has exited: after that,
/// the rest is converted on two threads, so a long step running on one holds up the end. At
/// 2^20 records (about 70 ms) the end of a two-thread Python run was seen 68 ms after the
/// command had exited. A step also reads every spool of the recording, so a command that ran
/// a thousand processes keeps steps of 2^20, where those reads stay a few percent of a step.
const STEP_RECORDS: u64 = 1 << 16;
const MAX_STEP_RECORDS: u64 = 1 << 20;

/// Records a step converts at most in a recording of `spools` spools: [`STEP_RECORDS`] for
/// each, within 2^16 and 2^20.
fn step_records(spools: usize) -> u64 {
    STEP_RECORDS
        .saturating_mul(spools as u64)
        .clamp(STEP_RECORDS, MAX_STEP_RECORDS)
}

/// One spool being converted.
struct LiveTrace {
    pid: u32,
    generation: u32,
    reader: LiveSpool,
    /// Created once the spool's header is read (the trace's META comes from it).
    writer: Option<RecordWriter>,
    stats: RecordingStats,
    /// When the writer last flushed for a follower, and whether records came since.
    flushed_at: Instant,
    unflushed: bool,
    /// The marks written while the command ran (the rest come with the spool's end).
    marks_written: Vec<allocview_loaders::binary::Mark>,
    /// The call stacks written while the command ran, and their symbols found.
    stacks: TraceStacks,
}

/// The spools of a recording, converted while the command runs.
pub(super) struct Converter<'a> {
    dir: &'a Path,
    program: &'a str,
    output: &'a Path,
    form: Form,
    base: TimeBase,
    protected: &'a [&'a Path],
    /// By spool path; `None` once its live conversion was given up.
    traces: HashMap<PathBuf, Option<LiveTrace>>,
    /// Why a spool's live conversion was given up, by spool path.
    given_up: HashMap<PathBuf, String>,
    /// Where the modules of the stacks go to be read, and their locations symbolized, while
    /// the command runs; and where the symbols come back.
    modules: Option<ModuleFeed>,
    symbolized: (mpsc::Sender<Symbolized>, mpsc::Receiver<Symbolized>),
}

impl<'a> Converter<'a> {
    pub(super) fn new(
        dir: &'a Path,
        program: &'a str,
        output: &'a Path,
        form: Form,
        base: TimeBase,
        protected: &'a [&'a Path],
        modules: Option<ModuleFeed>,
    ) -> Self {
        Self {
            dir,
            program,
            output,
            form,
            base,
            protected,
            traces: HashMap::new(),
            given_up: HashMap::new(),
            modules,
            symbolized: mpsc::channel(),
        }
    }

    /// Converts what the spools hold until `child` exits; returns its status.
    pub(super) fn run_until_exit(&mut self, child: &mut Child) -> Result<ExitStatus> {
        loop {
            let exited = child.try_wait().context("cannot wait for the command")?;
            // Once the command is gone, what its spools hold is converted by `finish`, on two
            // threads; here the spools are only opened and read.
            let more = self.step(exited.is_none());
            if let Some(status) = exited {
                return Ok(status);
            }
            if !more {
                std::thread::sleep(POLL);
            }
        }
    }

    /// One look at the spools: new ones are opened, every live one read, and its events
    /// emitted when `emit` ([`step_records`] at most); returns whether more are ready.
    fn step(&mut self, emit: bool) -> bool {
        if let Ok(found) = list_spools(self.dir) {
            for spool in found {
                if !self.traces.contains_key(&spool.path) {
                    let trace =
                        LiveSpool::open(&spool.path, self.base)
                            .ok()
                            .map(|reader| LiveTrace {
                                pid: spool.pid,
                                generation: spool.generation,
                                reader,
                                writer: None,
                                stats: RecordingStats::default(),
                                flushed_at: Instant::now(),
                                unflushed: false,
                                marks_written: Vec::new(),
                                stacks: TraceStacks::default(),
                            });
                    self.traces.insert(spool.path, trace);
                }
            }
        }
        self.take_symbols();
        let (program, output, form, protected) =
            (self.program, self.output, self.form, self.protected);
        let records = step_records(self.traces.len());
        let mut more = false;
        for (path, slot) in &mut self.traces {
            let Some(trace) = slot else { continue };
            let symbolize = self
                .modules
                .as_ref()
                .map(|feed| (path.as_path(), feed, &self.symbolized.0));
            let target = (program, output, form, protected);
            match trace.step(target, emit.then_some(records), symbolize) {
                Ok(m) => more |= m,
                Err(e) => {
                    // The spool stays; it is converted from the finished file.
                    *slot = None;
                    self.given_up.insert(path.clone(), format!("{e:#}"));
                    continue;
                }
            }
            if let Some(feed) = &self.modules {
                for m in trace.reader.new_modules_in_use() {
                    feed.read(&m);
                }
            }
        }
        more
    }

    /// Takes in the symbols that came back from the symbolizing thread.
    fn take_symbols(&mut self) {
        while let Ok(s) = self.symbolized.1.try_recv() {
            if let Some(Some(trace)) = self.traces.get_mut(&s.trace) {
                trace.stacks.answer(s);
            }
        }
    }

    /// Why the live conversion of `spool` was given up, if it was.
    pub(super) fn given_up(&self, spool: &Path) -> Option<&str> {
        self.given_up.get(spool).map(String::as_str)
    }

    /// Finishes the live conversion of `spool` into `path` (`stacks` writes the run's tables
    /// and the rest of its stacks) and returns its summary, or `None` when it is to be
    /// converted from the file (why is then in [`Self::given_up`]). Call it once the
    /// symbolizing thread has stopped: the symbols it found are then all here.
    pub(super) fn finish(
        &mut self,
        spool: &Path,
        path: &Path,
        stacks: &mut AddStacks<'_>,
    ) -> Option<RecordingSummary> {
        self.take_symbols();
        let mut trace = self.traces.remove(spool).flatten()?;
        let writer = trace.writer.take()?;
        match finish_trace(trace, writer, path, self.protected, stacks) {
            Ok(summary) => Some(summary),
            Err(why) => {
                self.given_up.insert(spool.to_path_buf(), why);
                None
            }
        }
    }
}

/// The rest of `trace` into `writer`, the file put at `path`.
fn finish_trace(
    trace: LiveTrace,
    mut writer: RecordWriter,
    path: &Path,
    protected: &[&Path],
    stacks: &mut AddStacks<'_>,
) -> std::result::Result<RecordingSummary, String> {
    // Refused before the backlog is converted rather than after.
    writer
        .retarget(path, protected)
        .map_err(|e| format!("{e:#}"))?;
    // While the command ran, its threads had the cores; what it left is converted on two:
    // this thread reads and merges the spool, the pipe's counts and writes.
    let mut pipe = Pipe::start(writer, trace.stats)
        .map_err(|e| format!("cannot start the trace's writing thread: {e}"))?;
    let read = trace.reader.finish(&mut |r| pipe.push(r));
    let written = pipe.close();
    // A record the writing thread refused stops the reading too: its error says why.
    let info = match (read, &written) {
        (Ok(info), _) => info,
        (Err(_), Err(why)) => return Err(why.clone()),
        (Err(e), Ok(_)) => return Err(e.to_string()),
    };
    let Written {
        mut writer,
        mut stats,
    } = written?;
    let marks_so_far = [trace.marks_written.as_slice(), info.marks.as_slice()].concat();
    if allocview_loaders::binary::marks::recording_stopped(&marks_so_far) {
        // Blocks allocated while recording was stopped were freed unseen.
        stats.mark_started_mid_run();
    }
    stacks(&mut writer, info, trace.stacks).map_err(|e| format!("{e:#}"))?;
    writer.finish().map_err(|e| format!("{e:#}"))?;
    Ok(stats.finish())
}

/// What a trace is written from and to: the program's name, the output, its form, and the
/// files it must not replace.
type TraceTarget<'a> = (&'a str, &'a Path, Form, &'a [&'a Path]);

/// Where a trace's locations are symbolized while the command runs: the trace's spool (its
/// key), the symbolizing thread, and where the frames come back.
type Symbolize<'a> = (&'a Path, &'a ModuleFeed, &'a mpsc::Sender<Symbolized>);

impl LiveTrace {
    fn step(
        &mut self,
        (program, output, form, protected): TraceTarget<'_>,
        emit: Option<u64>,
        symbolize: Option<Symbolize<'_>>,
    ) -> Result<bool> {
        self.reader.read()?;
        if self.writer.is_none() {
            let meta = self.reader.meta();
            if meta.is_empty() {
                return Ok(false);
            }
            let meta = trace_meta(meta, program);
            let path = per_process_name(output, self.pid, self.generation);
            self.writer = Some(RecordWriter::create(&path, form, &meta, protected)?);
        }
        let (Some(writer), Some(records)) = (self.writer.as_mut(), emit) else {
            return Ok(false);
        };
        let stats = &mut self.stats;
        let mut emitted = false;
        let poll = self.reader.emit_at_most(
            &mut |r| {
                emitted = true;
                stats.push(r)?;
                writer.push(r).map_err(|_| "a writable output")
            },
            records,
        )?;
        self.unflushed |= emitted;
        // A follower of the file sees the run a quarter second late at most.
        if self.unflushed && self.flushed_at.elapsed() >= LIVE_FLUSH {
            // The program's memory and the marks so far go with the events, so a follower's
            // timeline draws them as they come.
            if form == Form::Binary {
                let (memory, marks) = self.reader.take_run_tables()?;
                writer
                    .write_live_tables(&memory, &marks)
                    .context("cannot write the trace")?;
                self.marks_written.extend(marks);
                // And the stacks of its events, with the symbols found so far: the sites
                // panel of a follower shows functions while the program runs.
                if let Some(stacks) = self.reader.stacks_so_far() {
                    if let Some((key, feed, reply)) = symbolize {
                        self.stacks.ask(key, stacks, feed, reply);
                    }
                    self.stacks.write(writer, stacks)?;
                }
            }
            writer.flush_live().context("cannot write the trace")?;
            self.flushed_at = Instant::now();
            self.unflushed = false;
        }
        if poll == LivePoll::Late {
            anyhow::bail!("an event came in late");
        }
        Ok(poll == LivePoll::More)
    }
}
