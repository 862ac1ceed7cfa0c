//! Call stacks of recorded allocations: the tracer's stack definitions and module map in a
//! spool, the stack frames of a trace, and their conversion into the shared [`StackTable`].
//!
//! In a **spool** (event encoding 4), a `0x11` MODULE frame describes one module (bias u64,
//! segment count u8, each segment's start and end u64, build id length u8 and bytes, then the
//! path), and a stream's op byte `0x0d` defines a stack: its id (prefix varint), how the walk
//! ended (u8, [`StackEnd`]), the frame count (u8), then each return address as a zigzag
//! LEB128 varint of its difference from the previous (the first from 0), innermost first.
//! Allocation events carry a stack id after the address (prefix varint, 0 = none).
//!
//! In a **trace**, four frames hold the stacks, anywhere before END (once after the events, or
//! as they grow between blocks: each frame adds to those before it, see [`merge`] and
//! [`StacksWritten`]); ids are the spool's:
//!
//! - `0x05` MODULES: varint n, then per module: varint bias, varint build-id length and bytes,
//!   varint path length and UTF-8 path.
//! - `0x06` LOCATIONS: varint n, then per code location: varint module index + 1 (0: in no
//!   known module, the offset is then the address), varint offset (the module's virtual
//!   address: the address less the bias).
//! - `0x07` STACKS: varint n, then per stack: varint id, u8 end, varint depth, and that many
//!   varint location indices, innermost first.
//! - `0x08` SYMBOLS: varint n, then per symbolized location: varint location index, varint
//!   source-frame count, and per source frame (innermost first: inlined calls expand a
//!   location into several) function, file (each a varint length and UTF-8) and varint line.
//!
//! An event with op bit 6 set is followed (after its address) by a varint stack id.

use std::collections::HashMap;

use super::codec::{Cursor, put_varint, unzigzag};
use crate::sites::{Frame, StackTable};

mod place;
pub(super) use place::Placer;
#[cfg(test)]
pub(super) use place::from_spool;

/// How a stack walk ended (the tracer's `End`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackEnd {
    /// At the outermost frame.
    Complete,
    /// At the tracer's depth cap.
    DepthCap,
    /// At a frame whose unwind rule the tracer does not follow (a DWARF expression, a signal
    /// frame).
    Unsupported,
    /// At code without unwind information (or outside every module: JIT code).
    NoInfo,
    /// At a frame that failed a check (a read outside the stack or the module).
    BadFrame,
}

impl StackEnd {
    fn from_u8(b: u8) -> Self {
        match b {
            0 => Self::Complete,
            1 => Self::DepthCap,
            2 => Self::Unsupported,
            3 => Self::NoInfo,
            _ => Self::BadFrame,
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            Self::Complete => 0,
            Self::DepthCap => 1,
            Self::Unsupported => 2,
            Self::NoInfo => 3,
            Self::BadFrame => 4,
        }
    }
}

/// A module (executable, shared object) of the traced process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NativeModule {
    pub path: String,
    pub build_id: Vec<u8>,
    /// Load bias: address = virtual address in the file + bias.
    pub bias: u64,
    /// Mapped segments `[start, end)` (spools only: the trace keeps locations instead).
    pub segments: Vec<(u64, u64)>,
}

/// A code location: a return address as module + offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    /// Index into [`NativeStacks::modules`]; `None`: in no known module (`offset` is the
    /// address).
    pub module: Option<u32>,
    pub offset: u64,
}

/// One source frame of a symbolized location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceFrame {
    pub function: String,
    /// Empty when unknown.
    pub file: String,
    /// 0 when unknown.
    pub line: u32,
}

/// A recorded stack: location indices, innermost first, and how its walk ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NativeStack {
    pub locations: Vec<u32>,
    pub end: StackEnd,
}

/// The stacks of a recorded trace or spool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NativeStacks {
    pub modules: Vec<NativeModule>,
    pub locations: Vec<Location>,
    /// Stack id (as events carry it) to stack.
    pub stacks: HashMap<u32, NativeStack>,
    /// Source frames per location index, once symbolized (empty entries: unresolved).
    pub symbols: Vec<Vec<SourceFrame>>,
}

