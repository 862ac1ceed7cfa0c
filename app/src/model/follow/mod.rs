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
//! follower waits at least nine times as long as its last round took before the next, so a
//! longer run is shown less often rather than at a higher cost, and the explorer runs at a
//! lower priority than the program ([`yield_to_the_program`]). A file identified by another
//! inode than the one followed is another recording: everything starts over.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use allocview_sim::classes::ClassSeriesBuilder;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry;
use allocview_sim::policy::spec::PolicySpec;
use allocview_sim::replay::{LIVE_BUCKET_WIDTH_NS, LiveReplay, ReplayOptions};

use super::live::{Follow, Grown, Wake};
use super::state::{AppState, BUCKETS};
use super::trace_data::{Opening, TraceData};
use super::update::Msg;

mod locate;
use locate::{Chosen, Found, locate};

/// The shortest wait between two readings of a growing file.
const REFRESH: Duration = Duration::from_millis(250);
/// How many times its own duration the follower waits after a round: a tenth of its time at
/// work (at a third, the C++ workload of `scripts/bench-live.sh` ran 10 to 20% slower watched
/// on 2 cores that `record` keeps busy).
const IDLE_PER_WORK: u32 = 9;
/// Policies that need the whole trace before they place anything.
const WHOLE_TRACE_POLICIES: [&str; 2] = ["oracle", "predictive"];

/// What the follower takes of the state.
struct Follower {
    output: PathBuf,
    /// `--heap`: the heap to show, by name (resolved in each recording).
    heap: Option<String>,
    lenient: bool,
    device: Option<allocview_loaders::kineto::DeviceChoice>,
    specs: Vec<PolicySpec>,
    config: PolicyConfig,
    /// Where the recording comes from (`record --live`: its time and pid).
    from: Follow,
    cancel: Arc<AtomicBool>,
    tx: Sender<Msg>,
}

/// The recording being followed: what is replayed of it so far.
struct Followed {
    inode: (u64, u64),
    ended: bool,
    /// The heap shown, resolved in this recording.
    heap: u32,
    /// Per policy: its live replay, or why it has none (`None`: replayed at the end).
    replays: Vec<Result<Option<LiveReplay>, String>>,
    classes: ClassSeriesBuilder,
    /// Whole-trace policies replayed once the recording ended.
    whole_done: bool,
}

/// Whether the follower goes on after a round.
#[derive(PartialEq, Eq)]
enum Next {
    Go,
    Stop,
}

/// Starts following `state.path` on a thread of its own, reporting [`Msg::Grown`] each time
/// the recording has grown (and [`Msg::Replayed`] for the whole-trace policies at its end).
pub fn start_follow(state: &AppState, lenient: bool, tx: &Sender<Msg>) {
    let follower = Follower {
        output: state.path.clone(),
        heap: state.heap.clone(),
        lenient,
        device: state.device,
        specs: state.policies.iter().map(|p| p.spec.clone()).collect(),
        config: state.config.clone(),
        from: state
            .live
            .as_ref()
            .map(|l| l.from.clone())
            .unwrap_or_default(),
        cancel: Arc::clone(&state.cancel),
        tx: tx.clone(),
    };
    for i in 0..state.real.len() {
        let why = "the real allocators replay a finished trace: open the file once the \
                   recording has ended";
        follower.send(Msg::RealReplayed(i, Err(why.to_owned())));
    }
    std::thread::spawn(move || follower.run());
}

impl Follower {
    /// Looks for the recording and reads it again each time it changed, until the frontend
    /// moves on.
    fn run(self) {
        let mut followed: Option<Followed> = None;
        let mut chosen: Option<Chosen> = None;
        // The file as last read (inode, bytes, ended): read again only once it changed.
        let mut last_read = None;
        while !self.cancel.load(Ordering::Relaxed) {
            let started = Instant::now();
            let Some(found) = locate(&self.output, chosen.as_ref(), self.from.since) else {
                self.waiting(self.why_nothing_yet());
                std::thread::sleep(REFRESH);
                continue;
            };
            if found.chosen.is_some() {
                chosen.clone_from(&found.chosen);
            }
            let seen = Some((found.inode, found.bytes, found.ended));
            if seen != last_read {
                last_read = seen;
                if self.round(&mut followed, &found) == Next::Stop {
                    return;
                }
            }
            let took = started.elapsed();
            std::thread::sleep(REFRESH.max(took * IDLE_PER_WORK));
        }
    }

    /// Sends `msg` to the frontend and wakes it; false once the frontend is gone.
    fn send(&self, msg: Msg) -> bool {
        let sent = self.tx.send(msg).is_ok();
        if let Some(Wake(wake)) = &self.from.wake {
            wake();
        }
        sent
    }

