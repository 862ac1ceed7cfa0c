//! Following a trace while `record` writes it (`allocview FILE --follow`, `record --live`):
//! the explorers show the run as it happens.
//!
//! `record` writes its trace into a hidden temporary file beside the output
//! (`.allocview-tmp-PID-N-NAME`, see [`crate::safe_write`]) and renames it over the output
//! when the program has ended; while the program runs it ends an events block and flushes it
//! every [`crate::trace_file::LIVE_FLUSH`], so the file always holds the run up to a fraction
//! of a second ago. The follower finds the newest such file whose writer is alive (or the
//! output itself, finished) and, each time it has grown, reads it again and goes on:
//!
//! - the policies replay only the events they have not seen ([`LiveReplay`]), their series
//!   growing by merging buckets, never from the first event;
//! - the size classes likewise ([`ClassSeriesBuilder::growing`]);
//! - policies that need the whole trace before their first event (`oracle`, `predictive`)
//!   replay once the recording has ended.
//!
//! Each reading of the file is the whole file again (the loader is not incremental): the
//! follower waits at least three times as long as its last round took before the next, so it
//! takes at most a quarter of a core however long the run grows. A file identified by another
//! inode than the one followed is another recording: everything starts over.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use allocview_sim::classes::{ClassSeries, ClassSeriesBuilder};
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::replay::{LIVE_BUCKET_WIDTH_NS, LiveReplay, Replay, ReplayOptions};
use allocview_sim::series::Bucketing;

use super::state::{AppState, BUCKETS, RunStatus};
use super::trace_data::{Opening, TraceData};
use super::update::Msg;

/// The shortest wait between two readings of a growing file.
const REFRESH: Duration = Duration::from_millis(250);
/// How many times its own duration the follower waits after a round: a quarter of a core.
const IDLE_PER_WORK: u32 = 3;
/// Policies that need the whole trace before they place anything.
const WHOLE_TRACE_POLICIES: [&str; 2] = ["oracle", "predictive"];

/// What the explorers know of a followed run (`AppState::live`).
#[derive(Clone, Debug, Default)]
pub struct Live {
    /// Whether the cursor follows the newest event (`F`); a cursor moved by hand stops it.
    pub at_head: bool,
    /// The bucketing of the series shown: they grow with the run.
    pub bucketing: Option<Bucketing>,
    /// Whether the recording has ended (the file is finished).
    pub ended: bool,
    /// Readings of the file so far, and the seconds they took with the replays.
    pub rounds: u64,
    pub work_seconds: f64,
    /// Why there is nothing to show yet (no file, or one not readable yet).
    pub waiting: Option<String>,
}

/// One round of the follower: the trace as far as it was written, and every policy's replay
/// of it (`None`: not replayed this round).
#[derive(Clone)]
pub struct Grown {
    pub data: Arc<TraceData>,
    pub replays: Vec<Option<Result<Arc<Replay>, String>>>,
    pub classes: Arc<ClassSeries>,
    pub bucketing: Bucketing,
    pub ended: bool,
    /// The file is another recording than the one shown so far.
    pub restarted: bool,
    /// The round's seconds (reading and replaying).
    pub work_seconds: f64,
}

/// The file to read: a recording in progress, or the finished output.
struct Found {
    path: PathBuf,
    /// The name the file gets when its recording ends.
    finished_name: Option<String>,
    inode: (u64, u64),
    bytes: u64,
    ended: bool,
}

