//! Reading a spool (kind 1): its segments gathered into one stream per thread buffer, the
//! streams' events decoded in either encoding, then merged into one sequence (`merge`).

use std::collections::HashMap;
use std::path::Path;

use super::codec::{Cursor, unzigzag};
use super::frames::{Frames, Next, parse_meta};
use super::stacks::{self, NativeModule, StackDef};
use super::{
    BinaryInfo, FRAME_META, FRAME_SEGMENT, FileKind, OP_CALL_MASK, OP_FREE, TimeBase, corrupt,
};
use crate::error::LoadError;
use crate::malloc_trace::{PtrSet, Record};

mod merge;
#[cfg(test)]
mod tests;

use merge::Merge;

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
/// Spool op (encoding 4): a stack definition (see `stacks.rs`).
const OP_STACK_DEF: u8 = 0x0d;
/// A spool's MODULE frame (encoding 4).
const FRAME_MODULE: u8 = 0x11;

/// One stream (a thread's buffer) of a spool while merging.
pub(super) struct Stream<'a> {
    /// The tracer's number for the stream: buffers taken earlier have lower numbers.
    id: u32,
    tid: u64,
    segments: Vec<&'a [u8]>,
    next_segment: usize,
    cur: Cursor<'a>,
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
}

#[derive(Clone, Copy)]
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
}

impl Stream<'_> {
    /// Decodes the stream's next event into `head`, moving to its next segment as needed.
    pub(super) fn advance(&mut self, encoding: SpoolEncoding) -> Result<(), &'static str> {
        self.head = None;
        loop {
            while self.cur.at_end() {
                let Some(seg) = self.segments.get(self.next_segment) else {
                    return Ok(());
                };
                self.next_segment += 1;
                self.cur = Cursor::new(seg);
            }
            let c = &mut self.cur;
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
                        let def = stacks::read_stack_def(c).ok_or("a cut stack definition")?;
                        self.defs.push(def);
                        continue;
                    }
                    if encoding != SpoolEncoding::Compact && op & OP_CALL_MASK == OP_KEYED {
                        if op != OP_KEYED {
                            return Err("reserved bits set in a switch to keyed events");
                        }
                        self.keyed = true;
                        continue;
                    }
                    if op & OP_CALL_MASK == OP_TIME {
                        if op != OP_TIME {
                            return Err("reserved bits set in a time change");
                        }
                        self.tick = self
                            .tick
                            .wrapping_add(c.zigzag().ok_or("a cut time")? as u64);
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
                let id = self.cur.prefix_varint().ok_or("a cut stack id")?;
                u32::try_from(id).ok().filter(|&id| id != 0)
            } else {
                None
            };
            let key = if self.keyed {
                let dk = unzigzag(self.cur.prefix_varint().ok_or("a cut order key")?);
                self.key = self.key.wrapping_add(dk as u64);
                Some(self.key)
            } else {
                None
            };
            self.head = Some(SpoolEvent {
                tick: self.tick,
                op: op & (OP_CALL_MASK | OP_FREE),
                size,
                addr: self.addr,
                key,
                stack,
            });
            return Ok(());
        }
    }
}

fn meta_i64(meta: &[(String, String)], key: &str) -> Option<i64> {
    meta.iter().find(|(k, _)| k == key)?.1.parse().ok()
}

