//! `allocview record [-o FILE] [--text] -- CMD ARGS...`: run a command under the malloc tracer.
//!
//! The tracer (`tracer/`, built by `app/build.rs` and embedded in this binary) is written to a
//! private temporary directory and preloaded into the command with `LD_PRELOAD`, which its
//! children inherit. Each traced process writes a spool (see `loaders/src/binary/`) next to
//! the output; when the command ends, every spool is merged by time and written as a trace
//! (binary by default, gzip text with `--text`), one file per process, and the spools are
//! removed, and a summary goes to stderr (stdout is the command's). While the command runs, `allocview` ignores SIGINT, SIGTERM, SIGHUP and SIGQUIT so
//! that a Ctrl-C, which reaches the command directly, still leaves it time to write the traces.
//!
//! Traces are written through `safe_write` (never over the program or a file named on its
//! command line, atomically); a spool that cannot be converted is kept next to the output.
//!
//! Every allocation's call stack is captured by default (x86-64; `--no-stacks` turns it off,
//! and `--text` too, the text form having no place for stacks): the tracer records return
//! addresses and the module map; the stacks are placed in the modules, written into the binary
//! trace and symbolized (`crate::symbolize::Prefetch`, `TraceStacks`) while the command runs,
//! as its conversion meets them; what is left is symbolized and written once it has exited.
//! With `--stack-sample SIZE` every event is still recorded but only the allocations sampled
//! by bytes (a mean of one every SIZE bytes, see the tracer's `sample.rs`) have their stack
//! walked; the trace's META says `stack_sample_bytes`, and the site figures weigh the sampled
//! allocations (`allocview_loaders::analysis::sampling`).

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{SystemTime, UNIX_EPOCH};

use allocview_loaders::analysis::stats::RecordingSummary;
use allocview_loaders::binary::{BinaryInfo, TimeBase};
use anyhow::{Context as _, Result, bail};
use tempfile::TempDir;

use crate::format;
use crate::recording::{TRACER_SO, convert_file};
use crate::safe_write;
use crate::symbolize::{Prefetch, Symbolizer, TraceStacks};
use crate::trace_file::{Form, RecordWriter};

mod limit;
mod live;
mod pipe;
mod spools;
mod watch;

use spools::{Spool, list_spools, per_process_name};

/// Why `record` cannot run in this build, and where it can (the book's "Platforms" says the same).
fn unsupported_here() -> String {
    let why = option_env!("ALLOCVIEW_NO_TRACER").unwrap_or("no tracer was built");
    format!(
        "allocview record is not supported on this platform ({}-{}: {why}). It runs on \
         Linux on x86-64 (events, exact order across threads, call stacks) and on other 64-bit \
         Linux machines such as aarch64 when the tracer compiles for them (events, order across \
         threads found by causality, no call stacks); every other command works here",
        std::env::consts::ARCH,
        std::env::consts::OS,
    )
}

