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
//! [`MAX_PIECE_ALLOCATIONS`] allocations without emptying its heap is refused: its plan would
//! have to be made whole.

use std::fs::File;
use std::io::{BufWriter, Read, Write as _};
use std::os::unix::fs::FileExt as _;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use allocview_sim::plan::pieces::{StreamPlan, plan_stream};
use allocview_sim::policy::oracle::{Oracle, PlanFeed};
use allocview_sim::policy::registry::PolicyConfig;
use allocview_sim::stream::Prefetched;
use allocview_sim::stream::packed::{delta, get, put, undelta};
use anyhow::{Context as _, Result};

use super::stream_source::StreamInput;
use crate::progress::ByteProgress;

/// Allocations one piece may hold. Planning takes about 200 bytes an allocation, and up to
/// `2 * jobs + 1` pieces are held at once, so this bounds the plan to about 4.5 GiB on two
/// cores; the shared traces' largest pieces have under 2 million.
pub(super) const MAX_PIECE_ALLOCATIONS: usize = 1 << 22;

/// Compressed bytes read from the plan's file at a time.
const READ_BYTES: usize = 1 << 16;

/// A streamed trace's oracle plan, in its temporary file.
pub(super) struct SpilledPlan {
    file: Arc<File>,
    file_bytes: u64,
    max_live_bytes: u64,
    plan: StreamPlan,
}

/// Plans `input` for `oracle` with `config` on `jobs` threads (pass 1 of the module docs).
pub(super) fn plan(input: &StreamInput, config: &PolicyConfig, jobs: usize) -> Result<SpilledPlan> {
    let started = Instant::now();
    let (file, path) = temporary_file()?;
    let file = Arc::new(file);
    let writer = BufWriter::with_capacity(1 << 20, Arc::clone(&file));
    let mut encoder = zstd::stream::write::Encoder::new(writer, 1)
        .with_context(|| format!("while starting the plan's file {}", path.display()))?;
    let mut bytes = Vec::with_capacity(1 << 16);
    let mut prev_id = 0u64;
    let source = input.open()?;
    let events = input.events_hint(&source);
    eprintln!(
        "note: oracle streamed: planning {} events in pieces between the moments where \
         nothing is live, on {jobs} threads, before its replay",
        crate::format::count(events)
    );
    let read = Arc::new(AtomicU64::new(0));
    let bar = ByteProgress::start_events("planning oracle", events, Arc::clone(&read));
    let mut stream = Prefetched::start(source);
    let planned = plan_stream(
        &mut stream,
        config.align_bytes,
        jobs,
        MAX_PIECE_ALLOCATIONS,
        Some(&read),
        &mut |ids, offsets| {
            bytes.clear();
            for (&id, &offset) in ids.iter().zip(offsets) {
                put(&mut bytes, delta(prev_id, u64::from(id)));
                put(&mut bytes, offset);
                prev_id = u64::from(id);
            }
            encoder
                .write_all(&bytes)
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
    encoder
        .finish()
        .and_then(|mut w| w.flush())
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

/// A new file in the temporary folder, already unlinked, and the name it had.
fn temporary_file() -> Result<(File, std::path::PathBuf)> {
    let dir = std::env::temp_dir();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let path = dir.join(format!(
        "allocview-oracle-plan-{}-{nanos}",
        std::process::id()
    ));
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| {
            format!(
                "while making a temporary file for the oracle's plan in {} (set TMPDIR to \
                 another folder)",
                dir.display()
            )
        })?;
    // Open, it stays readable; unlinked, it goes when the process does, however it ends.
    std::fs::remove_file(&path)
        .with_context(|| format!("while unlinking the temporary file {}", path.display()))?;
    Ok((file, path))
}

impl SpilledPlan {
    /// The streamed oracle of this plan (pass 2 of the module docs), reading the plan from the
    /// start.
    pub(super) fn oracle(&self, config: &PolicyConfig) -> Result<Oracle> {
        let reader = At {
            file: Arc::clone(&self.file),
            at: 0,
            end: self.file_bytes,
        };
        let decoder =
            zstd::stream::read::Decoder::new(reader).context("while reading the oracle's plan")?;
        let feed = FileFeed {
            decoder,
            buf: Vec::with_capacity(READ_BYTES),
            at: 0,
            ended: false,
            prev_id: 0,
        };
        Ok(Oracle::streamed(
            config,
            self.plan.total_bytes,
            self.max_live_bytes,
            Box::new(feed),
        ))
    }
}

/// The plan's file read from `at` (positional reads: every replay reads it on its own).
struct At {
    file: Arc<File>,
    at: u64,
    end: u64,
}

impl Read for At {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let left = usize::try_from(self.end - self.at).unwrap_or(usize::MAX);
        let want = out.len().min(left);
        let Some(out) = out.get_mut(..want) else {
            return Ok(0);
        };
        let n = self.file.read_at(out, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// The plan's allocations, decoded as the replay asks for them.
struct FileFeed {
    decoder: zstd::stream::read::Decoder<'static, std::io::BufReader<At>>,
    buf: Vec<u8>,
    at: usize,
    ended: bool,
    prev_id: u64,
}

impl FileFeed {
    /// Keeps at least one whole record (two varints, at most 20 bytes) in `buf` unless the
    /// file has ended.
    fn fill(&mut self) -> Result<(), String> {
        if self.ended || self.buf.len() - self.at >= 20 {
            return Ok(());
        }
        self.buf.drain(..self.at);
        self.at = 0;
        let have = self.buf.len();
        self.buf.resize(READ_BYTES, 0);
        let mut filled = have;
        while filled < 20 {
            let Some(room) = self.buf.get_mut(filled..) else {
                break;
            };
            let n = self
                .decoder
                .read(room)
                .map_err(|e| format!("while reading the oracle's plan: {e}"))?;
            if n == 0 {
                self.ended = true;
                break;
            }
            filled += n;
        }
        self.buf.truncate(filled);
        Ok(())
    }
}

impl PlanFeed for FileFeed {
    fn next_planned(&mut self) -> Result<Option<(u32, u64)>, String> {
        self.fill()?;
        let mut rest = self.buf.get(self.at..).unwrap_or(&[]);
        if rest.is_empty() {
            return Ok(None);
        }
        let before = rest.len();
        let (Some(d), Some(offset)) = (get(&mut rest), get(&mut rest)) else {
            return Err("the oracle's plan file is damaged".to_owned());
        };
        self.at += before - rest.len();
        let id = undelta(self.prev_id, d);
        self.prev_id = id;
        let id = u32::try_from(id).map_err(|_| format!("the plan names allocation {id}"))?;
        Ok(Some((id, offset)))
    }
}
