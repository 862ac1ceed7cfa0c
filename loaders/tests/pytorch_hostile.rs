//! Hostile PyTorch snapshots (issue 43), written here opcode by opcode: sizes that add up past
//! 2^64, one long string shared through the pickle memo among the items of nested settings,
//! one segment (or trace) named thousands of times whose blocks (or entries) are one dict
//! named thousands of times. Each loads to a result or a clear error, in bounded time and
//! memory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use allocview_loaders::LoadOptions;
use allocview_loaders::pytorch::load_snapshot;

/// Writes one value of a dict.
type Value<'a> = &'a dyn Fn(&mut Pickler);

/// A pickle of protocol 4, written opcode by opcode.
struct Pickler(Vec<u8>);

impl Pickler {
    fn new() -> Self {
        Self(vec![0x80, 4])
    }
    fn op(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend_from_slice(bytes);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.op(b"X")
            .op(&u32::try_from(s.len()).unwrap().to_le_bytes())
            .op(s.as_bytes())
    }
    /// LONG1 with 9 bytes: any u64.
    fn uint(&mut self, v: u64) -> &mut Self {
        self.op(&[0x8a, 9]).op(&v.to_le_bytes()).op(&[0])
    }
    fn put(&mut self, memo: u32) -> &mut Self {
        self.op(b"r").op(&memo.to_le_bytes())
    }
    fn get(&mut self, memo: u32) -> &mut Self {
        self.op(b"j").op(&memo.to_le_bytes())
    }
    /// A list of `n` references to memo entry `memo`: one get, then DUPs.
    fn shared_list(&mut self, memo: u32, n: usize) -> &mut Self {
        self.op(b"](").get(memo);
        for _ in 1..n {
            self.op(b"2");
        }
        self.op(b"e")
    }
    /// `{key: value, ...}` from the values each closure writes.
    fn dict(&mut self, items: &[(&str, Value<'_>)]) -> &mut Self {
        self.op(b"}(");
        for (k, v) in items {
            self.str(k);
            v(self);
        }
        self.op(b"u")
    }
    fn finish(&mut self) -> Vec<u8> {
        self.op(b".");
        std::mem::take(&mut self.0)
    }
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("allocview-pytorch-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A segment without `total_size` whose two blocks of 2^63 bytes add up past 2^64 - 1: the
/// sum panicked (debug) or wrapped (release). The segment is skipped, named.
#[test]
fn block_sizes_that_add_up_past_2_64_skip_their_segment() {
    let block = |p: &mut Pickler| {
        p.dict(&[
            ("size", &|p| {
                p.uint(1 << 63);
            }),
            ("state", &|p| {
                p.str("inactive");
            }),
        ]);
    };
    let bytes = Pickler::new()
        .dict(&[
            ("segments", &|p| {
                p.op(b"](").dict(&[
                    ("address", &|p| {
                        p.uint(0x1000);
                    }),
                    ("segment_type", &|p| {
                        p.str("large");
                    }),
                    ("blocks", &|p| {
                        p.op(b"](");
                        block(p);
                        block(p);
                        p.op(b"e");
                    }),
                ]);
                p.op(b"e");
            }),
            ("device_traces", &|p| {
                p.op(b"]");
            }),
        ])
        .finish();
    let snap = load_snapshot(&write("sum.pickle", &bytes), &LoadOptions::default()).unwrap();
    assert!(snap.raw_segments.is_empty());
    assert!(snap.raw_blocks.is_empty());
    assert!(
        snap.warnings
            .iter()
            .any(|w| w.starts_with("segment 0: its blocks' sizes add up past 2^64 - 1 bytes")),
        "{:?}",
        snap.warnings
    );
}

/// `allocator_settings` of `keys` keys, each value a list of 16 lists of 16 lists of 16
/// references to one string of `string_bytes` bytes (memo-shared: the file stays small).
fn shared_string_settings(keys: usize, string_bytes: usize) -> Vec<u8> {
    let mut p = Pickler::new();
    p.op(b"}(").str("segments").op(b"]");
    p.str("allocator_settings").op(b"}(");
    p.str(&"s".repeat(string_bytes)).put(0).op(b"0");
    for level in 1..=3 {
        p.shared_list(level - 1, 16).put(level).op(b"0");
    }
    for k in 0..keys {
        p.str(&format!("key{k}")).get(3);
    }
    p.op(b"uu").finish()
}

/// 10 keys of 16^3 references to a 2,000-byte string each rendered to 80 MB of text (with a
/// fourth level and 5,000 bytes, a 10.8 KB file took 3.25 GB and aborted). Every value's text
/// is bounded in bytes now, and all of them together.
#[test]
fn settings_that_share_a_string_render_to_bounded_text() {
    let bytes = shared_string_settings(10, 2000);
    assert!(bytes.len() < 4096, "{}", bytes.len());
    let snap = load_snapshot(&write("settings.pickle", &bytes), &LoadOptions::default()).unwrap();
    let raw = &snap.settings.raw;
    assert_eq!(raw.len(), 10);
    let cut = "... (cut)";
    for (key, text) in raw {
        assert!(
            text.len() <= 1024 + cut.len(),
            "{key}: {} bytes",
            text.len()
        );
        assert!(text.starts_with("[[[ssss"), "{key}: {}", &text[..40]);
        assert!(text.ends_with(cut), "{key}");
    }
}

/// `segments`: `n` references to one segment whose `blocks` are `n` references to one
/// block; `device_traces`: `n` references to one trace of `n` references to one entry.
fn memo_shared_records(n: usize, traces: bool) -> Vec<u8> {
    let mut p = Pickler::new();
    p.op(b"}(").str("segments");
    if traces {
        p.op(b"]").str("device_traces");
        p.dict(&[
            ("action", &|p| {
                p.str("alloc");
            }),
            ("addr", &|p| {
                p.uint(0x10_0000);
            }),
            ("size", &|p| {
                p.uint(512);
            }),
        ]);
    } else {
        p.dict(&[
            ("size", &|p| {
                p.uint(512);
            }),
            ("state", &|p| {
                p.str("active_allocated");
            }),
        ]);
    }
    // The record is memo 0; its container (the segment, whose blocks are n references to
    // the block, or the trace of n references to the entry) is memo 1; the value is a list
    // of n references to memo 1.
    p.put(0).op(b"0");
    if traces {
        p.shared_list(0, n);
    } else {
        p.op(b"}(").str("address").uint(0x10_0000);
        p.str("total_size").uint(2 << 20);
        p.str("segment_type").str("large");
        p.str("blocks").shared_list(0, n).op(b"u");
    }
    p.put(1).op(b"0").shared_list(1, n);
    if !traces {
        p.str("device_traces").op(b"]");
    }
    p.op(b"u").finish()
}

/// 800 references to a segment of 800 references to a block: 640,000 blocks from a 3 KB
/// file (7,000 of each, 49 million blocks from 28 KB, aborted out of memory). The reader's
/// records are bounded in proportion to the file: it is refused, naming the record.
#[test]
fn memo_shared_segments_and_traces_are_refused_past_a_budget() {
    for traces in [false, true] {
        let bytes = memo_shared_records(800, traces);
        assert!(bytes.len() < 4096, "{}", bytes.len());
        let path = write(&format!("shared-{traces}.pickle"), &bytes);
        let e = load_snapshot(&path, &LoadOptions::default())
            .map(|s| s.raw_blocks.len())
            .unwrap_err()
            .to_string();
        let at = if traces {
            "at device 656 trace entry 385"
        } else {
            "at segment "
        };
        assert!(e.contains(at), "{e}");
        assert!(e.contains("shared through the pickle memo"), "{e}");
        assert!(e.contains(&format!("shared-{traces}.pickle")), "{e}");
    }
}

/// A few shared references stay within the budget: the same file with 20 of each loads.
#[test]
fn a_little_memo_sharing_loads() {
    let path = write("little.pickle", &memo_shared_records(20, false));
    let snap = load_snapshot(&path, &LoadOptions::default()).unwrap();
    assert_eq!(snap.raw_blocks.len(), 400);
}
