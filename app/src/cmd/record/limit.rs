//! `allocview record --limit BYTES` (and `--fail-nth N`, `--fail-rate P --seed S`): the
//! tracer makes allocations fail (see `tracer/src/limit.rs` for what counts), and `record`
//! reports how the program reacted: its exit status or signal and the first failure, with its
//! call stack where stacks are recorded.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use allocview_loaders::events::CALL_NAMES;
use allocview_loaders::{LoadOptions, Loaded};
use allocview_sim::trace::EventKind;
use anyhow::{Context as _, Result, bail};

use crate::format;

/// The fault-injection flags of `allocview record`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct LimitArgs {
    /// Make allocations fail (NULL with ENOMEM) once they would take the program's live heap
    /// bytes (the usable sizes of its live blocks) past this limit, e.g. 64MiB.
    #[arg(long, value_parser = crate::units::parse_bytes, value_name = "BYTES")]
    pub limit: Option<u64>,
    /// Make the Nth allocation call (1-based, counted per process) fail.
    #[arg(long, value_name = "N")]
    pub fail_nth: Option<u64>,
    /// Make each allocation call fail with this probability (0 to 1), the same calls on every
    /// run with the same --seed.
    #[arg(long, value_name = "P")]
    pub fail_rate: Option<f64>,
    /// Seed of --fail-rate.
    #[arg(long, default_value_t = 0, value_name = "S")]
    pub seed: u64,
}

const VARS: [&str; 4] = [
    "ALLOCVIEW_LIMIT",
    "ALLOCVIEW_FAIL_NTH",
    "ALLOCVIEW_FAIL_RATE_PPB",
    "ALLOCVIEW_FAIL_SEED",
];

impl LimitArgs {
    /// Whether any failure is asked for.
    #[must_use]
    pub fn any(&self) -> bool {
        self.limit.is_some() || self.fail_nth.is_some() || self.fail_rate.is_some()
    }

    /// Sets the tracer's variables on `cmd` (and clears inherited ones not asked for).
    pub fn apply(&self, cmd: &mut Command) -> Result<()> {
        for v in VARS {
            cmd.env_remove(v);
        }
        if let Some(l) = self.limit {
            cmd.env("ALLOCVIEW_LIMIT", l.to_string());
        }
        if let Some(n) = self.fail_nth {
            if n == 0 {
                bail!("--fail-nth counts from 1");
            }
            cmd.env("ALLOCVIEW_FAIL_NTH", n.to_string());
        }
        if let Some(p) = self.fail_rate {
            if !(0.0..=1.0).contains(&p) {
                bail!("--fail-rate must be between 0 and 1, got {p}");
            }
            cmd.env(
                "ALLOCVIEW_FAIL_RATE_PPB",
                ((p * 1e9).round() as u64).to_string(),
            );
            cmd.env("ALLOCVIEW_FAIL_SEED", self.seed.to_string());
        }
        Ok(())
    }
}

/// Says how the program ended, and each written trace's failed allocations and the first one.
pub fn report(status: ExitStatus, traces: &[PathBuf]) -> Result<()> {
    use std::os::unix::process::ExitStatusExt as _;
    let ended = match (status.code(), status.signal()) {
        (Some(0), _) => "exited normally (status 0)".to_owned(),
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!(
            "was killed by signal {sig}{}{}",
            signal_name(sig).map_or_else(String::new, |n| format!(" ({n})")),
            if status.core_dumped() {
                ", core dumped"
            } else {
                ""
            }
        ),
        (None, None) => format!("ended with {status}"),
    };
    eprintln!("under the allocation limit, the program {ended}");
    for path in traces {
        failures_of(path)?;
    }
    Ok(())
}

fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        6 => "SIGABRT",
        7 => "SIGBUS",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        15 => "SIGTERM",
        _ => return None,
    })
}

/// Prints the failed allocations of one trace.
fn failures_of(path: &Path) -> Result<()> {
    let Loaded::MallocTrace(trace) = allocview_loaders::load(path, &LoadOptions::default())
        .with_context(|| format!("while reading back {}", path.display()))?
    else {
        bail!("{} is not a malloc trace", path.display());
    };
    let ev = &trace.events;
    let kind = ev.column("kind")?.u8()?;
    let failed_code = EventKind::AllocFailed.code();
    let count = kind.iter().filter(|&k| k == Some(failed_code)).count();
    if count == 0 {
        eprintln!("  {}: no allocation failed", path.display());
        return Ok(());
    }
    let Some(first) = kind.iter().position(|k| k == Some(failed_code)) else {
        return Ok(());
    };
    let view = allocview_loaders::trace_view(ev, path)?;
    let live_bytes: u64 = (0..first).fold(0u64, |live, i| match view.kind.get(i) {
        Some(&k) if k == EventKind::Alloc.code() => live + view.size_bytes.get(i).unwrap_or(&0),
        Some(&k) if k == EventKind::Free.code() => {
            live.saturating_sub(*view.size_bytes.get(i).unwrap_or(&0))
        }
        _ => live,
    });
    let call = ev
        .column("call")
        .ok()
        .and_then(|c| c.u8().ok()?.get(first))
        .and_then(|c| CALL_NAMES.get(usize::from(c)))
        .copied()
        .unwrap_or("allocation");
    let size = view.size_bytes.get(first).copied().unwrap_or(0);
    let t_ns = view.t_ns.get(first).copied().unwrap_or(0);
    eprintln!(
        "  {}: {} failed allocation{}; the first, event {} at {}: {call} of {} with {} live \
         (requested bytes)",
        path.display(),
        format::count(count as u64),
        if count == 1 { "" } else { "s" },
        format::count(first as u64),
        format::seconds(t_ns as f64 / 1e9),
        format::bytes(size),
        format::bytes(live_bytes),
    );
    let stack = ev
        .column("stack_id")
        .ok()
        .and_then(|c| c.u32().ok()?.get(first));
    if let (Some(id), Some(stacks)) = (stack, trace.stacks.as_ref()) {
        for frame in stacks.frames_of(id).take(12) {
            eprintln!("      {frame}");
        }
    }
    Ok(())
}
