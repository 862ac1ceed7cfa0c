//! `oracle` on a streamed trace, in two passes over the file.
//!
//! 1. **Plan.** The events are cut into pieces between the moments where nothing is live and
//!    each piece is planned alone, on every core, as the file is read
//!    ([`allocview_sim::plan::pieces`]: a piece's plan is the whole plan's offsets for it). The
//!    offsets go, in allocation order, to a temporary file, as zstd-compressed varints (about 2
//!    bytes an allocation; the file is unlinked as soon as it is made, so nothing is left behind
//!    however the run ends). The plan's size is the largest piece's.
//! 2. **Replay.** [`Oracle::streamed`] starts with the whole plan's size, as the loaded oracle
//!    does, and reads each allocation's offset from the file as the replay reaches it.
//!
//! Memory holds the pieces being planned, not the plan. A trace that goes more than
//! [`max_piece_allocations`] allocations without emptying its heap is refused: its plan would
//! have to be made whole.

use std::fs::File;
use std::io::{BufWriter, Read, Write as _};
use std::os::unix::fs::FileExt as _;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use allocview_sim::plan::pieces::{MIN_PIECE_BUFFERS, StreamPlan, plan_stream};
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::oracle::{Oracle, PlanFeed};
use allocview_sim::stream::Prefetched;
use allocview_sim::stream::packed::{delta, get, put, undelta};
use anyhow::{Context as _, Result};

use crate::progress::ByteProgress;
use crate::session::source::StreamInput;

/// Bytes of memory planning takes per allocation of a piece (its buffers, planning units and
/// the occupancy index: about 200 measured, with room).
const PLAN_BYTES_PER_ALLOCATION: u64 = 256;

/// The most allocations one piece may hold: `--jobs` pieces are planned at once and as many
/// again wait (queued, or planned before an earlier one is done), so all of them together take
/// at most half the available memory, and never more than 4,194,304 (1 GiB of planning per
/// piece; the shared traces' largest pieces have under 2 million).
pub(super) fn max_piece_allocations(jobs: usize, available_bytes: Option<u64>) -> usize {
    const MOST: u64 = 1 << 22;
    let held = 2 * jobs.max(1) as u64 + 1;
    let fits = available_bytes.map_or(MOST, |a| a / 2 / held / PLAN_BYTES_PER_ALLOCATION);
    usize::try_from(fits.clamp(MIN_PIECE_BUFFERS as u64, MOST)).unwrap_or(usize::MAX)
}

/// Compressed bytes read from the plan's file at a time.
const READ_BYTES: usize = 1 << 16;

/// A streamed trace's oracle plan, in its temporary file.
pub(super) struct SpilledPlan {
    file: Arc<File>,
    file_bytes: u64,
    max_live_bytes: u64,
    plan: StreamPlan,
}

/// Plans `input` for `oracle` with `config` on `jobs` threads, pieces of at most
/// `max_piece_allocations` (pass 1 of the module docs).
pub(super) fn plan(
    input: &StreamInput,
    config: &PolicyConfig,
    jobs: usize,
    max_piece_allocations: usize,
) -> Result<SpilledPlan> {
    let started = Instant::now();
    // The input first: no plan file for a trace that does not open.
    let source = input.open()?;
    let (file, path) = temporary_file()?;
    let file = Arc::new(file);
    let mut writer = PlanWriter::new(Arc::clone(&file))
        .with_context(|| format!("while starting the plan's file {}", path.display()))?;
    let events = input.events_hint(&source);
    eprintln!(
        "note: oracle streamed: planning {} events in pieces between the moments where \
         nothing is live, on {jobs} thread{}, before its replay",
        crate::format::count(events),
        if jobs == 1 { "" } else { "s" },
    );
    let read = Arc::new(AtomicU64::new(0));
    let bar = ByteProgress::start_events("planning oracle", events, Arc::clone(&read));
    let mut stream = Prefetched::start(source);
    let planned = plan_stream(
        &mut stream,
        config.align_bytes,
        jobs,
        MIN_PIECE_BUFFERS..=max_piece_allocations,
        Some(&read),
        &mut |ids, offsets| {
            writer
                .write(ids, offsets)
                .map_err(|e| format!("while writing the plan to {}: {e}", path.display()))
        },
    );
    drop(bar);
    let source = stream
        .finish()
        .context("the thread reading the trace failed")?;
    let plan = planned
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("while planning oracle for {}", input.file.display()))?;
    writer
        .finish()
        .with_context(|| format!("while writing the plan to {}", path.display()))?;
    let file_bytes = file
        .metadata()
        .with_context(|| format!("while reading the size of {}", path.display()))?
        .len();
    eprintln!(
        "note: oracle streamed: {} allocations planned in {} piece{} (largest {}) in {:.1} s; \
         the plan takes {} in a temporary file",
        crate::format::count(plan.allocations),
        crate::format::count(plan.pieces),
        if plan.pieces == 1 { "" } else { "s" },
        crate::format::count(plan.largest_piece_allocations),
        started.elapsed().as_secs_f64(),
        crate::format::bytes(file_bytes),
    );
    Ok(SpilledPlan {
        file,
        file_bytes,
        max_live_bytes: source.peak_live_bytes(),
        plan,
    })
}

