//! Call stacks in `allocview record`: a C++ program built here without frame pointers, and
//! Python, recorded with stacks; the symbolized, demangled frames are checked by name and
//! order. Also: `--no-stacks` records none, and converting to text says what it drops.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use allocview_loaders::sites::StackTable;
use allocview_loaders::{LoadOptions, Loaded, MallocTrace};

fn allocview(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("record-stacks-{name}"));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn load(path: &Path) -> MallocTrace {
    let Loaded::MallocTrace(t) = allocview_loaders::load(path, &LoadOptions::default()).unwrap()
    else {
        panic!("{} is not a malloc trace", path.display());
    };
    t
}

/// A C++ program whose allocations come from named functions at known depths, and one through
/// libstdc++'s `std::vector`. Built `-O2 -fomit-frame-pointer`: only DWARF CFI can unwind it.
const WIDGETS_CPP: &str = r#"
#include <cstdio>
#include <vector>
struct Widget { int a[8]; };
__attribute__((noinline)) Widget* make_widgets(int n) {
    Widget* w = new Widget[n];
    asm volatile("" ::: "memory");
    return w;
}
__attribute__((noinline)) void* level_two(int n) {
    void* p = make_widgets(n);
    asm volatile("" ::: "memory");
    return p;
}
__attribute__((noinline)) std::vector<long>* fill_vector(int n) {
    auto* v = new std::vector<long>();
    for (int i = 0; i < n; i++) v->push_back(i);
    return v;
}
int main(int argc, char**) {
    void* keep[50];
    for (int i = 0; i < 50; i++) keep[i] = level_two(1000 + i + argc);
    auto* v = fill_vector(5000);
    std::printf("%zu %p\n", v->size(), keep[3]);
    return 0;
}
"#;

