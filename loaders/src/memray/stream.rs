//! The bytes of a memray capture: the whole file is one LZ4 frame (or, written with
//! `--no-compress`, the raw stream), read here with the offset of every byte in the
//! decompressed stream, so that an error names where it is.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lz4_flex::frame::FrameDecoder;

use crate::error::LoadError;

/// The first bytes of an LZ4 frame.
pub(super) const LZ4_MAGIC: [u8; 4] = [0x04, 0x22, 0x4d, 0x18];

/// The longest string a record may hold (a file name, a function name, the command line):
/// longer is a damaged length, and reading stops there rather than growing without bound.
const MAX_STRING_BYTES: usize = 1 << 20;

/// What went wrong reading the stream.
#[derive(Debug)]
pub(super) enum StreamError {
    /// The stream ended inside a record.
    Eof { offset: u64 },
    /// A value that cannot be: `what` at `offset` of the decompressed stream.
    Bad { offset: u64, what: String },
    /// The LZ4 frame did not decode (or the file did not read) after `compressed_offset`
    /// file bytes.
    Io {
        offset: u64,
        compressed_offset: u64,
        error: io::Error,
    },
}

impl StreamError {
    /// The offset in the decompressed stream where reading stopped.
    pub(super) fn offset(&self) -> u64 {
        match self {
            Self::Eof { offset } | Self::Bad { offset, .. } | Self::Io { offset, .. } => *offset,
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Self::Eof { offset } => format!(
                "the capture ends inside a record at byte {offset} of the decompressed stream"
            ),
            Self::Bad { offset, what } => {
                format!("{what} at byte {offset} of the decompressed stream")
            }
            Self::Io {
                offset,
                compressed_offset,
                error,
            } => format!(
                "the LZ4 stream does not decode ({error}) near byte {compressed_offset} of the \
                 file (byte {offset} of the decompressed stream)"
            ),
        }
    }
}

/// Counts the file bytes the decoder has taken (for errors and the progress bar).
struct Counting {
    file: File,
    read_bytes: Arc<AtomicU64>,
    progress: Option<Arc<AtomicU64>>,
}

impl Read for Counting {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf)?;
        self.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(p) = &self.progress {
            p.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(n)
    }
}

/// The decompressed stream, byte by byte, with its offset.
pub(super) struct Stream {
    inner: Box<dyn Read>,
    read_bytes: Arc<AtomicU64>,
    /// Offset of the next byte in the decompressed stream.
    pub(super) offset: u64,
}

impl Stream {
    /// Opens `path`: an LZ4 frame when it starts with the LZ4 magic, else the raw stream.
    pub(super) fn open(path: &Path, progress: Option<Arc<AtomicU64>>) -> Result<Self, LoadError> {
        let mut file = File::open(path).map_err(|e| LoadError::io(path, e))?;
        let mut magic = [0u8; 4];
        let compressed = match file.read_exact(&mut magic) {
            Ok(()) => magic == LZ4_MAGIC,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => false,
            Err(e) => return Err(LoadError::io(path, e)),
        };
        // Reopen rather than seek so the counting starts at byte 0 either way.
        let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
        let read_bytes = Arc::new(AtomicU64::new(0));
        let counting = Counting {
            file,
            read_bytes: Arc::clone(&read_bytes),
            progress,
        };
        // The frame decoder's buffers are sized by the frame's block size, at most 4 MiB by
        // the LZ4 format: nothing here is sized by a length the file claims beyond that.
        let inner: Box<dyn Read> = if compressed {
            Box::new(BufReader::with_capacity(
                1 << 16,
                FrameDecoder::new(BufReader::new(counting)),
            ))
        } else {
            Box::new(BufReader::with_capacity(1 << 16, counting))
        };
        Ok(Self {
            inner,
            read_bytes,
            offset: 0,
        })
    }

    /// Bytes of the file read so far.
    pub(super) fn file_bytes_read(&self) -> u64 {
        self.read_bytes.load(Ordering::Relaxed)
    }

    pub(super) fn bad(&self, offset: u64, what: impl Into<String>) -> StreamError {
        StreamError::Bad {
            offset,
            what: what.into(),
        }
    }

    /// The next byte, or `None` at the end of the stream.
    pub(super) fn next_byte(&mut self) -> Result<Option<u8>, StreamError> {
        let mut b = [0u8; 1];
        loop {
            match self.inner.read(&mut b) {
                Ok(0) => return Ok(None),
                Ok(_) => {
                    self.offset += 1;
                    return Ok(Some(b[0]));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    return Err(StreamError::Io {
                        offset: self.offset,
                        compressed_offset: self.file_bytes_read(),
                        error,
                    });
                }
            }
        }
    }

    /// The next byte, which must be there.
    pub(super) fn u8(&mut self) -> Result<u8, StreamError> {
        self.next_byte()?.ok_or(StreamError::Eof {
            offset: self.offset,
        })
    }

    /// `N` bytes, which must be there.
    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], StreamError> {
        let mut out = [0u8; N];
        for b in &mut out {
            *b = self.u8()?;
        }
        Ok(out)
    }

    pub(super) fn u64_le(&mut self) -> Result<u64, StreamError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(super) fn i32_le(&mut self) -> Result<i32, StreamError> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    /// An unsigned LEB128 varint of at most 64 bits.
    pub(super) fn varint(&mut self) -> Result<u64, StreamError> {
        let start = self.offset;
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(self.bad(start, "a varint longer than 64 bits"));
            }
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
            shift += 7;
            if shift > 63 {
                return Err(self.bad(start, "a varint longer than 64 bits"));
            }
        }
    }

    /// A zig-zag signed varint.
    pub(super) fn signed_varint(&mut self) -> Result<i64, StreamError> {
        let z = self.varint()?;
        // Zig-zag: the low bit is the sign; the cast reinterprets the 63 bits left.
        Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    /// A NUL-terminated string (lossy UTF-8: names are shown, never parsed).
    pub(super) fn cstring(&mut self) -> Result<String, StreamError> {
        let start = self.offset;
        let mut bytes = Vec::new();
        loop {
            let b = self.u8()?;
            if b == 0 {
                return Ok(String::from_utf8_lossy(&bytes).into_owned());
            }
            if bytes.len() >= MAX_STRING_BYTES {
                return Err(self.bad(
                    start,
                    format!("a string longer than {MAX_STRING_BYTES} bytes (no NUL)"),
                ));
            }
            bytes.push(b);
        }
    }

    /// `len_bytes` bytes; the buffer grows with what is read, never by the claimed length.
    pub(super) fn blob(&mut self, len_bytes: u64) -> Result<Vec<u8>, StreamError> {
        let start = self.offset;
        if len_bytes > MAX_STRING_BYTES as u64 {
            return Err(self.bad(
                start,
                format!("a line table of {len_bytes} bytes (at most {MAX_STRING_BYTES})"),
            ));
        }
        let mut out = Vec::new();
        for _ in 0..len_bytes {
            out.push(self.u8()?);
        }
        Ok(out)
    }
}
