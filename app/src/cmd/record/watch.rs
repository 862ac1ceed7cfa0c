//! `record --live` and `record --gui`: the run shown in an explorer while it is recorded.
//!
//! The recording itself is a plain `allocview record` of the same command, started as a child
//! process, whose trace the explorer follows as it is written (`model::follow`). The
//! explorer has the terminal, so the command's standard input is empty and its output, and
//! the recording's own summary, go to `OUTPUT.log` (a file this command made earlier is
//! replaced; any other file of that name is refused). Quitting the explorer before the command
//! has ended leaves both running: the trace is finished when the command ends.

use std::ffi::OsString;
use std::io::{IsTerminal as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

use super::RecordArgs;
use crate::model::live::Follow;
use crate::model::state::Launch;

/// The first line of the log, by which a later `record --live` knows the file is its own.
const LOG_HEADER: &str = "# allocview record --live: the recorded command's output";

/// Runs the recording of `args` in a child `allocview record` writing `output`, and an
/// explorer following it; returns the status to exit with (the command's, once it has ended;
/// 0 when it is still running).
pub(super) fn run(args: &RecordArgs, output: &Path) -> Result<u8> {
    if args.gui && !cfg!(feature = "gui") {
        bail!("this allocview was built without the desktop explorer (feature `gui`)");
    }
    let in_a_terminal = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if !args.gui && !in_a_terminal {
        bail!(
            "record --live shows the run in this terminal, and its input or output is not one: \
             use record --gui, or record without --live and `allocview FILE --follow` elsewhere"
        );
    }
    let log_path = log_path(output);
    let log = open_log(&log_path)?;
    // A trace of that name from an earlier run is not this run's.
    let since = std::time::SystemTime::now();
    let exe = std::env::current_exe().context("cannot find allocview's own executable")?;
    let mut child = Command::new(exe)
        .args(forwarded(args, output))
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("cannot share the log")?)
        .stderr(log)
        .spawn()
        .context("cannot start the recording")?;
    let follow = Follow {
        since: Some(since),
        recorder_pid: Some(child.id()),
        log: Some(log_path.clone()),
        wake: None,
    };
    let shown = if args.gui {
        show_in_gui(output, follow)
    } else {
        let launch = Launch {
            goto: None,
            follow: Some(follow),
        };
        show_in_terminal(output, launch)
    };
    match child.try_wait().context("cannot wait for the recording")? {
        Some(status) => {
            shown?;
            if status.success() {
                eprintln!(
                    "recorded {}; the command's output is in {}",
                    output.display(),
                    log_path.display()
                );
            } else {
                // `record`'s own failure, or the command's status: its last words say which.
                eprintln!("the end of {}:", log_path.display());
                let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                for line in lines.iter().skip(lines.len().saturating_sub(10)) {
                    eprintln!("  {line}");
                }
            }
            Ok(status
                .code()
                .and_then(|c| u8::try_from(c).ok())
                .unwrap_or(1))
        }
        None => {
            eprintln!(
                "the command is still running and being recorded into {} (allocview record, \
                 pid {}); its output goes to {}",
                output.display(),
                child.id(),
                log_path.display()
            );
            shown.map(|()| 0)
        }
    }
}

/// The explorers' default policies, with no flags given.
fn default_policies() -> Result<crate::session::PolicyArgs> {
    use clap::{Args as _, FromArgMatches as _};
    let cmd = crate::session::PolicyArgs::augment_args(clap::Command::new("live"));
    let matches = cmd
        .try_get_matches_from(["live"])
        .context("the default policies")?;
    crate::session::PolicyArgs::from_arg_matches(&matches).context("the default policies")
}

fn show_in_terminal(output: &Path, launch: Launch) -> Result<()> {
    let policies = default_policies()?;
    let (names, real) = policies.explorer_specs_and_real(None)?;
    let config = policies.config()?;
    let jobs = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let input = crate::session::InputArgs::default();
    crate::tui::run(output, &names, &real, config, &input, jobs, launch)
}

#[cfg(feature = "gui")]
fn show_in_gui(output: &Path, follow: Follow) -> Result<()> {
    crate::gui::run(&crate::gui::GuiArgs {
        files: vec![output.to_path_buf()],
        policies: default_policies()?,
        input: crate::session::InputArgs::default(),
        screenshot: None,
        goto: None,
        size: "1400x900".to_owned(),
        sites: false,
        tune: false,
        follow: true,
        follow_recording: Some(follow),
    })
}

