//! Loaded or streamed: whether a command reads a binary trace block by block instead of
//! loading it ([`StreamArgs`]: `--stream`, `--no-stream`, and on its own for a binary trace whose
//! events may not fit in half the memory available), refusing to load what cannot fit, and how
//! much of a trace too big to load an explorer opens. Streamed, the events are decoded block by
//! block from the file ([`super::source`]) and replayed as they come ([`super::runs`]), so
//! memory is bounded by a block, the live allocations and each policy's heap, not by the trace.

use std::path::Path;

use allocview_loaders::binary;
use anyhow::{Context as _, Result, bail};

use super::options::{InputArgs, StreamArgs};

/// Bytes of memory an event takes once loaded (the event table's columns and what building
/// them costs at the peak), for the choice to stream.
const LOADED_BYTES_PER_EVENT: u64 = 40;
/// Most events a byte of a binary trace holds, for the estimate (its zstd blocks take 1.2 to 3
/// bytes an event on real traces).
const EVENTS_PER_FILE_BYTE_MAX: u64 = 1;

impl StreamArgs {
    /// Whether to stream `file`: asked for, or a binary trace whose events may not fit in half
    /// the available memory. A window (`--from/--to/--events`) streams too
    /// ([`super::source`]).
    pub fn applies(&self, file: &Path, input: &InputArgs) -> Result<bool> {
        if self.no_stream {
            return Ok(false);
        }
        let is_binary = binary::is_binary(&binary::file_head(file)?);
        if self.stream {
            if !is_binary {
                // Only a text trace converts to the binary form; every other input is read
                // whole.
                let text = matches!(
                    allocview_loaders::detect(file),
                    Ok(allocview_loaders::InputKind::MallocTrace)
                );
                if text {
                    bail!(
                        "--stream reads allocview's binary traces; convert {} first \
                         (allocview convert {} OUT.avt)",
                        file.display(),
                        file.display()
                    );
                }
                bail!(
                    "--stream reads allocview's binary traces; {} is loaded whole (without \
                     --stream)",
                    file.display()
                );
            }
            if input.lenient {
                bail!("--stream reads strictly: --lenient repairs damage in a loaded trace only");
            }
            return Ok(true);
        }
        if !is_binary || input.lenient {
            return Ok(false);
        }
        let loaded_bytes = loaded_bytes_estimate(file)?;
        let big = available_memory_bytes().is_some_and(|avail| loaded_bytes > avail / 2);
        let stream = big && is_trace(file);
        if stream {
            eprintln!(
                "note: {} may not fit in memory once loaded: streaming it block by block",
                file.display()
            );
        }
        Ok(stream)
    }

    /// Whether `stats` streams `file`: as [`Self::applies`], and on its own for any whole,
    /// cleanly finished binary trace (one with its INDEX frame). Its figures need one pass and
    /// no column, so reading the blocks as they come is faster than loading them (the loaded
    /// trace's columns cost a page fault every 4 KiB) and takes a sixth of the memory, with the
    /// same output. A cut or damaged file, `--lenient` and a window load as before: the loader
    /// says what it found wrong in the whole file, where a stream stops at it.
    pub fn applies_to_stats(&self, file: &Path, input: &InputArgs) -> Result<bool> {
        if self.no_stream || self.applies(file, input)? {
            return Ok(!self.no_stream);
        }
        let whole = input.window.spec()?.is_none();
        if !whole || input.lenient || !is_trace(file) {
            return Ok(false);
        }
        // An INDEX frame that does not describe the blocks is refused here, with where: a
        // stream would trust it, and a load would count other events than a stream.
        let finished = binary::read_index_frame(file)
            .with_context(|| format!("while reading {}", file.display()))?
            .is_some();
        Ok(finished)
    }
}

/// Memory the events of `file` (a binary trace or spool) would take once loaded: of a trace,
/// from the events its blocks declare (their headers read, nothing decompressed: a few bytes
/// of zstd can hold 65,536 events); of a spool, from its size.
fn loaded_bytes_estimate(file: &Path) -> Result<u64> {
    let events = match binary::block_events(file)
        .with_context(|| format!("while reading {}", file.display()))?
    {
        Some(events) => events,
        None => std::fs::metadata(file)
            .with_context(|| format!("cannot open {}", file.display()))?
            .len()
            .saturating_mul(EVENTS_PER_FILE_BYTE_MAX),
    };
    Ok(events.saturating_mul(LOADED_BYTES_PER_EVENT))
}

/// A binary trace whose events would take more memory than is available once loaded: its
/// events, the memory they would take, and the memory available (the events its blocks
/// declare, from the frame headers: an INDEX frame may not agree with them, and a file may
/// have none; `None` for any other file, one that fits, or one whose blocks the loader will
/// refuse itself).
fn too_big(file: &Path) -> Option<(u64, u64, u64)> {
    let records = binary::block_events(file).ok()??;
    let need = records.saturating_mul(LOADED_BYTES_PER_EVENT);
    let avail = available_memory_bytes()?;
    (need > avail).then_some((records, need, avail))
}

