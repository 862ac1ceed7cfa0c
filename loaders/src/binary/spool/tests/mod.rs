use super::super::FileKind;
use super::super::codec::{put_varint, zigzag};
use super::super::frames::write_frame;
use super::super::tests::read;
use super::super::{
    FRAME_META, FRAME_SEGMENT, KIND_SPOOL, MAGIC, OP_FREE, VERSION, load_binary, read_records,
};
use super::*;
use crate::events::LoadOptions;

mod live;
use live::read_live;

fn spool(segments: &[(u32, u64, u64, i64, Vec<u8>)], meta: &str) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend([VERSION, KIND_SPOOL]);
    write_frame(&mut out, FRAME_META, &[meta.as_bytes()]).unwrap();
    for (stream, tid, tick, ns, events) in segments {
        let mut head = Vec::new();
        head.extend(stream.to_le_bytes());
        head.extend(tid.to_le_bytes());
        head.extend(tick.to_le_bytes());
        head.extend(ns.to_le_bytes());
        write_frame(&mut out, FRAME_SEGMENT, &[&head, events]).unwrap();
    }
    out
}

fn spool_event(out: &mut Vec<u8>, prev: &mut (u64, u64), op: u8, tick: u64, size: u64, addr: u64) {
    out.push(op);
    put_varint(out, zigzag(tick.wrapping_sub(prev.0) as i64));
    if op & OP_FREE == 0 {
        put_varint(out, size);
    }
    put_varint(out, zigzag(addr.wrapping_sub(prev.1) as i64));
    *prev = (tick, addr);
}

/// An event in the tracer's compact encoding (META `events=2`), with a time change first
/// when the time differs from the stream's previous event.
fn compact_event(
    out: &mut Vec<u8>,
    prev: &mut (u64, u64),
    op: u8,
    tick: u64,
    size: u64,
    addr: u64,
) {
    if tick != prev.0 {
        out.push(OP_TIME);
        put_varint(out, zigzag(tick.wrapping_sub(prev.0) as i64));
    }
    let delta = zigzag(addr.wrapping_sub(prev.1) as i64);
    let len = (71 - delta.leading_zeros() as usize) / 8;
    let (code, len) = if len >= 7 { (7, 8) } else { (len, len) };
    out.push(op | ((code as u8) << OP_ADDR_SHIFT));
    if op & OP_FREE == 0 {
        assert!(size < 1 << 56);
        let bits = 64 - (size | 1).leading_zeros() as usize;
        let n = bits.div_ceil(7);
        let word = (size << n) | (1 << (n - 1));
        out.extend(&word.to_le_bytes()[..n]);
    }
    out.extend(&delta.to_le_bytes()[..len]);
    *prev = (tick, addr);
}

type Row = (i64, u64, Option<u64>, u64, Option<u8>);

fn rows_of(records: &[Record]) -> Vec<Row> {
    records
        .iter()
        .map(|r| (r.t_ns, r.tid, r.size_bytes, r.addr, r.call))
        .collect()
}

const COMPACT_META: &str = "pid=5\ntick0=1000\nmono_ns0=1000\nrealtime_ns0=5000\n\
                            clock=monotonic_coarse_ns\nclock_resolution_ns=1000000\nevents=2\n";

#[test]
fn compact_spools_decode_sizes_addresses_and_time_changes() {
    let mut a = Vec::new();
    let mut pa = (0, 0);
    compact_event(&mut a, &mut pa, 0, 1000, 16, 0x5555_0000_1000);
    compact_event(&mut a, &mut pa, 3 | OP_FREE, 1000, 0, 0x5555_0000_1000);
    compact_event(&mut a, &mut pa, 1, 2_001_000, 300, 0x5555_0000_1000);
    compact_event(&mut a, &mut pa, 0, 2_001_000, (1 << 56) - 1, 0);
    compact_event(&mut a, &mut pa, 2, 2_001_000, 7, u64::MAX);
    let bytes = spool(&[(0, 10, 0, 0, a)], COMPACT_META);
    let (back, info) = read(&bytes);
    assert_eq!(info.truncated, None);
    assert_eq!(
        rows_of(&back),
        vec![
            (0, 10, Some(16), 0x5555_0000_1000, Some(0)),
            (0, 10, None, 0x5555_0000_1000, Some(3)),
            (2_000_000, 10, Some(300), 0x5555_0000_1000, Some(1)),
            (2_000_000, 10, Some((1 << 56) - 1), 0, Some(0)),
            (2_000_000, 10, Some(7), u64::MAX, Some(2)),
        ]
    );
}

