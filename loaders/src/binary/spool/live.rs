//! Reading a spool while the tracer still writes it: [`LiveSpool`] takes in the frames
//! written so far and emits the events no thread can still add to; at the end, the rest.
//! Its records are the whole-file reading's, in the same order, unless an event comes in
//! after its time's events were emitted (a thread held up between reading the time and
//! writing its event): the reading then says so ([`LivePoll::Late`]) and the caller reads
//! the finished file instead.

use std::borrow::Cow;
use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::super::frames::{Next, frame_at, read_header};
use super::super::stacks::NativeModule;
use super::super::{BinaryInfo, FileKind, TimeBase};
use super::SpoolState;
use crate::error::LoadError;
use crate::events::Record;

/// The bytes of a file header (magic, version, kind).
const HEADER_BYTES: usize = 10;

/// A spool read as it grows.
pub struct LiveSpool {
    path: PathBuf,
    file: File,
    /// Bytes read and not yet taken in as frames (from the start of a frame, or of the file).
    pending: Vec<u8>,
    /// The offset of `pending` in the frames (after the header).
    pending_at: usize,
    header_read: bool,
    state: SpoolState<'static>,
}

/// How a step of a [`LiveSpool`] went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LivePoll {
    /// The events emitted so far are the file's.
    Going,
    /// As `Going`, and the step stopped at its most records: more may be ready.
    More,
    /// An event came in late (see the module documentation): read the finished file instead.
    Late,
}

impl LiveSpool {
    /// Opens a spool the tracer is writing.
    ///
    /// # Errors
    /// When the file cannot be opened.
    pub fn open(path: &Path, base: TimeBase) -> Result<Self, LoadError> {
        let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
        let mut state = SpoolState::new(path, base);
        state.reading_live();
        Ok(Self {
            path: path.to_path_buf(),
            file,
            pending: Vec::new(),
            pending_at: 0,
            header_read: false,
            state,
        })
    }

    /// The META lines read so far (the tracer writes them first).
    #[must_use]
    pub fn meta(&self) -> &[(String, String)] {
        self.state.meta()
    }

    /// The reading no longer keeps the live pointers (see `Merge::may_drop_live`).
    #[cfg(test)]
    pub(super) fn live_dropped(&self) -> bool {
        self.state.live_dropped()
    }

    /// The modules that the stacks emitted since the last call use, and no earlier one did
    /// (the tracer writes every module it finds loaded, used or not).
    pub fn new_modules_in_use(&mut self) -> Vec<NativeModule> {
        self.state.new_modules_in_use()
    }

    /// The call stacks of the events emitted so far (and of some not yet emitted), for a trace
    /// written while the program runs: its tables only grow, so what a call adds to the last
    /// one's can be appended to the trace (see `stacks::Placer`). [`Self::finish`] gives the
    /// whole tables. `None` for a spool without stacks.
    pub fn stacks_so_far(&mut self) -> Option<&super::super::NativeStacks> {
        if !self.header_read {
            return None;
        }
        self.state.stacks_so_far()
    }

    /// The program's memory samples and the run's marks read since the last call, for a trace
    /// written while the program runs (`allocview FILE --follow` shows them); [`Self::finish`]
    /// gives the rest. None with a TSC clock, whose tick length is known only at the end.
    ///
    /// # Errors
    /// When the spool's header lacks its clock's calibration.
    pub fn take_run_tables(
        &mut self,
    ) -> Result<(Vec<super::super::MemorySample>, Vec<super::super::Mark>), LoadError> {
        if !self.header_read {
            return Ok((Vec::new(), Vec::new()));
        }
        self.state.take_run_tables_so_far()
    }

    /// Takes in what the tracer wrote since the last step.
    ///
    /// # Errors
    /// When the file cannot be read, is not a spool, or a frame is corrupt.
    pub fn read(&mut self) -> Result<(), LoadError> {
        self.take_in()
    }

    /// Emits the events no thread can still add to, of those read.
    ///
    /// # Errors
    /// When an event is corrupt; `f`'s error.
    pub fn emit(
        &mut self,
        f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
    ) -> Result<LivePoll, LoadError> {
        self.emit_some(f, None)
    }

    /// As [`Self::emit`], stopping at the end of the time in which `max_records` are
    /// reached ([`LivePoll::More`]), so that a caller can look at other things between steps.
    ///
    /// # Errors
    /// As [`Self::emit`].
    pub fn emit_at_most(
        &mut self,
        f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
        max_records: u64,
    ) -> Result<LivePoll, LoadError> {
        self.emit_some(f, Some(max_records))
    }

    fn emit_some(
        &mut self,
        f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
        max_records: Option<u64>,
    ) -> Result<LivePoll, LoadError> {
        let more = self.header_read && self.state.emit_written(f, max_records)?;
        Ok(if self.state.is_late() {
            LivePoll::Late
        } else if more {
            LivePoll::More
        } else {
            LivePoll::Going
        })
    }

    /// Once the tracer is done with the file: takes in the rest and emits every event left.
    ///
    /// # Errors
    /// As [`Self::emit`], and when an event came in late.
    pub fn finish(
        mut self,
        f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
    ) -> Result<BinaryInfo, LoadError> {
        self.take_in()?;
        if !self.header_read {
            // Too short for a header: the whole-file reading's error.
            read_header(&self.path, &self.pending)?;
        }
        if let Next::Cut(why) = frame_at(&self.pending, self.pending_at) {
            // The tracer's last write may be cut when the process was killed mid-write.
            self.state.cut(why);
        }
        self.state.finish(f)
    }

    /// Reads what the file holds beyond what was read, and takes in its whole frames.
    fn take_in(&mut self) -> Result<(), LoadError> {
        self.file
            .read_to_end(&mut self.pending)
            .map_err(|e| LoadError::io(&self.path, e))?;
        if !self.header_read {
            if self.pending.len() < HEADER_BYTES {
                return Ok(());
            }
            if read_header(&self.path, &self.pending)? != FileKind::Spool {
                return Err(LoadError::format(&self.path, "not a spool"));
            }
            self.pending.drain(..HEADER_BYTES);
            self.header_read = true;
        }
        let mut used = 0;
        while let Next::Frame(tag, payload, at) = frame_at(
            self.pending.get(used..).unwrap_or(&[]),
            self.pending_at + used,
        ) {
            let len = payload.len();
            self.state.frame(
                tag,
                Cow::Owned(payload.to_vec()),
                (at + HEADER_BYTES) as u64,
            )?;
            used += 5 + len;
        }
        self.pending.drain(..used);
        self.pending_at += used;
        Ok(())
    }
}
