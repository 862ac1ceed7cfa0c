//! A pickle decoder for PyTorch memory snapshots: safe (it never imports or calls anything),
//! streaming, and lean enough to hold a gigabyte snapshot's object graph in less memory than
//! the file takes on disk.
//!
//! Entry points: [`decode_file`] (streams a file through a 1 MiB buffer), [`decode_reader`]
//! and [`decode`] (a byte slice, no copy). They return a [`Pickle`], the decoded object graph,
//! read through [`Val`] handles from [`Pickle::root`].
//!
//! # What is supported
//!
//! Protocols 2 to 5 (the first opcode must be `PROTO`): plain data only.
//! - Control: `PROTO`, `FRAME` (its length is ignored), `STOP`, `MARK`, `POP`, `POP_MARK`, `DUP`.
//! - Memo: `MEMOIZE`, `PUT`/`BINPUT`/`LONG_BINPUT`, `GET`/`BINGET`/`LONG_BINGET`.
//! - Scalars: `NONE`, `NEWTRUE`, `NEWFALSE`, `INT` (text, with its `00`/`01` bool forms), `BININT`,
//!   `BININT1`, `BININT2`, `LONG` (text), `LONG1`, `LONG4`, `BINFLOAT`, `FLOAT` (text).
//! - Strings: `SHORT_BINUNICODE`, `BINUNICODE`, `BINUNICODE8`, `UNICODE` (raw-unicode-escape);
//!   Python 2 strings `STRING`, `BINSTRING`, `SHORT_BINSTRING` become `str` when they are UTF-8,
//!   else bytes. Invalid UTF-8 (Python's lone surrogates) is replaced by U+FFFD.
//! - Bytes: `SHORT_BINBYTES`, `BINBYTES`, `BINBYTES8`, `BYTEARRAY8`.
//! - Containers: `EMPTY_DICT`, `DICT`, `SETITEM`, `SETITEMS`, `EMPTY_LIST`, `LIST`, `APPEND`,
//!   `APPENDS`, `EMPTY_TUPLE`, `TUPLE`, `TUPLE1`, `TUPLE2`, `TUPLE3`, `EMPTY_SET`, `ADDITEMS`,
//!   `FROZENSET` (sets keep their items in order, without removing duplicates).
//!
//! Everything that imports or calls (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`,
//! `NEWOBJ`, `NEWOBJ_EX`, `EXT1/2/4`, `PERSID`, `BINPERSID`) is refused with
//! [`PickleError::Unsupported`], out-of-band buffers (`NEXT_BUFFER`, `READONLY_BUFFER`) with
//! [`PickleError::OutOfBandBuffer`]. NUL bytes after `STOP` (memory_viz pads with them) are
//! accepted, anything else there is [`PickleError::TrailingData`]. Every error names the byte
//! offset of the opcode at fault; the decoder never panics, never recurses, and refuses a length
//! field that claims more bytes than the input holds before allocating anything for it.
//!
//! Integers: up to 61 bits inline; wider ones up to 128 bits exactly ([`Val::as_i64`],
//! [`Val::as_u64`] for addresses of 2^63 and above, [`Val::as_i128`]); wider still keep their
//! little-endian two's-complement bytes ([`Val::big_int_le_bytes`]). Text integers are limited to
//! 4300 digits, as in CPython.
//!
//! # Memory layout, and why
//!
//! Snapshots are millions of small dicts (`{"action": .., "addr": .., "frames": ..}`) that share
//! their keys, their action strings and their `frames` lists through the pickle memo. So:
//! - A value is one `u64` ([`Raw`]): a 3-bit tag and a payload. None, bools, integers of up to 61
//!   bits, string ids and container ids are inline; floats, wider integers and bytes are indices
//!   into side tables.
//! - Strings (and bytes) are interned: equal strings share one stored copy and one id, so a key
//!   repeated a million times costs nothing after the first and compares as one integer.
//! - A container is 12 bytes: a kind, a start and a length into one flat `Vec` of values shared by
//!   all containers. A list or dict filled by one `APPENDS`/`SETITEMS` batch (what Python writes
//!   for up to 1000 items) is one contiguous run there. A container appended to again later (the
//!   trace list, with its thousands of batches) moves to a `Vec` of its own.
//! - A dict's keys live in a *shape*: the interned sequence of its string keys. Trace entries all
//!   share a handful of shapes, so a dict costs 12 bytes plus 8 per value (keys are free).
//! - The memo holds values, so a memo reference to a container yields the same container id:
//!   shared `frames` lists stay shared ([`Val::container_id`] tells identity from equality),
//!   and mutating a container after memoizing it is visible through every reference.
//!
//! A protocol-4 snapshot spends about 11 bytes of file per dict item, so the graph takes about
//! 0.8 times the file's size and the peak is that plus the memo and a 1 MiB read buffer.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(test)]
mod tests;

/// Why a pickle could not be decoded. Each message names the byte offset of the opcode at fault.
#[derive(Debug, thiserror::Error)]
pub enum PickleError {
    #[error("cannot open {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read the pickle at byte offset {offset}: {source}")]
    Read {
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error(
        "not a pickle of protocol 2 to 5: expected PROTO (0x80) at byte offset 0, found {found}"
    )]
    NotPickle { found: String },
    #[error("protocol {version} at byte offset {offset} is not supported (2 to 5 are)")]
    Protocol { version: u8, offset: u64 },
    #[error("truncated pickle: input ends at byte offset {offset} before STOP")]
    MissingStop { offset: u64 },
    #[error(
        "truncated pickle: opcode {opcode} at byte offset {offset} needs {needed_bytes} bytes, \
         {remaining_bytes} remain"
    )]
    Truncated {
        opcode: &'static str,
        offset: u64,
        needed_bytes: u64,
        remaining_bytes: u64,
    },
    #[error("truncated pickle: opcode {opcode} at byte offset {offset} has no end-of-line")]
    UnterminatedLine { opcode: &'static str, offset: u64 },
    #[error(
        "unsupported opcode {code:#04x} ({opcode}) at byte offset {offset}: snapshots hold only \
         plain dicts, lists, tuples, strings and numbers"
    )]
    Unsupported {
        code: u8,
        opcode: &'static str,
        offset: u64,
    },
    #[error("out-of-band buffers are not supported: opcode {opcode} at byte offset {offset}")]
    OutOfBandBuffer { opcode: &'static str, offset: u64 },
    #[error("unknown opcode {code:#04x} at byte offset {offset}: not a pickle, or a damaged one")]
    UnknownOpcode { code: u8, offset: u64 },
    #[error("MARK missing for {opcode} at byte offset {offset}")]
    MarkMissing { opcode: &'static str, offset: u64 },
    #[error(
        "stack empty at byte offset {offset}: {opcode} needs {needed} value(s) above the last \
         MARK, {available} there"
    )]
    StackUnderflow {
        opcode: &'static str,
        offset: u64,
        needed: usize,
        available: usize,
    },
    #[error("{opcode} of unknown memo key {key} at byte offset {offset}")]
    MemoMissing {
        opcode: &'static str,
        key: u64,
        offset: u64,
    },
    #[error("{opcode} at byte offset {offset} expects {expected}, found {found}")]
    WrongType {
        opcode: &'static str,
        offset: u64,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{opcode} at byte offset {offset}: {problem}")]
    BadArgument {
        opcode: &'static str,
        offset: u64,
        problem: String,
    },
    #[error("trailing data after STOP at byte offset {offset}")]
    TrailingData { offset: u64 },
    #[error("{what} at byte offset {offset} exceed this decoder's limit of 2^32 - 1")]
    TooLarge { what: &'static str, offset: u64 },
}

type Result<T, E = PickleError> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------------------------
// Opcodes

const MARK: u8 = b'(';
const EMPTY_TUPLE: u8 = b')';
const STOP: u8 = b'.';
const POP: u8 = b'0';
const POP_MARK: u8 = b'1';
const DUP: u8 = b'2';
const BINBYTES: u8 = b'B';
const SHORT_BINBYTES: u8 = b'C';
const FLOAT: u8 = b'F';
const BINFLOAT: u8 = b'G';
const INT: u8 = b'I';
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const LONG: u8 = b'L';
const BININT2: u8 = b'M';
const NONE: u8 = b'N';
const STRING: u8 = b'S';
const BINSTRING: u8 = b'T';
const SHORT_BINSTRING: u8 = b'U';
const UNICODE: u8 = b'V';
const BINUNICODE: u8 = b'X';
const EMPTY_LIST: u8 = b']';
const APPEND: u8 = b'a';
const DICT: u8 = b'd';
const APPENDS: u8 = b'e';
const GET: u8 = b'g';
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';
const LIST: u8 = b'l';
const PUT: u8 = b'p';
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const SETITEM: u8 = b's';
const TUPLE: u8 = b't';
const SETITEMS: u8 = b'u';
const EMPTY_DICT: u8 = b'}';
const PROTO: u8 = 0x80;
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const LONG1: u8 = 0x8a;
const LONG4: u8 = 0x8b;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE8: u8 = 0x8d;
const BINBYTES8: u8 = 0x8e;
const EMPTY_SET: u8 = 0x8f;
const ADDITEMS: u8 = 0x90;
const FROZENSET: u8 = 0x91;
const MEMOIZE: u8 = 0x94;
const FRAME: u8 = 0x95;
const BYTEARRAY8: u8 = 0x96;
const NEXT_BUFFER: u8 = 0x97;
const READONLY_BUFFER: u8 = 0x98;

/// The name pickletools gives an opcode, or "unknown".
fn opcode_name(code: u8) -> &'static str {
    match code {
        b'(' => "MARK",
        b')' => "EMPTY_TUPLE",
        b'.' => "STOP",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        b'F' => "FLOAT",
        b'G' => "BINFLOAT",
        b'I' => "INT",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'L' => "LONG",
        b'M' => "BININT2",
        b'N' => "NONE",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'R' => "REDUCE",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'X' => "BINUNICODE",
        b']' => "EMPTY_LIST",
        b'a' => "APPEND",
        b'b' => "BUILD",
        b'c' => "GLOBAL",
        b'd' => "DICT",
        b'e' => "APPENDS",
        b'g' => "GET",
        b'h' => "BINGET",
        b'i' => "INST",
        b'j' => "LONG_BINGET",
        b'l' => "LIST",
        b'o' => "OBJ",
        b'p' => "PUT",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b's' => "SETITEM",
        b't' => "TUPLE",
        b'u' => "SETITEMS",
        b'}' => "EMPTY_DICT",
        0x80 => "PROTO",
        0x81 => "NEWOBJ",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        0x8a => "LONG1",
        0x8b => "LONG4",
        0x8c => "SHORT_BINUNICODE",
        0x8d => "BINUNICODE8",
        0x8e => "BINBYTES8",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x92 => "NEWOBJ_EX",
        0x93 => "STACK_GLOBAL",
        0x94 => "MEMOIZE",
        0x95 => "FRAME",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "unknown",
    }
}

