//! `allocview ctl PID start|stop|mark NAME`: starts or stops recording in a process that
//! `allocview record` runs (`--paused` starts it stopped), or puts a named mark into its trace.
//!
//! The tracer in the process looks for a command file next to its spool once a flush period
//! (the tracer's `control.rs` has the protocol): this writes the file whole under a name of its
//! own and links it into place (a link never replaces a file, so two `ctl`s at once take turns
//! and neither command is lost), then waits until the tracer has obeyed and removed it, so
//! that when `ctl` returns the program's next call already finds recording as the command
//! left it.

use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

/// How long a command may wait for the tracer (which looks every 20 ms).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// How often the file is looked at meanwhile.
const POLL: Duration = Duration::from_millis(5);
/// The longest mark name the tracer keeps (its `control::MAX_NAME_BYTES`).
const MAX_NAME_BYTES: usize = 200;

/// Arguments of `allocview ctl`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
                        allocview record --paused -o serve.avt -- ./serve &\n  \
                        allocview ctl $(pgrep -n serve) start\n  \
                        allocview ctl $(pgrep -n serve) mark 'after warm-up'\n  \
                        allocview ctl $(pgrep -n serve) stop")]
pub struct CtlArgs {
    /// The process: one that `allocview record` runs (the program, or any process it started).
    pub pid: u32,
    /// `start` or `stop` recording, or `mark` a moment (the name follows).
    #[arg(value_parser = ["start", "stop", "mark"])]
    pub action: String,
    /// The mark's name (with `mark`): shown on the timelines, in `stats`.
    pub name: Option<String>,
}

/// Runs `allocview ctl`.
pub fn run(args: &CtlArgs) -> Result<()> {
    let line = command_line(args)?;
    let prefix = spool_prefix(args.pid)?;
    let mut ctl = prefix.clone().into_os_string();
    ctl.push(format!(".{}.ctl", args.pid));
    let ctl = PathBuf::from(ctl);
    let mut tmp = ctl.clone().into_os_string();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    // Created new, never through a link someone planted at the name (`O_EXCL`).
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .with_context(|| {
            format!(
                "cannot write {}: has the recording of process {} ended?",
                tmp.display(),
                args.pid
            )
        })?;
    let sent = f
        .write_all(line.as_bytes())
        .and_then(|()| f.sync_data())
        .with_context(|| format!("cannot write {}", tmp.display()))
        .and_then(|()| publish(&tmp, &ctl, args.pid))
        .and_then(|()| wait_taken(&ctl, &f, args.pid));
    drop(f);
    let _ = std::fs::remove_file(&tmp);
    sent?;
    println!("{}", done_message(args));
    Ok(())
}

/// Links the command file `tmp` into place at `ctl`, once the command before it (another
/// `ctl`'s) has been taken.
fn publish(tmp: &std::path::Path, ctl: &std::path::Path, pid: u32) -> Result<()> {
    let started = Instant::now();
    loop {
        match std::fs::hard_link(tmp, ctl) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                check_waiting(started, pid, "an earlier command")?;
                std::thread::sleep(POLL);
            }
            Err(e) => return Err(e).with_context(|| format!("cannot write {}", ctl.display())),
        }
    }
}

