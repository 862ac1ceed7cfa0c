//! The file header and the frames of either kind (tag, length, payload), read and written.

use std::io::{self, Write};
use std::path::Path;

use super::codec::Cursor;
use super::{FileKind, KIND_SPOOL, KIND_TRACE, MAX_FRAME_BYTES, VERSION, is_binary};
use crate::error::LoadError;

pub(super) fn parse_meta(bytes: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The frames of a file held in memory.
pub(super) struct Frames<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) pos: usize,
}

pub(super) enum Next<'a> {
    Frame(u8, &'a [u8], usize),
    End,
    Cut(String),
}

impl<'a> Frames<'a> {
    pub(super) fn next(&mut self) -> Next<'a> {
        let rest = self.bytes.get(self.pos..).unwrap_or(&[]);
        let next = frame_at(rest, self.pos);
        if let Next::Frame(_, payload, _) = next {
            self.pos += 5 + payload.len();
        }
        next
    }
}

/// The frame at the start of `rest`, which is at offset `at` of the frames.
pub(super) fn frame_at(rest: &[u8], at: usize) -> Next<'_> {
    if rest.is_empty() {
        return Next::End;
    }
    let mut c = Cursor::new(rest);
    let (Some(tag), Some(len)) = (c.u8(), c.u32()) else {
        return Next::Cut(format!("a frame header is cut at byte {at}"));
    };
    let len = len as usize;
    if len > MAX_FRAME_BYTES {
        return Next::Cut(format!("a frame length of {len} bytes at byte {at}"));
    }
    let Some(payload) = c.take(len) else {
        return Next::Cut(format!("the frame at byte {at} is cut"));
    };
    Next::Frame(tag, payload, at)
}

/// Reads the file's header; returns the kind and the offset of the first frame.
pub(super) fn read_header(path: &Path, bytes: &[u8]) -> Result<FileKind, LoadError> {
    if !is_binary(bytes) {
        return Err(LoadError::format(
            path,
            "not an allocview binary file (bad magic)",
        ));
    }
    let describe =
        |b: Option<u8>| b.map_or_else(|| "none (the file ends)".to_owned(), |v| v.to_string());
    let version = bytes.get(8).copied();
    if version != Some(VERSION) {
        return Err(LoadError::format(
            path,
            format!(
                "byte 8: unsupported allocview binary version {} (this build reads {VERSION})",
                describe(version)
            ),
        ));
    }
    match bytes.get(9).copied() {
        Some(KIND_TRACE) => Ok(FileKind::Trace),
        Some(KIND_SPOOL) => Ok(FileKind::Spool),
        other => Err(LoadError::format(
            path,
            format!(
                "byte 9: unknown allocview file kind {} (expected {KIND_TRACE}, a trace, or \
                 {KIND_SPOOL}, a spool)",
                describe(other)
            ),
        )),
    }
}

pub(super) fn write_frame(out: &mut impl Write, tag: u8, parts: &[&[u8]]) -> io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(len).map_err(|_| io::Error::other("frame larger than 4 GiB"))?;
    out.write_all(&[tag])?;
    out.write_all(&len.to_le_bytes())?;
    for p in parts {
        out.write_all(p)?;
    }
    Ok(())
}