/// Arguments of `allocview record`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  allocview record -- python3 -c 'print(sum(range(10**6)))'\n  \
                        allocview record -o ls.avt -- ls -l /usr\n  \
                        allocview record --paused -o serve.avt -- ./serve   (then: allocview ctl PID start)\n  \
                        allocview record --live -o train.avt -- python3 train.py   (watch it as it runs)\n  \
                        allocview record --text -o make.trace.gz -- make -j2"
)]
pub struct RecordArgs {
    /// The trace to write. When the command starts several processes (fork, exec), each gets
    /// its own file, named after this one with the process id inserted before the extension.
    /// Default: `allocview-<program>-<pid>.avt` (`.trace.gz` with --text) here.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Write the libtracemalloc text form, gzipped, with the call-name column (it has no
    /// call stacks, so none are captured).
    #[arg(long)]
    pub text: bool,
    /// Do not capture the call stack of each allocation (captured by default, on x86-64).
    #[arg(long)]
    pub no_stacks: bool,
    /// Start the command with recording stopped: `allocview ctl PID start` starts it (and
    /// `stop`, `mark NAME`; ctl works without --paused too). Blocks allocated before recording
    /// starts and freed after are counted apart, not as unknown frees.
    #[arg(long)]
    pub paused: bool,
    /// Walk the call stack of only some allocations, sampled by bytes: a mean of one sample
    /// every SIZE bytes allocated (512KiB, 1MiB, or plain bytes), as tcmalloc and heapprofd
    /// do. Every allocation and free is still recorded (replays, totals and peaks stay
    /// exact); the figures by site become unbiased estimates. Far cheaper than a stack per
    /// allocation, for production runs.
    #[arg(long, value_parser = crate::units::parse_bytes, value_name = "SIZE")]
    pub stack_sample: Option<u64>,
    #[command(flatten)]
    pub faults: limit::LimitArgs,
    /// Show the run in the terminal explorer while it is recorded: the timeline, heap maps,
    /// sites and size classes grow with it (`F` follows the newest event). The command's
    /// output goes to OUTPUT.log.
    #[arg(long)]
    pub live: bool,
    /// As --live, in the desktop explorer.
    #[arg(long)]
    pub gui: bool,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

/// Runs `allocview record`; returns the status `allocview` exits with: the command's, as
/// `time` does (its exit status, or 128 + the signal that killed it), once its traces are
/// written, so that a script sees the failure of the command it recorded.
pub fn run(args: &RecordArgs) -> Result<u8> {
    if TRACER_SO.is_empty() {
        bail!("{}", unsupported_here());
    }
    let Some(program) = args.command.first() else {
        bail!("no command to record (put it after --)");
    };
    let program_name = Path::new(program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "command".into());
    let output = output_path(args, &program_name);
    // The trace must never replace the traced program or a file named on its command line.
    let protected = protected_files(&args.command);
    let protected_refs: Vec<&Path> = protected.iter().map(PathBuf::as_path).collect();
    safe_write::refuse_if_any_input(&protected_refs, &output)?;
    refuse_output_named_in_command(&output, &args.command)?;
    if args.live || args.gui {
        check_stack_sample(args)?;
        return watch::run(args, &output);
    }
    let staging = Staging::create(&output)?;
    let started_wall_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0);

    check_stack_sample(args)?;
    let stacks = !args.no_stacks && !args.text && cfg!(target_arch = "x86_64");
    if args.text && !args.no_stacks {
        eprintln!("note: --text: the text form has no call stacks, so none are captured");
    }
    let target = Target {
        output: &output,
        form: if args.text { Form::Text } else { Form::Binary },
        program_name: &program_name,
        base: TimeBase {
            realtime_ns: Some(started_wall_ns),
        },
        protected: &protected_refs,
    };
    let (mut child, ignored) = spawn_traced(args, program, &staging, stacks)?;
    // The modules of the stacks are read while the command runs.
    let prefetch = stacks.then(Prefetch::start);
    let mut live = live::Converter::new(
        staging.spools.path(),
        target.program_name,
        target.output,
        target.form,
        target.base,
        target.protected,
        prefetch.as_ref().map(Prefetch::feed),
    );
    let status = live.run_until_exit(&mut child)?;
    drop(ignored);

    let written = convert_spools(staging.spools.path(), target, &mut live, prefetch)?;
    report(args, &written, status)?;
    Ok(exit_code(status))
}

/// The status a shell shows for `status`: its exit code, or 128 + the signal that killed it.
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        // A shell shows the low byte too.
        (Some(code), _) => (code & 0xff) as u8,
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(u8::MAX),
        (None, None) => 1,
    }
}

/// Refuses an output that the command names too, as an argument or after a `=`
/// (`prog --log=out.txt` with `-o out.txt`): the command would write the file, and the trace
/// replace it (or the other way round), whether or not it exists yet.
fn refuse_output_named_in_command(output: &Path, command: &[OsString]) -> Result<()> {
    let Some(out) = resolved(output) else {
        return Ok(());
    };
    for arg in command.iter().skip(1) {
        let bytes = arg.as_encoded_bytes();
        let after_eq = bytes
            .iter()
            .position(|&b| b == b'=')
            .and_then(|i| bytes.get(i + 1..))
            .map(|rest| Path::new(std::ffi::OsStr::from_bytes(rest)));
        for candidate in std::iter::once(Path::new(arg)).chain(after_eq) {
            if !candidate.as_os_str().is_empty() && resolved(candidate).as_ref() == Some(&out) {
                bail!(
                    "refusing to record into {}: the command names the same file (`{}`), so                      the trace and the command's own output would overwrite each other; choose                      another -o",
                    output.display(),
                    arg.to_string_lossy()
                );
            }
        }
    }
    Ok(())
}

