//! The calls a replay process runs, written in the replayer's file format (see
//! `replayer/src/main.rs`): one 16-byte call per event of the trace, so that a sample's call
//! count is an event index.
//!
//! Each allocation gets a slot in the replayer's table of live pointers; a freed slot is given
//! to the next allocation, so the table holds as many slots as allocations were ever live at
//! once (its pages are in the replay's baseline, not in the measured memory). A free and then
//! an allocation that the trace names `realloc` (or `reallocarray`), one after the other on one
//! thread (other threads' calls may come between), are one `realloc` call; `calloc` is
//! `calloc`; every other allocation is `malloc` (the trace does not keep an aligned call's
//! alignment).

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
const CALL_REALLOCARRAY: u8 = 9;

/// How the replay runs, for the header.
pub(super) struct Setup {
    pub threads: u32,
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
    let (from, to) = realloc_halves(view, threads, calls);
    let is = |bits: &[u64], i: usize| bits.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1);
    let mut slot_of = vec![u32::MAX; view.num_allocs as usize];
    let mut free_slots: Vec<u32> = Vec::new();
    let mut slots = 0u32;
    // The header's slot count is known at the end: the header is written last.
    out.write_all(&[0u8; HEADER_BYTES])?;
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
                let op = if is(&to, i) {
                    REALLOC_TO
                } else if call == Some(CALL_CALLOC) {
                    CALLOC
                } else {
                    MALLOC
                };
                (op, slot)
            }
            Some(EventKind::Free) => match slot_of.get(id).copied() {
                Some(slot) if slot != u32::MAX => {
                    free_slots.push(slot);
                    (if is(&from, i) { REALLOC_FROM } else { FREE }, slot)
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
        out.write_all(&rec)?;
    }
    let mut header = [0u8; HEADER_BYTES];
    header[..8].copy_from_slice(MAGIC);
    header[8..16].copy_from_slice(&(n as u64).to_le_bytes());
    header[16..24].copy_from_slice(&u64::from(slots.max(1)).to_le_bytes());
    header[24..28].copy_from_slice(&setup.threads.to_le_bytes());
    header[32..36].copy_from_slice(&setup.sample_every.to_le_bytes());
    header[40..48].copy_from_slice(&setup.mark.to_le_bytes());
    out.seek(SeekFrom::Start(0))?;
    out.write_all(&header)?;
    Ok(())
}

/// Which frees begin a `realloc` and which allocations end one, as bit sets by event: a free
/// named `realloc` (or `reallocarray`) of a known block, and the next event of the same
/// thread, an allocation named so (other threads' events may come between the two: the
/// tracer writes the free when the call starts and the allocation when it returns).
fn realloc_halves(
    view: &TraceView<'_>,
    threads: &[u16],
    calls: Option<&[u8]>,
) -> (Vec<u64>, Vec<u64>) {
    let n = view.len();
    let (mut from, mut to) = (vec![0u64; n.div_ceil(64)], vec![0u64; n.div_ceil(64)]);
    let Some(calls) = calls else {
        return (from, to);
    };
    let named = |i: usize| matches!(calls.get(i), Some(&CALL_REALLOC | &CALL_REALLOCARRAY));
    // Per thread: its latest event, when that was a realloc's free.
    let mut open: std::collections::HashMap<u16, usize> = std::collections::HashMap::new();
    for i in 0..n {
        let thread = threads.get(i).copied().unwrap_or(0);
        let opened = open.remove(&thread);
        match view.kind_at(i) {
            Some(EventKind::Free) if named(i) => {
                open.insert(thread, i);
            }
            Some(EventKind::Alloc) if named(i) => {
                if let Some(f) = opened {
                    if let Some(w) = from.get_mut(f / 64) {
                        *w |= 1 << (f % 64);
                    }
                    if let Some(w) = to.get_mut(i / 64) {
                        *w |= 1 << (i % 64);
                    }
                }
            }
            _ => {}
        }
    }
    (from, to)
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
    fn a_realloc_keeps_its_halves_when_another_thread_comes_between() {
        let mut t = OwnedTrace::new();
        let a = t.alloc(0, 10);
        let _b = t.alloc(1, 5);
        t.free(2, a);
        let _c = t.alloc(3, 7);
        let _d = t.alloc(4, 20);
        // Thread 0: a, realloc's free of a, ..., realloc's alloc; thread 1 between.
        let ops = ops_of(&t, &[0, 1, 0, 1, 0], Some(&[0, 0, 2, 0, 2]));
        let codes: Vec<u8> = ops.iter().map(|o| o[0]).collect();
        assert_eq!(codes, [MALLOC, MALLOC, REALLOC_FROM, MALLOC, REALLOC_TO]);
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