/// A Python frame among a spool stack definition's `pcs`: this bit set, the code id in
/// bits 24-62 and the line in bits 0-23 (native return addresses stay below 2^57).
pub(super) const PY_FRAME_BIT: u64 = 1 << 63;
const PY_LINE_BITS: u32 = 24;

/// The module that a trace's Python frames are placed in: a location in it is a code id
/// (`offset >> 24`) and a line, and its symbol is the function, file and line.
pub const PYTHON_FRAMES_MODULE: &str = crate::sites::PYTHON_FRAMES_MODULE;

/// A Python code object a spool names (op `0x0b`, kind 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PyCode {
    pub(super) id: u32,
    pub(super) name: String,
    pub(super) file: String,
}

/// Spool op (event encoding 4 and up, from a CPython interpreter): a Python record, whose
/// next byte says which (see the tracer's `python/frames.rs` and `stacks.rs`):
/// - 1, a code object: id (prefix varint), first line (varint), qualified name and file
///   (each a varint length and UTF-8);
/// - 2, a stack with Python frames: id (prefix varint), how the walk ended (u8), frame count
///   (u8), then each frame innermost first, a varint `v`: `v` even, a native frame whose
///   address differs from the previous native frame's by the zigzag value `v >> 1`; `v` odd,
///   a Python frame of code id `v >> 1`, followed by its line as a varint.
pub(super) const OP_PYTHON: u8 = 0x0b;

/// Reads a Python record after its op byte into `defs` or `codes`.
pub(super) fn read_python_record(
    c: &mut Cursor<'_>,
    modules_before: u32,
    defs: &mut Vec<StackDef>,
    codes: &mut Vec<PyCode>,
) -> Option<()> {
    match c.u8()? {
        1 => {
            let id = u32::try_from(c.prefix_varint()?).ok()?;
            let _first_line = c.varint()?;
            let name = read_str(c)?;
            let file = read_str(c)?;
            codes.push(PyCode { id, name, file });
        }
        2 => defs.push(read_def(c, modules_before, true)?),
        _ => return None,
    }
    Some(())
}

/// A spool's stack definition, before its addresses are placed in modules.
pub(super) struct StackDef {
    pub(super) id: u32,
    pub(super) end: StackEnd,
    pub(super) pcs: Vec<u64>,
    /// Module frames read before the segment that holds the definition: the modules mapped
    /// when the stack was recorded are among them (see [`ModuleRanges`]).
    pub(super) modules_before: u32,
}

/// Reads a stack definition after its op byte, in a segment read after `modules_before`
/// module frames.
pub(super) fn read_stack_def(c: &mut Cursor<'_>, modules_before: u32) -> Option<StackDef> {
    read_def(c, modules_before, false)
}

/// A stack definition of either op: `python`, with Python frames among its native ones.
fn read_def(c: &mut Cursor<'_>, modules_before: u32, python: bool) -> Option<StackDef> {
    let id = u32::try_from(c.prefix_varint()?).ok()?;
    let end = StackEnd::from_u8(c.u8()?);
    let n = c.u8()?;
    let mut pcs = Vec::with_capacity(usize::from(n));
    let mut pc = 0u64;
    for _ in 0..n {
        let v = c.varint()?;
        if !python {
            pc = pc.wrapping_add(unzigzag(v) as u64);
            pcs.push(pc);
        } else if v & 1 == 0 {
            pc = pc.wrapping_add(unzigzag(v >> 1) as u64);
            pcs.push(pc & !PY_FRAME_BIT);
        } else {
            let code = (v >> 1).min((1 << (63 - PY_LINE_BITS)) - 1);
            let line = c.varint()?.min((1 << PY_LINE_BITS) - 1);
            pcs.push(PY_FRAME_BIT | code << PY_LINE_BITS | line);
        }
    }
    Some(StackDef {
        id,
        end,
        pcs,
        modules_before,
    })
}

