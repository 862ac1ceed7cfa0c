//! Reading a spool while it is written ([`LiveSpool`]): in steps, in short steps, with late
//! events, and with threads that own their periods.

use super::*;

/// Reads `bytes` as a [`LiveSpool`] does while the tracer writes them: the file grows by
/// `chunk` bytes (cutting frames anywhere) and each step reads and emits. Returns the
/// records, how many were emitted before the end, and how the last step went.
pub(super) fn read_live(bytes: &[u8], chunk: usize, name: &str) -> (Vec<Record>, usize, LivePoll) {
    read_live_in_steps(bytes, chunk, name, None)
}

/// As [`read_live`], each step emitting at most about `max_records` (one step per write: the
/// steps may fall behind the writes).
fn read_live_in_steps(
    bytes: &[u8],
    chunk: usize,
    name: &str,
    max_records: Option<u64>,
) -> (Vec<Record>, usize, LivePoll) {
    use std::io::Write as _;
    let dir = tempfile::Builder::new()
        .prefix("allocview-live-test-")
        .tempdir()
        .unwrap();
    let path = dir.path().join(format!("{name}-{chunk}.spool"));
    let mut file = std::fs::File::create(&path).unwrap();
    let mut live = LiveSpool::open(&path, TimeBase::default()).unwrap();
    let mut out = Vec::new();
    let mut poll = LivePoll::Going;
    for part in bytes.chunks(chunk) {
        file.write_all(part).unwrap();
        live.read().unwrap();
        let mut push = |r: &Record| {
            out.push(*r);
            Ok(())
        };
        poll = match max_records {
            None => live.emit(&mut push).unwrap(),
            Some(n) => live.emit_at_most(&mut push, n).unwrap(),
        };
        if poll == LivePoll::Late {
            break;
        }
    }
    let before_end = out.len();
    if poll != LivePoll::Late {
        live.finish(&mut |r| {
            out.push(*r);
            Ok(())
        })
        .unwrap();
    }
    std::fs::remove_file(&path).ok();
    (out, before_end, poll)
}

#[test]
fn a_spool_read_while_written_gives_the_whole_files_records() {
    let bytes = handover_spool();
    let (whole, info) = read(&bytes);
    assert_eq!(info.truncated, None);
    assert_eq!(whole.len(), 40 * 5 * 4);
    for chunk in [1, 7, 100, 4096, bytes.len()] {
        let (live, before_end, poll) = read_live(&bytes, chunk, "handover");
        assert_eq!(poll, LivePoll::Going, "chunk {chunk}");
        assert_eq!(live, whole, "chunk {chunk}");
        // The steps emit up to the next-to-last mark (after period 35); the end, the rest.
        assert_eq!(before_end, 36 * 5 * 4, "chunk {chunk}");
    }
}

#[test]
fn a_spool_read_in_short_steps_gives_the_whole_files_records() {
    let bytes = handover_spool();
    let (whole, _) = read(&bytes);
    for max_records in [1, 3, 19, 20, 1000] {
        for chunk in [7, 4096, bytes.len()] {
            let (live, before_end, poll) =
                read_live_in_steps(&bytes, chunk, "steps", Some(max_records));
            let at = format!("chunk {chunk}, steps of {max_records}");
            assert_ne!(poll, LivePoll::Late, "{at}");
            assert_eq!(live, whole, "{at}");
            // Steps fall behind the writes when they are short; never ahead of the marks.
            assert!(before_end <= 36 * 5 * 4, "{at}");
            if chunk == bytes.len() {
                // One step: the records of the times it took, whole.
                let expected = (max_records as usize).div_ceil(20).min(36) * 20;
                assert_eq!(before_end, expected, "{at}");
                assert_eq!(poll == LivePoll::More, expected < 36 * 20, "{at}");
            }
        }
    }
}

