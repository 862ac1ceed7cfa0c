//! Reading a trace (kind 0): its frames in order, the decoding of its event blocks, and what
//! happens when a frame does not read.
//!
//! A frame that does not read (an impossible length, a length running past the end of the
//! file, an events block that does not decompress or decode, a thread table that does not
//! parse) is either the end of a cut file or damage in the middle. The reader tells them apart
//! by looking for the next frame that reads in full after it ([`Reader::resync`]): frames
//! are self-delimiting and an events block is strongly checked (zstd's magic and content size,
//! then every event of the block decoded), so finding one means the file goes on. Nothing
//! found: the file was cut there ([`BinaryInfo::truncated`], not an error, as before). Found:
//!
//! - strict: an error naming the file, the offset, what was wrong and where the file reads
//!   again;
//! - lenient: when the damaged frame reads in full once its end is taken from where the next
//!   frame starts (only its length was wrong), it is *repaired* and nothing is lost; otherwise
//!   the bytes up to the next frame are skipped. Each stretch is a [`Damage`] in
//!   [`BinaryInfo::damaged`], and the events lost are counted from the END frame's total.
//!
//! A block is decoded in full before any of its records is passed on, so a damaged block
//! contributes nothing rather than a prefix of garbage.

use std::path::Path;

use super::block::BlockDecoder;
use super::codec::Cursor;
use super::frames::parse_meta;
use super::index::{BlockEntry, BlockIndex};
use super::stacks::{
    self, FRAME_LOCATIONS, FRAME_MODULES, FRAME_STACKS, FRAME_SYMBOLS, NativeStacks,
};
use super::verify::{check_loaded, declared_events};
use super::{
    BinaryInfo, FRAME_END, FRAME_EVENTS, FRAME_META, FRAME_THREADS, FileKind, MAX_FRAME_BYTES,
    corrupt,
};
use crate::error::LoadError;
use crate::events::{Damage, Record, Strictness};

/// Bytes of the file header before the first frame (frame positions below are relative to it).
const HEADER_BYTES: u64 = 10;
/// Bytes of a frame header: tag u8, length u32.
const FRAME_HEADER_BYTES: usize = 5;

/// One frame, decoded but not yet applied (so that a frame is taken whole or not at all).
enum Parsed {
    Meta(Vec<(String, String)>),
    Memory(Vec<super::MemorySample>),
    Mappings(Vec<super::Mapping>),
    Marks(Vec<super::Mark>),
    /// A HEAPS frame's names (`heaps.rs`).
    Heaps(Vec<super::HeapName>),
    Threads(Vec<u64>),
    /// The block's records are in [`Reader::decoded`].
    Events,
    End(u64),
    /// The INDEX frame, checked against the blocks read once they are all read.
    Index(BlockIndex),
    /// Part of the call-stack tables (`stacks.rs`), with a SYMBOLS frame's entries.
    Stacks(NativeStacks, stacks::SymbolEntries),
    /// A tag this version does not know: skipped, so later versions may add informative ones.
    Unknown,
}

/// Why the frame at a position did not read.
struct Problem {
    what: String,
    /// The frame runs past the end of the file: a cut file, unless a frame reads after it.
    past_end: bool,
}

/// A frame found at a position: tag, payload and the position after it.
struct FrameAt<'a> {
    tag: u8,
    payload: &'a [u8],
    next: usize,
}

struct Reader<'a> {
    /// The file after its header.
    bytes: &'a [u8],
    threads: Vec<u64>,
    decoded: Vec<Record>,
    decoder: BlockDecoder,
}

