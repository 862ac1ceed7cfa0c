use std::io::Write as _;

use super::*;

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn load(text: &str, strictness: Strictness) -> Result<MallocTrace, LoadError> {
    let f = file(text);
    let opts = LoadOptions {
        strictness,
        ..LoadOptions::default()
    };
    load_heaptrack(f.path(), &opts)
}

/// Format 3: two classes (100 bytes from `work` inlined into `main`, 8 bytes from `main`).
const FORMAT_3: &str = "v 10400 3\nX ./prog\nI 1000 5e2921\n\
s 6 ./prog\ns 4 main\ns 6 prog.c\ns 4 work\n\
i 401000 1 2 3 a 4 3 5\ni 401100 1 2 3 c\n\
t 1 0\nt 2 0\n\
a 64 1\na 8 2\n\
+ 0\nc a\n+ 0\n+ 1\nR 10\n- 0\nc 14\n- 1\n+ 0\n# strings: 4\n";

#[test]
fn a_free_ends_the_latest_live_allocation_of_its_class() {
    let t = load(FORMAT_3, Strictness::Strict).unwrap();
    assert_eq!(t.summary.mallocs, 4);
    assert_eq!(t.summary.frees, 2);
    assert_eq!(t.summary.frees_unknown, 0);
    let ids: Vec<Option<u32>> = t.events["alloc_id"].u32().unwrap().iter().collect();
    // + 0 (id 0), + 0 (id 1), + 1 (id 2), - 0 ends id 1 (LIFO), - 1 ends id 2, + 0 (id 3).
    assert_eq!(ids, [Some(0), Some(1), Some(2), Some(1), Some(2), Some(3)]);
    let times: Vec<Option<i64>> = t.events["t_ns"].i64().unwrap().iter().collect();
    assert_eq!(times[1], Some(10_000_000));
    assert_eq!(times[5], Some(20_000_000));
    assert_eq!(t.memory.len(), 1);
    assert_eq!(t.memory[0].resident_bytes, 16 * 4096);
    assert!(
        t.summary
            .warnings()
            .iter()
            .any(|w| w.contains("LIFO") && w.contains("lifetimes are approximate"))
    );
}

#[test]
fn stacks_name_the_inlined_frames_innermost_first() {
    let t = load(FORMAT_3, Strictness::Strict).unwrap();
    let stacks = t.stacks.unwrap();
    let stack = t.events["stack_id"].u32().unwrap().get(0).unwrap();
    let frames: Vec<String> = stacks.frames_of(stack).map(ToString::to_string).collect();
    assert_eq!(frames, ["main (prog.c:10)", "work (prog.c:5)"]);
    let module: Vec<&str> = stacks.frames_of(stack).map(|f| f.module.as_str()).collect();
    assert_eq!(module, ["./prog", "./prog"]);
}

#[test]
fn format_0_pairs_by_the_pointers_it_records() {
    let text = "X ./old\ns main\ni 401000 0 1\nt 1 0\n+ 20 1 7f00\n+ 30 1 7f40\n- 7f00\n";
    let t = load(text, Strictness::Strict).unwrap();
    let ids: Vec<Option<u32>> = t.events["alloc_id"].u32().unwrap().iter().collect();
    assert_eq!(ids, [Some(0), Some(1), Some(0)]);
    assert!(t.summary.notes.is_empty());
}

#[test]
fn a_bad_line_names_its_line_and_column_and_lenient_counts_it() {
    let text = FORMAT_3.replace("+ 1\n", "+ zz\n");
    let e = load(&text, Strictness::Strict).unwrap_err().to_string();
    assert!(e.contains("line 17, column 3"), "{e}");
    assert!(e.contains("allocation info"), "{e}");
    let t = load(&text, Strictness::Lenient).unwrap();
    assert_eq!(t.summary.bad_lines, 1);
    assert_eq!(t.summary.first_bad_lines[0].line, 17);
    assert_eq!(t.summary.mallocs, 3);
}

#[test]
fn indices_must_name_what_was_read_before() {
    for (bad, field) in [
        ("a 8 9\n", "trace"),
        ("t 9 0\n", "instruction pointer index"),
        ("i 1 99\n", "module"),
        ("+ 7\n", "allocation info"),
    ] {
        let text = format!("{FORMAT_3}{bad}");
        let e = load(&text, Strictness::Strict).unwrap_err().to_string();
        assert!(e.contains(field), "{bad}: {e}");
    }
}

#[test]
fn a_raw_stream_is_refused_with_the_command_that_interprets_it() {
    let text = "v 10550 3\nx 3 abc\nm 1 -\n";
    for mode in [Strictness::Strict, Strictness::Lenient] {
        let e = load(text, mode).unwrap_err().to_string();
        assert!(
            e.contains("RAW") && e.contains("heaptrack_interpret"),
            "{e}"
        );
    }
}

#[test]
fn detection_needs_the_version_line_or_the_old_header() {
    assert!(is_heaptrack(&["v 10400 3", "X ./prog"]));
    assert!(is_heaptrack(&["X ./old", "s main"]));
    assert!(!is_heaptrack(&["v 1.0 3"]));
    assert!(!is_heaptrack(&["X marks the spot", "nothing"]));
    assert!(!is_heaptrack(&["0.000001\t1\t8\t0x10"]));
}