fn build_cpp(dir: &Path) -> PathBuf {
    let src = dir.join("widgets.cpp");
    std::fs::write(&src, WIDGETS_CPP).unwrap();
    let exe = dir.join("widgets");
    let out = Command::new("g++")
        .args(["-O2", "-fomit-frame-pointer", "-g", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("g++ must be installed (build-essential)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The function names of every stack with an allocation of exactly `size` bytes.
fn stacks_of_size(t: &MallocTrace, size: u64) -> Vec<Vec<String>> {
    let table = t.stacks.as_ref().expect("a trace recorded with stacks");
    let sizes = t.events.column("size_bytes").unwrap().u64().unwrap();
    let kinds = t.events.column("kind").unwrap().u8().unwrap();
    let ids = t.events.column("stack_id").unwrap().u32().unwrap();
    let mut out: Vec<Vec<String>> = Vec::new();
    for i in 0..t.events.height() {
        if kinds.get(i) == Some(0)
            && sizes.get(i) == Some(size)
            && let Some(id) = ids.get(i)
        {
            let names = names(table, id);
            if !out.contains(&names) {
                out.push(names);
            }
        }
    }
    out
}

fn names(table: &StackTable, id: u32) -> Vec<String> {
    table.frames_of(id).map(|f| f.function.clone()).collect()
}

/// Whether `needles` appear in `hay` in this order, each right after the previous one.
fn consecutive(hay: &[String], needles: &[&str]) -> bool {
    hay.windows(needles.len())
        .any(|w| w.iter().zip(needles).all(|(a, b)| a == b))
}

#[test]
fn a_cpp_program_without_frame_pointers_has_symbolized_demangled_stacks() {
    let dir = scratch("cpp");
    let exe = build_cpp(&dir);
    let out = dir.join("w.avt");
    let stderr = ok(&allocview(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]));
    assert!(stderr.contains("code locations named"), "{stderr}");
    let t = load(&out);
    // make_widgets(1000 + i + 1): 32-byte widgets, so 32 * (1001 + i) bytes.
    let stacks = stacks_of_size(&t, 32 * 1001);
    assert_eq!(stacks.len(), 1, "{stacks:#?}");
    let s = &stacks[0];
    assert!(
        consecutive(s, &["make_widgets(int)", "level_two(int)", "main"]),
        "{s:#?}"
    );
    // The innermost frame is the C++ runtime's operator new (libstdc++, no frame pointers).
    assert!(s[0].starts_with("operator new"), "{s:#?}");
    assert!(s.iter().any(|f| f.contains("libc_start")), "{s:#?}");
    // File and line from the program's DWARF.
    let table = t.stacks.as_ref().unwrap();
    let id = (0..table.num_stacks() as u32)
        .find(|&id| names(table, id) == *s)
        .unwrap();
    let make = table
        .frames_of(id)
        .find(|f| f.function == "make_widgets(int)")
        .unwrap();
    assert!(
        make.file.ends_with("widgets.cpp") && make.line == 6,
        "{make:?}"
    );
    // The vector's growth: 8-byte longs, doubling up to 8192 elements (64 KiB).
    let grown = stacks_of_size(&t, 8 * 8192);
    assert!(!grown.is_empty());
    for s in &grown {
        assert!(s[0].starts_with("operator new"), "{s:#?}");
        let fill = s
            .iter()
            .position(|f| f == "fill_vector(int)")
            .expect("fill_vector");
        assert_eq!(s.get(fill + 1).map(String::as_str), Some("main"), "{s:#?}");
        assert!(
            s[..fill]
                .iter()
                .any(|f| f.starts_with("std::vector<long, std::allocator<long> >::")),
            "{s:#?}"
        );
    }
    // Every allocation of the program has a stack; frees have none.
    let ids = t.events.column("stack_id").unwrap();
    let kinds = t.events.column("kind").unwrap().u8().unwrap().clone();
    let with = ids.u32().unwrap().iter().zip(kinds.iter());
    for (id, kind) in with {
        assert_eq!(
            id.is_some(),
            kind == Some(0),
            "stack {id:?} on an event of kind {kind:?}"
        );
    }
}

fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

#[test]
fn python_stacks_show_the_interpreters_frames() {
    let dir = scratch("python");
    let out = dir.join("py.avt");
    let script = "import threading\n\
                  def work():\n    return [str(i) * 3 for i in range(20000)]\n\
                  ts = [threading.Thread(target=work) for _ in range(3)]\n\
                  [t.start() for t in ts]\n[t.join() for t in ts]\n";
    ok(&allocview(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        "env",
        "PYTHONMALLOC=malloc",
        python(),
        "-c",
        script,
    ]));
    // `env` execs python: the trace of the second image is python's.
    let traces: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "avt"))
        .collect();
    let biggest = traces
        .iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let t = load(biggest);
    let table = t.stacks.as_ref().expect("stacks");
    let all: Vec<Vec<String>> = (0..table.num_stacks() as u32)
        .map(|id| names(table, id))
        .collect();
    let has = |name: &str| all.iter().any(|s| s.iter().any(|f| f == name));
    let longest = all.iter().max_by_key(|s| s.len()).unwrap();
    // The interpreter loop, named from python's dynamic symbol table (PyObject_Malloc itself
    // tail-calls the allocator, so its caller holds the return address: see
    // docs/src/guide/call-stacks.md).
    assert!(
        has("_PyEval_EvalFrameDefault"),
        "no _PyEval_EvalFrameDefault frame in {longest:#?}"
    );
    // The C API functions that allocate for the program's objects.
    assert!(
        has("PyUnicode_New") || has("PyList_New") || has("_PyObject_New"),
        "no allocating C API frame"
    );
    // Threads' stacks reach the thread start in the C library.
    assert!(
        all.iter()
            .any(|s| s.iter().any(|f| f.contains("start_thread"))),
        "no thread start"
    );
}

#[test]
fn no_stacks_records_none() {
    let dir = scratch("none");
    let exe = build_cpp(&dir);
    let out = dir.join("w.avt");
    ok(&allocview(&[
        "record",
        "--no-stacks",
        "-o",
        out.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]));
    let t = load(&out);
    assert!(t.stacks.is_none());
    assert!(t.events.column("stack_id").is_err());
    assert!(t.events.height() > 50);
}

#[test]
fn converting_keeps_stacks_in_binary_and_says_what_text_drops() {
    let dir = scratch("convert");
    let exe = build_cpp(&dir);
    let out = dir.join("w.avt");
    ok(&allocview(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]));
    let text = dir.join("w.trace.gz");
    let stderr = ok(&allocview(&[
        "convert",
        out.to_str().unwrap(),
        text.to_str().unwrap(),
    ]));
    assert!(
        stderr.contains("the text form has no call stacks") && stderr.contains("lose their stack"),
        "{stderr}"
    );
    let copy = dir.join("copy.avt");
    ok(&allocview(&[
        "convert",
        "--to",
        "binary",
        out.to_str().unwrap(),
        copy.to_str().unwrap(),
    ]));
    let (a, b) = (load(&out), load(&copy));
    let (ta, tb) = (a.stacks.unwrap(), b.stacks.unwrap());
    assert_eq!(ta.num_stacks(), tb.num_stacks());
    assert!(
        a.events
            .column("stack_id")
            .unwrap()
            .equals_missing(b.events.column("stack_id").unwrap())
    );
    for id in 0..ta.num_stacks() as u32 {
        assert_eq!(names(&ta, id), names(&tb, id));
    }
    parquet_keeps_the_stacks(&out, &a.events, &ta);
}

