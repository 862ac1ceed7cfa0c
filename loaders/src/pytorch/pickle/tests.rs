//! Tests of the pickle decoder. Expected bytes come from CPython 3.11's `pickle.dumps`, pasted
//! as literals; a few opcode sequences are built by hand (each checked with `pickle.loads`).

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::AtomicU64;

use super::*;

fn ok(bytes: &[u8]) -> Pickle {
    match decode(bytes) {
        Ok(p) => p,
        Err(e) => panic!("decode failed: {e}"),
    }
}

fn err(bytes: &[u8]) -> String {
    match decode(bytes) {
        Ok(p) => panic!("decoded, expected an error: {:?}", p.root()),
        Err(e) => e.to_string(),
    }
}

fn list<'a>(v: Val<'a>) -> Vec<Val<'a>> {
    v.seq().expect("a list or tuple").collect()
}

/// `{'a': [1, -2, 3.5, 'é€😀', None, True, False, (1, 2), (), 2**40, -2**63, 2**64-1, 2**70,
/// -300, 70000, -2**31], 'b': {'n': (1,)}, 'c': (1, 2, 3)}` plus, from protocol 3, `'bytes':
/// [b'xy', b'z' * 300]` and, in protocol 5, `'ba': bytearray(b'ab')`.
fn check_common(p: &Pickle) {
    let root = p.root();
    assert_eq!(root.kind(), Kind::Dict);
    let a = list(root.get("a").unwrap());
    assert_eq!(a.len(), 16);
    assert_eq!(a[0].as_i64(), Some(1));
    assert_eq!(a[1].as_i64(), Some(-2));
    assert_eq!(a[2].as_f64(), Some(3.5));
    assert_eq!(a[2].kind_name(), "float");
    assert_eq!(a[3].as_str(), Some("é€😀"));
    assert!(a[4].is_none());
    assert_eq!(a[5].as_bool(), Some(true));
    assert_eq!(a[6].as_bool(), Some(false));
    assert_eq!(a[5].as_i64(), None, "bools are not ints here");
    assert_eq!(a[7].kind(), Kind::Tuple);
    let t: Vec<i64> = a[7].seq().unwrap().filter_map(|v| v.as_i64()).collect();
    assert_eq!(t, [1, 2]);
    assert_eq!(a[8].kind(), Kind::Tuple);
    assert_eq!(a[8].item_count(), Some(0));
    assert_eq!(a[9].as_i64(), Some(1 << 40));
    assert_eq!(a[10].as_i64(), Some(i64::MIN));
    assert_eq!(a[10].as_u64(), None);
    assert_eq!(a[11].as_u64(), Some(u64::MAX));
    assert_eq!(a[11].as_i64(), None);
    assert_eq!(a[12].as_i128(), Some(1 << 70));
    assert_eq!(a[12].as_u64(), None);
    assert_eq!(a[13].as_i64(), Some(-300));
    assert_eq!(a[14].as_i64(), Some(70000));
    assert_eq!(a[15].as_i64(), Some(-(1 << 31)));
    let b = root.get("b").unwrap();
    assert_eq!(b.kind_name(), "dict");
    let n = b.get("n").unwrap();
    assert_eq!(n.kind(), Kind::Tuple);
    assert_eq!(list(n)[0].as_i64(), Some(1));
    let c: Vec<i64> = root
        .get("c")
        .unwrap()
        .seq()
        .unwrap()
        .filter_map(|v| v.as_i64())
        .collect();
    assert_eq!(c, [1, 2, 3]);
    assert!(root.get("missing").is_none());
    assert!(root.get("a").unwrap().get("x").is_none(), "get on a list");
}

fn check_bytes(p: &Pickle) {
    let bytes = list(p.root().get("bytes").unwrap());
    assert_eq!(bytes[0].as_bytes(), Some(&b"xy"[..]));
    assert_eq!(bytes[1].as_bytes(), Some(&[b'z'; 300][..]));
    assert_eq!(bytes[1].kind_name(), "bytes");
    assert_eq!(bytes[1].as_str(), None);
}

#[test]
fn protocol_2() {
    let p = ok(b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00X\x09\x00\x00\x00\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80q\x03N\x88\x89K\x01K\x02\x86q\x04)\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@J\xd4\xfe\xff\xffJp\x11\x01\x00J\x00\x00\x00\x80eX\x01\x00\x00\x00bq\x05}q\x06X\x01\x00\x00\x00nq\x07K\x01\x85q\x08sX\x01\x00\x00\x00cq\x09K\x01K\x02K\x03\x87q\x0au.");
    assert_eq!(p.protocol(), 2);
    check_common(&p);
}

#[test]
fn protocol_2_bytes_need_a_global() {
    // Protocol 2 pickles bytes as `_codecs.encode(...)`: a GLOBAL and a REDUCE.
    let e = err(b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01)c_codecs\x0aencode\x0aq\x05X\x02\x00\x00\x00xyq\x06X\x06\x00\x00\x00latin1q\x07\x86q\x08Rq\x09eu.");
    assert_eq!(
        e,
        "unsupported opcode 0x63 (GLOBAL) at byte offset 21: snapshots hold only plain dicts, \
         lists, tuples, strings and numbers"
    );
}

#[test]
fn protocol_3() {
    let p = ok(b"\x80\x03}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00X\x09\x00\x00\x00\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80q\x03N\x88\x89K\x01K\x02\x86q\x04)\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@J\xd4\xfe\xff\xffJp\x11\x01\x00J\x00\x00\x00\x80eX\x01\x00\x00\x00bq\x05}q\x06X\x01\x00\x00\x00nq\x07K\x01\x85q\x08sX\x01\x00\x00\x00cq\x09K\x01K\x02K\x03\x87q\x0aX\x05\x00\x00\x00bytesq\x0b]q\x0c(C\x02xyq\x0dB,\x01\x00\x00zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzq\x0eeu.");
    assert_eq!(p.protocol(), 3);
    check_common(&p);
    check_bytes(&p);
}

