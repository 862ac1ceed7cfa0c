//! The whole of a trace too big to load, read once in the background while the explorers show
//! a part of it ([`Scan`]). The read keeps a resume point every few hundred thousand events
//! (where the block stream stands, and the allocations live there), so that any part opens by
//! reading from the nearest point before it rather than from the trace's first event: a part
//! at the end of a 2-billion-event trace costs the part, not the trace, and a short part
//! anywhere opens in a fraction of a second. It also gathers an overview: the highest live
//! bytes in each of [`OVERVIEW_BUCKETS`] equal stretches of the trace.
//!
//! Memory: a point holds the live allocations twice (the stream's pairing and the window's
//! carried-in set), packed as varints (`allocview_sim::stream::packed`): about 25 bytes an
//! allocation for both copies, instead of the 200 of the maps they unpack to when a part
//! opens. Past
//! [`POINTS_BUDGET_BYTES`] every other point is dropped and the spacing doubles, so the points'
//! memory stays bounded whatever the trace's length. One scan runs at a time: opening another
//! trace stops it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use allocview_loaders::binary::{BinaryEventStream, PackedStreamPoint};
use allocview_sim::stream::EventBatch;
use allocview_sim::stream::packed::PackedBefore;
use allocview_sim::stream::window::{Before, WindowSpec};

use crate::session::source::ResumePoint;

/// The read's niceness (Linux applies it to the thread alone).
const SCAN_NICE: i32 = 10;
/// Stretches of the overview.
pub const OVERVIEW_BUCKETS: usize = 1024;
/// Spacing of the resume points at first, in events, at most (a 256th of the trace when that
/// is less: points fall between blocks of 65,536 events, so a small trace has one at each).
const FIRST_SPACING_EVENTS: u64 = 1 << 18;
/// Memory the resume points may take.
const POINTS_BUDGET_BYTES: u64 = 1 << 30;
/// What a live allocation costs a point, about, in each of its two packed copies (the
/// pairing's and the carried-in set's: varints of about a dozen bytes in all), and a free slot
/// of the pairing.
const PACKED_BYTES_PER_LIVE_COPY: u64 = 14;
const PACKED_BYTES_PER_FREE_SLOT: u64 = 3;

/// A [`ResumePoint`] as the scan keeps it: packed.
struct KeptPoint {
    stream: PackedStreamPoint,
    before: PackedBefore,
}

impl KeptPoint {
    fn bytes(&self) -> u64 {
        (self.stream.bytes() + self.before.bytes()) as u64
    }

    fn unpack(&self) -> Option<ResumePoint> {
        Some(ResumePoint {
            stream: self.stream.unpack()?,
            before: self.before.unpack()?,
        })
    }
}

/// What the scan has found so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overview {
    /// Events in each stretch (the last may hold fewer).
    pub bucket_events: u64,
    /// The highest live bytes reached in each stretch read so far.
    pub max_live_bytes: Vec<u64>,
    pub scanned_events: u64,
    pub trace_events: u64,
    /// Resume points kept, and their spacing in events.
    pub points: usize,
    pub spacing_events: u64,
    pub done: bool,
    /// Why the scan stopped early (the parts still open by reading from the start).
    pub error: Option<String>,
}

#[derive(Default)]
struct Found {
    points: Vec<Arc<KeptPoint>>,
    /// Bytes the points take.
    points_bytes: u64,
    overview: Overview,
}

/// A background read of one trace (see the module docs).
pub struct Scan {
    path: PathBuf,
    /// The file's length and modification time when the read started: a file written anew
    /// since (the same path) is read anew, its old points being of another trace.
    stamp: Option<(u64, std::time::SystemTime)>,
    /// Memory the resume points may take ([`POINTS_BUDGET_BYTES`]).
    budget_bytes: u64,
    found: Mutex<Found>,
    cancel: AtomicBool,
}