/// Reads a spool's MODULE frame.
pub(super) fn read_module_frame(payload: &[u8]) -> Option<NativeModule> {
    let mut c = Cursor::new(payload);
    let bias = c.u64()?;
    let n = c.u8()?;
    let mut segments = Vec::with_capacity(usize::from(n));
    for _ in 0..n {
        segments.push((c.u64()?, c.u64()?));
    }
    let id_len = c.u8()?;
    let build_id = c.take(usize::from(id_len))?.to_vec();
    let path = String::from_utf8_lossy(payload.get(c.pos..)?).into_owned();
    Some(NativeModule {
        path,
        build_id,
        bias,
        segments,
    })
}

pub(super) const FRAME_MODULES: u8 = 0x05;
pub(super) const FRAME_LOCATIONS: u8 = 0x06;
pub(super) const FRAME_STACKS: u8 = 0x07;
pub(super) const FRAME_SYMBOLS: u8 = 0x08;

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s);
}

fn read_bytes<'a>(c: &mut Cursor<'a>) -> Option<&'a [u8]> {
    let n = usize::try_from(c.varint()?).ok()?;
    c.take(n)
}

fn read_str(c: &mut Cursor<'_>) -> Option<String> {
    Some(String::from_utf8_lossy(read_bytes(c)?).into_owned())
}

/// The trace frames (tag, payload) that hold `s`, in the order they are written.
pub(super) fn encode_frames(s: &NativeStacks) -> Vec<(u8, Vec<u8>)> {
    encode_appended(s, &[], &mut StacksWritten::default())
}

/// How much of a growing [`NativeStacks`] a trace was given: a trace's stack frames append
/// modules and locations and add stacks by id (see [`merge`]), so tables that only grow (a
/// spool's, placed while the program runs) can be written as they grow, and a reader of the
/// file cut anywhere has the stacks of the events before the cut.
#[derive(Debug, Default)]
pub struct StacksWritten {
    modules: usize,
    locations: usize,
    stacks: std::collections::HashSet<u32>,
    started: bool,
}

impl StacksWritten {
    /// Locations written so far (those of `s.locations` before this index).
    #[must_use]
    pub fn locations(&self) -> usize {
        self.locations
    }
}

/// The trace frames that add to a trace what `s` holds beyond `written`, and `symbols`
/// (source frames by location index, for locations `s` has none for); `written` then
/// counts them. The first call writes MODULES, LOCATIONS and STACKS even when empty (a trace
/// recorded with stacks says so), later ones only frames with something in them.
pub(super) fn encode_appended(
    s: &NativeStacks,
    symbols: &[(usize, Vec<SourceFrame>)],
    written: &mut StacksWritten,
) -> Vec<(u8, Vec<u8>)> {
    let new_modules = s.modules.get(written.modules..).unwrap_or(&[]);
    let mut modules = Vec::new();
    put_varint(&mut modules, new_modules.len() as u64);
    for m in new_modules {
        put_varint(&mut modules, m.bias);
        put_str(&mut modules, &m.build_id);
        put_str(&mut modules, m.path.as_bytes());
    }
    let new_locations = s.locations.get(written.locations..).unwrap_or(&[]);
    let mut locations = Vec::new();
    put_varint(&mut locations, new_locations.len() as u64);
    for l in new_locations {
        put_varint(&mut locations, l.module.map_or(0, |m| u64::from(m) + 1));
        put_varint(&mut locations, l.offset);
    }
    let mut ids: Vec<u32> = s
        .stacks
        .keys()
        .filter(|id| !written.stacks.contains(id))
        .copied()
        .collect();
    ids.sort_unstable();
    let mut stacks = Vec::new();
    put_varint(&mut stacks, ids.len() as u64);
    for id in &ids {
        let Some(st) = s.stacks.get(id) else { continue };
        put_varint(&mut stacks, u64::from(*id));
        stacks.push(st.end.to_u8());
        put_varint(&mut stacks, st.locations.len() as u64);
        for &l in &st.locations {
            put_varint(&mut stacks, u64::from(l));
        }
    }
    let first = !written.started;
    let mut frames = Vec::new();
    for (tag, payload, n) in [
        (FRAME_MODULES, modules, new_modules.len()),
        (FRAME_LOCATIONS, locations, new_locations.len()),
        (FRAME_STACKS, stacks, ids.len()),
    ] {
        if first || n > 0 {
            frames.push((tag, payload));
        }
    }
    let symbolized: Vec<(usize, &[SourceFrame])> = s
        .symbols
        .iter()
        .enumerate()
        .skip(written.locations)
        .map(|(i, f)| (i, f.as_slice()))
        .chain(symbols.iter().map(|(i, f)| (*i, f.as_slice())))
        .filter(|(_, f)| !f.is_empty())
        .collect();
    if !symbolized.is_empty() {
        let mut payload = Vec::new();
        put_varint(&mut payload, symbolized.len() as u64);
        for (i, frames) in symbolized {
            put_varint(&mut payload, i as u64);
            put_varint(&mut payload, frames.len() as u64);
            for f in frames {
                put_str(&mut payload, f.function.as_bytes());
                put_str(&mut payload, f.file.as_bytes());
                put_varint(&mut payload, u64::from(f.line));
            }
        }
        frames.push((FRAME_SYMBOLS, payload));
    }
    written.modules = s.modules.len();
    written.locations = s.locations.len();
    written.stacks.extend(ids);
    written.started = true;
    frames
}