#[test]
fn protocol_4() {
    let p = ok(b"\x80\x04\x95\x8a\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00\x8c\x09\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\x94N\x88\x89K\x01K\x02\x86\x94)C\x02xy\x94\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@J\xd4\xfe\xff\xffJp\x11\x01\x00J\x00\x00\x00\x80e\x8c\x01b\x94}\x94\x8c\x01n\x94K\x01\x85\x94s\x8c\x01c\x94K\x01K\x02K\x03\x87\x94u.");
    assert_eq!(p.protocol(), 4);
    // This one has b'xy' inside 'a' (17 items); check the shared part around it.
    let a = list(p.root().get("a").unwrap());
    assert_eq!(a.len(), 17);
    assert_eq!(a[3].as_str(), Some("é€😀"));
    assert_eq!(a[9].as_bytes(), Some(&b"xy"[..]));
    assert_eq!(a[12].as_u64(), Some(u64::MAX));
    assert_eq!(a[13].as_i128(), Some(1 << 70));
    assert_eq!(
        p.root().get("b").unwrap().get("n").unwrap().kind(),
        Kind::Tuple
    );
}

#[test]
fn protocol_5() {
    let p = ok(b"\x80\x05\x95\xd9\x01\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00\x8c\x09\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\x94N\x88\x89K\x01K\x02\x86\x94)\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@J\xd4\xfe\xff\xffJp\x11\x01\x00J\x00\x00\x00\x80e\x8c\x01b\x94}\x94\x8c\x01n\x94K\x01\x85\x94s\x8c\x01c\x94K\x01K\x02K\x03\x87\x94\x8c\x05bytes\x94]\x94(C\x02xy\x94B,\x01\x00\x00zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz\x94e\x8c\x02ba\x94\x96\x02\x00\x00\x00\x00\x00\x00\x00ab\x94u.");
    assert_eq!(p.protocol(), 5);
    check_common(&p);
    check_bytes(&p);
    assert_eq!(p.root().get("ba").unwrap().as_bytes(), Some(&b"ab"[..]));
}

#[test]
fn text_opcodes() {
    // b'\x80\x02' + pickle.dumps({'s': 'a\\b\nc€é', 'i': [True, False, 5, -7, 2**70, -2**70,
    // 1.25, None, 0], 't': (1,), 'shared': [l, l], 'd': {}}, 0) with l = [7]: MARK, DICT,
    // UNICODE, PUT, GET, LIST, APPEND, INT (and its bool forms), LONG, FLOAT, TUPLE, SETITEM.
    let p = ok(b"\x80\x02(dp0\x0aVs\x0ap1\x0aVa\\u005cb\\u000ac\\u20ac\xe9\x0ap2\x0asVi\x0ap3\x0a(lp4\x0aI01\x0aaI00\x0aaI5\x0aaI-7\x0aaL1180591620717411303424L\x0aaL-1180591620717411303424L\x0aaF1.25\x0aaNaI0\x0aasVt\x0ap5\x0a(I1\x0atp6\x0asVshared\x0ap7\x0a(lp8\x0a(lp9\x0aI7\x0aaag9\x0aasVd\x0ap10\x0a(dp11\x0as.");
    let root = p.root();
    assert_eq!(root.get("s").unwrap().as_str(), Some("a\\b\nc€é"));
    let i = list(root.get("i").unwrap());
    assert_eq!(i[0].as_bool(), Some(true));
    assert_eq!(i[1].as_bool(), Some(false));
    assert_eq!(i[2].as_i64(), Some(5));
    assert_eq!(i[3].as_i64(), Some(-7));
    assert_eq!(i[4].as_i128(), Some(1 << 70));
    assert_eq!(i[5].as_i128(), Some(-(1 << 70)));
    assert_eq!(i[6].as_f64(), Some(1.25));
    assert!(i[7].is_none());
    assert_eq!(i[8].as_i64(), Some(0));
    let t = root.get("t").unwrap();
    assert_eq!(t.kind(), Kind::Tuple);
    let shared = list(root.get("shared").unwrap());
    assert_eq!(shared[0].container_id(), shared[1].container_id());
    assert_eq!(list(shared[0])[0].as_i64(), Some(7));
    assert_eq!(root.get("d").unwrap().item_count(), Some(0));
}

#[test]
fn python2_strings() {
    // SHORT_BINSTRING, BINSTRING, STRING (escapes), and a non-UTF-8 BINSTRING (bytes).
    let p = ok(b"\x80\x02(U\x03abcT\x03\x00\x00\x00defS'a\\x41\\n\\'\\101'\x0aU\x01\xfft.");
    let v = list(p.root());
    assert_eq!(v[0].as_str(), Some("abc"));
    assert_eq!(v[1].as_str(), Some("def"));
    assert_eq!(v[2].as_str(), Some("aA\n'A"));
    assert_eq!(v[3].as_bytes(), Some(&[0xff][..]));
    assert!(err(b"\x80\x02S'abc\x0a.").contains("STRING at byte offset 2"));
}

#[test]
fn binary_string_and_bytes_opcodes() {
    // BINUNICODE8, BINBYTES8, BYTEARRAY8, SHORT_BINBYTES, and invalid UTF-8 (a lone surrogate
    // as Python's surrogatepass writes it) replaced.
    let p = ok(b"\x80\x04(\x8d\x02\x00\x00\x00\x00\x00\x00\x00hi\x8e\x01\x00\x00\x00\x00\x00\x00\x00\x00\x96\x00\x00\x00\x00\x00\x00\x00\x00C\x00\x8c\x03\xed\xa0\x80l.");
    let v = list(p.root());
    assert_eq!(v[0].as_str(), Some("hi"));
    assert_eq!(v[1].as_bytes(), Some(&[0][..]));
    assert_eq!(v[2].as_bytes(), Some(&[][..]));
    assert_eq!(v[3].as_bytes(), Some(&[][..]));
    assert_eq!(v[4].as_str(), Some("\u{fffd}\u{fffd}\u{fffd}"));
}