#[test]
fn an_event_written_after_its_time_was_emitted_is_reported_not_merged() {
    // Thread 20's event of period 0 is written only after two marks: a thread held up
    // between reading the time and writing its event.
    let mut out = MAGIC.to_vec();
    out.extend([VERSION, KIND_SPOOL]);
    write_frame(&mut out, FRAME_META, &[COMPACT_META.as_bytes()]).unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let (mut pa, mut pb) = ((0, 0), (0, 0));
    compact_event(&mut a, &mut pa, 0, 1000, 16, 0x1000);
    compact_event(&mut a, &mut pa, 0, 3_001_000, 16, 0x2000);
    segment_frame(&mut out, 0, 10, 0, &a);
    flush_mark(&mut out, 2_000_000);
    flush_mark(&mut out, 4_000_000);
    compact_event(&mut b, &mut pb, 3 | OP_FREE, 1000, 0, 0x1000);
    segment_frame(&mut out, 1, 20, 0, &b);
    let (_, before_end, poll) = read_live(&out, 1, "late");
    assert_eq!(poll, LivePoll::Late);
    assert_eq!(before_end, 1, "only the event before the next-to-last mark");
    // Also when the steps stop at every time: the time emitted counts as a bound.
    let (_, before_end, poll) = read_live_in_steps(&out, 1, "late-steps", Some(1));
    assert_eq!(poll, LivePoll::Late);
    assert_eq!(before_end, 1);
    // The whole file reads in order.
    let (whole, _) = read(&out);
    assert_eq!(
        whole.iter().map(|r| r.tid).collect::<Vec<_>>(),
        vec![10, 20, 10]
    );
}

#[test]
fn an_event_before_a_time_a_short_step_emitted_is_late() {
    use std::io::Write as _;
    // Thread 10's events at 1000, 2.5 ms and 3 ms, marks up to 6 ms: a step of two records
    // stops after 2.5 ms. Thread 20's event of 2.2 ms, written after, must not follow it.
    let mut first = MAGIC.to_vec();
    first.extend([VERSION, KIND_SPOOL]);
    write_frame(&mut first, FRAME_META, &[COMPACT_META.as_bytes()]).unwrap();
    let (mut a, mut pa) = (Vec::new(), (0, 0));
    compact_event(&mut a, &mut pa, 0, 1000, 16, 0x1000);
    compact_event(&mut a, &mut pa, 0, 2_500_000, 16, 0x2000);
    compact_event(&mut a, &mut pa, 0, 3_000_000, 16, 0x3000);
    segment_frame(&mut first, 0, 10, 0, &a);
    for mark in [2_000_000, 4_000_000, 6_000_000] {
        flush_mark(&mut first, mark);
    }
    let (mut rest, mut b, mut pb) = (Vec::new(), Vec::new(), (0, 0));
    compact_event(&mut b, &mut pb, 0, 2_200_000, 16, 0x4000);
    segment_frame(&mut rest, 1, 20, 0, &b);

    let dir = tempfile::Builder::new()
        .prefix("allocview-live-test-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("late-after-step.spool");
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&first).unwrap();
    let mut live = LiveSpool::open(&path, TimeBase::default()).unwrap();
    live.read().unwrap();
    let mut times = Vec::new();
    let mut push = |r: &Record| {
        times.push(r.t_ns);
        Ok(())
    };
    assert_eq!(live.emit_at_most(&mut push, 2).unwrap(), LivePoll::More);
    file.write_all(&rest).unwrap();
    live.read().unwrap();
    assert_eq!(live.emit_at_most(&mut push, 2).unwrap(), LivePoll::Late);
    // The first two events (times count from the first).
    assert_eq!(times, [0, 2_499_000]);
    std::fs::remove_file(&path).ok();
}

