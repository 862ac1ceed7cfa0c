//! Real-allocator rows (`real-glibc`, `real-jemalloc`, `real-mimalloc`, `real-tcmalloc`): the
//! trace's calls replayed through the actual library in a process of their own, whose resident
//! memory is the row's footprint. Measured, not modelled.
//!
//! The road of one row: [`RealSpec`] parses what the user wrote; [`ops::write_ops`] writes
//! the calls into a private directory, beside the embedded replayer (`replayer/`, built by
//! `app/build.rs`); the replayer runs there with the library preloaded and the settings in the
//! environment (nothing of the user's own allocator environment is inherited), writes each
//! allocation's pages, and samples its resident memory every [`sample_every`] calls, after the
//! trace's peak of live bytes and after the last call; [`RealRun`] holds what it measured,
//! less what the process held before the first call.
//!
//! What such a row cannot show: the program's own work between its allocations (the replay
//! runs the calls back to back), its cache effects, and the timing of its threads (each
//! traced thread runs on a thread of its own, but in the recorded global order, one at a
//! time).

mod ops;
pub mod spec;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use allocview_sim::series::Series;
use allocview_sim::trace::TraceView;
use anyhow::{Context as _, Result, bail};

pub use spec::{REAL_NAMES, RealSpec, Touch, is_real};

/// The replay process, embedded (empty where it could not be built).
static REPLAYER_EXE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/allocview_replayer"));

/// Most threads a replay starts (one per traced thread, all alive at once).
const MAX_THREADS: u32 = 1024;

/// Calls between two samples of resident memory: at most 1,024, and fewer on short traces (a
/// sample costs a read of `/proc/self/statm`, some 2 µs), so a trace of any length has at
/// least some 256 samples where it has the calls.
#[must_use]
pub fn sample_every(events: usize) -> u32 {
    u32::try_from((events / 256).clamp(1, 1024)).unwrap_or(1024)
}

/// What a real row measured.
#[derive(Clone, Debug)]
pub struct RealRun {
    pub spec: RealSpec,
    /// The shared object preloaded (`None`: the C library's own allocator).
    pub library: Option<PathBuf>,
    /// The line a user sets to run their program so.
    pub env_line: String,
    /// `(events done, resident bytes above the baseline)`, ascending; the first at 0.
    pub samples: Vec<(usize, u64)>,
    /// What the replay process held before the first call (subtracted from every sample).
    pub baseline_rss_bytes: u64,
    pub peak_rss_bytes: u64,
    /// Events done at the sample of the peak.
    pub peak_rss_event: usize,
    /// Resident memory right after the event of the trace's peak of live bytes.
    pub rss_at_peak_live_bytes: u64,
    pub final_rss_bytes: u64,
    /// Allocations the library refused (returned NULL).
    pub failed_allocations: u64,
    /// The replay alone (the calls, the page writes and the samples), and its rate.
    pub replay_seconds: f64,
    pub events_per_second: f64,
    /// The whole row: writing the calls, starting the process, the replay.
    pub wall_seconds: f64,
}

impl RealRun {
    /// The row's series: live bytes from the trace, the footprint the measured resident
    /// memory, on the trace's time axis in `buckets` buckets (as every policy's).
    #[must_use]
    pub fn series(&self, view: &TraceView<'_>, buckets: usize) -> Series {
        allocview_sim::series::measured(view, buckets, &self.samples)
    }
}

/// Whether this build has the replay process; why not, when it does not.
fn replayer_missing() -> Option<&'static str> {
    option_env!("ALLOCVIEW_NO_REPLAYER").or(REPLAYER_EXE.is_empty().then_some("not built"))
}

/// A trace's calls written once for its replays, beside the replayer, in a private directory
/// (removed when dropped): every real row of one trace replays this one file.
pub struct Prepared {
    dir: tempfile::TempDir,
    exe: PathBuf,
    calls_path: PathBuf,
    /// Traced threads (each would be a thread of the replay).
    threads: u32,
    /// Replays run on these files so far (each writes its own samples).
    runs: std::cell::Cell<u32>,
    /// Writing the calls (counted in each row's wall time).
    write_seconds: f64,
}

