//! Reading the log's lines: [`scan_lines`] turns each `__LOG_MEMORY__` record, BFC region line,
//! `MEMINFO` line and dump OOM header into an [`Item`], before any pairing.

use std::collections::HashMap;

use super::{LOG_MEMORY_LABEL, MemlogSummary, RecordKind};
use crate::tf::dump::BfcDump;
use crate::tf::human::{ByteCount, parse_bytes};
use crate::tf::split_log_line;

/// What a record says of an allocation (a deallocation names only its allocator and id).
#[derive(Clone, Debug)]
pub(super) struct Described {
    /// Index into the allocator names.
    pub(super) allocator: usize,
    pub(super) tf_id: i64,
    pub(super) ptr: u64,
    pub(super) requested: u64,
    pub(super) allocated: Option<u64>,
    pub(super) step: Option<i64>,
    pub(super) kernel: Option<String>,
}

/// A record read from a line, before pairing.
#[derive(Clone, Debug)]
pub(super) enum Item {
    /// An allocation or deallocation record.
    Record(RecordKind, Described),
    /// A tensor output: what a live allocation turned out to hold.
    Output(Described),
    Extend {
        by: Option<ByteCount>,
        allocator: String,
    },
    Region {
        base: u64,
        end: u64,
    },
    MemInfo {
        tag: String,
        current: u64,
        peak: u64,
    },
    Oom {
        rounded: u64,
        allocator: Option<String>,
        op: Option<String>,
    },
}

/// The allocator names of the records, in order of first appearance; items refer to them by
/// index so that pairing compares integers, not strings.
#[derive(Debug, Default)]
pub(super) struct AllocatorNames {
    pub(super) names: Vec<String>,
    pub(super) index: HashMap<String, usize>,
}

impl AllocatorNames {
    fn intern(&mut self, name: &str) -> usize {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        self.names.push(name.to_owned());
        self.index.insert(name.to_owned(), self.names.len() - 1);
        self.names.len() - 1
    }
}

/// What [`scan_lines`] read, before an allocator is chosen.
pub(super) struct Scan {
    pub(super) summary: MemlogSummary,
    pub(super) allocators: AllocatorNames,
    /// Names from `Creating new BFCAllocator named: ...`.
    pub(super) bfc_allocators: Vec<String>,
    /// (line, t_ns, tid, item), in line order.
    pub(super) items: Vec<(u64, Option<i64>, Option<u64>, Item)>,
}

/// Reads every line of the log; `dumps` are the BFC dumps already found in it, whose OOM
/// headers become [`Item::Oom`] at their lines.
pub(super) fn scan_lines(text: &str, dumps: &[BfcDump]) -> Scan {
    let mut summary = MemlogSummary::default();
    let mut allocators = AllocatorNames::default();
    let mut bfc_allocators: Vec<String> = Vec::new();
    let mut items: Vec<(u64, Option<i64>, Option<u64>, Item)> = Vec::new();
    let mut oom_lines: HashMap<u64, &BfcDump> = HashMap::new();
    for d in dumps {
        if let Some(o) = &d.oom {
            oom_lines.insert(o.line, d);
        }
    }
    for (i, raw) in text.lines().enumerate() {
        let line = i as u64 + 1;
        summary.lines = line;
        let l = split_log_line(raw);
        let m = l.message;
        if let Some(rest) = m.strip_prefix(LOG_MEMORY_LABEL) {
            summary.records += 1;
            match parse_record(rest.trim_start(), &mut allocators, &mut summary) {
                Some(Some(item)) => items.push((line, l.t_ns, l.tid, item)),
                Some(None) => {}
                None => {
                    summary.unreadable_records += 1;
                    if summary.first_unreadable_lines.len() < 5 {
                        summary.first_unreadable_lines.push(line);
                    }
                }
            }
            continue;
        }
        if let Some(d) = oom_lines.get(&line) {
            if let Some(rounded) = d.oom.as_ref().and_then(|o| o.rounded_or_estimate()) {
                items.push((
                    line,
                    l.t_ns,
                    l.tid,
                    Item::Oom {
                        rounded,
                        allocator: d.allocator.clone(),
                        op: d.oom.as_ref().and_then(|o| o.op.clone()),
                    },
                ));
            }
            continue;
        }
        if let Some(name) = m.strip_prefix("Creating new BFCAllocator named: ") {
            bfc_allocators.push(name.trim().to_owned());
        } else if let Some(item) = parse_side_line(m) {
            items.push((line, l.t_ns, l.tid, item));
        }
    }
    Scan {
        summary,
        allocators,
        bfc_allocators,
        items,
    }
}