#[test]
fn integers() {
    // BININT1, BININT2, BININT (negative), LONG1 of 0, 1, 8 and 9 bytes, LONG4, text INT.
    let p = ok(b"\x80\x02(K\xffM\xff\xffJ\x00\x00\x00\x80\x8a\x00\x8a\x01\xff\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8b\x02\x00\x00\x00\x00\x80I-9223372036854775808\x0aI18446744073709551615\x0al.");
    let v: Vec<Option<i128>> = list(p.root()).iter().map(|v| v.as_i128()).collect();
    assert_eq!(
        v,
        [
            Some(255),
            Some(65535),
            Some(-(1 << 31)),
            Some(0),
            Some(-1),
            Some(i128::from(i64::MAX)),
            Some(1 << 63),
            Some(-32768),
            Some(i128::from(i64::MIN)),
            Some(i128::from(u64::MAX)),
        ]
    );
    let v = list(p.root());
    assert_eq!(v[5].as_i64(), Some(i64::MAX));
    assert_eq!(v[6].as_u64(), Some(1 << 63), "addresses of 2^63 and above");
    assert_eq!(v[6].as_i64(), None);
    assert_eq!(v[6].as_f64(), Some(9_223_372_036_854_775_808.0));
    // Equal wide integers are interned: the table holds one 2^63.
    assert_eq!(ok(b"\x80\x02(\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00l.").wide_ints.len(), 1);
}

#[test]
fn big_integers_keep_their_bytes() {
    // pickle.dumps([2**2400, -2**2400], 4) uses LONG4 of 301 bytes; built here by hand.
    let mut b = b"\x80\x04(\x8b\x2d\x01\x00\x00".to_vec();
    b.extend(std::iter::repeat_n(0u8, 300));
    b.push(0x01);
    b.extend(b"\x8b\x2d\x01\x00\x00");
    b.extend(std::iter::repeat_n(0u8, 300));
    b.push(0xff);
    // Redundant sign bytes are dropped; an int of 17 bytes and text beyond 128 bits.
    b.extend(b"\x8a\x11\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00");
    b.extend(b"L340282366920938463463374607431768211456L\x0al.");
    let p = ok(&b);
    let v = list(p.root());
    assert_eq!(v[0].kind_name(), "int");
    assert_eq!(v[0].as_i128(), None);
    assert_eq!(v[0].as_f64(), None);
    let big = v[0].big_int_le_bytes().unwrap();
    assert_eq!(big.len(), 301);
    assert_eq!(big.last(), Some(&1));
    assert_eq!(v[1].big_int_le_bytes().unwrap().last(), Some(&0xff));
    assert_eq!(v[2].as_i64(), Some(1), "17-byte LONG1 with redundant zeros");
    // 2^128: 17 bytes, the last 0x01.
    let b128 = v[3].big_int_le_bytes().unwrap();
    assert_eq!(b128.len(), 17);
    assert_eq!(b128[16], 1);
    assert!(b128[..16].iter().all(|&x| x == 0));
    // CPython's 4300-digit limit for text integers.
    let mut long = b"\x80\x02I".to_vec();
    long.extend(std::iter::repeat_n(b'9', 4301));
    long.extend(b"\x0a.");
    assert!(err(&long).starts_with("INT at byte offset 2: invalid integer"));
}

#[test]
fn floats() {
    // BINFLOAT (big-endian) and FLOAT text, including inf and nan as repr() writes them.
    let p = ok(b"\x80\x02(G\xc0\x09!\xfbTD-\x18G\x7f\xf0\x00\x00\x00\x00\x00\x00Finf\x0aFnan\x0aF-1e-300\x0al.");
    let v: Vec<f64> = list(p.root()).iter().filter_map(|v| v.as_f64()).collect();
    assert_eq!(v[0], -std::f64::consts::PI);
    assert_eq!(v[1], f64::INFINITY);
    assert!(v[2].is_infinite());
    assert!(v[3].is_nan());
    assert_eq!(v[4], -1e-300);
    assert!(err(b"\x80\x02Fabc\x0a.").starts_with("FLOAT at byte offset 2: invalid float"));
}

#[test]
fn tuples_and_lists_and_sets() {
    // EMPTY_TUPLE, TUPLE1-3, TUPLE from a MARK, LIST from a MARK.
    let p =
        ok(b"\x80\x02()K\x01\x85K\x01K\x02\x86K\x01K\x02K\x03\x87(K\x01K\x02K\x03K\x04t(K\x05lt.");
    let v = list(p.root());
    assert_eq!(p.root().kind(), Kind::Tuple);
    let kinds: Vec<&str> = v.iter().map(Val::kind_name).collect();
    assert_eq!(kinds, ["tuple", "tuple", "tuple", "tuple", "tuple", "list"]);
    let lens: Vec<usize> = v.iter().filter_map(Val::item_count).collect();
    assert_eq!(lens, [0, 1, 2, 3, 4, 1]);
    assert_eq!(
        format!("{:?}", p.root()),
        "((), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [5])"
    );
    // Empty tuples are one object, as in CPython.
    let p2 = ok(b"\x80\x02))\x86.");
    let v2 = list(p2.root());
    assert_eq!(v2[0].container_id(), v2[1].container_id());
    // pickle.dumps([{1, 2}, frozenset([3])], 4): EMPTY_SET, ADDITEMS, FROZENSET.
    let p = ok(b"\x80\x04\x95\x12\x00\x00\x00\x00\x00\x00\x00]\x94(\x8f\x94(K\x01K\x02\x90(K\x03\x91\x94e.");
    let v = list(p.root());
    assert_eq!(v[0].kind(), Kind::Set);
    assert_eq!(v[1].kind(), Kind::FrozenSet);
    assert_eq!(format!("{:?}", p.root()), "[{1, 2}, {3}]");
    assert!(v[0].dict_items().is_none());
    assert!(p.root().dict_items().is_none());
    let e = err(b"\x80\x04)(K\x01e.");
    assert_eq!(e, "APPENDS at byte offset 6 expects a list, found tuple");
    let e = err(b"\x80\x04](K\x01K\x02u.");
    assert_eq!(e, "SETITEMS at byte offset 8 expects a dict, found list");
}

