//! Crafted binary traces for the tests of hostile input (issue 43): block bombs and block
//! indexes that do not agree with the blocks, each a `pub fn` so that the every-command
//! hostile test (`app/tests/hostile_input.rs`) and the loaders' tests build the same files.
//! Only for tests and fuzzing.

use std::io::Write as _;

use super::codec::{put_varint, zigzag};
use super::frames::write_frame;
use super::index::{BlockEntry, BlockIndex};
use super::{
    BLOCK_EVENTS, CODEC_STORED, CODEC_ZSTD, FRAME_END, FRAME_EVENTS, FRAME_INDEX, FRAME_META,
    FRAME_THREADS, KIND_TRACE, MAGIC, OP_FREE, OP_NO_CALL, VERSION,
};

/// A trace written frame by frame, with whatever index and END the test wants.
pub struct CraftedTrace {
    bytes: Vec<u8>,
    /// The blocks written so far, as an honest index would list them.
    pub blocks: Vec<BlockEntry>,
    /// Events in the blocks written so far.
    pub events: u64,
}

impl Default for CraftedTrace {
    fn default() -> Self {
        Self::new()
    }
}

impl CraftedTrace {
    /// The header, a META frame and a THREADS frame introducing thread 1 (index 0).
    #[must_use]
    pub fn new() -> Self {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[VERSION, KIND_TRACE]);
        let mut t = Self {
            bytes,
            blocks: Vec::new(),
            events: 0,
        };
        t.frame(FRAME_META, b"source=crafted\n");
        let mut threads = Vec::new();
        put_varint(&mut threads, 1);
        put_varint(&mut threads, 1);
        t.frame(FRAME_THREADS, &threads);
        t
    }

    /// Appends a frame.
    pub fn frame(&mut self, tag: u8, payload: &[u8]) {
        // Writing to a Vec does not fail.
        write_frame(&mut self.bytes, tag, &[payload]).ok();
    }

    /// Appends an EVENTS frame of `events` events whose decoded bytes are `raw_bytes` long,
    /// holding `data` (compressed or not as `codec` says), and lists it in [`Self::blocks`]
    /// with the times given.
    pub fn events_frame(&mut self, codec: u8, events: u64, raw_bytes: u64, data: &[u8]) {
        let mut payload = vec![codec];
        put_varint(&mut payload, events);
        put_varint(&mut payload, raw_bytes);
        payload.extend_from_slice(data);
        self.blocks.push(BlockEntry {
            offset: self.bytes.len() as u64,
            first_record: self.events,
            records: events,
            first_t_ns: 0,
            max_t_ns: 0,
        });
        self.events += events;
        self.frame(FRAME_EVENTS, &payload);
    }

    /// Appends a stored block of `n` allocations of 16 bytes, one a nanosecond from `t0_ns`
    /// on, at addresses `base, base + 16, ...`, then their frees (so `2 n` events).
    pub fn alloc_free_block(&mut self, t0_ns: i64, base: u64, n: u64) {
        let mut raw = Vec::new();
        let (mut prev_t, mut prev_addr) = (0i64, 0u64);
        let mut put = |raw: &mut Vec<u8>, t_ns: i64, addr: u64, size: Option<u64>| {
            raw.push(OP_NO_CALL | if size.is_none() { OP_FREE } else { 0 });
            put_varint(raw, zigzag(t_ns - prev_t));
            if let Some(s) = size {
                put_varint(raw, s);
            }
            put_varint(raw, zigzag(addr.wrapping_sub(prev_addr) as i64));
            (prev_t, prev_addr) = (t_ns, addr);
        };
        let mut t_ns = t0_ns;
        for i in 0..n {
            put(&mut raw, t_ns, base + 16 * i, Some(16));
            t_ns += 1;
        }
        for i in 0..n {
            put(&mut raw, t_ns, base + 16 * i, None);
            t_ns += 1;
        }
        self.events_frame(CODEC_STORED, 2 * n, raw.len() as u64, &raw);
        if let Some(b) = self.blocks.last_mut() {
            b.first_t_ns = t0_ns;
            b.max_t_ns = t_ns - 1;
        }
    }

    /// Appends a copy of the frame of block `k` (not listed in [`Self::blocks`]).
    pub fn duplicate_block(&mut self, k: usize) {
        let Some(b) = self.blocks.get(k) else { return };
        let at = b.offset as usize;
        let len = self
            .bytes
            .get(at + 1..at + 5)
            .and_then(|l| l.try_into().ok())
            .map_or(0, u32::from_le_bytes) as usize;
        let copy = self.bytes.get(at..at + 5 + len).unwrap_or(&[]).to_vec();
        self.bytes.extend_from_slice(&copy);
    }

    /// Appends an INDEX frame listing `blocks` (and thread 1).
    pub fn index(&mut self, blocks: &[BlockEntry]) {
        let index = BlockIndex {
            threads: vec![1],
            blocks: blocks.to_vec(),
            from_frame: true,
            cut: None,
        };
        let payload = index.encode(self.bytes.len() as u64);
        self.frame(FRAME_INDEX, &payload);
    }

    /// Appends the END frame counting `total` events, and returns the file.
    #[must_use]
    pub fn end(mut self, total: u64) -> Vec<u8> {
        let mut end = Vec::new();
        put_varint(&mut end, total);
        self.frame(FRAME_END, &end);
        self.bytes
    }

    /// The file as it is (no INDEX, no END: a cut file).
    #[must_use]
    pub fn cut(self) -> Vec<u8> {
        self.bytes
    }
}