/// Symbol entries of a SYMBOLS frame, as (location index, source frames): kept apart until
/// [`merge`] knows how many locations there are, so that an entry naming location 2^27 costs
/// its few bytes and not a table of 2^27 empty entries (the stacks fuzz target's 64-byte input
/// that took 5 GB).
pub(super) type SymbolEntries = Vec<(usize, Vec<SourceFrame>)>;

/// Applies one of the trace's stack frames to `s` (a SYMBOLS frame's entries are returned);
/// `Err` names what did not read.
pub(super) fn read_frame(
    s: &mut NativeStacks,
    tag: u8,
    payload: &[u8],
) -> Result<SymbolEntries, String> {
    let mut c = Cursor::new(payload);
    let cut = |what: &str| format!("a cut {what}");
    let n = c.varint().ok_or_else(|| cut("count"))?;
    if n > payload.len() as u64 {
        return Err(format!("a count of {n} in a {}-byte frame", payload.len()));
    }
    let mut symbols = SymbolEntries::new();
    for _ in 0..n {
        match tag {
            FRAME_MODULES => s.modules.push(NativeModule {
                bias: c.varint().ok_or_else(|| cut("module"))?,
                build_id: read_bytes(&mut c).ok_or_else(|| cut("build id"))?.to_vec(),
                path: read_str(&mut c).ok_or_else(|| cut("module path"))?,
                segments: Vec::new(),
            }),
            FRAME_LOCATIONS => {
                let m = c.varint().ok_or_else(|| cut("location"))?;
                let offset = c.varint().ok_or_else(|| cut("location"))?;
                let module = m.checked_sub(1).and_then(|m| u32::try_from(m).ok());
                s.locations.push(Location { module, offset });
            }
            FRAME_STACKS => {
                let id = c.varint().and_then(|v| u32::try_from(v).ok());
                let id = id.ok_or_else(|| cut("stack id"))?;
                let end = StackEnd::from_u8(c.u8().ok_or_else(|| cut("stack"))?);
                let depth = c.varint().ok_or_else(|| cut("stack"))?;
                let locations = (0..depth)
                    .map(|_| c.varint().and_then(|v| u32::try_from(v).ok()))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| cut("stack"))?;
                s.stacks.insert(id, NativeStack { locations, end });
            }
            _ => symbols.push(read_symbols(&mut c)?),
        }
    }
    if !c.at_end() {
        return Err("bytes after the table".into());
    }
    Ok(symbols)
}

/// How many frames the stacks read so far expand to in a [`StackTable`] (each location a
/// stack names counts its source frames, 1 when it has none), kept up to date as frames are
/// merged: a location's inline frames are repeated at every depth of every stack that names
/// it, so a small file can ask for billions (`crafted::stacks_inline_bomb`); the reader
/// compares this with what the file's size allows before anything is expanded.
#[derive(Debug, Default)]
pub(super) struct Expansion {
    /// How many times the stacks name each location index.
    refs: HashMap<u32, u64>,
    /// Frames the stacks expand to (an upper bound: a location the tables lack expands to
    /// none in [`NativeStacks::to_table`], and counts one here).
    pub(super) frames: u64,
}