/// Refuses to load a binary trace whose events would take more memory than is available (the
/// load would be killed, or abort on its first reservation), and says which commands stream it.
pub fn refuse_if_too_big(file: &Path) -> Result<()> {
    if let Some((records, need, avail)) = too_big(file) {
        bail!(
            "{} holds {} events, about {} once loaded, more than the {} of memory available: \
             `allocview stats`, `compare`, `report` and `predict` stream it block by block, whole or \
             a window of it, and the explorers open a window of it (--from/--to/--events) \
             (docs/src/guide/big-traces.md); this command needs the trace loaded",
            file.display(),
            crate::format::count(records),
            crate::format::bytes(need),
            crate::format::bytes(avail)
        );
    }
    Ok(())
}

/// What an event of an explorer's part takes once replayed (the event table, a replay's
/// addresses and index, with room).
const EXPLORER_BYTES_PER_EVENT: u64 = 64;

/// Events of the parts an explorer shows of a trace too big to load, at most: a part, and so
/// each move to another one (`g #N`, `{`, `}`), is read from the nearest resume point, replayed
/// by one policy and drawn in under 100 ms (`allocview bench hops`, bfc: p99 86 to 88 ms on
/// the 2-billion-event trace), where parts of 33.5 million events took 3 to 5 s.
const EXPLORER_PART_EVENTS_MAX: u64 = 1 << 18;

/// For a binary trace too big to load whole: its events, and how many of them an explorer
/// opens by default, from its start ([`default_part_events`]). `None` when the trace can be
/// loaded.
#[must_use]
pub fn explorer_default_window(file: &Path) -> Option<(u64, u64)> {
    let (records, _, avail) = too_big(file)?;
    Some((records, default_part_events(records, avail)))
}

/// Events of an explorer's part of a trace of `records` events with `avail_bytes` of memory:
/// [`EXPLORER_PART_EVENTS_MAX`], or fewer where they would not fit in a quarter of the memory
/// at [`EXPLORER_BYTES_PER_EVENT`]; one at least, the trace's at most.
fn default_part_events(records: u64, avail_bytes: u64) -> u64 {
    (avail_bytes / 4 / EXPLORER_BYTES_PER_EVENT)
        .min(EXPLORER_PART_EVENTS_MAX)
        .clamp(1, records.max(1))
}

/// True for a binary trace (a spool is loaded: its threads are merged in memory).
fn is_trace(file: &Path) -> bool {
    // Byte 9 is the file's kind: 0 a trace, 1 a spool.
    binary::file_head(file).is_ok_and(|head| binary::is_binary(&head) && head.get(9) == Some(&0))
}

/// `MemAvailable` of `/proc/meminfo`, in bytes, or `ALLOCVIEW_AVAILABLE_MEMORY` (bytes) where
/// it is set: what allocview may count on, to try the big-trace paths on a small trace or to
/// keep allocview smaller than the machine.
/// Either is lowered to the address space this process may still map (`ulimit -v`), as an
/// allocation past it aborts.
pub(crate) fn available_memory_bytes() -> Option<u64> {
    let limit = address_space_left_bytes();
    if let Some(v) = std::env::var_os("ALLOCVIEW_AVAILABLE_MEMORY")
        && let Some(bytes) = v.to_str().and_then(|s| s.trim().parse::<u64>().ok())
    {
        return Some(limit.map_or(bytes, |l| l.min(bytes)));
    }
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(limit.map_or(kib * 1024, |l| l.min(kib * 1024)))
}

/// The soft `RLIMIT_AS` less the address space mapped already (`VmSize`), from `/proc/self`;
/// `None` when unlimited or unknown.
fn address_space_left_bytes() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    let soft: u64 = line
        .trim_start_matches("Max address space")
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let vm_kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmSize:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(soft.saturating_sub(vm_kib * 1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts are capped at 262,144 events, narrowed where memory is short, and never empty
    /// or longer than the trace.
    #[test]
    fn an_explorers_part_is_capped_and_fits_the_memory() {
        let gib = 1u64 << 30;
        assert_eq!(default_part_events(2_000_000_000, 20 * gib), 1 << 18);
        // A quarter of 20 MB at 64 bytes an event.
        assert_eq!(default_part_events(2_000_000_000, 20_000_000), 78_125);
        assert_eq!(default_part_events(2_000_000_000, 0), 1);
        assert_eq!(default_part_events(1000, 20 * gib), 1000);
        assert_eq!(default_part_events(0, 20 * gib), 1);
    }
}