/// Writes plan records: per allocation, the step from the previous id and the offset, as
/// varints, zstd-compressed with a checksum.
struct PlanWriter {
    encoder: zstd::stream::write::Encoder<'static, BufWriter<Arc<File>>>,
    bytes: Vec<u8>,
    prev_id: u64,
}

impl PlanWriter {
    fn new(file: Arc<File>) -> std::io::Result<Self> {
        let mut encoder =
            zstd::stream::write::Encoder::new(BufWriter::with_capacity(1 << 20, file), 1)?;
        encoder.include_checksum(true)?;
        Ok(Self {
            encoder,
            bytes: Vec::with_capacity(1 << 16),
            prev_id: 0,
        })
    }

    fn write(&mut self, ids: &[u32], offsets: &[u64]) -> std::io::Result<()> {
        self.bytes.clear();
        for (&id, &offset) in ids.iter().zip(offsets) {
            put(&mut self.bytes, delta(self.prev_id, u64::from(id)));
            put(&mut self.bytes, offset);
            self.prev_id = u64::from(id);
        }
        self.encoder.write_all(&self.bytes)
    }

    fn finish(self) -> std::io::Result<()> {
        self.encoder.finish()?.flush()
    }
}

/// A new file in the temporary folder, already unlinked, and the name it had.
fn temporary_file() -> Result<(File, std::path::PathBuf)> {
    let dir = std::env::temp_dir();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut attempt = 0u32;
    let (file, path) = loop {
        let path = dir.join(format!(
            "allocview-oracle-plan-{}-{nanos}-{attempt}",
            std::process::id()
        ));
        match File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(file) => break (file, path),
            // Another plan of this process (`report`, two oracle variants) took the name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 1000 => {
                attempt += 1;
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "while making a temporary file for the oracle's plan in {} (set TMPDIR \
                         to another folder)",
                        dir.display()
                    )
                });
            }
        }
    };
    // Open, it stays readable; unlinked, it goes when the process does, however it ends.
    std::fs::remove_file(&path)
        .with_context(|| format!("while unlinking the temporary file {}", path.display()))?;
    Ok((file, path))
}

/// What went wrong reading a streamed plan, kept for the replay's caller: the oracle can only
/// refuse the allocation it was serving, and the run must not pass for a complete one.
pub(super) type FeedError = Arc<Mutex<Option<String>>>;

impl SpilledPlan {
    /// The streamed oracle of this plan (pass 2 of the module docs), reading the plan from the
    /// start, and where a failure to read it is kept.
    pub(super) fn oracle(&self, config: &PolicyConfig) -> Result<(Oracle, FeedError)> {
        let reader = At {
            file: Arc::clone(&self.file),
            at_bytes: 0,
            end_bytes: self.file_bytes,
        };
        let error = FeedError::default();
        let feed = FileFeed::new(reader, READ_BYTES, Arc::clone(&error))
            .context("while reading the oracle's plan")?;
        let oracle = Oracle::streamed(
            config,
            self.plan.total_bytes,
            self.max_live_bytes,
            Box::new(feed),
        );
        Ok((oracle, error))
    }
}

/// The plan's file read from `at_bytes` (positional reads: every replay reads it on its own).
struct At {
    file: Arc<File>,
    at_bytes: u64,
    end_bytes: u64,
}

impl Read for At {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let left = usize::try_from(self.end_bytes - self.at_bytes).unwrap_or(usize::MAX);
        let want = out.len().min(left);
        let Some(out) = out.get_mut(..want) else {
            return Ok(0);
        };
        let n = self.file.read_at(out, self.at_bytes)?;
        self.at_bytes += n as u64;
        Ok(n)
    }
}

/// The plan's records, decoded as the replay asks for them.
struct FileFeed<R: Read> {
    decoder: zstd::stream::read::Decoder<'static, std::io::BufReader<R>>,
    /// Decompressed bytes not yet decoded start at `at`.
    buf: Vec<u8>,
    at: usize,
    read_bytes: usize,
    ended: bool,
    prev_id: u64,
    error: FeedError,
}

/// The longest record: two varints of at most ten bytes.
const RECORD_BYTES_MAX: usize = 20;

impl<R: Read> FileFeed<R> {
    fn new(reader: R, read_bytes: usize, error: FeedError) -> std::io::Result<Self> {
        Ok(Self {
            decoder: zstd::stream::read::Decoder::new(reader)?,
            buf: Vec::with_capacity(read_bytes.max(RECORD_BYTES_MAX)),
            at: 0,
            read_bytes: read_bytes.max(RECORD_BYTES_MAX),
            ended: false,
            prev_id: 0,
            error,
        })
    }

