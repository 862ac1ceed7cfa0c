//! A live trace's writing on a thread of its own ([`Pipe`]): the recording's summary and the
//! trace file's encoding and compression take the records in batches, while the converter's
//! thread reads and merges the spool. Used once the command has exited, for the backlog it
//! leaves when it allocates faster than one core converts: that part is then converted on both
//! cores instead of one. While the command runs the converter stays on one thread: a second
//! one took CPU from the command's own threads (`record` of the C++ stacks workload took
//! 1.92-2.09 s that way, against 1.82-1.99 s).

use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::thread::JoinHandle;

use allocview_loaders::analysis::stats::RecordingStats;
use allocview_loaders::events::Record;

use crate::trace_file::RecordWriter;

/// Records per batch: large enough that handing one over costs nothing per record, small
/// enough that the writing thread starts soon after the converter does.
const BATCH_RECORDS: usize = 16_384;
/// Batches on their way to the writing thread, at most: the converter waits beyond that.
const BATCHES_IN_FLIGHT: usize = 4;

/// What the writing thread hands back once every batch is in.
pub(super) struct Written {
    pub writer: RecordWriter,
    pub stats: RecordingStats,
}

/// The converter's end of the writing thread.
pub(super) struct Pipe {
    to_writer: Option<SyncSender<Vec<Record>>>,
    /// Emptied batches, sent back to be filled again.
    emptied: Receiver<Vec<Record>>,
    batch: Vec<Record>,
    worker: Option<JoinHandle<Result<Written, String>>>,
}

impl Pipe {
    /// Starts the thread that counts (`stats`) and writes (`writer`) the records.
    ///
    /// # Errors
    /// When no thread can be started.
    pub(super) fn start(writer: RecordWriter, stats: RecordingStats) -> std::io::Result<Self> {
        let (to_writer, batches) = sync_channel::<Vec<Record>>(BATCHES_IN_FLIGHT);
        let (give_back, emptied) = sync_channel::<Vec<Record>>(BATCHES_IN_FLIGHT + 1);
        let worker = std::thread::Builder::new()
            .name("allocview-write".to_owned())
            .spawn(move || write_batches(&batches, &give_back, writer, stats))?;
        Ok(Self {
            to_writer: Some(to_writer),
            emptied,
            batch: Vec::with_capacity(BATCH_RECORDS),
            worker: Some(worker),
        })
    }

    /// Takes one record; hands a full batch to the writing thread.
    ///
    /// # Errors
    /// When the writing thread stopped (its error comes from [`Self::close`]).
    pub(super) fn push(&mut self, r: &Record) -> Result<(), &'static str> {
        self.batch.push(*r);
        if self.batch.len() >= BATCH_RECORDS {
            self.flush()?;
        }
        Ok(())
    }

    /// Hands the records taken so far to the writing thread.
    ///
    /// # Errors
    /// As [`Self::push`].
    pub(super) fn flush(&mut self) -> Result<(), &'static str> {
        const STOPPED: &str = "the trace's writing thread to go on";
        if self.batch.is_empty() {
            return Ok(());
        }
        let next = match self.emptied.try_recv() {
            Ok(v) => v,
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => {
                Vec::with_capacity(BATCH_RECORDS)
            }
        };
        let full = std::mem::replace(&mut self.batch, next);
        self.to_writer
            .as_ref()
            .ok_or(STOPPED)?
            .send(full)
            .map_err(|_| STOPPED)
    }

    /// Hands over what is left and waits for the writing thread: the writer (every record
    /// written to it, the file not finished) and the summary, or the thread's error.
    ///
    /// # Errors
    /// The first record the summary or the writer refused, or a failed write.
    pub(super) fn close(mut self) -> Result<Written, String> {
        let flushed = self.flush();
        self.to_writer = None;
        let joined = self
            .worker
            .take()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err("the trace's writing thread panicked".to_owned()))
            })
            .unwrap_or_else(|| Err("the trace's writing thread is gone".to_owned()));
        // The thread's own error says more than "it stopped".
        let written = joined?;
        flushed.map_err(str::to_owned)?;
        Ok(written)
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        // A pipe given up on: the thread sees the channel close, ends, and drops the file
        // (unfinished, so never put in place of the output).
        self.to_writer = None;
        if let Some(w) = self.worker.take() {
            w.join().ok();
        }
    }
}

