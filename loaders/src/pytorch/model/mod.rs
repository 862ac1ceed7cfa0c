//! The snapshot's objects, typed: segments, blocks, trace entries, annotations and settings,
//! read from the decoded pickle with every key optional (reference section 1.6: keys came and
//! went between releases, so a missing one is defaulted and named in `missing`, an unknown one
//! ignored).

use std::collections::HashMap;
use std::iter::Flatten;
use std::option;

use allocview_sim::policy::pytorch::PytorchSettings;

use super::pickle::{Key, Pickle, Seq, Val};
use crate::sites::{Frame, NO_STACK, StackTable};

mod budget;
mod render;
mod settings;

use budget::Budget;

/// A block's state in the final segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    ActiveAllocated,
    /// Freed by the program, waiting for outstanding CUDA events.
    ActivePendingFree,
    Inactive,
}

impl BlockState {
    /// The name PyTorch writes.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::ActiveAllocated => "active_allocated",
            Self::ActivePendingFree => "active_pending_free",
            Self::Inactive => "inactive",
        }
    }

    /// Allocated as far as the allocator is concerned (not reusable yet).
    #[must_use]
    pub fn is_active(self) -> bool {
        !matches!(self, Self::Inactive)
    }
}

/// One block of a final segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawBlock {
    pub address: u64,
    pub size_bytes: u64,
    pub requested_bytes: u64,
    pub state: BlockState,
    pub stack_id: u32,
}

/// One segment at the end of the trace (the moment of the snapshot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSegment {
    pub device: i64,
    pub address: u64,
    pub total_bytes: u64,
    pub allocated_bytes: u64,
    pub active_bytes: u64,
    pub requested_bytes: u64,
    pub stream: u64,
    /// `segment_type == 'small'`: the small pool (blocks of at most 1 MiB).
    pub small_pool: bool,
    pub pool_id: (i64, i64),
    pub expandable: bool,
    pub stack_id: u32,
    /// Its blocks in [`RawSnapshot::blocks`] (one table for all segments: a million
    /// segments' own vectors took about 50 bytes each in headers and allocator overhead).
    pub blocks: std::ops::Range<usize>,
}

/// What a trace entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    /// Older dev builds' annotations, later moved to `external_annotations`.
    UserDefined,
    Annotate,
}

impl Action {
    /// Every action, in the order reports list them.
    pub const ALL: [Self; 11] = [
        Self::Alloc,
        Self::FreeRequested,
        Self::FreeCompleted,
        Self::SegmentAlloc,
        Self::SegmentFree,
        Self::SegmentMap,
        Self::SegmentUnmap,
        Self::Snapshot,
        Self::Oom,
        Self::UserDefined,
        Self::Annotate,
    ];

    /// The name PyTorch writes.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Alloc => "alloc",
            Self::FreeRequested => "free_requested",
            Self::FreeCompleted => "free_completed",
            Self::SegmentAlloc => "segment_alloc",
            Self::SegmentFree => "segment_free",
            Self::SegmentMap => "segment_map",
            Self::SegmentUnmap => "segment_unmap",
            Self::Snapshot => "snapshot",
            Self::Oom => "oom",
            Self::UserDefined => "user_defined",
            Self::Annotate => "annotate",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }
}

/// One entry of a device trace, in 32 bytes: a 1 GB snapshot holds 15 million of them, and
/// they live beside the decoded pickle at the load's peak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawEntry {
    pub action: Action,
    /// Index into [`RawSnapshot::streams`] (see [`RawEntry::stream`]).
    pub stream_index: u16,
    pub stack_id: u32,
    /// `addr`; for `oom`, which has no address, `device_free` (what cudaMemGetInfo said was
    /// free; [`NO_DEVICE_FREE`] when absent). Read it through [`RawEntry::address`] and
    /// [`RawEntry::device_free`].
    pub addr: u64,
    pub size_bytes: u64,
    /// Unix-epoch microseconds; [`NO_TIME`] before PyTorch 2.2 (see [`RawEntry::time`]).
    pub time_us: i64,
}

const _: () = assert!(std::mem::size_of::<RawEntry>() == 32);