/// What `path` names, comparable between spellings: an existing file's canonical path, else
/// its directory's canonical path and its name (`None` when the directory does not exist).
fn resolved(path: &Path) -> Option<PathBuf> {
    if let Ok(p) = std::fs::canonicalize(path) {
        return Some(p);
    }
    let name = path.file_name()?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Some(std::fs::canonicalize(dir).ok()?.join(name))
}

/// The trace to write: `--output`, or a name made of the program and this process's id, so
/// that recordings made one after another in the same folder do not replace one another.
fn output_path(args: &RecordArgs, program_name: &str) -> PathBuf {
    let ext = if args.text { "trace.gz" } else { "avt" };
    args.output.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "allocview-{program_name}-{}.{ext}",
            std::process::id()
        ))
    })
}

/// A recording's private files, removed when dropped: the folder the tracer's spools go to
/// and the one holding the tracer, and the `LD_PRELOAD` value that loads it.
struct Staging {
    // Declared in the order they are removed: the spools, then the tracer.
    spools: TempDir,
    /// Holds the tracer; kept only to be removed on drop.
    _work: TempDir,
    preload: OsString,
}

impl Staging {
    /// Writes the tracer to a private temporary folder and makes the spools' folder next to
    /// `output`: spools can be large, and /tmp may be small.
    fn create(output: &Path) -> Result<Self> {
        let out_dir = match output.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // Private (mode 0700) folders with unpredictable names, made here or not at all.
        let work = tempfile::Builder::new()
            .prefix("allocview-record-")
            .tempdir()
            .context("cannot create a private directory for the tracer")?;
        let so_path = work.path().join("liballocview_tracer.so");
        std::fs::write(&so_path, TRACER_SO)
            .with_context(|| format!("cannot write the tracer to {}", so_path.display()))?;
        let spools = tempfile::Builder::new()
            .prefix(".allocview-spool-")
            .tempdir_in(&out_dir)
            .with_context(|| format!("cannot create a spool directory in {}", out_dir.display()))?;
        // Libraries the user preloads stay preloaded, after the tracer.
        let preload = match std::env::var_os("LD_PRELOAD") {
            Some(existing) if !existing.is_empty() => {
                let mut v = so_path.clone().into_os_string();
                v.push(":");
                v.push(existing);
                v
            }
            _ => so_path.clone().into_os_string(),
        };
        Ok(Self {
            spools,
            _work: work,
            preload,
        })
    }
}

/// Starts the command with the tracer preloaded, its faults (`--fail-*`) applied, and this
/// process deaf to the terminal's signals until the command has exited, so that a Ctrl-C
/// still leaves it time to write the traces.
fn spawn_traced(
    args: &RecordArgs,
    program: &OsString,
    staging: &Staging,
    stacks: bool,
) -> Result<(Child, IgnoredSignals)> {
    let mut command = Command::new(program);
    args.faults.apply(&mut command)?;
    let ignored = ignore_termination_signals()?;
    let child = command
        .args(args.command.iter().skip(1))
        .env("LD_PRELOAD", &staging.preload)
        .env("ALLOCVIEW_SPOOL", staging.spools.path().join("p"))
        .env("ALLOCVIEW_STACKS", if stacks { "1" } else { "0" })
        .env("ALLOCVIEW_PAUSED", if args.paused { "1" } else { "0" })
        .env(
            "ALLOCVIEW_STACK_SAMPLE",
            args.stack_sample
                .filter(|_| stacks)
                .map_or_else(|| "0".to_owned(), |b| b.to_string()),
        )
        .spawn()
        .with_context(|| format!("cannot run {}", program.to_string_lossy()))?;
    if args.paused {
        eprintln!(
            "allocview: recording is paused; start it with `allocview ctl {pid} start` (also \
             `stop`, `mark NAME`)",
            pid = child.id()
        );
    }
    Ok((child, ignored))
}

/// Refuses a `--stack-sample` that cannot apply: with no stacks recorded (`--no-stacks`,
/// `--text`, a platform without stacks) or of 0 bytes.
fn check_stack_sample(args: &RecordArgs) -> Result<()> {
    let Some(bytes) = args.stack_sample else {
        return Ok(());
    };
    if args.no_stacks {
        bail!(
            "--stack-sample samples the call stacks that --no-stacks turns off: use one or the \
             other"
        );
    }
    if args.text {
        bail!(
            "--stack-sample needs call stacks, which the text form (--text) cannot hold: drop \
             --text (`allocview convert` makes the text form of a trace later)"
        );
    }
    if !cfg!(target_arch = "x86_64") {
        bail!("--stack-sample: call stacks are recorded on x86-64 only");
    }
    if bytes == 0 {
        bail!("--stack-sample 0: the mean sampling interval must be at least 1 byte");
    }
    Ok(())
}

