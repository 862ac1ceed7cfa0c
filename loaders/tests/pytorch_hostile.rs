//! Hostile PyTorch snapshots (issue 43), written here opcode by opcode: sizes that add up past
//! 2^64. Each loads to a result or a clear error.
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
