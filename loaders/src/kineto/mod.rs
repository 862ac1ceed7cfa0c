//! PyTorch profiler (Kineto) traces: the Chrome-trace JSON `torch.profiler` writes
//! (`*.pt.trace.json`, plain or gzip), recorded with `profile_memory=True`.
//!
//! Every `[memory]` instant event says what one device's allocator did: `Bytes` (positive for
//! an allocation, negative for a free) at `Addr`, with the device's `Total Allocated` and
//! `Total Reserved` after it, on `Device Type` (0 CPU, 1 CUDA, 6 HIP, ...) and `Device Id`.
//! One device's events are read per load ([`LoadOptions::device`]; by default the GPU with the
//! most events, else the CPU) into the common event table, paired by address; a trace of the
//! 2021 schema, whose events have no `Addr`, pairs each free with the latest live allocation
//! of its size, and says its lifetimes are approximate.
//!
//! The site of an event is the innermost operator (`cpu_op`) on its thread whose span holds
//! its time; its stack is every span holding it (Python functions, annotations, operators),
//! outer to inner ([`stacks`]). `Total Reserved` becomes the trace's recorded memory series
//! ([`RecordedSeries::AllocatorReserved`]).

mod collect;
mod parse;
mod stacks;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::binary::MemorySample;
use crate::error::LoadError;
use crate::events::{LoadOptions, MallocTrace, Record, RecordedSeries, Strictness};
use crate::foreign::{ForeignEvents, into_trace};
use crate::input::{Compression, sniff};
use collect::{Collector, MemEvent};
use parse::ParseStop;

/// A device of the trace: PyTorch's device type and index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    /// `c10::DeviceType`: 0 CPU, 1 CUDA, 6 HIP, 12 XPU, 13 MPS, ...
    pub device_type: i64,
    /// `-1` for the CPU.
    pub index: i64,
}

/// Device type names (`c10::DeviceType`) as `--device` takes them.
const DEVICE_TYPES: [(&str, i64); 6] = [
    ("cpu", 0),
    ("cuda", 1),
    ("hip", 6),
    ("xpu", 12),
    ("mps", 13),
    ("privateuse1", 20),
];

impl Device {
    /// A GPU (or another accelerator): anything but the CPU.
    #[must_use]
    pub fn is_gpu(self) -> bool {
        self.device_type != 0
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match DEVICE_TYPES.iter().find(|d| d.1 == self.device_type) {
            Some((name, 0)) if self.index < 0 => f.write_str(name),
            Some((name, _)) => write!(f, "{name}:{}", self.index),
            None => write!(f, "{}:{}", self.device_type, self.index),
        }
    }
}

/// Which device's events to read (`--device`): `cuda:0`, `hip:1`, `cpu`, a type alone (the
/// one of that type with the most events), or numbers (`6:0`, PyTorch's device type and id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceChoice {
    pub device_type: i64,
    pub index: Option<i64>,
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, index) = match s.split_once(':') {
            Some((k, i)) => (k, Some(i)),
            None => (s, None),
        };
        let device_type = DEVICE_TYPES
            .iter()
            .find(|d| d.0.eq_ignore_ascii_case(kind.trim()))
            .map(|d| d.1)
            .or_else(|| kind.trim().parse().ok());
        let index = index.map(|i| i.trim().parse::<i64>());
        match (device_type, index) {
            (Some(device_type), None) => Ok(Self {
                device_type,
                index: None,
            }),
            (Some(device_type), Some(Ok(i))) => Ok(Self {
                device_type,
                index: Some(i),
            }),
            _ => Err(format!(
                "expected a device such as cuda:0, hip:0, cpu or 1:0 (PyTorch's device type \
                 and index), found {s:?}"
            )),
        }
    }
}

/// Most decompressed bytes [`is_kineto`] looks at.
pub const DETECT_HEAD_BYTES: u64 = 1 << 20;

/// True when `head` (the first decompressed bytes of a file) is a PyTorch profiler trace: a
/// JSON object with `traceEvents` and a mark of the profiler (its schema version, its device
/// properties, its memory events or options, its operators).
#[must_use]
pub fn is_kineto(head: &[u8]) -> bool {
    let start = head.iter().position(|b| !b.is_ascii_whitespace());
    if start.and_then(|i| head.get(i)) != Some(&b'{') {
        return false;
    }
    let has = |needle: &[u8]| head.windows(needle.len()).any(|w| w == needle);
    has(b"\"traceEvents\"")
        && [
            &b"\"schemaVersion\""[..],
            b"\"deviceProperties\"",
            b"\"[memory]\"",
            b"\"profile_memory\"",
            b"\"cpu_op\"",
            b"\"PyTorch Profiler",
        ]
        .iter()
        .any(|n| has(n))
}