/// Where and how the traces are written: the same for every process of the recording.
#[derive(Clone, Copy)]
struct Target<'a> {
    output: &'a Path,
    form: Form,
    program_name: &'a str,
    base: TimeBase,
    protected: &'a [&'a Path],
}

/// One trace written: the process image it records, its file and its summary.
struct Written {
    pid: u32,
    generation: u32,
    path: PathBuf,
    summary: RecordingSummary,
}

/// Converts every spool the command left into its trace, in process start order (pids grow,
/// mostly; exec generations in order), removing each spool once its trace is written. A
/// command that left no spool is an error: LD_PRELOAD did not reach it.
fn convert_spools(
    spools_dir: &Path,
    target: Target<'_>,
    live: &mut live::Converter<'_>,
    prefetch: Option<Prefetch>,
) -> Result<Vec<Written>> {
    let mut found = list_spools(spools_dir)?;
    if found.is_empty() {
        bail!(
            "the command wrote no trace (is it statically linked, or setuid? LD_PRELOAD does \
             not apply to those)"
        );
    }
    found.sort_by_key(|s| (s.pid, s.generation));
    let single = found.len() == 1;
    let mut written = Vec::new();
    // Shared by the processes: each module is read once.
    let mut symbolizer = prefetch.map(Prefetch::finish).unwrap_or_default();
    for spool in &found {
        let path = if single {
            target.output.to_path_buf()
        } else {
            per_process_name(target.output, spool.pid, spool.generation)
        };
        let summary = convert_spool(spool, &path, target, live, &mut symbolizer)?;
        std::fs::remove_file(&spool.path).ok();
        written.push(Written {
            pid: spool.pid,
            generation: spool.generation,
            path,
            summary,
        });
    }
    Ok(written)
}

/// Converts one spool into the trace `path`: finishes its live conversion, or converts the
/// file when that was given up. A spool that cannot be converted is kept next to the output,
/// since the private spool folder is removed on the way out.
fn convert_spool(
    spool: &Spool,
    path: &Path,
    target: Target<'_>,
    live: &mut live::Converter<'_>,
    symbolizer: &mut Symbolizer,
) -> Result<RecordingSummary> {
    let mut add_stacks =
        |writer: &mut RecordWriter, info: BinaryInfo, written: TraceStacks| -> Result<()> {
            writer.write_run_tables(&info)?;
            if let Some(stacks) = info.stacks {
                written.finish(writer, &stacks, symbolizer)?.print_summary();
            }
            Ok(())
        };
    let converted = match live.finish(&spool.path, path, &mut add_stacks) {
        Some(summary) => Ok(summary),
        None => {
            if let Some(why) = live.given_up(&spool.path) {
                // It costs the time of a conversion after the run: worth knowing.
                eprintln!(
                    "  note: pid {}: converted after the run, not while it ran ({why})",
                    spool.pid
                );
            }
            convert_file(
                &spool.path,
                path,
                target.form,
                target.program_name,
                target.base,
                target.protected,
                &mut add_stacks,
            )
        }
    };
    converted.map_err(|e| {
        let kept = keep_spool(&spool.path, path);
        e.context(format!(
            "while converting the trace of process {}; {kept}",
            spool.pid
        ))
    })
}