#[cfg(not(feature = "gui"))]
fn show_in_gui(_output: &Path, _follow: Follow) -> Result<()> {
    bail!("this allocview was built without the desktop explorer (feature `gui`)")
}

/// `OUTPUT.log`.
fn log_path(output: &Path) -> PathBuf {
    let mut name = output.as_os_str().to_owned();
    name.push(".log");
    PathBuf::from(name)
}

/// Creates the log, or replaces one an earlier `record --live` made; refuses any other file.
fn open_log(path: &Path) -> Result<std::fs::File> {
    if let Ok(mut existing) = std::fs::File::open(path) {
        let mut head = vec![0; LOG_HEADER.len()];
        let ours = existing.read_exact(&mut head).is_ok() && head == LOG_HEADER.as_bytes();
        if !ours {
            bail!(
                "{} exists and was not written by allocview record --live: it would receive \
                 the command's output; move it, or record to another -o",
                path.display()
            );
        }
    }
    let mut log =
        std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
    writeln!(log, "{LOG_HEADER}").with_context(|| format!("cannot write {}", path.display()))?;
    Ok(log)
}

/// The arguments of the child `allocview record`: every flag of `args` but `--live` and
/// `--gui`, the output named (its default name holds this process's pid).
fn forwarded(args: &RecordArgs, output: &Path) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec!["record".into(), "-o".into(), output.into()];
    let flags = [
        (args.text, "--text"),
        (args.no_stacks, "--no-stacks"),
        (args.paused, "--paused"),
    ];
    out.extend(flags.iter().filter(|f| f.0).map(|f| OsString::from(f.1)));
    let values = [
        ("--stack-sample", args.stack_sample.map(|v| v.to_string())),
        ("--limit", args.faults.limit.map(|v| v.to_string())),
        ("--fail-nth", args.faults.fail_nth.map(|v| v.to_string())),
        ("--fail-rate", args.faults.fail_rate.map(|v| v.to_string())),
        ("--seed", Some(args.faults.seed.to_string())),
    ];
    for (flag, value) in values {
        if let Some(v) = value {
            out.push(flag.into());
            out.push(v.into());
        }
    }
    out.push("--".into());
    out.extend(args.command.iter().cloned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: Sub,
    }
    #[derive(clap::Subcommand)]
    enum Sub {
        Record(RecordArgs),
    }

    fn parse(argv: &[&str]) -> RecordArgs {
        let Sub::Record(a) = Cli::try_parse_from(argv).unwrap().cmd;
        a
    }

    #[test]
    fn the_child_records_with_every_flag_but_the_explorers() {
        let a = parse(&[
            "allocview",
            "record",
            "--live",
            "--paused",
            "--stack-sample",
            "512KiB",
            "--limit",
            "1MiB",
            "--seed",
            "3",
            "-o",
            "x.avt",
            "--",
            "prog",
            "--live",
            "-o",
        ]);
        let f = forwarded(&a, Path::new("x.avt"));
        let again = parse(
            &std::iter::once("allocview")
                .chain(f.iter().map(|s| s.to_str().unwrap()))
                .collect::<Vec<_>>(),
        );
        assert!(!again.live && !again.gui);
        assert!(again.paused);
        assert_eq!(again.stack_sample, Some(512 << 10));
        assert_eq!(again.faults.limit, Some(1 << 20));
        assert_eq!(again.faults.seed, 3);
        assert_eq!(again.output.as_deref(), Some(Path::new("x.avt")));
        // The command's own arguments are its own.
        assert_eq!(again.command, ["prog", "--live", "-o"]);
    }

    #[test]
    fn a_log_not_ours_is_refused_and_ours_replaced() {
        let d = std::env::temp_dir().join(format!("allocview-watch-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("run.avt.log");
        std::fs::write(&p, "my notes\n").unwrap();
        let e = open_log(&p).unwrap_err().to_string();
        assert!(e.contains("was not written by allocview"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "my notes\n");
        std::fs::remove_file(&p).unwrap();
        drop(open_log(&p).unwrap());
        std::fs::write(&p, format!("{LOG_HEADER}\nold output\n")).unwrap();
        drop(open_log(&p).unwrap());
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("{LOG_HEADER}\n")
        );
        std::fs::remove_dir_all(&d).ok();
    }
}