/// `raw_bytes` zero bytes, zstd-compressed, with the content size in the frame header or not.
/// Zero bytes decode as events: op 0 (the first call, an allocation), time, size and address
/// deltas 0, four bytes each.
fn zstd_zeros(raw_bytes: u64, content_size: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let Ok(mut enc) = zstd::stream::write::Encoder::new(&mut out, 19) else {
        return Vec::new();
    };
    if content_size {
        enc.set_pledged_src_size(Some(raw_bytes)).ok();
    } else {
        enc.include_contentsize(false).ok();
    }
    let chunk = vec![0u8; 1 << 20];
    let mut left = raw_bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64);
        enc.write_all(chunk.get(..n as usize).unwrap_or(&[])).ok();
        left -= n;
    }
    enc.finish().ok();
    out
}

/// Bytes of one zero event (see [`zstd_zeros`]).
const ZERO_EVENT_BYTES: u64 = 4;

/// One zstd block of 2^26 real events (256 MiB decoded) in about 8 KB: a load reserved room
/// for all of them (gigabytes) before the first was decoded.
#[must_use]
pub fn block_decompression_bomb() -> Vec<u8> {
    let events = 1u64 << 26;
    let mut t = CraftedTrace::new();
    let raw_bytes = events * ZERO_EVENT_BYTES;
    t.events_frame(CODEC_ZSTD, events, raw_bytes, &zstd_zeros(raw_bytes, true));
    let total = t.events;
    t.end(total)
}

/// One zstd block declaring a quarter of a billion events (1 GiB decoded) whose zstd frame
/// does not say its size and holds 4 bytes: a load reserved by the header's claim.
#[must_use]
pub fn block_claim_unsized() -> Vec<u8> {
    let events = 250_000_000u64;
    let mut t = CraftedTrace::new();
    t.events_frame(
        CODEC_ZSTD,
        events,
        events * ZERO_EVENT_BYTES,
        &zstd_zeros(4, false),
    );
    let total = t.events;
    t.end(total)
}

/// Four zstd blocks of 2^24 real events each (67 million events) in about 8 KB: more events in
/// a block than the format's writer ever puts there.
#[must_use]
pub fn blocks_over_format_limit() -> Vec<u8> {
    let events = 1u64 << 24;
    let data = zstd_zeros(events * ZERO_EVENT_BYTES, true);
    let mut t = CraftedTrace::new();
    for _ in 0..4 {
        t.events_frame(CODEC_ZSTD, events, events * ZERO_EVENT_BYTES, &data);
    }
    let total = t.events;
    t.end(total)
}

/// `blocks` zstd blocks of [`BLOCK_EVENTS`] real events each (what the format allows), with
/// an INDEX frame or without one: `blocks * 65,536` events in about 40 bytes a block, more
/// than memory holds once loaded for a few thousand blocks.
#[must_use]
pub fn blocks_many(blocks: usize, with_index: bool) -> Vec<u8> {
    let events = u64::from(BLOCK_EVENTS);
    let data = zstd_zeros(events * ZERO_EVENT_BYTES, true);
    let mut t = CraftedTrace::new();
    for _ in 0..blocks {
        t.events_frame(CODEC_ZSTD, events, events * ZERO_EVENT_BYTES, &data);
    }
    if with_index {
        let listed = t.blocks.clone();
        t.index(&listed);
    }
    let total = t.events;
    t.end(total)
}

/// Three blocks of 100 allocations and their frees, 1 ms apart.
fn three_blocks() -> CraftedTrace {
    let mut t = CraftedTrace::new();
    for k in 0..3u64 {
        t.alloc_free_block(k as i64 * 1_000_000, 0x10_0000 * (k + 1), 100);
    }
    t
}

