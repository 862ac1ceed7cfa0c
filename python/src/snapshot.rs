//! `from_snapshot`: the object `torch.cuda.memory._snapshot()` returns, turned value by value
//! into the graph the pickle decoder builds from a snapshot file (`GraphBuilder`), then read by
//! the same snapshot model. A container reached twice (the frame dicts PyTorch shares between
//! trace entries) becomes one node, as the pickle memo makes it when the file is decoded.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use allocview_loaders::pytorch::pickle::{GraphBuilder, Kind, Node, Pickle, PickleError};
use allocview_loaders::pytorch::{PytorchSnapshot, from_raw, model};
use anyhow::{Context as _, Result};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PySet, PyString,
    PyTuple,
};

use crate::AllocviewError;

/// Deeper than any snapshot nests (a dict of lists of dicts of frame lists): past it the object
/// is refused rather than the stack risked on a cyclic or hostile object.
const MAX_DEPTH: usize = 64;

/// The pickle protocol a graph built from a Python object reports: none, it was no pickle.
pub const NO_PROTOCOL: u8 = 0;

struct Converter {
    g: GraphBuilder,
    /// Containers already converted, by object identity.
    seen: HashMap<usize, Node>,
}

/// Converts `obj` to a decoded-pickle graph (with the GIL: it reads Python objects).
pub fn to_graph(obj: &Bound<'_, PyAny>) -> PyResult<Pickle> {
    let mut c = Converter {
        g: GraphBuilder::new(NO_PROTOCOL),
        seen: HashMap::new(),
    };
    let root = c
        .node(obj, 0)
        .map_err(|(path, msg)| AllocviewError::new_err(format!("snapshot{path}: {msg}")))?;
    Ok(c.g.finish(root))
}

/// The snapshot the loader would make of a file holding `graph` (`path` names it).
pub fn from_graph(graph: &Pickle, path: &Path) -> Result<PytorchSnapshot> {
    let started = Instant::now();
    let raw = model::read_snapshot(graph)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{} is not a PyTorch memory snapshot", path.display()))?;
    let mut snap = from_raw(raw, graph.protocol())?;
    snap.load_seconds = started.elapsed().as_secs_f64();
    Ok(snap)
}

/// An error: where in the object (`['device_traces'][0]`, built on the way out) and what.
type Fail = (String, String);

fn built(e: PickleError) -> Fail {
    (String::new(), e.to_string())
}

impl Converter {
    fn node(&mut self, obj: &Bound<'_, PyAny>, depth: usize) -> Result<Node, Fail> {
        if depth > MAX_DEPTH {
            return Err((
                String::new(),
                format!("nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        if obj.is_none() {
            return Ok(self.g.none());
        }
        // bool before int: Python's bools are ints.
        if let Ok(b) = obj.cast::<PyBool>() {
            return Ok(self.g.bool(b.is_true()));
        }
        if obj.is_instance_of::<PyInt>() {
            return self.int(obj);
        }
        if let Ok(f) = obj.cast::<PyFloat>() {
            return self.g.float(f.value()).map_err(built);
        }
        if let Ok(s) = obj.cast::<PyString>() {
            let text = s.to_cow().map_err(|e| (String::new(), e.to_string()))?;
            return self.g.str(&text).map_err(built);
        }
        if let Ok(b) = obj.cast::<PyBytes>() {
            return self.g.bytes(b.as_bytes()).map_err(built);
        }
        if let Ok(b) = obj.cast::<PyByteArray>() {
            return self.g.bytes(&b.to_vec()).map_err(built);
        }
        let id = obj.as_ptr() as usize;
        if let Some(&node) = self.seen.get(&id) {
            return Ok(node);
        }
        let node = self.container(obj, depth)?;
        self.seen.insert(id, node);
        Ok(node)
    }

    fn container(&mut self, obj: &Bound<'_, PyAny>, depth: usize) -> Result<Node, Fail> {
        if let Ok(d) = obj.cast::<PyDict>() {
            let mut pairs = Vec::with_capacity(d.len() * 2);
            for (k, v) in d.iter() {
                let key = self.node(&k, depth + 1)?;
                let value = self.node(&v, depth + 1).map_err(|(p, m)| {
                    let shown = k.repr().map_or_else(|_| "?".to_owned(), |r| r.to_string());
                    (format!("[{shown}]{p}"), m)
                })?;
                pairs.push(key);
                pairs.push(value);
            }
            return self.g.dict(&pairs).map_err(built);
        }
        let kind = if obj.is_instance_of::<PyList>() {
            Kind::List
        } else if obj.is_instance_of::<PyTuple>() {
            Kind::Tuple
        } else if obj.is_instance_of::<PySet>() {
            Kind::Set
        } else if obj.is_instance_of::<PyFrozenSet>() {
            Kind::FrozenSet
        } else {
            let ty = obj
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string());
            return Err((
                String::new(),
                format!(
                    "a {ty} where a snapshot holds only dicts, lists, tuples, strings, \
                     numbers, bytes and None"
                ),
            ));
        };
        let mut items = Vec::new();
        for (i, item) in obj
            .try_iter()
            .map_err(|e| (String::new(), e.to_string()))?
            .enumerate()
        {
            let item = item.map_err(|e| (String::new(), e.to_string()))?;
            items.push(
                self.node(&item, depth + 1)
                    .map_err(|(p, m)| (format!("[{i}]{p}"), m))?,
            );
        }
        self.g.sequence(kind, &items).map_err(built)
    }

    fn int(&mut self, obj: &Bound<'_, PyAny>) -> Result<Node, Fail> {
        if let Ok(v) = obj.extract::<i128>() {
            return self.g.int(v).map_err(built);
        }
        // Wider than 128 bits: its two's-complement bytes, as the decoder keeps them.
        let py_err = |e: PyErr| (String::new(), e.to_string());
        let bits: usize = obj
            .call_method0("bit_length")
            .and_then(|b| b.extract())
            .map_err(py_err)?;
        let kwargs = PyDict::new(obj.py());
        kwargs.set_item("signed", true).map_err(py_err)?;
        let le: Vec<u8> = obj
            .call_method("to_bytes", (bits / 8 + 1, "little"), Some(&kwargs))
            .and_then(|b| b.extract())
            .map_err(py_err)?;
        self.g.big_int(&le).map_err(built)
    }
}