/// Runs with a few values that need 8 bytes are stored narrow, those values escaped; a run
/// mostly of such values stays wide. Either way every value reads back.
#[test]
fn mostly_narrow_runs_escape_their_wide_values() {
    // [[1, 2**40, 3, 4, 5], {'a': 2**40, 'b': 1, 'c': 2, 'd': -9}, [2**40, -2**50, 7]]
    let p = ok(b"\x80\x02]q\x00(]q\x01(K\x01\x8a\x06\x00\x00\x00\x00\x00\x01K\x03K\x04K\x05e}q\x02(X\x01\x00\x00\x00aq\x03\x8a\x06\x00\x00\x00\x00\x00\x01X\x01\x00\x00\x00bq\x04K\x01X\x01\x00\x00\x00cq\x05K\x02X\x01\x00\x00\x00dq\x06J\xf7\xff\xff\xffu]q\x07(\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x07\x00\x00\x00\x00\x00\x00\xfcK\x07ee.");
    let top = list(p.root());
    let first: Vec<i64> = list(top[0]).iter().map(|v| v.as_i64().unwrap()).collect();
    assert_eq!(first, [1, 1 << 40, 3, 4, 5]);
    let d: Vec<(&str, i64)> = top[1]
        .dict_items()
        .unwrap()
        .map(|(k, v)| (k.as_str().unwrap(), v.as_i64().unwrap()))
        .collect();
    assert_eq!(d, [("a", 1 << 40), ("b", 1), ("c", 2), ("d", -9)]);
    let last: Vec<i64> = list(top[2]).iter().map(|v| v.as_i64().unwrap()).collect();
    assert_eq!(last, [1 << 40, -(1 << 50), 7]);
    // The first list and the dict's values escaped one value each; the last list is wide.
    assert_eq!(p.escaped.len(), 2);
    assert_eq!(p.items.len(), 3);
    assert_eq!(format!("{:?}", top[0]), "[1, 1099511627776, 3, 4, 5]");
}

#[test]
fn nested_dicts() {
    // {'x': {'y': {'z': [1, {'w': None}]}}, 'k': 1}, protocol 4, by pickle.dumps.
    let p = ok(b"\x80\x04\x95+\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01x\x94}\x94\x8c\x01y\x94}\x94\x8c\x01z\x94]\x94(K\x01}\x94\x8c\x01w\x94Nsess\x8c\x01k\x94K\x01u.");
    let root = p.root();
    let w = root
        .get("x")
        .and_then(|x| x.get("y"))
        .and_then(|y| y.get("z"))
        .unwrap();
    let w = list(w);
    assert_eq!(w[0].as_i64(), Some(1));
    assert!(w[1].get("w").unwrap().is_none());
    let keys: Vec<&str> = root
        .dict_items()
        .unwrap()
        .filter_map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(keys, ["x", "k"]);
    assert_eq!(
        format!("{root:?}"),
        "{\"x\": {\"y\": {\"z\": [1, {\"w\": None}]}}, \"k\": 1}"
    );
    // Non-string keys, and a key set twice (the last value wins, in the first position).
    let p = ok(b"\x80\x02}(K\x01K\x02X\x01\x00\x00\x00aK\x03K\x01K\x04u.");
    let items: Vec<(String, i64)> = p
        .root()
        .dict_items()
        .unwrap()
        .map(|(k, v)| (format!("{k:?}"), v.as_i64().unwrap()))
        .collect();
    assert_eq!(items, [("1".to_owned(), 4), ("\"a\"".to_owned(), 3)]);
    let p = ok(b"\x80\x02}(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00aK\x02u.");
    assert_eq!(p.root().item_count(), Some(1));
    assert_eq!(p.root().get("a").unwrap().as_i64(), Some(2));
    // SETITEMS in two batches, then SETITEM: one dict.
    let p = ok(b"\x80\x02}(X\x01\x00\x00\x00aK\x01u(X\x01\x00\x00\x00bK\x02X\x01\x00\x00\x00aK\x03uX\x01\x00\x00\x00cK\x04s.");
    let items: Vec<(&str, i64)> = p
        .root()
        .dict_items()
        .unwrap()
        .map(|(k, v)| (k.as_str().unwrap(), v.as_i64().unwrap()))
        .collect();
    assert_eq!(items, [("a", 3), ("b", 2), ("c", 4)]);
    let key = p.key("b").unwrap();
    assert_eq!(p.root().get_key(key).unwrap().as_i64(), Some(2));
    assert!(p.key("nowhere").is_none());
}

#[test]
fn memo_sharing_keeps_identity() {
    // sh = [1]; sl = {'x': sh}; pickle.dumps([sh, sh, sl, sl, (sh,)], 4)
    let p = ok(b"\x80\x04\x95\x1b\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94K\x01ah\x01}\x94\x8c\x01x\x94h\x01sh\x02h\x01\x85\x94e.");
    let v = list(p.root());
    let id = v[0].container_id().unwrap();
    assert_eq!(v[1].container_id(), Some(id));
    assert_eq!(v[2].get("x").unwrap().container_id(), Some(id));
    assert_eq!(v[2].container_id(), v[3].container_id());
    assert_eq!(list(v[4])[0].container_id(), Some(id));
    assert_ne!(v[2].container_id(), Some(id));
    assert_eq!(p.containers(), 4, "outer list, sh, sl, the tuple");
    // Two equal but distinct lists keep distinct ids: pickle.dumps([[1], [1]], 4).
    let p = ok(b"\x80\x04\x95\x0f\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94K\x01a]\x94K\x01ae.");
    let v = list(p.root());
    assert_ne!(v[0].container_id(), v[1].container_id());
}

