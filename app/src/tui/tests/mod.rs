//! The terminal explorer on ratatui's TestBackend: whole screens as snapshots, plus the
//! behaviour behind the keys, on a real trace.

use std::path::{Path, PathBuf};

use allocview_sim::policy::config::PolicyConfig;
use crossterm::event::{
    Event, KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::layout::Rect;

use super::{keys, render};
use allocview_sim::policy::spec::PolicySpec;

use crate::model::state::{AppState, Mode, PromptKind};

use crate::model::update::{Msg, update};
use crate::model::workers::load_blocking;

pub(super) fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sample-traces")
        .join(name)
}

pub(super) fn specs(names: &[&'static str]) -> Vec<PolicySpec> {
    names.iter().map(|&n| PolicySpec::plain(n)).collect()
}

/// `path` opened on the window `events` with first-fit, loaded and replayed, the cursor sent
/// to `goto` as the frontends send a part's.
pub(super) fn windowed(path: &Path, events: &str, goto: Option<String>) -> AppState {
    let mut s = AppState::new(path, &specs(&["first-fit"]), PolicyConfig::default());
    s.window = crate::session::WindowArgs {
        events: Some(events.to_owned()),
        ..Default::default()
    };
    s.initial_goto = goto;
    load_blocking(&mut s, false, 1).unwrap();
    s
}

pub(super) fn loaded(trace: &str, policies: &[&'static str]) -> AppState {
    // Paths in snapshots must not depend on where the checkout lives.
    let mut state = AppState::new(&sample(trace), &specs(policies), PolicyConfig::default());
    load_blocking(&mut state, false, 2).unwrap();
    state.path = PathBuf::from(trace);
    if let Some(d) = state.data.as_mut()
        && let Some(d) = std::sync::Arc::get_mut(d)
    {
        d.path = PathBuf::from(trace);
    }
    state
}

pub(super) fn screen(state: &mut AppState, w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    render(&mut t, state).unwrap();
    t.backend().to_string()
}

pub(super) fn key(c: char) -> Event {
    Event::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE))
}

pub(super) fn send(state: &mut AppState, ev: &Event) {
    send_with_strip(state, ev, None);
}

/// [`send`], with the whole trace's strip at `strip` on screen.
pub(super) fn send_with_strip(state: &mut AppState, ev: &Event, strip: Option<Rect>) {
    let timeline = Some(Rect::new(10, 2, 100, 10));
    if let Some(msg) = keys::to_msg(ev, state.prompt.is_some(), timeline, strip) {
        let mut next = Some(msg);
        while let Some(m) = next.take() {
            next = update(state, m);
        }
    }
}

pub(super) fn type_text(state: &mut AppState, text: &str) {
    for c in text.chars() {
        send(state, &key(c));
    }
    send(
        state,
        &Event::Key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE)),
    );
}

mod parts;

#[test]
fn full_screen_at_the_peak() {
    let mut s = loaded("find_usr_include.trace.gz", &["first-fit", "best-fit"]);
    send(&mut s, &key('g'));
    type_text(&mut s, "22255");
    assert_eq!(s.cursor, 22_255);
    let text = screen(&mut s, 140, 44);
    // The reference peak: 247,976 live bytes at event 22,255.
    assert!(text.contains("event 22,255/40,402"), "{text}");
    assert!(text.contains("live 242 KiB"), "{text}");
    assert!(text.contains("heap: first-fit"), "{text}");
    insta::assert_snapshot!("find_at_peak", text);
}

#[test]
fn bfc_shows_its_bins_beside_the_heap() {
    let mut s = loaded("xz_T2_8KiB_blocks.trace.gz", &["bfc"]);
    update(&mut s, Msg::End);
    let text = screen(&mut s, 150, 46);
    assert!(text.contains("BFC bins"), "{text}");
    assert!(text.contains("heap: bfc"), "{text}");
    insta::assert_snapshot!("xz_bfc_end", text);
}

#[test]
fn comparison_view_puts_every_policy_side_by_side() {
    let mut s = loaded("xz_T2_8KiB_blocks.trace.gz", &["bfc", "first-fit", "buddy"]);
    send(&mut s, &key('c'));
    assert_eq!(s.mode, Mode::Compare);
    update(&mut s, Msg::Step(5000));
    let text = screen(&mut s, 160, 44);
    for p in ["heap: bfc", "heap: first-fit", "heap: buddy"] {
        assert!(text.contains(p), "{p} missing:\n{text}");
    }
    // Every policy was seeked to the same cursor.
    let cursors: Vec<usize> = s.heaps.iter().flatten().map(|h| h.event).collect();
    assert_eq!(cursors, vec![5000; 3]);
    insta::assert_snapshot!("xz_compare", text);
}

