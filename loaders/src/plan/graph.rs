//! allocview's JSON graph plan: a computation graph in MegEngine's terms, from which buffer
//! lifetimes are derived.
//!
//! ```json
//! {
//!   "format": "allocview-graph-plan",
//!   "alignment_bytes": 64,
//!   "operators": [
//!     {"name": "data", "outputs": [{"tensor": "x", "size_bytes": 602112}]},
//!     {"name": "conv1", "inputs": ["x"], "outputs": [{"tensor": "c1", "size_bytes": 3211264}]},
//!     {"name": "relu1", "inputs": ["c1"],
//!      "outputs": [{"tensor": "r1", "size_bytes": 3211264, "overwrites": "c1"}]},
//!     {"name": "pool", "inputs": ["r1"], "outputs": [{"tensor": "p", "size_bytes": 802816}]}
//!   ],
//!   "graph_outputs": ["p"]
//! }
//! ```
//!
//! Operators run in array order; operator `i` is time `i`. Each tensor is produced by exactly
//! one operator and may be read by later ones. As in MegEngine's static memory planner, a
//! tensor's lifetime begins at its producer and ends after its last reader: `[producer,
//! max(producer + 1, last reader + 1))`; a tensor in `graph_outputs` stays live through the
//! last operator. An output may declare `"overwrites": "<input>"` (MegEngine's
//! `alloc_overwrite`: an in-place operator writes its output into an input's memory) with an
//! optional `"offset_bytes"` inside it; the operator must be that input's last reader, the
//! input must not be a graph output, at most one output may overwrite a given tensor, and the
//! output must fit inside it. `alignment_bytes` (top level: every tensor; per output: that
//! tensor) defaults to 1. `name` and `type` of an operator, and `shape` and `dtype` of an
//! output, are for people and ignored. Unknown keys and keys given twice are errors, so a typo
//! does not silently drop a constraint.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use serde_json::{Map, Value};

use super::{FrameColumns, MemoryPlan, PlanFormat, PlanRow, rows_frame};
use crate::error::LoadError;
use crate::input::{StreamEnd, read_all};

/// The value of the optional top-level `"format"` key.
pub const FORMAT_NAME: &str = "allocview-graph-plan";

/// A tensor while the graph is read.
struct Tensor {
    producer: usize,
    size_bytes: u64,
    align_bytes: u64,
    last_reader: Option<usize>,
    overwrite: Option<(String, u64)>,
    overwritten: bool,
    graph_output: bool,
}

/// A JSON value read with duplicate object keys refused: serde_json's `Value` keeps the last
/// of them silently, and a plan whose key is given twice is ambiguous.
struct NoDuplicateKeys(Value);

impl<'de> serde::Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicateKeysVisitor)
            .map(NoDuplicateKeys)
    }
}

struct NoDuplicateKeysVisitor;

impl<'de> serde::de::Visitor<'de> for NoDuplicateKeysVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        serde::Deserialize::deserialize(d).map(|v: NoDuplicateKeys| v.0)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(NoDuplicateKeys(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut obj = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if obj.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the key {key:?} is given twice"
                )));
            }
            let NoDuplicateKeys(v) = map.next_value()?;
            obj.insert(key, v);
        }
        Ok(Value::Object(obj))
    }
}

fn check_keys(obj: &Map<String, Value>, allowed: &[&str], at: &str) -> Result<(), String> {
    for key in obj.keys() {
        if !allowed.contains(&key.as_str()) {
            return Err(format!(
                "{at}: unknown key {key:?} (expected one of {})",
                allowed.join(", ")
            ));
        }
    }
    Ok(())
}

fn uint(v: &Value, at: &str) -> Result<u64, String> {
    v.as_u64()
        .ok_or_else(|| format!("{at}: expected an unsigned integer, found {v}"))
}

fn string<'a>(v: &'a Value, at: &str) -> Result<&'a str, String> {
    v.as_str()
        .ok_or_else(|| format!("{at}: expected a string, found {v}"))
}

fn align(v: Option<&Value>, default: u64, at: &str) -> Result<u64, String> {
    let Some(v) = v else { return Ok(default) };
    let a = uint(v, at)?;
    if a.is_power_of_two() {
        Ok(a)
    } else {
        Err(format!("{at}: expected a power of two, found {a}"))
    }
}

/// The graph as it is read, operator by operator.
struct Graph {
    tensors: HashMap<String, Tensor>,
    /// Tensor names in order of production: the order of the rows.
    order: Vec<String>,
    /// Operator names by index, so that a message can name the operator behind a time.
    names: Vec<String>,
}