/// `convert` to Parquet (streamed) gives every allocation the stack the loader gives it,
/// through the file's stacks and frames tables.
fn parquet_keeps_the_stacks(trace: &Path, loaded: &polars::prelude::DataFrame, table: &StackTable) {
    use polars::prelude::*;
    let events = trace.with_extension("parquet");
    ok(&allocview(&[
        "convert",
        trace.to_str().unwrap(),
        events.to_str().unwrap(),
    ]));
    let read = |name: &str| {
        let path = trace.with_file_name(name);
        ParquetReader::new(std::fs::File::open(path).unwrap())
            .finish()
            .unwrap()
    };
    let stem = trace.file_stem().unwrap().to_str().unwrap();
    let (got, stacks, frames) = (
        read(&format!("{stem}.parquet")),
        read(&format!("{stem}.stacks.parquet")),
        read(&format!("{stem}.frames.parquet")),
    );
    let function = frames.column("function").unwrap().str().unwrap();
    let mut by_stack: std::collections::HashMap<u32, Vec<(u32, String)>> = Default::default();
    let cols = ["stack_id", "depth", "frame_id"].map(|c| stacks.column(c).unwrap().u32().unwrap());
    for row in 0..stacks.height() {
        let [s, d, f] = cols.each_ref().map(|c| c.get(row).unwrap());
        let name = function.get(f as usize).unwrap().to_owned();
        by_stack.entry(s).or_default().push((d, name));
    }
    let ours = got.column("stack_id").unwrap().u32().unwrap();
    let theirs = loaded.column("stack_id").unwrap().u32().unwrap();
    assert_eq!(ours.len(), theirs.len());
    let mut with_stack = 0;
    for (file_id, id) in ours.iter().zip(theirs.iter()) {
        let (Some(file_id), Some(id)) = (file_id, id) else {
            assert_eq!(file_id.is_some(), id.is_some());
            continue;
        };
        let mut frames = by_stack.get(&file_id).cloned().unwrap_or_default();
        frames.sort();
        let frames: Vec<String> = frames.into_iter().map(|(_, n)| n).collect();
        assert_eq!(frames, names(table, id));
        with_stack += 1;
    }
    assert!(with_stack > 50, "{with_stack} allocations with a stack");
}

#[test]
fn a_rust_program_has_demangled_frames_and_pthread_getattr_np_does_not_deadlock() {
    // allocview itself: Rust's runtime calls pthread_getattr_np at start, which allocates
    // while holding the thread's lock (the tracer must not take that lock itself).
    let dir = scratch("rust");
    let out = dir.join("av.avt");
    let me = env!("CARGO_BIN_EXE_allocview");
    ok(&allocview(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        me,
        "--help",
    ]));
    let t = load(&out);
    let table = t.stacks.as_ref().expect("stacks");
    let all: Vec<Vec<String>> = (0..table.num_stacks() as u32)
        .map(|id| names(table, id))
        .collect();
    assert!(
        all.iter()
            .flatten()
            .any(|f| f.starts_with("std::rt::lang_start") || f.starts_with("std::rt::init")),
        "no Rust runtime frame"
    );
    assert!(
        all.iter()
            .flatten()
            .all(|f| !f.starts_with("_ZN") && !f.starts_with("_R")),
        "a mangled Rust name"
    );
    assert!(
        all.iter().flatten().any(|f| f.starts_with("clap")),
        "no clap frame"
    );
}

