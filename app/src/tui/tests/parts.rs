//! The explorers' parts of a trace shown as a window: `g #N`, `{` and `}`, and a click on the
//! whole trace's strip.

use crossterm::event::{Event, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::layout::Rect;

use super::{key, loaded, sample, screen, send, send_with_strip, type_text, windowed};
use crate::model::workers::load_blocking;
use crate::tui::render;

/// Where a click on the strip counts is nothing when no strip is drawn: a trace shown whole,
/// or a window of a trace loaded whole (no background read, so no overview).
#[test]
fn no_strip_drawn_no_strip_to_click() {
    let mut t = Terminal::new(TestBackend::new(160, 50)).unwrap();
    let mut whole = loaded("find_usr_include.trace.gz", &["first-fit"]);
    assert_eq!(
        render(&mut t, &mut whole).unwrap().overview_strip,
        Rect::default()
    );
    let mut part = windowed(&sample("find_usr_include.trace.gz"), "20000..25000", None);
    assert_eq!(
        render(&mut t, &mut part).unwrap().overview_strip,
        Rect::default()
    );
}

/// A click on the whole trace's strip goes to the middle of the stretch its cell stands for:
/// the part of the same grid that holds that event opens with the cursor on it. A click
/// beside the strip does not.
#[test]
fn a_click_on_the_whole_trace_strip_opens_that_part() {
    use crossterm::event::{MouseButton, MouseEvent, MouseEventKind};
    let path = sample("find_usr_include.trace.gz");
    let mut s = windowed(&path, "20000..25000", None);
    let strip = Rect::new(2, 12, 8, 1);
    let click = |column: u16, row: u16| {
        Event::Mouse(MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column,
            row,
            modifiers: KeyModifiers::NONE,
        })
    };
    // Cell 6 of 8: 6.5 / 8 of 40,403 events is event 32,827.
    send_with_strip(&mut s, &click(8, 12), Some(strip));
    assert_eq!(
        s.reopen.take().unwrap().events.as_deref(),
        Some("30000..35000")
    );
    assert_eq!(s.reopen_goto.take().as_deref(), Some("#32827"));
    // Cell 4: event 22,726, in the part shown: the cursor moves there.
    let carried = s.events() - 5_000;
    send_with_strip(&mut s, &click(6, 12), Some(strip));
    assert!(s.reopen.is_none());
    assert_eq!(s.cursor, carried + 2_726);
    // Past the strip's end, and on the row above it.
    send_with_strip(&mut s, &click(10, 12), Some(strip));
    send_with_strip(&mut s, &click(8, 11), Some(strip));
    assert!(s.reopen.is_none());
    // A trace shown whole has no strip to go by.
    let mut whole = loaded("find_usr_include.trace.gz", &["first-fit"]);
    send_with_strip(&mut whole, &click(8, 12), Some(strip));
    assert!(whole.reopen.is_none());
}

/// `g #N` goes to event N of the whole trace: inside the part shown the cursor moves there
/// (past the carried-in allocations); elsewhere the part of the same grid that holds it is
/// asked for, and once it is open the cursor is on that event.
#[test]
fn goto_an_event_of_the_whole_trace_opens_its_part() {
    let path = sample("find_usr_include.trace.gz");
    let mut s = windowed(&path, "20000..25000", None);
    let carried = s.events() - 5_000;
    assert!(carried > 0);
    send(&mut s, &key('g'));
    type_text(&mut s, "#21,000");
    assert_eq!(s.cursor, carried + 1_000);
    assert!(s.reopen.is_none());
    send(&mut s, &key('g'));
    type_text(&mut s, "#33333");
    assert_eq!(
        s.reopen.take().unwrap().events.as_deref(),
        Some("30000..35000")
    );
    assert!(s.message.as_deref().unwrap().contains("for event #33,333"));
    let goto = s.reopen_goto.take();
    assert_eq!(goto.as_deref(), Some("#33333"));
    // Before the part, on the same grid.
    send(&mut s, &key('g'));
    type_text(&mut s, "#100");
    assert_eq!(s.reopen.take().unwrap().events.as_deref(), Some("0..5000"));
    send(&mut s, &key('g'));
    type_text(&mut s, "#40403");
    assert!(s.reopen.is_none());
    assert!(
        s.message
            .as_deref()
            .unwrap()
            .contains("the trace has 40,403 events"),
        "{:?}",
        s.message
    );
    // The asked part opened as the frontends open it: the cursor on event #33,333, the
    // same event as in the whole trace.
    let next = windowed(&path, "30000..35000", goto);
    let carried = next.events() - 5_000;
    assert_eq!(next.cursor, carried + 3_333);
    let whole = loaded("find_usr_include.trace.gz", &["first-fit"]);
    let (a, b) = (next.data.unwrap(), whole.data.unwrap());
    let (va, vb) = (a.view(), b.view());
    assert_eq!(
        (va.t_ns[next.cursor], va.size_bytes[next.cursor]),
        (vb.t_ns[33_333], vb.size_bytes[33_333])
    );
}

/// `}` and `{` ask for the next and previous part of a window's length, and the status line
/// says which part is shown; the whole trace has no parts.
#[test]
fn braces_open_the_next_and_previous_parts_of_a_window() {
    let path = sample("find_usr_include.trace.gz");
    let mut s = windowed(&path, "20000..25000", None);
    let part = s.data.as_ref().unwrap().part.unwrap();
    assert_eq!(
        (part.start, part.end, part.trace_events),
        (20_000, 25_000, 40_403)
    );
    assert!(screen(&mut s, 180, 40).contains("(part 20,000..25,000 of 40,403;"));
    send(&mut s, &key('}'));
    assert_eq!(
        s.reopen.take().unwrap().events.as_deref(),
        Some("25000..30000")
    );
    send(&mut s, &key('{'));
    assert_eq!(
        s.reopen.take().unwrap().events.as_deref(),
        Some("15000..20000")
    );
    // The last part of the grid is shorter, and `{` from it keeps the grid.
    s.window.events = Some("40000..45000".to_owned());
    load_blocking(&mut s, false, 1).unwrap();
    let part = s.data.as_ref().unwrap().part.unwrap();
    assert_eq!((part.start, part.end), (40_000, 40_403));
    send(&mut s, &key('{'));
    assert_eq!(
        s.reopen.take().unwrap().events.as_deref(),
        Some("35000..40000")
    );
    // The last part is shorter; past it there is none.
    s.window.events = Some("40000..".to_owned());
    load_blocking(&mut s, false, 1).unwrap();
    send(&mut s, &key('}'));
    assert!(s.reopen.is_none());
    assert!(
        s.message.as_deref().unwrap().contains("last part"),
        "{:?}",
        s.message
    );
    let mut whole = loaded("find_usr_include.trace.gz", &["first-fit"]);
    send(&mut whole, &key('}'));
    assert!(whole.reopen.is_none());
    assert!(
        whole
            .message
            .as_deref()
            .unwrap()
            .contains("the whole trace is shown")
    );
}
