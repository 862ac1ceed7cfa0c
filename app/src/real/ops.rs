//! The calls a replay process runs, written in the replayer's file format (see
//! `replayer/src/main.rs`): one 16-byte call per event of the trace, so that a sample's call
//! count is an event index.
//!
//! Each allocation gets a slot in the replayer's table of live pointers; a freed slot is given
//! to the next allocation, so the table holds as many slots as allocations were ever live at
//! once (its pages are in the replay's baseline, not in the measured memory). A free and then
//! an allocation that the trace names `realloc`, one after the other on one thread, are one
//! `realloc` call; `calloc` is `calloc`; every other allocation is `malloc` (the trace does
//! not keep an aligned call's alignment).

use std::io::{Seek, SeekFrom, Write};

use allocview_sim::trace::{EventKind, NO_ALLOC_ID, TraceView};
use anyhow::Result;

pub(super) const HEADER_BYTES: usize = 48;
const MAGIC: &[u8; 8] = b"AVRPLAY1";

const MALLOC: u8 = 0;
const CALLOC: u8 = 1;
const FREE: u8 = 2;
const REALLOC_FROM: u8 = 3;
const REALLOC_TO: u8 = 4;
const NOTHING: u8 = 5;

/// The `call` column's codes this reads (`allocview_loaders::events::CALL_NAMES`).
const CALL_CALLOC: u8 = 1;
const CALL_REALLOC: u8 = 2;

/// How the replay runs, for the header.
pub(super) struct Setup {
    pub threads: u32,
    pub touch: u8,
    pub one_thread: bool,
    pub sample_every: u32,
    /// The event after which a sample is also taken (the peak of live bytes).
    pub mark: u64,
}

/// Writes the calls of `view` (with each event's thread index and, where the trace names
/// them, its call) to `out`.
///
/// # Errors
/// Writing.
pub(super) fn write_ops(
    out: &mut (impl Write + Seek),
    view: &TraceView<'_>,
    threads: &[u16],
    calls: Option<&[u8]>,
    setup: &Setup,
) -> Result<()> {
    let n = view.len();
    let mut slot_of = vec![u32::MAX; view.num_allocs as usize];
    let mut free_slots: Vec<u32> = Vec::new();
    let mut slots = 0u32;
    // The header's slot count is known at the end: the header is written last.
    out.write_all(&[0u8; HEADER_BYTES])?;
    // The call before this one, held back in case this one makes it a realloc's first half.
    let mut held: Option<[u8; 16]> = None;
    for i in 0..n {
        let thread = threads.get(i).copied().unwrap_or(0);
        let call = calls.and_then(|c| c.get(i)).copied();
        let id = view.alloc_id.get(i).copied().unwrap_or(NO_ALLOC_ID) as usize;
        let size = view.size_bytes.get(i).copied().unwrap_or(0);
        let (op, slot) = match view.kind_at(i) {
            Some(EventKind::Alloc) => {
                let slot = free_slots.pop().unwrap_or_else(|| {
                    slots += 1;
                    slots - 1
                });
                if let Some(s) = slot_of.get_mut(id) {
                    *s = slot;
                }
                // The second half of a realloc: its first half is the event before, on this
                // thread, a free named realloc.
                let after_realloc_free = i > 0
                    && call == Some(CALL_REALLOC)
                    && calls.and_then(|c| c.get(i - 1)).copied() == Some(CALL_REALLOC)
                    && threads.get(i - 1).copied().unwrap_or(0) == thread
                    && held.is_some_and(|o| o[0] == FREE);
                if after_realloc_free && let Some(prev) = held.as_mut() {
                    prev[0] = REALLOC_FROM;
                    (REALLOC_TO, slot)
                } else if call == Some(CALL_CALLOC) {
                    (CALLOC, slot)
                } else {
                    (MALLOC, slot)
                }
            }
            Some(EventKind::Free) => match slot_of.get(id).copied() {
                Some(slot) if slot != u32::MAX => {
                    free_slots.push(slot);
                    (FREE, slot)
                }
                _ => (NOTHING, 0),
            },
            _ => (NOTHING, 0),
        };
        let mut rec = [0u8; 16];
        rec[0] = op;
        rec[2..4].copy_from_slice(&thread.to_le_bytes());
        rec[4..8].copy_from_slice(&slot.to_le_bytes());
        rec[8..16].copy_from_slice(&size.to_le_bytes());
        if let Some(prev) = held.replace(rec) {
            out.write_all(&prev)?;
        }
    }
    if let Some(prev) = held {
        out.write_all(&prev)?;
    }
    let mut header = [0u8; HEADER_BYTES];
    header[..8].copy_from_slice(MAGIC);
    header[8..16].copy_from_slice(&(n as u64).to_le_bytes());
    header[16..24].copy_from_slice(&u64::from(slots.max(1)).to_le_bytes());
    header[24..28].copy_from_slice(&setup.threads.to_le_bytes());
    header[28] = setup.touch;
    header[29] = u8::from(setup.one_thread);
    header[32..36].copy_from_slice(&setup.sample_every.to_le_bytes());
    header[40..48].copy_from_slice(&setup.mark.to_le_bytes());
    out.seek(SeekFrom::Start(0))?;
    out.write_all(&header)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocview_sim::trace::OwnedTrace;

    fn ops_of(t: &OwnedTrace, threads: &[u16], calls: Option<&[u8]>) -> Vec<[u8; 16]> {
        let v = t.view().unwrap();
        let mut out = std::io::Cursor::new(Vec::new());
        let setup = Setup {
            threads: 2,
            touch: 2,
            one_thread: false,
            sample_every: 1,
            mark: 0,
        };
        write_ops(&mut out, &v, threads, calls, &setup).unwrap();
        let out = out.into_inner();
        assert_eq!(&out[..8], MAGIC);
        out[HEADER_BYTES..]
            .chunks(16)
            .map(|c| c.try_into().unwrap())
            .collect()
    }

    #[test]
    fn freed_slots_are_reused_and_reallocs_are_one_call() {
        let mut t = OwnedTrace::new();
        let a = t.alloc(0, 10);
        t.free(1, a);
        let b = t.alloc(2, 20);
        t.free(3, b);
        let _c = t.alloc(4, 30);
        let ops = ops_of(&t, &[0, 0, 0, 0, 0], Some(&[0, 3, 1, 2, 2]));
        let codes: Vec<u8> = ops.iter().map(|o| o[0]).collect();
        assert_eq!(codes, [MALLOC, FREE, CALLOC, REALLOC_FROM, REALLOC_TO]);
        let slots: Vec<u32> = ops
            .iter()
            .map(|o| u32::from_le_bytes(o[4..8].try_into().unwrap()))
            .collect();
        assert_eq!(slots, [0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_realloc_split_across_threads_is_a_free_and_a_malloc() {
        let mut t = OwnedTrace::new();
        let a = t.alloc(0, 10);
        t.free(1, a);
        let _b = t.alloc(2, 20);
        let ops = ops_of(&t, &[0, 0, 1], Some(&[0, 2, 2]));
        let codes: Vec<u8> = ops.iter().map(|o| o[0]).collect();
        assert_eq!(codes, [MALLOC, FREE, MALLOC]);
    }
}