impl<'a> Reader<'a> {
    /// The frame header at `pos` and its payload's extent.
    fn frame_at(&self, pos: usize) -> Result<FrameAt<'a>, Problem> {
        let rest = self.bytes.get(pos..).unwrap_or(&[]);
        let mut c = Cursor::new(rest);
        let (Some(tag), Some(len)) = (c.u8(), c.u32()) else {
            return Err(Problem {
                what: "a frame header is cut".into(),
                past_end: true,
            });
        };
        let len = len as usize;
        if len > MAX_FRAME_BYTES {
            return Err(Problem {
                what: format!("a frame length of {len} bytes (at most {MAX_FRAME_BYTES} are read)"),
                past_end: false,
            });
        }
        let Some(payload) = c.take(len) else {
            return Err(Problem {
                what: format!(
                    "a frame of {len} bytes runs past the end of the file ({} bytes left)",
                    rest.len().saturating_sub(FRAME_HEADER_BYTES)
                ),
                past_end: true,
            });
        };
        Ok(FrameAt {
            tag,
            payload,
            next: pos + FRAME_HEADER_BYTES + len,
        })
    }

    /// Decodes one frame's payload without applying it.
    fn parse(&mut self, tag: u8, payload: &[u8]) -> Result<Parsed, String> {
        let mut c = Cursor::new(payload);
        match tag {
            FRAME_META => Ok(Parsed::Meta(parse_meta(payload))),
            FRAME_THREADS => {
                let n = c.varint().ok_or("a cut thread count")?;
                // Each id takes at least a byte: a count beyond the payload is damage.
                if n > payload.len() as u64 {
                    return Err(format!(
                        "a thread count of {n} in a {}-byte frame",
                        payload.len()
                    ));
                }
                let mut ids = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    ids.push(c.varint().ok_or("a cut thread id")?);
                }
                if !c.at_end() {
                    return Err("bytes after the thread table".into());
                }
                Ok(Parsed::Threads(ids))
            }
            FRAME_EVENTS => {
                self.parse_events(payload, &[])?;
                Ok(Parsed::Events)
            }
            FRAME_MODULES | FRAME_LOCATIONS | FRAME_STACKS | FRAME_SYMBOLS => {
                let mut part = NativeStacks::default();
                let symbols = stacks::read_frame(&mut part, tag, payload)?;
                Ok(Parsed::Stacks(part, symbols))
            }
            FRAME_END => {
                let total = c.varint().ok_or("a cut end frame")?;
                if !c.at_end() {
                    return Err("bytes after the end frame's count".into());
                }
                Ok(Parsed::End(total))
            }
            super::FRAME_INDEX => Ok(Parsed::Index(BlockIndex::decode(payload)?)),
            super::memory::FRAME_MEMORY => {
                Ok(Parsed::Memory(super::memory::decode_frame(payload)?))
            }
            super::memory::FRAME_MAPPINGS => {
                Ok(Parsed::Mappings(super::memory::decode_mappings(payload)?))
            }
            super::marks::FRAME_MARKS => Ok(Parsed::Marks(super::marks::decode_frame(payload)?)),
            super::heaps::FRAME_HEAPS => {
                let mut names = Vec::new();
                super::heaps::decode_names(payload, &mut names).ok_or("a corrupt heaps frame")?;
                Ok(Parsed::Heaps(names))
            }
            _ => Ok(Parsed::Unknown),
        }
    }

    /// Decompresses and decodes an events block into [`Self::decoded`]; `more_threads` are
    /// threads introduced by a frame not yet applied (when looking for where the file reads
    /// again).
    fn parse_events(&mut self, payload: &[u8], more_threads: &[u64]) -> Result<(), String> {
        self.decoder
            .decode_with(payload, &self.threads, more_threads, &mut self.decoded)
    }

    /// The first position from `from` on where a frame reads in full and is followed by a
    /// plausible frame header (or the end of the file): where the file goes on after damage.
    /// META frames (only ever first) and unknown tags are not taken: they check nothing.
    fn resync(&mut self, from: usize) -> Option<usize> {
        let end = self.bytes.len();
        for q in from..end.saturating_sub(FRAME_HEADER_BYTES - 1) {
            let tag = self.bytes.get(q).copied()?;
            if !matches!(tag, FRAME_THREADS | FRAME_EVENTS | FRAME_END) {
                continue;
            }
            let Ok(frame) = self.frame_at(q) else {
                continue;
            };
            let ok = match tag {
                // The last frame: it ends the file exactly.
                FRAME_END => {
                    frame.next == end
                        && matches!(self.parse(tag, frame.payload), Ok(Parsed::End(_)))
                }
                FRAME_EVENTS => {
                    self.plausible_header(frame.next)
                        && self.parse_events(frame.payload, &[]).is_ok()
                }
                // A thread table comes right before the block that uses it: both must read.
                _ => match self.parse(tag, frame.payload) {
                    Ok(Parsed::Threads(ids)) => self.frame_at(frame.next).is_ok_and(|ev| {
                        ev.tag == FRAME_EVENTS
                            && self.plausible_header(ev.next)
                            && self.parse_events(ev.payload, &ids).is_ok()
                    }),
                    _ => false,
                },
            };
            if ok {
                return Some(q);
            }
        }
        None
    }

    /// True at the end of the file, before a cut header, or at a header with a known tag.
    fn plausible_header(&self, pos: usize) -> bool {
        let left = self.bytes.len().saturating_sub(pos);
        left < FRAME_HEADER_BYTES
            || self.bytes.get(pos).is_some_and(|t| {
                matches!(
                    *t,
                    FRAME_THREADS
                        | FRAME_EVENTS
                        | FRAME_END
                        | FRAME_MODULES
                        | FRAME_LOCATIONS
                        | FRAME_STACKS
                        | FRAME_SYMBOLS
                        | super::FRAME_INDEX
                        | super::memory::FRAME_MEMORY
                        | super::memory::FRAME_MAPPINGS
                        | super::marks::FRAME_MARKS
                        | super::heaps::FRAME_HEAPS
                )
            })
    }
}