/// Counts the bytes read from the file, for the progress bar.
struct Progress<R> {
    inner: R,
    counter: Option<Arc<AtomicU64>>,
}

impl<R: Read> Read for Progress<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(c) = &self.counter {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(n)
    }
}

/// Loads one device's `[memory]` events of the profiler trace at `path`.
///
/// # Errors
/// When the file cannot be read, is not JSON (the error names the byte offset of the
/// decompressed text, its line and column), has no `[memory]` events or none of the device
/// asked for, or (strict) an event's field does not read.
pub fn load_kineto(path: &Path, opts: &LoadOptions) -> Result<MallocTrace, LoadError> {
    let started = Instant::now();
    let (compression, _) = sniff(path)?;
    let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
    let counted = BufReader::with_capacity(
        256 << 10,
        Progress {
            inner: file,
            counter: opts.progress.clone(),
        },
    );
    let reader: Box<dyn Read> = match compression {
        Compression::Gzip => Box::new(BufReader::with_capacity(
            256 << 10,
            flate2::bufread::MultiGzDecoder::new(counted),
        )),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::with_buffer(counted)
                .map_err(|e| LoadError::io(path, e))?,
        ),
        Compression::Plain => Box::new(counted),
    };
    let mut c = Collector::new(opts.strictness);
    let mut notes = Vec::new();
    match parse::parse(reader, &mut c) {
        Ok(p) if !p.has_events => {
            return Err(LoadError::format(
                path,
                "a JSON object without a traceEvents array: not a PyTorch profiler trace",
            ));
        }
        Ok(_) => {}
        Err(ParseStop::Sink(why)) => {
            return Err(LoadError::format(
                path,
                format!("{why} (use --lenient to skip bad events)"),
            ));
        }
        Err(ParseStop::Syntax {
            offset,
            line,
            column,
            message,
            eof,
            parsed,
        }) => {
            let what = if eof {
                "the trace ends early (a cut or truncated file)"
            } else {
                "the JSON is malformed"
            };
            let at = format!(
                "{what} at byte {offset} of the JSON text (line {line}, column {column}): \
                 {message}"
            );
            if opts.strictness == Strictness::Strict || !parsed.has_events {
                return Err(LoadError::format(
                    path,
                    format!("{at} (use --lenient to load the events before it)"),
                ));
            }
            notes.push(format!(
                "{at}; loaded the {} trace events before it",
                parsed.events
            ));
        }
    }
    build(path, c, notes, opts, started)
}

/// The chosen device's events into the event table.
fn build(
    path: &Path,
    c: Collector,
    mut notes: Vec<String>,
    opts: &LoadOptions,
    started: Instant,
) -> Result<MallocTrace, LoadError> {
    let mut per_device: BTreeMap<Device, usize> = BTreeMap::new();
    for e in &c.memory {
        *per_device.entry(e.device).or_default() += 1;
    }
    let device = choose(path, &per_device, opts.device)?;
    let mut events: Vec<MemEvent> = c
        .memory
        .iter()
        .filter(|e| e.device == device)
        .copied()
        .collect();
    // The profiler writes events per thread; pairing needs them in time order (ties keep
    // the file's order).
    events.sort_by_key(|e| e.t_ns);
    notes.push(device_note(device, &per_device));
    if c.skipped > 0 {
        let mut msg = format!("skipped {} malformed trace events", c.skipped);
        for s in &c.first_skipped {
            msg.push_str(&format!("\n  {s}"));
        }
        notes.push(msg);
    }
    if c.spans_unreadable > 0 {
        notes.push(format!(
            "{} operator or function spans have no readable time or name: the allocations in \
             them lack those frames",
            c.spans_unreadable
        ));
    }
    let origin_ns = events.first().map_or(0, |e| e.t_ns);
    let (stacks, stack_ids) = stacks::event_stacks(&events, &c.spans, &c.names);
    let records = records(&events, &stack_ids, &c.thread_tids, origin_ns, &mut notes);
    if let Some(base) = allocated_before(&events) {
        notes.push(format!(
            "{base} bytes were allocated on {device} before the profiler's first event (its \
             Total Allocated less its Bytes): those allocations are not in the trace, so live \
             bytes here count from them, while the recorded reserved bytes include them"
        ));
    }
    let memory = reserved_series(&events, origin_ns);
    let foreign = ForeignEvents {
        records,
        stacks,
        memory,
        notes,
        memory_series: RecordedSeries::AllocatorReserved,
    };
    let mut trace = into_trace(path, foreign, opts.strictness, started)?;
    trace.summary.gpu_device = device.is_gpu().then(|| device.to_string());
    Ok(trace)
}