/// An optional array under `key`, empty when absent: an operator without inputs (a source) or
/// without outputs is legal, but a value that is not an array is a typo worth refusing.
fn optional_array<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    what: &str,
    at: &str,
) -> Result<&'a [Value], String> {
    match obj.get(key) {
        Some(v) => v
            .as_array()
            .map(Vec::as_slice)
            .ok_or_else(|| format!("{at}.{key}: expected {what}")),
        None => Ok(&[]),
    }
}

/// Reads the text as JSON, refusing keys given twice; the message names the line and column
/// because that is all a syntax error can point to.
fn read_json(text: &str) -> Result<Value, String> {
    serde_json::from_str::<NoDuplicateKeys>(text)
        .map(|v| v.0)
        .map_err(|e| {
            format!(
                "line {}, column {}: invalid JSON: {e}",
                e.line(),
                e.column()
            )
        })
}

/// Checks the top level's keys and format, and returns the default alignment and the
/// operators: everything the operators' reading depends on is settled before it starts.
fn read_top_level(root: &Map<String, Value>) -> Result<(u64, &[Value]), String> {
    check_keys(
        root,
        &[
            "format",
            "name",
            "alignment_bytes",
            "operators",
            "graph_outputs",
        ],
        "the top level",
    )?;
    if let Some(f) = root.get("format") {
        let f = string(f, "\"format\"")?;
        if f != FORMAT_NAME {
            return Err(format!("\"format\": expected {FORMAT_NAME:?}, found {f:?}"));
        }
    }
    let default_align_bytes = align(root.get("alignment_bytes"), 1, "\"alignment_bytes\"")?;
    let ops = root
        .get("operators")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .ok_or("expected an \"operators\" array at the top level")?;
    Ok((default_align_bytes, ops))
}

impl Graph {
    /// Reads operator `i`: its inputs first, since an output may only overwrite one of this
    /// operator's own inputs, then its outputs.
    fn read_operator(
        &mut self,
        i: usize,
        op: &Value,
        default_align_bytes: u64,
    ) -> Result<(), String> {
        let obj = op
            .as_object()
            .ok_or_else(|| format!("operators[{i}]: expected an object, found {op}"))?;
        let name = match obj.get("name") {
            Some(n) => string(n, &format!("operators[{i}].name"))?.to_owned(),
            None => format!("op{i}"),
        };
        let at = format!("operators[{i}] ({name:?})");
        check_keys(obj, &["name", "type", "inputs", "outputs"], &at)?;
        if let Some(t) = obj.get("type") {
            string(t, &format!("{at}.type"))?;
        }
        let input_names = self.read_inputs(i, obj, &at)?;
        let outputs = optional_array(obj, "outputs", "an array of objects", &at)?;
        for (k, out) in outputs.iter().enumerate() {
            let oat = format!("{at}.outputs[{k}]");
            self.read_output(i, out, &input_names, default_align_bytes, &oat)?;
        }
        self.names.push(name);
        Ok(())
    }

