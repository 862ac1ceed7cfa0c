//! `record` samples the program's own resident memory: `stats` shows its peak beside the peak
//! of live bytes, `compare` sets `glibc` against it, and the samples survive `convert`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{build_c, json, ok, run};

/// Waits 50 ms (the first samples come before anything is allocated), holds 64 MiB written
/// through for 300 ms (30 samples' worth), then frees it and holds 1 MiB for 200 ms more.
const HOLDER_C: &str = r#"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(void) {
    usleep(50000);
    char *big = malloc(64 << 20);
    memset(big, 1, 64 << 20);
    usleep(300000);
    free(big);
    char *small = malloc(1 << 20);
    memset(small, 1, 1 << 20);
    usleep(200000);
    free(small);
    return 0;
}
"#;

#[test]
fn the_program_s_resident_memory_is_recorded_beside_its_live_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "holder", HOLDER_C);
    let trace = dir.path().join("holder.avt");
    ok(&[
        "record",
        "-o",
        trace.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]);
    let t = trace.to_str().unwrap();
    // Streamed (a binary trace's default) and loaded read the same samples.
    let streamed = json(&["stats", t, "--json"]);
    let loaded = json(&["stats", t, "--json", "--no-stream"]);
    let m = &streamed["recorded_memory"];
    assert_eq!(m, &loaded["recorded_memory"]);
    // 0.55 s at one sample per 10 ms.
    let samples = m["samples"].as_u64().unwrap();
    assert!((35..=90).contains(&samples), "{m}");
    let grew = m["peak_anon_bytes"].as_u64().unwrap() - m["first_anon_bytes"].as_u64().unwrap();
    assert!(
        (63 << 20..80 << 20).contains(&grew),
        "the 64 MiB written is resident: {m}"
    );
    // The big block was freed (glibc unmaps a block that large): the end holds about 1 MiB.
    let fin = m["final_anon_bytes"].as_u64().unwrap() - m["first_anon_bytes"].as_u64().unwrap();
    assert!(fin < 8 << 20, "{m}");
    let table = ok(&["stats", t]);
    assert!(table.contains("peak RSS"), "{table}");

    let v = json(&["compare", t, "--json", "--policy", "glibc"]);
    let e = &v["policies"][0]["error_against_recorded"];
    assert_eq!(e["recorded_anon_growth_bytes"].as_u64().unwrap(), grew);
    assert_eq!(v["recorded_memory"]["samples"].as_u64().unwrap(), samples);

    // The samples survive a conversion to the binary form; the text form says it drops them.
    let copy = dir.path().join("copy.avt");
    ok(&["convert", t, copy.to_str().unwrap(), "--to", "binary"]);
    let again = json(&["stats", copy.to_str().unwrap(), "--json"]);
    assert_eq!(again["recorded_memory"], *m);
    let text = dir.path().join("copy.trace");
    let out = run(&["convert", t, text.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("memory samples"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Maps 32 MiB anonymously and writes it, gives back its second half, then maps a file of
/// 1 MiB (its own executable's first MiB) and 8 MiB more anonymously with `mremap` growing it;
/// and reserves 64 MiB of addresses it never uses (`PROT_NONE`).
const MAPPER_C: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv) {
    (void)argc;
    char *a = mmap(0, 32 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(a, 1, 32 << 20);
    usleep(30000);
    munmap(a + (16 << 20), 16 << 20);
    int fd = open(argv[0], O_RDONLY);
    void *f = mmap(0, 1 << 20, PROT_READ, MAP_PRIVATE, fd, 0);
    char *b = mmap(0, 4 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    b = mremap(b, 4 << 20, 8 << 20, MREMAP_MAYMOVE);
    void *r = mmap(0, 64 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    usleep(30000);
    return f == MAP_FAILED || b == MAP_FAILED || r == MAP_FAILED;
}
"#;

#[test]
fn the_program_s_own_mappings_outside_the_allocator_are_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "mapper", MAPPER_C);
    let trace = dir.path().join("mapper.avt");
    ok(&[
        "record",
        "-o",
        trace.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]);
    let t = trace.to_str().unwrap();
    let m = json(&["stats", t, "--json"])["recorded_memory"].clone();
    // The program's four mmaps, its munmap and its mremap (the C library's own start-up maps
    // through entry points the tracer does not see).
    assert_eq!(m["mapping_calls"], 4 + 1 + 1, "{m}");
    // The reservation is not memory the program holds: not counted.
    assert_eq!(m["mapped_outside_allocator_peak_bytes"], 32 << 20, "{m}");
    // 16 MiB left of the first mapping, and the 8 MiB the second grew to.
    assert_eq!(m["mapped_outside_allocator_final_bytes"], 24 << 20, "{m}");
    assert_eq!(m["mapped_files_peak_bytes"], 1 << 20, "{m}");
    // Loaded the same as streamed, and kept by a conversion to the binary form.
    assert_eq!(
        json(&["stats", t, "--json", "--no-stream"])["recorded_memory"],
        m
    );
    let copy = dir.path().join("copy.avt");
    ok(&["convert", t, copy.to_str().unwrap(), "--to", "binary"]);
    assert_eq!(
        json(&["stats", copy.to_str().unwrap(), "--json"])["recorded_memory"],
        m
    );
}