// ---------------------------------------------------------------------------------------------
// Input: a byte slice, or a reader behind a growable buffer

/// Where the decoder's bytes come from: a window of unconsumed bytes that can be refilled.
trait Input {
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

struct SliceInput<'a> {
    data: &'a [u8],
    pos: usize,
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
const READ_CHUNK_BYTES: usize = 1 << 20;

struct ReaderInput<'p, R> {
    reader: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Input offset of `buf[start]`.
    offset: u64,
    /// Input size if known (a file's length), else `u64::MAX`.
    total_bytes: u64,
    eof: bool,
    progress: Option<&'p AtomicU64>,
}

impl<'p, R: Read> ReaderInput<'p, R> {
    fn new(reader: R, total_bytes: u64, progress: Option<&'p AtomicU64>) -> Self {
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

// ---------------------------------------------------------------------------------------------
// Values

const TAG_BITS: u32 = 3;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
const TAG_INT: u64 = 0;
const TAG_STR: u64 = 1;
const TAG_CONTAINER: u64 = 2;
const TAG_CONST: u64 = 3;
const TAG_FLOAT: u64 = 4;
const TAG_WIDE: u64 = 5;
const TAG_BYTES: u64 = 6;
const TAG_BIG: u64 = 7;

/// One decoded value in 8 bytes: a 3-bit tag and a payload (an inline integer of up to 61
/// bits, a constant, or an id into one of [`Pickle`]'s tables).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Raw(u64);

impl Raw {
    const NONE: Raw = Raw(TAG_CONST);
    const FALSE: Raw = Raw((1 << TAG_BITS) | TAG_CONST);
    const TRUE: Raw = Raw((2 << TAG_BITS) | TAG_CONST);
    /// An empty memo slot; never a value.
    const HOLE: Raw = Raw((0xff << TAG_BITS) | TAG_CONST);

    #[inline]
    fn tag(self) -> u64 {
        self.0 & TAG_MASK
    }
    #[inline]
    fn id(self) -> u32 {
        // Ids are created from u32s.
        (self.0 >> TAG_BITS) as u32
    }
    #[inline]
    fn with_id(tag: u64, id: u32) -> Raw {
        Raw((u64::from(id) << TAG_BITS) | tag)
    }
    /// The inline form of `v`, when it fits in 61 bits.
    #[inline]
    fn small_int(v: i64) -> Option<Raw> {
        let shifted = v.wrapping_shl(TAG_BITS);
        (shifted >> TAG_BITS == v).then_some(Raw(shifted as u64 | TAG_INT))
    }
    #[inline]
    fn inline_int(self) -> i64 {
        (self.0 as i64) >> TAG_BITS
    }
    /// The 4-byte form: ids below 2^29, integers in -2^28..2^28.
    #[inline]
    fn narrow(self) -> Option<u32> {
        let n = self.0 as u32;
        (Raw::widen(n) == self).then_some(n)
    }
    #[inline]
    fn widen(n: u32) -> Raw {
        if u64::from(n) & TAG_MASK == TAG_INT {
            Raw(i64::from(n as i32) as u64)
        } else {
            Raw(u64::from(n))
        }
    }
}

/// What a value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    None,
    Bool,
    Int,
    Float,
    Str,
    Bytes,
    List,
    Tuple,
    Dict,
    Set,
    FrozenSet,
}

impl Kind {
    /// Python's name for the kind, for messages ("dict", "int", "None", ...).
    pub fn name(self) -> &'static str {
        match self {
            Kind::None => "None",
            Kind::Bool => "bool",
            Kind::Int => "int",
            Kind::Float => "float",
            Kind::Str => "str",
            Kind::Bytes => "bytes",
            Kind::List => "list",
            Kind::Tuple => "tuple",
            Kind::Dict => "dict",
            Kind::Set => "set",
            Kind::FrozenSet => "frozenset",
        }
    }

    fn container_code(self) -> u32 {
        match self {
            Kind::Tuple => 1,
            Kind::Dict => 2,
            Kind::Set => 3,
            Kind::FrozenSet => 4,
            _ => 0,
        }
    }

    fn from_container_code(code: u32) -> Kind {
        match code {
            1 => Kind::Tuple,
            2 => Kind::Dict,
            3 => Kind::Set,
            4 => Kind::FrozenSet,
            _ => Kind::List,
        }
    }
}

/// A container: 12 bytes. `meta` holds the kind (bits 0-2), whether the items moved to a
/// `Vec` of their own (bit 3, then `start` indexes `Pickle::spilled`), whether its run is in
/// `Pickle::narrow` rather than `Pickle::items` (bit 4) and, for a dict whose values are a run,
/// its shape (bits 5-31).
#[derive(Clone, Copy)]
struct Container {
    start: u32,
    len: u32,
    meta: u32,
}

const META_KIND_MASK: u32 = 0b111;
const META_SPILLED: u32 = 1 << 3;
const META_NARROW: u32 = 1 << 4;
const META_SHAPE_SHIFT: u32 = 5;
const MAX_SHAPE: u32 = (1 << (32 - META_SHAPE_SHIFT)) - 1;
/// Dicts with more keys than this never get a shape: a shape pays off when many dicts share it.
const MAX_SHAPE_KEYS: usize = 64;

impl Container {
    fn kind(self) -> Kind {
        Kind::from_container_code(self.meta & META_KIND_MASK)
    }
    fn spilled(self) -> bool {
        self.meta & META_SPILLED != 0
    }
    fn narrow(self) -> bool {
        self.meta & META_NARROW != 0
    }
    fn shape(self) -> u32 {
        self.meta >> META_SHAPE_SHIFT
    }
}

/// A run of values, 8 or 4 bytes each.
#[derive(Clone, Copy)]
enum Items<'a> {
    Wide(&'a [Raw]),
    Narrow(&'a [u32]),
}

impl<'a> Items<'a> {
    #[inline]
    fn len(self) -> usize {
        match self {
            Items::Wide(v) => v.len(),
            Items::Narrow(v) => v.len(),
        }
    }
    #[inline]
    fn get(self, i: usize) -> Option<Raw> {
        match self {
            Items::Wide(v) => v.get(i).copied(),
            Items::Narrow(v) => v.get(i).map(|&n| Raw::widen(n)),
        }
    }
    fn skip(self, n: usize) -> Items<'a> {
        match self {
            Items::Wide(v) => Items::Wide(v.get(n..).unwrap_or_default()),
            Items::Narrow(v) => Items::Narrow(v.get(n..).unwrap_or_default()),
        }
    }
    fn iter(self) -> impl Iterator<Item = Raw> + 'a {
        let (wide, narrow) = match self {
            Items::Wide(v) => (v, &[][..]),
            Items::Narrow(v) => (&[][..], v),
        };
        wide.iter()
            .copied()
            .chain(narrow.iter().map(|&n| Raw::widen(n)))
    }
}

/// Storage for interned strings (`String`) or byte strings (`Vec<u8>`), back to back.
trait Arena: Default {
    type Item: ?Sized;
    fn bytes(item: &Self::Item) -> &[u8];
    fn push(&mut self, item: &Self::Item);
    fn slice(&self, start: usize, end: usize) -> Option<&Self::Item>;
    fn len_bytes(&self) -> usize;
    fn capacity_bytes(&self) -> usize;
}

impl Arena for String {
    type Item = str;
    fn bytes(item: &str) -> &[u8] {
        item.as_bytes()
    }
    fn push(&mut self, item: &str) {
        self.push_str(item);
    }
    fn slice(&self, start: usize, end: usize) -> Option<&str> {
        self.get(start..end)
    }
    fn len_bytes(&self) -> usize {
        self.len()
    }
    fn capacity_bytes(&self) -> usize {
        self.capacity()
    }
}

impl Arena for Vec<u8> {
    type Item = [u8];
    fn bytes(item: &[u8]) -> &[u8] {
        item
    }
    fn push(&mut self, item: &[u8]) {
        self.extend_from_slice(item);
    }
    fn slice(&self, start: usize, end: usize) -> Option<&[u8]> {
        self.get(start..end)
    }
    fn len_bytes(&self) -> usize {
        self.len()
    }
    fn capacity_bytes(&self) -> usize {
        self.capacity()
    }
}

/// Interned strings: all stored back to back, found by an open-addressing table.
#[derive(Default)]
struct Interner<A: Arena> {
    data: A,
    /// `starts[i]..starts[i + 1]` is string `i` (one more entry than strings).
    starts: Vec<u64>,
    /// `(hash >> 32) << 32 | (id + 1)`, 0 for an empty slot; the length is a power of two.
    slots: Vec<u64>,
}

