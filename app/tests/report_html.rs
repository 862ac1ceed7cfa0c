//! `report --html` and `diff --html` in a real browser: the page is written, is small and
//! fetches nothing, and headless Chromium loads it from a file without a script error and
//! draws its timeline, heap map and sites table (the DOM says so, and the pixels of each area
//! are not blank). Skips (with a message) where chromium is not installed, unless
//! `ALLOCVIEW_REQUIRE_TEST_INPUTS` is set; CI installs it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{ok, repo_arg};

/// The page must stay under this for any input.
const MAX_PAGE_BYTES: u64 = 5 << 20;

fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser"].into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("ALLOCVIEW_REQUIRE_TEST_INPUTS").is_none(),
            "a required test tool is missing: chromium (apt-get install chromium)"
        );
        eprintln!("skipping: chromium is missing (apt-get install chromium)");
    }
    found
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("report-html-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Headless Chromium on `page` at 1400 x `height`: the DOM after its scripts ran, or with
/// `screenshot`, a PNG of the window there.
fn chromium_run(browser: &str, page: &Path, height: u32, screenshot: Option<&Path>) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--virtual-time-budget=10000",
    ])
    .arg(format!("--window-size=1400,{height}"))
    .arg(format!("--user-data-dir={}", profile.path().display()));
    match screenshot {
        Some(png) => cmd.arg(format!("--screenshot={}", png.display())),
        None => cmd.arg("--dump-dom"),
    };
    let out = cmd
        .arg(format!("file://{}", page.canonicalize().unwrap().display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The start tag of the element with `id` in `dom`.
fn tag_with_id<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let start = dom[..at].rfind('<')?;
    let end = at + dom[at..].find('>')?;
    Some(&dom[start..=end])
}

/// The `data-rect` (x, y, width, height in CSS pixels) of a drawn area.
fn rect_of(tag: &str) -> (u32, u32, u32, u32) {
    let at = tag.find("data-rect=\"").unwrap() + "data-rect=\"".len();
    let text = &tag[at..at + tag[at..].find('"').unwrap()];
    let v: Vec<u32> = text.split(',').map(|x| x.parse().unwrap()).collect();
    (v[0], v[1], v[2], v[3])
}

/// The area's pixels are a drawing: several colours and a good share off the background.
fn assert_drawn(img: &image::RgbaImage, (x, y, w, h): (u32, u32, u32, u32), what: &str) {
    assert!(
        x + w <= img.width() && y + h <= img.height(),
        "{what} at {x},{y} {w}x{h} is outside the {}x{} screenshot",
        img.width(),
        img.height()
    );
    let background = *img.get_pixel(x + 2, y + 2);
    let mut colours = HashSet::new();
    let mut off = 0u64;
    for yy in y..y + h {
        for xx in x..x + w {
            let p = img.get_pixel(xx, yy);
            colours.insert(p.0);
            if *p != background {
                off += 1;
            }
        }
    }
    let total = u64::from(w) * u64::from(h);
    assert!(colours.len() >= 8, "{what}: only {} colours", colours.len());
    assert!(
        off * 50 > total,
        "{what}: {off} of {total} pixels differ from the background"
    );
}

/// Checks a written page: its size, that it fetches nothing, that Chromium runs it without
/// a script error and draws `areas` (element ids), whose pixels are not blank. Saves a
/// 1400x900 screenshot beside it; returns the page's size in bytes.
fn check_page(page: &Path, areas: &[&str]) -> u64 {
    let html = std::fs::read_to_string(page).unwrap();
    let size_bytes = html.len() as u64;
    assert!(
        size_bytes < MAX_PAGE_BYTES,
        "{} is {size_bytes} bytes",
        page.display()
    );
    for fetch in [
        "http://",
        "https://",
        "<link",
        "<script src",
        "<img",
        "@import",
    ] {
        assert!(!html.contains(fetch), "the page holds {fetch:?}");
    }
    let Some(browser) = chromium() else {
        return size_bytes;
    };
    let dom = chromium_run(browser, page, 900, None);
    assert!(
        !dom.contains("class=\"script-error\""),
        "the page raised a script error:\n{}",
        dom.lines()
            .filter(|l| l.contains("script-error"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        dom.contains("data-ready=\"1\""),
        "the page's script did not finish"
    );
    // A tall window holds every area, for their pixels.
    let tall = page.with_extension("tall.png");
    chromium_run(browser, page, 5000, Some(&tall));
    let img = image::open(&tall).unwrap().to_rgba8();
    for id in areas {
        let tag = tag_with_id(&dom, id).unwrap_or_else(|| panic!("no #{id} in the page"));
        assert!(
            tag.contains("data-drawn=\"1\""),
            "#{id} was not drawn: {tag}"
        );
        assert_drawn(&img, rect_of(tag), id);
    }
    let shot = page.with_extension("png");
    chromium_run(browser, page, 900, Some(&shot));
    eprintln!("screenshot: {}", shot.display());
    size_bytes
}

fn report_html(input: &str, name: &str, extra: &[&str]) -> PathBuf {
    let out = scratch(name).join(format!("{name}.html"));
    let mut args = vec!["report", input, "--html", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let stdout = ok(&args);
    assert!(stdout.contains("wrote"), "{stdout}");
    out
}

#[test]
fn report_html_of_a_malloc_trace_draws_every_area() {
    let page = report_html(
        &repo_arg("sample-traces/python_json.avt"),
        "malloc",
        &["--policy", "glibc,bfc,first-fit"],
    );
    check_page(
        &page,
        &[
            "timeline",
            "heapmap",
            "sites-table",
            "flamegraph",
            "classes",
        ],
    );
}

#[test]
fn report_html_of_a_pytorch_snapshot_draws_every_area() {
    let page = report_html(
        &repo_arg("sample-traces/pytorch/lm_train_step_b.pickle"),
        "snapshot",
        &[],
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("\"segments\":[["), "no segments in the page");
    // The sites' stacks hold the training script's Python frames.
    assert!(html.contains(".py\","), "no Python frame in the sites");
    check_page(
        &page,
        &[
            "timeline",
            "heapmap",
            "sites-table",
            "flamegraph",
            "classes",
        ],
    );
}

#[test]
fn report_html_of_a_tf_memory_log_and_a_dump() {
    let page = report_html(
        &repo_arg("loaders/tests/data/tf/mobilenetv2_train_memlog.txt.gz"),
        "memlog",
        &[],
    );
    check_page(&page, &["timeline", "heapmap", "sites-table"]);
    // A dump is a heap at one moment: its chunks as a heap map, and its bins.
    let page = report_html(
        &repo_arg("loaders/tests/data/tf/mobilenetv2_oom_dump.txt.gz"),
        "dump",
        &[],
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("\"bins\":[{"), "no bins in the dump's page");
    check_page(&page, &["heapmap"]);
}

#[test]
fn diff_html_overlays_two_runs() {
    let out = scratch("diff").join("diff.html");
    let stdout = ok(&[
        "diff",
        &repo_arg("sample-traces/pytorch/lm_train_step_a.pickle"),
        &repo_arg("sample-traces/pytorch/lm_train_step_b.pickle"),
        "--html",
        out.to_str().unwrap(),
    ]);
    assert!(stdout.contains("wrote"), "{stdout}");
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(html.contains("\"kind\":\"diff\""));
    assert!(html.contains("lm_train_step_a.pickle") && html.contains("lm_train_step_b.pickle"));
    check_page(&out, &["timeline", "sites-table"]);
}

#[test]
fn report_html_of_a_streamed_trace_draws_what_a_stream_gives() {
    // Read block by block, as a trace too big for memory is: the timeline, the heaps at the
    // peak and the size classes are drawn; the page says why the sites are not there.
    let trace = repo_arg("sample-traces/python_json.avt");
    let page = report_html(&trace, "streamed", &["--stream", "--policy", "glibc,bfc"]);
    check_page(&page, &["timeline", "heapmap", "classes"]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("read block by block (--stream)"), "the note");
    // The same peak as the page of the trace loaded whole.
    let loaded = report_html(&trace, "streamed-loaded", &["--policy", "glibc,bfc"]);
    let peak = |p: &std::path::Path| {
        let text = std::fs::read_to_string(p).unwrap();
        let at = text.find("\"peak_live_bytes\":").unwrap() + "\"peak_live_bytes\":".len();
        text[at..].split([',', '}']).next().unwrap().to_owned()
    };
    assert_eq!(peak(&page), peak(&loaded));
}

/// Drives the page as a reader does, with the browser's own events, and writes what it saw
/// into the DOM: the timeline's readout under the pointer before and after a wheel zoom, the
/// heap map's readout of a block, the flame graph's readouts around a click on a frame, and the
/// search's matched share.
const INTERACT_JS: &str = r##"
window.addEventListener("load", function () {
  setTimeout(function () {
    var out = {};
    var tip = document.querySelector(".tip");
    function at(canvas, fx, fy, type, extra) {
      var r = canvas.getBoundingClientRect();
      var init = Object.assign({ clientX: r.left + r.width * fx, clientY: r.top + r.height * fy,
                                 bubbles: true, cancelable: true }, extra || {});
      canvas.dispatchEvent(type === "wheel" ? new WheelEvent("wheel", init) : new MouseEvent(type, init));
      return tip.textContent;
    }
    var tl = document.querySelector("#timeline canvas");
    out.hover_before = at(tl, 0.6, 0.5, "mousemove");
    for (var i = 0; i < 5; i++) at(tl, 0.3, 0.5, "wheel", { deltaY: -100 });
    out.hover_after = at(tl, 0.6, 0.5, "mousemove");
    out.heap = at(document.querySelector("#heapmap canvas"), 0.5, 0.3, "mousemove");
    var search = document.querySelector("input[type=search]");
    search.value = "size class 10";
    search.dispatchEvent(new Event("input"));
    out.found = search.parentNode.querySelector("span").textContent;
    search.value = "";
    search.dispatchEvent(new Event("input"));
    var fl = document.querySelector("#flamegraph canvas");
    var y = 1.5 * 18 / fl.getBoundingClientRect().height;
    out.flame_left_before = at(fl, 0.03, y, "mousemove");
    out.flame_clicked = at(fl, 0.97, y, "mousemove");
    at(fl, 0.97, y, "click");
    out.flame_left_after = at(fl, 0.03, y, "mousemove");
    var pre = document.createElement("pre");
    pre.id = "interaction";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }, 200);
});
"##;

#[test]
fn the_timeline_zooms_the_flame_graph_zooms_and_searches_under_real_events() {
    let Some(browser) = chromium() else {
        return;
    };
    let page = report_html(
        &repo_arg("sample-traces/python_json.avt"),
        "interact",
        &["--policy", "glibc"],
    );
    let driven = page.with_file_name("driven.html");
    let html = std::fs::read_to_string(&page).unwrap();
    let script = format!("<script>{INTERACT_JS}</script></body>");
    std::fs::write(&driven, html.replacen("</body>", &script, 1)).unwrap();
    let dom = chromium_run(browser, &driven, 900, None);
    let at = dom
        .find("<pre id=\"interaction\">")
        .expect("the driver ran")
        + 22;
    let text = &dom[at..at + dom[at..].find("</pre>").unwrap()];
    let v: serde_json::Value = serde_json::from_str(&text.replace("&quot;", "\"")).unwrap();
    let s = |k: &str| v[k].as_str().unwrap().to_owned();
    // The readout names the time and the live bytes under the pointer; zoomed in, the same
    // point of the canvas is an earlier time (the zoom was centred left of it).
    assert!(s("hover_before").starts_with("t = ") && s("hover_before").contains("live bytes"));
    assert_ne!(
        s("hover_before"),
        s("hover_after"),
        "the wheel zoomed the timeline"
    );
    // A click on a frame of the flame graph's second row, near its right edge, zooms into it:
    // the frame then fills the width, so the row's left end names it too.
    let first = |k: &str| s(k).lines().next().unwrap_or_default().to_owned();
    assert!(s("flame_clicked").contains(" of all"), "{v}");
    assert_ne!(first("flame_left_before"), first("flame_clicked"), "{v}");
    assert_eq!(
        first("flame_left_after"),
        first("flame_clicked"),
        "the click zoomed: {v}"
    );
    // The heap map names the block under the pointer.
    assert!(
        s("heap").starts_with("cell ") && s("heap").contains(" block of "),
        "{v}"
    );
    assert!(s("found").starts_with("matched "), "{v}");
    assert!(!s("found").starts_with("matched 0 B"), "{v}");
}
