//! Reading a spool (kind 1): its segments gathered into one stream per thread buffer, the
//! streams' events decoded in either encoding, then merged into one sequence (`merge`). The
//! same state (`state`) reads a whole file, or a spool while the tracer still writes it
//! (`live`).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::path::Path;

use super::codec::{Cursor, unzigzag};
use super::frames::{Frames, Next};
use super::stacks::{self, PyCode, StackDef};
use super::{BinaryInfo, OP_CALL_MASK, OP_FREE, TimeBase};
use crate::error::LoadError;
use crate::events::Record;

mod live;
mod merge;
mod order;
mod state;
#[cfg(test)]
mod tests;

pub use live::{LivePoll, LiveSpool};
use state::SpoolState;

/// How a spool encodes its events (its META's `events`; absent in the first tracer's).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum SpoolEncoding {
    /// As in a trace block, with no thread field: op, time, size and address as varints.
    Varints,
    /// Time changes as separate records, prefix-varint sizes, short addresses (see the module
    /// documentation).
    Compact,
    /// As `Compact`, and a stream may switch to keyed events: each then ends with its order key.
    Keyed,
    /// As `Keyed`, and allocations carry stack ids, and streams hold stack definitions.
    Stacked,
}

/// Spool op (encoding 2): a time change; a zigzag varint of the time's difference follows.
const OP_TIME: u8 = 0x0f;
/// Spool op bits 5-7 (encoding 2): the address delta's length code.
const OP_ADDR_SHIFT: u8 = 5;
/// Spool op (encoding 3): the stream's events from here on carry order keys.
const OP_KEYED: u8 = 0x0e;
/// Spool op (encodings 5 and 6): the stream's events from here on carry no order keys.
const OP_UNKEYED: u8 = 0x0c;
/// Spool op (encoding 4): a stack definition (see `stacks.rs`).
const OP_STACK_DEF: u8 = 0x0d;
/// Spool op (encodings 3 and later): a heap prefix, the heap id (a prefix varint, not 0)
/// follows; the stream's next event belongs to that heap (see `heaps.rs`).
const OP_HEAP_PREFIX: u8 = 0x1b;
/// A spool's MODULE frame (encoding 4).
const FRAME_MODULE: u8 = 0x11;
/// A spool's flush mark: the clock value (u64) read before the clock thread wrote out every
/// thread's events; what a thread recorded before that value is in the file before the mark
/// (unless the thread read the time and was held up before writing its event).
const FRAME_FLUSHED: u8 = 0x12;

/// One stream (a thread's buffer) of a spool while merging.
pub(super) struct Stream<'a> {
    /// The tracer's number for the stream: buffers taken earlier have lower numbers.
    id: u32,
    tid: u64,
    /// The segments not yet decoded to their end, the first from `pos` on.
    segments: VecDeque<Segment<'a>>,
    pos: usize,
    tick: u64,
    addr: u64,
    /// The stream's events carry order keys (since its [`OP_KEYED`]).
    keyed: bool,
    /// The order key of the stream's previous keyed event.
    key: u64,
    /// The next event, decoded ahead (the merge compares heads).
    head: Option<SpoolEvent>,
    /// The stack definitions met so far.
    defs: Vec<StackDef>,
    /// The Python code objects named so far.
    codes: Vec<PyCode>,
    /// The heap of the next event, from an [`OP_HEAP_PREFIX`] (0: malloc's).
    next_heap: u32,
}

/// A segment's events, and how many module frames came before it in the file.
pub(super) struct Segment<'a> {
    pub(super) events: Cow<'a, [u8]>,
    pub(super) modules_before: u32,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct SpoolEvent {
    tick: u64,
    op: u8,
    size: u64,
    addr: u64,
    /// The order key (encoding 3, events recorded while several threads did): TSC ticks,
    /// comparable across the process's threads.
    key: Option<u64>,
    /// The allocation's stack id (encoding 4; `None` for frees and when none was captured).
    stack: Option<u32>,
    /// The heap (0: malloc's). Its `addr` is then [`merge_addr`]'s, apart from malloc's.
    heap: u32,
}

/// The address the merge orders an event of `heap` by: malloc's own, and for another heap
/// the address with bit 63 set (malloc's never has it: user addresses stay below 2^57 and
/// the Python tags take bits 60-61) and mixed with the heap's id, so that the causality
/// order of one heap never waits on another's blocks (an arena's blocks lie inside a block
/// malloc gave it, and two pools may both number their blocks from 0). Its own inverse.
pub(super) fn merge_addr(heap: u32, addr: u64) -> u64 {
    if heap == 0 {
        return addr;
    }
    let mix = u64::from(heap).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    addr ^ (mix | 1 << 63)
}

impl<'a> Stream<'a> {
    /// The stream numbered `id` (the tracer's) of thread `tid`, before its first segment.
    fn new(id: u32, tid: u64) -> Self {
        Self {
            id,
            tid,
            segments: VecDeque::new(),
            pos: 0,
            tick: 0,
            addr: 0,
            keyed: false,
            key: 0,
            head: None,
            defs: Vec::new(),
            codes: Vec::new(),
            next_heap: 0,
        }
    }