/// Writes `view`'s calls (each event's thread index in `threads`, its call in `calls` where the
/// trace names them) for [`run_prepared`] to replay through each of `specs`, once each of them
/// is known to be able to run (so nothing is written for a replay that would be refused).
///
/// # Errors
/// A build without the replayer, a spec refused ([`check`]), or a file that cannot be written.
pub fn prepare(
    specs: &[RealSpec],
    view: &TraceView<'_>,
    threads: &[u16],
    calls: Option<&[u8]>,
) -> Result<Prepared> {
    if let Some(why) = replayer_missing() {
        bail!("real-allocator rows are not available in this build ({why})");
    }
    let n_threads = u32::from(threads.iter().copied().max().unwrap_or(0)) + 1;
    for spec in specs {
        check(spec, view, n_threads)?;
    }
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("allocview-real-")
        .tempdir()
        .context("cannot create a private directory for the replay")?;
    let exe = dir.path().join("allocview_replayer");
    write_executable(&exe)?;
    let calls_path = dir.path().join("calls.bin");
    let (_, peak_event) = view.peak_live();
    let setup = ops::Setup {
        threads: n_threads,
        sample_every: sample_every(view.len()),
        mark: peak_event as u64,
    };
    let f = std::fs::File::create(&calls_path)
        .with_context(|| format!("cannot write {}", calls_path.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    ops::write_ops(&mut w, view, threads, calls, &setup)
        .with_context(|| format!("cannot write {}", calls_path.display()))?;
    w.into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_data())
        .with_context(|| format!("cannot write {}", calls_path.display()))?;
    Ok(Prepared {
        dir,
        exe,
        calls_path,
        threads: n_threads,
        runs: std::cell::Cell::new(0),
        write_seconds: started.elapsed().as_secs_f64(),
    })
}

/// What refuses a replay: too little memory, too many threads for `threads=each`.
fn check(spec: &RealSpec, view: &TraceView<'_>, n_threads: u32) -> Result<()> {
    check_room(spec, view)?;
    if !spec.one_thread && n_threads > MAX_THREADS {
        bail!(
            "{}: the trace has {n_threads} threads, and each would be a thread of the replay, \
             all alive at once (at most {MAX_THREADS}); replay them on one: {}:threads=one",
            spec.label,
            spec.label
        );
    }
    Ok(())
}

/// Replays the calls `prepared` holds (of `view`) through the allocator `spec` names.
///
/// # Errors
/// A library that is not installed, a replay process that could not run or failed.
pub fn run_prepared(spec: &RealSpec, view: &TraceView<'_>, prepared: &Prepared) -> Result<RealRun> {
    check(spec, view, prepared.threads)?;
    let library = spec.library()?;
    let started = Instant::now();
    let n = prepared.runs.get();
    prepared.runs.set(n + 1);
    let out_path = prepared.dir.path().join(format!("samples-{n}.bin"));
    let mut cmd = std::process::Command::new(&prepared.exe);
    cmd.arg(&prepared.calls_path)
        .arg(&out_path)
        .arg(spec.touch.code().to_string())
        .arg(if spec.one_thread { "one" } else { "each" });
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(spec::is_allocator_env) {
            cmd.env_remove(&k);
        }
    }
    if let Some(lib) = &library {
        cmd.env("LD_PRELOAD", lib);
    }
    for (k, v) in spec.settings_env() {
        cmd.env(k, v);
    }
    let out = cmd
        .stdout(std::process::Stdio::null())
        .output()
        .with_context(|| {
            format!(
                "{}: cannot run the replay process from {} (a file system mounted noexec? \
                 TMPDIR names where it goes)",
                spec.label,
                prepared.dir.path().display()
            )
        })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The dynamic linker ignores a library it cannot load, and the process would run on the
    // C library's allocator under the other's name.
    if stderr.contains("cannot be preloaded") {
        bail!(
            "{}: {} could not be loaded, so nothing was replayed through it: {}",
            spec.label,
            library
                .as_ref()
                .map_or_else(|| "the library".to_owned(), |l| l.display().to_string()),
            stderr.trim()
        );
    }
    if !out.status.success() {
        bail!(
            "{}: the replay process failed ({}): {}",
            spec.label,
            out.status,
            stderr.trim()
        );
    }
    let measured = read_samples(&out_path)
        .with_context(|| format!("{}: reading the replay's samples", spec.label))?;
    std::fs::remove_file(&out_path).ok();
    let (_, peak_event) = view.peak_live();
    let wall_seconds = started.elapsed().as_secs_f64() + prepared.write_seconds;
    Ok(summarise(
        spec,
        library,
        measured,
        peak_event,
        view.len(),
        wall_seconds,
    ))
}