    /// Records operator `i` as the last reader so far of each input, which extends the input's
    /// lifetime; an input must already exist and must not have been overwritten in place, since
    /// its memory then holds another tensor.
    fn read_inputs<'a>(
        &mut self,
        i: usize,
        obj: &'a Map<String, Value>,
        at: &str,
    ) -> Result<Vec<&'a str>, String> {
        let inputs = optional_array(obj, "inputs", "an array of tensor names", at)?;
        let mut input_names: Vec<&str> = Vec::with_capacity(inputs.len());
        for (k, input) in inputs.iter().enumerate() {
            let t = string(input, &format!("{at}.inputs[{k}]"))?;
            let tensor = self.tensors.get_mut(t).ok_or_else(|| {
                format!("{at}.inputs[{k}]: tensor {t:?} is produced by no earlier operator")
            })?;
            if tensor.overwritten {
                return Err(format!(
                    "{at}.inputs[{k}]: tensor {t:?} was already overwritten in place by an \
                     earlier operator, so it cannot be read here"
                ));
            }
            tensor.last_reader = Some(i);
            input_names.push(t);
        }
        Ok(input_names)
    }

    /// Reads one output of operator `i` (at `oat`) into a new tensor; each tensor has exactly
    /// one producer, so a name produced before is refused.
    fn read_output(
        &mut self,
        i: usize,
        out: &Value,
        input_names: &[&str],
        default_align_bytes: u64,
        oat: &str,
    ) -> Result<(), String> {
        let o = out
            .as_object()
            .ok_or_else(|| format!("{oat}: expected an object, found {out}"))?;
        check_keys(
            o,
            &[
                "tensor",
                "size_bytes",
                "alignment_bytes",
                "overwrites",
                "offset_bytes",
                "shape",
                "dtype",
            ],
            oat,
        )?;
        let t = string(
            o.get("tensor")
                .ok_or_else(|| format!("{oat}: missing \"tensor\" (its name)"))?,
            &format!("{oat}.tensor"),
        )?;
        if let Some(prev) = self.tensors.get(t) {
            let by = self.names.get(prev.producer).map_or("", String::as_str);
            return Err(format!(
                "{oat}: tensor {t:?} is already produced by operators[{}] ({by:?})",
                prev.producer
            ));
        }
        let size_bytes = uint(
            o.get("size_bytes")
                .ok_or_else(|| format!("{oat}: missing \"size_bytes\""))?,
            &format!("{oat}.size_bytes"),
        )?;
        let align_bytes = align(
            o.get("alignment_bytes"),
            default_align_bytes,
            &format!("{oat}.alignment_bytes"),
        )?;
        let overwrite = self.claim_overwrite(o, size_bytes, input_names, oat)?;
        self.tensors.insert(
            t.to_owned(),
            Tensor {
                producer: i,
                size_bytes,
                align_bytes,
                last_reader: None,
                overwrite,
                overwritten: false,
                graph_output: false,
            },
        );
        self.order.push(t.to_owned());
        Ok(())
    }

    /// The input an output overwrites in place and the offset inside it, if it declares one,
    /// marking that input overwritten: MegEngine's `alloc_overwrite` lends the input's memory
    /// only when the output fits inside it and nothing else has claimed it.
    fn claim_overwrite(
        &mut self,
        o: &Map<String, Value>,
        size_bytes: u64,
        input_names: &[&str],
        oat: &str,
    ) -> Result<Option<(String, u64)>, String> {
        let Some(p) = o.get("overwrites") else {
            if o.contains_key("offset_bytes") {
                return Err(format!("{oat}: \"offset_bytes\" needs \"overwrites\""));
            }
            return Ok(None);
        };
        let p = string(p, &format!("{oat}.overwrites"))?;
        let offset = match o.get("offset_bytes") {
            Some(v) => uint(v, &format!("{oat}.offset_bytes"))?,
            None => 0,
        };
        if !input_names.contains(&p) {
            return Err(format!(
                "{oat}: overwrites {p:?}, which is not an input of this operator"
            ));
        }
        let parent = self
            .tensors
            .get_mut(p)
            .ok_or_else(|| format!("{oat}: overwrites unknown tensor {p:?}"))?;
        if parent.overwritten {
            return Err(format!(
                "{oat}: tensor {p:?} is already overwritten by another output"
            ));
        }
        if offset
            .checked_add(size_bytes)
            .is_none_or(|e| e > parent.size_bytes)
        {
            return Err(format!(
                "{oat}: {size_bytes} B at offset {offset} do not fit inside \
                 {p:?} ({} B)",
                parent.size_bytes
            ));
        }
        parent.overwritten = true;
        Ok(Some((p.to_owned(), offset)))
    }

    /// Marks the tensors in `graph_outputs`, which stay live through the last operator; an
    /// overwritten tensor no longer has memory of its own to hand out.
    fn mark_graph_outputs(&mut self, outs: &Value) -> Result<(), String> {
        let outs = outs
            .as_array()
            .ok_or("\"graph_outputs\": expected an array of tensor names")?;
        for (k, v) in outs.iter().enumerate() {
            let t = string(v, &format!("graph_outputs[{k}]"))?;
            let tensor = self.tensors.get_mut(t).ok_or_else(|| {
                format!("graph_outputs[{k}]: tensor {t:?} is produced by no operator")
            })?;
            if tensor.overwritten {
                return Err(format!(
                    "graph_outputs[{k}]: tensor {t:?} is overwritten in place, so it cannot \
                     be an output"
                ));
            }
            tensor.graph_output = true;
        }
        Ok(())
    }

    /// Turns the tensors into rows in order of production, each live from its producer to
    /// after its last reader (through the last of `n_ops` operators for a graph output). Only
    /// now are all readers known, so only now can an overwrite be checked against a later
    /// reader of the tensor it overwrote.
    fn into_rows(self, n_ops: u64) -> Result<Vec<PlanRow>, String> {
        let Graph {
            tensors,
            order,
            names,
        } = self;
        let mut rows = Vec::with_capacity(order.len());
        for t in order {
            let Some(tensor) = tensors.get(&t) else {
                continue;
            };
            // An overwritten tensor must be dead once its overwriter runs: no later reader.
            if let Some((p, _)) = &tensor.overwrite
                && let Some(parent) = tensors.get(p)
                && let Some(r) = parent.last_reader
                && r > tensor.producer
            {
                let by = names.get(r).map_or("", String::as_str);
                let ow = names.get(tensor.producer).map_or("", String::as_str);
                return Err(format!(
                    "tensor {p:?} is read by operators[{r}] ({by:?}) after operators[{}] ({ow:?}) \
                     overwrote it with {t:?}",
                    tensor.producer
                ));
            }
            let lower = tensor.producer as u64;
            let mut upper = lower + 1;
            if let Some(r) = tensor.last_reader {
                upper = upper.max(r as u64 + 1);
            }
            if tensor.graph_output {
                upper = upper.max(n_ops);
            }
            let mut row = PlanRow::new(t.clone(), tensor.size_bytes, lower, upper);
            row.align_bytes = tensor.align_bytes;
            row.overwrite.clone_from(&tensor.overwrite);
            rows.push(row);
        }
        Ok(rows)
    }
}

