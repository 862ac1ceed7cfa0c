//! Where the decoder's bytes come from: a byte slice, or a reader behind a buffer that grows
//! only with what was read; and the reads of opcode arguments, checked against what remains.

use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};

use super::opcodes::opcode_name;
use super::{PickleError, Result};

/// Where the decoder's bytes come from: a window of unconsumed bytes that can be refilled.
pub(super) trait Input {
    /// The unconsumed bytes available without reading.
    fn window(&self) -> &[u8];
    /// Drops `n` bytes (at most the window's length) from the front of the window.
    fn consume(&mut self, n: usize);
    /// Reads until the window holds at least `n` bytes or the input ends.
    fn fill(&mut self, n: usize) -> io::Result<()>;
    /// Byte offset of the window's start in the input.
    fn offset(&self) -> u64;
    /// Bytes from the window's start to the end of the input, as far as known (an upper bound).
    fn remaining(&self) -> u64;
}

pub(super) struct SliceInput<'a> {
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
}

impl Input for SliceInput<'_> {
    #[inline]
    fn window(&self) -> &[u8] {
        self.data.get(self.pos..).unwrap_or_default()
    }
    #[inline]
    fn consume(&mut self, n: usize) {
        self.pos = self.pos.saturating_add(n).min(self.data.len());
    }
    fn fill(&mut self, _n: usize) -> io::Result<()> {
        Ok(())
    }
    #[inline]
    fn offset(&self) -> u64 {
        self.pos as u64
    }
    fn remaining(&self) -> u64 {
        (self.data.len() - self.pos) as u64
    }
}

/// Read size of [`ReaderInput`]: large enough that reads cost nothing, small enough to not count.
pub(super) const READ_CHUNK_BYTES: usize = 1 << 20;

pub(super) struct ReaderInput<'p, R> {
    pub(super) reader: R,
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    /// Input offset of `buf[start]`.
    pub(super) offset: u64,
    /// Input size if known (a file's length), else `u64::MAX`.
    pub(super) total_bytes: u64,
    pub(super) eof: bool,
    pub(super) progress: Option<&'p AtomicU64>,
}

impl<'p, R: Read> ReaderInput<'p, R> {
    pub(super) fn new(reader: R, total_bytes: u64, progress: Option<&'p AtomicU64>) -> Self {
        Self {
            reader,
            buf: Vec::new(),
            start: 0,
            end: 0,
            offset: 0,
            total_bytes,
            eof: false,
            progress,
        }
    }
}

impl<R: Read> Input for ReaderInput<'_, R> {
    #[inline]
    fn window(&self) -> &[u8] {
        self.buf.get(self.start..self.end).unwrap_or_default()
    }
    #[inline]
    fn consume(&mut self, n: usize) {
        let n = n.min(self.end - self.start);
        self.start += n;
        self.offset += n as u64;
    }
    fn fill(&mut self, n: usize) -> io::Result<()> {
        while self.end - self.start < n && !self.eof {
            if self.end == self.buf.len() {
                if self.start > 0 {
                    self.buf.copy_within(self.start..self.end, 0);
                    self.end -= self.start;
                    self.start = 0;
                } else {
                    // Grow by doubling up to `n`: the buffer never outgrows what was read by
                    // more than twice, whatever a length field claims.
                    let grown = (self.buf.len() * 2)
                        .max(READ_CHUNK_BYTES)
                        .min(n.max(READ_CHUNK_BYTES));
                    self.buf.resize(grown, 0);
                }
            }
            let Some(space) = self.buf.get_mut(self.end..) else {
                break;
            };
            match self.reader.read(space) {
                Ok(0) => self.eof = true,
                Ok(k) => {
                    self.end += k;
                    if let Some(progress) = self.progress {
                        let read = self.offset + (self.end - self.start) as u64;
                        progress.store(read, Ordering::Relaxed);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
    #[inline]
    fn offset(&self) -> u64 {
        self.offset
    }
    fn remaining(&self) -> u64 {
        if self.eof {
            (self.end - self.start) as u64
        } else {
            self.total_bytes.saturating_sub(self.offset)
        }
    }
}

pub(super) fn truncated(op: u8, at: u64, input: &impl Input, needed: u64) -> PickleError {
    // Counted from the end of the opcode byte, so they include any length field already read.
    let done = input.offset() - (at + 1);
    PickleError::Truncated {
        opcode: opcode_name(op),
        offset: at,
        needed_bytes: done.saturating_add(needed),
        remaining_bytes: done.saturating_add(input.remaining()),
    }
}

pub(super) fn read_error(at: u64, source: io::Error) -> PickleError {
    PickleError::Read { offset: at, source }
}

/// The next `N` bytes, consumed.
#[inline]
pub(super) fn take<const N: usize>(input: &mut impl Input, op: u8, at: u64) -> Result<[u8; N]> {
    if let Some(a) = input.window().first_chunk::<N>() {
        let a = *a;
        input.consume(N);
        return Ok(a);
    }
    input.fill(N).map_err(|e| read_error(input.offset(), e))?;
    match input.window().first_chunk::<N>() {
        Some(a) => {
            let a = *a;
            input.consume(N);
            Ok(a)
        }
        None => Err(truncated(op, at, input, N as u64)),
    }
}

/// Makes the next `len` bytes available in the window (not consumed): the length is checked
/// against what the input can hold before anything is allocated for it.
#[inline]
pub(super) fn need(input: &mut impl Input, op: u8, at: u64, len: u64) -> Result<usize> {
    if len > input.remaining() {
        return Err(truncated(op, at, input, len));
    }
    let n = usize::try_from(len).map_err(|_| truncated(op, at, input, len))?;
    if input.window().len() < n {
        input.fill(n).map_err(|e| read_error(input.offset(), e))?;
        if input.window().len() < n {
            return Err(truncated(op, at, input, len));
        }
    }
    Ok(n)
}

/// Makes a newline-terminated argument available: returns its length without the newline.
pub(super) fn need_line(input: &mut impl Input, op: u8, at: u64) -> Result<usize> {
    let mut searched = 0;
    loop {
        let window = input.window();
        if let Some(i) = window
            .get(searched..)
            .and_then(|w| w.iter().position(|&b| b == b'\n'))
        {
            return Ok(searched + i);
        }
        searched = window.len();
        if input.remaining() <= searched as u64 {
            return Err(PickleError::UnterminatedLine {
                opcode: opcode_name(op),
                offset: at,
            });
        }
        let more = searched.saturating_add(searched.max(4096));
        input
            .fill(more)
            .map_err(|e| read_error(input.offset(), e))?;
        if input.window().len() <= searched {
            return Err(PickleError::UnterminatedLine {
                opcode: opcode_name(op),
                offset: at,
            });
        }
    }
}
