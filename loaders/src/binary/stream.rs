//! A binary trace read block by block ([`BinaryEventStream`]): the events the loader would
//! build, decoded on demand from the file's blocks, for replays of traces larger than memory.
//!
//! Each block is read at the offset its index entry gives, decompressed, decoded, and its
//! records paired with earlier allocations exactly as the loader pairs them (the same
//! [`Pairing`]), so the events, ids and counts are the loader's. What it holds does not grow
//! with the trace: a few blocks' records (decoded ahead, [`ReadAhead`]) and one block's
//! events, the block index (about 20 bytes per 65,536 events), and the pairing's live
//! pointers (bounded by the live allocations).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use allocview_sim::stream::{EventBatch, EventSource};

use super::block::BlockDecoder;
use super::index::{BlockIndex, read_block, read_index};
use crate::error::LoadError;
use crate::events::{Line, LoadSummary, Pairing, Record, Requests, ThreadIds};

/// The events of a binary trace, decoded a block at a time (see the module docs).
pub struct BinaryEventStream {
    file: File,
    path: PathBuf,
    file_bytes: u64,
    index: BlockIndex,
    /// Decodes the blocks after the one being paired, on a thread of its own (started at the
    /// first read, from the stream's block then).
    ahead: Option<ReadAhead>,
    records: Vec<Record>,
    /// Where the stream stands: all that carries from one block to the next.
    at: StreamPoint,
    /// Which requests of a trace recorded in a CPython interpreter it reads.
    requests: Requests,
    /// Which heap's events it reads (0: the malloc family's; see `heaps.rs`).
    heap: u32,
}

/// Blocks decoded ahead: reading and decompressing a block need nothing of the blocks before
/// it, only the pairing does, so a thread decodes the next blocks while the stream pairs this
/// one (the loader decodes its blocks in parallel the same way).
struct ReadAhead {
    blocks: Receiver<Result<Vec<Record>, LoadError>>,
    /// Record buffers handed back for reuse.
    spent: SyncSender<Vec<Record>>,
}

/// Blocks queued decoded ahead of the pairing (one more may be decoded, waiting for room).
const BLOCKS_AHEAD: usize = 2;

impl ReadAhead {
    fn start(stream: &BinaryEventStream) -> Result<Self, LoadError> {
        let path = stream.path.clone();
        let file = stream
            .file
            .try_clone()
            .map_err(|e| LoadError::io(&path, e))?;
        let mut decoder = BlockDecoder::new(&path)?;
        let index = stream.index.clone();
        let (file_bytes, first) = (stream.file_bytes, stream.at.next_block);
        let (send, blocks) = sync_channel(BLOCKS_AHEAD);
        let (spent, returned) = sync_channel::<Vec<Record>>(BLOCKS_AHEAD + 2);
        std::thread::Builder::new()
            .name("allocview-decode".into())
            .spawn(move || {
                for block in index.blocks.iter().skip(first) {
                    let mut records = returned.try_recv().unwrap_or_default();
                    let read = read_block(
                        &file,
                        &path,
                        file_bytes,
                        &index,
                        block,
                        &mut decoder,
                        &mut records,
                    );
                    let failed = read.is_err();
                    // The stream has gone (dropped, or failed): stop.
                    if send.send(read.map(|()| records)).is_err() || failed {
                        break;
                    }
                }
            })
            .map_err(|e| LoadError::io(&stream.path, e))?;
        Ok(Self { blocks, spent })
    }
}

/// Where a stream stands between two blocks: all it needs to go on from there (the next
/// block, the pairing's live pointers, the threads and the counts so far), so that a later
/// part of the trace can be read without reading what comes before it again
/// ([`BinaryEventStream::open_at`]). Its memory is that of the live allocations.
#[derive(Clone)]
pub struct StreamPoint {
    next_block: usize,
    pairing: Pairing,
    threads: ThreadIds,
    summary: LoadSummary,
    events_per_thread: Vec<u64>,
    peak_live_bytes: u64,
    peak_live_event: u64,
}

impl StreamPoint {
    /// Events streamed before this point.
    #[must_use]
    pub fn events(&self) -> u64 {
        self.summary.events
    }

    /// Allocations live at this point (what its memory grows with).
    #[must_use]
    pub fn live_allocations(&self) -> usize {
        self.pairing.live_allocations()
    }

    /// Slots freed and not reused yet at this point (they are kept, in order).
    #[must_use]
    pub fn free_slots(&self) -> usize {
        self.pairing.free_slots()
    }
}

/// A [`StreamPoint`] packed small ([`StreamPoint::pack`]): the pairing's live pointers and
/// free slots as varints (see `allocview_sim::stream::packed`), the rest as it is.
#[derive(Clone)]
pub struct PackedStreamPoint {
    rest: StreamPoint,
    live: Box<[u8]>,
}