    fn waiting(&self, why: String) {
        self.send(Msg::LiveWaiting(why));
    }

    /// Why there is no file to show: not recorded yet, or the `record` this command started
    /// has ended without writing one.
    fn why_nothing_yet(&self) -> String {
        match (self.from.recorder_pid, &self.from.log) {
            (Some(pid), Some(log)) if !crate::procfs::running(pid) => format!(
                "the recording ended without writing {}: see {}",
                self.output.display(),
                log.display()
            ),
            _ => format!("waiting for {} to be recorded", self.output.display()),
        }
    }

    /// Reads the file again and replays what it added.
    fn round(&self, followed: &mut Option<Followed>, found: &Found) -> Next {
        let same = followed.as_ref().filter(|f| f.inode == found.inode);
        // The heap asked for is looked up in each recording, and may be named only once the
        // program has made it.
        let heap = match same {
            Some(f) => f.heap,
            None => match crate::session::input::heap_id(&found.path, self.heap.as_deref()) {
                Ok(id) => id,
                Err(e) => {
                    self.waiting(format!("{}: {e:#}", found.path.display()));
                    return Next::Go;
                }
            },
        };
        let opening = Opening {
            lenient: self.lenient,
            device: self.device,
            heap,
            keep_calls: false,
        };
        let progress = Arc::new(AtomicU64::new(0));
        let window = crate::session::WindowArgs::default();
        let mut data = match TraceData::load_with(&found.path, &opening, &window, progress) {
            Ok(d) => d,
            // A file just created has no header yet, or is cut inside one; a finished one
            // that does not load may be replaced by a new recording.
            Err(e) => {
                self.waiting(format!("{}: not readable ({e})", found.path.display()));
                return Next::Go;
            }
        };
        if data.part.is_some() {
            // Past what the explorers load whole: only its first part would come back.
            self.waiting(format!(
                "the run has grown past what the explorer holds in memory: the view stops \
                 here; open {} once the recording has ended (it opens a part at a time)",
                self.output.display()
            ));
            return Next::Stop;
        }
        data.path.clone_from(&self.output);
        if !found.ended {
            // A file being written is cut short by nature: that is no news.
            data.warnings.retain(|w| !is_cut_short(w));
        }
        let shrank = same.is_some_and(|f| {
            f.classes.events() > data.len()
                || f.replays
                    .iter()
                    .any(|r| matches!(r, Ok(Some(l)) if l.events() > data.len()))
        });
        let restarted = same.is_none() || shrank;
        if restarted {
            *followed = Some(self.fresh(found, heap));
        }
        let Some(f) = followed.as_mut() else {
            return Next::Go;
        };
        f.ended = found.ended;
        let data = Arc::new(data);
        let Some(grown) = self.grow(f, &data, restarted) else {
            return Next::Stop;
        };
        if !self.send(Msg::Grown(Box::new(grown))) {
            return Next::Stop;
        }
        if f.ended && !f.whole_done {
            f.whole_done = true;
            self.replay_whole(f, &data);
        }
        Next::Go
    }

    /// A recording seen for the first time.
    fn fresh(&self, found: &Found, heap: u32) -> Followed {
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
            heap,
            replays,
            classes: ClassSeriesBuilder::growing(0, LIVE_BUCKET_WIDTH_NS, BUCKETS, 16_384),
            whole_done: false,
        }
    }

    /// Replays what `data` adds to `f` and makes the round's report; `None` when the frontend
    /// moved on.
    fn grow(&self, f: &mut Followed, data: &Arc<TraceData>, restarted: bool) -> Option<Grown> {
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
        })
    }

    /// Replays the whole-trace policies on the finished trace, with the live series' bucketing.
    fn replay_whole(&self, f: &Followed, data: &TraceData) {
        let view = data.view();
        let bucketing = f.classes.snapshot().bucketing;
        let config = data.with_predictive_features(data.policy_config(self.config.clone()));
        for (i, spec) in self.specs.iter().enumerate() {
            if !matches!(f.replays.get(i), Some(Ok(None))) {
                continue;
            }
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
            if !self.send(Msg::Replayed(i, result)) {
                return;
            }
        }
    }
}

/// Whether a load warning says the file was cut short (as a file being written is).
fn is_cut_short(warning: &str) -> bool {
    warning.contains("cut short") || warning.contains("truncated")
}

/// How the follower replays a policy: as the explorer does, without the layout index (it is
/// sized by the trace's length; the heap map replays from a checkpoint instead).
fn live_options(align_bytes: u64) -> ReplayOptions {
    ReplayOptions {
        layout_index: false,
        ..super::options::explorer_options(align_bytes, 0)
    }
}