#[test]
fn mutation_after_memoizing_is_seen_through_every_reference() {
    // l = []; BINPUT 0; (l, l) by BINGET; then BINGET l, APPEND 5, POP: pickle.loads gives
    // ([5], [5]).
    let p = ok(b"\x80\x02]q\x00h\x00h\x00\x86h\x00K\x05a0.");
    let v = list(p.root());
    assert_eq!(format!("{:?}", p.root()), "([5], [5])");
    assert_eq!(v[0].container_id(), v[1].container_id());
    // The same after the list got a first batch: the second one moves it out of the flat run.
    let p = ok(b"\x80\x02](K\x01K\x02eq\x00](K\x09eh\x00(K\x03K\x04eh\x00K\x05a0\x86.");
    assert_eq!(format!("{:?}", p.root()), "([9], [1, 2, 3, 4, 5])");
    // A dict: MEMOIZE, then items set through a GET of it.
    let p = ok(b"\x80\x04}\x94h\x00(\x8c\x01a\x94K\x01u0h\x00\x8c\x01b\x94K\x02s0h\x00\x85.");
    assert_eq!(format!("{:?}", p.root()), "({\"a\": 1, \"b\": 2},)");
}

#[test]
fn equal_lists_share_storage_not_identity() {
    // a = [1, 2, 3, 4]; b = [1, 2, 3, 4]; a.append(5); b.append(6); c = [1, 2, 3, 4] (LIST);
    // (a, b, c): pickle.loads gives ([1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 4]).
    let p = ok(b"\x80\x02](K\x01K\x02K\x03K\x04eq\x00](K\x01K\x02K\x03K\x04eq\x01h\x00K\x05a0h\x01K\x06a0(K\x01K\x02K\x03K\x04lq\x02h\x00h\x01h\x02\x87.");
    assert_eq!(
        format!("{:?}", p.root()),
        "([1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 4])"
    );
    let v = list(p.root());
    assert_ne!(v[0].container_id(), v[1].container_id());
    assert_ne!(v[1].container_id(), v[2].container_id());
    // One run of 4 values, grown in place by a's 5, then the outer tuple's 3; b moved out
    // when it grew.
    assert_eq!(p.narrow.len(), 4 + 1 + 3);
    assert_eq!(p.spilled.len(), 1);
}

#[test]
fn stack_opcodes() {
    // POP, POP_MARK, DUP, MARK; PUT/GET text and LONG_BINPUT/LONG_BINGET.
    let p = ok(b"\x80\x02K\x01K\x020(K\x03K\x041K\x052\x86r\x00\x01\x00\x00j\x00\x01\x00\x00p7\x0ag7\x0a\x87.");
    assert_eq!(format!("{:?}", p.root()), "((5, 5), (5, 5), (5, 5))");
    let v = list(p.root());
    assert_eq!(v[0].container_id(), v[2].container_id());
    // Python: POP with nothing above the last MARK discards the MARK.
    let p = ok(b"\x80\x02K\x01(0.");
    assert_eq!(p.root().as_i64(), Some(1));
}

#[test]
fn frames_and_memo_keys() {
    // A FRAME in the middle; MEMOIZE after PUT to a far key (sparse); GET of it.
    let p = ok(b"\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00K\x07r\x00\x00\x00\x10K\x08\x94j\x00\x00\x00\x10h\x01\x87.");
    assert_eq!(format!("{:?}", p.root()), "(8, 7, 8)");
    // A PUT key of 2^32 - 1 does not allocate a memo of that size (CPython's C unpickler
    // raises MemoryError here).
    let p = ok(b"\x80\x02K\x07r\xff\xff\xff\xffj\xff\xff\xff\xff\x85.");
    assert_eq!(format!("{:?}", p.root()), "(7,)");
}

#[test]
fn error_messages_name_the_offset() {
    assert_eq!(
        err(b"\x80\x06N."),
        "protocol 6 at byte offset 1 is not supported (2 to 5 are)"
    );
    assert_eq!(
        err(b"\x80\x01N."),
        "protocol 1 at byte offset 1 is not supported (2 to 5 are)"
    );
    assert_eq!(
        err(b"(lp0\x0a."),
        "not a pickle of protocol 2 to 5: expected PROTO (0x80) at byte offset 0, found 0x28"
    );
    assert_eq!(
        err(b""),
        "not a pickle of protocol 2 to 5: expected PROTO (0x80) at byte offset 0, found an empty input"
    );
    assert_eq!(
        err(b"\x80\x04]K\x01K\x02e."),
        "MARK missing for APPENDS at byte offset 7"
    );
    assert_eq!(
        err(b"\x80\x04]h\x07."),
        "BINGET of unknown memo key 7 at byte offset 3"
    );
    assert_eq!(
        err(b"\x80\x04j\x00\x01\x00\x00."),
        "LONG_BINGET of unknown memo key 256 at byte offset 2"
    );
    assert_eq!(
        err(b"\x80\x04."),
        "stack empty at byte offset 2: STOP needs 1 value(s) above the last MARK, 0 there"
    );
    assert_eq!(
        err(b"\x80\x04K\x01\x86."),
        "stack empty at byte offset 4: TUPLE2 needs 2 value(s) above the last MARK, 1 there"
    );
    assert_eq!(
        err(b"\x80\x04K\x01(a."),
        "stack empty at byte offset 5: APPEND needs 1 value(s) above the last MARK, 0 there"
    );
    assert_eq!(
        err(b"\x80\x04(K\x01e."),
        "stack empty at byte offset 5: APPENDS needs 1 value(s) above the last MARK, 0 there"
    );
    assert_eq!(
        err(b"\x80\x04X\x38\x00\x00\x00abcdefghijkl"),
        "truncated pickle: opcode BINUNICODE at byte offset 2 needs 60 bytes, 16 remain"
    );
    assert_eq!(
        err(b"\x80\x04N"),
        "truncated pickle: input ends at byte offset 3 before STOP"
    );
    assert_eq!(
        err(b"\x80\x04I12"),
        "truncated pickle: opcode INT at byte offset 2 has no end-of-line"
    );
    assert_eq!(
        err(b"\x80\x04}(K\x01u."),
        "SETITEMS at byte offset 6: odd number of values (1) for key-value pairs"
    );
    assert_eq!(
        err(b"\x80\x04N.N"),
        "trailing data after STOP at byte offset 4"
    );
    assert_eq!(
        err(b"\x80\x04N.\x00\x00x"),
        "trailing data after STOP at byte offset 6"
    );
    assert_eq!(
        err(b"\x80\x04\xff."),
        "unknown opcode 0xff at byte offset 2: not a pickle, or a damaged one"
    );
    assert_eq!(
        err(b"\x80\x04\x8b\xff\xff\xff\xff."),
        "LONG4 at byte offset 2: negative length -1"
    );
    // memory_viz pads the pickle with NUL bytes.
    let p = ok(b"\x80\x04N.\x00\x00\x00");
    assert_eq!(p.bytes_read(), 7);
}

