//! DHAT's JSON (`dhatFileVersion` 2), as Valgrind's `--tool=dhat` and dhat-rs write it, in
//! heap mode: per program point, the bytes and blocks allocated over the run (`tb`, `tbk`),
//! and where the file has block lifetimes (`bklt`), live at the global peak (`gb`, `gbk`) and
//! at the end (`eb`, `ebk`). The end is the profile's moment (what was still live: leaks); the
//! peak is the second moment `--at peak` reads.
//!
//! A frame of the frames table reads `0xADDRESS: function (file:line[:column])` or
//! `0xADDRESS: function (in module)` (dhat-rs leaves the address out); its innermost first,
//! as `fs` lists them; the first entry, `[root]`, is no frame.

use serde_json::Value;

use super::{HeapProfile, Holds, ProfileFormat, ProfileSample};
use crate::sites::{Frame, StackTable};

/// Whether `head` (a file's first decompressed bytes) is DHAT's JSON.
#[must_use]
pub fn is_dhat(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head.get(..head.len().min(4096)).unwrap_or(head));
    text.trim_start().starts_with('{') && text.contains("\"dhatFileVersion\"")
}

/// Parses a whole DHAT file.
///
/// # Errors
/// JSON that does not parse (with its line and column), another file version or mode, or a
/// program point that names no frame of the table (with its index).
pub fn parse(bytes: &[u8], lenient: bool) -> Result<HeapProfile, String> {
    let doc: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("the JSON does not parse: {e}"))?;
    let version = doc["dhatFileVersion"].as_u64();
    if version != Some(2) {
        return Err(format!(
            "dhatFileVersion {}: allocview reads version 2",
            doc["dhatFileVersion"]
        ));
    }
    let mode = doc["mode"].as_str().unwrap_or("");
    if mode != "heap" && mode != "rust-heap" {
        return Err(format!(
            "a DHAT file in {mode:?} mode (copy or ad-hoc profiling): allocview reads heap profiles"
        ));
    }
    let lifetimes = doc["bklt"].as_bool() == Some(true);
    let ftbl = doc["ftbl"].as_array().ok_or("no frames table (ftbl)")?;
    let pps = doc["pps"].as_array().ok_or("no program points (pps)")?;
    let mut stacks = StackTable::new();
    let frame_ids: Vec<u32> = ftbl
        .iter()
        .map(|f| stacks.intern_frame(frame(f.as_str().unwrap_or("??"))))
        .collect();
    let mut samples = Vec::with_capacity(pps.len().min(1 << 20));
    let mut skipped = 0u64;
    for (i, pp) in pps.iter().enumerate() {
        let ids = match point_frames(pp, i, &frame_ids) {
            Ok(ids) => ids,
            Err(_) if lenient => {
                skipped += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        let n = |k: &str| pp[k].as_u64().unwrap_or(0);
        samples.push(ProfileSample {
            stack: stacks.intern_stack(ids),
            live_bytes: n("eb"),
            live_objects: n("ebk"),
            alloc_bytes: n("tb"),
            alloc_objects: n("tbk"),
            peak_bytes: n("gb"),
            peak_objects: n("gbk"),
        });
    }
    let unit_ns = match doc["tu"].as_str() {
        Some("µs") => Some(1_000),
        _ => None,
    };
    let mut notes = Vec::new();
    if skipped > 0 {
        notes.push(format!(
            "skipped {skipped} program points that name frames the table lacks (--lenient)"
        ));
    }
    notes.push(format!(
        "a DHAT profile of {}: per-site totals, a moment at its end{}, not a timeline",
        doc["cmd"].as_str().unwrap_or("a program"),
        if lifetimes { " and at its peak" } else { "" }
    ));
    if !lifetimes {
        notes.push(
            "the file has no block lifetimes (bklt): nothing is live at its end or peak in it"
                .to_owned(),
        );
    }
    Ok(HeapProfile {
        format: ProfileFormat::Dhat,
        stacks,
        samples,
        has: Holds {
            live: lifetimes,
            alloc: true,
            peak: lifetimes,
        },
        duration_ns: unit_ns.and_then(|u: u64| doc["te"].as_u64().map(|t| t.saturating_mul(u))),
        notes,
    })
}

/// The stack ids of program point `i`'s frames (`fs`), innermost first.
fn point_frames(pp: &Value, i: usize, frame_ids: &[u32]) -> Result<Vec<u32>, String> {
    let fs = pp["fs"]
        .as_array()
        .ok_or_else(|| format!("program point {i} has no fs"))?;
    let mut ids = Vec::with_capacity(fs.len().min(1024));
    for f in fs {
        let id = f
            .as_u64()
            .and_then(|f| usize::try_from(f).ok())
            .filter(|&f| f > 0)
            .and_then(|f| frame_ids.get(f))
            .ok_or_else(|| format!("program point {i} names frame {f}, which ftbl lacks"))?;
        ids.push(*id);
    }
    Ok(ids)
}

/// A frame of the frames table.
fn frame(text: &str) -> Frame {
    // `0x4848899: malloc (in /usr/libexec/valgrind/vgpreload_dhat-amd64-linux.so)`
    let rest = match text.split_once(": ") {
        Some((addr, rest)) if addr.starts_with("0x") => rest,
        _ => text,
    };
    let (function, place) = match rest.rfind(" (") {
        Some(i) if rest.ends_with(')') => (
            rest.get(..i).unwrap_or(rest),
            rest.get(i + 2..rest.len() - 1).unwrap_or(""),
        ),
        _ => (rest, ""),
    };
    let mut f = Frame {
        function: function.to_owned(),
        file: "??".to_owned(),
        line: 0,
        module: String::new(),
    };
    if let Some(module) = place.strip_prefix("in ") {
        f.module = module.to_owned();
    } else if !place.is_empty() {
        // `file:line` or `file:line:column`.
        let mut parts = place.rsplitn(3, ':');
        let last = parts.next().unwrap_or("");
        let mid = parts.next();
        let first = parts.next();
        match (first, mid) {
            (Some(file), Some(line))
                if line.parse::<i64>().is_ok() && last.parse::<i64>().is_ok() =>
            {
                f.file = file.to_owned();
                f.line = line.parse().unwrap_or(0);
            }
            _ => match place.rsplit_once(':') {
                Some((file, line)) if line.parse::<i64>().is_ok() => {
                    f.file = file.to_owned();
                    f.line = line.parse().unwrap_or(0);
                }
                _ => f.file = place.to_owned(),
            },
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_as_valgrind_and_dhat_rs_write_them() {
        let f = frame("0x105FBE2: heap.rawCAlloc (heap.zig:188)");
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("heap.rawCAlloc", "heap.zig", 188)
        );
        let f = frame("0x4848899: malloc (in /usr/libexec/valgrind/vgpreload_dhat-amd64-linux.so)");
        assert_eq!(f.function, "malloc");
        assert_eq!(
            f.module,
            "/usr/libexec/valgrind/vgpreload_dhat-amd64-linux.so"
        );
        let f = frame("alloc::vec::Vec<T>::push (src/vec/mod.rs:10:5)");
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("alloc::vec::Vec<T>::push", "src/vec/mod.rs", 10)
        );
        assert_eq!(frame("[root]").function, "[root]");
    }
}