/// Refuses a replay whose written pages would not fit in the machine's available memory (the
/// replay holds the trace's peak of live bytes for real): it would be killed, or push out
/// everything else, rather than answer.
fn check_room(spec: &RealSpec, view: &TraceView<'_>) -> Result<()> {
    let (peak_live, _) = view.peak_live();
    // The calls file (16 bytes a call) may be in memory too (a tmpfs).
    let calls_bytes = view.len() as u64 * 16;
    let written = if spec.touch == Touch::None {
        0
    } else {
        peak_live
    };
    let Some(available) = mem_available_bytes() else {
        return Ok(());
    };
    if written + calls_bytes > available / 10 * 8 {
        bail!(
            "{}: the trace holds {} live at its peak, and its calls take {}: more than 80% of \
             the {} this machine has available; a real row writes every page it allocates, so \
             it would not fit ({}:touch=none writes none)",
            spec.label,
            crate::format::bytes(peak_live),
            crate::format::bytes(calls_bytes),
            crate::format::bytes(available),
            spec.label
        );
    }
    Ok(())
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn mem_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn write_executable(path: &Path) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(REPLAYER_EXE)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// What the replay process wrote.
struct Measured {
    baseline_rss_bytes: u64,
    replay_ns: u64,
    failed: u64,
    /// `(events done, resident bytes)`, as read (the baseline not yet subtracted).
    samples: Vec<(usize, u64)>,
}

fn read_samples(path: &Path) -> Result<Measured> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .with_context(|| format!("cannot read {}", path.display()))?;
    let word = |i: usize| {
        bytes
            .get(8 + i * 8..16 + i * 8)
            .and_then(|w| w.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if bytes.get(..8) != Some(b"AVRPOUT1".as_slice()) {
        bail!("{}: not the replay's samples", path.display());
    }
    let (Some(baseline), Some(replay_ns), Some(failed), Some(n)) =
        (word(0), word(1), word(2), word(3))
    else {
        bail!("{}: cut short", path.display());
    };
    // Two words a sample, after the four of the header: the count is checked against the
    // file's length, not trusted.
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    if n.checked_mul(16).and_then(|b| b.checked_add(40)) != Some(bytes.len()) {
        bail!(
            "{}: {n} samples do not fit its {} bytes",
            path.display(),
            bytes.len()
        );
    }
    let samples = (0..n)
        .filter_map(|i| Some((usize::try_from(word(4 + 2 * i)?).ok()?, word(5 + 2 * i)?)))
        .collect();
    Ok(Measured {
        baseline_rss_bytes: baseline,
        replay_ns,
        failed,
        samples,
    })
}

fn summarise(
    spec: &RealSpec,
    library: Option<PathBuf>,
    m: Measured,
    peak_live_event: usize,
    events: usize,
    wall_seconds: f64,
) -> RealRun {
    let samples: Vec<(usize, u64)> = m
        .samples
        .iter()
        .map(|&(done, rss)| (done, rss.saturating_sub(m.baseline_rss_bytes)))
        .collect();
    let (peak_rss_event, peak_rss_bytes) = samples
        .iter()
        .copied()
        .fold((0, 0), |best, s| if s.1 > best.1 { s } else { best });
    let rss_at_peak_live_bytes = samples
        .iter()
        .find(|&&(done, _)| done > peak_live_event)
        .map_or(0, |s| s.1);
    let final_rss_bytes = samples.last().map_or(0, |s| s.1);
    let replay_seconds = m.replay_ns as f64 / 1e9;
    RealRun {
        env_line: spec.env_line(library.as_deref()),
        spec: spec.clone(),
        library,
        samples,
        baseline_rss_bytes: m.baseline_rss_bytes,
        peak_rss_bytes,
        peak_rss_event,
        rss_at_peak_live_bytes,
        final_rss_bytes,
        failed_allocations: m.failed,
        replay_seconds,
        events_per_second: events as f64 / replay_seconds.max(1e-9),
        wall_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the embedded replayer on a calls file of `header` and `ops` 16-byte calls.
    fn replay_file(header: &[u8; ops::HEADER_BYTES], calls: usize) -> std::process::Output {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("allocview_replayer");
        write_executable(&exe).unwrap();
        let mut file = header.to_vec();
        file.resize(ops::HEADER_BYTES + calls * 16, 5);
        // Every call NOTHING (op 5) on thread 0, slot 0.
        for c in file[ops::HEADER_BYTES..].chunks_mut(16) {
            c.fill(0);
            c[0] = 5;
        }
        let calls_path = dir.path().join("calls.bin");
        std::fs::write(&calls_path, file).unwrap();
        std::process::Command::new(&exe)
            .arg(&calls_path)
            .arg(dir.path().join("out.bin"))
            .args(["2", "each"])
            .output()
            .unwrap()
    }

    fn header(calls: u64, slots: u64, threads: u32) -> [u8; ops::HEADER_BYTES] {
        let mut h = [0u8; ops::HEADER_BYTES];
        h[..8].copy_from_slice(b"AVRPLAY1");
        h[8..16].copy_from_slice(&calls.to_le_bytes());
        h[16..24].copy_from_slice(&slots.to_le_bytes());
        h[24..28].copy_from_slice(&threads.to_le_bytes());
        h[32..36].copy_from_slice(&1u32.to_le_bytes());
        h
    }

    #[test]
    fn a_header_that_claims_more_slots_or_threads_than_its_calls_is_refused() {
        if replayer_missing().is_some() {
            return;
        }
        assert!(replay_file(&header(4, 4, 1), 4).status.success());
        // The tables are mapped by these counts: refused before anything is mapped.
        for bad in [header(4, 1 << 20, 1), header(4, 4, 1 << 20)] {
            let out = replay_file(&bad, 4);
            assert!(!out.status.success());
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("claims more slots or threads"), "{err}");
        }
    }
}