/// The writing thread: every batch through the summary and the writer, in order, until the
/// converter closes the channel or a record is refused.
fn write_batches(
    batches: &Receiver<Vec<Record>>,
    give_back: &SyncSender<Vec<Record>>,
    mut writer: RecordWriter,
    mut stats: RecordingStats,
) -> Result<Written, String> {
    for mut batch in batches {
        for r in &batch {
            stats
                .push(r)
                .map_err(|e| format!("a record the summary refused: {e}"))?;
            writer
                .push(r)
                .map_err(|e| format!("cannot write the trace: {e}"))?;
        }
        batch.clear();
        // The converter may have enough batches already: then this one is dropped.
        give_back.try_send(batch).ok();
    }
    Ok(Written { writer, stats })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace_file::Form;
    use allocview_loaders::binary::TimeBase;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("allocview-pipe-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A pipe to a binary trace `t.avt` in a fresh directory: the directory, the path, the pipe.
    fn pipe_in(name: &str) -> (std::path::PathBuf, std::path::PathBuf, Pipe) {
        let dir = scratch(name);
        let path = dir.join("t.avt");
        let writer = RecordWriter::create(&path, Form::Binary, &[], &[]).unwrap();
        let pipe = Pipe::start(writer, RecordingStats::default()).unwrap();
        (dir, path, pipe)
    }

    fn record(i: u64) -> Record {
        Record {
            t_ns: i64::try_from(i).unwrap(),
            tid: 1,
            size_bytes: if i.is_multiple_of(2) {
                Some(16 + i)
            } else {
                None
            },
            // Each free (odd i) frees the allocation just before it.
            addr: 0x1000 + (i / 2) * 0x100,
            call: None,
            stack: None,
            heap: 0,
        }
    }

    /// Records pushed through the pipe, over several batches and a partial last one, are
    /// written in order and counted: the file loads back as the same events, and the summary
    /// is the one counted on this thread.
    #[test]
    fn records_through_the_pipe_are_written_in_order_and_counted() {
        let dir = scratch("order");
        let path = dir.join("t.avt");
        let meta = vec![("source".to_owned(), "test".to_owned())];
        let writer = RecordWriter::create(&path, Form::Binary, &meta, &[]).unwrap();
        let mut pipe = Pipe::start(writer, RecordingStats::default()).unwrap();
        let n = 3 * BATCH_RECORDS as u64 + 7;
        let mut here = RecordingStats::default();
        for i in 0..n {
            let r = record(i);
            here.push(&r).unwrap();
            pipe.push(&r).unwrap();
            if i == 100 {
                pipe.flush().unwrap();
            }
        }
        let Written { writer, stats } = pipe.close().unwrap();
        assert_eq!(writer.finish().unwrap(), n);
        assert_eq!(stats.finish(), here.finish());
        let mut back = Vec::new();
        allocview_loaders::binary::read_records(&path, TimeBase::default(), |r: &Record| {
            back.push(*r);
            Ok(())
        })
        .unwrap();
        let expected: Vec<Record> = (0..n).map(record).collect();
        assert_eq!(back, expected);
        std::fs::remove_dir_all(dir).ok();
    }

    /// When the writing thread stops at a record the summary refuses (two live allocations
    /// whose sizes add up past 2^64), the converter's pushes fail instead of waiting on the
    /// full channel, and closing says which record it was; no file is left.
    #[test]
    fn a_refused_record_stops_the_pipe_and_close_says_why() {
        let (dir, _, mut pipe) = pipe_in("refused");
        let huge = |i: u64| Record {
            size_bytes: Some(1 << 63),
            addr: 0x1000 * (i + 1),
            ..record(0)
        };
        pipe.push(&huge(0)).unwrap();
        pipe.push(&huge(1)).unwrap();
        pipe.flush().unwrap();
        // More batches than the channel holds: a push fails once the thread is gone.
        let pushed = (0..(BATCHES_IN_FLIGHT + 2) * BATCH_RECORDS)
            .map(|i| pipe.push(&record(2 * i as u64)))
            .position(|r| r.is_err());
        assert!(pushed.is_some(), "every push was taken");
        let why = pipe.close().err().unwrap();
        assert!(why.contains("a record the summary refused"), "{why}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no file left");
        std::fs::remove_dir_all(dir).ok();
    }

    /// A pipe dropped without being closed leaves no trace file behind.
    #[test]
    fn a_pipe_given_up_leaves_no_file() {
        let (dir, path, mut pipe) = pipe_in("dropped");
        pipe.push(&record(0)).unwrap();
        drop(pipe);
        assert!(!path.exists());
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "no temporary file left"
        );
        std::fs::remove_dir_all(dir).ok();
    }
}
