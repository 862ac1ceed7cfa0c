//! `allocview export` read back by the tools users open its files with: `go tool pprof`,
//! speedscope's own schema and viewer, Valgrind's `dh_view.html` and Chrome's trace format,
//! on a real PyTorch snapshot (call stacks, Python frames) and a recorded C program (native
//! stacks with build ids). The viewers run in headless Chromium.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;
use common::{build_c, json, ok, pprof_top, require_tool, snapshot};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("export-{name}"));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The npm packages the viewers' checks use (speedscope, ajv): `ALLOCVIEW_NODE_MODULES`.
fn node_modules() -> Option<PathBuf> {
    let dir = std::env::var_os("ALLOCVIEW_NODE_MODULES").map(PathBuf::from);
    let found = dir.filter(|d| d.join("speedscope/dist/release/index.html").is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("ALLOCVIEW_REQUIRE_TEST_INPUTS").is_none(),
            "ALLOCVIEW_NODE_MODULES must name a node_modules with speedscope and ajv"
        );
        eprintln!("skipping: set ALLOCVIEW_NODE_MODULES (npm install speedscope ajv)");
    }
    found
}

/// `allocview export INPUT -o OUT EXTRA...`, which must succeed.
fn export(input: &str, out: &Path, extra: &[&str]) {
    let mut args = vec!["export", input, "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    ok(&args);
}

/// `go tool pprof -raw` of `profile`: its samples, labels, mappings and locations as text.
fn pprof_raw(profile: &Path) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(profile)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Headless Chromium's DOM of `url` once its scripts have run.
fn chromium_dom(url: &str) -> String {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1400,900",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `sites --json --by function` at `at`: a figure by site name, where above zero.
fn sites_by_function(
    input: &str,
    at: &str,
    key: &str,
    policy: Option<&str>,
) -> HashMap<String, u64> {
    let mut args = vec!["sites", input, "--json", "--by", "function", "--at", at];
    if let Some(p) = policy {
        args.extend(["--policy", p]);
    }
    json(&args)["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s[key].as_u64().unwrap(),
            )
        })
        .filter(|(_, b)| *b > 0)
        .collect()
}

#[test]
fn go_tool_pprof_names_the_top_functions_of_sites_with_the_same_bytes() {
    if !require_tool("go", &["version"], "apt-get install golang-go") {
        return;
    }
    let dir = scratch("pprof");
    let snap = snapshot("lm_train_step_b");
    let peak = dir.join("peak.pb.gz");
    export(&snap, &peak, &["--policy", "pytorch"]);
    let top = pprof_top(&peak, "inuse_space").0;
    let sites = sites_by_function(&snap, "peak", "live_bytes", Some("pytorch"));
    assert_eq!(
        top, sites,
        "pprof's inuse_space by function against sites --at peak"
    );
    assert!(top.get("step").is_some_and(|&b| b > 500 << 20), "{top:?}");
    // What only allocview can say: the free bytes each site's blocks pin in the policy's heap.
    let pinned = pprof_top(&peak, "pinned_free_space").0;
    assert_eq!(
        pinned,
        sites_by_function(&snap, "peak", "pinned_free_bytes", Some("pytorch"))
    );
    assert!(!pinned.is_empty());
    // At the end, every allocation of the run is counted: alloc_space is sites' allocated.
    let end = dir.join("end.pprof");
    export(&snap, &end, &["--at", "end"]);
    assert_eq!(
        pprof_top(&end, "alloc_space").0,
        sites_by_function(&snap, "end", "alloc_bytes", None)
    );
    // The labels: thread and size class.
    let raw = pprof_raw(&peak);
    assert!(raw.contains("size_class:[128KiB..256KiB]"), "{raw:.2000}");
    assert!(raw.contains("thread:["), "{raw:.2000}");
    assert!(
        raw.contains(
            "alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes[dflt] \
             allocated_space/bytes pinned_free_space/bytes"
        ),
        "{raw:.400}"
    );
}

/// A C program whose allocations come from two named functions, live at the end.
const TWO_SITES_C: &str = r#"
#include <stdlib.h>
#include <string.h>
__attribute__((noinline)) void *make_table(void) { void *p = malloc(300000); memset(p, 1, 300000); return p; }
__attribute__((noinline)) void *make_names(int i) { void *p = malloc(1000 + i); memset(p, 2, 1000); return p; }
int main(void) {
    void *keep[64];
    keep[0] = make_table();
    for (int i = 1; i < 64; i++) keep[i] = make_names(i);
    volatile char sink = ((char *)keep[0])[0] + ((char *)keep[63])[0];
    (void)sink;
    return 0;
}
"#;