/// Waits until the tracer has taken the command at `ctl` (the file `ours`, linked there); on a
/// timeout, removes it unless it is already another `ctl`'s.
fn wait_taken(ctl: &std::path::Path, ours: &std::fs::File, pid: u32) -> Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let started = Instant::now();
    let our_inode = ours.metadata().map(|m| m.ino()).ok();
    while let Ok(there) = std::fs::metadata(ctl) {
        if Some(there.ino()) != our_inode {
            // Taken, and another `ctl`'s command came after it.
            break;
        }
        if let Err(e) = check_waiting(started, pid, "the command") {
            // Not left for the tracer to find later, when nobody waits for it.
            let _ = std::fs::remove_file(ctl);
            return Err(e);
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// The line the tracer reads, checked.
fn command_line(args: &CtlArgs) -> Result<String> {
    match (args.action.as_str(), &args.name) {
        ("mark", None) => bail!("`ctl PID mark` needs a name: allocview ctl PID mark NAME"),
        ("mark", Some(name)) => {
            if name.is_empty() || name.contains(['\n', '\r']) {
                bail!("a mark's name must be one line of text, not empty");
            }
            if name.len() > MAX_NAME_BYTES {
                bail!(
                    "a mark's name is at most {MAX_NAME_BYTES} bytes; this one has {}",
                    name.len()
                );
            }
            Ok(format!("mark {name}\n"))
        }
        (action, None) => Ok(format!("{action}\n")),
        (action, Some(_)) => bail!("`ctl PID {action}` takes no name (only `mark` does)"),
    }
}

fn done_message(args: &CtlArgs) -> String {
    match (args.action.as_str(), &args.name) {
        ("start", _) => format!("recording started in process {}", args.pid),
        ("stop", _) => format!("recording stopped in process {}", args.pid),
        (_, name) => format!(
            "marked \"{}\" in process {}",
            name.as_deref().unwrap_or(""),
            args.pid
        ),
    }
}

/// The spool prefix `record` gave the process (its `ALLOCVIEW_SPOOL`), from its environment.
fn spool_prefix(pid: u32) -> Result<PathBuf> {
    let path = format!("/proc/{pid}/environ");
    let environ = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("there is no process {pid}")
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => bail!(
            "cannot read {path}: process {pid} belongs to another user (run ctl as that user)"
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot read {path}")),
    };
    let prefix = environ
        .split(|&b| b == 0)
        .find_map(|var| var.strip_prefix(b"ALLOCVIEW_SPOOL="))
        .filter(|p| !p.is_empty());
    match prefix {
        Some(p) => Ok(PathBuf::from(std::ffi::OsStr::from_bytes(p))),
        None => bail!(
            "process {pid} is not recorded by allocview (its environment has no \
             ALLOCVIEW_SPOOL): start it with `allocview record --paused -- CMD` to control \
             its recording, or use `allocview attach {pid}` to trace it as it runs"
        ),
    }
}

/// Whether to wait on for the tracer to take `what`: an error once [`ANSWER_WITHIN`] has
/// passed since `started`, or the process has ended.
fn check_waiting(started: Instant, pid: u32, what: &str) -> Result<()> {
    if started.elapsed() > ANSWER_WITHIN {
        bail!(
            "the tracer in process {pid} did not take {what} within {} s (it looks every 20 \
             ms): is the process stopped, exiting, or not traced (a static binary)?",
            ANSWER_WITHIN.as_secs()
        );
    }
    if !crate::procfs::running(pid) {
        bail!("process {pid} ended before it took {what}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(action: &str, name: Option<&str>) -> CtlArgs {
        CtlArgs {
            pid: 1,
            action: action.into(),
            name: name.map(Into::into),
        }
    }

    #[test]
    fn commands_are_checked_before_anything_is_written() {
        assert_eq!(command_line(&args("start", None)).unwrap(), "start\n");
        assert_eq!(
            command_line(&args("mark", Some("warm"))).unwrap(),
            "mark warm\n"
        );
        assert!(command_line(&args("mark", None)).is_err());
        assert!(command_line(&args("mark", Some("a\nstop"))).is_err());
        assert!(command_line(&args("stop", Some("x"))).is_err());
        assert!(command_line(&args("mark", Some(&"x".repeat(201)))).is_err());
    }

    #[test]
    fn a_process_not_recorded_is_told_how_to_record_it() {
        // This test's own process has no ALLOCVIEW_SPOOL.
        let err = spool_prefix(std::process::id()).unwrap_err().to_string();
        assert!(
            err.contains("record --paused") && err.contains("attach"),
            "{err}"
        );
        assert!(
            spool_prefix(u32::MAX)
                .unwrap_err()
                .to_string()
                .contains("no process")
        );
    }
}