/// The device asked for, or the GPU with the most events, else the CPU.
fn choose(
    path: &Path,
    per_device: &BTreeMap<Device, usize>,
    asked: Option<DeviceChoice>,
) -> Result<Device, LoadError> {
    let listed = || {
        per_device
            .iter()
            .map(|(d, n)| format!("{d} ({n} events)"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if per_device.is_empty() {
        return Err(LoadError::format(
            path,
            "the profiler trace has no [memory] events: record it with \
             torch.profiler.profile(profile_memory=True)",
        ));
    }
    let best = |keep: &dyn Fn(&Device) -> bool| {
        per_device
            .iter()
            .filter(|(d, _)| keep(d))
            .max_by_key(|(d, n)| (**n, std::cmp::Reverse(**d)))
            .map(|(d, _)| *d)
    };
    let chosen = match asked {
        Some(a) => {
            best(&|d| d.device_type == a.device_type && a.index.is_none_or(|i| i == d.index))
        }
        None => best(&|d| d.is_gpu()).or_else(|| best(&|_| true)),
    };
    chosen.ok_or_else(|| {
        LoadError::format(
            path,
            format!(
                "no [memory] events of the device asked for; the trace has {}",
                listed()
            ),
        )
    })
}

fn device_note(device: Device, per_device: &BTreeMap<Device, usize>) -> String {
    let others: Vec<String> = per_device
        .iter()
        .filter(|(d, _)| **d != device)
        .map(|(d, n)| format!("{d} ({n})"))
        .collect();
    let mut note = format!(
        "PyTorch profiler trace: read the {} [memory] events of {device}",
        per_device.get(&device).copied().unwrap_or(0)
    );
    if let Some(first) = per_device.keys().find(|d| **d != device) {
        note.push_str(&format!(
            "; the other devices' ({}) are left out: --device {first} reads them",
            others.join(", ")
        ));
    }
    note
}

/// The records of `events` (in time order): allocations and frees by address, or, in a trace
/// without addresses, each free paired with the latest live allocation of its size.
fn records(
    events: &[MemEvent],
    stack_ids: &[u32],
    thread_tids: &[u64],
    origin_ns: i64,
    notes: &mut Vec<String>,
) -> Vec<Record> {
    let by_size = events.iter().all(|e| e.addr.is_none());
    if by_size {
        notes.push(
            "this trace's [memory] events have no addresses (the 2021 profiler schema): each \
             free was paired with the latest live allocation of the same size on the device, \
             so the lifetimes are approximate"
                .to_owned(),
        );
    }
    // Addresses of the allocations paired by size: above any real one, one apart.
    let mut next_addr: u64 = 1 << 62;
    let mut live_by_size: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut out = Vec::with_capacity(events.len());
    for (e, &stack) in events.iter().zip(stack_ids) {
        let size_bytes = e.bytes.unsigned_abs();
        let addr = match (e.addr, by_size) {
            (Some(a), false) => a,
            _ if e.bytes >= 0 => {
                next_addr += 1;
                live_by_size.entry(size_bytes).or_default().push(next_addr);
                next_addr
            }
            _ => live_by_size
                .get_mut(&size_bytes)
                .and_then(Vec::pop)
                .unwrap_or_else(|| {
                    next_addr += 1;
                    next_addr
                }),
        };
        let tid = thread_tids.get(e.thread as usize).copied().unwrap_or(0);
        out.push(Record {
            t_ns: e.t_ns.saturating_sub(origin_ns),
            tid,
            size_bytes: (e.bytes >= 0).then_some(size_bytes),
            addr,
            call: None,
            stack: Some(stack),
            heap: 0,
        });
    }
    out
}

/// What the device held before the first event, by the file's own totals (none when it held
/// nothing or the trace has no totals).
fn allocated_before(events: &[MemEvent]) -> Option<u64> {
    let first = events.first()?;
    let total = i128::from(first.total_allocated_bytes?);
    let before = total - i128::from(first.bytes);
    u64::try_from(before).ok().filter(|&b| b > 0)
}

/// `Total Reserved` at each event, as the recorded series (none when the device reports
/// nothing reserved: the CPU's allocator reserves nothing).
fn reserved_series(events: &[MemEvent], origin_ns: i64) -> Vec<MemorySample> {
    let samples: Vec<MemorySample> = events
        .iter()
        .filter_map(|e| {
            e.total_reserved_bytes.map(|r| MemorySample {
                t_ns: e.t_ns.saturating_sub(origin_ns),
                resident_bytes: r,
                anon_bytes: r,
            })
        })
        .collect();
    if samples.iter().all(|s| s.resident_bytes == 0) {
        return Vec::new();
    }
    samples
}

#[cfg(test)]
mod tests;
