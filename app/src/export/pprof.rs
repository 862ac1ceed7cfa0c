//! pprof's `profile.proto`, gzipped, with Go's heap profile sample types: what `go tool
//! pprof`, Pyroscope, Parca, Datadog and Perfetto read.
//!
//! Samples are keyed by stack, thread (label `thread`, the recorded thread id) and size class
//! (label `size_class`, the range of request sizes). Values, in order: `alloc_objects/count`
//! and `alloc_space/bytes` (allocations from the input's start to the moment),
//! `inuse_objects/count` and `inuse_space/bytes` (live at the moment, the default type); with
//! a policy, `allocated_space/bytes` (its blocks, after its rounding) and
//! `pinned_free_space/bytes` (the free bytes those blocks pin). A sample's stack starts at
//! its site, the frame `sites` names (the allocator's and the interpreter's frames inside it
//! are kept with `--all-frames`). Each frame is a location of one line; native frames sit in a mapping per module, with its build id where the input
//! recorded one, at their address in the module (load bias removed) inside a range of their
//! own, so a symbolizer can find them again; Python frames have no mapping.

use std::collections::HashMap;
use std::io::Write as _;

use allocview_loaders::sites::{PYTHON_FRAMES_MODULE, StackTable};
use anyhow::{Context as _, Result};

use super::moment::{Moment, size_class_label};
use super::proto::Message;

/// Where module `k`'s range starts (`k + 1` units of 2^40 bytes): ranges of their own, far
/// above any module's size.
const MAPPING_SPAN_BYTES: u64 = 1 << 40;

/// The function samples without a recorded stack sit in.
const NO_STACK_NAME: &str = "(no stack recorded)";

/// The id of the location of samples without a stack: after every frame's.
fn no_stack_location(stacks: &StackTable) -> u64 {
    stacks.num_frames() as u64 + 1
}

/// Strings, interned: index 0 is the empty string, as the format requires.
struct Strings {
    index: HashMap<String, i64>,
    table: Vec<String>,
}

impl Strings {
    fn new() -> Self {
        Self {
            index: HashMap::from([(String::new(), 0)]),
            table: vec![String::new()],
        }
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// What a pprof export is made of, besides the moment.
pub struct PprofInput<'a> {
    pub stacks: &'a StackTable,
    /// The recorded thread id of each thread index.
    pub thread_ids: &'a [u64],
    /// A line for `pprof -comments`: the input and the moment.
    pub comment: String,
    /// Keep the frames inside each site (the allocator's, the interpreter's): by default a
    /// sample's stack starts at its site, so that pprof's leaf functions are `sites`'.
    pub all_frames: bool,
}

/// The gzipped profile of `moment`.
///
/// # Errors
/// Only when compressing fails.
pub fn write(moment: &Moment, input: &PprofInput<'_>) -> Result<Vec<u8>> {
    let bytes = profile(moment, input).into_bytes();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&bytes).context("compressing the profile")?;
    gz.finish().context("compressing the profile")
}

fn value_type(strings: &mut Strings, kind: &str, unit: &str) -> Message {
    let mut m = Message::default();
    m.int(1, strings.id(kind)).int(2, strings.id(unit));
    m
}