/// Event blocks decoded ahead of the records being handed out.
const BLOCKS_AHEAD: usize = 4;

/// Reads a trace's frames (`bytes`: the file after its header), calling `f` on each record.
///
/// The frames are read and their blocks decompressed and decoded on a thread of their own, a
/// few blocks ahead of `f`: reading takes the longer of the two instead of their sum. `f`
/// sees the same records in the same order, and a refusal of `f` or damage is reported as
/// before: `f`'s refusal first, since it comes first in the file.
pub(super) fn read_trace(
    path: &Path,
    bytes: &[u8],
    strictness: Strictness,
    f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
) -> Result<BinaryInfo, LoadError> {
    let mut handed = 0u64;
    pipeline(
        path,
        bytes,
        strictness,
        &mut |block: &mut Vec<Record>, _, _, out: &mut Vec<Record>| {
            std::mem::swap(block, out);
            Ok(())
        },
        &mut |rec, pos| {
            f(rec).map_err(|why| refused(path, handed, pos, why))?;
            handed += 1;
            Ok(())
        },
    )
}

/// [`read_trace`] with the records made into `T`s by `stage` (which may refuse one) on the
/// reading thread, and `f` taking the `T`s: a loader's sequential pairing runs beside the
/// columns it fills. On a refusal, `f` still gets what `stage` made before it.
pub(super) fn read_trace_staged<T, S>(
    path: &Path,
    bytes: &[u8],
    strictness: Strictness,
    mut stage: S,
    f: &mut dyn FnMut(&T),
) -> Result<BinaryInfo, LoadError>
where
    T: Send,
    S: FnMut(&Record, &mut Vec<T>) -> Result<(), &'static str> + Send,
{
    pipeline(
        path,
        bytes,
        strictness,
        &mut |block: &mut Vec<Record>, before, pos, out: &mut Vec<T>| {
            for (i, rec) in (before..).zip(block.iter()) {
                stage(rec, out).map_err(|why| refused(path, i, pos, why))?;
            }
            Ok(())
        },
        &mut |item, _| {
            f(item);
            Ok(())
        },
    )
}

/// The error for a record refused at index `record`, in the block at `pos`.
fn refused(path: &Path, record: u64, pos: usize, why: &str) -> LoadError {
    LoadError::format(
        path,
        format!(
            "record {record} (in the events block at byte {}): {why}",
            pos as u64 + HEADER_BYTES
        ),
    )
}