#[test]
fn help_overlay_lists_the_keys() {
    let mut s = loaded("find_usr_include.trace.gz", &["first-fit"]);
    send(&mut s, &key('?'));
    let text = screen(&mut s, 120, 40);
    assert!(text.contains("keys (? to close)"), "{text}");
    assert!(text.contains("next / previous mark, peak or OOM"), "{text}");
    assert!(text.contains("follow the newest event"), "{text}");
    send(&mut s, &key('q'));
    assert!(!s.help && !s.quit, "q closes the help first");
    send(&mut s, &key('q'));
    assert!(s.quit);
}

#[test]
fn tiny_and_odd_terminals_never_panic() {
    let mut s = loaded("xz_T2_8KiB_blocks.trace.gz", &["bfc", "buddy"]);
    for (w, h) in [
        (1, 1),
        (10, 3),
        (19, 5),
        (20, 6),
        (30, 8),
        (45, 12),
        (80, 24),
        (300, 100),
    ] {
        let text = screen(&mut s, w, h);
        assert_eq!(text.lines().count(), usize::from(h));
        send(&mut s, &key('c'));
        screen(&mut s, w, h);
        send(&mut s, &key('?'));
        screen(&mut s, w, h);
        send(&mut s, &key('?'));
    }
}

#[test]
fn stepping_keys_move_the_cursor() {
    let mut s = loaded("find_usr_include.trace.gz", &["first-fit"]);
    screen(&mut s, 120, 40);
    let page = s.page_rows as i64;
    assert!(page > 3);
    send(&mut s, &key('l'));
    send(
        &mut s,
        &Event::Key(KeyEvent::new(KeyCode::Right, KeyModifiers::NONE)),
    );
    assert_eq!(s.cursor, 2);
    send(&mut s, &key('h'));
    assert_eq!(s.cursor, 1);
    send(
        &mut s,
        &Event::Key(KeyEvent::new(KeyCode::PageDown, KeyModifiers::NONE)),
    );
    assert_eq!(s.cursor as i64, 1 + page);
    send(&mut s, &key('k'));
    assert_eq!(s.cursor, 1);
    send(
        &mut s,
        &Event::Key(KeyEvent::new(KeyCode::End, KeyModifiers::NONE)),
    );
    assert_eq!(s.cursor, 40_402);
    send(&mut s, &key(']'));
    assert_eq!(s.cursor, 40_402, "clamped at the end");
    send(&mut s, &key('['));
    assert!(s.cursor < 40_402);
    send(
        &mut s,
        &Event::Key(KeyEvent::new(KeyCode::Home, KeyModifiers::NONE)),
    );
    assert_eq!(s.cursor, 0);
    send(&mut s, &key(']'));
    assert!(s.cursor > 0);
}

#[test]
fn the_explorer_loads_only_the_window_with_its_live_blocks_carried_in() {
    let path = sample("find_usr_include.trace.gz");
    let mut whole = AppState::new(&path, &specs(&["first-fit"]), PolicyConfig::default());
    load_blocking(&mut whole, false, 1).unwrap();
    let s = windowed(&path, "20000..25000", None);
    let live_at = |st: &AppState, event: usize| {
        let (_, c) = st
            .selected_replay()
            .unwrap()
            .state_at(&st.data.as_ref().unwrap().view(), event)
            .unwrap();
        allocview_sim::metrics::live_bytes(&c)
    };
    // The window's rows: the allocations live before event 20000, then its 5000 events.
    let carried = s.events() - 5_000;
    assert!(carried > 0);
    for j in [0, 1, 2_500, 4_999] {
        assert_eq!(
            live_at(&s, carried + j),
            live_at(&whole, 20_000 + j),
            "event {j}"
        );
    }
}

/// Workers whose state the frontend has left (`cancel` set) stop their replays and report
/// nothing: the old part's memory goes with them.
#[test]
fn workers_of_a_cancelled_state_stop_their_replays() {
    let path = sample("find_usr_include.trace.gz");
    let mut s = AppState::new(
        &path,
        &specs(&["first-fit", "bfc"]),
        PolicyConfig::default(),
    );
    s.cancel.store(true, std::sync::atomic::Ordering::Relaxed);
    load_blocking(&mut s, false, 2).unwrap();
    assert!(s.data.is_some());
    assert!(
        s.policies
            .iter()
            .all(|p| matches!(p.status, crate::model::state::RunStatus::Pending))
    );
}