/// Parses a JSON graph plan into buffer rows (tensors in order of production), and the number
/// of operators.
///
/// # Errors
/// A message naming the JSON line and column (syntax) or the operator and tensor (meaning).
pub fn parse_graph_json(text: &str) -> Result<(Vec<PlanRow>, usize), String> {
    let root = read_json(text)?;
    let root = root
        .as_object()
        .ok_or("expected a JSON object with an \"operators\" array at the top")?;
    let (default_align_bytes, ops) = read_top_level(root)?;
    let mut graph = Graph {
        tensors: HashMap::new(),
        order: Vec::new(),
        names: Vec::with_capacity(ops.len()),
    };
    for (i, op) in ops.iter().enumerate() {
        graph.read_operator(i, op, default_align_bytes)?;
    }
    if let Some(outs) = root.get("graph_outputs") {
        graph.mark_graph_outputs(outs)?;
    }
    let rows = graph.into_rows(ops.len() as u64)?;
    Ok((rows, ops.len()))
}

/// Loads a JSON graph plan (plain or gzip).
///
/// # Errors
/// When the file cannot be read or is not a valid graph plan; the message names the file and
/// the line and column, or the operator and tensor, at fault.
pub fn load_graph_json(path: &Path) -> Result<MemoryPlan, LoadError> {
    let start = Instant::now();
    let (bytes, end) = read_all(path)?;
    if let StreamEnd::Truncated(why) = end {
        return Err(LoadError::format(
            path,
            format!("the compressed stream is truncated ({why}): a JSON plan must be whole"),
        ));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        LoadError::format(
            path,
            format!(
                "not UTF-8 text (byte {} is invalid): expected a JSON graph plan",
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    let (rows, _) = parse_graph_json(&text).map_err(|m| LoadError::format(path, m))?;
    let buffers = rows_frame(&rows, FrameColumns { align: false })?;
    Ok(MemoryPlan {
        path: path.to_path_buf(),
        format: PlanFormat::GraphJson,
        buffers,
        time_unit: "operator",
        notes: Vec::new(),
        load_seconds: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_follow_producer_and_last_reader() {
        let (rows, n) = parse_graph_json(
            r#"{"operators": [
                {"outputs": [{"tensor": "a", "size_bytes": 10}]},
                {"inputs": ["a"], "outputs": [{"tensor": "b", "size_bytes": 20}]},
                {"inputs": ["a", "b"], "outputs": [{"tensor": "c", "size_bytes": 30}]},
                {"outputs": [{"tensor": "unused", "size_bytes": 5}]}
            ], "graph_outputs": ["c"]}"#,
        )
        .unwrap();
        assert_eq!(n, 4);
        let spans: Vec<(&str, u64, u64)> = rows
            .iter()
            .map(|r| (r.id.as_str(), r.lower, r.upper))
            .collect();
        assert_eq!(
            spans,
            [("a", 0, 3), ("b", 1, 3), ("c", 2, 4), ("unused", 3, 4)]
        );
    }

    /// A key given twice is an error naming the key and where, at any depth; the same key in
    /// two different objects is fine.
    #[test]
    fn duplicate_keys_are_refused() {
        let twice_in_output = "{\"operators\": [\n  {\"outputs\": [{\"tensor\": \"a\", \"size_bytes\": 10, \"size_bytes\": 20}]}\n]}";
        let e = parse_graph_json(twice_in_output).unwrap_err();
        assert!(e.contains("\"size_bytes\" is given twice"), "{e}");
        assert!(e.starts_with("line 2, column "), "{e}");
        let twice_at_top = r#"{"alignment_bytes": 64, "operators": [], "alignment_bytes": 1}"#;
        let e = parse_graph_json(twice_at_top).unwrap_err();
        assert!(e.contains("\"alignment_bytes\" is given twice"), "{e}");
        let (rows, _) = parse_graph_json(
            r#"{"operators": [{"outputs": [{"tensor": "a", "size_bytes": 1}]},
                              {"outputs": [{"tensor": "b", "size_bytes": 2}]}]}"#,
        )
        .unwrap();
        assert_eq!(rows.len(), 2);
    }
}
