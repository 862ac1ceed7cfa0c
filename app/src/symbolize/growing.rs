//! The call stacks of one trace as `record` writes them: while the program runs, what the
//! spool's placed stacks add since the last flush, with the symbols found for them on the
//! [`super::Prefetch`] thread, so that a follower of the trace (`record --live`) sees the
//! sites of its events by function; at the end, the rest, and what was found.

use std::path::Path;
use std::sync::mpsc;

use allocview_loaders::binary::{NativeStacks, SourceFrame, StacksWritten};
use anyhow::Result;

use super::{ModuleFeed, Report, Symbolized, Symbolizer};
use crate::trace_file::RecordWriter;

/// What a trace was given of its stacks, and the symbols found for them.
#[derive(Default)]
pub struct TraceStacks {
    written: StacksWritten,
    /// Locations sent to be symbolized (those before this index).
    sent: usize,
    /// Locations whose frames came back (those before this index): the rest are symbolized
    /// by [`Self::finish`].
    answered: usize,
    /// Frames found and not yet written, by location index.
    found: Vec<(usize, Vec<SourceFrame>)>,
    /// Locations named, and with a file and line.
    named: Report,
}

impl TraceStacks {
    /// Sends the locations of `stacks` not sent yet to `feed`'s thread, to be symbolized; the
    /// frames come back on `reply` as `trace`'s.
    pub fn ask(
        &mut self,
        trace: &Path,
        stacks: &NativeStacks,
        feed: &ModuleFeed,
        reply: &mpsc::Sender<Symbolized>,
    ) {
        let new = stacks.locations.get(self.sent..).unwrap_or(&[]);
        if !new.is_empty()
            && feed.symbolize(trace.to_path_buf(), self.sent, &stacks.modules, new, reply)
        {
            self.sent = stacks.locations.len();
        }
    }

    /// Takes in frames that came back.
    pub fn answer(&mut self, s: Symbolized) {
        self.take(s.first, s.frames);
    }

    fn take(&mut self, first: usize, frames: Vec<Vec<SourceFrame>>) {
        // The thread answers in the order asked; anything else is symbolized at the end.
        if first != self.answered {
            return;
        }
        self.answered += frames.len();
        self.named.count_named(&frames);
        let found = frames
            .into_iter()
            .enumerate()
            .filter(|(_, f)| !f.is_empty());
        self.found.extend(found.map(|(i, f)| (first + i, f)));
    }

    /// Writes what `stacks` adds to what the trace was given, and the frames found since.
    ///
    /// # Errors
    /// On write errors.
    pub fn write(&mut self, writer: &mut RecordWriter, stacks: &NativeStacks) -> Result<()> {
        writer.append_stacks(stacks, &self.found, &mut self.written)?;
        self.found.clear();
        Ok(())
    }

    /// Writes the rest of `stacks` (the whole tables, at the end), the locations whose frames
    /// did not come back symbolized with `symbolizer`, and tells what was found.
    ///
    /// # Errors
    /// On write errors.
    pub fn finish(
        mut self,
        writer: &mut RecordWriter,
        stacks: &NativeStacks,
        symbolizer: &mut Symbolizer,
    ) -> Result<Report> {
        let rest = stacks.locations.get(self.answered..).unwrap_or(&[]);
        let frames = symbolizer.resolve(&stacks.modules, rest);
        self.take(self.answered, frames);
        self.write(writer, stacks)?;
        let mut report = symbolizer.module_report(&stacks.modules, &stacks.locations);
        report.locations = stacks.locations.len();
        report.named = self.named.named;
        report.with_lines = self.named.with_lines;
        report.python = stacks.symbols.iter().filter(|s| !s.is_empty()).count();
        report.count_stacks(stacks);
        Ok(report)
    }
}