#[test]
fn goto_accepts_events_and_times() {
    let mut s = loaded("find_usr_include.trace.gz", &["first-fit"]);
    send(&mut s, &key('g'));
    assert_eq!(s.prompt.as_ref().map(|p| p.kind), Some(PromptKind::Goto));
    type_text(&mut s, "25.83ms");
    // The reference peak is at t = 0.025830 s; the first event at that time:
    let data = s.data.clone().unwrap();
    let v = data.view();
    assert_eq!(v.t_ns[s.cursor] - v.t_ns[0], 25_830_000);
    assert!(s.cursor == 0 || v.t_ns[s.cursor - 1] - v.t_ns[0] < 25_830_000);
    send(&mut s, &key('g'));
    type_text(&mut s, "nonsense");
    assert!(
        s.message
            .as_deref()
            .unwrap_or("")
            .contains("expected an event number")
    );
}

#[test]
fn next_mark_reaches_the_reference_peak_and_ooms() {
    let mut s = loaded("find_usr_include.trace.gz", &["first-fit"]);
    let mut visited = Vec::new();
    for _ in 0..200 {
        let before = s.cursor;
        send(&mut s, &key('n'));
        if s.cursor == before {
            break;
        }
        visited.push(s.cursor);
    }
    assert!(
        visited.contains(&22_255),
        "peak live event not among {visited:?}"
    );
    assert!(visited.windows(2).all(|w| w[0] < w[1]));
    send(&mut s, &key('N'));
    assert!(s.cursor < *visited.last().unwrap());

    // Under a limit, the OOM events are marks too.
    let mut s = AppState::new(
        &sample("xz_T2_8KiB_blocks.trace.gz"),
        &specs(&["bfc"]),
        PolicyConfig {
            limit_bytes: Some(150 << 20),
            ..PolicyConfig::default()
        },
    );
    load_blocking(&mut s, false, 1).unwrap();
    let oom = s.selected_replay().unwrap().ooms[0].event;
    for _ in 0..100 {
        send(&mut s, &key('n'));
        if s.cursor == oom {
            break;
        }
    }
    assert_eq!(s.cursor, oom);
    assert!(
        s.message
            .as_deref()
            .unwrap_or("")
            .starts_with("OOM at event")
    );
}

#[test]
fn policy_cycling_and_zoom() {
    let mut s = loaded(
        "find_usr_include.trace.gz",
        &["first-fit", "best-fit", "buddy"],
    );
    send(&mut s, &key('p'));
    assert_eq!(s.selected, 1);
    send(&mut s, &key('P'));
    send(&mut s, &key('P'));
    assert_eq!(s.selected, 2);
    update(&mut s, Msg::Step(20_000));
    send(&mut s, &key('+'));
    let (lo, hi) = s.zoom;
    assert!((hi - lo - 0.5).abs() < 1e-9);
    let span = s.bucketing().unwrap().span_ns as f64;
    let c = s.cursor_t_ns() as f64 / span;
    assert!(lo <= c && c <= hi);
    send(&mut s, &key('-'));
    send(&mut s, &key('-'));
    assert_eq!(s.zoom, (0.0, 1.0));
}

#[test]
fn filter_limits_the_event_list() {
    let mut s = loaded("xz_T2_8KiB_blocks.trace.gz", &["first-fit"]);
    send(&mut s, &key('/'));
    type_text(&mut s, "thread=1");
    assert_eq!(s.filter.thread, Some(1));
    let text = screen(&mut s, 140, 44);
    assert!(text.contains("events [thread=1]"), "{text}");
    // Thread 1 has 9 events; every listed row except the cursor's belongs to it.
    let data = s.data.clone().unwrap();
    let vp = crate::model::view::Viewport {
        timeline_points: 100,
        heap_cells: 100,
        event_rows: 30,
        heat_columns: 20,
        plan_size: (40, 20),
    };
    let vm = crate::model::view::view_model(&s, &vp);
    let rows: Vec<_> = vm.events.iter().filter(|r| !r.is_cursor).collect();
    assert_eq!(rows.len(), 9);
    assert!(rows.iter().all(|r| data.thread_at(r.index) == 1));
    send(&mut s, &key('/'));
    type_text(&mut s, "size=64..127 class=7");
    assert_eq!(s.filter.min_size_bytes, Some(64));
    assert_eq!(s.filter.class, Some(7));
    send(&mut s, &key('/'));
    type_text(&mut s, "colour=blue");
    assert!(
        s.message
            .as_deref()
            .unwrap_or("")
            .contains("unknown filter")
    );
}

