//! The program's own heaps: events a program reports of its own allocator (an arena, a pool,
//! a GPU memory manager) through `allocview.h` or the `allocview-heap` crate, or through the
//! `otel_memory` USDT probes, beside the malloc family's.
//!
//! Every event belongs to one heap: 0 is the malloc family's, any other number one the
//! program reported (`allocview_heap_alloc(heap, ptr, size)`). In a trace, op bit 7 marks an
//! event of another heap than 0 and its id follows it ([`super::OP_HEAP`]); HEAPS frames
//! (`0x0E`) name them ([`encode_names`]). In a spool, the op byte `0x1b` prefixes such an
//! event with its id and `0x18` frames name the heaps (see the tracer's `heaps.rs`).
//!
//! Readers see one heap at a time, heap 0 unless asked ([`crate::LoadOptions::heap`]): each
//! heap is a consistent set of addresses of its own (an arena's blocks lie inside a block
//! malloc gave it, so their addresses would clash with malloc's if mixed).

use std::collections::HashMap;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::Path;

use super::codec::{Cursor, put_varint};
use super::{FRAME_END, corrupt, read_header};
use crate::error::LoadError;
use crate::events::Record;

/// Tag of a trace's HEAPS frame.
pub(super) const FRAME_HEAPS: u8 = 0x0E;
/// Tag of a spool's HEAPS frame: varint heap id, then the name to the frame's end.
pub(super) const SPOOL_FRAME_HEAPS: u8 = 0x18;
/// The name of heap 0, the malloc family's.
pub const MALLOC_HEAP: &str = "malloc";
/// Longest heap name kept, in bytes (longer names are cut at a character boundary).
pub const MAX_HEAP_NAME_BYTES: usize = 255;
/// The most heaps a trace holds besides malloc's: a writer refuses more, and a reader names at
/// most this many (others read as `heap-N`), so that crafted input costs bounded time.
pub const MAX_HEAPS: usize = 4096;

/// A heap's id and the name the program gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapName {
    pub id: u32,
    pub name: String,
}

/// `name` cut to [`MAX_HEAP_NAME_BYTES`] at a character boundary, lossily decoded.
pub(super) fn clean_name(bytes: &[u8]) -> String {
    let mut s = String::from_utf8_lossy(bytes).into_owned();
    if s.len() > MAX_HEAP_NAME_BYTES {
        let mut end = MAX_HEAP_NAME_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Sets `id`'s name in `names` (a later name replaces an earlier one); past [`MAX_HEAPS`]
/// names, a new id is left unnamed (each call then costs a bounded search).
pub(super) fn set_name(names: &mut Vec<HeapName>, id: u32, name: String) {
    let full = names.len() >= MAX_HEAPS;
    match names.iter_mut().find(|h| h.id == id) {
        Some(h) => h.name = name,
        None if !full => names.push(HeapName { id, name }),
        None => {}
    }
}

/// A HEAPS frame's payload (trace, kind 0).
#[must_use]
pub(super) fn encode_names(names: &[HeapName]) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, names.len() as u64);
    for h in names {
        put_varint(&mut out, u64::from(h.id));
        put_varint(&mut out, h.name.len() as u64);
        out.extend_from_slice(h.name.as_bytes());
    }
    out
}

/// Reads a trace's HEAPS frame into `names`; `None` when it does not parse.
pub(super) fn decode_names(payload: &[u8], names: &mut Vec<HeapName>) -> Option<()> {
    let mut c = Cursor::new(payload);
    let n = c.varint()?;
    for _ in 0..n {
        let id = u32::try_from(c.varint()?).ok().filter(|&id| id != 0)?;
        let len = usize::try_from(c.varint()?).ok()?;
        let name = clean_name(c.take(len)?);
        set_name(names, id, name);
    }
    c.at_end().then_some(())
}

/// Reads a spool's HEAPS frame into `names`; `None` when it does not parse.
pub(super) fn decode_spool_name(payload: &[u8], names: &mut Vec<HeapName>) -> Option<()> {
    let mut c = Cursor::new(payload);
    let id = u32::try_from(c.varint()?).ok().filter(|&id| id != 0)?;
    let rest = payload.get(c.pos..)?;
    set_name(names, id, clean_name(rest));
    Some(())
}

