//! Marks: named moments a user put into a run (`allocview ctl PID mark NAME`), and the moments
//! recording stopped and started again (`ctl PID stop|start`, `record --paused`); the
//! tracer's `control.rs` writes them.
//!
//! In a spool, each mark is a frame (`0x16 MARK`: the clock's tick u64, the kind u8, then the
//! name in UTF-8), timed as the events. In a trace, all are one frame (`0x0c MARKS`, after the
//! last EVENTS frame): varint n, then per mark its time in nanoseconds as a zigzag varint of
//! the difference from the previous mark's (the first from 0), the kind u8, the name's length
//! as a varint and the name.
//!
//! Kinds: 0 a user's mark, 1 recording stopped, 2 recording started. Between a stop and the
//! next start the trace holds nothing: a block allocated before a stop whose free was not
//! recorded may have been freed while recording was stopped, and one allocated meanwhile may
//! be freed after the start, unseen ([`recording_stopped`]).

use super::codec::{Cursor, put_varint, zigzag};

/// A trace's MARKS frame.
pub(crate) const FRAME_MARKS: u8 = 0x0c;
/// A spool's MARK frame (one mark).
pub(crate) const FRAME_MARK: u8 = 0x16;
/// The longest name a mark may have (the tracer cuts longer ones).
const MAX_NAME_BYTES: u64 = 4096;

/// What a mark says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkKind {
    /// A user's named moment.
    User,
    /// Recording stopped here.
    Stopped,
    /// Recording started (again) here.
    Started,
}

impl MarkKind {
    fn code(self) -> u8 {
        match self {
            Self::User => 0,
            Self::Stopped => 1,
            Self::Started => 2,
        }
    }

    fn of(code: u8) -> Option<Self> {
        Some(match code {
            0 => Self::User,
            1 => Self::Stopped,
            2 => Self::Started,
            _ => return None,
        })
    }

    /// How the kind reads in a table.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::User => "mark",
            Self::Stopped => "recording stopped",
            Self::Started => "recording started",
        }
    }
}

/// One mark of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// On the events' time axis.
    pub t_ns: i64,
    pub kind: MarkKind,
    /// The user's name for it (empty for a stop or a start).
    pub name: String,
}

impl Mark {
    /// What a timeline shows for it: the name, or the kind for a stop or a start.
    #[must_use]
    pub fn label(&self) -> &str {
        match self.kind {
            MarkKind::User => &self.name,
            kind => kind.label(),
        }
    }
}

/// Whether recording stopped at some point of the run: then blocks allocated while it was
/// stopped may be freed after it started again, unseen, as in a recording begun mid-run
/// ([`LoadSummary::mark_started_mid_run`](crate::events::LoadSummary::mark_started_mid_run)).
#[must_use]
pub fn recording_stopped(marks: &[Mark]) -> bool {
    marks.iter().any(|m| m.kind == MarkKind::Stopped)
}

/// A trace's MARKS frame's payload.
#[must_use]
pub fn encode_frame(marks: &[Mark]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + marks.len() * 16);
    put_varint(&mut out, marks.len() as u64);
    let mut prev = 0i64;
    for m in marks {
        put_varint(&mut out, zigzag(m.t_ns.wrapping_sub(prev)));
        out.push(m.kind.code());
        put_varint(&mut out, m.name.len() as u64);
        out.extend_from_slice(m.name.as_bytes());
        prev = m.t_ns;
    }
    out
}