#[test]
fn events_of_one_time_are_ordered_by_causality_across_threads() {
    // One clock period: thread 10 (the lower stream) allocates x twice; thread 20 frees x
    // in between and then allocates y, which thread 10 frees. Merging by time and then
    // stream would give thread 10's second allocation of x while x is live.
    let (x, y) = (0x1000, 0x2000);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let (mut pa, mut pb) = ((0, 0), (0, 0));
    compact_event(&mut a, &mut pa, 0, 1000, 32, x);
    compact_event(&mut a, &mut pa, 0, 1000, 48, x);
    compact_event(&mut a, &mut pa, 3 | OP_FREE, 1000, 0, y);
    compact_event(&mut b, &mut pb, 3 | OP_FREE, 1000, 0, x);
    compact_event(&mut b, &mut pb, 0, 1000, 64, y);
    // A free of a pointer allocated before tracing started: it fits anywhere.
    compact_event(&mut b, &mut pb, 3 | OP_FREE, 1000, 0, 0x9000);
    let bytes = spool(&[(1, 20, 0, 0, b), (0, 10, 0, 0, a)], COMPACT_META);
    let (back, _) = read(&bytes);
    let got: Vec<(u64, Option<u64>, u64)> =
        back.iter().map(|r| (r.tid, r.size_bytes, r.addr)).collect();
    assert_eq!(got.len(), 6);
    let at = |row: (u64, Option<u64>, u64)| got.iter().position(|&g| g == row).unwrap();
    // x: allocated, freed by the other thread, allocated again.
    assert!(at((10, Some(32), x)) < at((20, None, x)));
    assert!(at((20, None, x)) < at((10, Some(48), x)));
    // y: allocated by thread 20 before thread 10 frees it.
    assert!(at((20, Some(64), y)) < at((10, None, y)));
    // Each thread's own order is kept.
    let order = |tid: u64| -> Vec<usize> {
        (0..got.len())
            .filter(|&i| got[i].0 == tid)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        order(10),
        vec![
            at((10, Some(32), x)),
            at((10, Some(48), x)),
            at((10, None, y))
        ]
    );
    assert_eq!(
        order(20),
        vec![
            at((20, None, x)),
            at((20, Some(64), y)),
            at((20, None, 0x9000))
        ]
    );
    // Loaded, the trace has no inconsistency.
    let dir = std::env::temp_dir().join(format!("allocview-causal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("handover.spool");
    std::fs::write(&path, &bytes).unwrap();
    let t = load_binary(&path, &LoadOptions::default()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(t.summary.mallocs_of_live_ptr, 0);
    assert_eq!(
        t.summary.frees_unknown, 1,
        "only the pointer from before tracing"
    );
    assert_eq!(t.summary.timestamps_non_monotonic, 0);
}

/// A stream's encoder state for keyed spools (META `events=3`): time, address, key, and
/// whether the stream has switched to keyed events.
#[derive(Default)]
struct KeyedStream {
    prev: (u64, u64),
    key: u64,
    keyed: bool,
}

/// An event as the tracer writes it once several threads record: the switch to keyed
/// events when the stream has not made it yet, the compact event, then the key's
/// difference from the stream's previous key (zigzag, prefix varint).
fn keyed_event(
    out: &mut Vec<u8>,
    s: &mut KeyedStream,
    op: u8,
    tick: u64,
    size: u64,
    addr: u64,
    key: Option<u64>,
) {
    let Some(key) = key else {
        assert!(!s.keyed, "a keyed stream stays keyed");
        compact_event(out, &mut s.prev, op, tick, size, addr);
        return;
    };
    if tick != s.prev.0 {
        out.push(OP_TIME);
        put_varint(out, zigzag(tick.wrapping_sub(s.prev.0) as i64));
        s.prev.0 = tick;
    }
    if !s.keyed {
        out.push(OP_KEYED);
        s.keyed = true;
    }
    compact_event(out, &mut s.prev, op, tick, size, addr);
    let dk = zigzag(key.wrapping_sub(s.key) as i64);
    let bits = 64 - (dk | 1).leading_zeros() as usize;
    let n = bits.div_ceil(7);
    assert!(n <= 8);
    out.extend(&((dk << n) | (1 << (n - 1))).to_le_bytes()[..n]);
    s.key = key;
}

const KEYED_META: &str = "pid=5\ntick0=1000\nmono_ns0=1000\nrealtime_ns0=5000\n\
                          clock=monotonic_coarse_ns\nclock_resolution_ns=1000000\nevents=3\n";

#[test]
fn keys_order_the_events_of_one_time_exactly() {
    // One clock period, two threads. Several orders fit the pointers' lives (b's life on
    // thread 20 could go before or after a's allocation); the keys say which happened.
    // Thread 10 also hands x over: allocated at key 10, freed by thread 20 at 40, then
    // allocated again by thread 10 at 60. Thread 20's stream is split in two segments,
    // and its keys go down once (TSC reads of one thread may differ by a few cycles from
    // their program order): its own order is kept.
    let (a, b, x) = (0x1000, 0x2000, 0x3000);
    let (mut t10, mut t20a, mut t20b) = (Vec::new(), Vec::new(), Vec::new());
    let (mut s10, mut s20) = (KeyedStream::default(), KeyedStream::default());
    keyed_event(&mut t10, &mut s10, 0, 1000, 16, x, Some(10));
    keyed_event(&mut t10, &mut s10, 0, 1000, 32, a, Some(50));
    keyed_event(&mut t10, &mut s10, 0, 1000, 48, x, Some(60));
    keyed_event(&mut t10, &mut s10, 3 | OP_FREE, 1000, 0, a, Some(90));
    keyed_event(&mut t20a, &mut s20, 0, 1000, 64, b, Some(20));
    keyed_event(&mut t20a, &mut s20, 3 | OP_FREE, 1000, 0, x, Some(40));
    keyed_event(&mut t20b, &mut s20, 3 | OP_FREE, 1000, 0, b, Some(38));
    let bytes = spool(
        &[(0, 10, 0, 0, t10), (1, 20, 0, 0, t20a), (1, 20, 0, 0, t20b)],
        KEYED_META,
    );
    let (back, info) = read(&bytes);
    assert_eq!(info.truncated, None);
    let got: Vec<(u64, Option<u64>, u64)> =
        back.iter().map(|r| (r.tid, r.size_bytes, r.addr)).collect();
    assert_eq!(
        got,
        vec![
            (10, Some(16), x),
            (20, Some(64), b),
            (20, None, x),
            (20, None, b),
            (10, Some(32), a),
            (10, Some(48), x),
            (10, None, a),
        ]
    );
}

#[test]
fn in_the_period_keys_start_events_without_one_come_first() {
    // Thread 10 recorded alone until thread 20 started, in the middle of this period:
    // thread 10's first two events have no key, the rest of the period has keys. Thread 20
    // (the lower stream here) allocates x after thread 10 freed it, then frees y, which
    // thread 10 allocated with a key. In stream order, the free of y would come before
    // its allocation, and the allocation of x while x is live.
    let (x, y) = (0x1000, 0x2000);
    let (mut t10, mut t20) = (Vec::new(), Vec::new());
    let (mut s10, mut s20) = (KeyedStream::default(), KeyedStream::default());
    keyed_event(&mut t10, &mut s10, 0, 1000, 16, x, None);
    keyed_event(&mut t10, &mut s10, 3 | OP_FREE, 1000, 0, x, None);
    keyed_event(&mut t10, &mut s10, 0, 1000, 32, y, Some(500));
    keyed_event(&mut t20, &mut s20, 0, 1000, 48, x, Some(400));
    keyed_event(&mut t20, &mut s20, 3 | OP_FREE, 1000, 0, y, Some(600));
    // A later period: keyed events of both threads, ordered by time first.
    keyed_event(&mut t20, &mut s20, 3 | OP_FREE, 1_001_000, 0, x, Some(700));
    let bytes = spool(&[(0, 20, 0, 0, t20), (1, 10, 0, 0, t10)], KEYED_META);
    let (back, _) = read(&bytes);
    assert_eq!(
        rows_of(&back),
        vec![
            (0, 10, Some(16), x, Some(0)),
            (0, 10, None, x, Some(3)),
            (0, 20, Some(48), x, Some(0)),
            (0, 10, Some(32), y, Some(0)),
            (0, 20, None, y, Some(3)),
            (1_000_000, 20, None, x, Some(3)),
        ]
    );
    // The same events in a spool of the previous encoding are refused: a reader that
    // does not know keys cannot skip them.
    let old_meta = KEYED_META.replace("events=3", "events=2");
    let old = spool(&[(0, 20, 0, 0, Vec::from([OP_KEYED]))], &old_meta);
    let dir = std::env::temp_dir().join(format!("allocview-keyed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("old.spool");
    std::fs::write(&path, &old).unwrap();
    let res = read_records(&path, TimeBase::default(), |_| Ok(()));
    std::fs::remove_dir_all(&dir).ok();
    assert!(res.is_err());
}

#[test]
fn a_later_time_never_goes_before_an_earlier_one_whatever_the_pointers() {
    // Thread 20's free of x is a period later than thread 10's second allocation of x:
    // times win (that recording is inconsistent; the loader reports it).
    let x = 0x1000;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let (mut pa, mut pb) = ((0, 0), (0, 0));
    compact_event(&mut a, &mut pa, 0, 1000, 32, x);
    compact_event(&mut a, &mut pa, 0, 1000, 48, x);
    compact_event(&mut b, &mut pb, 3 | OP_FREE, 1_001_000, 0, x);
    let bytes = spool(&[(0, 10, 0, 0, a), (1, 20, 0, 0, b)], COMPACT_META);
    let (back, _) = read(&bytes);
    assert_eq!(
        rows_of(&back),
        vec![
            (0, 10, Some(32), x, Some(0)),
            (0, 10, Some(48), x, Some(0)),
            (1_000_000, 20, None, x, Some(3)),
        ]
    );
}

#[test]
fn spool_streams_merge_by_time_across_segments() {
    // Thread 10 allocates at ticks 100 and 300; thread 20 frees the first block at 200.
    // Stream 0 is split over two segments written after stream 1's.
    let (mut a1, mut a2, mut b) = (Vec::new(), Vec::new(), Vec::new());
    let mut pa = (0, 0);
    spool_event(&mut a1, &mut pa, 0, 100, 32, 0x1000);
    spool_event(&mut a2, &mut pa, 1, 300, 64, 0x2000);
    let mut pb = (0, 0);
    spool_event(&mut b, &mut pb, 3 | OP_FREE, 200, 0, 0x1000);
    let meta = "pid=5\ntick0=0\nmono_ns0=1000\nrealtime_ns0=5000\nclock=tsc\n";
    // Calibration: 2 ns per tick.
    let bytes = spool(
        &[
            (1, 20, 400, 1800, b),
            (0, 10, 350, 1700, a1),
            (0, 10, 500, 2000, a2),
        ],
        meta,
    );
    let (back, info) = read(&bytes);
    assert_eq!(info.kind, FileKind::Spool);
    let got = rows_of(&back);
    assert_eq!(
        got,
        vec![
            (200, 10, Some(32), 0x1000, Some(0)),
            (400, 20, None, 0x1000, Some(3)),
            (600, 10, Some(64), 0x2000, Some(1)),
        ]
    );
}

/// A SEGMENT frame of `stream` (thread `tid`) holding `events`, its calibration point `tick`.
fn segment_frame(out: &mut Vec<u8>, stream: u32, tid: u64, tick: u64, events: &[u8]) {
    let mut head = Vec::new();
    head.extend(stream.to_le_bytes());
    head.extend(tid.to_le_bytes());
    head.extend(tick.to_le_bytes());
    head.extend((tick as i64).to_le_bytes());
    write_frame(out, FRAME_SEGMENT, &[&head, events]).unwrap();
}

fn flush_mark(out: &mut Vec<u8>, tick: u64) {
    write_frame(out, FRAME_FLUSHED, &[&tick.to_le_bytes()]).unwrap();
}

/// Two threads handing blocks over through 40 clock periods, keyed from the tenth, with a
/// flush of both streams and a mark every 4 periods, as the clock thread writes them.
fn handover_spool() -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend([VERSION, KIND_SPOOL]);
    write_frame(&mut out, FRAME_META, &[KEYED_META.as_bytes()]).unwrap();
    let (mut s10, mut s20) = (KeyedStream::default(), KeyedStream::default());
    let mut key = 0;
    for period in 0..40u64 {
        let tick = 1000 + period * 1_000_000;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for i in 0..5u64 {
            let x = 0x10_0000 + (period * 5 + i) * 0x100;
            let k = |key: u64| (period >= 10).then_some(key);
            // Thread 10 allocates x, thread 20 frees it; then thread 20 allocates y and
            // thread 10 frees it, at the same address each round.
            keyed_event(&mut a, &mut s10, 0, tick, 24 + i, x, k(key + 1));
            keyed_event(&mut b, &mut s20, 3 | OP_FREE, tick, 0, x, k(key + 2));
            keyed_event(&mut b, &mut s20, 0, tick, 40, 0x9000, k(key + 3));
            keyed_event(&mut a, &mut s10, 3 | OP_FREE, tick, 0, 0x9000, k(key + 4));
            key += 4;
        }
        segment_frame(&mut out, 0, 10, tick, &a);
        segment_frame(&mut out, 1, 20, tick, &b);
        if period % 4 == 3 {
            flush_mark(&mut out, tick + 1);
        }
    }
    out
}

#[test]
fn a_period_owned_by_one_thread_has_its_events_without_keys_first() {
    // Encoding 5: thread 10 owns period 1 (no keys) until thread 20 records in it; from then
    // on both key their events. In period 2 thread 10 owns the period again (OP_UNKEYED).
    let meta = KEYED_META.replace("events=3", "events=5");
    let (a, b, c) = (0x1000, 0x2000, 0x3000);
    let (mut t10, mut t20) = (Vec::new(), Vec::new());
    let (mut s10, mut s20) = (KeyedStream::default(), KeyedStream::default());
    keyed_event(&mut t10, &mut s10, 0, 1000, 16, a, None);
    keyed_event(&mut t10, &mut s10, 3 | OP_FREE, 1000, 0, a, Some(30));
    keyed_event(&mut t20, &mut s20, 0, 1000, 32, b, Some(20));
    keyed_event(&mut t20, &mut s20, 0, 1000, 48, a, Some(40));
    t10.push(OP_UNKEYED);
    s10.keyed = false;
    keyed_event(&mut t10, &mut s10, 0, 2_001_000, 64, c, None);
    let bytes = spool(&[(0, 10, 0, 0, t10), (1, 20, 0, 0, t20)], &meta);
    let (back, info) = read(&bytes);
    assert_eq!(info.truncated, None);
    let got: Vec<(u64, Option<u64>, u64)> =
        back.iter().map(|r| (r.tid, r.size_bytes, r.addr)).collect();
    assert_eq!(
        got,
        vec![
            (10, Some(16), a),
            (20, Some(32), b),
            (10, None, a),
            (20, Some(48), a),
            (10, Some(64), c),
        ]
    );
}

/// Issue 20, item 8: a period shared by hundreds of threads without keys, with blocks handed
/// from each thread to the next, merges into an order consistent with every pointer's life
/// (the search's state per depth is bounded; `scripts/gen-spool-threads.py` makes the larger
/// files of the benchmark).
#[test]
fn a_period_of_many_threads_without_keys_merges_consistently() {
    let threads = 300u64;
    let mut segments = Vec::new();
    for t in 0..threads {
        let (mut ev, mut prev) = (Vec::new(), (0, 0));
        let base = 0x10_0000_0000 + t * 0x100_0000;
        for k in 0..10 {
            compact_event(&mut ev, &mut prev, 0, 1000, 48, base + k * 64);
            if k % 4 != 3 {
                compact_event(&mut ev, &mut prev, 3 | OP_FREE, 1000, 0, base + k * 64);
            }
        }
        if t > 0 {
            // The previous thread's blocks that it did not free itself.
            let prev_base = base - 0x100_0000;
            for k in [3, 7] {
                compact_event(&mut ev, &mut prev, 3 | OP_FREE, 1000, 0, prev_base + k * 64);
            }
        }
        segments.push((u32::try_from(t).unwrap(), 100 + t, 0, 0, ev));
    }
    let bytes = spool(&segments, COMPACT_META);
    let dir = std::env::temp_dir().join(format!("allocview-many-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("many.spool");
    std::fs::write(&path, &bytes).unwrap();
    let t = load_binary(&path, &LoadOptions::default()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(t.summary.mallocs, threads * 10);
    assert_eq!(t.summary.frees, threads * 10 - 2);
    assert_eq!(t.summary.frees_unknown, 0);
    assert_eq!(t.summary.mallocs_of_live_ptr, 0);
}

/// The live reading keeps the live pointers until keys have been emitted for a while, not
/// until some stream's next event has one: a thread that started later (its keyed events
/// already read, far ahead of what is emitted) must not drop them before the period in which
/// the second thread starts, whose events (the main thread's, from before it knew of other
/// threads, and the new thread's, the owner of the period) carry no keys and are ordered by
/// causality. (Every `record` of a multi-threaded Python program fell back to converting the
/// whole file this way.)
#[test]
fn a_stream_keyed_ahead_of_the_reading_keeps_the_live_pointers() {
    let period = |p: u64| 1000 + p * 1_000_000;
    let mut out = MAGIC.to_vec();
    out.extend([VERSION, KIND_SPOOL]);
    write_frame(&mut out, FRAME_META, &[KEYED_META.as_bytes()]).unwrap();
    let (mut s10, mut s20, mut s30) = (
        KeyedStream::default(),
        KeyedStream::default(),
        KeyedStream::default(),
    );
    // The main thread alone, periods 0 to 11.
    let mut main = Vec::new();
    for p in 0..12 {
        keyed_event(
            &mut main,
            &mut s10,
            0,
            period(p),
            16,
            0x1000 + p * 0x100,
            None,
        );
        keyed_event(
            &mut main,
            &mut s10,
            3 | OP_FREE,
            period(p),
            0,
            0x1000 + p * 0x100,
            None,
        );
    }
    segment_frame(&mut out, 0, 10, period(0), &main);
    // A third thread's stream, keyed from its first event in period 13, is in the file early.
    let mut third = Vec::new();
    keyed_event(&mut third, &mut s30, 0, period(13), 64, 0x7000, Some(500));
    segment_frame(&mut out, 2, 30, period(13), &third);
    flush_mark(&mut out, period(3));
    flush_mark(&mut out, period(6));
    // Period 12: the main thread (no key yet) hands x to thread 20, which owns the period;
    // thread 20 frees x and allocates at its address again, then the main thread frees y,
    // which thread 20 allocated: only causality orders them.
    let (x, y) = (0x20_0000, 0x30_0000);
    let mut main = Vec::new();
    keyed_event(&mut main, &mut s10, 0, period(12), 24, x, None);
    let mut second = Vec::new();
    keyed_event(&mut second, &mut s20, 3 | OP_FREE, period(12), 0, x, None);
    keyed_event(&mut second, &mut s20, 0, period(12), 40, y, None);
    keyed_event(&mut second, &mut s20, 0, period(12), 32, x, None);
    keyed_event(&mut main, &mut s10, 3 | OP_FREE, period(12), 0, y, None);
    segment_frame(&mut out, 0, 10, period(12), &main);
    segment_frame(&mut out, 1, 20, period(12), &second);
    for p in [9, 12, 15, 18, 21] {
        flush_mark(&mut out, period(p) + 1);
    }
    let (whole, _) = read(&out);
    assert_eq!(whole.len(), 12 * 2 + 5 + 1);
    for chunk in [1, 64, out.len()] {
        let (live, _, poll) = read_live(&out, chunk, "keyed-ahead");
        assert_eq!(poll, LivePoll::Going, "chunk {chunk}");
        assert_eq!(live, whole, "chunk {chunk}");
    }
}