/// The GNU build id of `exe`, as `readelf -n` prints it.
fn build_id(exe: &Path) -> String {
    let out = Command::new("readelf").arg("-n").arg(exe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap()
        .to_owned()
}

#[test]
fn a_recorded_program_s_profile_has_its_functions_bytes_and_build_id() {
    if !require_tool("go", &["version"], "apt-get install golang-go") {
        return;
    }
    let dir = scratch("recorded");
    let exe = build_c(&dir, "two_sites", TWO_SITES_C);
    let trace = dir.join("two_sites.avt");
    ok(&[
        "record",
        "-o",
        trace.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
    ]);
    let out = dir.join("end.pb.gz");
    export(trace.to_str().unwrap(), &out, &["--at", "end"]);
    let top = pprof_top(&out, "inuse_space").0;
    assert_eq!(top.get("make_table"), Some(&300_000), "{top:?}");
    let names: u64 = (1..64).map(|i| 1000 + i).sum();
    assert_eq!(top.get("make_names"), Some(&names), "{top:?}");
    let raw = pprof_raw(&out);
    let id = build_id(&exe);
    assert!(
        raw.lines()
            .any(|l| l.contains("two_sites") && l.contains(&id)),
        "the program's mapping carries its build id {id}:\n{raw}"
    );
}

#[test]
fn speedscope_s_schema_accepts_the_export_and_its_viewer_shows_the_frames() {
    let Some(modules) = node_modules() else {
        return;
    };
    if !require_tool("node", &["--version"], "apt-get install nodejs") {
        return;
    }
    let dir = scratch("speedscope");
    let snap = snapshot("lm_train_step_b");
    let out = dir.join("peak.speedscope.json");
    export(&snap, &out, &["--policy", "pytorch"]);
    let check = dir.join("validate.js");
    std::fs::write(
        &check,
        "const nm = process.argv[2];\n\
         const Ajv = require(nm + '/ajv');\n\
         const schema = require(nm + '/speedscope/dist/release/file-format-schema.json');\n\
         const data = JSON.parse(require('fs').readFileSync(process.argv[3], 'utf8'));\n\
         const ajv = new Ajv({strict: false, allErrors: true});\n\
         if (!ajv.validate(schema, data)) { console.log(JSON.stringify(ajv.errors)); process.exit(1); }\n",
    )
    .unwrap();
    let v = Command::new("node")
        .arg(&check)
        .arg(&modules)
        .arg(&out)
        .output()
        .unwrap();
    assert!(v.status.success(), "schema: {v:?}");
    let doc: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let names: Vec<&str> = doc["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().split(' ').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "inuse_space",
            "alloc_space",
            "allocated_space",
            "pinned_free_space"
        ]
    );
    if !require_tool("chromium", &["--version"], "apt-get install chromium") {
        return;
    }
    // speedscope's offline viewer loads a local profile through a script that hands it over;
    // the script then presses `3`, the Sandwich view: a table of every frame (in the DOM).
    let b64 = base64(&std::fs::read(&out).unwrap());
    let loader = dir.join("profile.js");
    std::fs::write(
        &loader,
        format!(
            "speedscope.loadFileFromBase64('peak.speedscope.json', '{b64}');\n\
             setTimeout(function () {{ window.dispatchEvent(new KeyboardEvent('keypress', {{key: '3'}})); }}, 1000);\n"
        ),
    )
    .unwrap();
    let url = format!(
        "file://{}#localProfilePath={}",
        modules.join("speedscope/dist/release/index.html").display(),
        loader.display()
    );
    let dom = chromium_dom(&url);
    assert!(
        dom.contains("lm_train_step_b.pickle at event"),
        "the title: {dom:.3000}"
    );
    for frame in [
        "(no stack recorded)",
        "step",
        "forward",
        "torch::unwind::unwind()",
    ] {
        assert!(
            dom.contains(&format!("</span>{}</td>", frame.replace('<', "&lt;"))),
            "the sandwich table lists {frame}"
        );
    }
}