/// The `Profile` message.
fn profile(moment: &Moment, input: &PprofInput<'_>) -> Message {
    let mut strings = Strings::new();
    let mut p = Message::default();
    let mut types = vec![
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ];
    if moment.policy.is_some() {
        types.extend([("allocated_space", "bytes"), ("pinned_free_space", "bytes")]);
    }
    for (kind, unit) in &types {
        p.message(1, &value_type(&mut strings, kind, unit));
    }
    let mut used_frames: Vec<u32> = Vec::new();
    for (key, t) in &moment.samples {
        let frames = if input.all_frames {
            input.stacks.stack(key.stack)
        } else {
            input.stacks.from_site(key.stack)
        };
        used_frames.extend_from_slice(frames);
        let mut s = Message::default();
        if frames.is_empty() {
            // Bytes without a recorded stack still weigh, under a location that says so.
            s.packed(1, [no_stack_location(input.stacks)]);
        } else {
            s.packed(1, frames.iter().map(|&f| u64::from(f) + 1));
        }
        let mut values = vec![
            t.alloc_objects,
            t.alloc_bytes,
            t.inuse_objects,
            t.inuse_bytes,
        ];
        if moment.policy.is_some() {
            values.extend([t.allocated_bytes, t.pinned_free_bytes]);
        }
        s.packed(2, values);
        let tid = input
            .thread_ids
            .get(usize::from(key.thread))
            .copied()
            .unwrap_or(u64::from(key.thread));
        let labels = [
            ("thread", tid.to_string()),
            ("size_class", size_class_label(key.size_class)),
        ];
        for (k, v) in labels.iter().filter(|_| moment.labelled) {
            let mut l = Message::default();
            l.int(1, strings.id(k)).int(2, strings.id(v));
            s.message(3, &l);
        }
        p.message(2, &s);
    }
    used_frames.sort_unstable();
    used_frames.dedup();
    code(&mut p, &mut strings, input.stacks, &used_frames);
    p.int(10, moment.since_start_ns);
    p.message(11, &value_type(&mut strings, "space", "bytes"));
    p.int(12, 1);
    p.int(13, strings.id(&input.comment));
    if let Some(policy) = &moment.policy {
        p.int(13, strings.id(&format!("policy {policy}")));
    }
    p.int(14, strings.id("inuse_space"));
    for s in &strings.table {
        p.bytes(6, s.as_bytes());
    }
    p
}

/// The mappings, locations and functions of `frames` (frame ids; location id = frame id + 1).
fn code(p: &mut Message, strings: &mut Strings, stacks: &StackTable, frames: &[u32]) {
    let mut mapping_of: HashMap<&str, u64> = HashMap::new();
    let mut function_of: HashMap<(&str, &str), u64> = HashMap::new();
    let mut functions: Vec<Message> = Vec::new();
    let mut mappings: Vec<Message> = Vec::new();
    for &id in frames {
        let Some(f) = stacks.frame(id) else {
            continue;
        };
        let mapping = if f.module.is_empty() || f.module == PYTHON_FRAMES_MODULE {
            0
        } else {
            let next = mapping_of.len() as u64 + 1;
            let m = *mapping_of.entry(f.module.as_str()).or_insert(next);
            if m == next {
                let mut msg = Message::default();
                msg.uint(1, m)
                    .uint(2, m * MAPPING_SPAN_BYTES)
                    .uint(3, (m + 1) * MAPPING_SPAN_BYTES)
                    .int(5, strings.id(&f.module))
                    .int(6, strings.id(stacks.build_id(&f.module).unwrap_or("")))
                    .flag(7, true)
                    .flag(8, true)
                    .flag(9, true);
                mappings.push(msg);
            }
            m
        };
        let next = function_of.len() as u64 + 1;
        let function = *function_of
            .entry((f.function.as_str(), f.file.as_str()))
            .or_insert(next);
        if function == next {
            let mut msg = Message::default();
            let file = if f.file == "??" { "" } else { f.file.as_str() };
            msg.uint(1, function)
                .int(2, strings.id(&f.function))
                .int(3, strings.id(&f.function))
                .int(4, strings.id(file));
            functions.push(msg);
        }
        let mut line = Message::default();
        line.uint(1, function).int(2, f.line.max(0));
        let mut loc = Message::default();
        loc.uint(1, u64::from(id) + 1).uint(2, mapping);
        if mapping != 0
            && let Some(offset) = stacks.module_offset(id)
        {
            loc.uint(
                3,
                mapping * MAPPING_SPAN_BYTES + offset % MAPPING_SPAN_BYTES,
            );
        }
        loc.message(4, &line);
        p.message(4, &loc);
    }
    {
        // The location of samples without a stack (written whether or not one uses it).
        let function = function_of.len() as u64 + 1;
        let mut f = Message::default();
        f.uint(1, function)
            .int(2, strings.id(NO_STACK_NAME))
            .int(3, strings.id(NO_STACK_NAME));
        functions.push(f);
        let mut line = Message::default();
        line.uint(1, function);
        let mut loc = Message::default();
        loc.uint(1, no_stack_location(stacks)).message(4, &line);
        p.message(4, &loc);
    }
    for m in &mappings {
        p.message(3, m);
    }
    for f in &functions {
        p.message(5, f);
    }
}