/// What the reading thread makes of a block: `stage(block, records before it, its position,
/// out)`.
type Stage<'s, T> =
    dyn FnMut(&mut Vec<Record>, u64, usize, &mut Vec<T>) -> Result<(), LoadError> + Send + 's;

/// Reads the frames on a thread of their own, making each block into `T`s with `stage` there,
/// and hands the `T`s to `f` here, with their block's position, in file order. The first
/// error in file order is returned: `f`'s, else `stage`'s (after `f` got what was made
/// before it), else the read's.
fn pipeline<T: Send>(
    path: &Path,
    bytes: &[u8],
    strictness: Strictness,
    stage: &mut Stage<'_, T>,
    f: &mut dyn FnMut(&T, usize) -> Result<(), LoadError>,
) -> Result<BinaryInfo, LoadError> {
    let threaded = std::thread::scope(|scope| {
        let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<(Vec<T>, usize)>(BLOCKS_AHEAD);
        let (empty_tx, empty_rx) = std::sync::mpsc::channel::<Vec<T>>();
        let stage = &mut *stage;
        let spawned = std::thread::Builder::new()
            .name("allocview-blocks".into())
            .spawn_scoped(scope, move || {
                produce(
                    path,
                    bytes,
                    strictness,
                    stage,
                    &mut |items, pos| full_tx.send((items, pos)).is_ok(),
                    &mut || empty_rx.try_recv().unwrap_or_default(),
                )
            });
        // No thread to be had: the same work is done below, on this one.
        let reader = spawned.ok()?;
        let mut first_error = None;
        'blocks: for (mut items, pos) in full_rx.iter() {
            for item in &items {
                if let Err(e) = f(item, pos) {
                    first_error = Some(e);
                    break 'blocks;
                }
            }
            items.clear();
            // The reader may have finished: a buffer it will not take is simply dropped.
            let _ = empty_tx.send(items);
        }
        // Stops the reader if `f` refused (its next block finds no taker).
        drop(full_rx);
        let read = match reader.join() {
            Ok(read) => read,
            // A panic there is one here, as when this thread did the reading.
            Err(panic) => std::panic::resume_unwind(panic),
        };
        Some(first_error.map_or(read, Err))
    });
    if let Some(result) = threaded {
        return result;
    }
    let mut first_error = None;
    let read = produce(
        path,
        bytes,
        strictness,
        stage,
        &mut |items, pos| {
            for item in &items {
                if let Err(e) = f(item, pos) {
                    first_error = Some(e);
                    return false;
                }
            }
            true
        },
        &mut Vec::new,
    );
    first_error.map_or(read, Err)
}