/// Where the follower reads `output`'s recording: a temporary file of a `record` that is
/// still running, else the output itself. While it runs, `record` writes each process's trace
/// under its per-process name (`run.PID.avt`, renamed to `run.avt` at the end when the program
/// ran one process): of the newest `record`'s files, the follower reads the first process's
/// (the lowest pid, the program's own).
fn locate(output: &Path, followed_name: Option<&str>) -> Option<Found> {
    let name = output.file_name()?.to_str()?;
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // (writer's modification time, process pid and exec generation, the file)
    let mut candidates: Vec<(u32, std::time::SystemTime, (u32, u32), Found)> = Vec::new();
    for entry in std::fs::read_dir(&dir).ok()?.flatten() {
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        let Some(rest) = file.strip_prefix(".allocview-tmp-") else {
            continue;
        };
        // `WRITER-ATTEMPT-NAME`.
        let mut parts = rest.splitn(3, '-');
        let (Some(writer), Some(_), Some(written)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Ok(writer) = writer.parse::<u32>() else {
            continue;
        };
        let Some(process) = process_of(name, written) else {
            continue;
        };
        if !Path::new(&format!("/proc/{writer}")).exists() {
            continue;
        }
        let Ok(m) = entry.metadata() else { continue };
        let modified = m.modified().unwrap_or(std::time::UNIX_EPOCH);
        let found = Found {
            path: entry.path(),
            finished_name: Some(written.to_owned()),
            inode: (m.dev(), m.ino()),
            bytes: m.len(),
            ended: false,
        };
        candidates.push((writer, modified, process, found));
    }
    let newest_writer = candidates.iter().max_by_key(|c| c.1).map(|c| c.0);
    if let Some(writer) = newest_writer {
        return candidates
            .into_iter()
            .filter(|c| c.0 == writer)
            .min_by_key(|c| c.2)
            .map(|c| c.3);
    }
    // Finished: the output, or the per-process trace that was followed (a program that ran
    // several processes keeps them apart).
    let finished = followed_name
        .map(|n| output.with_file_name(n))
        .filter(|p| p.exists())
        .unwrap_or_else(|| output.to_path_buf());
    let m = std::fs::metadata(&finished).ok()?;
    Some(Found {
        path: finished,
        finished_name: None,
        inode: (m.dev(), m.ino()),
        bytes: m.len(),
        ended: true,
    })
}

/// Whether `written` is the output `name` or one of its per-process names (`stem.PID.ext`,
/// `stem.PID-N.ext`): the process's pid and exec generation (`(0, 0)` for the name itself).
fn process_of(name: &str, written: &str) -> Option<(u32, u32)> {
    if written == name {
        return Some((0, 0));
    }
    let (stem, ext) = match name.find('.') {
        Some(dot) if dot > 0 => name.split_at(dot),
        _ => (name, ""),
    };
    let tag = written
        .strip_prefix(stem)?
        .strip_prefix('.')?
        .strip_suffix(ext)?;
    let (pid, generation) = tag.split_once('-').unwrap_or((tag, "0"));
    Some((pid.parse().ok()?, generation.parse().ok()?))
}

/// What the follower takes of the state.
struct Follower {
    output: PathBuf,
    opening: Opening,
    specs: Vec<PolicySpec>,
    config: PolicyConfig,
    cancel: Arc<AtomicBool>,
    tx: Sender<Msg>,
}

/// The recording being followed: what is replayed of it so far.
struct Followed {
    inode: (u64, u64),
    ended: bool,
    /// Per policy: its live replay, or why it has none (`None`: replayed at the end).
    replays: Vec<Result<Option<LiveReplay>, String>>,
    classes: ClassSeriesBuilder,
    /// Whole-trace policies replayed once the recording ended.
    whole_done: bool,
}

/// Starts following `state.path` on a thread of its own, reporting [`Msg::Grown`] each time
/// the recording has grown (and [`Msg::Replayed`] for the whole-trace policies at its end).
pub fn start_follow(state: &AppState, lenient: bool, tx: &Sender<Msg>) {
    let heap = state.heap.clone();
    let mut follower = Follower {
        output: state.path.clone(),
        opening: Opening {
            lenient,
            device: state.device,
            heap: 0,
            keep_calls: false,
        },
        specs: state.policies.iter().map(|p| p.spec.clone()).collect(),
        config: state.config.clone(),
        cancel: Arc::clone(&state.cancel),
        tx: tx.clone(),
    };
    for i in 0..state.real.len() {
        let why = "the real allocators replay a finished trace: open the file once the \
                   recording has ended";
        tx.send(Msg::RealReplayed(i, Err(why.to_owned()))).ok();
    }
    std::thread::spawn(move || {
        let mut heap_id = None;
        let mut followed: Option<Followed> = None;
        let mut followed_name: Option<String> = None;
        // The file as last read (inode, bytes, ended): read again only once it changed.
        let mut last_read = None;
        while !follower.cancel.load(Ordering::Relaxed) {
            let started = Instant::now();
            let Some(found) = locate(&follower.output, followed_name.as_deref()) else {
                follower.waiting(format!(
                    "waiting for {} to be recorded",
                    follower.output.display()
                ));
                std::thread::sleep(REFRESH);
                continue;
            };
            if let Some(n) = &found.finished_name {
                followed_name = Some(n.clone());
            }
            if heap_id.is_none() {
                match crate::session::input::heap_id(&found.path, heap.as_deref()) {
                    Ok(id) => heap_id = Some(id),
                    Err(e) if found.ended => {
                        follower.tx.send(Msg::Loaded(Err(format!("{e:#}")))).ok();
                        return;
                    }
                    // The heap may not have been named yet: look again next round.
                    Err(_) => {}
                }
                follower.opening.heap = heap_id.unwrap_or(0);
            }
            let seen = Some((found.inode, found.bytes, found.ended));
            if seen != last_read {
                last_read = seen;
                follower.round(&mut followed, &found, started);
            }
            let took = started.elapsed();
            std::thread::sleep(REFRESH.max(took * IDLE_PER_WORK));
        }
    });
}

impl Follower {
    fn waiting(&self, why: String) {
        self.tx.send(Msg::LiveWaiting(why)).ok();
    }

    /// Reads the file again and replays what it added.
    fn round(&self, followed: &mut Option<Followed>, found: &Found, started: Instant) {
        let progress = Arc::new(AtomicU64::new(0));
        let window = crate::session::WindowArgs::default();
        let mut data = match TraceData::load_with(&found.path, &self.opening, &window, progress) {
            Ok(d) => d,
            // A file just created has no header yet, or is cut inside one.
            Err(e) if !found.ended => {
                self.waiting(format!("{}: not readable yet ({e})", found.path.display()));
                return;
            }
            Err(e) => {
                self.tx.send(Msg::Loaded(Err(e))).ok();
                *followed = None;
                return;
            }
        };
        data.path.clone_from(&self.output);
        if !found.ended {
            // A file being written is cut short by nature: that is no news.
            data.warnings.retain(|w| !is_cut_short(w));
        }
        let restarted = match followed {
            Some(f) => {
                f.inode != found.inode
                    || f.replays
                        .iter()
                        .any(|r| matches!(r, Ok(Some(l)) if l.events() > data.len()))
            }
            None => true,
        };
        if restarted {
            *followed = Some(self.fresh(found));
        }
        let Some(f) = followed.as_mut() else { return };
        f.ended = found.ended;
        let data = Arc::new(data);
        let Some(grown) = self.grow(f, &data, restarted, started) else {
            return;
        };
        if self.tx.send(Msg::Grown(Box::new(grown))).is_err() {
            return;
        }
        if f.ended && !f.whole_done {
            f.whole_done = true;
            self.replay_whole(f, &data);
        }
    }

    /// A recording seen for the first time.
    fn fresh(&self, found: &Found) -> Followed {
        let replays = self
            .specs
            .iter()
            .map(|spec| {
                if WHOLE_TRACE_POLICIES.contains(&spec.name) {
                    return Ok(None);
                }
                let cfg = spec.apply(&self.config).map_err(|e| e.to_string())?;
                let empty = allocview_sim::trace::OwnedTrace::new();
                let view = empty.view().map_err(|e| e.to_string())?;
                let policy = registry::build(spec.name, &cfg, &view).map_err(|e| e.to_string())?;
                Ok(Some(LiveReplay::new(
                    policy,
                    &live_options(cfg.align_bytes),
                )))
            })
            .collect();
        Followed {
            inode: found.inode,
            ended: false,
            replays,
            classes: ClassSeriesBuilder::growing(0, LIVE_BUCKET_WIDTH_NS, BUCKETS, 16_384),
            whole_done: false,
        }
    }

    /// Replays what `data` adds to `f` and makes the round's report; `None` when the frontend
    /// moved on.
    fn grow(
        &self,
        f: &mut Followed,
        data: &Arc<TraceData>,
        restarted: bool,
        started: Instant,
    ) -> Option<Grown> {
        let view = data.view();
        if f.classes.events() == 0 {
            let t0 = view.t_ns.first().copied().unwrap_or(0);
            f.classes = ClassSeriesBuilder::growing(t0, LIVE_BUCKET_WIDTH_NS, BUCKETS, 16_384);
        }
        let from = f.classes.events();
        let new = view
            .kind
            .iter()
            .zip(view.size_bytes)
            .zip(view.t_ns)
            .skip(from);
        for ((&code, &size), &t) in new {
            f.classes.push(code, size, t);
        }
        let mut replays = Vec::with_capacity(f.replays.len());
        for r in &mut f.replays {
            replays.push(match r {
                Ok(Some(live)) => {
                    if live.extend(&view, &self.cancel) {
                        return None;
                    }
                    live.snapshot().map(|s| Ok(Arc::new(s)))
                }
                Ok(None) if !f.ended => Some(Err(
                    "needs the whole trace: replays once the recording has ended".to_owned(),
                )),
                Ok(None) => None,
                Err(e) => Some(Err(e.clone())),
            });
        }
        let classes = f.classes.snapshot();
        let bucketing = classes.bucketing;
        Some(Grown {
            data: Arc::clone(data),
            replays,
            classes: Arc::new(classes),
            bucketing,
            ended: f.ended,
            restarted,
            work_seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Replays the whole-trace policies on the finished trace, with the live series' bucketing.
    fn replay_whole(&self, f: &Followed, data: &TraceData) {
        let view = data.view();
        let bucketing = f.classes.snapshot().bucketing;
        for (i, spec) in self.specs.iter().enumerate() {
            if !matches!(f.replays.get(i), Some(Ok(None))) {
                continue;
            }
            let config = data.with_predictive_features(data.policy_config(self.config.clone()));
            let result = spec
                .apply(&config)
                .and_then(|cfg| {
                    let opts = ReplayOptions {
                        buckets: bucketing.buckets,
                        ..live_options(cfg.align_bytes)
                    };
                    registry::build(spec.name, &cfg, &view).map(|p| {
                        allocview_sim::replay::replay_with_bucketing(&view, p, &opts, bucketing)
                    })
                })
                .map(Arc::new)
                .map_err(|e| e.to_string());
            if self.tx.send(Msg::Replayed(i, result)).is_err() {
                return;
            }
        }
    }
}

/// Takes a round of the follower: the longer trace, the policies' replays of it (a policy
/// replayed before keeps showing its last replay until the next arrives), the size classes;
/// the cursor stays where it was unless it follows the newest event.
pub(super) fn grown(state: &mut AppState, g: Grown) {
    let Some(live) = state.live.as_mut() else {
        return;
    };
    live.bucketing = Some(g.bucketing);
    live.ended = g.ended;
    live.rounds += 1;
    live.work_seconds += g.work_seconds;
    live.waiting = None;
    let at_head = live.at_head;
    if g.restarted {
        if let Some(w) = g.data.warnings.first() {
            state.message = Some(format!("warning: {w}"));
        }
        state.cursor = 0;
        state.heaps = state.policies.iter().map(|_| None).collect();
    }
    state.data = Some(g.data);
    state.classes = Some(g.classes);
    for (slot, r) in state.policies.iter_mut().zip(g.replays) {
        match r {
            Some(Ok(r)) => slot.status = RunStatus::Done(r),
            Some(Err(e)) => slot.status = RunStatus::Failed(e),
            None => {}
        }
    }
    let last = state.events().saturating_sub(1);
    if at_head {
        state.set_cursor(last);
        // A zoomed timeline slides with the newest event.
        let (lo, hi) = state.zoom;
        if hi < 1.0 {
            state.zoom = (1.0 - (hi - lo), 1.0);
        }
    } else {
        state.set_cursor(state.cursor.min(last));
    }
    state.refresh_sites();
    state.refresh_heaps();
}

/// `F`: the cursor goes to the newest event and follows it.
pub(super) fn follow_head(state: &mut AppState) {
    let Some(live) = state.live.as_mut() else {
        state.message = Some("F follows a run being recorded (--follow, record --live)".to_owned());
        return;
    };
    live.at_head = true;
    let last = state.events().saturating_sub(1);
    state.set_cursor(last);
}

/// Whether a load warning says the file was cut short (as a file being written is).
fn is_cut_short(warning: &str) -> bool {
    warning.contains("cut short") || warning.contains("truncated")
}

/// How the follower replays a policy: the explorer's buckets and checkpoints, no layout index
/// (it is sized by the trace's length; the heap map replays from a checkpoint instead).
fn live_options(align_bytes: u64) -> ReplayOptions {
    ReplayOptions {
        align_bytes,
        buckets: BUCKETS,
        layout_index: false,
        checkpoint_budget_bytes: super::workers::checkpoint_budget_bytes(0),
        checkpoint_min_copies: super::workers::CHECKPOINT_MIN_COPIES,
        ..ReplayOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("allocview-follow-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&d).ok();
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_recording_in_progress_is_found_before_the_finished_output() {
        let d = scratch("locate");
        let out = d.join("run.avt");
        assert!(locate(&out, None).is_none());
        std::fs::write(&out, b"old").unwrap();
        let f = locate(&out, None).unwrap();
        assert!(f.ended);
        assert_eq!(f.path, out);
        // A writer that is alive (this process) writing two processes' traces, and one that
        // is gone.
        let me = std::process::id();
        let live = d.join(format!(".allocview-tmp-{me}-0-run.4242.avt"));
        std::fs::write(&live, b"new, growing").unwrap();
        std::fs::write(
            d.join(format!(".allocview-tmp-{me}-0-run.4250-1.avt")),
            b"child",
        )
        .unwrap();
        std::fs::write(d.join(".allocview-tmp-999999999-0-run.avt"), b"dead").unwrap();
        // Another output's recording in the same folder.
        std::fs::write(d.join(format!(".allocview-tmp-{me}-0-other.avt")), b"x").unwrap();
        std::fs::write(d.join(format!(".allocview-tmp-{me}-0-runner.1.avt")), b"x").unwrap();
        let f = locate(&out, None).unwrap();
        assert!(!f.ended);
        assert_eq!(f.path, live);
        assert_eq!(f.bytes, 12);
        assert_eq!(process_of("run.avt", "run.avt"), Some((0, 0)));
        assert_eq!(process_of("run.avt", "run.12-3.avt"), Some((12, 3)));
        assert_eq!(process_of("run.avt", "runner.12.avt"), None);
        assert_eq!(process_of("trace", "trace.7"), Some((7, 0)));
        std::fs::remove_dir_all(&d).ok();
    }
}