/// A line beside the records that still matters to the trace: the BFC growing a region
/// (`Extending allocation by ...`, `Allocated memory at ...`) or a `MEMINFO` figure.
fn parse_side_line(m: &str) -> Option<Item> {
    if let Some(rest) = m.strip_prefix("Extending allocation by ") {
        let (by, rest) = rest.split_once(" bytes for ").unwrap_or((rest, ""));
        return Some(Item::Extend {
            by: parse_bytes(by),
            allocator: rest.trim().trim_end_matches('.').to_owned(),
        });
    }
    if let Some(rest) = m.strip_prefix("Allocated memory at ") {
        let (a, b) = rest.split_once(" to ")?;
        let (base, end) = (parse_hex(a)?, parse_hex(b)?);
        return (end > base).then_some(Item::Region { base, end });
    }
    let rest = m.strip_prefix("MEMINFO ")?;
    let (tag, json) = rest.split_once(' ')?;
    Some(Item::MemInfo {
        tag: tag.to_owned(),
        current: json_u64(json, "current")?,
        peak: json_u64(json, "peak")?,
    })
}

fn parse_hex(s: &str) -> Option<u64> {
    let s = s.trim();
    let h = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    u64::from_str_radix(h, 16).ok()
}

/// `"key": 123` inside a one-line JSON object.
fn json_u64(json: &str, key: &str) -> Option<u64> {
    let (_, rest) = json.split_once(&format!("\"{key}\":"))?;
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Flattened fields of a short debug string: (dotted path, value), strings unescaped.
fn proto_fields(body: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut path: Vec<String> = Vec::new();
    let b = body.as_bytes();
    let mut i = 0;
    let word_end = |mut j: usize| {
        while j < b.len() && !b[j].is_ascii_whitespace() && !matches!(b[j], b':' | b'{' | b'}') {
            j += 1;
        }
        j
    };
    let skip_ws = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        j
    };
    loop {
        i = skip_ws(i);
        let Some(&c) = b.get(i) else { break };
        if c == b'}' {
            path.pop()?;
            i += 1;
            continue;
        }
        let start = i;
        i = word_end(i);
        if i == start {
            return None;
        }
        let name = body.get(start..i)?;
        i = skip_ws(i);
        match b.get(i) {
            Some(b'{') => {
                path.push(name.to_owned());
                i += 1;
            }
            Some(b':') => {
                i = skip_ws(i + 1);
                let (value, next) = if b.get(i) == Some(&b'"') {
                    read_quoted(body, i)?
                } else {
                    let e = word_end(i);
                    (body.get(i..e)?.to_owned(), e)
                };
                i = next;
                let key = if path.is_empty() {
                    name.to_owned()
                } else {
                    format!("{}.{name}", path.join("."))
                };
                out.push((key, value));
            }
            // A bare word: the debug-string marker (`goo.gle/debugproto`).
            _ => {}
        }
    }
    path.is_empty().then_some(out)
}