fn hash_bytes(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let (words, tail) = bytes.as_chunks::<8>();
    let mut h = (bytes.len() as u64).wrapping_mul(K);
    for w in words {
        h = (h.rotate_left(23) ^ u64::from_le_bytes(*w)).wrapping_mul(K);
    }
    let mut last = [0u8; 8];
    for (d, s) in last.iter_mut().zip(tail) {
        *d = *s;
    }
    h = (h.rotate_left(23) ^ u64::from_le_bytes(last)).wrapping_mul(K);
    // murmur3's finaliser: every input bit reaches the high bits used for the slot.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

impl<A: Arena> Interner<A> {
    fn len(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    fn get(&self, id: u32) -> Option<&A::Item> {
        let i = id as usize;
        let start = usize::try_from(*self.starts.get(i)?).ok()?;
        let end = usize::try_from(*self.starts.get(i + 1)?).ok()?;
        self.data.slice(start, end)
    }

    fn get_bytes(&self, id: u32) -> Option<&[u8]> {
        self.get(id).map(A::bytes)
    }

    fn slot_of(&self, hash: u64) -> usize {
        let bits = self.slots.len().trailing_zeros();
        if bits == 0 {
            0
        } else {
            (hash >> (64 - bits)) as usize
        }
    }

    /// The slot holding `item`, or the empty slot where it would go.
    fn probe(&self, bytes: &[u8], hash: u64) -> Option<(usize, Option<u32>)> {
        let mask = self.slots.len().checked_sub(1)?;
        let mut i = self.slot_of(hash);
        loop {
            let slot = *self.slots.get(i)?;
            if slot == 0 {
                return Some((i, None));
            }
            let id = (slot as u32).wrapping_sub(1);
            if slot >> 32 == hash >> 32 && self.get_bytes(id) == Some(bytes) {
                return Some((i, Some(id)));
            }
            i = (i + 1) & mask;
        }
    }

    /// The id of `item` if it was interned.
    fn find(&self, item: &A::Item) -> Option<u32> {
        let bytes = A::bytes(item);
        self.probe(bytes, hash_bytes(bytes))?.1
    }

    /// The id of `item`, storing it if it is new; `None` past 2^32 - 2 strings.
    fn intern(&mut self, item: &A::Item) -> Option<u32> {
        if self.starts.is_empty() {
            self.starts.push(0);
        }
        if (self.len() + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let bytes = A::bytes(item);
        let hash = hash_bytes(bytes);
        let (i, found) = self.probe(bytes, hash)?;
        if let Some(id) = found {
            return Some(id);
        }
        let id = u32::try_from(self.len())
            .ok()
            .filter(|&id| id < u32::MAX - 1)?;
        self.data.push(item);
        self.starts.push(self.data.len_bytes() as u64);
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = (hash >> 32 << 32) | u64::from(id + 1);
        }
        Some(id)
    }

    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(64);
        let old = std::mem::replace(&mut self.slots, vec![0; size]);
        let mask = size - 1;
        for slot in old.into_iter().filter(|&s| s != 0) {
            let id = (slot as u32).wrapping_sub(1);
            let hash = self.get_bytes(id).map(hash_bytes).unwrap_or_default();
            let mut i = self.slot_of(hash);
            while let Some(s) = self.slots.get_mut(i) {
                if *s == 0 {
                    *s = slot;
                    break;
                }
                i = (i + 1) & mask;
            }
        }
    }

    fn heap_bytes(&self) -> usize {
        self.data.capacity_bytes() + self.starts.capacity() * 8 + self.slots.capacity() * 8
    }
}

/// Narrow runs of at least this many values are shared by all lists with the same content.
const MIN_SHARED_RUN: usize = 4;

/// Finds a narrow run by content, so that lists with equal items (frames lists of the same
/// call stack) store them once. Sharing is safe because a run's values never change: a list
/// grows in place only past the end of every run that shares its start.
#[derive(Default)]
struct RunIndex {
    /// `(hash >> 32) << 32 | (start + 1)`, 0 for an empty slot; the length is a power of two.
    slots: Vec<u64>,
    len: usize,
}

fn hash_narrow(values: &[Raw]) -> u64 {
    let mut h = (values.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for r in values {
        h = (h.rotate_left(5) ^ u64::from(r.0 as u32)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

impl RunIndex {
    /// Where a run equal to `values` starts in `narrow`, or `None` after noting that one will
    /// start at `narrow.len()`.
    fn find_or_add(&mut self, narrow: &[u32], values: &[Raw]) -> Option<u32> {
        let new_start = u32::try_from(narrow.len()).ok().filter(|&s| s < u32::MAX)?;
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let hash = hash_narrow(values);
        let mask = self.slots.len() - 1;
        let mut i = (hash >> (64 - self.slots.len().trailing_zeros())) as usize;
        loop {
            let slot = *self.slots.get(i)?;
            if slot == 0 {
                break;
            }
            if slot >> 32 == hash >> 32 {
                let start = (slot as u32).wrapping_sub(1);
                let run = narrow.get(start as usize..start as usize + values.len());
                if run.is_some_and(|run| run.iter().zip(values).all(|(&n, r)| n == r.0 as u32)) {
                    return Some(start);
                }
            }
            i = (i + 1) & mask;
        }
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = (hash >> 32 << 32) | u64::from(new_start + 1);
            self.len += 1;
        }
        None
    }

    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(1024);
        let old = std::mem::replace(&mut self.slots, vec![0; size]);
        let mask = size - 1;
        let bits = size.trailing_zeros();
        for slot in old.into_iter().filter(|&s| s != 0) {
            let mut i = ((slot >> 32) >> (32 - bits)) as usize;
            while let Some(s) = self.slots.get_mut(i) {
                if *s == 0 {
                    *s = slot;
                    break;
                }
                i = (i + 1) & mask;
            }
        }
    }
}

/// FxHash: the key-shape table hashes a few `u64`s per dict, where SipHash would be slow.
#[derive(Default)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = (self.0.rotate_left(5) ^ hash_bytes(bytes)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type FxBuild = BuildHasherDefault<FxHasher>;

/// The decoded object graph of one pickle. See the module documentation for its layout.
pub struct Pickle {
    root: Raw,
    protocol: u8,
    bytes_read: u64,
    containers: Vec<Container>,
    /// Runs of container items (for dicts with a shape, only the values).
    items: Vec<Raw>,
    /// Runs whose values all have a 4-byte form (frames lists: references to frame dicts).
    narrow: Vec<u32>,
    /// Items of containers that grew after their first run (dicts: key, value, key, value...).
    spilled: Vec<Vec<Raw>>,
    /// Shape `i`'s keys are `shape_keys[shape_starts[i]..shape_starts[i + 1]]`.
    shape_starts: Vec<u32>,
    shape_keys: Vec<Raw>,
    strings: Interner<String>,
    /// Bytes, and the little-endian bytes of integers wider than 128 bits.
    blobs: Interner<Vec<u8>>,
    floats: Vec<f64>,
    wide_ints: Vec<i128>,
}

impl fmt::Debug for Pickle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pickle")
            .field("protocol", &self.protocol)
            .field("bytes_read", &self.bytes_read)
            .field("containers", &self.containers.len())
            .field("items", &self.items.len())
            .field("narrow_items", &self.narrow.len())
            .field("spilled", &self.spilled.len())
            .field("shapes", &self.shapes())
            .field("strings", &self.strings.len())
            .field("heap_bytes", &self.heap_bytes())
            .finish_non_exhaustive()
    }
}

impl Pickle {
    /// The value the pickle's `STOP` returned.
    pub fn root(&self) -> Val<'_> {
        self.val(self.root)
    }

    /// The pickle protocol (2 to 5) from the `PROTO` opcode.
    pub fn protocol(&self) -> u8 {
        self.protocol
    }

    /// The number of distinct containers (lists, tuples, dicts, sets) in the graph.
    pub fn containers(&self) -> usize {
        self.containers.len()
    }

    /// The number of distinct strings.
    pub fn strings(&self) -> usize {
        self.strings.len()
    }

    /// The number of distinct dict key sets (shapes) shared by dicts.
    pub fn shapes(&self) -> usize {
        self.shape_starts.len().saturating_sub(1)
    }

    /// Bytes of input consumed, padding after `STOP` included.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// Heap bytes held by the graph (capacities of its tables).
    pub fn heap_bytes(&self) -> usize {
        self.containers.capacity() * size_of::<Container>()
            + self.items.capacity() * 8
            + self.narrow.capacity() * 4
            + self.spilled.capacity() * size_of::<Vec<Raw>>()
            + self.spilled.iter().map(|v| v.capacity() * 8).sum::<usize>()
            + self.shape_starts.capacity() * 4
            + self.shape_keys.capacity() * 8
            + self.strings.heap_bytes()
            + self.blobs.heap_bytes()
            + self.floats.capacity() * 8
            + self.wide_ints.capacity() * 16
    }

    /// A key for [`Val::get_key`]: the string's id, if any string in the pickle equals it.
    /// `None` means no dict in the pickle has this key.
    pub fn key(&self, key: &str) -> Option<Key> {
        self.strings.find(key).map(Key)
    }

    fn val(&self, raw: Raw) -> Val<'_> {
        Val { pickle: self, raw }
    }

    fn container(&self, raw: Raw) -> Option<Container> {
        if raw.tag() == TAG_CONTAINER {
            self.containers.get(raw.id() as usize).copied()
        } else {
            None
        }
    }

    /// A container's items (dicts: values only when `keys` is a shape, else interleaved).
    fn slots(&self, c: Container) -> (&[Raw], Items<'_>) {
        let start = c.start as usize;
        if c.spilled() {
            let items = self.spilled.get(start).map_or(&[][..], Vec::as_slice);
            return (&[], Items::Wide(items));
        }
        let range = start..start + c.len as usize;
        let items = if c.narrow() {
            Items::Narrow(self.narrow.get(range).unwrap_or_default())
        } else {
            Items::Wide(self.items.get(range).unwrap_or_default())
        };
        if c.kind() == Kind::Dict {
            (self.shape(c.shape()), items)
        } else {
            (&[], items)
        }
    }

    fn shape(&self, shape: u32) -> &[Raw] {
        let i = shape as usize;
        match (self.shape_starts.get(i), self.shape_starts.get(i + 1)) {
            (Some(&a), Some(&b)) => self
                .shape_keys
                .get(a as usize..b as usize)
                .unwrap_or_default(),
            _ => &[],
        }
    }
}