/// Standard base64, for the speedscope loader script.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ABC[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn valgrind_s_dh_view_shows_the_dhat_export_s_program_points() {
    let viewer = Path::new("/usr/libexec/valgrind/dh_view.html");
    if !viewer.is_file() {
        assert!(
            std::env::var_os("ALLOCVIEW_REQUIRE_TEST_INPUTS").is_none(),
            "valgrind's dh_view.html is missing (apt-get install valgrind)"
        );
        eprintln!("skipping: valgrind's dh_view.html is missing");
        return;
    }
    if !require_tool("chromium", &["--version"], "apt-get install chromium") {
        return;
    }
    let dir = scratch("dhat");
    let snap = snapshot("lm_train_step_b");
    let out = dir.join("run.dhat.json");
    export(&snap, &out, &[]);
    let doc: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(doc["dhatFileVersion"], 2);
    // At the global peak, the points hold the peak of live bytes `stats` gives.
    let stats = json(&["stats", &snap, "--json"]);
    let at_peak: u64 = doc["pps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["gb"].as_u64().unwrap())
        .sum();
    assert_eq!(at_peak, stats["peak_live_bytes"].as_u64().unwrap());
    // dh_view reads its data from a file input; the page here hands it the same object.
    for f in ["dh_view.html", "dh_view.js", "dh_view.css"] {
        std::fs::copy(viewer.with_file_name(f), dir.join(f)).unwrap();
    }
    let data = std::fs::read_to_string(&out).unwrap();
    std::fs::write(
        dir.join("load.js"),
        format!(
            "window.addEventListener('load', function () {{ tryFunc(function () {{\n\
             gFilename = 'run.dhat.json'; gData = {data}; buildTree(); displayTree(0, 0, 0); }}); }});\n"
        ),
    )
    .unwrap();
    let page = std::fs::read_to_string(dir.join("dh_view.html"))
        .unwrap()
        .replace("</body>", "<script src=\"load.js\"></script></body>");
    std::fs::write(dir.join("view.html"), page).unwrap();
    let dom = chromium_dom(&format!("file://{}", dir.join("view.html").display()));
    assert!(
        !dom.contains("class=\"error\""),
        "dh_view raised an error: {dom:.3000}"
    );
    assert!(
        dom.contains("Command: lm_train_step_b.pickle"),
        "{dom:.3000}"
    );
    let peak = stats["peak_live_bytes"].as_u64().unwrap();
    let shown = format!("At t-gmax: {} bytes (100%)", allocview::format::count(peak));
    assert!(dom.contains(&shown), "{shown} in {dom:.3000}");
    assert!(dom.contains("step ("), "the optimizer's frame is a node");
}

#[test]
fn a_chrome_trace_has_a_counter_track_per_policy_from_the_bucketed_series() {
    let dir = scratch("chrome");
    let snap = snapshot("lm_train_step_b");
    let out = dir.join("run.trace.json");
    export(&snap, &out, &["--policy", "pytorch,bfc"]);
    let doc: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "M")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"pytorch") && names.contains(&"bfc"),
        "{names:?}"
    );
    // Every event is one the format defines, with the fields its phase needs.
    for e in events {
        let ph = e["ph"].as_str().unwrap();
        assert!(["M", "C", "i", "X"].contains(&ph), "{e}");
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
        if ph != "M" {
            assert!(e["ts"].as_f64().is_some_and(|t| t >= 0.0), "{e}");
        }
    }
    // The footprint track's largest value is compare's peak footprint, and an instant marks it.
    let compare = json(&["compare", &snap, "--json", "--policy", "pytorch,bfc"]);
    for (pid, name) in [(1, "pytorch"), (2, "bfc")] {
        let peak = compare["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["peak_footprint_bytes"]
            .as_u64()
            .unwrap();
        let track_max = events
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == "bytes" && e["pid"] == pid)
            .map(|e| e["args"]["footprint"].as_u64().unwrap())
            .max()
            .unwrap();
        assert_eq!(track_max, peak, "{name}");
        assert!(events.iter().any(|e| e["ph"] == "i"
            && e["pid"] == pid
            && e["name"].as_str().unwrap().starts_with("peak footprint")));
    }
    // Built from buckets: a bounded number of events, whatever the input's length.
    let counters = events.iter().filter(|e| e["ph"] == "C").count();
    assert!(counters <= 2 * 2 * 4096, "{counters}");
}

#[test]
fn the_format_comes_from_to_or_the_output_s_name_and_a_nameless_one_is_refused() {
    let dir = scratch("names");
    let snap = snapshot("lm_forward_a");
    let out = dir.join("profile.bin");
    let err = common::fails(&["export", &snap, "-o", out.to_str().unwrap()]);
    assert!(err.contains("--to pprof|speedscope|chrome|dhat"), "{err}");
    export(&snap, &out, &["--to", "pprof"]);
    assert_eq!(&std::fs::read(&out).unwrap()[..2], &[0x1f, 0x8b], "gzipped");
    let err = common::fails(&[
        "export",
        &snap,
        "-o",
        out.to_str().unwrap(),
        "--to",
        "flame",
    ]);
    assert!(err.contains("expected a format"), "{err}");
    // `--to TIME` is still the end of the window, as in every command.
    let trace = common::sample("python_fragments.trace.gz");
    let trace = trace.to_str().unwrap();
    let early = dir.join("early.speedscope.json");
    export(trace, &early, &["--to", "0.2s", "--at", "end"]);
    let whole = dir.join("whole.speedscope.json");
    export(trace, &whole, &["--at", "end"]);
    let allocated = |p: &Path| {
        let d: Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        d["profiles"][1]["endValue"].as_u64().unwrap()
    };
    let (early, whole) = (allocated(&early), allocated(&whole));
    assert!(
        0 < early && early < whole,
        "the window holds fewer allocations: {early} {whole}"
    );
}