/// Source frames location `loc` expands to (see [`Expansion`]).
fn width(s: &NativeStacks, loc: usize) -> u64 {
    s.symbols.get(loc).map_or(1, |f| f.len().max(1) as u64)
}

impl Expansion {
    /// Counts `stack` in (`add`) or out, with the symbols `s` has now.
    fn count(&mut self, s: &NativeStacks, stack: &NativeStack, add: bool) {
        for &loc in &stack.locations {
            let w = width(s, loc as usize);
            let r = self.refs.entry(loc).or_insert(0);
            if add {
                *r += 1;
                self.frames = self.frames.saturating_add(w);
            } else {
                *r = r.saturating_sub(1);
                self.frames = self.frames.saturating_sub(w);
            }
        }
    }

    /// Location `loc`'s source frames go from `before` to `after` (each at least 1).
    fn rewidth(&mut self, loc: usize, before: u64, after: u64) {
        let r = u32::try_from(loc)
            .ok()
            .and_then(|l| self.refs.get(&l))
            .copied()
            .unwrap_or(0);
        self.frames = self
            .frames
            .saturating_sub(r.saturating_mul(before))
            .saturating_add(r.saturating_mul(after));
    }
}

/// Adds a frame's worth of tables (read into `part` by [`read_frame`], with its symbol
/// entries) to `into`, counting what the stacks now expand to in `expansion`. Returns how many
/// symbol entries name a location the tables do not have (LOCATIONS comes before SYMBOLS):
/// nothing could show them, so they are counted and left out.
pub(super) fn merge(
    into: &mut NativeStacks,
    part: NativeStacks,
    symbols: SymbolEntries,
    expansion: &mut Expansion,
) -> u64 {
    into.modules.extend(part.modules);
    into.locations.extend(part.locations);
    for (id, stack) in part.stacks {
        expansion.count(into, &stack, true);
        if let Some(old) = into.stacks.insert(id, stack) {
            expansion.count(into, &old, false);
        }
    }
    let mut unknown = 0;
    for (i, frames) in symbols {
        if i >= into.locations.len() {
            unknown += 1;
            continue;
        }
        if frames.is_empty() {
            continue;
        }
        if into.symbols.len() <= i {
            into.symbols.resize(i + 1, Vec::new());
        }
        expansion.rewidth(i, width(into, i), frames.len() as u64);
        into.symbols[i] = frames;
    }
    unknown
}

fn read_symbols(c: &mut Cursor<'_>) -> Result<(usize, Vec<SourceFrame>), String> {
    let loc = c
        .varint()
        .and_then(|v| usize::try_from(v).ok())
        .ok_or("a cut symbol entry")?;
    let k = c.varint().ok_or("a cut symbol entry")?;
    let mut frames = Vec::new();
    for _ in 0..k {
        let function = read_str(c).ok_or("a cut function name")?;
        let file = read_str(c).ok_or("a cut file name")?;
        let line = c.varint().ok_or("a cut line")?;
        frames.push(SourceFrame {
            function,
            file,
            line: u32::try_from(line).unwrap_or(0),
        });
    }
    Ok((loc, frames))
}

impl NativeStacks {
    /// The frames of a location for [`StackTable`]: its source frames, or module + offset.
    /// Whether module `m` is the one Python frames are placed in (its offsets are code ids).
    fn is_python_module(&self, m: u32) -> bool {
        self.modules
            .get(m as usize)
            .is_some_and(|m| m.path == PYTHON_FRAMES_MODULE)
    }

    fn frames_of(&self, loc: u32) -> Vec<Frame> {
        let Some(l) = self.locations.get(loc as usize) else {
            return Vec::new();
        };
        let module = l
            .module
            .and_then(|m| self.modules.get(m as usize))
            .map_or("", |m| m.path.as_str());
        let symbols = self.symbols.get(loc as usize).filter(|s| !s.is_empty());
        if let Some(symbols) = symbols {
            return symbols
                .iter()
                .map(|f| Frame {
                    function: f.function.clone(),
                    file: if f.file.is_empty() {
                        "??".to_owned()
                    } else {
                        f.file.clone()
                    },
                    line: i64::from(f.line),
                    module: module.to_owned(),
                })
                .collect();
        }
        let name = module.rsplit('/').next().unwrap_or(module);
        let function = if name.is_empty() {
            format!("0x{:x}", l.offset)
        } else {
            format!("{name}+0x{:x}", l.offset)
        };
        vec![Frame {
            function,
            file: "??".to_owned(),
            line: 0,
            module: module.to_owned(),
        }]
    }