pub(super) fn read_spool(
    path: &Path,
    mut frames: Frames<'_>,
    base: TimeBase,
    f: &mut dyn FnMut(&Record) -> Result<(), &'static str>,
) -> Result<BinaryInfo, LoadError> {
    let mut info = BinaryInfo {
        kind: FileKind::Spool,
        meta: Vec::new(),
        records: 0,
        truncated: None,
        damaged: Vec::new(),
        events_lost: None,
        stacks: None,
    };
    let mut modules: Vec<NativeModule> = Vec::new();
    let mut streams: Vec<Stream<'_>> = Vec::new();
    let mut by_id: HashMap<u32, usize> = HashMap::new();
    let mut calib_last: Option<(u64, i64)> = None;
    loop {
        let (tag, payload, at) = match frames.next() {
            Next::Frame(tag, payload, at) => (tag, payload, (at + 10) as u64),
            Next::End => break,
            Next::Cut(why) => {
                // The tracer's last write may be cut when the process was killed mid-write.
                info.truncated = Some(why);
                break;
            }
        };
        match tag {
            FRAME_META => info.meta.extend(parse_meta(payload)),
            FRAME_MODULE => {
                let m = stacks::read_module_frame(payload)
                    .ok_or_else(|| corrupt(path, at, "a module frame"))?;
                modules.push(m);
            }
            FRAME_SEGMENT => {
                let mut c = Cursor::new(payload);
                let (Some(stream), Some(tid), Some(tick), Some(ns)) =
                    (c.u32(), c.u64(), c.u64(), c.u64())
                else {
                    return Err(corrupt(path, at, "segment header"));
                };
                if calib_last.is_none_or(|(t, _)| tick > t) {
                    calib_last = Some((tick, ns as i64));
                }
                let events = c.take(payload.len() - c.pos).unwrap_or(&[]);
                let idx = *by_id.entry(stream).or_insert_with(|| {
                    streams.push(Stream {
                        id: stream,
                        tid,
                        segments: Vec::new(),
                        next_segment: 0,
                        cur: Cursor::new(&[]),
                        tick: 0,
                        addr: 0,
                        keyed: false,
                        key: 0,
                        head: None,
                        defs: Vec::new(),
                    });
                    streams.len() - 1
                });
                if let Some(s) = streams.get_mut(idx) {
                    s.segments.push(events);
                }
            }
            _ => {}
        }
    }
    let tick0 = meta_i64(&info.meta, "tick0")
        .ok_or_else(|| corrupt(path, 10, "no tick0 in the spool header"))?;
    let mono0 = meta_i64(&info.meta, "mono_ns0").ok_or_else(|| corrupt(path, 10, "no mono_ns0"))?;
    let wall0 =
        meta_i64(&info.meta, "realtime_ns0").ok_or_else(|| corrupt(path, 10, "no realtime_ns0"))?;
    let tsc = info.meta.iter().any(|(k, v)| k == "clock" && v == "tsc");
    let encoding = match meta_i64(&info.meta, "events") {
        None | Some(1) => SpoolEncoding::Varints,
        Some(2) => SpoolEncoding::Compact,
        Some(3) => SpoolEncoding::Keyed,
        Some(4) => SpoolEncoding::Stacked,
        Some(_) => {
            return Err(LoadError::format(
                path,
                "a spool event encoding this build does not know (written by a newer tracer)",
            ));
        }
    };
    let tick0 = tick0 as u64;
    // Nanoseconds per tick: exactly 1 for a nanosecond clock; for the TSC, the slope from the
    // start to the latest calibration point (short runs fall back to 1 GHz until a point exists).
    let ns_per_tick = match calib_last {
        Some((t, ns)) if tsc && t > tick0 => (ns - mono0) as f64 / (t - tick0) as f64,
        _ => 1.0,
    };
    let offset = wall0 - base.realtime_ns.unwrap_or(wall0);
    let to_ns = |tick: u64| -> i64 {
        let dt = tick.wrapping_sub(tick0) as i64;
        (dt as f64 * ns_per_tick).round() as i64 + offset
    };
    // Segments are in the order they were written; the merge wants the streams' own order.
    streams.sort_by_key(|s| s.id);
    let mut merge = Merge {
        path,
        encoding,
        truncated: info.truncated.is_some(),
        // One thread alone needs no ordering by causality, so no live set either.
        live: (streams.len() > 1).then(PtrSet::default),
        records: 0,
        to_ns: &to_ns,
        f,
    };
    merge.run(&mut streams)?;
    info.records = merge.records;
    if encoding == SpoolEncoding::Stacked {
        let defs = streams.iter_mut().flat_map(|s| s.defs.drain(..)).collect();
        info.stacks = Some(stacks::from_spool(modules, defs));
    }
    Ok(info)
}