/// Reads the frames, makes each block into `T`s with `stage` (in a buffer from `spare`) and
/// hands them to `sink` with the block's position; `sink` returns false to stop. A refusal of
/// `stage` is returned after `sink` got what was made before it.
fn produce<T>(
    path: &Path,
    bytes: &[u8],
    strictness: Strictness,
    stage: &mut Stage<'_, T>,
    sink: &mut dyn FnMut(Vec<T>, usize) -> bool,
    spare: &mut dyn FnMut() -> Vec<T>,
) -> Result<BinaryInfo, LoadError> {
    let mut failed = None;
    let mut before = 0u64;
    let read = read_frames(path, bytes, strictness, &mut |block, pos| {
        let mut out = spare();
        let records = block.len() as u64;
        let made = stage(block, before, pos, &mut out);
        before += records;
        let taken = sink(out, pos);
        match made {
            Ok(()) => taken,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    });
    failed.map_or(read, Err)
}

/// Reads a trace's frames, handing each decoded events block to `emit` with its position
/// (`emit` may take the records; it returns false to stop the read).
fn read_frames(
    path: &Path,
    bytes: &[u8],
    strictness: Strictness,
    emit: &mut dyn FnMut(&mut Vec<Record>, usize) -> bool,
) -> Result<BinaryInfo, LoadError> {
    let mut info = BinaryInfo::empty(FileKind::Trace);
    let mut r = Reader {
        bytes,
        threads: Vec::new(),
        decoded: Vec::new(),
        decoder: BlockDecoder::new(path)?,
    };
    let offset = |pos: usize| pos as u64 + HEADER_BYTES;
    let mut pos = 0usize;
    let mut end_total = None;
    // The blocks read, as an index lists them, and the INDEX frame, to check one by the other.
    let mut seen: Vec<BlockEntry> = Vec::new();
    let mut index = None;
    // Events the EVENTS frames of skipped stretches declare.
    let mut skipped_events = 0u64;
    let mut budget = StackBudget::new(bytes.len() as u64 + HEADER_BYTES);
    while pos < bytes.len() {
        let read = r.frame_at(pos).and_then(|frame| {
            r.parse(frame.tag, frame.payload)
                .map(|parsed| (parsed, frame.next))
                .map_err(|what| Problem {
                    what: format!("{} frame: {what}", frame_name(frame.tag)),
                    past_end: false,
                })
        });
        let (parsed, next) = match read {
            Ok(ok) => ok,
            Err(problem) => match recover(&mut r, path, pos, problem, strictness, &mut info)? {
                Recovery::Stop => {
                    if !info.damaged.is_empty() {
                        skipped_events += declared_events(bytes.get(pos..).unwrap_or(&[]));
                    }
                    break;
                }
                Recovery::SkipTo(q) => {
                    skipped_events += declared_events(bytes.get(pos..q).unwrap_or(&[]));
                    pos = q;
                    continue;
                }
                Recovery::Repaired(parsed, q) => (parsed, q),
            },
        };
        match parsed {
            Parsed::Meta(meta) => info.meta.extend(meta),
            Parsed::Memory(samples) => info.memory.extend(samples),
            Parsed::Mappings(calls) => info.mappings.extend(calls),
            Parsed::Marks(marks) => info.marks.extend(marks),
            Parsed::Heaps(names) => {
                for h in names {
                    super::heaps::set_name(&mut info.heaps, h.id, h.name);
                }
            }
            Parsed::Threads(ids) => r.threads.extend(ids),
            Parsed::Events => {
                if let Some(first) = r.decoded.first() {
                    seen.push(BlockEntry {
                        offset: offset(pos),
                        first_record: info.records,
                        records: r.decoded.len() as u64,
                        first_t_ns: first.t_ns,
                        max_t_ns: r.decoded.iter().map(|x| x.t_ns).max().unwrap_or(first.t_ns),
                    });
                }
                info.records += r.decoded.len() as u64;
                if !emit(&mut r.decoded, pos) {
                    return Ok(info);
                }
            }
            Parsed::End(total) => {
                end_total = Some((total, pos));
                break;
            }
            Parsed::Stacks(part, symbols) => {
                let at = offset(pos);
                merge_stacks(
                    path,
                    at,
                    strictness,
                    (part, symbols),
                    &mut budget,
                    &mut info,
                )?;
            }
            Parsed::Index(read) => index = Some(read),
            Parsed::Unknown => {}
        }
        pos = next;
    }
    check_end(path, strictness, end_total, skipped_events, &mut info)?;
    if let Some(index) = index
        && info.damaged.is_empty()
        && info.truncated.is_none()
        && let Err((at, what)) = check_loaded(&index, &seen)
    {
        // A stream reads by the index: it would not give these events.
        let what = format!("{what}; a stream of the file (`--stream`) would read other events");
        refuse_or_note(path, strictness, at, what, &mut info)?;
        info.events_lost = Some(0);
    }
    Ok(info)
}

/// What reading goes on with after the frame at `pos` did not read.
enum Recovery {
    /// Nothing after it reads (the file was cut, or lenient: damage to its end).
    Stop,
    /// Lenient: the damage up to this position is skipped.
    SkipTo(usize),
    /// Lenient: the frame reads in full once it ends where the next frame starts.
    Repaired(Parsed, usize),
}

/// Where the file reads again after the frame at `pos` did not read (see the module docs):
/// in strict mode an error when it does, in lenient mode the damage noted in `info`.
fn recover(
    r: &mut Reader<'_>,
    path: &Path,
    pos: usize,
    problem: Problem,
    strictness: Strictness,
    info: &mut BinaryInfo,
) -> Result<Recovery, LoadError> {
    let offset = |pos: usize| pos as u64 + HEADER_BYTES;
    let Some(q) = r.resync(pos + 1) else {
        if problem.past_end {
            info.truncated = Some(format!("{} at byte {}", problem.what, offset(pos)));
            return Ok(Recovery::Stop);
        }
        // Damage with nothing readable after it.
        if strictness == Strictness::Strict {
            return Err(corrupt(
                path,
                offset(pos),
                &format!("{}; nothing after it reads", problem.what),
            ));
        }
        info.damaged.push(Damage {
            offset: offset(pos),
            skipped_bytes: (r.bytes.len() - pos) as u64,
            what: format!("{}; nothing after it reads", problem.what),
            repaired: false,
        });
        return Ok(Recovery::Stop);
    };
    // Was only the length wrong? Then the frame ends where the next one starts.
    let tag = r.bytes.get(pos).copied().unwrap_or(0);
    let repaired = r
        .bytes
        .get(pos + FRAME_HEADER_BYTES..q)
        .and_then(|payload| r.parse(tag, payload).ok())
        .filter(|p| !matches!(p, Parsed::Unknown | Parsed::End(_)));
    if strictness == Strictness::Strict {
        let hint = if repaired.is_some() {
            "only its length is wrong: --lenient reads it in full"
        } else {
            "--lenient skips the damage and reads the rest"
        };
        return Err(corrupt(
            path,
            offset(pos),
            &format!(
                "{}; the file reads again at byte {} ({hint})",
                problem.what,
                offset(q)
            ),
        ));
    }
    info.damaged.push(Damage {
        offset: offset(pos),
        skipped_bytes: if repaired.is_some() {
            0
        } else {
            (q - pos) as u64
        },
        what: problem.what,
        repaired: repaired.is_some(),
    });
    Ok(match repaired {
        Some(parsed) => Recovery::Repaired(parsed, q),
        None => Recovery::SkipTo(q),
    })
}

/// A disagreement between frames that lost no bytes: an error when strict, else noted as
/// damage at `at` (the reader goes on with what the blocks hold).
fn refuse_or_note(
    path: &Path,
    strictness: Strictness,
    at: u64,
    what: String,
    info: &mut BinaryInfo,
) -> Result<(), LoadError> {
    if strictness == Strictness::Strict {
        return Err(corrupt(path, at, &what));
    }
    info.damaged.push(Damage {
        offset: at,
        skipped_bytes: 0,
        what,
        repaired: false,
    });
    Ok(())
}

/// Checks the END frame's count (`end_total`: the count and the frame's position) against
/// the records read, or notes that there was none.
fn check_end(
    path: &Path,
    strictness: Strictness,
    end_total: Option<(u64, usize)>,
    skipped_events: u64,
    info: &mut BinaryInfo,
) -> Result<(), LoadError> {
    let Some((total, at)) = end_total else {
        if info.truncated.is_none() && info.damaged.is_empty() {
            info.truncated = Some("the file has no end frame (the writer was interrupted)".into());
        }
        return Ok(());
    };
    if total != info.records && info.damaged.is_empty() {
        // Every frame read, yet the count disagrees: damage no check saw (an events frame
        // whose tag was hit reads as an unknown frame, which is skipped).
        let what = format!(
            "the end frame counts {total} events, the blocks hold {}",
            info.records
        );
        refuse_or_note(path, strictness, at as u64 + HEADER_BYTES, what, info)?;
    }
    if !info.damaged.is_empty() {
        let by_end = total.saturating_sub(info.records);
        if skipped_events > by_end {
            // END agrees with what was read though blocks were skipped: it was written (or
            // damaged) to agree; the skipped blocks' own headers count what they held.
            info.damaged.push(Damage {
                offset: at as u64 + HEADER_BYTES,
                skipped_bytes: 0,
                what: format!(
                    "the end frame counts {total} events, {} were read, yet the skipped blocks \
                     declare {skipped_events}",
                    info.records
                ),
                repaired: false,
            });
        }
        info.events_lost = Some(by_end.max(skipped_events));
    }
    Ok(())
}

/// Frames a trace's call stacks may expand to (see [`stacks::Expansion`]) for each byte of
/// the file. A stack names a location in a byte or two and the tracer walks at most 255
/// frames, and real code inlines a few calls into a return address on average (dozens at
/// most): an honest trace expands to a few frames a byte, under a tenth of this.
const EXPANDED_FRAMES_PER_BYTE: u64 = 32;
/// ... and at least this many, whatever the file's size (about 100 MB of tables at most).
const EXPANDED_FRAMES_MIN: u64 = 1 << 22;

/// What a trace's call stacks expand to so far, and what the file's size allows.
struct StackBudget {
    /// `None` once refused: later stack frames are left out too.
    expansion: Option<stacks::Expansion>,
    file_bytes: u64,
    allowed_frames: u64,
}

impl StackBudget {
    fn new(file_bytes: u64) -> Self {
        Self {
            expansion: Some(stacks::Expansion::default()),
            file_bytes,
            allowed_frames: file_bytes
                .saturating_mul(EXPANDED_FRAMES_PER_BYTE)
                .max(EXPANDED_FRAMES_MIN),
        }
    }
}

/// Merges a stack frame's tables (`read`) into `info.stacks`, and refuses them when they
/// expand to more frames than the file's size allows: strict, an error naming the frame's
/// offset `at`; lenient, the call stacks are left out (with this and every later stack
/// frame), the events kept.
fn merge_stacks(
    path: &Path,
    at: u64,
    strictness: Strictness,
    (part, symbols): (NativeStacks, stacks::SymbolEntries),
    budget: &mut StackBudget,
    info: &mut BinaryInfo,
) -> Result<(), LoadError> {
    let Some(exp) = budget.expansion.as_mut() else {
        return Ok(());
    };
    let into = info.stacks.get_or_insert_with(NativeStacks::default);
    let unknown = stacks::merge(into, part, symbols, exp);
    if unknown > 0 {
        info.damaged.push(Damage {
            offset: at,
            skipped_bytes: 0,
            what: format!(
                "{unknown} symbol entries name a location the trace does not have (left out)"
            ),
            repaired: false,
        });
    }
    let (allowed, file_bytes) = (budget.allowed_frames, budget.file_bytes);
    if exp.frames <= allowed {
        return Ok(());
    }
    let what = format!(
        "the call stacks expand to {} frames (each location's inline frames at every depth of \
         every stack naming it), more than the {allowed} a {file_bytes}-byte file may \
         ({EXPANDED_FRAMES_PER_BYTE} a byte); --lenient reads its events without call stacks",
        exp.frames
    );
    if strictness == Strictness::Strict {
        return Err(corrupt(path, at, &what));
    }
    info.damaged.push(Damage {
        offset: at,
        skipped_bytes: 0,
        what: format!("{what}; the call stacks are left out"),
        repaired: false,
    });
    info.stacks = None;
    budget.expansion = None;
    Ok(())
}

fn frame_name(tag: u8) -> String {
    match tag {
        FRAME_META => "a META".into(),
        FRAME_THREADS => "a THREADS".into(),
        FRAME_EVENTS => "an EVENTS".into(),
        FRAME_END => "the END".into(),
        FRAME_MODULES => "a MODULES".into(),
        FRAME_LOCATIONS => "a LOCATIONS".into(),
        FRAME_STACKS => "a STACKS".into(),
        FRAME_SYMBOLS => "a SYMBOLS".into(),
        super::memory::FRAME_MEMORY => "a MEMORY".into(),
        super::memory::FRAME_MAPPINGS => "a MAPPINGS".into(),
        super::marks::FRAME_MARKS => "a MARKS".into(),
        super::FRAME_INDEX => "the INDEX".into(),
        other => format!("a 0x{other:02x}"),
    }
}