/// A string key resolved once by [`Pickle::key`], for fast repeated [`Val::get_key`] lookups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key(u32);

/// A handle to one value of a [`Pickle`]: 16 bytes, `Copy`.
#[derive(Clone, Copy)]
pub struct Val<'a> {
    pickle: &'a Pickle,
    raw: Raw,
}

impl<'a> Val<'a> {
    /// What the value is.
    pub fn kind(&self) -> Kind {
        match self.raw.tag() {
            TAG_INT | TAG_WIDE | TAG_BIG => Kind::Int,
            TAG_STR => Kind::Str,
            TAG_BYTES => Kind::Bytes,
            TAG_FLOAT => Kind::Float,
            TAG_CONTAINER => self
                .pickle
                .container(self.raw)
                .map_or(Kind::None, Container::kind),
            _ if self.raw == Raw::NONE => Kind::None,
            _ => Kind::Bool,
        }
    }

    /// Python's name for the value's type, for error messages: "dict", "list", "int", ...
    pub fn kind_name(&self) -> &'static str {
        self.kind().name()
    }

    pub fn is_none(&self) -> bool {
        self.raw == Raw::NONE
    }

    /// True and False (not the integers 0 and 1).
    pub fn as_bool(&self) -> Option<bool> {
        match self.raw {
            Raw::TRUE => Some(true),
            Raw::FALSE => Some(false),
            _ => None,
        }
    }

    /// An integer of up to 128 bits (not a bool).
    pub fn as_i128(&self) -> Option<i128> {
        match self.raw.tag() {
            TAG_INT => Some(i128::from(self.raw.inline_int())),
            TAG_WIDE => self.pickle.wide_ints.get(self.raw.id() as usize).copied(),
            _ => None,
        }
    }

    /// An integer that fits in `i64` (not a bool).
    pub fn as_i64(&self) -> Option<i64> {
        if self.raw.tag() == TAG_INT {
            return Some(self.raw.inline_int());
        }
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// An integer that fits in `u64` (addresses may be 2^63 or more).
    pub fn as_u64(&self) -> Option<u64> {
        if self.raw.tag() == TAG_INT {
            return u64::try_from(self.raw.inline_int()).ok();
        }
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// A float, or an integer converted to one (rounded when wider than 53 bits).
    pub fn as_f64(&self) -> Option<f64> {
        match self.raw.tag() {
            TAG_FLOAT => self.pickle.floats.get(self.raw.id() as usize).copied(),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// The little-endian two's-complement bytes of an integer wider than 128 bits.
    pub fn big_int_le_bytes(&self) -> Option<&'a [u8]> {
        if self.raw.tag() == TAG_BIG {
            self.pickle.blobs.get(self.raw.id())
        } else {
            None
        }
    }

    pub fn as_str(&self) -> Option<&'a str> {
        if self.raw.tag() == TAG_STR {
            self.pickle.strings.get(self.raw.id())
        } else {
            None
        }
    }

    /// The interned id of a string: equal strings have equal ids.
    pub fn str_id(&self) -> Option<u32> {
        (self.raw.tag() == TAG_STR).then(|| self.raw.id())
    }

    /// Bytes, bytearrays, and Python 2 strings that are not UTF-8.
    pub fn as_bytes(&self) -> Option<&'a [u8]> {
        if self.raw.tag() == TAG_BYTES {
            self.pickle.blobs.get(self.raw.id())
        } else {
            None
        }
    }

    /// The container's identity: two handles to the same list (through the memo) have the same
    /// id, two equal lists do not. `None` for scalars.
    pub fn container_id(&self) -> Option<u32> {
        (self.raw.tag() == TAG_CONTAINER).then(|| self.raw.id())
    }

    /// The number of items of a container (pairs for a dict).
    pub fn item_count(&self) -> Option<usize> {
        self.pickle.container(self.raw).map(|c| match c.kind() {
            Kind::Dict if c.spilled() => self.pickle.slots(c).1.len() / 2,
            _ if c.spilled() => self.pickle.slots(c).1.len(),
            _ => c.len as usize,
        })
    }

    /// A dict's value for a string key. A linear scan: dicts in snapshots have a handful of keys.
    /// For many lookups of the same key, [`Pickle::key`] and [`Val::get_key`] avoid comparing
    /// strings.
    pub fn get(&self, key: &str) -> Option<Val<'a>> {
        let strings = &self.pickle.strings;
        let key = key.as_bytes();
        self.dict_items()?
            .find(|(k, _)| k.raw.tag() == TAG_STR && strings.get_bytes(k.raw.id()) == Some(key))
            .map(|(_, v)| v)
    }

    /// A dict's value for a key from [`Pickle::key`].
    pub fn get_key(&self, key: Key) -> Option<Val<'a>> {
        let want = Raw::with_id(TAG_STR, key.0);
        let c = self.pickle.container(self.raw)?;
        if c.kind() != Kind::Dict {
            return None;
        }
        let (keys, items) = self.pickle.slots(c);
        let raw = match items {
            Items::Wide(items) if c.spilled() => items
                .chunks_exact(2)
                .find(|kv| kv.first() == Some(&want))
                .and_then(|kv| kv.get(1).copied()),
            _ => items.get(keys.iter().position(|&k| k == want)?),
        };
        raw.map(|r| self.pickle.val(r))
    }

    /// A dict's items in insertion order.
    pub fn dict_items(&self) -> Option<DictItems<'a>> {
        let c = self.pickle.container(self.raw)?;
        if c.kind() != Kind::Dict {
            return None;
        }
        let (keys, items) = self.pickle.slots(c);
        Some(if c.spilled() {
            DictItems {
                pickle: self.pickle,
                keys: items,
                values: items.skip(1),
                stride: 2,
                next: 0,
                len: items.len() / 2,
            }
        } else {
            DictItems {
                pickle: self.pickle,
                keys: Items::Wide(keys),
                values: items,
                stride: 1,
                next: 0,
                len: items.len().min(keys.len()),
            }
        })
    }

    /// The items of a list or a tuple (either may stand where the other is expected), or of a
    /// set or frozenset.
    pub fn seq(&self) -> Option<Seq<'a>> {
        let c = self.pickle.container(self.raw)?;
        if c.kind() == Kind::Dict {
            return None;
        }
        let items = self.pickle.slots(c).1;
        Some(Seq {
            pickle: self.pickle,
            items,
            front: 0,
            back: items.len(),
        })
    }

    fn fmt_depth(&self, f: &mut fmt::Formatter<'_>, depth: usize) -> fmt::Result {
        const MAX_ITEMS: usize = 64;
        match self.kind() {
            Kind::None => f.write_str("None"),
            Kind::Bool => f.write_str(if self.as_bool() == Some(true) {
                "True"
            } else {
                "False"
            }),
            Kind::Int => match (self.as_i128(), self.big_int_le_bytes()) {
                (Some(v), _) => write!(f, "{v}"),
                (None, Some(b)) => write!(f, "<int of {} bytes>", b.len()),
                (None, None) => f.write_str("<int>"),
            },
            Kind::Float => write!(f, "{:?}", self.as_f64().unwrap_or(f64::NAN)),
            Kind::Str => write!(f, "{:?}", self.as_str().unwrap_or_default()),
            Kind::Bytes => write!(
                f,
                "b'{}'",
                self.as_bytes().unwrap_or_default().escape_ascii()
            ),
            kind => {
                let (open, close) = match kind {
                    Kind::Dict | Kind::Set | Kind::FrozenSet => ("{", "}"),
                    Kind::Tuple => ("(", ")"),
                    _ => ("[", "]"),
                };
                if depth == 0 {
                    return write!(f, "{open}...{close}");
                }
                f.write_str(open)?;
                let len = self.item_count().unwrap_or_default();
                if let Some(items) = self.dict_items() {
                    for (i, (k, v)) in items.take(MAX_ITEMS).enumerate() {
                        if i > 0 {
                            f.write_str(", ")?;
                        }
                        k.fmt_depth(f, depth - 1)?;
                        f.write_str(": ")?;
                        v.fmt_depth(f, depth - 1)?;
                    }
                } else if let Some(items) = self.seq() {
                    for (i, v) in items.take(MAX_ITEMS).enumerate() {
                        if i > 0 {
                            f.write_str(", ")?;
                        }
                        v.fmt_depth(f, depth - 1)?;
                    }
                    if kind == Kind::Tuple && len == 1 {
                        f.write_str(",")?;
                    }
                }
                if len > MAX_ITEMS {
                    write!(f, ", ... {} more", len - MAX_ITEMS)?;
                }
                f.write_str(close)
            }
        }
    }
}

/// Python-like text of the value, at most 8 containers deep and 64 items per container.
impl fmt::Debug for Val<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_depth(f, 8)
    }
}

/// The items of a list, tuple or set: see [`Val::seq`].
#[derive(Clone)]
pub struct Seq<'a> {
    pickle: &'a Pickle,
    items: Items<'a>,
    front: usize,
    back: usize,
}

impl<'a> Iterator for Seq<'a> {
    type Item = Val<'a>;
    #[inline]
    fn next(&mut self) -> Option<Val<'a>> {
        if self.front >= self.back {
            return None;
        }
        let raw = self.items.get(self.front)?;
        self.front += 1;
        Some(self.pickle.val(raw))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.back - self.front;
        (left, Some(left))
    }
    fn nth(&mut self, n: usize) -> Option<Val<'a>> {
        self.front = self.front.saturating_add(n).min(self.back);
        self.next()
    }
}

