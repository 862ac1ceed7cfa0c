//! The pickle machine: the stack, the marks, the memo, and the loop over the opcodes.

use std::collections::HashMap;

use super::build::Builder;
use super::graph::{Kind, Pickle};
use super::input::{Input, READ_CHUNK_BYTES, need, need_line, read_error, take};
use super::opcodes::*;
use super::raw::{Raw, TAG_BYTES};
use super::tables::FxBuild;
use super::text::{MAX_INT_DIGITS, int_from_le, int_from_text, raw_unicode_escape, string_literal};
use super::{PickleError, Result};

/// The pickle machine's stack, marks and memo.
pub(super) struct Machine {
    stack: Vec<Raw>,
    /// Stack lengths at each MARK.
    marks: Vec<usize>,
    memo: Memo,
}

/// The memo: dense up to about twice the number of entries, sparse beyond (so a large key in
/// a `PUT` cannot make it allocate).
#[derive(Default)]
pub(super) struct Memo {
    dense: Vec<Raw>,
    sparse: HashMap<u64, Raw, FxBuild>,
    /// Distinct keys set: the key `MEMOIZE` uses next, as Python's `len(memo)`.
    count: u64,
}

impl Memo {
    pub(super) fn put(&mut self, key: u64, value: Raw) {
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
    pub(super) fn get(&self, key: u64) -> Option<Raw> {
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
    pub(super) fn base(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    #[inline]
    pub(super) fn pop(&mut self, op: u8, at: u64) -> Result<Raw> {
        if self.stack.len() > self.base()
            && let Some(v) = self.stack.pop()
        {
            return Ok(v);
        }
        Err(self.underflow(op, at, 1))
    }

    #[inline]
    pub(super) fn top(&self, op: u8, at: u64) -> Result<Raw> {
        if self.stack.len() > self.base()
            && let Some(&v) = self.stack.last()
        {
            return Ok(v);
        }
        Err(self.underflow(op, at, 1))
    }

    pub(super) fn underflow(&self, op: u8, at: u64, needed: usize) -> PickleError {
        PickleError::StackUnderflow {
            opcode: opcode_name(op),
            offset: at,
            needed,
            available: self.stack.len().saturating_sub(self.base()),
        }
    }

    /// Pops the last MARK: the values above it are `stack[mark..]`.
    #[inline]
    pub(super) fn pop_mark(&mut self, op: u8, at: u64) -> Result<usize> {
        self.marks.pop().ok_or(PickleError::MarkMissing {
            opcode: opcode_name(op),
            offset: at,
        })
    }

    /// Pops the last MARK for an opcode that adds the values above it to the container just
    /// below it: returns the container and the mark's position.
    #[inline]
    pub(super) fn pop_mark_target(&mut self, op: u8, at: u64) -> Result<(Raw, usize)> {
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

pub(super) fn bad(op: u8, at: u64, problem: impl Into<String>) -> PickleError {
    PickleError::BadArgument {
        opcode: opcode_name(op),
        offset: at,
        problem: problem.into(),
    }
}

/// The pickle machine: one pass over the opcodes, no recursion.
pub(super) fn run(input: &mut impl Input) -> Result<Pickle> {
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
