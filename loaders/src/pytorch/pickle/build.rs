//! Builds the graph's tables as the machine runs: containers, runs, shapes, interned values.

use std::collections::HashMap;

use super::graph::{
    Container, Kind, MAX_SHAPE, MAX_SHAPE_KEYS, META_KIND_MASK, META_NARROW, META_SHAPE_SHIFT,
    META_SPILLED, Pickle,
};
use super::opcodes::{ADDITEMS, DICT, opcode_name};
use super::raw::{Raw, TAG_BIG, TAG_BYTES, TAG_CONTAINER, TAG_FLOAT, TAG_STR, TAG_WIDE};
use super::tables::{FxBuild, Interner, MIN_SHARED_RUN, RunIndex};
use super::text::Int;
use super::{PickleError, Result};

/// Builds the graph's tables.
pub(super) struct Builder {
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

impl Builder {
    pub(super) fn new(protocol: u8) -> Self {
        Self {
            p: Pickle {
                root: Raw::NONE,
                protocol,
                bytes_read: 0,
                containers: Vec::new(),
                items: Vec::new(),
                narrow: Vec::new(),
                escaped: Vec::new(),
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

    pub(super) fn too_large(what: &'static str, at: u64) -> PickleError {
        PickleError::TooLarge { what, offset: at }
    }

    /// A string from UTF-8 bytes (invalid sequences become U+FFFD).
    pub(super) fn str(&mut self, bytes: &[u8], at: u64) -> Result<Raw> {
        let id = match std::str::from_utf8(bytes) {
            Ok(s) => self.p.strings.intern(s),
            Err(_) => self.p.strings.intern(&String::from_utf8_lossy(bytes)),
        };
        id.map(|id| Raw::with_id(TAG_STR, id))
            .ok_or_else(|| Self::too_large("strings", at))
    }

    pub(super) fn blob(&mut self, tag: u64, bytes: &[u8], at: u64) -> Result<Raw> {
        self.p
            .blobs
            .intern(bytes)
            .map(|id| Raw::with_id(tag, id))
            .ok_or_else(|| Self::too_large("byte strings", at))
    }

    /// A Python 2 string: `str` if it is UTF-8, else bytes.
    pub(super) fn py2_str(&mut self, bytes: &[u8], at: u64) -> Result<Raw> {
        if std::str::from_utf8(bytes).is_ok() {
            self.str(bytes, at)
        } else {
            self.blob(TAG_BYTES, bytes, at)
        }
    }

    #[inline]
    pub(super) fn int64(&mut self, v: i64, at: u64) -> Result<Raw> {
        match Raw::small_int(v) {
            Some(raw) => Ok(raw),
            None => self.wide(i128::from(v), at),
        }
    }

    pub(super) fn wide(&mut self, v: i128, at: u64) -> Result<Raw> {
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

    pub(super) fn int(&mut self, v: Int, at: u64) -> Result<Raw> {
        match v {
            Int::Small(v) => self.wide(v, at),
            Int::Big(bytes) => self.blob(TAG_BIG, &bytes, at),
        }
    }

    pub(super) fn float(&mut self, v: f64, at: u64) -> Result<Raw> {
        let id = u32::try_from(self.p.floats.len()).map_err(|_| Self::too_large("floats", at))?;
        self.p.floats.push(v);
        Ok(Raw::with_id(TAG_FLOAT, id))
    }

    pub(super) fn new_container(
        &mut self,
        kind: Kind,
        start: u32,
        len: u32,
        at: u64,
    ) -> Result<Raw> {
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
    pub(super) fn push_run(&mut self, values: &[Raw], share: bool, at: u64) -> Result<(u32, u32)> {
        let wide = values.iter().filter(|r| r.narrow().is_none()).count();
        let (start, narrow) = if wide > 0
            && wide * 2 < values.len()
            && Raw::escape(self.p.escaped.len() + wide).is_some()
        {
            // Narrow with escapes: 4 bytes a value and 8 more for each escaped one.
            let start = self.p.narrow.len();
            for &r in values {
                let n = match r.narrow() {
                    Some(n) => n,
                    None => {
                        let n = Raw::escape(self.p.escaped.len())
                            .ok_or_else(|| Self::too_large("container items", at))?;
                        self.p.escaped.push(r);
                        n
                    }
                };
                self.p.narrow.push(n);
            }
            (start, META_NARROW)
        } else if wide == 0 {
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
    pub(super) fn sequence(&mut self, kind: Kind, values: &[Raw], at: u64) -> Result<Raw> {
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

    pub(super) fn empty_tuple(&mut self, at: u64) -> Result<Raw> {
        if let Some(raw) = self.empty_tuple {
            return Ok(raw);
        }
        let raw = self.new_container(Kind::Tuple, 0, 0, at)?;
        self.empty_tuple = Some(raw);
        Ok(raw)
    }

    pub(super) fn kind_of(&self, raw: Raw) -> &'static str {
        self.p.val(raw).kind_name()
    }

    /// Appends `values` to the list or set `target`.
    pub(super) fn extend(&mut self, op: u8, target: Raw, values: &[Raw], at: u64) -> Result<()> {
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
    pub(super) fn spill(&mut self, id: usize, items: Vec<Raw>, at: u64) -> Result<()> {
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
    pub(super) fn set_items(&mut self, op: u8, target: Raw, pairs: &[Raw], at: u64) -> Result<()> {
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
    pub(super) fn find_shape(&mut self, pairs: &[Raw]) -> Option<u32> {
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
    pub(super) fn dict(&mut self, pairs: &[Raw], at: u64) -> Result<Raw> {
        let dict = self.new_container(Kind::Dict, 0, 0, at)?;
        self.set_items(DICT, dict, pairs, at)?;
        Ok(dict)
    }

    /// Removes repeated keys from dicts that grew more than once (the last value wins, at the
    /// first key's position, as in Python), and trims the tables.
    pub(super) fn finish(mut self, root: Raw, bytes_read: u64) -> Pickle {
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
        p.escaped.shrink_to_fit();
        p.spilled.shrink_to_fit();
        for v in &mut p.spilled {
            v.shrink_to_fit();
        }
        p
    }
}
