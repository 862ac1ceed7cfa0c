use super::*;
use crate::malloc_trace::Record;

fn records() -> Vec<Record> {
    vec![
        Record {
            t_ns: 1_000,
            tid: 7,
            size_bytes: Some(24),
            addr: 0x1000,
            call: Some(1),
        },
        Record {
            t_ns: 3_000,
            tid: 7,
            size_bytes: None,
            addr: 0x1000,
            call: Some(2),
        },
        Record {
            t_ns: 3_000,
            tid: 9,
            size_bytes: Some(96),
            addr: 0x3000,
            call: Some(2),
        },
        Record {
            t_ns: 2_500,
            tid: 7,
            size_bytes: None,
            addr: 0,
            call: None,
        },
        Record {
            t_ns: 4_000,
            tid: 9,
            size_bytes: Some(u64::MAX),
            addr: 0,
            call: Some(0),
        },
        Record {
            t_ns: 4_001,
            tid: u64::MAX,
            size_bytes: None,
            addr: u64::MAX,
            call: Some(3),
        },
    ]
}

fn write(records: &[Record]) -> Vec<u8> {
    let mut w = BinaryWriter::new(Vec::new(), &[("pid".into(), "1".into())]).unwrap();
    for r in records {
        w.push(r).unwrap();
    }
    w.finish().unwrap()
}

pub(super) fn read(bytes: &[u8]) -> (Vec<Record>, BinaryInfo) {
    let dir = std::env::temp_dir().join(format!("allocview-binary-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}.avt", bytes.len()));
    std::fs::write(&path, bytes).unwrap();
    let mut out = Vec::new();
    let info = read_records(&path, TimeBase::default(), |r| {
        out.push(*r);
        Ok(())
    })
    .unwrap();
    std::fs::remove_file(&path).ok();
    (out, info)
}

#[test]
fn records_round_trip_exactly() {
    let recs = records();
    let (back, info) = read(&write(&recs));
    assert_eq!(back, recs);
    assert_eq!(info.records, recs.len() as u64);
    assert_eq!(info.truncated, None);
    assert_eq!(info.meta_value("pid"), Some("1"));
}

#[test]
fn many_blocks_round_trip() {
    let recs: Vec<Record> = (0..(BLOCK_EVENTS as u64 * 2 + 17))
        .map(|i| Record {
            t_ns: i as i64 * 37,
            tid: i % 3,
            size_bytes: (i % 2 == 0).then_some(i * 8),
            addr: 0x5555_0000 + (i / 2) * 64,
            call: Some((i % 11) as u8),
        })
        .collect();
    let bytes = write(&recs);
    assert!(
        bytes.len() < recs.len() * 3,
        "{} bytes for {} records",
        bytes.len(),
        recs.len()
    );
    let (back, _) = read(&bytes);
    assert_eq!(back, recs);
}

#[test]
fn a_cut_file_reads_what_is_there_and_says_so() {
    let recs = records();
    let bytes = write(&recs);
    // Drop the END frame (1 tag + 4 length + 1 varint).
    let (back, info) = read(&bytes[..bytes.len() - 6]);
    assert_eq!(back, recs);
    assert!(info.truncated.is_some());
    // Cut inside the events frame: nothing of it is read, and the cut is reported.
    let (back, info) = read(&bytes[..bytes.len() - 12]);
    assert!(back.is_empty());
    assert!(info.truncated.is_some());
}

#[test]
fn corrupt_blocks_are_errors_not_panics() {
    let mut bytes = write(&records());
    let dir = std::env::temp_dir();
    let path = dir.join(format!(
        "allocview-binary-corrupt-{}.avt",
        std::process::id()
    ));
    // Flip every byte after the header in turn; reading must never panic.
    for i in 10..bytes.len() {
        bytes[i] ^= 0x5a;
        std::fs::write(&path, &bytes).unwrap();
        let _ = read_records(&path, TimeBase::default(), |_| Ok(()));
        bytes[i] ^= 0x5a;
    }
    std::fs::remove_file(&path).ok();
}