impl StreamPoint {
    /// This, packed small.
    #[must_use]
    pub fn pack(&self) -> PackedStreamPoint {
        let (pairing, live) = self.pairing.pack();
        PackedStreamPoint {
            rest: Self {
                next_block: self.next_block,
                pairing,
                threads: self.threads.clone(),
                summary: self.summary.clone(),
                events_per_thread: self.events_per_thread.clone(),
                peak_live_bytes: self.peak_live_bytes,
                peak_live_event: self.peak_live_event,
            },
            live,
        }
    }
}

impl PackedStreamPoint {
    /// The point packed; `None` if the bytes do not hold what [`StreamPoint::pack`] wrote
    /// (never, for bytes it wrote).
    #[must_use]
    pub fn unpack(&self) -> Option<StreamPoint> {
        let r = &self.rest;
        Some(StreamPoint {
            next_block: r.next_block,
            pairing: Pairing::unpack(&r.pairing, &self.live)?,
            threads: r.threads.clone(),
            summary: r.summary.clone(),
            events_per_thread: r.events_per_thread.clone(),
            peak_live_bytes: r.peak_live_bytes,
            peak_live_event: r.peak_live_event,
        })
    }

    /// Events streamed before the point.
    #[must_use]
    pub fn events(&self) -> u64 {
        self.rest.events()
    }

    /// Bytes this takes: the packed allocations, and the threads and counts beside them (not
    /// the counts' list of damaged lines, empty for a sound file).
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.live.len()
            + std::mem::size_of::<Self>()
            + self.rest.events_per_thread.len() * 8
            + self.rest.threads.order.len() * 32
    }
}

impl BinaryEventStream {
    /// Where the stream stands now, between two blocks (see [`StreamPoint`]).
    #[must_use]
    pub fn point(&self) -> StreamPoint {
        self.at.clone()
    }

    /// [`Self::point`], packed, without cloning the pairing's map first (packing sorts a list
    /// of the live allocations, 24 bytes each, for as long as it takes).
    #[must_use]
    pub fn packed_point(&self) -> PackedStreamPoint {
        self.at.pack()
    }

    /// The free slots a [`Self::point`] taken now would hold, without taking it.
    #[must_use]
    pub fn point_free_slots(&self) -> usize {
        self.at.pairing.free_slots()
    }

    /// The live allocations a [`Self::point`] taken now would hold, without taking it.
    #[must_use]
    pub fn point_live_allocations(&self) -> usize {
        self.at.live_allocations()
    }

    /// Opens a binary trace positioned at `point`, taken from a stream of the same file: the
    /// events that follow, with the ids, counts and warnings of a stream read from the start.
    ///
    /// # Errors
    /// As [`Self::open`]; and when the file no longer has the point's block (it changed).
    pub fn open_at(path: &Path, point: &StreamPoint) -> Result<Self, LoadError> {
        let mut s = Self::open(path)?;
        if point.next_block > s.index.blocks.len() {
            return Err(LoadError::format(
                path,
                format!(
                    "the file changed while it was shown: it has {} events blocks, and block {} \
                     was read before",
                    s.index.blocks.len(),
                    point.next_block
                ),
            ));
        }
        s.at = point.clone();
        Ok(s)
    }

