//! `allocview attach PID [--duration 30s] [-o FILE]`: record a process that is already
//! running, started without allocview, for a while, and leave it running.
//!
//! The tracer is loaded into the process through ptrace and started there
//! ([`crate::inject::Attached`]); the process runs on, recording the C library's allocation
//! calls of every thread into a spool. When the duration ends, on Ctrl-C (or SIGTERM, SIGHUP)
//! to allocview, or when the process exits, the recording is stopped in the process (its calls
//! go back to the C library directly) and the spool is converted into the trace. The trace's
//! META says `started_mid_run=1`: frees of blocks allocated before the attach are expected and
//! counted apart (`stats` says how many).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
// What only the x86-64 Linux attach uses (elsewhere the command says it is unsupported).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
use {
    crate::format,
    anyhow::Context as _,
    std::sync::Arc,
    std::sync::atomic::{AtomicBool, Ordering},
    std::time::Instant,
};

/// Arguments of `allocview attach`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  allocview attach 4242 --duration 30s\n  \
                        sudo allocview attach $(pidof myservice) -o service.avt\n\n\
                        Needs ptrace permission over the process: the same user with \
                        kernel.yama.ptrace_scope=0, or root; in a container, CAP_SYS_PTRACE \
                        (docker run --cap-add SYS_PTRACE).")]
pub struct AttachArgs {
    /// The process to record.
    pub pid: i32,
    /// How long to record (e.g. 30s, 500ms, 2m, 1h); default: until Ctrl-C or until the
    /// process exits.
    #[arg(long, value_parser = parse_duration, value_name = "TIME")]
    pub duration: Option<Duration>,
    /// The trace to write. Default: `allocview-<program>-<pid>.avt` here.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// `30s`, `500ms`, `2m`, `1h`, or a number of seconds (`1.5`).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (e.g. 30s, 500ms, 2m)"))?;
    let seconds = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1e3,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}` (ms, s, m or h)"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("`{text}`: {e}"))
}

/// Runs `allocview attach`.
pub fn run(args: &AttachArgs) -> Result<()> {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        record_attached(args)
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    {
        let _ = args;
        bail!(
            "allocview attach works on x86-64 Linux only (this is {}-{})",
            std::env::consts::ARCH,
            std::env::consts::OS
        )
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn record_attached(args: &AttachArgs) -> Result<()> {
    use crate::inject::Attached;
    use crate::recording::{TRACER_SO, spool_to_trace};

    let pid = args.pid;
    let program = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "process".to_owned());
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("allocview-{program}-{pid}.avt")));
    // Refused before the process is touched, not after it was recorded.
    let folder = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !folder.is_dir() {
        bail!(
            "cannot write {}: {} is not a folder",
            output.display(),
            folder.display()
        );
    }
    // Registered before the attach: a Ctrl-C that comes while attaching still detaches.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("cannot catch the termination signals")?;
    }
    let attached = Attached::start(pid, TRACER_SO)?;
    let started = Instant::now();
    eprintln!(
        "attached to process {pid} ({program}); recording {}; Ctrl-C stops and detaches",
        args.duration.map_or_else(
            || "until it exits".to_owned(),
            |d| format!("for {}", format::seconds(d.as_secs_f64()))
        )
    );
    let ended = loop {
        if !attached.running() {
            break "the process exited";
        }
        if stop.load(Ordering::Relaxed) {
            break "stopped by a signal";
        }
        if args.duration.is_some_and(|d| started.elapsed() >= d) {
            break "the duration ended";
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Stopped even when the process exited meanwhile (then nothing to do); an error still
    // converts what the spool holds.
    let stopped = attached.stop(TRACER_SO);
    let spool = attached
        .spools()
        .into_iter()
        .find(|p| spool_of(p, pid))
        .with_context(|| {
            format!(
                "process {pid} wrote no recording under {}",
                attached.prefix_in_target()
            )
        })?;
    let summary = match spool_to_trace(&spool, &output, &program) {
        Ok(summary) => summary,
        Err(e) => {
            // The recording is not lost with the private folder: it is kept beside the output.
            let kept = keep_spool(&spool, &output);
            std::fs::remove_file(&spool).ok();
            return Err(match kept {
                Some(kept) => e.context(format!(
                    "converting the recording of process {pid} failed; it is kept in {} \
                     (`allocview convert {} OUT.avt` converts it)",
                    kept.display(),
                    kept.display()
                )),
                None => e.context(format!("converting the recording of process {pid}")),
            });
        }
    };
    // Removed here too: the private directory may not be reachable by its path any more (a
    // process in another mount namespace that exited).
    std::fs::remove_file(&spool).ok();
    eprintln!(
        "detached from process {pid} ({ended}, after {}): {}  {} events, {} threads, peak \
         live {}, {} live at detach",
        format::seconds(started.elapsed().as_secs_f64()),
        output.display(),
        format::count(summary.events),
        summary.threads,
        format::bytes(summary.peak_live_bytes),
        format::bytes(summary.final_live_bytes),
    );
    for w in summary.summary.warnings() {
        eprintln!("  note: {w}");
    }
    eprintln!("explore: allocview stats {}", output.display());
    if let Err(e) = stopped {
        bail!("the trace was written, but stopping the recording in process {pid} failed: {e:#}");
    }
    Ok(())
}

/// Copies `spool` beside `output` under a name no file has (`<output>.spool`, or with a number
/// added), never over one; `None` when it cannot.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn keep_spool(spool: &std::path::Path, output: &std::path::Path) -> Option<PathBuf> {
    let mut from = std::fs::File::open(spool).ok()?;
    for n in 0..100 {
        let mut name = output.as_os_str().to_owned();
        name.push(if n == 0 {
            ".spool".to_owned()
        } else {
            format!(".{n}.spool")
        });
        let kept = PathBuf::from(name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&kept)
        {
            Ok(mut to) => {
                return std::io::copy(&mut from, &mut to).ok().map(|_| kept);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(_) => return None,
        }
    }
    None
}

/// Whether `path` is the spool of process `pid` (`attach.<pid>.spool` or
/// `attach.<pid>.<n>.spool`), not one of a child it forked.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn spool_of(path: &std::path::Path, pid: i32) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let own = format!("attach.{pid}.");
    name.strip_prefix(&own).is_some_and(|rest| {
        rest == "spool"
            || rest
                .strip_suffix(".spool")
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("s").is_err());
    }
}