#[test]
fn threads_calling_pthread_getattr_np_record_with_stacks() {
    let dir = scratch("getattr");
    let src = dir.join("getattr.c");
    std::fs::write(
        &src,
        r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
void* volatile sink;
static void* run(void* arg) {
    pthread_attr_t a;
    for (int i = 0; i < 100; i++) {
        pthread_getattr_np(pthread_self(), &a);
        pthread_attr_destroy(&a);
        sink = malloc(64);
        free(sink);
    }
    return arg;
}
int main(void) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, run, 0);
    run(0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.join("getattr");
    let built = Command::new("cc")
        .args(["-O2", "-g", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = dir.join("g.avt");
    ok(&allocview(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]));
    let t = load(&out);
    let stacks = stacks_of_size(&t, 64);
    assert!(
        stacks.iter().any(|s| s.first().is_some_and(|f| f == "run")),
        "{stacks:#?}"
    );
    assert!(
        stacks
            .iter()
            .any(|s| s.iter().any(|f| f.contains("start_thread"))),
        "{stacks:#?}"
    );
}

/// Two libraries of the same layout (`a_alloc` and `b_alloc` at the same offsets): loaded in
/// turn by [`DLOPEN_LOOP_C`], each pair at the same address.
const DL_LIB_C: &str = r#"
#include <stdlib.h>
__attribute__((noinline)) void* NAME(void) {
    void* p = malloc(SIZE);
    asm volatile("" ::: "memory");
    return p;
}
"#;

/// Loads liba then libb (argv 1 and 2) `argv[3]` times each, allocating through each and
/// closing it: the second of a pair is mapped where the first was. After each pair, a page
/// is mapped at that address, so the next pair lands elsewhere: the process maps more
/// distinct modules than the tracer's table used to hold (2,048).
const DLOPEN_LOOP_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
int main(int argc, char** argv) {
    if (argc != 4) return 2;
    int pairs = atoi(argv[3]), same = 0;
    void** keep = calloc(2 * (size_t)pairs, sizeof(void*));
    for (int i = 0; i < pairs; i++) {
        void* base[2];
        for (int k = 0; k < 2; k++) {
            void* h = dlopen(argv[1 + k], RTLD_NOW | RTLD_LOCAL);
            if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
            void* (*f)(void) = (void* (*)(void))dlsym(h, k ? "b_alloc" : "a_alloc");
            Dl_info info;
            if (!f || !dladdr((void*)f, &info)) return 1;
            base[k] = info.dli_fbase;
            free(f());
            keep[2 * i + k] = f();
            if (dlclose(h) != 0) return 1;
        }
        same += base[0] == base[1];
        mmap(base[1], 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    }
    for (int i = 0; i < 2 * pairs; i++) free(keep[i]);
    free(keep);
    printf("pairs=%d same=%d\n", pairs, same);
    return 0;
}
"#;

fn cc(args: &[&str], out: &Path, src: &Path) {
    let built = Command::new("cc")
        .args(args)
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
}

#[test]
fn libraries_unloaded_and_loaded_again_at_the_same_address_keep_their_own_stacks() {
    let dir = scratch("dlclose");
    let mut libs = Vec::new();
    for (name, size) in [("a", 1111), ("b", 2222)] {
        let src = dir.join(format!("lib{name}.c"));
        let code = DL_LIB_C
            .replace("NAME", &format!("{name}_alloc"))
            .replace("SIZE", &size.to_string());
        std::fs::write(&src, code).unwrap();
        let lib = dir.join(format!("lib{name}.so"));
        cc(
            &["-shared", "-fPIC", "-g", "-fno-omit-frame-pointer"],
            &lib,
            &src,
        );
        libs.push(lib);
    }
    let src = dir.join("loop.c");
    std::fs::write(&src, DLOPEN_LOOP_C).unwrap();
    let exe = dir.join("loop");
    cc(&["-g", "-fno-omit-frame-pointer"], &exe, &src);
    let pairs = 2100;
    let out = dir.join("loop.avt");
    let run = allocview(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
        libs[0].to_str().unwrap(),
        libs[1].to_str().unwrap(),
        &pairs.to_string(),
    ]);
    ok(&run);
    // The program ran to its end, and most pairs shared their address (else this tests
    // nothing).
    let stdout = String::from_utf8_lossy(&run.stdout);
    let same: u32 = stdout
        .trim()
        .strip_prefix(&format!("pairs={pairs} same="))
        .unwrap_or_else(|| panic!("{stdout}"))
        .parse()
        .unwrap();
    assert!(same > pairs / 2, "{stdout}");
    let t = load(&out);
    assert_eq!(t.summary.frees_unknown, 0);
    // Every allocation is attributed to the function of the library that made it.
    let table = t.stacks.as_ref().expect("a trace recorded with stacks");
    let sizes = t.events.column("size_bytes").unwrap().u64().unwrap();
    let kinds = t.events.column("kind").unwrap().u8().unwrap();
    let ids = t.events.column("stack_id").unwrap().u32().unwrap();
    let mut wrong = Vec::new();
    let mut counted = [0u32; 2];
    for i in 0..t.events.height() {
        let (want, other, k) = match sizes.get(i) {
            Some(1111) => ("a_alloc", "b_alloc", 0),
            Some(2222) => ("b_alloc", "a_alloc", 1),
            _ => continue,
        };
        if kinds.get(i) != Some(0) {
            continue;
        }
        counted[k] += 1;
        let frames = ids.get(i).map(|id| names(table, id)).unwrap_or_default();
        if !frames.iter().any(|f| f == want) || frames.iter().any(|f| f == other) {
            wrong.push((want, frames));
        }
    }
    assert_eq!(counted, [2 * pairs; 2]);
    assert!(
        wrong.is_empty(),
        "{} of {} allocations attributed wrongly, the first: {:?}",
        wrong.len(),
        4 * pairs,
        wrong.first()
    );
}
