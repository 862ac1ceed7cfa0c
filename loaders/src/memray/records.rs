//! The records after the header, read into [`ForeignEvents`]: each allocator call with the
//! Python stack of its thread at that moment (and, with `--native`, its native stack), and
//! the resident-memory samples. The encoding is memray's streaming writer's (formats 12 and
//! 13 share it): a type byte whose high bits say the kind and whose low bits carry flags,
//! then varints, most of them deltas from the previous record's value.

use std::collections::{BTreeMap, HashMap};

use super::header::Header;
use super::stacks::{NativeFrame, PythonStacks};
use super::stream::{Stream, StreamError};
use crate::binary::MemorySample;
use crate::error::LineError;
use crate::events::{Record, call_code};
use crate::foreign::ForeignEvents;

/// memray's allocator codes (`hooks::Allocator`).
const PYMALLOC_FREE: u8 = 1;
const PYMALLOC_MALLOC: u8 = 2;
const PYMALLOC_CALLOC: u8 = 3;
const PYMALLOC_REALLOC: u8 = 4;
const FREE: u8 = 5;
const MMAP: u8 = 14;
const MUNMAP: u8 = 15;

/// Record types without flags.
const FILLER: u8 = 0;
const TRAILER: u8 = 1;
const MEMORY_RECORD: u8 = 2;
const NATIVE_TRACE_INDEX: u8 = 5;
const MEMORY_MAP_START: u8 = 6;
const SEGMENT_HEADER: u8 = 7;
const THREAD_RECORD: u8 = 10;
const CONTEXT_SWITCH: u8 = 12;
const CODE_OBJECT: u8 = 14;

/// The name in [`crate::events::CALL_NAMES`] of memray allocator `code`, or `None` for a code
/// memray does not have.
fn call_name(code: u8) -> Option<&'static str> {
    Some(match code {
        PYMALLOC_FREE | FREE => "free",
        PYMALLOC_MALLOC | 6 => "malloc",
        PYMALLOC_CALLOC | 8 => "calloc",
        PYMALLOC_REALLOC | 7 => "realloc",
        9 => "posix_memalign",
        10 => "aligned_alloc",
        11 => "memalign",
        12 => "valloc",
        13 => "pvalloc",
        MMAP | MUNMAP => "other",
        _ => return None,
    })
}

/// How the records read: what was kept, and what lenient mode skipped.
#[derive(Default)]
pub(super) struct Outcome {
    pub(super) events: ForeignEvents,
    /// Records skipped in lenient mode (a pop past the stack's bottom, a call before any
    /// thread was named), with the first few.
    pub(super) skipped: u64,
    pub(super) first_skipped: Vec<LineError>,
    /// Calls through Python's allocator (`--trace-python-allocators`).
    pub(super) python_allocator_events: u64,
    /// Records read.
    pub(super) records: u64,
    /// Allocations at an address memray still held live (a free it did not see), kept live
    /// at an address of their own.
    pub(super) displaced: u64,
    /// The stream ended between records without memray's trailer (a run cut short).
    pub(super) no_trailer: bool,
}

/// The reader's state: the delta bases, the pointer cache, the threads' stacks.
pub(super) struct Records<'h> {
    header: &'h Header,
    lenient: bool,
    out: Outcome,
    t_ns: i64,
    tid: Option<u64>,
    stacks: PythonStacks,
    last_data_pointer: u64,
    last_native_frame_id: u64,
    last_instruction_pointer: u64,
    last_first_line: i32,
    /// The 15 addresses seen last (most recent first): allocation records name one by index.
    recent: [u64; 15],
    /// Live `mmap` ranges by start: a `munmap` may end part of one.
    mappings: BTreeMap<u64, Mapped>,
    thread_names: HashMap<u64, String>,
    /// Live allocations (not mappings) by address: the index of their record.
    live: HashMap<u64, usize>,
}

/// Where an allocation whose address came back from the allocator while memray still held
/// it live is moved: above every user address, with bits 60-61 (the Python allocator tags of
/// allocview's own recordings) clear, 8 bytes apart.
const DISPLACED_BASE: u64 = 1 << 63;

