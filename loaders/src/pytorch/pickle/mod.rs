//! A pickle decoder for PyTorch memory snapshots: safe (it never imports or calls anything),
//! streaming, and lean enough to hold a gigabyte snapshot's object graph in about as much
//! memory as the file takes on disk.
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
//! their keys, their action strings and their frame dicts through the pickle memo. So:
//! - A value is one `u64` (`raw::Raw`): a 3-bit tag and a payload. None, bools, integers of up
//!   to 61 bits, string ids and container ids are inline; floats, wider integers and bytes are
//!   indices into side tables.
//! - Strings (and bytes) are interned: equal strings share one stored copy and one id, so a key
//!   repeated a million times costs nothing after the first and compares as one integer.
//! - A container is 12 bytes: a kind, a start and a length into a flat table of values shared by
//!   all containers. A list or dict filled by one `APPENDS`/`SETITEMS` batch (what Python writes
//!   for up to 1000 items) is one contiguous run there. A container appended to again later (the
//!   trace list, with its thousands of batches) moves to a `Vec` of its own.
//! - There are two flat tables: runs whose values all have a 4-byte form (ids below 2^29,
//!   integers in -2^28..2^28: frames lists, frame dicts) take 4 bytes a value, others 8.
//! - Lists of 4 or more items with equal contents share one run (`tables::RunIndex`): the frames
//!   lists of one call stack, written once per trace entry, are stored once. Each list keeps its
//!   own container id.
//! - A dict's keys live in a *shape*: the interned sequence of its string keys. Trace entries all
//!   share a handful of shapes, so a dict costs 12 bytes plus 4 or 8 per value (keys are free).
//! - The memo holds values, so a memo reference to a container yields the same container id:
//!   shared lists and dicts stay shared ([`Val::container_id`] tells identity from equality),
//!   and mutating a container after memoizing it is visible through every reference.
//!
//! Measured (`examples/decode_pickle.rs`, bench profile, one core): the four real snapshots'
//! graphs take 0.5 to 1.1 times their file's size; a 1 GB file made by
//! `scripts/make-big-snapshot.py` (15 M trace entries, 18 M containers) decodes at about
//! 350 MB/s into tables of 1.19 times its size, with a peak RSS of 1.34 times its size (the
//! tables, the memo, the stack and a 1 MiB read buffer).

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

mod build;
mod graph;
mod input;
mod machine;
mod opcodes;
mod raw;
mod tables;
#[cfg(test)]
mod tests;
mod text;
mod values;

pub use graph::{DictItems, Key, Kind, Pickle, Seq, Val};
use input::{ReaderInput, SliceInput};
use machine::run;
pub use values::{GraphBuilder, Node};

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
    /// A graph built from values ([`GraphBuilder`]), not decoded: `index` counts the values.
    #[error("value {index} of the object: {problem}")]
    BadValue { index: u64, problem: String },
}

type Result<T, E = PickleError> = std::result::Result<T, E>;

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