#[test]
fn mouse_scrubs_the_timeline() {
    let mut s = loaded("find_usr_include.trace.gz", &["first-fit"]);
    // The test's plot area is x 10..110: a click at its middle goes to mid-trace.
    let click = |col| {
        Event::Mouse(MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column: col,
            row: 5,
            modifiers: KeyModifiers::NONE,
        })
    };
    send(&mut s, &click(60));
    let span = s.bucketing().unwrap().span_ns as f64;
    let at = s.cursor_t_ns() as f64 / span;
    assert!((at - 50.0 / 99.0).abs() < 0.02, "cursor at {at}");
    let before = s.cursor;
    send(
        &mut s,
        &Event::Mouse(MouseEvent {
            kind: MouseEventKind::Drag(MouseButton::Left),
            column: 100,
            row: 5,
            modifiers: KeyModifiers::NONE,
        }),
    );
    assert!(s.cursor > before);
    // Outside the plot: ignored.
    let before = s.cursor;
    send(&mut s, &click(200));
    assert_eq!(s.cursor, before);
}

#[test]
fn export_writes_series_csv_and_heap_text() {
    let mut s = loaded("find_usr_include.trace.gz", &["first-fit", "bfc"]);
    let dir_guard = tempfile::Builder::new()
        .prefix("allocview-export-")
        .tempdir()
        .unwrap();
    let dir = dir_guard.path().to_path_buf();
    s.export_dir = dir.clone();
    update(&mut s, Msg::Step(22_255));
    send(&mut s, &key('e'));
    let msg = s.message.clone().unwrap();
    assert!(msg.starts_with("exported"), "{msg}");
    let csv = std::fs::read_to_string(dir.join("find_usr_include-event22255-series.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("policy,bucket,t_start_s"));
    // Both replayed policies, every bucket of the (unzoomed) timeline.
    assert_eq!(lines.len(), 1 + 2 * crate::model::state::BUCKETS);
    let peak_live: u64 = lines[1..]
        .iter()
        .map(|l| l.split(',').nth(5).unwrap().parse::<u64>().unwrap())
        .max()
        .unwrap();
    assert_eq!(peak_live, 247_976, "the CSV keeps the exact peak");
    let txt = std::fs::read_to_string(dir.join("find_usr_include-event22255-heap.txt")).unwrap();
    assert!(txt.contains("first-fit: footprint"), "{txt}");
    assert!(!txt.contains("bfc: footprint"), "only the policy on screen");
}

#[test]
fn load_error_is_shown_not_panicked() {
    let dir_guard = tempfile::Builder::new()
        .prefix("allocview-tui-")
        .tempdir()
        .unwrap();
    let dir = dir_guard.path().to_path_buf();
    let bad = dir.join("bad.trace");
    std::fs::write(&bad, "0.1\t1\t8\t0x10\n0.2\t1\tx\t0x20\n").unwrap();
    let mut s = AppState::new(&bad, &specs(&["first-fit"]), PolicyConfig::default());
    let (tx, rx) = std::sync::mpsc::channel();
    crate::model::workers::start_workers(&s, false, 1, &tx);
    drop(tx);
    for m in rx {
        update(&mut s, m);
    }
    let text = screen(&mut s, 100, 20);
    assert!(text.contains("could not load the trace"), "{text}");
    assert!(text.contains("line 2"), "{text}");
}

fn tf_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../loaders/tests/data/tf")
        .join(name)
}

#[test]
fn a_bfc_dump_shows_its_heap_bins_and_diagnosis() {
    let mut s = AppState::new(
        &tf_fixture("mobilenetv2_oom_memlog_dump.txt.gz"),
        &specs(&["bfc"]),
        PolicyConfig::default(),
    );
    load_blocking(&mut s, false, 1).unwrap();
    // A memory log: events with their TensorFlow op, and the dump it ends in.
    let text = screen(&mut s, 170, 44);
    assert!(text.contains(" op "), "{text}");
    update(&mut s, Msg::End);
    let text = screen(&mut s, 170, 44);
    assert!(
        text.contains("alloc_failed"),
        "the OOM request is the last event:\n{text}"
    );

    let mut s = AppState::new(
        &tf_fixture("mobilenetv2_oom_dump.txt.gz"),
        &specs(&["bfc"]),
        PolicyConfig::default(),
    );
    load_blocking(&mut s, false, 1).unwrap();
    s.export_dir = std::env::temp_dir();
    let text = screen(&mut s, 150, 44);
    for want in [
        "TensorFlow BFC dump",
        "OOM: 98.00MiB requested (rounded to 102760448)",
        "not enough memory",
        "heap: TensorFlow dump of bfc_cpu_allocator_for_gpu",
        "BFC bins",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
    // One moment of a heap: no empty event list or class history, and the heap's box takes
    // most of the screen (its top border is within the first third).
    assert!(!text.contains("no events"), "{text}");
    assert!(!text.contains("size classes over time"), "{text}");
    let heap_top = text
        .lines()
        .position(|l| l.contains("heap: TensorFlow dump"))
        .unwrap();
    assert!(
        heap_top < 44 / 3,
        "heap box starts on row {heap_top}:\n{text}"
    );
    // Keys do not panic on a history-less input.
    for c in ['l', 'h', ']', 'n', 'p', 'c', '+', 'e'] {
        send(&mut s, &key(c));
        screen(&mut s, 150, 44);
    }
}

#[test]
fn a_plan_shows_its_picture_and_the_bound() {
    let plan = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/plans/resnet50.csv");
    let mut s = AppState::new(&plan, &specs(&["bfc"]), PolicyConfig::default());
    load_blocking(&mut s, false, 1).unwrap();
    let text = screen(&mut s, 120, 36);
    assert!(
        text.contains("176 buffers; lower bound (max live) 9.19 MiB"),
        "{text}"
    );
    assert!(
        text.contains("> greedy-by-size: 9.19 MiB (1.000 x the bound)"),
        "{text}"
    );
    assert!(
        text.contains("pushdown: 10.7 MiB (1.167 x the bound)"),
        "{text}"
    );
    assert!(text.contains("─ lower bound 9.19 MiB"), "{text}");
    // p shows the next plan.
    send(&mut s, &key('p'));
    let text = screen(&mut s, 120, 36);
    assert!(text.contains("plan: pushdown"), "{text}");
    assert!(text.contains("> pushdown"), "{text}");
    for (w, h) in [(20, 6), (40, 10), (200, 60)] {
        screen(&mut s, w, h);
    }
}

#[test]
fn a_pytorch_snapshot_shows_its_recorded_heap_phases_and_frames() {
    let mut s = AppState::new(
        &sample("pytorch/lm_train_step_b.pickle"),
        &specs(&["pytorch", "bfc"]),
        PolicyConfig::default(),
    );
    load_blocking(&mut s, false, 2).unwrap();
    let data = s.data.clone().unwrap();
    assert_eq!(data.format, "pytorch-snapshot");
    // The allocation of 147 MiB at 17.555 ms, made in model.py's forward (line 41).
    let view = data.view();
    let at = (0..view.len())
        .find(|&i| {
            view.kind_at(i) == Some(allocview_sim::trace::EventKind::Alloc)
                && view.t_ns[i] == 17_555_000
                && view.size_bytes[i] > 100 << 20
        })
        .unwrap();
    update(&mut s, Msg::GotoEvent(at));
    let text = screen(&mut s, 170, 50);
    assert!(text.contains("frames of allocation"), "{text}");
    assert!(text.contains("at forward (model.py:41)"), "{text}");
    assert!(text.contains("phases: Optimizer.step#AdamW.step"), "{text}");
    assert!(text.contains("96 segments"), "{text}");
    // The heap is the recorded one: `pytorch` replayed the snapshot address for address, so
    // its footprint is what the segments held (3.95 GiB, no new segment in this trace).
    assert!(text.contains("footprint 3.95 GiB"), "{text}");
    // A carried-in allocation says why it has no frames.
    update(&mut s, Msg::Home);
    let text = screen(&mut s, 170, 50);
    assert!(
        text.contains("allocation 0: live before the trace"),
        "{text}"
    );
}

#[test]
fn the_sites_panel_attributes_memory_and_highlights_a_sites_blocks() {
    let mut s = AppState::new(
        &sample("pytorch/lm_train_step_b.pickle"),
        &specs(&["pytorch"]),
        PolicyConfig::default(),
    );
    load_blocking(&mut s, false, 1).unwrap();
    send(&mut s, &key('g'));
    type_text(&mut s, "peak");
    send(&mut s, &key('s'));
    let text = screen(&mut s, 170, 50);
    assert!(
        text.contains("sites at event 2,290 (call stacks)"),
        "{text}"
    );
    // The largest site first: the blocks allocated before the trace began.
    let rows = s.sites.rows().unwrap().clone();
    assert_eq!(rows[0].name, "(no stack recorded)");
    let step = rows.iter().position(|r| r.name == "step").unwrap();
    for _ in 0..step {
        send(&mut s, &key('>'));
    }
    assert_eq!(s.sites.selected_row().unwrap().name, "step");
    let text = screen(&mut s, 170, 50);
    // Its blocks are marked in the heap map, its stack shown, its line on the timeline.
    let vm = crate::model::view::view_model(
        &s,
        &crate::model::view::Viewport {
            timeline_points: 100,
            heap_cells: 4000,
            event_rows: 10,
            heat_columns: 50,
            plan_size: (10, 10),
        },
    );
    let selected = vm.heaps[0]
        .map
        .as_ref()
        .unwrap()
        .cells
        .iter()
        .filter(|&&c| c == crate::model::heapmap::CellKind::Selected)
        .count();
    assert!(selected > 0, "the site's blocks are marked");
    assert!(
        text.contains("at step (optimizer.py:74)") || text.contains("at step (optimizer.py:75)"),
        "{text}"
    );
    assert!(text.contains("site step live"), "{text}");
    let highlighted = s.sites.highlighted();
    assert_eq!(highlighted.len() as u64, rows[step].live_blocks);
    // Closing the panel brings the histogram back and clears the marks.
    send(&mut s, &key('s'));
    let text = screen(&mut s, 170, 50);
    assert!(text.contains("live by size class"), "{text}");
    assert!(s.sites.highlighted().is_empty());
}

/// A policy that plans before its replay (the oracle) says how far the plan has got instead of
/// "waiting to replay".
#[test]
fn a_planning_policy_shows_its_progress() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut s = loaded("find_usr_include.trace.gz", &["oracle"]);
    let slot = &mut s.policies[0];
    slot.status = crate::model::state::RunStatus::Pending;
    slot.progress.store(0, Relaxed);
    slot.preparing.total.store(4096, Relaxed);
    slot.preparing.done.store(1024, Relaxed);
    let text = screen(&mut s, 170, 50);
    assert!(
        text.contains("planning every allocation before the replay: 1,024 of 4,096 placed (25%)"),
        "{text}"
    );
}

/// On a narrow terminal the status line keeps the cursor's figures and gives up the start of
/// the file name instead, and the event list keeps whole columns.
#[test]
fn a_narrow_status_line_keeps_the_cursors_figures() {
    let mut s = loaded("find_usr_include.trace.gz", &["first-fit"]);
    let text = screen(&mut s, 100, 24);
    let status = text.lines().last().unwrap();
    assert!(status.contains("live 472 B  footprint 480 B"), "{status}");
    assert!(status.contains('…'), "{status}");
    // The event list drops its least important columns whole (address first) instead of
    // cutting every header to a stub.
    assert!(
        text.contains("event       kind         size         alloc id"),
        "{text}"
    );
    assert!(!text.contains("address"), "{text}");
    let text = screen(&mut s, 250, 24);
    let status = text.lines().last().unwrap();
    assert!(status.contains("find_usr_include.trace.gz"), "{status}");
    assert!(!status.contains('…'), "{status}");
}

/// Phase boundaries too dense to tell apart are not drawn over the lines; the timeline says how
/// many are in view instead.
#[test]
fn dense_phases_are_counted_not_drawn() {
    let mut s = AppState::new(
        &sample("pytorch/lm_train_step_b.pickle"),
        &specs(&["pytorch"]),
        PolicyConfig::default(),
    );
    load_blocking(&mut s, false, 1).unwrap();
    let vp = |points| crate::model::view::Viewport {
        timeline_points: points,
        heap_cells: 100,
        event_rows: 5,
        heat_columns: 10,
        plan_size: (10, 10),
    };
    let wide = crate::model::view::view_model(&s, &vp(2000));
    let t = wide.timeline.unwrap();
    assert!(!t.phases.is_empty());
    assert_eq!(t.phases.len(), t.phases_in_view);
    let narrow = crate::model::view::view_model(&s, &vp(t.phases_in_view * 16 - 1));
    let t2 = narrow.timeline.unwrap();
    assert!(t2.phases.is_empty());
    assert_eq!(t2.phases_in_view, t.phases_in_view);
}
