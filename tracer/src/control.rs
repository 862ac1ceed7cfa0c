//! Recording on demand: `allocview record --paused` starts the program with the tracer idle
//! (`ALLOCVIEW_PAUSED=1`), and `allocview ctl PID start|stop|mark NAME` starts and stops
//! recording and adds named marks, in any process `record` runs, paused or not.
//!
//! The channel is a file next to the spool, `<prefix>.<pid>.ctl` (the prefix is
//! `ALLOCVIEW_SPOOL`, which `ctl` reads from `/proc/PID/environ`): `ctl` writes it whole
//! (renamed into place) and waits for it to disappear; the clock thread looks for it once a
//! flush period (20 ms: one failed `open` when there is none), reads it, removes it and obeys.
//! A file rather than a signal: no handler of the program's is replaced, and a mark carries
//! its name. The file holds one command per line: `start`, `stop`, or `mark NAME`.
//!
//! While recording is stopped, every call passes straight to the allocator: the run number
//! ([`crate::EPOCH`]) moves, so each thread finds at its next call that it has nothing to
//! record, as when in-process tracking ends a run, and records nothing until it moves again.
//! A thread that resumes writes out what was left in its buffer and starts a new stream in
//! the same spool (stack ids and the module map stay valid: they belong to the spool).
//!
//! Each change is written to the spool as a MARK frame (`0x16`: the clock's tick u64, the kind
//! u8: 0 a user's mark, 1 recording stopped, 2 recording started; then the name, UTF-8, up to
//! [`MAX_NAME_BYTES`]), so that a reader knows which stretches of the run were not recorded:
//! frees there of blocks allocated before are expected, and blocks allocated before a stop
//! whose free was not seen are of unknown fate, not leaks. A spool of a run that started
//! paused says `started_mid_run=1` in its META.

use super::*;

/// The spool frame of a mark.
pub(crate) const FRAME_MARK: u8 = 0x16;
/// A user's mark (`ctl PID mark NAME`).
const MARK_USER: u8 = 0;
/// Recording stopped here (`ctl PID stop`).
const MARK_STOPPED: u8 = 1;
/// Recording started here (`ctl PID start`, or the first start of a paused run).
const MARK_STARTED: u8 = 2;
/// The longest mark name kept (longer ones are cut at a character boundary).
pub(crate) const MAX_NAME_BYTES: usize = 200;

/// Recording is stopped: calls pass straight through.
static PAUSED: AtomicBool = AtomicBool::new(false);

/// Whether recording is stopped (`record --paused` before its first start, or `ctl stop`).
#[inline(always)]
pub(crate) fn paused() -> bool {
    PAUSED.load(Ordering::Acquire)
}

/// At initialisation: `ALLOCVIEW_PAUSED=1` starts the run stopped.
pub(crate) fn init() {
    // SAFETY: getenv does not allocate; the result is NUL-terminated or null.
    let v = unsafe { getenv(c"ALLOCVIEW_PAUSED".as_ptr()) };
    // SAFETY: as above.
    let on = !v.is_null() && unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes() == b"1";
    PAUSED.store(on, Ordering::Release);
}

/// Called by the clock thread once a flush period: obeys a command file if there is one.
pub(crate) fn poll() {
    let mut path = [0u8; 4200];
    let mut w = StackWriter::new(&mut path);
    w.put(PREFIX.get());
    w.put_u8(b'.');
    w.put_dec(PID.load(Ordering::Acquire) as u64);
    w.put(b".ctl\0");
    if w.overflowed() || PREFIX.get().is_empty() {
        return;
    }
    let mut body = [0u8; 4096];
    // SAFETY: a NUL-terminated path; reading into a stack buffer.
    let n = unsafe {
        let fd = open(path.as_ptr().cast(), O_RDONLY | O_CLOEXEC);
        if fd < 0 {
            return;
        }
        let n = read(fd, body.as_mut_ptr().cast(), body.len());
        close(fd);
        usize::try_from(n).unwrap_or(0)
    };
    for line in body.get(..n).unwrap_or(&[]).split(|&b| b == b'\n') {
        obey(line);
    }
    // Removed once obeyed: `ctl` returns when the file is gone, and the program's next call
    // then finds recording as the command left it.
    // SAFETY: the NUL-terminated path above.
    unsafe { unlink(path.as_ptr().cast()) };
}

fn obey(line: &[u8]) {
    match line {
        b"start" => start(),
        b"stop" => stop(),
        _ => {
            if let Some(name) = line.strip_prefix(b"mark ") {
                write_mark(MARK_USER, name);
            }
        }
    }
}

/// Starts recording: threads take up their buffers at their next call.
fn start() {
    if !PAUSED.load(Ordering::Acquire) {
        return;
    }
    write_mark(MARK_STARTED, b"");
    PAUSED.store(false, Ordering::Release);
    EPOCH.fetch_add(1, Ordering::AcqRel);
}

/// Stops recording: threads record nothing from their next call; what they recorded is
/// written out now.
fn stop() {
    if PAUSED.swap(true, Ordering::AcqRel) {
        return;
    }
    EPOCH.fetch_add(1, Ordering::AcqRel);
    let _busy = Busy::new();
    flush_all(Wait::Block);
    write_mark(MARK_STOPPED, b"");
}

/// Writes a MARK frame timed now.
fn write_mark(kind: u8, name: &[u8]) {
    let name = cut_at_char(name, MAX_NAME_BYTES);
    let mut frame = [0u8; 1 + 4 + 8 + 1 + MAX_NAME_BYTES];
    let mut w = StackWriter::new(&mut frame);
    w.put_u8(FRAME_MARK);
    w.put_u32((8 + 1 + name.len()) as u32);
    w.put_u64(now_ns());
    w.put_u8(kind);
    w.put(name);
    write_frame(w.bytes());
}

/// The longest prefix of `name` of at most `max` bytes that does not end inside a UTF-8
/// character (so that the reader's check of the name does not refuse a cut one).
fn cut_at_char(name: &[u8], max: usize) -> &[u8] {
    if name.len() <= max {
        return name;
    }
    let mut end = max;
    // Continuation bytes are 10xxxxxx: back off to the start of the character.
    while end > 0 && name.get(end).is_some_and(|&b| b & 0xc0 == 0x80) {
        end -= 1;
    }
    name.get(..end).unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_name_is_cut_before_a_character_not_inside_it() {
        let name = "é".repeat(150); // 300 bytes, 2 per character
        let cut = cut_at_char(name.as_bytes(), 201);
        assert_eq!(cut.len(), 200);
        assert!(std::str::from_utf8(cut).is_ok());
        assert_eq!(cut_at_char(b"short", 200), b"short");
    }
}