    /// Keeps at least one whole record in `buf` unless the plan has ended.
    fn fill(&mut self) -> std::io::Result<()> {
        if self.ended || self.buf.len() - self.at >= RECORD_BYTES_MAX {
            return Ok(());
        }
        self.buf.drain(..self.at);
        self.at = 0;
        let mut filled = self.buf.len();
        self.buf.resize(self.read_bytes, 0);
        let read = loop {
            if filled >= RECORD_BYTES_MAX {
                break Ok(());
            }
            let Some(room) = self.buf.get_mut(filled..) else {
                break Ok(());
            };
            match self.decoder.read(room) {
                Ok(0) => {
                    self.ended = true;
                    break Ok(());
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        // On an error too: what was not read must not be decoded.
        self.buf.truncate(filled);
        read
    }

    fn next_record(&mut self) -> Result<Option<(u32, u64)>, String> {
        self.fill()
            .map_err(|e| format!("while reading the oracle's plan: {e}"))?;
        let mut rest = self.buf.get(self.at..).unwrap_or(&[]);
        if rest.is_empty() {
            return Ok(None);
        }
        let before = rest.len();
        let (Some(d), Some(offset)) = (get(&mut rest), get(&mut rest)) else {
            return Err("the oracle's plan ends in the middle of a record".to_owned());
        };
        self.at += before - rest.len();
        let id = undelta(self.prev_id, d);
        self.prev_id = id;
        let id = u32::try_from(id).map_err(|_| format!("the plan names allocation {id}"))?;
        Ok(Some((id, offset)))
    }
}

impl<R: Read + Send> PlanFeed for FileFeed<R> {
    fn next_planned(&mut self) -> Result<Option<(u32, u64)>, String> {
        let next = self.next_record();
        if let Err(e) = &next {
            let mut kept = self.error.lock().unwrap_or_else(PoisonError::into_inner);
            kept.get_or_insert_with(|| e.clone());
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records written in pieces, read back through reads of a few bytes at a time (so
    /// records straddle every refill), come back as written; a cut file is an error kept
    /// for the caller; an empty plan has no record.
    #[test]
    fn the_plan_file_reads_back_what_was_written() {
        let (file, _) = temporary_file().unwrap();
        let file = Arc::new(file);
        let mut writer = PlanWriter::new(Arc::clone(&file)).unwrap();
        let mut want = Vec::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for piece in 0..50u32 {
            let ids: Vec<u32> = (0..100).map(|k| piece * 100 + k).collect();
            let offsets: Vec<u64> = ids
                .iter()
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x >> (x % 64)
                })
                .collect();
            writer.write(&ids, &offsets).unwrap();
            want.extend(ids.into_iter().zip(offsets));
        }
        writer.finish().unwrap();
        let len = file.metadata().unwrap().len();
        let read = |end_bytes: u64, read_bytes: usize| {
            let at = At {
                file: Arc::clone(&file),
                at_bytes: 0,
                end_bytes,
            };
            let error = FeedError::default();
            let mut feed = FileFeed::new(at, read_bytes, Arc::clone(&error)).unwrap();
            let mut got = Vec::new();
            let end = loop {
                match feed.next_planned() {
                    Ok(Some(r)) => got.push(r),
                    Ok(None) => break None,
                    Err(e) => break Some(e),
                }
            };
            (got, end, error.lock().unwrap().clone())
        };
        for read_bytes in [1, 7, 23, READ_BYTES] {
            let (got, end, kept) = read(len, read_bytes);
            assert_eq!(got, want, "{read_bytes}");
            assert_eq!((end, kept), (None, None));
        }
        let (got, end, kept) = read(len / 2, 64);
        assert!(got.len() < want.len() && got[..] == want[..got.len()]);
        assert!(end.is_some() && end == kept, "{end:?} {kept:?}");

        let (empty, _) = temporary_file().unwrap();
        let empty = Arc::new(empty);
        PlanWriter::new(Arc::clone(&empty))
            .unwrap()
            .finish()
            .unwrap();
        let at = At {
            end_bytes: empty.metadata().unwrap().len(),
            file: empty,
            at_bytes: 0,
        };
        let mut feed = FileFeed::new(at, 64, FeedError::default()).unwrap();
        assert_eq!(feed.next_planned(), Ok(None));
    }

    #[test]
    fn pieces_fit_half_the_memory_and_are_capped() {
        assert_eq!(max_piece_allocations(2, None), 1 << 22);
        assert_eq!(max_piece_allocations(2, Some(24 << 30)), 1 << 22);
        // 1 GiB available, two jobs: five pieces in half of it.
        assert_eq!(
            max_piece_allocations(2, Some(1 << 30)),
            (1 << 29) / 5 / PLAN_BYTES_PER_ALLOCATION as usize
        );
        assert_eq!(max_piece_allocations(8, Some(1 << 20)), MIN_PIECE_BUFFERS);
    }
}