/// A C-escaped, double-quoted string starting at `start`; returns it and the index after it.
fn read_quoted(body: &str, start: usize) -> Option<(String, usize)> {
    let b = body.as_bytes();
    let mut out: Vec<u8> = Vec::new();
    let mut i = start + 1;
    while let Some(&c) = b.get(i) {
        match c {
            b'"' => return Some((String::from_utf8_lossy(&out).into_owned(), i + 1)),
            b'\\' => {
                let e = *b.get(i + 1)?;
                i += 2;
                match e {
                    b'n' => out.push(b'\n'),
                    b't' => out.push(b'\t'),
                    b'r' => out.push(b'\r'),
                    b'0'..=b'7' => {
                        let mut v = u32::from(e - b'0');
                        let mut k = 0;
                        while k < 2
                            && let Some(&d) = b.get(i)
                            && (b'0'..=b'7').contains(&d)
                        {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                            k += 1;
                        }
                        out.push(u8::try_from(v & 0xff).unwrap_or(0));
                    }
                    other => out.push(other),
                }
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    None
}

/// The flattened fields of one record.
struct Fields(Vec<(String, String)>);

impl Fields {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// proto3 omits zero fields, so an absent one is 0; `None` only when it does not parse.
    fn int(&self, key: &str) -> Option<i64> {
        self.get(key).map_or(Some(0), |v| v.parse().ok())
    }

    /// As [`Fields::int`].
    fn uint(&self, key: &str) -> Option<u64> {
        self.get(key).map_or(Some(0), |v| v.parse().ok())
    }
}

/// One `__LOG_MEMORY__` record (the text after the label). `None` when unreadable,
/// `Some(None)` for records that make no event (steps, empty tensors, deferred frees).
fn parse_record(
    rest: &str,
    allocators: &mut AllocatorNames,
    summary: &mut MemlogSummary,
) -> Option<Option<Item>> {
    let (message, body) = rest.split_once(' ')?;
    let body = body.trim().strip_prefix('{')?.strip_suffix('}')?;
    let fields = Fields(proto_fields(body)?);
    let step = fields.int("step_id")?;
    match message {
        "MemoryLogStep" => {
            summary.steps += 1;
            Some(None)
        }
        "MemoryLogTensorAllocation" | "MemoryLogTensorOutput" => {
            let output = message == "MemoryLogTensorOutput";
            parse_tensor(&fields, output, step, allocators, summary)
        }
        "MemoryLogTensorDeallocation" => {
            summary.tensor_deallocations += 1;
            Some(Some(Item::Record(
                RecordKind::TensorDeallocation,
                Described {
                    allocator: allocators.intern(fields.get("allocator_name").unwrap_or("")),
                    tf_id: fields.int("allocation_id")?,
                    ptr: 0,
                    requested: 0,
                    allocated: None,
                    step: None,
                    kernel: None,
                },
            )))
        }
        "MemoryLogRawAllocation" | "MemoryLogRawDeallocation" => {
            let deallocation = message == "MemoryLogRawDeallocation";
            parse_raw(&fields, deallocation, step, allocators, summary)
        }
        _ => None,
    }
}

/// A `MemoryLogTensorAllocation` or (`output`) `MemoryLogTensorOutput`; see [`parse_record`].
fn parse_tensor(
    fields: &Fields,
    output: bool,
    step: i64,
    allocators: &mut AllocatorNames,
    summary: &mut MemlogSummary,
) -> Option<Option<Item>> {
    const AD: &str = "tensor.allocation_description";
    if output {
        summary.tensor_outputs += 1;
    } else {
        summary.tensor_allocations += 1;
    }
    let Some(allocator) = fields.get(&format!("{AD}.allocator_name")) else {
        if !output {
            summary.tensors_without_buffer += 1;
        }
        return Some(None);
    };
    let allocator = allocators.intern(allocator);
    let tf_id = fields.int(&format!("{AD}.allocation_id"))?;
    let ptr = fields.uint(&format!("{AD}.ptr"))?;
    let requested = fields.uint(&format!("{AD}.requested_bytes"))?;
    let allocated = Some(fields.uint(&format!("{AD}.allocated_bytes"))?);
    let described = Described {
        allocator,
        tf_id,
        ptr,
        requested,
        allocated,
        step: Some(step),
        kernel: fields.get("kernel_name").map(str::to_owned),
    };
    Some(Some(if output {
        Item::Output(described)
    } else {
        Item::Record(RecordKind::TensorAllocation, described)
    }))
}

/// A `MemoryLogRawAllocation` or (`deallocation`) `MemoryLogRawDeallocation`; see
/// [`parse_record`].
fn parse_raw(
    fields: &Fields,
    deallocation: bool,
    step: i64,
    allocators: &mut AllocatorNames,
    summary: &mut MemlogSummary,
) -> Option<Option<Item>> {
    if deallocation {
        summary.raw_deallocations += 1;
        // A deferred free is always followed by the real one, which is the event.
        if fields.get("deferred") == Some("true") {
            summary.raw_deallocations_deferred += 1;
            return Some(None);
        }
    } else {
        summary.raw_allocations += 1;
    }
    let allocator = allocators.intern(fields.get("allocator_name").unwrap_or(""));
    let tf_id = fields.int("allocation_id")?;
    // A deallocation names only the id; the pairing fills in what it ends.
    let (record, ptr, requested) = if deallocation {
        (RecordKind::RawDeallocation, 0, 0)
    } else {
        let ptr = fields.uint("ptr")?;
        (RecordKind::RawAllocation, ptr, fields.uint("num_bytes")?)
    };
    Some(Some(Item::Record(
        record,
        Described {
            allocator,
            tf_id,
            ptr,
            requested,
            allocated: None,
            step: Some(step),
            kernel: fields.get("operation").map(str::to_owned),
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_short_debug_strings_with_the_marker() {
        let body = r#" goo.gle/debugproto   step_id: -6 kernel_name: "a\"b" tensor { dtype: DT_INT32 shape { dim { size: 2 } } allocation_description { requested_bytes: 8 allocated_bytes: 256 allocator_name: "bfc" allocation_id: 1 has_single_reference: true ptr: 139893623996480 } } "#;
        let f = proto_fields(body).unwrap();
        let get = |k: &str| f.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str());
        assert_eq!(get("step_id"), Some("-6"));
        assert_eq!(get("kernel_name"), Some("a\"b"));
        assert_eq!(get("tensor.shape.dim.size"), Some("2"));
        assert_eq!(
            get("tensor.allocation_description.ptr"),
            Some("139893623996480")
        );
        assert!(proto_fields("a { b: 1").is_none());
        assert!(proto_fields("a: \"open").is_none());
    }
}
