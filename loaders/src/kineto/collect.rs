//! What is kept of each event as it is read: the `[memory]` events, checked, and the spans of
//! operators, Python functions and annotations their sites come from.

use std::collections::HashMap;

use super::Device;
use super::parse::{EventSink, Names, RawEvent, Scalar};
use crate::events::{MAX_REPORTED_BAD_LINES, Strictness};

/// One `[memory]` event, as the file says it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MemEvent {
    pub t_ns: i64,
    /// Index of the event's pid/tid ([`Collector::threads`]).
    pub thread: u32,
    pub device: Device,
    /// Positive for an allocation, negative for a free.
    pub bytes: i64,
    pub addr: Option<u64>,
    pub total_allocated_bytes: Option<u64>,
    pub total_reserved_bytes: Option<u64>,
}

/// What a span stands for in a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SpanKind {
    /// A `cpu_op` (`Operator` in the 2021 schema): an allocation's site.
    Operator,
    /// A `python_function` (traces recorded `with_stack`).
    Python,
    /// A `user_annotation` (`record_function`).
    Annotation,
}

/// A complete (`ph: "X"`) event on a thread: `[start_ns, end_ns]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub thread: u32,
    pub start_ns: i64,
    pub end_ns: i64,
    pub name: u32,
    pub kind: SpanKind,
}

/// A pid or tid: a number, or a name (some traces write `"stream 7"`, the 2021 schema writes
/// operators' tids as strings of digits).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Id {
    Num(i64),
    Name(String),
    None,
}

impl Id {
    fn of(s: Scalar) -> Self {
        match s {
            Scalar::Str(text) => text.trim().parse().map_or(Self::Name(text), Self::Num),
            other => other.as_i64().map_or(Self::None, Self::Num),
        }
    }
}

/// The events kept, and what was skipped.
pub(crate) struct Collector {
    strictness: Strictness,
    pub memory: Vec<MemEvent>,
    pub spans: Vec<Span>,
    pub names: Names,
    threads: HashMap<(Id, Id), u32>,
    /// Per thread index: the tid as a number (a named tid gets its index).
    pub thread_tids: Vec<u64>,
    /// Events skipped under `--lenient`, and the first few reasons.
    pub skipped: u64,
    pub first_skipped: Vec<String>,
    /// Complete events of operators or functions whose times do not read (their sites lost).
    pub spans_unreadable: u64,
}

impl Collector {
    pub(crate) fn new(strictness: Strictness) -> Self {
        Self {
            strictness,
            memory: Vec::new(),
            spans: Vec::new(),
            names: Names::default(),
            threads: HashMap::new(),
            thread_tids: Vec::new(),
            skipped: 0,
            first_skipped: Vec::new(),
            spans_unreadable: 0,
        }
    }

    fn thread(&mut self, pid: Scalar, tid: Scalar) -> u32 {
        let key = (Id::of(pid), Id::of(tid));
        let next = u32::try_from(self.thread_tids.len()).unwrap_or(u32::MAX);
        let tid = match &key.1 {
            Id::Num(n) => n.unsigned_abs(),
            _ => u64::from(next),
        };
        *self.threads.entry(key).or_insert_with(|| {
            self.thread_tids.push(tid);
            next
        })
    }

    fn span(&mut self, e: RawEvent) {
        let kind = match RawEvent::text(&e.cat) {
            Some("cpu_op" | "Operator") => SpanKind::Operator,
            Some("python_function") => SpanKind::Python,
            Some("user_annotation") => SpanKind::Annotation,
            _ => return,
        };
        let (Some(start_ns), Some(dur_ns)) = (e.ts.us_as_ns(), e.dur.us_as_ns()) else {
            self.spans_unreadable += 1;
            return;
        };
        let Scalar::Str(name) = e.name else {
            self.spans_unreadable += 1;
            return;
        };
        let thread = self.thread(e.pid, e.tid);
        let name = self.names.intern(name);
        self.spans.push(Span {
            thread,
            start_ns,
            end_ns: start_ns.saturating_add(dur_ns.max(0)),
            name,
            kind,
        });
    }

    fn memory_event(&mut self, e: RawEvent) -> Result<(), String> {
        let a = &e.args;
        let t_ns = e.ts.us_as_ns().ok_or_else(|| bad("ts", "a time", &e.ts))?;
        let device_type = a
            .device_type
            .as_i64()
            .ok_or_else(|| bad("Device Type", "an integer", &a.device_type))?;
        let index = a
            .device_id
            .as_i64()
            .ok_or_else(|| bad("Device Id", "an integer", &a.device_id))?;
        let bytes = a
            .bytes
            .as_i64()
            .ok_or_else(|| bad("Bytes", "an integer", &a.bytes))?;
        let unsigned = |field: &'static str, v: &Option<Scalar>| match v {
            None => Ok(None),
            Some(s) => s
                .as_i64()
                .and_then(|i| u64::try_from(i).ok())
                .map(Some)
                .ok_or_else(|| bad(field, "a non-negative integer", s)),
        };
        let addr = unsigned("Addr", &a.addr)?;
        let total_allocated_bytes = unsigned("Total Allocated", &a.total_allocated)?;
        let total_reserved_bytes = unsigned("Total Reserved", &a.total_reserved)?;
        let thread = self.thread(e.pid, e.tid);
        self.memory.push(MemEvent {
            t_ns,
            thread,
            device: Device { device_type, index },
            bytes,
            addr,
            total_allocated_bytes,
            total_reserved_bytes,
        });
        Ok(())
    }
}

fn bad(field: &str, expected: &str, found: &Scalar) -> String {
    format!(
        "expected {expected} in the [memory] event's {field}, found {}",
        RawEvent::found(found)
    )
}

impl EventSink for Collector {
    fn event(&mut self, index: u64, end_offset: u64, e: RawEvent) -> Result<(), String> {
        let result = if e.not_object {
            Err("expected a JSON object as a trace event".to_owned())
        } else if e.is_memory() {
            self.memory_event(e)
        } else {
            if matches!(&e.ph, Scalar::Str(p) if p == "X") {
                self.span(e);
            }
            Ok(())
        };
        let Err(why) = result else {
            return Ok(());
        };
        let at =
            format!("trace event {index} (ending at byte {end_offset} of the JSON text): {why}");
        match self.strictness {
            Strictness::Strict => Err(at),
            Strictness::Lenient => {
                self.skipped += 1;
                if self.first_skipped.len() < MAX_REPORTED_BAD_LINES {
                    self.first_skipped.push(at);
                }
                Ok(())
            }
        }
    }
}