    /// The stacks as a [`StackTable`], and each recorded stack id's id in it.
    #[must_use]
    pub fn to_table(&self) -> (StackTable, HashMap<u32, u32>) {
        let mut table = StackTable::new();
        for m in &self.modules {
            if !m.build_id.is_empty() {
                let hex = m.build_id.iter().map(|b| format!("{b:02x}")).collect();
                table.set_build_id(&m.path, hex);
            }
        }
        let mut frame_ids: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut ids: Vec<&u32> = self.stacks.keys().collect();
        ids.sort_unstable();
        let mut map = HashMap::with_capacity(ids.len());
        for id in ids {
            let mut frames = Vec::new();
            for &loc in &self.stacks[id].locations {
                let fs = frame_ids.entry(loc).or_insert_with(|| {
                    let native = self
                        .locations
                        .get(loc as usize)
                        .filter(|l| l.module.is_some_and(|m| !self.is_python_module(m)));
                    self.frames_of(loc)
                        .into_iter()
                        .map(|f| {
                            let id = table.intern_frame(f);
                            if let Some(l) = native {
                                table.set_module_offset(id, l.offset);
                            }
                            id
                        })
                        .collect()
                });
                frames.extend_from_slice(fs);
            }
            map.insert(*id, table.intern_stack(frames));
        }
        (table, map)
    }
}

#[cfg(test)]
mod tests {
    use super::place::tests::module;
    use super::*;

    #[test]
    fn trace_frames_round_trip_and_unresolved_frames_are_module_plus_offset() {
        let mut s = from_spool(
            vec![module("/usr/bin/prog", 0, (0x40_0000, 0x50_0000))],
            vec![StackDef {
                id: 7,
                end: StackEnd::Unsupported,
                pcs: vec![0x40_0010, 0x40_0020],
                modules_before: 1,
            }],
            &[],
        );
        s.symbols = vec![vec![
            SourceFrame {
                function: "inlined_helper".to_owned(),
                file: "a.cpp".to_owned(),
                line: 3,
            },
            SourceFrame {
                function: "outer(int)".to_owned(),
                file: String::new(),
                line: 0,
            },
        ]];
        let mut back = NativeStacks::default();
        for (tag, payload) in encode_frames(&s) {
            let mut part = NativeStacks::default();
            let symbols = read_frame(&mut part, tag, &payload).unwrap();
            assert_eq!(
                merge(&mut back, part, symbols, &mut Expansion::default()),
                0
            );
        }
        for m in &mut s.modules {
            m.segments.clear();
        }
        assert_eq!(back, s);
        let (table, ids) = back.to_table();
        let names: Vec<String> = table.frames_of(ids[&7]).map(|f| f.to_string()).collect();
        assert_eq!(
            names,
            ["inlined_helper (a.cpp:3)", "outer(int)", "prog+0x400020"]
        );
        assert!(read_frame(&mut NativeStacks::default(), FRAME_STACKS, &[5, 1]).is_err());
    }

    /// Found by the stacks fuzz target: a symbol entry for location 2^27 took a table of 2^27
    /// entries (5 GB). It is kept apart until the merge, which leaves it out and counts it.
    #[test]
    fn a_symbol_entry_past_the_locations_is_counted_not_tabled() {
        let mut payload = Vec::new();
        put_varint(&mut payload, 1);
        put_varint(&mut payload, 1 << 27);
        put_varint(&mut payload, 1);
        put_str(&mut payload, b"f");
        put_str(&mut payload, b"f.c");
        put_varint(&mut payload, 3);
        let mut part = NativeStacks::default();
        let symbols = read_frame(&mut part, FRAME_SYMBOLS, &payload).unwrap();
        assert_eq!(symbols.len(), 1);
        let mut into = NativeStacks::default();
        assert_eq!(
            merge(&mut into, part, symbols, &mut Expansion::default()),
            1
        );
        assert!(into.symbols.is_empty());
    }
}