/// A block written twice, its copy not in the INDEX frame; END counts every block read.
#[must_use]
pub fn index_duplicated_block() -> Vec<u8> {
    let mut t = three_blocks();
    let listed = t.blocks.clone();
    t.duplicate_block(2);
    t.index(&listed);
    let total = t.events + listed.get(2).map_or(0, |b| b.records);
    t.end(total)
}

/// The INDEX frame leaves out the second block; END counts every block.
#[must_use]
pub fn index_skips_a_block() -> Vec<u8> {
    let mut t = three_blocks();
    let listed: Vec<BlockEntry> = t
        .blocks
        .iter()
        .enumerate()
        .filter(|(k, _)| *k != 1)
        .map(|(_, b)| *b)
        .collect();
    t.index(&listed);
    let total = t.events;
    t.end(total)
}

/// Blocks and INDEX agree; END counts 1,000 events more.
#[must_use]
pub fn index_end_disagrees() -> Vec<u8> {
    let mut t = three_blocks();
    let listed = t.blocks.clone();
    t.index(&listed);
    let total = t.events + 1000;
    t.end(total)
}

/// The INDEX frame says the first block's events run to 10^15 ns (11.6 days), the trace's
/// real span being 2 ms: a timeline laid out by it puts every event in its first bucket.
#[must_use]
pub fn index_lying_times() -> Vec<u8> {
    let mut t = three_blocks();
    let mut listed = t.blocks.clone();
    if let Some(b) = listed.first_mut() {
        b.max_t_ns = 1_000_000_000_000_000;
    }
    t.index(&listed);
    let total = t.events;
    t.end(total)
}

/// The second block's events do not decode (an op byte with its reserved bit set) while its
/// header reads; END counts only the other two blocks, so it agrees with what a lenient read
/// keeps.
#[must_use]
pub fn damaged_block_end_agrees() -> Vec<u8> {
    let mut t = CraftedTrace::new();
    t.alloc_free_block(0, 0x10_0000, 100);
    let raw = vec![0x80u8; 800];
    t.events_frame(CODEC_STORED, 200, raw.len() as u64, &raw);
    t.alloc_free_block(2_000_000, 0x30_0000, 100);
    let total = t.events - 200;
    t.end(total)
}

/// Inline frames of the one symbolized location of [`stacks_inline_bomb`].
const BOMB_INLINE_FRAMES: u64 = 40_000;
/// Distinct stacks of [`stacks_inline_bomb`], and the depth of each.
const BOMB_STACKS: u64 = 64;
const BOMB_DEPTH: u64 = 2_500;

/// A 320 KB trace whose call stacks expand to 6.4 billion frames: one location symbolized as
/// 40,000 inline frames, and 64 distinct stacks 2,500 deep that name it at every depth but
/// one. Expanding each stack's locations into their source frames took depth x inline count
/// entries per stack (26 GB), and every command aborted.
#[must_use]
pub fn stacks_inline_bomb() -> Vec<u8> {
    use super::stacks::{FRAME_LOCATIONS, FRAME_STACKS, FRAME_SYMBOLS};
    let mut t = CraftedTrace::new();
    t.alloc_free_block(0, 0x10_0000, 10);
    // Two locations in no known module: 0 (inlined many times over) and 1 (plain).
    let mut locations = Vec::new();
    put_varint(&mut locations, 2);
    for offset in [0x1000u64, 0x2000] {
        put_varint(&mut locations, 0);
        put_varint(&mut locations, offset);
    }
    t.frame(FRAME_LOCATIONS, &locations);
    let mut stacks = Vec::new();
    put_varint(&mut stacks, BOMB_STACKS);
    for id in 1..=BOMB_STACKS {
        put_varint(&mut stacks, id);
        stacks.push(0);
        put_varint(&mut stacks, BOMB_DEPTH);
        // Location 1 at a depth of its own makes each stack distinct.
        for d in 0..BOMB_DEPTH {
            stacks.push(u8::from(d == id));
        }
    }
    t.frame(FRAME_STACKS, &stacks);
    let mut symbols = Vec::new();
    put_varint(&mut symbols, 1);
    put_varint(&mut symbols, 0);
    put_varint(&mut symbols, BOMB_INLINE_FRAMES);
    for _ in 0..BOMB_INLINE_FRAMES {
        // Function "f", no file, no line: 4 bytes a frame.
        symbols.extend_from_slice(&[1, b'f', 0, 0]);
    }
    t.frame(FRAME_SYMBOLS, &symbols);
    let total = t.events;
    t.end(total)
}