/// The heaps a binary trace names (its HEAPS frames), reading only the frame headers and
/// those frames. A spool's are read with its events ([`super::BinaryInfo::heaps`]); any
/// other file has none.
///
/// # Errors
/// When the file cannot be read, or a HEAPS frame is corrupt.
pub fn heap_names(path: &Path) -> Result<Vec<HeapName>, LoadError> {
    let mut file = std::fs::File::open(path).map_err(|e| LoadError::io(path, e))?;
    let mut head = [0u8; 10];
    if file.read_exact(&mut head).is_err() || !super::is_binary(&head) {
        return Ok(Vec::new());
    }
    if read_header(path, &head)? != super::FileKind::Trace {
        // A spool: its names come with its events.
        let mut names = Vec::new();
        let info = super::read_records(path, super::TimeBase::default(), |_| Ok(()))?;
        for h in info.heaps {
            set_name(&mut names, h.id, h.name);
        }
        return Ok(names);
    }
    let mut names = Vec::new();
    let mut at = 10u64;
    loop {
        let mut fh = [0u8; 5];
        if file.read_exact(&mut fh).is_err() {
            return Ok(names);
        }
        let [tag, l0, l1, l2, l3] = fh;
        let len = u32::from_le_bytes([l0, l1, l2, l3]);
        if tag == FRAME_END {
            return Ok(names);
        }
        if tag == FRAME_HEAPS {
            let mut payload = Vec::new();
            (&mut file)
                .take(u64::from(len))
                .read_to_end(&mut payload)
                .map_err(|e| LoadError::io(path, e))?;
            if payload.len() != len as usize {
                return Ok(names);
            }
            decode_names(&payload, &mut names).ok_or_else(|| corrupt(path, at, "a heaps frame"))?;
        } else {
            file.seek(SeekFrom::Current(i64::from(len)))
                .map_err(|e| LoadError::io(path, e))?;
        }
        at += 5 + u64::from(len);
    }
}

/// The id of the heap named `name` in `path`: 0 for `malloc`; an error listing the heaps the
/// file has when it has none of that name. `heap-N` names heap N when no entry names it.
///
/// # Errors
/// When the file cannot be read, or has no heap of that name.
pub fn resolve_heap(path: &Path, name: &str) -> Result<u32, LoadError> {
    if name == MALLOC_HEAP {
        return Ok(0);
    }
    let names = heap_names(path)?;
    if let Some(h) = names.iter().rev().find(|h| h.name == name) {
        return Ok(h.id);
    }
    if let Some(id) = name
        .strip_prefix("heap-")
        .and_then(|n| n.parse::<u32>().ok())
        .filter(|&id| id != 0 && !names.iter().any(|h| h.id == id))
    {
        return Ok(id);
    }
    let mut list = vec![MALLOC_HEAP.to_owned()];
    list.extend(names.iter().map(|h| h.name.clone()));
    Err(LoadError::format(
        path,
        format!(
            "no heap named `{name}`: the trace's heaps are {}",
            list.join(", ")
        ),
    ))
}

/// What one heap of a trace holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapFigures {
    pub id: u32,
    pub name: String,
    pub events: u64,
    pub allocations: u64,
    pub frees: u64,
    /// The most bytes the heap had allocated and not freed at once.
    pub peak_live_bytes: u64,
    /// Bytes allocated and not freed at the end.
    pub final_live_bytes: u64,
}

/// Every heap of a binary trace or spool with its figures, heap 0 (malloc's) first and the
/// others by id: read in one pass over every event. Each heap's blocks are paired by address
/// within the heap; a free of an address the heap does not hold frees nothing.
///
/// # Errors
/// As [`super::read_records`].
pub fn heap_figures(path: &Path) -> Result<Vec<HeapFigures>, LoadError> {
    let mut by_id: HashMap<u32, (HeapFigures, HashMap<u64, u64>, u64)> = HashMap::new();
    let info = super::read_records(path, super::TimeBase::default(), |r: &Record| {
        let (f, live, live_bytes) = by_id.entry(r.heap).or_default();
        f.events += 1;
        match r.size_bytes {
            Some(size) => {
                f.allocations += 1;
                if r.addr != 0 {
                    if let Some(old) = live.insert(r.addr, size) {
                        *live_bytes = live_bytes.saturating_sub(old);
                    }
                    // Sizes come from the file: a crafted one may not overflow the sum.
                    *live_bytes = live_bytes.saturating_add(size);
                    f.peak_live_bytes = f.peak_live_bytes.max(*live_bytes);
                }
            }
            None => {
                f.frees += 1;
                if let Some(size) = live.remove(&r.addr) {
                    *live_bytes = live_bytes.saturating_sub(size);
                }
            }
        }
        Ok(())
    })?;
    let names = info.heaps;
    by_id.entry(0).or_default();
    // Looked up by id: a crafted trace may use a great many heaps.
    let name_by_id: HashMap<u32, &str> = names.iter().map(|h| (h.id, h.name.as_str())).collect();
    let mut out: Vec<HeapFigures> = by_id
        .into_iter()
        .map(|(id, (f, _, live_bytes))| HeapFigures {
            id,
            name: match (id, name_by_id.get(&id)) {
                (0, _) => MALLOC_HEAP.to_owned(),
                (_, Some(name)) => (*name).to_owned(),
                (_, None) => format!("heap-{id}"),
            },
            final_live_bytes: live_bytes,
            ..f
        })
        .collect();
    let present: std::collections::HashSet<u32> = out.iter().map(|f| f.id).collect();
    for h in &names {
        if !present.contains(&h.id) {
            out.push(HeapFigures {
                id: h.id,
                name: h.name.clone(),
                ..HeapFigures::default()
            });
        }
    }
    out.sort_by_key(|f| f.id);
    Ok(out)
}