/// Events `5` with `order_keys`: thread 10 alone for 20 periods, then thread 20 alone, each
/// owning its periods (no key anywhere), a flush mark every period; `shared_at_end` adds a
/// last period in which both threads record without keys, which that tracer never writes.
fn owned_periods_spool(order_keys: bool, shared_at_end: bool) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend([VERSION, KIND_SPOOL]);
    let meta = KEYED_META.replace("events=3", "events=5")
        + if order_keys { "order_keys=tsc\n" } else { "" };
    write_frame(&mut out, FRAME_META, &[meta.as_bytes()]).unwrap();
    let (mut p10, mut p20) = ((0, 0), (0, 0));
    for period in 0..40u64 {
        let tick = 1000 + period * 1_000_000;
        let (stream, tid, prev) = if period < 20 {
            (0, 10, &mut p10)
        } else {
            (1, 20, &mut p20)
        };
        let mut ev = Vec::new();
        for i in 0..4u64 {
            let x = 0x10_0000 + (period * 4 + i) * 0x40;
            compact_event(&mut ev, prev, 0, tick, 32, x);
            compact_event(&mut ev, prev, 3 | OP_FREE, tick, 0, x);
        }
        segment_frame(&mut out, stream, tid, tick, &ev);
        flush_mark(&mut out, tick + 1);
    }
    if shared_at_end {
        let tick = 1000 + 40 * 1_000_000;
        for (stream, tid, prev) in [(0, 10, &mut p10), (1, 20, &mut p20)] {
            let mut ev = Vec::new();
            compact_event(&mut ev, prev, 0, tick, 8, 0x9000 + tid);
            segment_frame(&mut out, stream, tid, tick, &ev);
        }
        flush_mark(&mut out, tick + 1);
        flush_mark(&mut out, tick + 2);
    }
    out
}

#[test]
fn threads_that_own_their_periods_need_no_live_pointers_once_keys_could_start() {
    use std::io::Write as _;
    for order_keys in [true, false] {
        let bytes = owned_periods_spool(order_keys, false);
        let (whole, _) = read(&bytes);
        let (live, _, poll) = read_live(&bytes, 97, "owned");
        assert_eq!(poll, LivePoll::Going);
        assert_eq!(live, whole);
        // Read live to the last mark: dropped 10 ms after thread 20's first event, where
        // keys are known to start then; kept otherwise (no event ever has a key).
        let dir = tempfile::Builder::new()
            .prefix("allocview-live-test-")
            .tempdir()
            .unwrap();
        let path = dir.path().join(format!("owned-{order_keys}.spool"));
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&bytes)
            .unwrap();
        let mut reader = LiveSpool::open(&path, TimeBase::default()).unwrap();
        reader.read().unwrap();
        assert_eq!(reader.emit(&mut |_| Ok(())).unwrap(), LivePoll::Going);
        assert_eq!(reader.live_dropped(), order_keys);
        std::fs::remove_file(&path).ok();
    }
    // A period shared without keys after that (which such a tracer never writes) is not
    // merged without the live pointers: the reading says so, and the whole file is read.
    // However the writes fall: the shared period may be the first of a step.
    let bytes = owned_periods_spool(true, true);
    for chunk in [1, 7, 97, bytes.len()] {
        let (_, _, poll) = read_live(&bytes, chunk, "owned-shared");
        assert_eq!(poll, LivePoll::Late, "chunk {chunk}");
    }
    let (whole, _) = read(&bytes);
    assert_eq!(whole.len(), 40 * 8 + 2);
}

#[test]
fn a_period_without_keys_after_every_stream_was_keyed_is_read_from_the_whole_file() {
    use std::io::Write as _;
    // Once both streams are keyed the live reading keeps no live pointers; two new streams
    // that then record without keys (no tracer does) would need them to be ordered.
    let first = handover_spool();
    let mut rest = Vec::new();
    let tick = 1000 + 40 * 1_000_000;
    for (stream, tid) in [(2u32, 30u64), (3, 40)] {
        let (mut ev, mut prev) = (Vec::new(), (0, 0));
        compact_event(&mut ev, &mut prev, 0, tick, 8, 0x7000 + u64::from(stream));
        segment_frame(&mut rest, stream, tid, tick, &ev);
    }
    let dir = tempfile::Builder::new()
        .prefix("allocview-live-test-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("unkeyed.spool");
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&first).unwrap();
    let mut live = LiveSpool::open(&path, TimeBase::default()).unwrap();
    live.read().unwrap();
    assert_eq!(live.emit(&mut |_| Ok(())).unwrap(), LivePoll::Going);
    file.write_all(&rest).unwrap();
    let err = live.finish(&mut |_| Ok(())).unwrap_err();
    assert!(err.to_string().contains("read the whole file"), "{err}");
    std::fs::remove_file(&path).ok();
    // The whole file orders them.
    let (whole, _) = read(&[first, rest].concat());
    assert_eq!(whole.len(), 40 * 5 * 4 + 2);
}