/// Reads a trace's MARKS frame; a count larger than the payload can hold (three bytes a mark
/// at least) is damage, refused before anything is allocated by it.
///
/// # Errors
/// A cut or damaged frame, in words.
pub(crate) fn decode_frame(payload: &[u8]) -> Result<Vec<Mark>, String> {
    let mut c = Cursor::new(payload);
    let n = c.varint().ok_or("a cut mark count")?;
    if n.saturating_mul(3) > payload.len() as u64 {
        return Err(format!("{n} marks in a {}-byte frame", payload.len()));
    }
    let mut out = Vec::with_capacity(n as usize);
    let mut t = 0i64;
    for i in 0..n {
        let dt = c.zigzag().ok_or("a cut mark")?;
        let kind = c
            .u8()
            .and_then(MarkKind::of)
            .ok_or_else(|| format!("mark {i} is of no known kind"))?;
        let len = c.varint().ok_or("a cut mark")?;
        if len > MAX_NAME_BYTES {
            return Err(format!("mark {i} has a {len}-byte name"));
        }
        let name = c.take(len as usize).ok_or("a cut mark name")?;
        let name = std::str::from_utf8(name)
            .map_err(|_| format!("mark {i}'s name is not UTF-8"))?
            .to_owned();
        t = t.wrapping_add(dt);
        out.push(Mark {
            t_ns: t,
            kind,
            name,
        });
    }
    if !c.at_end() {
        return Err("bytes after the marks".into());
    }
    Ok(out)
}

/// Reads a spool's MARK frame: `(tick, kind, name)`; a name that is not UTF-8 is read with
/// replacement characters, and one longer than a trace's MARKS frame holds is cut (at a
/// character boundary), so that the trace converted from the spool reads back.
pub(crate) fn decode_spool_mark(payload: &[u8]) -> Option<(u64, MarkKind, String)> {
    let mut c = Cursor::new(payload);
    let tick = c.u64()?;
    let kind = MarkKind::of(c.u8()?)?;
    let mut name = String::from_utf8_lossy(payload.get(9..)?).into_owned();
    let mut end = name.len().min(MAX_NAME_BYTES as usize);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name.truncate(end);
    Some((tick, kind, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(t_ns: i64, kind: MarkKind, name: &str) -> Mark {
        Mark {
            t_ns,
            kind,
            name: name.into(),
        }
    }

    #[test]
    fn marks_survive_the_trace_frame() {
        let marks = vec![
            mark(5_000, MarkKind::Started, ""),
            mark(9_000, MarkKind::User, "epoch 2 ✓"),
            mark(12_000, MarkKind::Stopped, ""),
        ];
        assert_eq!(decode_frame(&encode_frame(&marks)).unwrap(), marks);
    }

    #[test]
    fn a_damaged_frame_is_refused_in_words() {
        let mut bytes = encode_frame(&[mark(1, MarkKind::User, "a")]);
        bytes[2] = 9; // the kind
        assert!(decode_frame(&bytes).unwrap_err().contains("no known kind"));
        // A count the payload cannot hold allocates nothing.
        let mut huge = Vec::new();
        put_varint(&mut huge, u64::MAX / 4);
        assert!(decode_frame(&huge).unwrap_err().contains("marks in a"));
        let cut = &encode_frame(&[mark(1, MarkKind::User, "abc")])[..5];
        assert!(decode_frame(cut).is_err());
    }

    #[test]
    fn a_spool_mark_too_long_for_a_trace_is_cut_to_what_reads_back() {
        let mut payload = 7u64.to_le_bytes().to_vec();
        payload.push(0);
        payload.extend("é".repeat(3000).as_bytes()); // 6000 bytes
        let (tick, kind, name) = decode_spool_mark(&payload).unwrap();
        assert_eq!((tick, kind, name.len()), (7, MarkKind::User, 4096));
        let marks = [Mark {
            t_ns: 1,
            kind,
            name,
        }];
        assert_eq!(decode_frame(&encode_frame(&marks)).unwrap(), marks);
    }

    #[test]
    fn only_a_stop_makes_unseen_frees_expected() {
        let started = vec![mark(1, MarkKind::Started, ""), mark(2, MarkKind::User, "x")];
        assert!(!recording_stopped(&started));
        assert!(recording_stopped(&[mark(3, MarkKind::Stopped, "")]));
    }
}