/// [`RawEntry::time_us`] of an entry without a time.
pub const NO_TIME: i64 = i64::MIN;
/// [`RawEntry::device_free`] of an `oom` entry without `device_free`.
pub const NO_DEVICE_FREE: u64 = u64::MAX;

impl RawEntry {
    /// The entry's time, when the file has one.
    #[must_use]
    pub fn time(&self) -> Option<i64> {
        (self.time_us != NO_TIME).then_some(self.time_us)
    }

    /// The address; 0 for `oom`.
    #[must_use]
    pub fn address(&self) -> u64 {
        if self.action == Action::Oom {
            0
        } else {
            self.addr
        }
    }

    /// `oom`'s free device bytes.
    #[must_use]
    pub fn device_free(&self) -> Option<u64> {
        (self.action == Action::Oom && self.addr != NO_DEVICE_FREE).then_some(self.addr)
    }

    /// The stream, from the snapshot's stream table.
    #[must_use]
    pub fn stream(&self, streams: &[u64]) -> u64 {
        streams
            .get(usize::from(self.stream_index))
            .copied()
            .unwrap_or(0)
    }
}

/// One `external_annotations` item: a phase boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Annotation {
    /// `START` or `END`.
    pub stage: String,
    pub name: String,
    pub device: i64,
    pub time_us: i64,
}

/// `allocator_settings` as written, and as the `pytorch` policy reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// Present in the file (PyTorch 2.3 and later).
    pub present: bool,
    /// Every key with its value rendered as text, in file order.
    pub raw: Vec<(String, String)>,
    pub policy: PytorchSettings,
}

/// The whole snapshot, typed.
#[derive(Clone, Debug, Default)]
pub struct RawSnapshot {
    pub segments: Vec<RawSegment>,
    /// Every segment's blocks, in segment order (see [`RawSegment::blocks`]).
    pub blocks: Vec<RawBlock>,
    /// One trace per device, in device order.
    pub device_traces: Vec<Vec<RawEntry>>,
    /// Stream values, indexed by [`RawEntry::stream_index`].
    pub streams: Vec<u64>,
    pub annotations: Vec<Annotation>,
    pub settings: Settings,
    pub stacks: StackTable,
    /// Format notes: keys this file lacks that newer PyTorch writes, and what was assumed.
    pub missing: Vec<String>,
    /// Trace entries whose action allocview does not know (kept out of the events, counted).
    pub unknown_actions: HashMap<String, u64>,
    /// Entries or blocks skipped because a required field was absent or of the wrong type.
    pub skipped: Vec<String>,
}

/// Reads the decoded pickle. `Err` only when the top level is not a snapshot at all.
pub fn read_snapshot(pickle: &Pickle) -> Result<RawSnapshot, String> {
    let root = pickle.root();
    let mut r = Reader {
        keys: HotKeys::of(pickle),
        budget: Budget::of(pickle),
        ..Reader::default()
    };
    let mut snap = RawSnapshot::default();
    let segments = if let Some(segs) = root.get("segments") {
        segs
    } else if root.seq().is_some() {
        // PyTorch 1.13's torch.cuda.memory_snapshot(): a bare list of segments, no traces.
        r.note("the file is a list of segments (PyTorch 1.13 format): no trace, no settings");
        root
    } else {
        return Err(format!(
            "not a PyTorch memory snapshot: the top level is a {} without a `segments` key",
            root.kind_name()
        ));
    };
    for (i, seg) in r.items(segments, "segments").enumerate() {
        if r.budget.exceeded() {
            break;
        }
        if let Some(s) = r.segment(seg, i, &mut snap.blocks) {
            snap.segments.push(s);
        }
    }
    match root.get("device_traces") {
        Some(traces) => {
            for (dev, trace) in r.items(traces, "device_traces").enumerate() {
                let mut out = Vec::with_capacity(trace.seq().map_or(0, |s| s.len()));
                for (i, e) in r.items(trace, "device trace").enumerate() {
                    if r.budget.exceeded() {
                        break;
                    }
                    if let Some(entry) = r.entry(e, dev, i) {
                        out.push(entry);
                    }
                }
                snap.device_traces.push(out);
            }
        }
        None if root.get("segments").is_some() => {
            r.note("no `device_traces` (recorded without history): segments only");
        }
        None => {}
    }
    match root.get("external_annotations") {
        Some(a) => {
            for (i, item) in r.items(a, "external_annotations").enumerate() {
                if r.budget.exceeded() {
                    break;
                }
                snap.annotations.extend(r.annotation(item, i));
            }
        }
        None if root.get("segments").is_some() => {
            r.note("no `external_annotations` (before PyTorch 2.5): no phases");
        }
        None => {}
    }
    snap.settings = match root.get("allocator_settings") {
        Some(s) => r.settings(s),
        None => {
            r.note("no `allocator_settings` (before PyTorch 2.3): PyTorch's defaults assumed");
            Settings::default()
        }
    };
    if let Some(e) = r.budget.error() {
        return Err(e);
    }
    snap.stacks = r.stacks;
    snap.streams = r.streams;
    snap.missing = r.missing;
    snap.unknown_actions = r.unknown_actions;
    snap.skipped = r.skipped;
    if r.skipped_count > MAX_SKIP_NOTES as u64 {
        snap.skipped.push(format!(
            "{} skipped items in all; the first {MAX_SKIP_NOTES} are listed",
            r.skipped_count
        ));
    }
    Ok(snap)
}