#[test]
fn forbidden_opcodes_are_refused() {
    let cases: &[(&[u8], &str)] = &[
        (b"\x80\x02cos\x0asystem\x0a.", "0x63 (GLOBAL)"),
        (
            b"\x80\x04\x8c\x02os\x8c\x06system\x93.",
            "0x93 (STACK_GLOBAL)",
        ),
        (b"\x80\x02N)R.", "0x52 (REDUCE)"),
        (b"\x80\x02N}b.", "0x62 (BUILD)"),
        (b"\x80\x02N)\x81.", "0x81 (NEWOBJ)"),
        (b"\x80\x04N)}\x92.", "0x92 (NEWOBJ_EX)"),
        (b"\x80\x02(ios\x0asystem\x0a.", "0x69 (INST)"),
        (b"\x80\x02(No.", "0x6f (OBJ)"),
        (b"\x80\x02Pid\x0a.", "0x50 (PERSID)"),
        (b"\x80\x02NQ.", "0x51 (BINPERSID)"),
        (b"\x80\x02\x82\x01.", "0x82 (EXT1)"),
        (b"\x80\x02\x83\x01\x00.", "0x83 (EXT2)"),
        (b"\x80\x02\x84\x01\x00\x00\x00.", "0x84 (EXT4)"),
    ];
    for (bytes, what) in cases {
        let e = err(bytes);
        assert!(
            e.starts_with(&format!("unsupported opcode {what} at byte offset ")),
            "{e}"
        );
        assert!(e.ends_with("snapshots hold only plain dicts, lists, tuples, strings and numbers"));
    }
    assert_eq!(
        err(b"\x80\x05\x97."),
        "out-of-band buffers are not supported: opcode NEXT_BUFFER at byte offset 2"
    );
    assert_eq!(
        err(b"\x80\x05N\x98."),
        "out-of-band buffers are not supported: opcode READONLY_BUFFER at byte offset 3"
    );
}

/// A reader that counts what was read and never says how long it is.
struct Unsized<'a>(&'a [u8]);

impl Read for Unsized<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

#[test]
fn huge_length_fields_are_refused_without_allocating() {
    let claims: &[&[u8]] = &[
        b"\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x10abc.",
        b"\x80\x04\x8e\x00\x00\x00\x00\x00\x00\x00\x10abc.",
        b"\x80\x05\x96\x00\x00\x00\x00\x00\x00\x00\x10abc.",
        b"\x80\x04X\xff\xff\xff\xffabc.",
        b"\x80\x04\x8b\xff\xff\xff\x7fabc.",
        b"\x80\x04T\xff\xff\xff\x7fabc.",
    ];
    for bytes in claims {
        let e = err(bytes);
        assert!(e.starts_with("truncated pickle: opcode "), "{e}");
        assert!(e.contains("at byte offset 2 needs "), "{e}");
        assert!(
            e.ends_with(" bytes, 12 remain") || e.ends_with(" bytes, 8 remain"),
            "{e}"
        );
        // The same through a reader of unknown size: the buffer grows only with what was read.
        let e = match decode_reader(Unsized(bytes), None, None) {
            Ok(_) => panic!("decoded"),
            Err(e) => e.to_string(),
        };
        assert!(e.starts_with("truncated pickle: opcode "), "{e}");
    }
    assert!(
        err(b"\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x10abc.")
            .contains("needs 1152921504606846984 bytes")
    );
}

#[test]
fn deep_nesting_needs_no_recursion() {
    // 100,000 nested lists: EMPTY_LIST n times, then APPEND n - 1 times.
    let n = 100_000;
    let mut b = b"\x80\x04".to_vec();
    b.extend(std::iter::repeat_n(b']', n));
    b.extend(std::iter::repeat_n(b'a', n - 1));
    b.push(b'.');
    let p = ok(&b);
    assert_eq!(p.containers(), n);
    let mut depth = 0;
    let mut v = p.root();
    while let Some(inner) = v.seq().and_then(|mut s| s.next()) {
        v = inner;
        depth += 1;
    }
    assert_eq!(depth, n - 1);
    // Debug output stops at 8 levels.
    assert_eq!(format!("{:?}", p.root()), "[[[[[[[[[...]]]]]]]]]");
    // A list that contains itself.
    let p = ok(b"\x80\x02]q\x00h\x00a.");
    assert_eq!(list(p.root())[0].container_id(), p.root().container_id());
}