/// A live `mmap` range: its length, stack and thread.
#[derive(Clone, Copy)]
struct Mapped {
    len_bytes: u64,
    stack: Option<u32>,
    tid: u64,
}

/// At most this many skipped records are described.
const MAX_DESCRIBED: usize = 10;

impl<'h> Records<'h> {
    pub(super) fn new(header: &'h Header, lenient: bool) -> Self {
        Self {
            header,
            lenient,
            out: Outcome::default(),
            t_ns: 0,
            tid: None,
            stacks: PythonStacks::new(header.python_version),
            last_data_pointer: 0,
            last_native_frame_id: 0,
            last_instruction_pointer: 0,
            last_first_line: 0,
            recent: [0; 15],
            mappings: BTreeMap::new(),
            thread_names: HashMap::new(),
            live: HashMap::new(),
        }
    }

    /// Reads records to the trailer or the end of the stream. On an error, what was read
    /// before it is kept in `self` (see [`Self::finish`]).
    pub(super) fn read_all(&mut self, s: &mut Stream) -> Result<(), StreamError> {
        loop {
            let start = s.offset;
            let Some(token) = s.next_byte()? else {
                self.out.no_trailer = true;
                return Ok(());
            };
            self.out.records += 1;
            if token & 0x80 != 0 {
                self.allocation(s, start, token & 0x7f)?;
            } else if token & 0x40 != 0 {
                let code_object = s.varint()?;
                let instruction_offset = s.signed_varint()?;
                if let Some(tid) = self.thread(start, "a frame push")? {
                    self.stacks
                        .push(tid, code_object, instruction_offset, token & 1 == 1);
                }
            } else if token & 0x20 != 0 {
                self.object(s, token & 0x1f)?;
            } else if token & 0x10 != 0 {
                let count = usize::from(token & 0x0f) + 1;
                if let Some(tid) = self.thread(start, "a frame pop")?
                    && !self.stacks.pop(tid, count)
                {
                    self.skip(start, "a pop of frames the thread's stack holds", "a pop")?;
                }
            } else {
                match token {
                    TRAILER => return Ok(()),
                    FILLER => return padding(s, start),
                    MEMORY_RECORD => self.memory(s)?,
                    NATIVE_TRACE_INDEX => {
                        let ip = delta(&mut self.last_instruction_pointer, s.signed_varint()?);
                        let parent = delta(&mut self.last_native_frame_id, s.signed_varint()?);
                        self.stacks.native.push(NativeFrame { ip, parent });
                    }
                    MEMORY_MAP_START => self.stacks.clear_images(),
                    SEGMENT_HEADER => self.segments(s)?,
                    THREAD_RECORD => {
                        let name = s.cstring()?;
                        if let Some(tid) = self.thread(start, "a thread name")? {
                            self.thread_names.insert(tid, name);
                        }
                    }
                    CONTEXT_SWITCH => self.tid = Some(s.u64_le()?),
                    CODE_OBJECT => {
                        let id = s.varint()?;
                        let function = s.cstring()?;
                        let file = s.cstring()?;
                        let step = i32::try_from(s.signed_varint()?).unwrap_or(i32::MAX);
                        self.last_first_line = self.last_first_line.wrapping_add(step);
                        let len_bytes = s.varint()?;
                        let table = s.blob(len_bytes)?;
                        self.stacks
                            .code_object(id, function, file, self.last_first_line, table);
                    }
                    other => {
                        return Err(s.bad(start, format!("a record of unknown type {other}")));
                    }
                }
            }
        }
    }

    /// What was read (after [`Self::read_all`], whether it succeeded or not).
    pub(super) fn finish(mut self) -> Outcome {
        self.out.events.stacks = self.stacks.into_table();
        let threads = self.thread_names.len();
        if self.out.displaced > 0 {
            self.out.events.notes.push(format!(
                "allocations at an address memray still held live (a free it did not see): {}; \
                 they stay live to the end, as memray counts them, at addresses from \
                 {DISPLACED_BASE:#x}",
                self.out.displaced
            ));
        }
        if threads > 0 {
            self.out.events.notes.push(format!(
                "memray names {threads} threads; allocview keeps their ids, not their names"
            ));
        }
        self.out
    }

