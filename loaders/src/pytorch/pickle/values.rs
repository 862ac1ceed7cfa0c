//! A [`Pickle`] graph built from values that never were a pickle stream: the Python package
//! hands over the object `torch.cuda.memory._snapshot()` returns, converts it value by value
//! here, and the snapshot model then reads the graph exactly as it reads a decoded file (the
//! same interning, shapes and shared runs, so the same tables come out).

use super::Result;
use super::build::Builder;
use super::graph::{Kind, Pickle};
use super::raw::{Raw, TAG_BIG, TAG_BYTES};

/// One value added to a [`GraphBuilder`], to be used as an item of a later container.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Node(Raw);

/// Builds a [`Pickle`] bottom-up: scalars first, then the containers that hold them.
///
/// Errors name the number of values added before the one at fault where a decoded file's name
/// the byte offset.
pub struct GraphBuilder {
    b: Builder,
    added: u64,
}

impl GraphBuilder {
    /// A builder whose graph reports `protocol` (0: the values did not come from a pickle).
    #[must_use]
    pub fn new(protocol: u8) -> Self {
        Self {
            b: Builder::new(protocol),
            added: 0,
        }
    }

    fn at(&mut self) -> u64 {
        self.added += 1;
        self.added
    }

    #[must_use]
    pub fn none(&self) -> Node {
        Node(Raw::NONE)
    }

    #[must_use]
    pub fn bool(&self, v: bool) -> Node {
        Node(if v { Raw::TRUE } else { Raw::FALSE })
    }

    /// An integer of up to 128 bits.
    ///
    /// # Errors
    /// When the graph's table of wide integers is full.
    pub fn int(&mut self, v: i128) -> Result<Node> {
        let at = self.at();
        self.b.wide(v, at).map(Node)
    }

    /// An integer wider than 128 bits, as little-endian two's-complement bytes.
    ///
    /// # Errors
    /// When the graph's byte table is full.
    pub fn big_int(&mut self, le_bytes: &[u8]) -> Result<Node> {
        let at = self.at();
        self.b.blob(TAG_BIG, le_bytes, at).map(Node)
    }

    /// # Errors
    /// When the graph's float table is full.
    pub fn float(&mut self, v: f64) -> Result<Node> {
        let at = self.at();
        self.b.float(v, at).map(Node)
    }

    /// # Errors
    /// When the graph's string table is full.
    pub fn str(&mut self, v: &str) -> Result<Node> {
        let at = self.at();
        self.b.str(v.as_bytes(), at).map(Node)
    }

    /// # Errors
    /// When the graph's byte table is full.
    pub fn bytes(&mut self, v: &[u8]) -> Result<Node> {
        let at = self.at();
        self.b.blob(TAG_BYTES, v, at).map(Node)
    }

    /// A list, tuple, set or frozenset of `items`, in order.
    ///
    /// # Errors
    /// When `kind` is not a sequence kind, or the container tables are full.
    pub fn sequence(&mut self, kind: Kind, items: &[Node]) -> Result<Node> {
        let at = self.at();
        if !matches!(kind, Kind::List | Kind::Tuple | Kind::Set | Kind::FrozenSet) {
            return Err(super::PickleError::BadValue {
                index: at,
                problem: format!("a {} is not a sequence", kind.name()),
            });
        }
        let raws: Vec<Raw> = items.iter().map(|n| n.0).collect();
        self.b.sequence(kind, &raws, at).map(Node)
    }

    /// A dict of `pairs` (key, value, key, value, ...); a repeated key keeps its last value.
    ///
    /// # Errors
    /// When `pairs` has an odd length, or the container tables are full.
    pub fn dict(&mut self, pairs: &[Node]) -> Result<Node> {
        let at = self.at();
        if !pairs.len().is_multiple_of(2) {
            return Err(super::PickleError::BadValue {
                index: at,
                problem: "a dict's items must come in key, value pairs".to_owned(),
            });
        }
        let raws: Vec<Raw> = pairs.iter().map(|n| n.0).collect();
        self.b.dict(&raws, at).map(Node)
    }

    /// The graph, with `root` as the value [`Pickle::root`] returns.
    #[must_use]
    pub fn finish(self, root: Node) -> Pickle {
        self.b.finish(root.0, 0)
    }
}