/// {'segments': [one segment of two blocks], 'device_traces': [[alloc, free_requested,
/// free_completed, alloc]], 'allocator_settings': {...}, 'external_annotations': [...]}, with one
/// `frames` list shared by a block and every trace entry, by `pickle.dumps(snap, 4)`.
const SMALL_SNAPSHOT: &[u8] = b"\x80\x04\x95I\x03\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94}\x94(\x8c\x06device\x94K\x00\x8c\x07address\x94\x8a\x06\x00\x00\x00\x00\x00\x7f\x8c\x0atotal_size\x94J\x00\x00 \x00\x8c\x0eallocated_size\x94M\x00\x02\x8c\x0bactive_size\x94M\x00\x02\x8c\x0erequested_size\x94M\xf4\x01\x8c\x06stream\x94K\x00\x8c\x0csegment_type\x94\x8c\x05small\x94\x8c\x0fsegment_pool_id\x94K\x00K\x00\x86\x94\x8c\x0dis_expandable\x94\x89\x8c\x06frames\x94]\x94\x8c\x06blocks\x94]\x94(}\x94(h\x05\x8a\x06\x00\x00\x00\x00\x00\x7f\x8c\x04size\x94M\x00\x02h\x09M\xf4\x01\x8c\x05state\x94\x8c\x10active_allocated\x94h\x10]\x94(}\x94(\x8c\x04name\x94\x8c\x01f\x94\x8c\x08filename\x94\x8c\x04a.py\x94\x8c\x04line\x94K\x03u}\x94(h\x1a\x8c\x01g\x94h\x1c\x8c\x02??\x94h\x1eK\x00ueu}\x94(h\x05\x8a\x06\x00\x02\x00\x00\x00\x7fh\x15J\x00\xfe\x1f\x00h\x09K\x00h\x16\x8c\x08inactive\x94h\x10]\x94ueua\x8c\x0ddevice_traces\x94]\x94]\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94\x8a\x06\x00\x00\x00\x00\x00\x7fh\x15M\xf4\x01h\x0aK\x00\x8c\x07time_us\x94\x8a\x07\x9b\xe8\x16E\xd6;\x06h\x10h\x18u}\x94(h)\x8c\x0efree_requested\x94h+\x8a\x06\x00\x00\x00\x00\x00\x7fh\x15M\xf4\x01h\x0aK\x00h,\x8a\x07\x9e\xe8\x16E\xd6;\x06h\x10h\x18u}\x94(h)\x8c\x0efree_completed\x94h+\x8a\x06\x00\x00\x00\x00\x00\x7fh\x15M\xf4\x01h\x0aK\x00h,\x8a\x07\x9f\xe8\x16E\xd6;\x06h\x10h\x18u}\x94(h)h*h+\x8a\x06\x00\x00\x00\x00\x00\x7fh\x15M\xf4\x01h\x0aK\x00h,\x8a\x07\xf8\xe8\x16E\xd6;\x06h\x10h\x18uea\x8c\x12allocator_settings\x94}\x94(\x8c\x0emax_split_size\x94J\xff\xff\xff\xff\x8c\x1cgarbage_collection_threshold\x94G\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x13expandable_segments\x94\x89u\x8c\x14external_annotations\x94]\x94}\x94(\x8c\x05stage\x94\x8c\x05START\x94h\x1a\x8c\x19Optimizer.step#AdamW.step\x94h\x04K\x00h,\x8a\x07\x94\xe8\x16E\xd6;\x06uau.";

#[test]
fn small_snapshot_through_the_api() {
    let p = ok(SMALL_SNAPSHOT);
    let root = p.root();
    let segments = list(root.get("segments").unwrap());
    assert_eq!(segments.len(), 1);
    let seg = segments[0];
    assert_eq!(seg.get("address").unwrap().as_u64(), Some(0x7f00_0000_0000));
    assert_eq!(seg.get("segment_type").unwrap().as_str(), Some("small"));
    assert_eq!(seg.get("is_expandable").unwrap().as_bool(), Some(false));
    let pool: Vec<i64> = seg
        .get("segment_pool_id")
        .unwrap()
        .seq()
        .unwrap()
        .filter_map(|v| v.as_i64())
        .collect();
    assert_eq!(pool, [0, 0]);
    let blocks = list(seg.get("blocks").unwrap());
    assert_eq!(
        blocks[1].get("address").unwrap().as_u64(),
        Some(0x7f00_0000_0200)
    );
    assert_eq!(blocks[1].get("state").unwrap().as_str(), Some("inactive"));
    let traces = list(root.get("device_traces").unwrap());
    let trace = list(traces[0]);
    let actions: Vec<&str> = trace
        .iter()
        .filter_map(|e| e.get("action")?.as_str())
        .collect();
    assert_eq!(
        actions,
        ["alloc", "free_requested", "free_completed", "alloc"]
    );
    assert_eq!(
        trace[0].get("time_us").unwrap().as_i64(),
        Some(1_754_641_328_433_307)
    );
    // One frames list for the block and every entry.
    let frames = blocks[0].get("frames").unwrap().container_id();
    assert!(
        trace
            .iter()
            .all(|e| e.get("frames").unwrap().container_id() == frames)
    );
    let f0 = list(blocks[0].get("frames").unwrap());
    assert_eq!(f0[0].get("filename").unwrap().as_str(), Some("a.py"));
    assert_eq!(f0[1].get("line").unwrap().as_i64(), Some(0));
    // Equal strings share one id.
    assert_eq!(
        trace[0].get("action").unwrap().str_id(),
        trace[3].get("action").unwrap().str_id()
    );
    let settings = root.get("allocator_settings").unwrap();
    assert_eq!(settings.get("max_split_size").unwrap().as_i64(), Some(-1));
    assert_eq!(
        settings
            .get("garbage_collection_threshold")
            .unwrap()
            .as_f64(),
        Some(0.0)
    );
    let ann = list(root.get("external_annotations").unwrap());
    assert_eq!(
        ann[0].get("name").unwrap().as_str(),
        Some("Optimizer.step#AdamW.step")
    );
    // Trace entries share a shape; get_key finds by id.
    let action = p.key("action").unwrap();
    assert_eq!(
        trace[2].get_key(action).unwrap().as_str(),
        Some("free_completed")
    );
    assert_eq!(root.dict_items().unwrap().len(), 4);
    assert_eq!(trace[0].dict_items().unwrap().len(), 6);
}

#[test]
fn every_truncation_is_an_error_naming_an_offset() {
    for len in 0..SMALL_SNAPSHOT.len() {
        let cut = &SMALL_SNAPSHOT[..len];
        for e in [
            decode(cut).err(),
            decode_reader(Unsized(cut), None, None).err(),
            decode_reader(cut, Some(len as u64), None).err(),
        ] {
            let e = e.unwrap_or_else(|| panic!("a prefix of {len} bytes decoded"));
            assert!(e.to_string().contains("at byte offset "), "{len}: {e}");
        }
    }
    // Every single-byte corruption fails cleanly or decodes: never a panic.
    let mut bytes = SMALL_SNAPSHOT.to_vec();
    for i in 0..bytes.len() {
        for x in [0x00, 0x28, 0x2e, 0x61, 0x65, 0x68, 0x75, 0x94, 0xff] {
            let old = bytes[i];
            bytes[i] = x;
            if let Ok(p) = decode(&bytes) {
                let _ = format!("{:?}", p.root());
            }
            bytes[i] = old;
        }
    }
}