    /// Decodes the stream's next event into `head`, moving to its next segment as needed.
    pub(super) fn advance(&mut self, encoding: SpoolEncoding) -> Result<(), &'static str> {
        self.head = None;
        loop {
            let Some(seg) = self.segments.front() else {
                return Ok(());
            };
            if self.pos >= seg.events.len() {
                self.segments.pop_front();
                self.pos = 0;
                continue;
            }
            let mut cur = Cursor {
                bytes: &seg.events,
                pos: self.pos,
            };
            let c = &mut cur;
            let op = c.u8().ok_or("a cut event")?;
            let (size, delta) = match encoding {
                SpoolEncoding::Varints => {
                    if op & 0xe0 != 0 {
                        return Err("reserved op bits set");
                    }
                    self.tick = self
                        .tick
                        .wrapping_add(c.zigzag().ok_or("a cut time")? as u64);
                    let size = if op & OP_FREE != 0 {
                        0
                    } else {
                        c.varint().ok_or("a cut size")?
                    };
                    (size, c.zigzag().ok_or("a cut address")?)
                }
                SpoolEncoding::Compact | SpoolEncoding::Keyed | SpoolEncoding::Stacked => {
                    if encoding == SpoolEncoding::Stacked && op == OP_STACK_DEF {
                        let def = stacks::read_stack_def(c, seg.modules_before)
                            .ok_or("a cut stack definition")?;
                        self.defs.push(def);
                        self.pos = c.pos;
                        continue;
                    }
                    if encoding == SpoolEncoding::Stacked && op == stacks::OP_PYTHON {
                        stacks::read_python_record(
                            c,
                            seg.modules_before,
                            &mut self.defs,
                            &mut self.codes,
                        )
                        .ok_or("a cut or unknown Python record")?;
                        self.pos = c.pos;
                        continue;
                    }
                    if encoding != SpoolEncoding::Compact && op == OP_UNKEYED {
                        self.keyed = false;
                        self.pos = c.pos;
                        continue;
                    }
                    if encoding != SpoolEncoding::Compact && op & OP_CALL_MASK == OP_KEYED {
                        if op != OP_KEYED {
                            return Err("reserved bits set in a switch to keyed events");
                        }
                        self.keyed = true;
                        self.pos = c.pos;
                        continue;
                    }
                    if encoding != SpoolEncoding::Compact && op == OP_HEAP_PREFIX {
                        let heap = c.prefix_varint().ok_or("a cut heap prefix")?;
                        self.next_heap = u32::try_from(heap)
                            .ok()
                            .filter(|&h| h != 0)
                            .ok_or("a heap prefix out of range")?;
                        self.pos = c.pos;
                        continue;
                    }
                    if op & OP_CALL_MASK == OP_TIME {
                        if op != OP_TIME {
                            return Err("reserved bits set in a time change");
                        }
                        self.tick = self
                            .tick
                            .wrapping_add(c.zigzag().ok_or("a cut time")? as u64);
                        self.pos = c.pos;
                        continue;
                    }
                    let size = if op & OP_FREE != 0 {
                        0
                    } else {
                        c.prefix_varint().ok_or("a cut size")?
                    };
                    let code = usize::from(op >> OP_ADDR_SHIFT);
                    let len = if code == 7 { 8 } else { code };
                    (size, unzigzag(c.short_u64(len).ok_or("a cut address")?))
                }
            };
            self.addr = self.addr.wrapping_add(delta as u64);
            let stack = if encoding == SpoolEncoding::Stacked && op & OP_FREE == 0 {
                let id = c.prefix_varint().ok_or("a cut stack id")?;
                u32::try_from(id).ok().filter(|&id| id != 0)
            } else {
                None
            };
            let key = if self.keyed {
                let dk = unzigzag(c.prefix_varint().ok_or("a cut order key")?);
                self.key = self.key.wrapping_add(dk as u64);
                Some(self.key)
            } else {
                None
            };
            self.pos = c.pos;
            let heap = std::mem::take(&mut self.next_heap);
            self.head = Some(SpoolEvent {
                tick: self.tick,
                op: op & (OP_CALL_MASK | OP_FREE),
                size,
                addr: merge_addr(heap, self.addr),
                key,
                stack,
                heap,
            });
            return Ok(());
        }
    }
}

fn meta_i64(meta: &[(String, String)], key: &str) -> Option<i64> {
    meta.iter().find(|(k, _)| k == key)?.1.parse().ok()
}

/// Reads a whole spool: every frame, then the merge of every stream.
pub(super) fn read_spool(
    path: &Path,
    mut frames: Frames<'_>,
    base: TimeBase,
    f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
) -> Result<BinaryInfo, LoadError> {
    let mut state = SpoolState::new(path, base);
    loop {
        match frames.next() {
            Next::Frame(tag, payload, at) => {
                state.frame(tag, Cow::Borrowed(payload), (at + 10) as u64)?;
            }
            Next::End => break,
            Next::Cut(why) => {
                // The tracer's last write may be cut when the process was killed mid-write.
                state.cut(why);
                break;
            }
        }
    }
    // One thread alone needs no ordering by causality, so no live set either.
    state.finish(f)
}
