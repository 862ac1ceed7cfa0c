//! The decoded graph: 8-byte values, 12-byte containers, and the [`Val`] handles that read them.

use std::fmt;

use super::raw::{Raw, TAG_BIG, TAG_BYTES, TAG_CONTAINER, TAG_FLOAT, TAG_INT, TAG_STR, TAG_WIDE};
use super::tables::Interner;

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

    #[inline]
    pub(super) fn container_code(self) -> u32 {
        match self {
            Kind::Tuple => 1,
            Kind::Dict => 2,
            Kind::Set => 3,
            Kind::FrozenSet => 4,
            _ => 0,
        }
    }

    #[inline]
    pub(super) fn from_container_code(code: u32) -> Kind {
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
pub(super) struct Container {
    pub(super) start: u32,
    pub(super) len: u32,
    pub(super) meta: u32,
}

pub(super) const META_KIND_MASK: u32 = 0b111;
pub(super) const META_SPILLED: u32 = 1 << 3;
pub(super) const META_NARROW: u32 = 1 << 4;
pub(super) const META_SHAPE_SHIFT: u32 = 5;
pub(super) const MAX_SHAPE: u32 = (1 << (32 - META_SHAPE_SHIFT)) - 1;
/// Dicts with more keys than this never get a shape: a shape pays off when many dicts share it.
pub(super) const MAX_SHAPE_KEYS: usize = 64;

impl Container {
    #[inline]
    pub(super) fn kind(self) -> Kind {
        Kind::from_container_code(self.meta & META_KIND_MASK)
    }
    #[inline]
    pub(super) fn spilled(self) -> bool {
        self.meta & META_SPILLED != 0
    }
    #[inline]
    pub(super) fn narrow(self) -> bool {
        self.meta & META_NARROW != 0
    }
    #[inline]
    pub(super) fn shape(self) -> u32 {
        self.meta >> META_SHAPE_SHIFT
    }
}

/// A run of values, 8 or 4 bytes each. A narrow run may hold a few values without a 4-byte
/// form as escapes into a table of 8-byte ones (the second slice): a trace entry's address and
/// time need 8 bytes, its four other values 4, and a 1 GB snapshot holds millions of entries.
#[derive(Clone, Copy)]
pub(super) enum Items<'a> {
    Wide(&'a [Raw]),
    Narrow(&'a [u32], &'a [Raw]),
}

impl<'a> Items<'a> {
    #[inline]
    pub(super) fn len(self) -> usize {
        match self {
            Items::Wide(v) => v.len(),
            Items::Narrow(v, _) => v.len(),
        }
    }
    #[inline]
    pub(super) fn get(self, i: usize) -> Option<Raw> {
        match self {
            Items::Wide(v) => v.get(i).copied(),
            Items::Narrow(v, esc) => v.get(i).map(|&n| Raw::unescape(n, esc)),
        }
    }
    pub(super) fn skip(self, n: usize) -> Items<'a> {
        match self {
            Items::Wide(v) => Items::Wide(v.get(n..).unwrap_or_default()),
            Items::Narrow(v, esc) => Items::Narrow(v.get(n..).unwrap_or_default(), esc),
        }
    }
    pub(super) fn iter(self) -> impl Iterator<Item = Raw> + 'a {
        let (wide, narrow, esc) = match self {
            Items::Wide(v) => (v, &[][..], &[][..]),
            Items::Narrow(v, esc) => (&[][..], v, esc),
        };
        wide.iter()
            .copied()
            .chain(narrow.iter().map(|&n| Raw::unescape(n, esc)))
    }
}

/// The decoded object graph of one pickle. See the module documentation for its layout.
pub struct Pickle {
    pub(super) root: Raw,
    pub(super) protocol: u8,
    pub(super) bytes_read: u64,
    pub(super) containers: Vec<Container>,
    /// Runs of container items (for dicts with a shape, only the values).
    pub(super) items: Vec<Raw>,
    /// Runs whose values all have a 4-byte form (frames lists: references to frame dicts), or
    /// all but a few, escaped into `escaped`.
    pub(super) narrow: Vec<u32>,
    pub(super) escaped: Vec<Raw>,
    /// Items of containers that grew after their first run (dicts: key, value, key, value...).
    pub(super) spilled: Vec<Vec<Raw>>,
    /// Shape `i`'s keys are `shape_keys[shape_starts[i]..shape_starts[i + 1]]`.
    pub(super) shape_starts: Vec<u32>,
    pub(super) shape_keys: Vec<Raw>,
    pub(super) strings: Interner<String>,
    /// Bytes, and the little-endian bytes of integers wider than 128 bits.
    pub(super) blobs: Interner<Vec<u8>>,
    pub(super) floats: Vec<f64>,
    pub(super) wide_ints: Vec<i128>,
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
            + self.escaped.capacity() * 8
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

    #[inline]
    pub(super) fn val(&self, raw: Raw) -> Val<'_> {
        Val { pickle: self, raw }
    }

    #[inline]
    pub(super) fn container(&self, raw: Raw) -> Option<Container> {
        if raw.tag() == TAG_CONTAINER {
            self.containers.get(raw.id() as usize).copied()
        } else {
            None
        }
    }

    /// A container's items (dicts: values only when `keys` is a shape, else interleaved).
    pub(super) fn slots(&self, c: Container) -> (&[Raw], Items<'_>) {
        let start = c.start as usize;
        if c.spilled() {
            let items = self.spilled.get(start).map_or(&[][..], Vec::as_slice);
            return (&[], Items::Wide(items));
        }
        let range = start..start + c.len as usize;
        let items = if c.narrow() {
            Items::Narrow(self.narrow.get(range).unwrap_or_default(), &self.escaped)
        } else {
            Items::Wide(self.items.get(range).unwrap_or_default())
        };
        if c.kind() == Kind::Dict {
            (self.shape(c.shape()), items)
        } else {
            (&[], items)
        }
    }

    pub(super) fn shape(&self, shape: u32) -> &[Raw] {
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
pub struct Key(pub(super) u32);

/// A handle to one value of a [`Pickle`]: 16 bytes, `Copy`.
#[derive(Clone, Copy)]
pub struct Val<'a> {
    pub(super) pickle: &'a Pickle,
    pub(super) raw: Raw,
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

    /// Where a list's or tuple's items are stored: lists with equal contents that were stored
    /// once (runs of 4 or more items are shared) have equal keys, so a caller can compute
    /// something per distinct content once. `None` for scalars, dicts and containers that grew
    /// after their first run.
    pub fn content_key(&self) -> Option<(bool, u32, u32)> {
        let c = self.pickle.container(self.raw)?;
        (c.kind() != Kind::Dict && !c.spilled()).then(|| (c.narrow(), c.start, c.len))
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

    pub(super) fn fmt_depth(&self, f: &mut fmt::Formatter<'_>, depth: usize) -> fmt::Result {
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
    pub(super) pickle: &'a Pickle,
    pub(super) items: Items<'a>,
    pub(super) front: usize,
    pub(super) back: usize,
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
    pub(super) pickle: &'a Pickle,
    pub(super) keys: Items<'a>,
    pub(super) values: Items<'a>,
    pub(super) stride: usize,
    pub(super) next: usize,
    pub(super) len: usize,
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