impl ExactSizeIterator for Seq<'_> {}

impl DoubleEndedIterator for Seq<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front >= self.back {
            return None;
        }
        self.back -= 1;
        self.items.get(self.back).map(|raw| self.pickle.val(raw))
    }
}

/// The items of a dict, in insertion order: see [`Val::dict_items`].
#[derive(Clone)]
pub struct DictItems<'a> {
    pickle: &'a Pickle,
    keys: Items<'a>,
    values: Items<'a>,
    stride: usize,
    next: usize,
    len: usize,
}

impl<'a> Iterator for DictItems<'a> {
    type Item = (Val<'a>, Val<'a>);
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.len {
            return None;
        }
        let i = self.next * self.stride;
        self.next += 1;
        let k = self.keys.get(i)?;
        let v = self.values.get(i)?;
        Some((self.pickle.val(k), self.pickle.val(v)))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.len - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for DictItems<'_> {}

// ---------------------------------------------------------------------------------------------
// Decoding

/// Decodes a pickle file, streaming it through a 1 MiB buffer. `progress`, if given, is set to
/// the number of bytes read so far as decoding goes.
///
/// # Errors
/// When the file cannot be read or is not a supported pickle (see [`PickleError`]).
pub fn decode_file(path: &Path, progress: Option<&AtomicU64>) -> Result<Pickle> {
    let open_error = |source| PickleError::Open {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(open_error)?;
    let meta = file.metadata().map_err(open_error)?;
    let total_bytes = if meta.is_file() { meta.len() } else { u64::MAX };
    run(&mut ReaderInput::new(file, total_bytes, progress))
}

/// Decodes a pickle from a reader (e.g. a decompressor), as [`decode_file`] does.
/// `size_bytes` is the input's size if known: lengths claiming more are refused at once.
///
/// # Errors
/// When reading fails or the input is not a supported pickle (see [`PickleError`]).
pub fn decode_reader(
    reader: impl Read,
    size_bytes: Option<u64>,
    progress: Option<&AtomicU64>,
) -> Result<Pickle> {
    run(&mut ReaderInput::new(
        reader,
        size_bytes.unwrap_or(u64::MAX),
        progress,
    ))
}

/// Decodes a pickle held in memory (the slice is not copied).
///
/// # Errors
/// When the bytes are not a supported pickle (see [`PickleError`]).
pub fn decode(bytes: &[u8]) -> Result<Pickle> {
    run(&mut SliceInput {
        data: bytes,
        pos: 0,
    })
}

/// The pickle machine's stack, marks and memo.
struct Machine {
    stack: Vec<Raw>,
    /// Stack lengths at each MARK.
    marks: Vec<usize>,
    memo: Memo,
}

/// The memo: dense up to about twice the number of entries, sparse beyond (so a large key in
/// a `PUT` cannot make it allocate).
#[derive(Default)]
struct Memo {
    dense: Vec<Raw>,
    sparse: HashMap<u64, Raw, FxBuild>,
    /// Distinct keys set: the key `MEMOIZE` uses next, as Python's `len(memo)`.
    count: u64,
}

impl Memo {
    fn put(&mut self, key: u64, value: Raw) {
        let dense_len = self.dense.len() as u64;
        if let Some(slot) = usize::try_from(key)
            .ok()
            .and_then(|k| self.dense.get_mut(k))
        {
            if *slot == Raw::HOLE {
                self.count += 1;
            }
            *slot = value;
            return;
        }
        if key == dense_len {
            self.dense.push(value);
            if self.sparse.is_empty() || self.sparse.remove(&key).is_none() {
                self.count += 1;
            }
            return;
        }
        if key < self.count.saturating_mul(2).saturating_add(1024) {
            let new_len = key + 1;
            for k in dense_len..new_len {
                let moved = self.sparse.remove(&k).unwrap_or(Raw::HOLE);
                self.dense.push(moved);
            }
            if let Some(slot) = self.dense.last_mut() {
                if *slot == Raw::HOLE {
                    self.count += 1;
                }
                *slot = value;
            }
            return;
        }
        if self.sparse.insert(key, value).is_none() {
            self.count += 1;
        }
    }

    #[inline]
    fn get(&self, key: u64) -> Option<Raw> {
        match usize::try_from(key).ok().and_then(|k| self.dense.get(k)) {
            Some(&v) if v != Raw::HOLE => Some(v),
            Some(_) => None,
            None => self.sparse.get(&key).copied(),
        }
    }
}

impl Machine {
    /// Stack length at the last MARK: values below it are out of reach until POP_MARK.
    #[inline]
    fn base(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    #[inline]
    fn pop(&mut self, op: u8, at: u64) -> Result<Raw> {
        if self.stack.len() > self.base()
            && let Some(v) = self.stack.pop()
        {
            return Ok(v);
        }
        Err(self.underflow(op, at, 1))
    }

    #[inline]
    fn top(&self, op: u8, at: u64) -> Result<Raw> {
        if self.stack.len() > self.base()
            && let Some(&v) = self.stack.last()
        {
            return Ok(v);
        }
        Err(self.underflow(op, at, 1))
    }

    fn underflow(&self, op: u8, at: u64, needed: usize) -> PickleError {
        PickleError::StackUnderflow {
            opcode: opcode_name(op),
            offset: at,
            needed,
            available: self.stack.len().saturating_sub(self.base()),
        }
    }

    /// Pops the last MARK: the values above it are `stack[mark..]`.
    #[inline]
    fn pop_mark(&mut self, op: u8, at: u64) -> Result<usize> {
        self.marks.pop().ok_or(PickleError::MarkMissing {
            opcode: opcode_name(op),
            offset: at,
        })
    }

    /// Pops the last MARK for an opcode that adds the values above it to the container just
    /// below it: returns the container and the mark's position.
    #[inline]
    fn pop_mark_target(&mut self, op: u8, at: u64) -> Result<(Raw, usize)> {
        let mark = self.pop_mark(op, at)?;
        if mark > self.base()
            && let Some(&target) = self.stack.get(mark - 1)
        {
            return Ok((target, mark));
        }
        Err(PickleError::StackUnderflow {
            opcode: opcode_name(op),
            offset: at,
            needed: 1,
            available: mark.saturating_sub(self.base()),
        })
    }
}

/// Builds the graph's tables.
struct Builder {
    p: Pickle,
    shape_index: HashMap<Box<[Raw]>, u32, FxBuild>,
    last_shape: u32,
    wide_index: HashMap<i128, u32, FxBuild>,
    runs: RunIndex,
    /// Dicts that moved to a `Vec` of their own: their keys may repeat until [`Builder::finish`].
    dirty_dicts: Vec<u32>,
    empty_tuple: Option<Raw>,
    scratch: Vec<Raw>,
}

/// An integer as decoded, before it is stored.
enum Int {
    Small(i128),
    /// Little-endian two's complement, wider than 128 bits.
    Big(Vec<u8>),
}

impl Builder {
    fn new(protocol: u8) -> Self {
        Self {
            p: Pickle {
                root: Raw::NONE,
                protocol,
                bytes_read: 0,
                containers: Vec::new(),
                items: Vec::new(),
                narrow: Vec::new(),
                spilled: Vec::new(),
                // Shape 0 is the empty dict's.
                shape_starts: vec![0, 0],
                shape_keys: Vec::new(),
                strings: Interner::default(),
                blobs: Interner::default(),
                floats: Vec::new(),
                wide_ints: Vec::new(),
            },
            shape_index: HashMap::default(),
            last_shape: 0,
            wide_index: HashMap::default(),
            runs: RunIndex::default(),
            dirty_dicts: Vec::new(),
            empty_tuple: None,
            scratch: Vec::new(),
        }
    }

    fn too_large(what: &'static str, at: u64) -> PickleError {
        PickleError::TooLarge { what, offset: at }
    }

    /// A string from UTF-8 bytes (invalid sequences become U+FFFD).
    fn str(&mut self, bytes: &[u8], at: u64) -> Result<Raw> {
        let id = match std::str::from_utf8(bytes) {
            Ok(s) => self.p.strings.intern(s),
            Err(_) => self.p.strings.intern(&String::from_utf8_lossy(bytes)),
        };
        id.map(|id| Raw::with_id(TAG_STR, id))
            .ok_or_else(|| Self::too_large("strings", at))
    }

    fn blob(&mut self, tag: u64, bytes: &[u8], at: u64) -> Result<Raw> {
        self.p
            .blobs
            .intern(bytes)
            .map(|id| Raw::with_id(tag, id))
            .ok_or_else(|| Self::too_large("byte strings", at))
    }

    /// A Python 2 string: `str` if it is UTF-8, else bytes.
    fn py2_str(&mut self, bytes: &[u8], at: u64) -> Result<Raw> {
        if std::str::from_utf8(bytes).is_ok() {
            self.str(bytes, at)
        } else {
            self.blob(TAG_BYTES, bytes, at)
        }
    }

    #[inline]
    fn int64(&mut self, v: i64, at: u64) -> Result<Raw> {
        match Raw::small_int(v) {
            Some(raw) => Ok(raw),
            None => self.wide(i128::from(v), at),
        }
    }

    fn wide(&mut self, v: i128, at: u64) -> Result<Raw> {
        if let Some(raw) = i64::try_from(v).ok().and_then(Raw::small_int) {
            return Ok(raw);
        }
        if let Some(&id) = self.wide_index.get(&v) {
            return Ok(Raw::with_id(TAG_WIDE, id));
        }
        let id = u32::try_from(self.p.wide_ints.len())
            .map_err(|_| Self::too_large("integers wider than 61 bits", at))?;
        self.p.wide_ints.push(v);
        self.wide_index.insert(v, id);
        Ok(Raw::with_id(TAG_WIDE, id))
    }

    fn int(&mut self, v: Int, at: u64) -> Result<Raw> {
        match v {
            Int::Small(v) => self.wide(v, at),
            Int::Big(bytes) => self.blob(TAG_BIG, &bytes, at),
        }
    }

    fn float(&mut self, v: f64, at: u64) -> Result<Raw> {
        let id = u32::try_from(self.p.floats.len()).map_err(|_| Self::too_large("floats", at))?;
        self.p.floats.push(v);
        Ok(Raw::with_id(TAG_FLOAT, id))
    }

    fn new_container(&mut self, kind: Kind, start: u32, len: u32, at: u64) -> Result<Raw> {
        let id = u32::try_from(self.p.containers.len())
            .ok()
            .filter(|&id| id < u32::MAX)
            .ok_or_else(|| Self::too_large("containers", at))?;
        self.p.containers.push(Container {
            start,
            len,
            meta: kind.container_code(),
        });
        Ok(Raw::with_id(TAG_CONTAINER, id))
    }

    /// Appends `values` as a new run (narrow when every value has a 4-byte form): returns
    /// where it starts, and the meta bit saying which table it is in. With `share`, a narrow
    /// run equal to an earlier one is not stored again.
    fn push_run(&mut self, values: &[Raw], share: bool, at: u64) -> Result<(u32, u32)> {
        let (start, narrow) = if values.iter().all(|r| r.narrow().is_some()) {
            if share
                && values.len() >= MIN_SHARED_RUN
                && let Some(start) = self.runs.find_or_add(&self.p.narrow, values)
            {
                return Ok((start, META_NARROW));
            }
            let start = self.p.narrow.len();
            self.p.narrow.extend(values.iter().map(|r| r.0 as u32));
            (start, META_NARROW)
        } else {
            let start = self.p.items.len();
            self.p.items.extend_from_slice(values);
            (start, 0)
        };
        // Ends must fit in u32 too.
        let fits = u32::try_from(values.len())
            .ok()
            .zip(u32::try_from(start).ok())
            .and_then(|(len, start)| start.checked_add(len).map(|_| start));
        fits.map(|start| (start, narrow))
            .ok_or_else(|| Self::too_large("container items", at))
    }

    /// A new tuple, list or set with these items.
    fn sequence(&mut self, kind: Kind, values: &[Raw], at: u64) -> Result<Raw> {
        if kind == Kind::Tuple && values.is_empty() {
            return self.empty_tuple(at);
        }
        let (start, narrow) = self.push_run(values, true, at)?;
        let raw = self.new_container(kind, start, values.len() as u32, at)?;
        if let Some(c) = self.p.containers.get_mut(raw.id() as usize) {
            c.meta |= narrow;
        }
        Ok(raw)
    }

    fn empty_tuple(&mut self, at: u64) -> Result<Raw> {
        if let Some(raw) = self.empty_tuple {
            return Ok(raw);
        }
        let raw = self.new_container(Kind::Tuple, 0, 0, at)?;
        self.empty_tuple = Some(raw);
        Ok(raw)
    }

    fn kind_of(&self, raw: Raw) -> &'static str {
        self.p.val(raw).kind_name()
    }

    /// Appends `values` to the list or set `target`.
    fn extend(&mut self, op: u8, target: Raw, values: &[Raw], at: u64) -> Result<()> {
        let expected = if op == ADDITEMS {
            Kind::Set
        } else {
            Kind::List
        };
        let Some(c) = self.p.container(target).filter(|c| c.kind() == expected) else {
            return Err(PickleError::WrongType {
                opcode: opcode_name(op),
                offset: at,
                expected: if op == ADDITEMS { "a set" } else { "a list" },
                found: self.kind_of(target),
            });
        };
        if values.is_empty() {
            return Ok(());
        }
        let id = target.id() as usize;
        if c.spilled() {
            if let Some(v) = self.p.spilled.get_mut(c.start as usize) {
                v.extend_from_slice(values);
            }
            return Ok(());
        }
        if c.len == 0 {
            let (start, narrow) = self.push_run(values, true, at)?;
            if let Some(c) = self.p.containers.get_mut(id) {
                c.start = start;
                c.len = values.len() as u32;
                c.meta = (c.meta & META_KIND_MASK) | narrow;
            }
            return Ok(());
        }
        // The run is still the last of its table, and the values fit it: extend it in place.
        let end = c.start as usize + c.len as usize;
        let in_place = if c.narrow() {
            end == self.p.narrow.len() && values.iter().all(|r| r.narrow().is_some())
        } else {
            end == self.p.items.len()
        };
        let len = u32::try_from(values.len())
            .ok()
            .and_then(|n| c.len.checked_add(n));
        if in_place && let Some(len) = len {
            if c.narrow() {
                self.p.narrow.extend(values.iter().map(|r| r.0 as u32));
            } else {
                self.p.items.extend_from_slice(values);
            }
            if let Some(c) = self.p.containers.get_mut(id) {
                c.len = len;
            }
            return Ok(());
        }
        let (_, items) = self.p.slots(c);
        let mut v = Vec::with_capacity(items.len() + values.len());
        v.extend(items.iter());
        v.extend_from_slice(values);
        self.spill(id, v, at)
    }

    /// Moves container `id`'s items to a `Vec` of their own.
    fn spill(&mut self, id: usize, items: Vec<Raw>, at: u64) -> Result<()> {
        let index =
            u32::try_from(self.p.spilled.len()).map_err(|_| Self::too_large("containers", at))?;
        self.p.spilled.push(items);
        if let Some(c) = self.p.containers.get_mut(id) {
            c.start = index;
            c.len = 0;
            c.meta = (c.meta & META_KIND_MASK) | META_SPILLED;
            if c.kind() == Kind::Dict {
                self.dirty_dicts.push(id as u32);
            }
        }
        Ok(())
    }

    /// Sets `pairs` (key, value, key, value...) in the dict `target`.
    fn set_items(&mut self, op: u8, target: Raw, pairs: &[Raw], at: u64) -> Result<()> {
        if !pairs.len().is_multiple_of(2) {
            return Err(PickleError::BadArgument {
                opcode: opcode_name(op),
                offset: at,
                problem: format!("odd number of values ({}) for key-value pairs", pairs.len()),
            });
        }
        let Some(c) = self.p.container(target).filter(|c| c.kind() == Kind::Dict) else {
            return Err(PickleError::WrongType {
                opcode: opcode_name(op),
                offset: at,
                expected: "a dict",
                found: self.kind_of(target),
            });
        };
        if pairs.is_empty() {
            return Ok(());
        }
        let id = target.id() as usize;
        if c.spilled() {
            if let Some(v) = self.p.spilled.get_mut(c.start as usize) {
                v.extend_from_slice(pairs);
            }
            return Ok(());
        }
        if c.len == 0
            && let Some(shape) = self.find_shape(pairs)
        {
            let mut values = std::mem::take(&mut self.scratch);
            values.clear();
            values.extend(pairs.iter().skip(1).step_by(2));
            let run = self.push_run(&values, false, at);
            self.scratch = values;
            let (start, narrow) = run?;
            if let Some(c) = self.p.containers.get_mut(id) {
                c.start = start;
                c.len = (pairs.len() / 2) as u32;
                c.meta = (c.meta & META_KIND_MASK) | narrow | (shape << META_SHAPE_SHIFT);
            }
            return Ok(());
        }
        let (keys, values) = self.p.slots(c);
        let mut v = Vec::with_capacity(values.len() * 2 + pairs.len());
        for (&k, value) in keys.iter().zip(values.iter()) {
            v.push(k);
            v.push(value);
        }
        v.extend_from_slice(pairs);
        self.spill(id, v, at)
    }

    /// The shape of the keys of `pairs`, when they are all distinct strings and few enough.
    #[inline]
    fn find_shape(&mut self, pairs: &[Raw]) -> Option<u32> {
        let n = pairs.len() / 2;
        if n > MAX_SHAPE_KEYS {
            return None;
        }
        let last = self.p.shape(self.last_shape);
        if last.len() == n
            && last
                .iter()
                .zip(pairs.iter().step_by(2))
                .all(|(a, b)| a == b)
        {
            return Some(self.last_shape);
        }
        self.scratch.clear();
        self.scratch.extend(pairs.iter().step_by(2).copied());
        if let Some(&shape) = self.shape_index.get(self.scratch.as_slice()) {
            self.last_shape = shape;
            return Some(shape);
        }
        let keys = &self.scratch;
        if keys.iter().any(|k| k.tag() != TAG_STR) {
            return None;
        }
        // Distinct keys only: a repeated key goes to the slow path, which keeps the last value.
        for (i, k) in keys.iter().enumerate() {
            if keys.get(i + 1..).unwrap_or_default().contains(k) {
                return None;
            }
        }
        let shape = u32::try_from(self.p.shapes())
            .ok()
            .filter(|&s| s <= MAX_SHAPE)?;
        let end = u32::try_from(self.p.shape_keys.len() + n).ok()?;
        self.p.shape_keys.extend_from_slice(keys);
        self.p.shape_starts.push(end);
        self.shape_index.insert(keys.as_slice().into(), shape);
        self.last_shape = shape;
        Some(shape)
    }

    /// A new dict from `pairs`.
    fn dict(&mut self, pairs: &[Raw], at: u64) -> Result<Raw> {
        let dict = self.new_container(Kind::Dict, 0, 0, at)?;
        self.set_items(DICT, dict, pairs, at)?;
        Ok(dict)
    }

    /// Removes repeated keys from dicts that grew more than once (the last value wins, at the
    /// first key's position, as in Python), and trims the tables.
    fn finish(mut self, root: Raw, bytes_read: u64) -> Pickle {
        let dirty = std::mem::take(&mut self.dirty_dicts);
        for id in dirty {
            let Some(c) = self.p.containers.get(id as usize).copied() else {
                continue;
            };
            let floats = &self.p.floats;
            let Some(pairs) = self.p.spilled.get_mut(c.start as usize) else {
                continue;
            };
            // Keys compare as Python would for what snapshots hold: strings, bytes and ints are
            // interned, floats compare by value bits, containers by identity.
            let norm = |k: Raw| -> u128 {
                if k.tag() == TAG_FLOAT {
                    let bits = floats.get(k.id() as usize).map_or(0, |f| f.to_bits());
                    (u128::from(TAG_FLOAT + 1) << 64) | u128::from(bits)
                } else {
                    u128::from(k.0)
                }
            };
            let mut first: HashMap<u128, usize, FxBuild> = HashMap::default();
            let mut out: Vec<Raw> = Vec::new();
            let mut repeated = false;
            for kv in pairs.chunks_exact(2) {
                if let [k, v] = *kv {
                    match first.get(&norm(k)) {
                        Some(&i) => {
                            repeated = true;
                            if let Some(slot) = out.get_mut(i + 1) {
                                *slot = v;
                            }
                        }
                        None => {
                            first.insert(norm(k), out.len());
                            out.push(k);
                            out.push(v);
                        }
                    }
                }
            }
            if repeated {
                *pairs = out;
            }
        }
        let mut p = self.p;
        p.root = root;
        p.bytes_read = bytes_read;
        p.containers.shrink_to_fit();
        p.items.shrink_to_fit();
        p.narrow.shrink_to_fit();
        p.spilled.shrink_to_fit();
        for v in &mut p.spilled {
            v.shrink_to_fit();
        }
        p
    }
}

fn truncated(op: u8, at: u64, input: &impl Input, needed: u64) -> PickleError {
    // Counted from the end of the opcode byte, so they include any length field already read.
    let done = input.offset() - (at + 1);
    PickleError::Truncated {
        opcode: opcode_name(op),
        offset: at,
        needed_bytes: done.saturating_add(needed),
        remaining_bytes: done.saturating_add(input.remaining()),
    }
}

fn read_error(at: u64, source: io::Error) -> PickleError {
    PickleError::Read { offset: at, source }
}

/// The next `N` bytes, consumed.
#[inline]
fn take<const N: usize>(input: &mut impl Input, op: u8, at: u64) -> Result<[u8; N]> {
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
fn need(input: &mut impl Input, op: u8, at: u64, len: u64) -> Result<usize> {
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
fn need_line(input: &mut impl Input, op: u8, at: u64) -> Result<usize> {
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

fn bad(op: u8, at: u64, problem: impl Into<String>) -> PickleError {
    PickleError::BadArgument {
        opcode: opcode_name(op),
        offset: at,
        problem: problem.into(),
    }
}

/// Decodes little-endian two's complement (LONG1, LONG4).
fn int_from_le(bytes: &[u8]) -> Int {
    let mut len = bytes.len();
    // Drop redundant sign bytes.
    while len > 16 {
        match (bytes.get(len - 1), bytes.get(len - 2)) {
            (Some(0x00), Some(b)) if b & 0x80 == 0 => len -= 1,
            (Some(0xff), Some(b)) if b & 0x80 != 0 => len -= 1,
            _ => break,
        }
    }
    let bytes = bytes.get(..len).unwrap_or_default();
    if len > 16 {
        return Int::Big(bytes.to_vec());
    }
    let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
    let mut full = if negative { [0xff; 16] } else { [0; 16] };
    for (d, s) in full.iter_mut().zip(bytes) {
        *d = *s;
    }
    Int::Small(i128::from_le_bytes(full))
}

/// CPython's limit on the digits of an integer read from text.
const MAX_INT_DIGITS: usize = 4300;

/// Parses a decimal integer as Python's `int()` would for pickle text (`-12`, `+7`, ` 3 `).
fn int_from_text(text: &[u8]) -> Option<Int> {
    let text = text.trim_ascii();
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > MAX_INT_DIGITS || !digits.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    // Magnitude in base-2^32 limbs, least significant first.
    let mut limbs: Vec<u32> = vec![0];
    for &d in digits {
        let mut carry = u64::from(d - b'0');
        for limb in &mut limbs {
            let x = u64::from(*limb) * 10 + carry;
            *limb = x as u32;
            carry = x >> 32;
        }
        if carry > 0 {
            limbs.push(carry as u32);
        }
    }
    // Two's complement bytes, with room for the sign bit.
    let mut bytes: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    bytes.push(0);
    if negative {
        let mut carry = true;
        for b in &mut bytes {
            let (x, c) = (!*b).overflowing_add(u8::from(carry));
            *b = x;
            carry = c;
        }
    }
    Some(int_from_le(&bytes))
}

/// Decodes `raw-unicode-escape` (the UNICODE opcode): bytes are Latin-1 code points, except
/// `\uXXXX` and `\UXXXXXXXX` after an odd number of backslashes.
fn raw_unicode_escape(bytes: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b != b'\\' {
            out.push(char::from(b));
            i += 1;
            continue;
        }
        let run = bytes.get(i..)?.iter().take_while(|&&c| c == b'\\').count();
        let next = bytes.get(i + run).copied();
        let digits = match next {
            Some(b'u') => 4,
            Some(b'U') => 8,
            _ => 0,
        };
        if run % 2 == 0 || digits == 0 {
            out.extend(std::iter::repeat_n('\\', run));
            i += run;
            continue;
        }
        out.extend(std::iter::repeat_n('\\', run - 1));
        let hex = bytes.get(i + run + 1..i + run + 1 + digits)?;
        let code = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
        out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
        i += run + 1 + digits;
    }
    Some(out)
}

/// Decodes a STRING argument: a quoted Python 2 literal with backslash escapes.
fn string_literal(text: &[u8]) -> Option<Vec<u8>> {
    let (&q, rest) = text.split_first()?;
    let (&q2, body) = rest.split_last()?;
    if q != q2 || (q != b'\'' && q != b'"') {
        return None;
    }
    let mut out = Vec::with_capacity(body.len());
    let mut iter = body.iter().copied().peekable();
    while let Some(b) = iter.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let e = iter.next()?;
        match e {
            b'\n' => {}
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'x' => {
                let hi = char::from(iter.next()?).to_digit(16)?;
                let lo = char::from(iter.next()?).to_digit(16)?;
                out.push((hi * 16 + lo) as u8);
            }
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match iter.peek() {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            iter.next();
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            other => {
                if !matches!(other, b'\\' | b'\'' | b'"') {
                    out.push(b'\\');
                }
                out.push(other);
            }
        }
    }
    Some(out)
}

/// The pickle machine: one pass over the opcodes, no recursion.
fn run(input: &mut impl Input) -> Result<Pickle> {
    input.fill(2).map_err(|e| read_error(0, e))?;
    let protocol = match *input.window() {
        [PROTO, version, ..] => version,
        [PROTO] => {
            return Err(PickleError::Truncated {
                opcode: "PROTO",
                offset: 0,
                needed_bytes: 1,
                remaining_bytes: 0,
            });
        }
        [other, ..] => {
            return Err(PickleError::NotPickle {
                found: format!("{other:#04x}"),
            });
        }
        [] => {
            return Err(PickleError::NotPickle {
                found: "an empty input".to_owned(),
            });
        }
    };
    if !(2..=5).contains(&protocol) {
        return Err(PickleError::Protocol {
            version: protocol,
            offset: 1,
        });
    }
    let mut b = Builder::new(protocol);
    let mut m = Machine {
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Memo::default(),
    };
    let root = loop {
        let at = input.offset();
        let op = match input.window().first() {
            Some(&op) => op,
            None => {
                input.fill(1).map_err(|e| read_error(at, e))?;
                match input.window().first() {
                    Some(&op) => op,
                    None => return Err(PickleError::MissingStop { offset: at }),
                }
            }
        };
        input.consume(1);
        match op {
            // Most frequent first.
            BINGET => {
                let [k] = take::<1>(input, op, at)?;
                let v = m.memo.get(u64::from(k)).ok_or(PickleError::MemoMissing {
                    opcode: "BINGET",
                    key: u64::from(k),
                    offset: at,
                })?;
                m.stack.push(v);
            }
            LONG_BINGET => {
                let k = u64::from(u32::from_le_bytes(take::<4>(input, op, at)?));
                let v = m.memo.get(k).ok_or(PickleError::MemoMissing {
                    opcode: "LONG_BINGET",
                    key: k,
                    offset: at,
                })?;
                m.stack.push(v);
            }
            MEMOIZE => {
                let v = m.top(op, at)?;
                m.memo.put(m.memo.count, v);
            }
            BININT1 => {
                let [v] = take::<1>(input, op, at)?;
                m.stack
                    .push(Raw::small_int(i64::from(v)).unwrap_or(Raw::NONE));
            }
            BININT2 => {
                let v = u16::from_le_bytes(take::<2>(input, op, at)?);
                m.stack
                    .push(Raw::small_int(i64::from(v)).unwrap_or(Raw::NONE));
            }
            BININT => {
                let v = i32::from_le_bytes(take::<4>(input, op, at)?);
                m.stack
                    .push(Raw::small_int(i64::from(v)).unwrap_or(Raw::NONE));
            }
            LONG1 => {
                let [n] = take::<1>(input, op, at)?;
                let n = need(input, op, at, u64::from(n))?;
                let window = input.window();
                let bytes = window.get(..n).unwrap_or_default();
                let v = if n <= 8 {
                    let mut full = if bytes.last().is_some_and(|b| b & 0x80 != 0) {
                        [0xff; 8]
                    } else {
                        [0; 8]
                    };
                    for (d, s) in full.iter_mut().zip(bytes) {
                        *d = *s;
                    }
                    b.int64(i64::from_le_bytes(full), at)?
                } else {
                    b.int(int_from_le(bytes), at)?
                };
                input.consume(n);
                m.stack.push(v);
            }
            LONG4 => {
                let len = i32::from_le_bytes(take::<4>(input, op, at)?);
                let len = u64::try_from(len)
                    .map_err(|_| bad(op, at, format!("negative length {len}")))?;
                let n = need(input, op, at, len)?;
                let v = b.int(int_from_le(input.window().get(..n).unwrap_or_default()), at)?;
                input.consume(n);
                m.stack.push(v);
            }
            SHORT_BINUNICODE | BINUNICODE | BINUNICODE8 => {
                let len = match op {
                    SHORT_BINUNICODE => u64::from(take::<1>(input, op, at)?[0]),
                    BINUNICODE => u64::from(u32::from_le_bytes(take::<4>(input, op, at)?)),
                    _ => u64::from_le_bytes(take::<8>(input, op, at)?),
                };
                let n = need(input, op, at, len)?;
                let v = b.str(input.window().get(..n).unwrap_or_default(), at)?;
                input.consume(n);
                m.stack.push(v);
            }
            EMPTY_DICT => {
                let v = b.new_container(Kind::Dict, 0, 0, at)?;
                m.stack.push(v);
            }
            EMPTY_LIST => {
                let v = b.new_container(Kind::List, 0, 0, at)?;
                m.stack.push(v);
            }
            MARK => m.marks.push(m.stack.len()),
            SETITEMS => {
                let (target, mark) = m.pop_mark_target(op, at)?;
                b.set_items(op, target, m.stack.get(mark..).unwrap_or_default(), at)?;
                m.stack.truncate(mark);
            }
            APPENDS | ADDITEMS => {
                let (target, mark) = m.pop_mark_target(op, at)?;
                b.extend(op, target, m.stack.get(mark..).unwrap_or_default(), at)?;
                m.stack.truncate(mark);
            }
            SETITEM => {
                let v = m.pop(op, at)?;
                let k = m.pop(op, at)?;
                let target = m.top(op, at)?;
                b.set_items(op, target, &[k, v], at)?;
            }
            APPEND => {
                let v = m.pop(op, at)?;
                let target = m.top(op, at)?;
                b.extend(op, target, &[v], at)?;
            }
            FRAME => {
                // Frames only group opcodes for buffering; this reader buffers on its own.
                take::<8>(input, op, at)?;
            }
            NONE => m.stack.push(Raw::NONE),
            NEWTRUE => m.stack.push(Raw::TRUE),
            NEWFALSE => m.stack.push(Raw::FALSE),
            BINFLOAT => {
                let v = f64::from_be_bytes(take::<8>(input, op, at)?);
                let v = b.float(v, at)?;
                m.stack.push(v);
            }
            TUPLE1 | TUPLE2 | TUPLE3 => {
                let n = usize::from(op - TUPLE1 + 1);
                let available = m.stack.len().saturating_sub(m.base());
                if available < n {
                    return Err(m.underflow(op, at, n));
                }
                let from = m.stack.len() - n;
                let v = b.sequence(Kind::Tuple, m.stack.get(from..).unwrap_or_default(), at)?;
                m.stack.truncate(from);
                m.stack.push(v);
            }
            EMPTY_TUPLE => {
                let v = b.empty_tuple(at)?;
                m.stack.push(v);
            }
            TUPLE | LIST | FROZENSET => {
                let mark = m.pop_mark(op, at)?;
                let kind = match op {
                    TUPLE => Kind::Tuple,
                    LIST => Kind::List,
                    _ => Kind::FrozenSet,
                };
                let v = b.sequence(kind, m.stack.get(mark..).unwrap_or_default(), at)?;
                m.stack.truncate(mark);
                m.stack.push(v);
            }
            DICT => {
                let mark = m.pop_mark(op, at)?;
                let v = b.dict(m.stack.get(mark..).unwrap_or_default(), at)?;
                m.stack.truncate(mark);
                m.stack.push(v);
            }
            EMPTY_SET => {
                let v = b.new_container(Kind::Set, 0, 0, at)?;
                m.stack.push(v);
            }
            BINPUT => {
                let [k] = take::<1>(input, op, at)?;
                let v = m.top(op, at)?;
                m.memo.put(u64::from(k), v);
            }
            LONG_BINPUT => {
                let k = u32::from_le_bytes(take::<4>(input, op, at)?);
                let v = m.top(op, at)?;
                m.memo.put(u64::from(k), v);
            }
            PUT | GET => {
                let n = need_line(input, op, at)?;
                let line = input.window().get(..n).unwrap_or_default();
                let key = std::str::from_utf8(line.trim_ascii())
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| {
                        bad(
                            op,
                            at,
                            format!("invalid memo key {:?}", line.escape_ascii().to_string()),
                        )
                    })?;
                input.consume(n + 1);
                if op == PUT {
                    let v = m.top(op, at)?;
                    m.memo.put(key, v);
                } else {
                    let v = m.memo.get(key).ok_or(PickleError::MemoMissing {
                        opcode: "GET",
                        key,
                        offset: at,
                    })?;
                    m.stack.push(v);
                }
            }
            POP => {
                if m.stack.len() > m.base() {
                    m.stack.pop();
                } else if m.marks.pop().is_none() {
                    // As in Python, POP with nothing above the last MARK discards the MARK.
                    return Err(m.underflow(op, at, 1));
                }
            }
            POP_MARK => {
                let mark = m.pop_mark(op, at)?;
                m.stack.truncate(mark);
            }
            DUP => {
                let v = m.top(op, at)?;
                m.stack.push(v);
            }
            INT | LONG | FLOAT => {
                let n = need_line(input, op, at)?;
                let line = input.window().get(..n).unwrap_or_default();
                let v = match (op, line) {
                    (INT, b"00") => Raw::FALSE,
                    (INT, b"01") => Raw::TRUE,
                    (FLOAT, _) => {
                        let v = std::str::from_utf8(line)
                            .ok()
                            .and_then(|s| s.trim().parse::<f64>().ok())
                            .ok_or_else(|| {
                                bad(
                                    op,
                                    at,
                                    format!("invalid float {:?}", line.escape_ascii().to_string()),
                                )
                            })?;
                        b.float(v, at)?
                    }
                    _ => {
                        let digits = if op == LONG {
                            line.trim_ascii().strip_suffix(b"L").unwrap_or(line)
                        } else {
                            line
                        };
                        let v = int_from_text(digits).ok_or_else(|| {
                            bad(
                                op,
                                at,
                                format!(
                                    "invalid integer (decimal, at most {MAX_INT_DIGITS} digits) {:?}",
                                    String::from_utf8_lossy(line.get(..80).unwrap_or(line))
                                ),
                            )
                        })?;
                        b.int(v, at)?
                    }
                };
                input.consume(n + 1);
                m.stack.push(v);
            }
            UNICODE | STRING => {
                let n = need_line(input, op, at)?;
                let line = input.window().get(..n).unwrap_or_default();
                let v = if op == UNICODE {
                    let s = raw_unicode_escape(line)
                        .ok_or_else(|| bad(op, at, "invalid raw-unicode-escape text"))?;
                    b.str(s.as_bytes(), at)?
                } else {
                    let s = string_literal(line)
                        .ok_or_else(|| bad(op, at, "invalid quoted string literal"))?;
                    b.py2_str(&s, at)?
                };
                input.consume(n + 1);
                m.stack.push(v);
            }
            SHORT_BINSTRING | BINSTRING => {
                let len = if op == SHORT_BINSTRING {
                    u64::from(take::<1>(input, op, at)?[0])
                } else {
                    let len = i32::from_le_bytes(take::<4>(input, op, at)?);
                    u64::try_from(len).map_err(|_| bad(op, at, format!("negative length {len}")))?
                };
                let n = need(input, op, at, len)?;
                let v = b.py2_str(input.window().get(..n).unwrap_or_default(), at)?;
                input.consume(n);
                m.stack.push(v);
            }
            SHORT_BINBYTES | BINBYTES | BINBYTES8 | BYTEARRAY8 => {
                let len = match op {
                    SHORT_BINBYTES => u64::from(take::<1>(input, op, at)?[0]),
                    BINBYTES => u64::from(u32::from_le_bytes(take::<4>(input, op, at)?)),
                    _ => u64::from_le_bytes(take::<8>(input, op, at)?),
                };
                let n = need(input, op, at, len)?;
                let v = b.blob(TAG_BYTES, input.window().get(..n).unwrap_or_default(), at)?;
                input.consume(n);
                m.stack.push(v);
            }
            PROTO => {
                let [version] = take::<1>(input, op, at)?;
                if !(2..=5).contains(&version) {
                    return Err(PickleError::Protocol {
                        version,
                        offset: at + 1,
                    });
                }
            }
            STOP => break m.pop(op, at)?,
            NEXT_BUFFER | READONLY_BUFFER => {
                return Err(PickleError::OutOfBandBuffer {
                    opcode: opcode_name(op),
                    offset: at,
                });
            }
            _ => {
                let name = opcode_name(op);
                return Err(if name == "unknown" {
                    PickleError::UnknownOpcode {
                        code: op,
                        offset: at,
                    }
                } else {
                    PickleError::Unsupported {
                        code: op,
                        opcode: name,
                        offset: at,
                    }
                });
            }
        }
    };
    // Only NUL padding may follow STOP.
    drop(m);
    loop {
        let window = input.window();
        if let Some(i) = window.iter().position(|&b| b != 0) {
            return Err(PickleError::TrailingData {
                offset: input.offset() + i as u64,
            });
        }
        let n = window.len();
        input.consume(n);
        input
            .fill(READ_CHUNK_BYTES)
            .map_err(|e| read_error(input.offset(), e))?;
        if input.window().is_empty() {
            break;
        }
    }
    Ok(b.finish(root, input.offset()))
}