    /// Opens a binary trace and reads (or builds) its block index.
    ///
    /// # Errors
    /// When the file cannot be read or is not a binary trace (a spool is refused: convert it).
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let index = read_index(path)?;
        let cut = index.cut.clone();
        let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
        let file_bytes = file.metadata().map_err(|e| LoadError::io(path, e))?.len();
        Ok(Self {
            file,
            path: path.to_owned(),
            file_bytes,
            index,
            ahead: None,
            records: Vec::new(),
            at: StreamPoint {
                next_block: 0,
                pairing: Pairing::default(),
                threads: ThreadIds::default(),
                summary: {
                    let mut summary = LoadSummary {
                        truncated: cut,
                        ..LoadSummary::default()
                    };
                    // Blocks allocated before recording started, or while it was stopped (a
                    // few bytes at the file's end say), are freed unseen.
                    if super::started_mid_run(&super::read_meta(path)?)
                        || super::read_marks(path)
                            .is_ok_and(|m| super::marks::recording_stopped(&m))
                    {
                        summary.mark_started_mid_run();
                    }
                    summary
                },
                events_per_thread: Vec::new(),
                peak_live_bytes: 0,
                peak_live_event: 0,
            },
            requests: Requests::default(),
            heap: 0,
        })
    }

    /// Reads the requests `requests` of a trace recorded in a CPython interpreter (a stream
    /// resumed at a point must read the view the point was taken in).
    #[must_use]
    pub fn with_requests(self, requests: Requests) -> Self {
        Self { requests, ..self }
    }

    /// Reads heap `heap`'s events (0, the default: the malloc family's; a name is resolved
    /// with [`super::resolve_heap`]). A stream resumed at a point must read the heap the
    /// point was taken in.
    #[must_use]
    pub fn with_heap(self, heap: u32) -> Self {
        Self { heap, ..self }
    }

    /// The trace's block index.
    #[must_use]
    pub fn index(&self) -> &BlockIndex {
        &self.index
    }

    /// The loader's counts over the events streamed so far (all of them once the stream ends).
    #[must_use]
    pub fn summary(&self) -> &LoadSummary {
        &self.at.summary
    }

    /// Events per thread index (threads numbered by first event), over the events so far.
    #[must_use]
    pub fn events_per_thread(&self) -> &[u64] {
        &self.at.events_per_thread
    }

    /// The peak of live bytes over the events so far (the bound of every policy's footprint).
    #[must_use]
    pub fn peak_live_bytes(&self) -> u64 {
        self.at.peak_live_bytes
    }

    /// The first event at which [`Self::peak_live_bytes`] is reached (0 when it is 0), as
    /// `TraceView::peak_live` gives it.
    #[must_use]
    pub fn peak_live_event(&self) -> u64 {
        self.at.peak_live_event
    }

    /// Thread ids in thread-index order, over the events so far.
    #[must_use]
    pub fn thread_ids(&self) -> &[u64] {
        &self.at.threads.order
    }

    /// Bytes of the file read so far: where the next block starts (the file's length after
    /// the last), for progress bars.
    #[must_use]
    pub fn bytes_read(&self) -> u64 {
        self.index
            .blocks
            .get(self.at.next_block)
            .map_or(self.file_bytes, |b| b.offset)
    }

    /// Reads the next block's events into `out` (cleared first); `Ok(false)` after the last.
    ///
    /// # Errors
    /// When a block does not read, or a record breaks a loader limit (as a strict load).
    pub fn next_events(&mut self, out: &mut EventBatch) -> Result<bool, LoadError> {
        out.clear();
        let Some(block) = self.index.blocks.get(self.at.next_block).copied() else {
            return Ok(false);
        };
        if self.ahead.is_none() {
            self.ahead = Some(ReadAhead::start(self)?);
        }
        let Some(ahead) = &self.ahead else {
            return Err(LoadError::format(
                &self.path,
                "the block reader did not start".to_owned(),
            ));
        };
        let records = ahead.blocks.recv().map_err(|_| {
            LoadError::format(
                &self.path,
                format!(
                    "the thread decoding its blocks stopped before the block at byte {}",
                    block.offset
                ),
            )
        })??;
        // A full return queue only means the decoder has buffers enough.
        let _ = ahead
            .spent
            .try_send(std::mem::replace(&mut self.records, records));
        self.at.next_block += 1;
        for (k, r) in self.records.iter().enumerate() {
            let bad = |why: &str| {
                LoadError::format(
                    &self.path,
                    format!(
                        "record {} (in the events block at byte {}): {why}",
                        block.first_record + k as u64,
                        block.offset
                    ),
                )
            };
            let Some(line) = Line::of_record(r, self.requests, self.heap, &mut self.at.summary)
            else {
                continue;
            };
            let addr = line.addr;
            let thread = self.at.threads.index(r.tid).map_err(bad)?;
            let p = self
                .at
                .pairing
                .pair_line(&mut self.at.summary, &line)
                .map_err(bad)?;
            // As the loader: a file that names calls has the call column.
            self.at.summary.has_call_column |= r.call.is_some();
            let per_thread = usize::from(thread);
            if self.at.events_per_thread.len() <= per_thread {
                self.at.events_per_thread.resize(per_thread + 1, 0);
            }
            if let Some((old_id, old_size, old_slot)) = p.displaced {
                out.push(p.t_ns, EVENT_FREE, old_size, old_id, old_slot, thread, addr);
                self.at.summary.events += 1;
                self.at.events_per_thread[per_thread] += 1;
            }
            out.push(p.t_ns, p.kind.code(), p.size, p.id, p.slot, thread, addr);
            if self.at.pairing.live_bytes() > self.at.peak_live_bytes {
                self.at.peak_live_bytes = self.at.pairing.live_bytes();
                self.at.peak_live_event = self.at.summary.events;
            }
            self.at.summary.events += 1;
            self.at.events_per_thread[per_thread] += 1;
        }
        Ok(true)
    }
}

const EVENT_FREE: u8 = allocview_sim::trace::EventKind::Free as u8;

impl EventSource for BinaryEventStream {
    fn time_span(&self) -> (i64, i64) {
        // The loader clamps times below 0, and a time that goes back to the latest before it:
        // the last event's time is the largest.
        self.index
            .time_span()
            .map_or((0, 0), |(first, last)| (first.max(0), last.max(0)))
    }

    fn next_batch(&mut self, out: &mut EventBatch) -> Result<bool, String> {
        self.next_events(out).map_err(|e| e.to_string())
    }
}