#[test]
fn reader_and_slice_agree_and_report_progress() {
    let progress = AtomicU64::new(0);
    let p = decode_reader(Unsized(SMALL_SNAPSHOT), None, Some(&progress)).unwrap();
    assert_eq!(
        progress.load(std::sync::atomic::Ordering::Relaxed),
        SMALL_SNAPSHOT.len() as u64
    );
    assert_eq!(p.bytes_read(), SMALL_SNAPSHOT.len() as u64);
    let q = decode(SMALL_SNAPSHOT).unwrap();
    assert_eq!(format!("{:?}", p.root()), format!("{:?}", q.root()));
    assert_eq!(p.containers(), q.containers());
}

// ---------------------------------------------------------------------------------------------
// The real snapshots of /work/shared/data/pytorch (skipped when absent).

const REAL_DIR: &str = "/work/shared/data/pytorch";

/// Nodes of the value tree with memo references expanded (what a copying decoder builds).
fn expanded_nodes(root: Val<'_>) -> u64 {
    let mut count = 0;
    let mut todo = vec![root];
    while let Some(v) = todo.pop() {
        count += 1;
        if let Some(items) = v.dict_items() {
            for (k, v) in items {
                todo.push(k);
                todo.push(v);
            }
        } else if let Some(items) = v.seq() {
            todo.extend(items);
        }
    }
    count
}

#[test]
fn real_snapshots() {
    // (file, segments, blocks, alloc, free_requested, free_completed), from the README there.
    let expected = [
        (
            "lm_train_step_a.pickle",
            999,
            1987,
            6488,
            6488,
            6488,
            23_842_521_088u64,
        ),
        (
            "lm_forward_a.pickle",
            1722,
            4158,
            4138,
            2405,
            2405,
            47_234_154_496,
        ),
        (
            "lm_train_step_b.pickle",
            96,
            550,
            2162,
            2162,
            2162,
            4_238_344_192,
        ),
        (
            "lm_train_step_windows.pickle",
            216,
            455,
            1721,
            1721,
            1721,
            14_180_941_824,
        ),
    ];
    for (name, segments, blocks, allocs, requested, completed, total_bytes) in expected {
        let path = Path::new(REAL_DIR).join(name);
        if !path.exists() {
            eprintln!("skipping {name}: {} is absent", path.display());
            continue;
        }
        let progress = AtomicU64::new(0);
        let p = decode_file(&path, Some(&progress)).unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        assert_eq!(p.bytes_read(), size);
        assert_eq!(progress.load(std::sync::atomic::Ordering::Relaxed), size);
        assert_eq!(p.protocol(), 4);
        let root = p.root();
        let segs = list(root.get("segments").unwrap());
        assert_eq!(segs.len(), segments, "{name}");
        let sum: u64 = segs
            .iter()
            .map(|s| s.get("total_size").unwrap().as_u64().unwrap())
            .sum();
        assert_eq!(sum, total_bytes, "{name}");
        let n_blocks: usize = segs
            .iter()
            .map(|s| s.get("blocks").unwrap().seq().unwrap().len())
            .sum();
        assert_eq!(n_blocks, blocks, "{name}");
        let trace = list(root.get("device_traces").unwrap())[0];
        let action = p.key("action").unwrap();
        let mut counts = HashMap::<&str, usize>::new();
        for e in trace.seq().unwrap() {
            *counts
                .entry(e.get_key(action).unwrap().as_str().unwrap())
                .or_default() += 1;
        }
        assert_eq!(counts.get("alloc").copied(), Some(allocs), "{name}");
        assert_eq!(
            counts.get("free_requested").copied(),
            Some(requested),
            "{name}"
        );
        assert_eq!(
            counts.get("free_completed").copied(),
            Some(completed),
            "{name}"
        );
        assert_eq!(counts.len(), 3, "{name}: {counts:?}");
        // Shared frames lists stay shared.
        let expanded = expanded_nodes(root);
        assert!(
            (p.containers() as u64) * 20 < expanded,
            "{name}: {} containers for {expanded} expanded nodes",
            p.containers()
        );
        // free_requested and free_completed share a frames list, and every list shares frame
        // dicts.
        let lists: Vec<Val<'_>> = trace
            .seq()
            .unwrap()
            .filter_map(|e| e.get("frames"))
            .collect();
        let mut list_ids: Vec<u32> = lists.iter().filter_map(Val::container_id).collect();
        let mut frame_ids: Vec<u32> = lists
            .iter()
            .flat_map(|l| l.seq().unwrap().filter_map(|f| f.container_id()))
            .collect();
        let (entries, frames) = (list_ids.len(), frame_ids.len());
        list_ids.sort_unstable();
        list_ids.dedup();
        frame_ids.sort_unstable();
        frame_ids.dedup();
        assert!(
            list_ids.len() + completed <= entries,
            "{name}: {} frames lists for {entries} entries",
            list_ids.len()
        );
        assert!(
            frame_ids.len() * 100 < frames,
            "{name}: {} frame dicts for {frames} frames",
            frame_ids.len()
        );
        // The same graph from memory.
        let bytes = std::fs::read(&path).unwrap();
        let q = decode(&bytes).unwrap();
        assert_eq!(q.containers(), p.containers());
        eprintln!(
            "{name}: {size} B, {} containers, {} strings, {} shapes, {expanded} expanded nodes, \
             {} heap bytes ({:.2} of the file)",
            p.containers(),
            p.strings(),
            p.shapes(),
            p.heap_bytes(),
            p.heap_bytes() as f64 / size as f64
        );
    }
}