/// What tells one version of a file from another.
fn stamp_of(path: &Path) -> Option<(u64, std::time::SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

/// The scan of the file at `path` as it is now, if one was started.
pub fn existing(path: &Path) -> Option<Arc<Scan>> {
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let stamp = stamp_of(&key);
    lock(&SCANS)
        .iter()
        .find(|s| s.path == key && s.stamp == stamp)
        .map(Arc::clone)
}

/// The scans started by this process (one runs at a time; stopped ones are dropped).
static SCANS: Mutex<Vec<Arc<Scan>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data: still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The scan of `path`, started (on a thread of its own) if none runs for it; any scan of
/// another file is stopped. `trace_events` sizes the overview's stretches.
pub fn scan_of(path: &Path, trace_events: u64) -> Arc<Scan> {
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let stamp = stamp_of(&key);
    let mut scans = lock(&SCANS);
    scans.retain(|s| {
        let keep = s.path == key && s.stamp == stamp;
        if !keep {
            s.cancel.store(true, Ordering::Relaxed);
        }
        keep
    });
    if let Some(s) = scans.first() {
        return Arc::clone(s);
    }
    let scan = Arc::new(Scan::new(key, stamp, trace_events, POINTS_BUDGET_BYTES));
    scans.push(Arc::clone(&scan));
    let worker = Arc::clone(&scan);
    let started = std::thread::Builder::new()
        .name("allocview-scan".to_owned())
        .spawn(move || {
            // The read only speeds up later parts: it yields the cores to the part's replays
            // and the frontend (best effort: a failure leaves it at the usual priority).
            rustix::process::setpriority_process(Some(rustix::thread::gettid()), SCAN_NICE).ok();
            // A panic in the read ends it with an error, so that nobody waits for it.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.run()))
                .unwrap_or_else(|_| Err("the read stopped on an internal error".to_owned()));
            let mut found = lock(&worker.found);
            found.overview.done = result.is_ok();
            found.overview.error = result.err();
        });
    if let Err(e) = started {
        lock(&scan.found).overview.error = Some(format!("cannot start the scan: {e}"));
    }
    scan
}

impl Scan {
    fn new(
        path: PathBuf,
        stamp: Option<(u64, std::time::SystemTime)>,
        trace_events: u64,
        budget_bytes: u64,
    ) -> Self {
        Self {
            path,
            stamp,
            budget_bytes,
            found: Mutex::new(Found {
                points: Vec::new(),
                points_bytes: 0,
                overview: Overview {
                    bucket_events: trace_events.div_ceil(OVERVIEW_BUCKETS as u64).max(1),
                    trace_events,
                    spacing_events: (trace_events / 256).clamp(1, FIRST_SPACING_EVENTS),
                    ..Overview::default()
                },
            }),
            cancel: AtomicBool::new(false),
        }
    }

    /// What the scan has found so far.
    pub fn overview(&self) -> Overview {
        lock(&self.found).overview.clone()
    }

    /// Whether the read goes on (the frontends redraw for its progress).
    pub fn running(&self) -> bool {
        let found = lock(&self.found);
        !found.overview.done && found.overview.error.is_none()
    }

    /// The latest resume point a read of window `spec` can start from, if any, unpacked.
    pub fn point_for(&self, spec: &WindowSpec) -> Option<ResumePoint> {
        let kept = lock(&self.found)
            .points
            .iter()
            .rev()
            .find(|p| p.before.precedes(spec))
            .map(Arc::clone)?;
        // Unpacked outside the lock: the scan goes on meanwhile.
        kept.unpack()
    }

    /// Reads the whole trace, keeping points and the overview up to date.
    fn run(&self) -> Result<(), String> {
        let mut stream = BinaryEventStream::open(&self.path).map_err(|e| e.to_string())?;
        let mut before = Before::default();
        let mut batch = EventBatch::default();
        let bucket_events = lock(&self.found).overview.bucket_events;
        let mut next_point = 0u64;
        // Fixed: the stretches are sized from the index's count, which a damaged or hostile
        // file may understate; events past the last stretch count in it.
        let mut bucket_max = vec![0u64; OVERVIEW_BUCKETS];
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err("stopped: another trace was opened".to_owned());
            }
            let at = before.events() as u64;
            if at >= next_point {
                next_point = self.keep_point(&stream, &before, at);
            }
            if !stream.next_events(&mut batch).map_err(|e| e.to_string())? {
                return Ok(());
            }
            for j in 0..batch.len() {
                let bucket = usize::try_from(before.events() as u64 / bucket_events)
                    .unwrap_or(usize::MAX)
                    .min(OVERVIEW_BUCKETS - 1);
                before.note_event(&batch, j);
                if let Some(m) = bucket_max.get_mut(bucket) {
                    *m = (*m).max(before.live_bytes());
                }
            }
            let mut found = lock(&self.found);
            found.overview.scanned_events = before.events() as u64;
            found.overview.max_live_bytes.clone_from(&bucket_max);
        }
    }

    /// Keeps a resume point at event `at`, thinning the points past the budget; returns where
    /// the next one falls.
    fn keep_point(&self, stream: &BinaryEventStream, before: &Before, at: u64) -> u64 {
        // A live set that would take half the budget on its own is not packed at all (parts
        // then read from an earlier point), and the next try is further on.
        let live = (stream.point_live_allocations() + before.live_allocations()) as u64;
        let estimate = live
            .saturating_mul(PACKED_BYTES_PER_LIVE_COPY)
            .saturating_add(
                (stream.point_free_slots() as u64).saturating_mul(PACKED_BYTES_PER_FREE_SLOT),
            );
        if estimate > self.budget_bytes / 2 {
            let spacing = lock(&self.found).overview.spacing_events;
            return (at / spacing + 1) * spacing;
        }
        let point = Arc::new(KeptPoint {
            stream: stream.packed_point(),
            before: before.pack(),
        });
        let mut found = lock(&self.found);
        found.points_bytes += point.bytes();
        found.points.push(point);
        let mut spacing = found.overview.spacing_events;
        while found.points.len() > 1 && found.points_bytes > self.budget_bytes {
            spacing = spacing.saturating_mul(2);
            let kept: Vec<Arc<KeptPoint>> = found.points.iter().step_by(2).cloned().collect();
            found.points = kept;
            found.points_bytes = found.points.iter().map(|p| p.bytes()).sum();
        }
        found.overview.spacing_events = spacing;
        found.overview.points = found.points.len();
        // Points fall on block boundaries: the next is the first boundary past the spacing.
        (at / spacing + 1) * spacing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sample-traces/python_json.avt")
    }

    /// An index that understates the trace (here: 10 events for 7,486) does not grow the
    /// overview past its stretches: the events past them count in the last one.
    #[test]
    fn an_understated_event_count_keeps_the_overview_bounded() {
        let scan = Scan::new(sample(), None, 10, POINTS_BUDGET_BYTES);
        scan.run().unwrap();
        let o = scan.overview();
        assert_eq!(o.scanned_events, 7_486);
        assert_eq!(o.max_live_bytes.len(), OVERVIEW_BUCKETS);
        let peak = o.max_live_bytes.iter().max().copied().unwrap();
        assert_eq!(o.max_live_bytes.last().copied(), Some(peak));
    }

    /// A read keeps a point at the start and one after the block, packed to about a dozen
    /// bytes an allocation in each of its two copies; with a budget whose half the point at
    /// the end would exceed, by the estimate the scan makes before packing, it packs no live
    /// set and keeps the start only (thinning alone would keep both), and reads on to the end
    /// all the same.
    #[test]
    fn a_live_set_too_large_for_the_budget_is_never_copied() {
        let events = 7_486;
        let roomy = Scan::new(sample(), None, events, POINTS_BUDGET_BYTES);
        roomy.run().unwrap();
        let o = roomy.overview();
        assert_eq!((o.points, o.scanned_events), (2, events));
        let last = roomy
            .point_for(&WindowSpec {
                first_event: events as usize,
                ..WindowSpec::default()
            })
            .unwrap();
        let live = last.before.live_allocations() as u64;
        assert!(live > 10, "{live}");
        assert_eq!(last.stream.live_allocations() as u64, live);
        // What the live set adds to a point: the point at the end against the one at the
        // start (nothing live; the same counts and threads beside).
        let (first, last_bytes) = {
            let found = lock(&roomy.found);
            (found.points[0].bytes(), found.points[1].bytes())
        };
        let added = last_bytes - first;
        let before_bytes = {
            let found = lock(&roomy.found);
            (found.points[1].before.bytes() - found.points[0].before.bytes()) as u64
        };
        // The carried-in copy in id order: 8 bytes an allocation here; the pairing's by
        // address, ids as they are, with the free slots: 2 bytes each here.
        let free = last.stream.free_slots() as u64;
        assert!(free > 100, "{free}");
        assert!(before_bytes <= live * 10, "{before_bytes} for {live}");
        let pairing_bytes = added - before_bytes;
        assert!(
            pairing_bytes <= live * 12 + free * 2 + 64,
            "{pairing_bytes} for {live} live and {free} free slots"
        );
        // Below the estimate of the point at the end (2 x live x 14 and its free slots, over
        // half the budget), above the one at the start (nothing live).
        let tight = Scan::new(
            sample(),
            None,
            events,
            3 * live * PACKED_BYTES_PER_LIVE_COPY,
        );
        tight.run().unwrap();
        let o = tight.overview();
        assert_eq!((o.points, o.scanned_events), (1, events));
        let first = tight.point_for(&WindowSpec::default()).unwrap();
        assert_eq!(first.before.events(), 0);
    }
}
