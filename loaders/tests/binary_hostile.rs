//! Crafted binary traces (issue 43): blocks that claim or hold more than the format's writer
//! produces are refused before anything is reserved for them, with the block's offset; an
//! INDEX frame that does not describe the blocks is refused by the stream and by the strict
//! load alike; a lenient read counts what it skips from the skipped blocks' own headers.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

use allocview_loaders::binary::crafted::{self, CraftedTrace};
use allocview_loaders::binary::{BinaryEventStream, block_events, load_binary, read_index};
use allocview_loaders::{LoadOptions, Strictness};
use allocview_sim::stream::EventBatch;

mod scratch;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn load(path: &Path, strictness: Strictness) -> Result<allocview_loaders::MallocTrace, String> {
    let opts = LoadOptions {
        strictness,
        progress: None,
        ..LoadOptions::default()
    };
    load_binary(path, &opts).map_err(|e| e.to_string())
}

/// Streams the whole file; the first error.
fn stream_all(path: &Path) -> Result<u64, String> {
    let mut s = BinaryEventStream::open(path).map_err(|e| e.to_string())?;
    let mut batch = EventBatch::default();
    while s.next_events(&mut batch).map_err(|e| e.to_string())? {}
    Ok(s.summary().events)
}

/// A stored block of `events` zero events (4 bytes each: allocations of 0 bytes at 0).
fn zero_block(events: u64) -> Vec<u8> {
    let mut t = CraftedTrace::new();
    let raw = vec![0u8; usize::try_from(events * 4).unwrap()];
    t.events_frame(0, events, raw.len() as u64, &raw);
    let total = t.events;
    t.end(total)
}

#[test]
fn a_block_of_more_events_than_the_format_holds_is_refused_with_its_offset() {
    let dir = scratch::scratch_dir("allocview-binary-hostile-");
    // One event over the writer's 65,536: refused, though it would decode.
    let over = write(dir.path(), "over.avt", &zero_block(65_537));
    for e in [
        load(&over, Strictness::Strict).unwrap_err(),
        block_events(&over).unwrap_err().to_string(),
    ] {
        assert!(e.contains("at byte 37"), "{e}");
        assert!(
            e.contains("a block of 65537 events (the format holds at most 65536 in a block)"),
            "{e}"
        );
    }
    // Exactly the limit loads, and is counted from the header alone.
    let full = write(dir.path(), "full.avt", &zero_block(65_536));
    assert_eq!(
        load(&full, Strictness::Strict).unwrap().summary.events,
        65_536
    );
    assert_eq!(block_events(&full).unwrap(), Some(65_536));
    // A quarter of a billion events claimed by a zstd frame that does not say its size: refused
    // by the claim, nothing reserved for it.
    let claim = write(dir.path(), "claim.avt", &crafted::block_claim_unsized());
    let e = load(&claim, Strictness::Strict).unwrap_err();
    assert!(e.contains("at byte 37"), "{e}");
    assert!(e.contains("a block of 250000000 events"), "{e}");
}

#[test]
fn blocks_are_counted_from_their_headers_whatever_the_index_says() {
    let dir = scratch::scratch_dir("allocview-binary-hostile-");
    let no_index = write(dir.path(), "many.avt", &crafted::blocks_many(8, false));
    assert_eq!(block_events(&no_index).unwrap(), Some(8 * 65_536));
    assert_eq!(stream_all(&no_index).unwrap(), 8 * 65_536);
}

#[test]
fn an_index_that_does_not_describe_the_blocks_is_refused_streamed_and_loaded() {
    let dir = scratch::scratch_dir("allocview-binary-hostile-");
    let cases = [
        ("dup.avt", crafted::index_duplicated_block(), "byte 2184"),
        ("skip.avt", crafted::index_skips_a_block(), "byte 751"),
        ("end.avt", crafted::index_end_disagrees(), "byte 2224"),
    ];
    for (name, bytes, at) in cases {
        let p = write(dir.path(), name, &bytes);
        let e = read_index(&p).unwrap_err().to_string();
        assert!(e.contains(at), "{name}: {e}");
        let e = stream_all(&p).unwrap_err();
        assert!(e.contains(at), "{name}: {e}");
        let e = load(&p, Strictness::Strict).unwrap_err();
        assert!(e.contains(at), "{name}: {e}");
        // Lenient: loaded from the blocks, the disagreement said.
        let t = load(&p, Strictness::Lenient).unwrap();
        assert!(!t.summary.damaged.is_empty(), "{name}");
    }
}

#[test]
fn an_index_that_lies_about_a_blocks_times_is_refused_when_the_block_is_read() {
    let dir = scratch::scratch_dir("allocview-binary-hostile-");
    let p = write(dir.path(), "times.avt", &crafted::index_lying_times());
    let e = stream_all(&p).unwrap_err();
    assert!(e.contains("at byte 37"), "{e}");
    assert!(
        e.contains("the index says the block's events run from 0 ns to 1000000000000000 ns"),
        "{e}"
    );
    let e = load(&p, Strictness::Strict).unwrap_err();
    assert!(e.contains("at byte 37"), "{e}");
}

#[test]
fn a_lenient_read_counts_a_skipped_block_by_its_header_when_end_agrees() {
    let dir = scratch::scratch_dir("allocview-binary-hostile-");
    let p = write(
        dir.path(),
        "damaged.avt",
        &crafted::damaged_block_end_agrees(),
    );
    let t = load(&p, Strictness::Lenient).unwrap();
    assert_eq!(t.summary.events, 400);
    assert_eq!(t.summary.events_lost, Some(200));
    let warnings = t.summary.warnings().join("\n");
    assert!(warnings.contains("200 events lost"), "{warnings}");
    assert!(!warnings.contains("no events lost"), "{warnings}");
}

#[test]
fn stacks_whose_inline_frames_multiply_past_the_file_are_refused_with_the_frames_offset() {
    let dir = scratch::scratch_dir("allocview-binary-hostile-");
    // 320 KB whose stacks expand to 6.4 billion frames: the load expanded them (26 GB) and
    // aborted.
    let p = write(dir.path(), "inline.avt", &crafted::stacks_inline_bomb());
    let e = load(&p, Strictness::Strict).unwrap_err();
    assert!(e.contains(&p.display().to_string()), "{e}");
    assert!(e.contains("at byte 160393"), "{e}");
    assert!(
        e.contains("the call stacks expand to 6397440064 frames"),
        "{e}"
    );
    assert!(
        e.contains("--lenient reads its events without call stacks"),
        "{e}"
    );
    // Lenient: the events are kept, the stacks left out and said so.
    let t = load(&p, Strictness::Lenient).unwrap();
    assert_eq!(t.summary.events, 20);
    assert!(t.stacks.is_none());
    let warnings = t.summary.warnings().join("\n");
    assert!(
        warnings.contains("the call stacks are left out"),
        "{warnings}"
    );
}
