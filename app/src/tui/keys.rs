//! Terminal input to [`Msg`]s. This is all the terminal frontend decides.

use crossterm::event::{
    Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEventKind,
};
use ratatui::layout::Rect;

use crate::model::state::PromptKind;
use crate::model::update::Msg;

/// Maps a terminal event to a message. `timeline` is where the timeline's plot area is on
/// screen (for mouse scrubbing) and `strip` the whole trace's strip (a click goes to that part
/// of the trace); `prompt_open` routes keys to the prompt.
#[must_use]
pub fn to_msg(
    ev: &Event,
    prompt_open: bool,
    timeline: Option<Rect>,
    strip: Option<Rect>,
) -> Option<Msg> {
    match ev {
        Event::Key(k) if k.kind != KeyEventKind::Release => key(k, prompt_open),
        Event::Mouse(m) => {
            if let Some(s) = strip
                && m.kind == MouseEventKind::Down(MouseButton::Left)
                && m.row >= s.y
                && m.row < s.y.saturating_add(s.height)
                && m.column >= s.x
                && m.column < s.x + s.width
            {
                // The middle of the stretch the clicked cell stands for.
                let cell = f64::from(m.column - s.x) + 0.5;
                return Some(Msg::GotoTraceFraction(cell / f64::from(s.width)));
            }
            let area = timeline?;
            let inside = m.column >= area.x
                && m.column < area.x + area.width
                && m.row >= area.y
                && m.row < area.y + area.height;
            match m.kind {
                MouseEventKind::Down(MouseButton::Left)
                | MouseEventKind::Drag(MouseButton::Left)
                    if inside && area.width > 1 =>
                {
                    Some(Msg::ScrubTo(
                        f64::from(m.column - area.x) / f64::from(area.width - 1),
                    ))
                }
                MouseEventKind::ScrollUp if inside => Some(Msg::ZoomIn),
                MouseEventKind::ScrollDown if inside => Some(Msg::ZoomOut),
                _ => None,
            }
        }
        _ => None,
    }
}

fn key(k: &KeyEvent, prompt_open: bool) -> Option<Msg> {
    if prompt_open {
        return match k.code {
            KeyCode::Enter => Some(Msg::PromptSubmit),
            KeyCode::Esc => Some(Msg::PromptCancel),
            KeyCode::Backspace => Some(Msg::PromptBackspace),
            KeyCode::Char(c) => Some(Msg::PromptInput(c)),
            _ => None,
        };
    }
    if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
        return Some(Msg::Quit);
    }
    Some(match k.code {
        KeyCode::Right | KeyCode::Char('l') => Msg::Step(1),
        KeyCode::Left | KeyCode::Char('h') => Msg::Step(-1),
        KeyCode::PageDown | KeyCode::Char('j') | KeyCode::Down => Msg::StepPage(1),
        KeyCode::PageUp | KeyCode::Char('k') | KeyCode::Up => Msg::StepPage(-1),
        KeyCode::Char(']') => Msg::StepBucket(1),
        KeyCode::Char('[') => Msg::StepBucket(-1),
        KeyCode::Char('}') => Msg::OpenPart(1),
        KeyCode::Char('{') => Msg::OpenPart(-1),
        KeyCode::Home => Msg::Home,
        KeyCode::End | KeyCode::Char('G') => Msg::End,
        KeyCode::Char('g') => Msg::OpenPrompt(PromptKind::Goto),
        KeyCode::Char('/') => Msg::OpenPrompt(PromptKind::Filter),
        KeyCode::Char('n') => Msg::NextMark,
        KeyCode::Char('N') => Msg::PrevMark,
        KeyCode::Char('F') => Msg::FollowHead,
        KeyCode::Char('p') => Msg::CyclePolicy(1),
        KeyCode::Char('P') => Msg::CyclePolicy(-1),
        KeyCode::Char('c') => Msg::ToggleCompare,
        KeyCode::Char('s') => Msg::ToggleSites,
        KeyCode::Char('T') => Msg::Tune,
        KeyCode::Char('>') => Msg::CycleSite(1),
        KeyCode::Char('<') => Msg::CycleSite(-1),
        KeyCode::Char('+' | '=') => Msg::ZoomIn,
        KeyCode::Char('-') => Msg::ZoomOut,
        KeyCode::Char('e') => Msg::Export,
        KeyCode::Char('?') => Msg::ToggleHelp,
        KeyCode::Char('q') | KeyCode::Esc => Msg::Quit,
        _ => return None,
    })
}