/// The keys read millions of times (trace entries, frames, segments and blocks), resolved once so a lookup
/// compares string ids rather than strings. `None`: no dict in the file has that key.
#[derive(Clone, Copy, Default)]
struct HotKeys {
    action: Option<Key>,
    addr: Option<Key>,
    size: Option<Key>,
    stream: Option<Key>,
    time_us: Option<Key>,
    device_free: Option<Key>,
    frames: Option<Key>,
    name: Option<Key>,
    filename: Option<Key>,
    line: Option<Key>,
    // Segments' and blocks' keys: a big snapshot has millions of each, and comparing key
    // strings was a tenth of its load.
    address: Option<Key>,
    total_size: Option<Key>,
    allocated_size: Option<Key>,
    active_size: Option<Key>,
    requested_size: Option<Key>,
    segment_type: Option<Key>,
    segment_pool_id: Option<Key>,
    device: Option<Key>,
    is_expandable: Option<Key>,
    blocks: Option<Key>,
    state: Option<Key>,
    history: Option<Key>,
}

impl HotKeys {
    fn of(p: &Pickle) -> Self {
        Self {
            action: p.key("action"),
            addr: p.key("addr"),
            size: p.key("size"),
            stream: p.key("stream"),
            time_us: p.key("time_us"),
            device_free: p.key("device_free"),
            frames: p.key("frames"),
            name: p.key("name"),
            filename: p.key("filename"),
            line: p.key("line"),
            address: p.key("address"),
            total_size: p.key("total_size"),
            allocated_size: p.key("allocated_size"),
            active_size: p.key("active_size"),
            requested_size: p.key("requested_size"),
            segment_type: p.key("segment_type"),
            segment_pool_id: p.key("segment_pool_id"),
            device: p.key("device"),
            is_expandable: p.key("is_expandable"),
            blocks: p.key("blocks"),
            state: p.key("state"),
            history: p.key("history"),
        }
    }
}

/// `v[key]` through a resolved key.
fn hot<'a>(v: Val<'a>, key: Option<Key>) -> Option<Val<'a>> {
    v.get_key(key?)
}

/// Walks the pickle, interning stacks and collecting notes.
#[derive(Default)]
struct Reader {
    keys: HotKeys,
    stacks: StackTable,
    /// Memo-shared `frames` lists resolve once: container id -> stack id.
    by_container: HashMap<u32, u32>,
    /// Equal `frames` lists stored once by the decoder resolve once too: content -> stack id.
    by_content: HashMap<(bool, u32, u32), u32>,
    /// Frames by interned (name, file) string ids and line, so a frame seen again costs a
    /// hash lookup rather than three strings.
    frame_ids: HashMap<(u32, u32, i64), u32>,
    missing: Vec<String>,
    unknown_actions: HashMap<String, u64>,
    skipped: Vec<String>,
    /// Every skipped item, described or not.
    skipped_count: u64,
    streams: Vec<u64>,
    stream_ids: HashMap<u64, u16>,
    /// Keys already reported missing, so each is said once.
    said: std::collections::HashSet<&'static str>,
    /// Bytes the typed records may take (see [`budget`]).
    budget: Budget,
}