/// Tells on stderr (stdout is the command's) what was recorded and how to explore it, then
/// how the command ended: with faults injected, whether they showed in the traces.
fn report(args: &RecordArgs, written: &[Written], status: ExitStatus) -> Result<()> {
    eprintln!(
        "recorded {} process{} of `{}`",
        written.len(),
        if written.len() == 1 { "" } else { "es" },
        args.command
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    for w in written {
        summarise(w.pid, w.generation, &w.path, &w.summary);
    }
    if let Some(first) = written.first() {
        eprintln!("explore: allocview stats {}", shell_quote(&first.path));
    }
    if args.faults.any() {
        let paths: Vec<PathBuf> = written.iter().map(|w| w.path.clone()).collect();
        limit::report(status, &paths)?;
    } else if !status.success() {
        eprintln!("note: the command exited with {status}");
    }
    Ok(())
}

/// Prints events, threads and peak live bytes of one written trace, counted as it was
/// written.
fn summarise(pid: u32, generation: u32, path: &Path, s: &RecordingSummary) {
    let image = if generation > 0 {
        format!(" (exec #{generation})")
    } else {
        String::new()
    };
    eprintln!(
        "  pid {pid}{image}: {}  {} events, {} threads, peak live {} (at {}), {} live at exit",
        path.display(),
        format::count(s.events),
        s.threads,
        format::bytes(s.peak_live_bytes),
        format::seconds(s.peak_live_time_s),
        format::bytes(s.final_live_bytes),
    );
    for w in s.summary.warnings() {
        eprintln!("    note: {w}");
    }
}

/// The files a trace must not replace: the program (found as the shell would: a path when
/// it holds a `/`, else on `PATH`) and every argument that names an existing file.
fn protected_files(command: &[OsString]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(program) = command.first() {
        let program = Path::new(program);
        if program.components().count() > 1 {
            out.push(program.to_path_buf());
        } else if let Some(paths) = std::env::var_os("PATH") {
            out.extend(
                std::env::split_paths(&paths)
                    .map(|dir| dir.join(program))
                    .find(|p| p.is_file()),
            );
        }
    }
    out.extend(
        command
            .iter()
            .skip(1)
            .map(PathBuf::from)
            .filter(|p| p.is_file()),
    );
    out
}

/// Moves a spool whose conversion failed out of the private directory (removed on exit), next
/// to the trace it was to become; returns a sentence saying where it is.
fn keep_spool(spool: &Path, output: &Path) -> String {
    let name = output
        .file_name()
        .map_or_else(|| "trace".to_owned(), |n| n.to_string_lossy().into_owned());
    for n in 0..100u32 {
        let suffix = if n == 0 {
            String::new()
        } else {
            format!(".{n}")
        };
        let kept = output.with_file_name(format!("{name}{suffix}.spool"));
        if kept.exists() {
            continue;
        }
        if std::fs::rename(spool, &kept).is_ok() {
            return format!(
                "the recording is kept in {} (`allocview convert {} OUT` finishes it)",
                kept.display(),
                shell_quote(&kept)
            );
        }
        break;
    }
    format!(
        "the recording could not be kept (it was {})",
        spool.display()
    )
}

fn shell_quote(path: &Path) -> String {
    let s = path.display().to_string();
    if s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_./+,:@".contains(&b))
    {
        s
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Keeps this process alive through the signals a terminal sends to the whole foreground job,
/// until dropped (the command itself still gets them, with their default actions: handlers do
/// not survive exec).
struct IgnoredSignals {
    ids: Vec<signal_hook::SigId>,
    _flag: Arc<AtomicBool>,
    /// The temporary files' cleanup on SIGINT and SIGTERM (`safe_write`) waits too: the
    /// traces are being written while the command runs.
    _deferred: safe_write::DeferInterrupts,
}

fn ignore_termination_signals() -> Result<IgnoredSignals> {
    let deferred = safe_write::DeferInterrupts::new();
    let flag = Arc::new(AtomicBool::new(false));
    let mut ids = Vec::new();
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGQUIT,
    ] {
        ids.push(signal_hook::flag::register(sig, Arc::clone(&flag)).context("signal handler")?);
    }
    Ok(IgnoredSignals {
        ids,
        _flag: flag,
        _deferred: deferred,
    })
}

impl Drop for IgnoredSignals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_process_names_insert_the_pid() {
        assert_eq!(
            per_process_name(Path::new("out/trace.avt"), 42, 0),
            PathBuf::from("out/trace.42.avt")
        );
        assert_eq!(
            per_process_name(Path::new("t.trace.gz"), 42, 2),
            PathBuf::from("t.42-2.trace.gz")
        );
        assert_eq!(per_process_name(Path::new("x"), 7, 0), PathBuf::from("x.7"));
    }

    #[test]
    fn the_tracer_is_embedded() {
        assert!(
            TRACER_SO.starts_with(b"\x7fELF"),
            "{} bytes",
            TRACER_SO.len()
        );
    }
}