    /// The current thread; when no context switch came yet, `None` and the record is
    /// counted as skipped (lenient), or an error (strict).
    fn thread(&mut self, offset: u64, what: &'static str) -> Result<Option<u64>, StreamError> {
        match self.tid {
            Some(t) => Ok(Some(t)),
            None if self.lenient => {
                self.skip(offset, "a thread (a context switch record) first", what)?;
                Ok(None)
            }
            None => Err(StreamError::Bad {
                offset,
                what: format!("{what} before any thread was named (no context switch record)"),
            }),
        }
    }

    /// Counts a record lenient mode skips, or fails in strict mode.
    fn skip(
        &mut self,
        offset: u64,
        expected: &'static str,
        found: &str,
    ) -> Result<(), StreamError> {
        if !self.lenient {
            return Err(StreamError::Bad {
                offset,
                what: format!("{found} where the stream needs {expected}"),
            });
        }
        self.out.skipped += 1;
        if self.out.first_skipped.len() < MAX_DESCRIBED {
            self.out.first_skipped.push(LineError {
                line: self.out.records,
                column: 0,
                field: "record",
                expected,
                found: format!("{found} at byte {offset} of the decompressed stream"),
            });
        }
        Ok(())
    }

    fn memory(&mut self, s: &mut Stream) -> Result<(), StreamError> {
        let rss_bytes = s.varint()?;
        let ms = s.varint()?;
        self.t_ns = i64::try_from(ms.saturating_mul(1_000_000)).unwrap_or(i64::MAX);
        self.out.events.memory.push(MemorySample {
            t_ns: self.t_ns,
            resident_bytes: rss_bytes,
            // memray samples the resident set only.
            anon_bytes: 0,
        });
        Ok(())
    }

    fn segments(&mut self, s: &mut Stream) -> Result<(), StreamError> {
        let file = s.cstring()?;
        let count = s.varint()?;
        let base = s.u64_le()?;
        // The count is the file's claim: read segment by segment, never reserved by it.
        let mut segments = Vec::new();
        for _ in 0..count {
            let at = s.offset;
            let token = s.u8()?;
            if token != 8 {
                return Err(s.bad(
                    at,
                    format!("a record of type {token} inside a segment list"),
                ));
            }
            let vaddr = s.u64_le()?;
            let len_bytes = s.varint()?;
            segments.push((vaddr, len_bytes));
        }
        self.stacks.image(file, base, segments);
        Ok(())
    }

    /// The address of an allocation or object record: a cache hit, or a delta (in 8-byte
    /// units) from the last address read, which then enters the cache.
    fn address(&mut self, s: &mut Stream, cache_index: u8) -> Result<u64, StreamError> {
        if let Some(&addr) = self.recent.get(usize::from(cache_index)) {
            return Ok(addr);
        }
        let units = delta(&mut self.last_data_pointer, s.signed_varint()?);
        let addr = units.wrapping_shl(3);
        self.recent.copy_within(0..14, 1);
        self.recent[0] = addr;
        Ok(addr)
    }

    fn object(&mut self, s: &mut Stream, flags: u8) -> Result<(), StreamError> {
        // Object lifetimes (`--track-object-lifetimes`) are read past: they are no allocations.
        let created = flags & 1 == 1;
        self.address(s, (flags >> 1) & 0x0f)?;
        if self.header.native_traces && created {
            delta(&mut self.last_native_frame_id, s.signed_varint()?);
        }
        Ok(())
    }