/// At most this many skipped items are described; the rest are counted in the last line.
const MAX_SKIP_NOTES: usize = 20;

impl Reader {
    fn note(&mut self, text: &str) {
        self.missing.push(text.to_owned());
    }

    fn missing_once(&mut self, key: &'static str, what: &str) {
        if self.said.insert(key) {
            self.missing.push(format!("no `{key}`: {what}"));
        }
    }

    fn skip(&mut self, why: String) {
        self.skipped_count += 1;
        if self.skipped.len() < MAX_SKIP_NOTES {
            self.skipped.push(why);
        }
    }

    /// The items of a list or tuple, walked in place (a 1 GB snapshot's trace has 15 million:
    /// collecting their handles would cost hundreds of MB at the load's peak).
    fn items<'a>(&mut self, v: Val<'a>, what: &str) -> Flatten<option::IntoIter<Seq<'a>>> {
        let seq = v.seq();
        if seq.is_none() {
            self.skip(format!("{what} is a {}, expected a list", v.kind_name()));
        }
        seq.into_iter().flatten()
    }

    /// The stack id of a `frames` value (a list of `{name, filename, line}` dicts).
    fn stack(&mut self, frames: Option<Val<'_>>) -> u32 {
        let Some(frames) = frames else {
            return NO_STACK;
        };
        let container = frames.container_id();
        if let Some(id) = container.and_then(|c| self.by_container.get(&c)) {
            return *id;
        }
        let content = frames.content_key();
        if let Some(&id) = content.and_then(|k| self.by_content.get(&k)) {
            if let Some(c) = container {
                self.by_container.insert(c, id);
            }
            return id;
        }
        // An empty list (frames not recorded for it) is no stack, like a missing key.
        let Some(items) = frames.seq().filter(|it| it.len() > 0) else {
            return NO_STACK;
        };
        if !self.budget.charge(items.len() * size_of::<u32>(), || {
            "a `frames` list".to_owned()
        }) {
            return NO_STACK;
        }
        let mut ids = Vec::with_capacity(items.len());
        for f in items {
            let name = hot(f, self.keys.name);
            let file = hot(f, self.keys.filename);
            let line = hot(f, self.keys.line).and_then(|v| v.as_i64()).unwrap_or(0);
            let key = name
                .and_then(|v| v.str_id())
                .zip(file.and_then(|v| v.str_id()))
                .map(|(n, fl)| (n, fl, line));
            if let Some(&id) = key.and_then(|k| self.frame_ids.get(&k)) {
                ids.push(id);
                continue;
            }
            let text = |v: Option<Val<'_>>| v.and_then(|v| v.as_str()).unwrap_or("").to_owned();
            let (function, file) = (text(name), text(file));
            if !self
                .budget
                .charge(size_of::<Frame>() + function.len() + file.len(), || {
                    format!("frame {:?}", short(&function))
                })
            {
                return NO_STACK;
            }
            let id = self.stacks.intern_frame(Frame {
                function,
                file,
                line,
                module: String::new(),
            });
            if let Some(k) = key {
                self.frame_ids.insert(k, id);
            }
            ids.push(id);
        }
        let id = self.stacks.intern_stack(ids);
        if let Some(c) = container {
            self.by_container.insert(c, id);
        }
        if let Some(k) = content {
            self.by_content.insert(k, id);
        }
        id
    }

    /// The segment `seg`, its blocks appended to `all_blocks`.
    fn segment(
        &mut self,
        seg: Val<'_>,
        index: usize,
        all_blocks: &mut Vec<RawBlock>,
    ) -> Option<RawSegment> {
        let k = self.keys;
        let u = |key: Option<Key>| hot(seg, key).and_then(|v| v.as_u64());
        let Some(address) = u(k.address) else {
            self.skip(format!("segment {index}: no `address`"));
            return None;
        };
        if !self
            .budget
            .charge(size_of::<RawSegment>(), || format!("segment {index}"))
        {
            return None;
        }
        let small_pool = match hot(seg, k.segment_type).and_then(|v| v.as_str()) {
            Some(t) => t == "small",
            None => {
                self.missing_once("segment_type", "pool inferred from the segment size");
                u(k.total_size) == Some(2 << 20)
            }
        };
        let pool_id = hot(seg, k.segment_pool_id)
            .and_then(|v| {
                let mut it = v.seq()?;
                Some((it.next()?.as_i64()?, it.next()?.as_i64()?))
            })
            .unwrap_or((0, 0));
        let stack_id = self.stack(hot(seg, k.frames));
        let first_block = all_blocks.len();
        let mut cursor = address;
        let items = match hot(seg, k.blocks) {
            Some(b) => self.items(b, "blocks"),
            None => None.into_iter().flatten(),
        };
        for (bi, b) in items.enumerate() {
            if !self.budget.charge(size_of::<RawBlock>(), || {
                format!("segment {index}, block {bi}")
            }) {
                all_blocks.truncate(first_block);
                return None;
            }
            let Some(block) = self.block(b, cursor, index, bi) else {
                continue;
            };
            cursor = block.address.saturating_add(block.size_bytes);
            all_blocks.push(block);
        }
        let blocks = all_blocks.get(first_block..).unwrap_or_default();
        // Missing totals are the blocks' sizes added up: the file's values, so every sum is
        // checked, and a segment whose blocks add up past 2^64 - 1 bytes is skipped, named.
        let sum_where = |f: &dyn Fn(&RawBlock) -> bool, size: &dyn Fn(&RawBlock) -> u64| {
            blocks
                .iter()
                .filter(|b| f(b))
                .try_fold(0u64, |sum, b| sum.checked_add(size(b)))
        };
        let totals = [
            (k.total_size, sum_where(&|_| true, &|b| b.size_bytes)),
            (
                k.allocated_size,
                sum_where(&|b| b.state == BlockState::ActiveAllocated, &|b| {
                    b.size_bytes
                }),
            ),
            (
                k.active_size,
                sum_where(&|b| b.state.is_active(), &|b| b.size_bytes),
            ),
            (
                k.requested_size,
                sum_where(&|b| b.state.is_active(), &|b| b.requested_bytes),
            ),
        ]
        .map(|(key, sum)| u(key).or(sum));
        let [
            Some(total_bytes),
            Some(allocated_bytes),
            Some(active_bytes),
            Some(requested_bytes),
        ] = totals
        else {
            all_blocks.truncate(first_block);
            self.skip(format!(
                "segment {index}: its blocks' sizes add up past 2^64 - 1 bytes (and the \
                 segment does not give its totals)"
            ));
            return None;
        };
        Some(RawSegment {
            device: hot(seg, k.device).and_then(|v| v.as_i64()).unwrap_or(0),
            address,
            total_bytes,
            allocated_bytes,
            active_bytes,
            requested_bytes,
            stream: hot(seg, k.stream).map_or(0, stream_value),
            small_pool,
            pool_id,
            expandable: hot(seg, k.is_expandable)
                .and_then(|v| v.as_bool())
                .unwrap_or(false),
            stack_id,
            blocks: first_block..all_blocks.len(),
        })
    }

    fn block(&mut self, b: Val<'_>, cursor: u64, seg: usize, index: usize) -> Option<RawBlock> {
        let k = self.keys;
        let Some(size_bytes) = hot(b, k.size).and_then(|v| v.as_u64()) else {
            self.skip(format!("segment {seg}, block {index}: no `size`"));
            return None;
        };
        let address = match hot(b, k.address).and_then(|v| v.as_u64()) {
            Some(a) => a,
            None => {
                self.missing_once(
                    "address",
                    "block addresses computed from the segment address and block sizes",
                );
                cursor
            }
        };
        // Before PyTorch 2.1 a block's story was in `history`: its last entry is the live one.
        let history_last = hot(b, k.history).and_then(|h| h.seq()?.next_back());
        let requested_bytes = match hot(b, k.requested_size).and_then(|v| v.as_u64()) {
            Some(r) => r,
            None => {
                self.missing_once(
                    "requested_size",
                    "requested bytes taken from the block history or its size",
                );
                history_last
                    .and_then(|h| h.get("real_size")?.as_u64())
                    .unwrap_or(size_bytes)
            }
        };
        let state = match hot(b, k.state).and_then(|v| v.as_str()) {
            Some("active_allocated") => BlockState::ActiveAllocated,
            // The `_snapshot` docstring's spelling, in case a build ever wrote it.
            Some("active_pending_free" | "active_awaiting_free") => BlockState::ActivePendingFree,
            Some("inactive") => BlockState::Inactive,
            other => {
                self.skip(format!(
                    "segment {seg}, block {index}: unknown state {other:?}, taken as inactive"
                ));
                BlockState::Inactive
            }
        };
        let frames = hot(b, k.frames).or_else(|| history_last.and_then(|h| hot(h, k.frames)));
        let stack_id = self.stack(frames);
        Some(RawBlock {
            address,
            size_bytes,
            requested_bytes,
            state,
            stack_id,
        })
    }

    fn entry(&mut self, e: Val<'_>, device: usize, index: usize) -> Option<RawEntry> {
        let Some(name) = hot(e, self.keys.action).and_then(|v| v.as_str()) else {
            self.skip(format!("device {device} trace entry {index}: no `action`"));
            return None;
        };
        if !self.budget.charge(size_of::<RawEntry>(), || {
            format!("device {device} trace entry {index}")
        }) {
            return None;
        }
        let Some(action) = Action::parse(name) else {
            // Looked up before it is copied: one long name shared by every entry is copied once.
            match self.unknown_actions.get_mut(name) {
                Some(n) => *n += 1,
                None => {
                    self.unknown_actions.insert(name.to_owned(), 1);
                }
            }
            return None;
        };
        let time_us = hot(e, self.keys.time_us).and_then(|v| v.as_i64());
        if time_us.is_none() {
            self.missing_once("time_us", "trace order used as time (before PyTorch 2.2)");
        }
        let addr = hot(e, self.keys.addr).and_then(|v| v.as_u64());
        let addr = if action == Action::Oom {
            hot(e, self.keys.device_free)
                .and_then(|v| v.as_u64())
                .unwrap_or(NO_DEVICE_FREE)
        } else if let Some(a) = addr {
            a
        } else {
            self.skip(format!(
                "device {device} trace entry {index} ({name}): no `addr`"
            ));
            return None;
        };
        let stream = hot(e, self.keys.stream).map_or(0, stream_value);
        Some(RawEntry {
            action,
            stream_index: self.stream_index(stream),
            stack_id: self.stack(hot(e, self.keys.frames)),
            addr,
            size_bytes: hot(e, self.keys.size).and_then(|v| v.as_u64()).unwrap_or(0),
            time_us: time_us.unwrap_or(NO_TIME),
        })
    }

    /// Streams numbered in first-seen order; past 65,535 of them the rest share the last
    /// number, which is said.
    fn stream_index(&mut self, stream: u64) -> u16 {
        if let Some(&i) = self.stream_ids.get(&stream) {
            return i;
        }
        let Ok(i) = u16::try_from(self.streams.len()) else {
            if self.said.insert("too many streams") {
                self.missing.push(
                    "more than 65,536 streams: those past it are shown as the last one".to_owned(),
                );
            }
            return u16::MAX;
        };
        self.streams.push(stream);
        self.stream_ids.insert(stream, i);
        i
    }

    fn annotation(&mut self, a: Val<'_>, index: usize) -> Option<Annotation> {
        let text = |k: &str| a.get(k).and_then(|v| v.as_str()).unwrap_or("");
        let Some(time_us) = a.get("time_us").and_then(|v| v.as_i64()) else {
            self.skip("an annotation without `time_us`".to_owned());
            return None;
        };
        let (stage, name) = (text("stage"), text("name"));
        if !self
            .budget
            .charge(size_of::<Annotation>() + stage.len() + name.len(), || {
                format!("annotation {index}")
            })
        {
            return None;
        }
        Some(Annotation {
            stage: stage.to_owned(),
            name: name.to_owned(),
            device: a.get("device").and_then(|v| v.as_i64()).unwrap_or(0),
            time_us,
        })
    }
}

/// A stream: `int64(cudaStream_t)`, kept as its 64 bits (negative values as written by a
/// signed conversion, large ones as unsigned).
fn stream_value(v: Val<'_>) -> u64 {
    v.as_u64()
        .or_else(|| v.as_i64().map(|s| s as u64))
        .unwrap_or(0)
}

/// The first 80 characters of `s`, to name a record in a message.
fn short(s: &str) -> String {
    s.chars().take(80).collect()
}