    fn allocation(&mut self, s: &mut Stream, start: u64, flags: u8) -> Result<(), StreamError> {
        let addr = self.address(s, (flags >> 3) & 0x0f)?;
        let allocator = match flags & 7 {
            0 => s.u8()?,
            code => code,
        };
        let Some(name) = call_name(allocator) else {
            return Err(s.bad(
                start,
                format!("an allocation by unknown allocator {allocator}"),
            ));
        };
        let simple_free = matches!(allocator, FREE | PYMALLOC_FREE);
        let native_id = if self.header.native_traces && !simple_free {
            delta(&mut self.last_native_frame_id, s.signed_varint()?)
        } else {
            0
        };
        let size_bytes = if simple_free { 0 } else { s.varint()? };
        let Some(tid) = self.thread(start, "an allocation")? else {
            return Ok(());
        };
        if (PYMALLOC_FREE..=PYMALLOC_REALLOC).contains(&allocator) {
            self.out.python_allocator_events += 1;
        }
        let call = call_code(name.as_bytes());
        let stack = if simple_free || allocator == MUNMAP {
            None
        } else {
            self.stacks.stack_of(tid, native_id)
        };
        let record = Record {
            t_ns: self.t_ns,
            tid,
            size_bytes: (!simple_free).then_some(size_bytes),
            addr,
            call,
            stack,
            heap: 0,
        };
        match allocator {
            MMAP => {
                let mapped = Mapped {
                    len_bytes: size_bytes,
                    stack,
                    tid,
                };
                self.mappings.insert(addr, mapped);
                self.out.events.records.push(record);
            }
            MUNMAP => self.unmap(addr, size_bytes, tid, call),
            _ if simple_free => {
                self.live.remove(&addr);
                self.out.events.records.push(record);
            }
            _ => {
                let index = self.out.events.records.len();
                if let Some(old) = self.live.insert(addr, index) {
                    self.displace(old);
                }
                self.out.events.records.push(record);
            }
        }
        Ok(())
    }

    /// memray counts an allocation whose address the allocator hands out again before memray
    /// saw it freed as live to the end (its peak includes it); pairing by address would end
    /// it there instead. So it moves to an address no call names, and stays live.
    fn displace(&mut self, index: usize) {
        let n = self.out.displaced;
        self.out.displaced += 1;
        if let Some(r) = self.out.events.records.get_mut(index) {
            r.addr = DISPLACED_BASE.wrapping_add(n.wrapping_mul(8));
        }
    }

    /// `munmap(addr, len_bytes)`: each mapping it overlaps ends, and the parts of it outside
    /// the range start again as mappings of their own with the same stack, so the bytes live
    /// stay those memray counts (it removes the overlapped part of each interval).
    fn unmap(&mut self, addr: u64, len_bytes: u64, tid: u64, call: Option<u8>) {
        let end = addr.saturating_add(len_bytes);
        let overlapping: Vec<(u64, Mapped)> = self
            .mappings
            .range(..end)
            .rev()
            .take_while(|(start, m)| start.saturating_add(m.len_bytes) > addr)
            .map(|(&start, &m)| (start, m))
            .collect();
        for (start, m) in overlapping.into_iter().rev() {
            let Mapped {
                len_bytes: len,
                stack,
                tid: owner,
            } = m;
            self.mappings.remove(&start);
            let t_ns = self.t_ns;
            let piece = |addr: u64, size: Option<u64>, stack: Option<u32>, tid: u64| Record {
                t_ns,
                tid,
                size_bytes: size,
                addr,
                call,
                stack,
                heap: 0,
            };
            self.out.events.records.push(piece(start, None, None, tid));
            // What is left below the range and above it, each where there is any.
            let map_end = start.saturating_add(len);
            for (at, kept) in [
                (start, addr.saturating_sub(start)),
                (end, map_end.saturating_sub(end)),
            ] {
                if kept == 0 {
                    continue;
                }
                let left = Mapped {
                    len_bytes: kept,
                    ..m
                };
                self.mappings.insert(at, left);
                self.out
                    .events
                    .records
                    .push(piece(at, Some(kept), stack, owner));
            }
        }
    }
}

/// Applies a signed delta to `last` (memray's delta encoding wraps as unsigned arithmetic).
fn delta(last: &mut u64, step: i64) -> u64 {
    *last = last.wrapping_add_signed(step);
    *last
}

/// The padding after the last record: every byte left must be 0.
fn padding(s: &mut Stream, start: u64) -> Result<(), StreamError> {
    while let Some(b) = s.next_byte()? {
        if b != 0 {
            let at = s.offset - 1;
            return Err(s.bad(
                at,
                format!("byte {b:#04x} after the zero padding that began at byte {start}"),
            ));
        }
    }
    Ok(())
}
