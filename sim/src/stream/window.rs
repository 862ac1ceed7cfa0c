//! A window of a streamed trace: the events `start..end` after the allocations live at
//! `start` ("carried in"), as the loaders cut a window of a loaded trace
//! (`allocview_loaders::window`): the carried-in allocations first, in allocation order, at
//! the window's first event's time, then the window's events; allocation ids renumbered
//! densely in that order. The events before the window are read (their allocations and frees
//! decide what is carried in) but not handed out; memory holds the live allocations only.
//!
//! A window is resolved first ([`resolve`]: one read of the trace up to the window's end),
//! because a replay needs the window's time span before its first event, and a window by time
//! needs the events' times to find where it starts and ends.

use crate::trace::{EventKind, NO_ALLOC_ID};

use super::{EventBatch, EventSource};

/// What a window asks for: events `first_event..end_event` (all when `None`), narrowed to
/// the times `from_ns..to_ns` (each optional, absolute as the trace's times are).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowSpec {
    pub first_event: usize,
    pub end_event: Option<usize>,
    pub from_ns: Option<i64>,
    pub to_ns: Option<i64>,
}

/// A window found in a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedWindow {
    /// First event of the window, in the whole trace's numbering.
    pub start: usize,
    /// One past its last event.
    pub end: usize,
    /// Times of its first and last events.
    pub t_first_ns: i64,
    pub t_last_ns: i64,
    /// Allocations live at its start.
    pub carried_in: u64,
}

/// What [`resolve`] saw when the window is empty: the events read and the times of the first
/// and the last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmptyWindow {
    pub events: usize,
    pub t_first_ns: Option<i64>,
    pub t_last_ns: Option<i64>,
}

/// Finds `spec`'s window in the events of `source` (times never go back in a loaded or
/// streamed trace, so "the first event at or after a time" is where a time bound falls),
/// reading up to the window's end.
///
/// # Errors
/// `Ok(Err(..))` when the window holds no event; `Err` when the source fails.
pub fn resolve(
    source: &mut dyn EventSource,
    spec: &WindowSpec,
) -> Result<Result<ResolvedWindow, EmptyWindow>, String> {
    let mut batch = EventBatch::default();
    let mut i = 0usize;
    let (mut start, mut t_first, mut t_last) = (None, None, None);
    let mut t_seen = (None, None);
    let (mut live, mut carried_in) = (0u64, 0u64);
    'read: while source.next_batch(&mut batch)? {
        for ((&t, &kind), &id) in batch.t_ns.iter().zip(&batch.kind).zip(&batch.alloc_id) {
            if spec.end_event.is_some_and(|e| i >= e) || spec.to_ns.is_some_and(|to| t >= to) {
                break 'read;
            }
            t_seen = (t_seen.0.or(Some(t)), Some(t));
            if start.is_none() && i >= spec.first_event && spec.from_ns.is_none_or(|f| t >= f) {
                start = Some(i);
                t_first = Some(t);
                carried_in = live;
            }
            if id != NO_ALLOC_ID && kind == EventKind::Alloc as u8 {
                live += 1;
            } else if id != NO_ALLOC_ID && kind == EventKind::Free as u8 {
                live = live.saturating_sub(1);
            }
            if start.is_some() {
                t_last = Some(t);
            }
            i += 1;
        }
    }
    match (start, t_first, t_last) {
        (Some(start), Some(t_first_ns), Some(t_last_ns)) => Ok(Ok(ResolvedWindow {
            start,
            end: i,
            t_first_ns,
            t_last_ns,
            carried_in,
        })),
        _ => Ok(Err(EmptyWindow {
            events: i,
            t_first_ns: t_seen.0,
            t_last_ns: t_seen.1,
        })),
    }
}

/// Where a window lies: found beforehand ([`resolve`]: a replay needs the window's time span
/// before its first event), or found as the events come (one read fewer, for a window that is
/// only gathered into tables).
enum Bounds {
    Resolved(ResolvedWindow),
    AsTheyCome {
        spec: WindowSpec,
        /// The first event of the window and its time, once met.
        start: Option<(usize, i64)>,
        /// The last event handed out and its time.
        last: Option<(usize, i64)>,
        ended: bool,
        /// Events read and the times of the first and the last, for an empty window's error.
        seen: (usize, Option<i64>, Option<i64>),
        carried_in: u64,
    },
}

/// Where an event stands with respect to the window.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Before,
    In,
    After,
}

impl Bounds {
    fn place(&mut self, i: usize, t: i64) -> Place {
        match self {
            Self::Resolved(w) if i < w.start => Place::Before,
            Self::Resolved(w) if i < w.end => Place::In,
            Self::Resolved(_) => Place::After,
            Self::AsTheyCome {
                spec,
                start,
                last,
                ended,
                seen,
                ..
            } => {
                let past_end =
                    spec.end_event.is_some_and(|e| i >= e) || spec.to_ns.is_some_and(|to| t >= to);
                if *ended || past_end {
                    *ended = true;
                    return Place::After;
                }
                *seen = (i + 1, seen.1.or(Some(t)), Some(t));
                if start.is_none() && i >= spec.first_event && spec.from_ns.is_none_or(|f| t >= f) {
                    *start = Some((i, t));
                }
                if start.is_some() {
                    *last = Some((i, t));
                    Place::In
                } else {
                    Place::Before
                }
            }
        }
    }

    fn t_first_ns(&self) -> i64 {
        match self {
            Self::Resolved(w) => w.t_first_ns,
            Self::AsTheyCome { start, .. } => start.map_or(0, |s| s.1),
        }
    }

    fn ended(&self) -> bool {
        match self {
            Self::Resolved(_) => false,
            Self::AsTheyCome { ended, .. } => *ended,
        }
    }
}

/// An allocation live before the window: its id in the trace, bytes, thread and slot.
#[derive(Clone, Copy)]
pub(super) struct Live {
    pub(super) size_bytes: u64,
    pub(super) thread: u16,
    pub(super) slot: u32,
    pub(super) addr: u64,
}

/// What a window keeps of the events before it: how many were read, the times of the first
/// and the last, and the allocations live after them (by their id in the trace). Taken after
/// any prefix of a trace (a whole-trace scan keeps one every few hundred thousand events), it lets a
/// window that starts later be read from there ([`WindowSource::resume`]) instead of from the
/// trace's first event: what is carried in is the same.
#[derive(Clone, Default)]
pub struct Before {
    pub(super) at: usize,
    pub(super) t_first_ns: Option<i64>,
    pub(super) t_last_ns: Option<i64>,
    pub(super) live: std::collections::BTreeMap<u32, Live>,
    pub(super) live_bytes: u64,
}

impl Before {
    /// Events read.
    #[must_use]
    pub fn events(&self) -> usize {
        self.at
    }

    /// The time of the last event read (`None` before the first).
    #[must_use]
    pub fn t_last_ns(&self) -> Option<i64> {
        self.t_last_ns
    }

    /// Allocations live after the events read.
    #[must_use]
    pub fn live_allocations(&self) -> usize {
        self.live.len()
    }

    /// Bytes of those allocations.
    #[must_use]
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Whether a window `spec` starts at or after the events read, so that it can be read
    /// from here: its first event's number is not below them, or (for a window from a time)
    /// every event read is earlier than that time (times never go back).
    #[must_use]
    pub fn precedes(&self, spec: &WindowSpec) -> bool {
        precedes(self.at, self.t_last_ns, spec)
    }

    /// Notes the events of `batch`, the next ones of the trace.
    pub fn note_batch(&mut self, batch: &EventBatch) {
        for j in 0..batch.len() {
            self.note_event(batch, j);
        }
    }

    /// Notes event `j` of `batch` (the next event of the trace): its time and what it does
    /// to the live set.
    pub fn note_event(&mut self, batch: &EventBatch, j: usize) {
        self.at += 1;
        let Some(e) = batch.row(j) else {
            return;
        };
        self.t_first_ns.get_or_insert(e.t_ns);
        self.t_last_ns = Some(e.t_ns);
        if e.alloc_id == NO_ALLOC_ID {
            return;
        }
        if e.kind == EventKind::Alloc as u8 {
            let old = self.live.insert(
                e.alloc_id,
                Live {
                    size_bytes: e.size_bytes,
                    thread: e.thread,
                    slot: e.slot,
                    addr: e.addr,
                },
            );
            self.live_bytes = self
                .live_bytes
                .saturating_add(e.size_bytes)
                .saturating_sub(old.map_or(0, |o| o.size_bytes));
        } else if e.kind == EventKind::Free as u8
            && let Some(old) = self.live.remove(&e.alloc_id)
        {
            self.live_bytes = self.live_bytes.saturating_sub(old.size_bytes);
        }
    }
}

/// Whether window `spec` starts at or after `at` events read, the last at `t_last_ns`
/// ([`Before::precedes`]).
pub(super) fn precedes(at: usize, t_last_ns: Option<i64>, spec: &WindowSpec) -> bool {
    spec.first_event >= at
        || spec
            .from_ns
            .is_some_and(|from| t_last_ns.is_none_or(|t| t < from))
}

/// The events of a resolved window of `S` (see the module docs).
pub struct WindowSource<S> {
    inner: S,
    bounds: Bounds,
    /// The events read before the window (then the trace's events read so far).
    before: Before,
    /// In the window: the window's id of each live allocation, by its id in the trace.
    renamed: std::collections::HashMap<u32, u32>,
    next_id: u32,
    carried: bool,
    batch: EventBatch,
    figures: WindowFigures,
}

/// What the window's events add up to, as they are handed out (what the loader counts of a
/// whole trace as it reads it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WindowFigures {
    /// Events handed out, the carried-in allocations included.
    pub events: u64,
    pub events_per_thread: Vec<u64>,
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    /// The first event (in the window's numbering) at which live bytes peak.
    pub peak_live_event: u64,
    /// Events by kind code.
    pub kinds: [u64; 8],
}

impl WindowFigures {
    fn add(&mut self, kind: u8, size_bytes: u64, id: u32, thread: u16) {
        if let Some(n) = self.kinds.get_mut(usize::from(kind)) {
            *n += 1;
        }
        let t = usize::from(thread);
        if t >= self.events_per_thread.len() {
            self.events_per_thread.resize(t + 1, 0);
        }
        if let Some(n) = self.events_per_thread.get_mut(t) {
            *n += 1;
        }
        if id != NO_ALLOC_ID {
            if kind == EventKind::Alloc as u8 {
                self.live_bytes = self.live_bytes.saturating_add(size_bytes);
            } else if kind == EventKind::Free as u8 {
                self.live_bytes = self.live_bytes.saturating_sub(size_bytes);
            }
        }
        if self.live_bytes > self.peak_live_bytes {
            self.peak_live_bytes = self.live_bytes;
            self.peak_live_event = self.events;
        }
        self.events += 1;
    }
}

impl<S: EventSource> WindowSource<S> {
    /// The window `window` of `inner`, read from its first event.
    pub fn new(inner: S, window: ResolvedWindow) -> Self {
        Self::with_bounds(inner, Bounds::Resolved(window))
    }

    /// The window `spec` of `inner`, found as the events come: one read instead of two, for
    /// events gathered into tables. Its time span is not known before it is read
    /// ([`EventSource::time_span`] gives the first and last times met so far), so a replay
    /// takes a window found by [`resolve`] ([`Self::new`]).
    pub fn as_they_come(inner: S, spec: WindowSpec) -> Self {
        Self::after(inner, spec, Before::default())
    }

    /// The window found, once read (`Err`: what was read, for a window that holds no event).
    ///
    /// # Errors
    /// When the window holds no event.
    pub fn found(&self) -> Result<ResolvedWindow, EmptyWindow> {
        match &self.bounds {
            Bounds::Resolved(w) => Ok(*w),
            Bounds::AsTheyCome {
                start: Some((start, t_first_ns)),
                last: Some((last, t_last_ns)),
                carried_in,
                ..
            } => Ok(ResolvedWindow {
                start: *start,
                end: last + 1,
                t_first_ns: *t_first_ns,
                t_last_ns: *t_last_ns,
                carried_in: *carried_in,
            }),
            Bounds::AsTheyCome { seen, .. } => Err(EmptyWindow {
                events: seen.0,
                t_first_ns: seen.1,
                t_last_ns: seen.2,
            }),
        }
    }

    /// The window `spec` of `inner`, found as the events come, where `inner` is positioned
    /// after the events `before` noted (a stream resumed where they end) and the window
    /// starts after them ([`Before::precedes`]; `None` when it does not).
    pub fn resume(inner: S, spec: WindowSpec, before: Before) -> Option<Self> {
        before
            .precedes(&spec)
            .then(|| Self::after(inner, spec, before))
    }

    /// The window `spec`, found as the events come after those `before` noted.
    fn after(inner: S, spec: WindowSpec, before: Before) -> Self {
        let seen = (before.at, before.t_first_ns, before.t_last_ns);
        let mut w = Self::with_bounds(
            inner,
            Bounds::AsTheyCome {
                spec,
                start: None,
                last: None,
                ended: false,
                seen,
                carried_in: 0,
            },
        );
        w.before = before;
        w
    }

    fn with_bounds(inner: S, bounds: Bounds) -> Self {
        Self {
            inner,
            bounds,
            before: Before::default(),
            renamed: std::collections::HashMap::new(),
            next_id: 0,
            carried: false,
            batch: EventBatch::default(),
            figures: WindowFigures::default(),
        }
    }

    /// What the events handed out so far add up to.
    pub fn figures(&self) -> &WindowFigures {
        &self.figures
    }

    /// The source within.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Hands the allocations live at the window's start to `out`, renumbered.
    fn carry_in(&mut self, out: &mut EventBatch) {
        let t_first_ns = self.bounds.t_first_ns();
        if let Bounds::AsTheyCome { carried_in, .. } = &mut self.bounds {
            *carried_in = self.before.live.len() as u64;
        }
        self.before.live_bytes = 0;
        for (id, l) in std::mem::take(&mut self.before.live) {
            self.renamed.insert(id, self.next_id);
            out.push(
                t_first_ns,
                EventKind::Alloc as u8,
                l.size_bytes,
                self.next_id,
                l.slot,
                l.thread,
                l.addr,
            );
            self.figures
                .add(EventKind::Alloc as u8, l.size_bytes, self.next_id, l.thread);
            self.next_id += 1;
        }
        self.carried = true;
    }

    /// Event `j` of the inner batch, in the window.
    fn pass_on(&mut self, j: usize, out: &mut EventBatch) {
        let Some(e) = self.batch.row(j) else {
            return;
        };
        let new_id = if e.alloc_id == NO_ALLOC_ID {
            NO_ALLOC_ID
        } else if e.kind == EventKind::Alloc as u8 {
            self.renamed.insert(e.alloc_id, self.next_id);
            self.next_id += 1;
            self.next_id - 1
        } else if e.kind == EventKind::Free as u8 {
            self.renamed.remove(&e.alloc_id).unwrap_or(NO_ALLOC_ID)
        } else {
            self.renamed
                .get(&e.alloc_id)
                .copied()
                .unwrap_or(NO_ALLOC_ID)
        };
        out.push(
            e.t_ns,
            e.kind,
            e.size_bytes,
            new_id,
            e.slot,
            e.thread,
            e.addr,
        );
        self.figures.add(e.kind, e.size_bytes, new_id, e.thread);
    }
}

impl<S: EventSource> EventSource for WindowSource<S> {
    fn time_span(&self) -> (i64, i64) {
        match &self.bounds {
            Bounds::Resolved(w) => (w.t_first_ns, w.t_last_ns),
            Bounds::AsTheyCome { start, last, .. } => {
                (start.map_or(0, |s| s.1), last.map_or(0, |l| l.1))
            }
        }
    }

    fn next_batch(&mut self, out: &mut EventBatch) -> Result<bool, String> {
        out.clear();
        while out.is_empty() {
            if self.bounds.ended() {
                return Ok(false);
            }
            if let Bounds::Resolved(w) = &self.bounds
                && self.before.at >= w.end
            {
                return Ok(false);
            }
            let mut batch = std::mem::take(&mut self.batch);
            let more = self.inner.next_batch(&mut batch)?;
            self.batch = batch;
            if !more {
                return Ok(false);
            }
            for j in 0..self.batch.len() {
                let t = self.batch.t_ns.get(j).copied().unwrap_or(0);
                match self.bounds.place(self.before.at, t) {
                    Place::Before => self.before.note_event(&self.batch, j),
                    Place::In => {
                        if !self.carried {
                            self.carry_in(out);
                        }
                        self.pass_on(j, out);
                        self.before.at += 1;
                    }
                    Place::After => break,
                }
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events handed out a few at a time: allocations of ids in order, each freed a while
    /// later, slot = id, at times 10 ns apart.
    struct Source {
        events: Vec<(i64, u8, u64, u32)>,
        at: usize,
    }

    impl Source {
        fn new() -> Self {
            let mut events = Vec::new();
            let mut live: Vec<u32> = Vec::new();
            let mut id = 0u32;
            for i in 0..400i64 {
                if i % 3 == 2 && !live.is_empty() {
                    let victim = live.remove((i as usize * 7) % live.len());
                    events.push((i * 10, EventKind::Free as u8, 8, victim));
                } else {
                    events.push((i * 10, EventKind::Alloc as u8, 8 + i as u64, id));
                    live.push(id);
                    id += 1;
                }
            }
            Self { events, at: 0 }
        }
    }

    impl EventSource for Source {
        fn time_span(&self) -> (i64, i64) {
            (0, 3990)
        }

        fn next_batch(&mut self, out: &mut EventBatch) -> Result<bool, String> {
            out.clear();
            for &(t, kind, size, id) in self.events.iter().skip(self.at).take(7) {
                out.push(t, kind, size, id, id, 0, u64::from(id) * 64);
            }
            self.at += out.len();
            Ok(!out.is_empty())
        }
    }

    fn all(s: &mut impl EventSource) -> EventBatch {
        let (mut all, mut b) = (EventBatch::default(), EventBatch::default());
        while s.next_batch(&mut b).unwrap() {
            for e in (0..b.len()).filter_map(|k| b.row(k)) {
                all.push_row(&e);
            }
        }
        all
    }

    /// Windows by events, by time, and near the end of [`Source`]'s 400 events.
    fn three_windows() -> [WindowSpec; 3] {
        [
            WindowSpec {
                first_event: 50,
                end_event: Some(120),
                ..WindowSpec::default()
            },
            WindowSpec {
                from_ns: Some(1001),
                to_ns: Some(2500),
                ..WindowSpec::default()
            },
            WindowSpec {
                first_event: 390,
                ..WindowSpec::default()
            },
        ]
    }

    /// Found as the events come, a window hands out what the window found beforehand does,
    /// and finds the same bounds.
    #[test]
    fn a_window_found_as_the_events_come_is_the_resolved_one() {
        for spec in three_windows() {
            let w = resolve(&mut Source::new(), &spec).unwrap().unwrap();
            let resolved = all(&mut WindowSource::new(Source::new(), w));
            let mut lazy = WindowSource::as_they_come(Source::new(), spec);
            let got = all(&mut lazy);
            assert_eq!(got, resolved, "{spec:?}");
            assert_eq!(lazy.found(), Ok(w), "{spec:?}");
            assert!(
                w.carried_in > 0
                    && resolved.len() as u64 == w.carried_in + (w.end - w.start) as u64
            );
            assert_eq!(lazy.time_span(), (w.t_first_ns, w.t_last_ns));
        }
        let none = WindowSpec {
            first_event: 1000,
            ..WindowSpec::default()
        };
        let mut lazy = WindowSource::as_they_come(Source::new(), none);
        assert!(!lazy.next_batch(&mut EventBatch::default()).unwrap());
        assert_eq!(
            lazy.found(),
            Err(EmptyWindow {
                events: 400,
                t_first_ns: Some(0),
                t_last_ns: Some(3990)
            })
        );
    }

    /// A window read from a `Before` taken after some of the trace's batches (the source
    /// resumed there) hands out what the window read from the first event does, finds the
    /// same bounds, and says the same of an empty window; a window that starts inside the
    /// noted events is refused.
    #[test]
    fn a_window_resumed_after_noted_events_is_the_one_read_from_the_start() {
        let mut specs = three_windows().to_vec();
        // And one past the trace's end: empty.
        specs.push(WindowSpec {
            first_event: 1000,
            ..WindowSpec::default()
        });
        for spec in specs {
            let mut whole = WindowSource::as_they_come(Source::new(), spec);
            let expected = all(&mut whole);
            // Resume points after 0, 3, 6 and 7 batches of 7 events (35 and 49 events in).
            for batches in [0usize, 3, 6, 7] {
                let mut src = Source::new();
                let mut before = Before::default();
                let mut b = EventBatch::default();
                for _ in 0..batches {
                    assert!(src.next_batch(&mut b).unwrap());
                    before.note_batch(&b);
                }
                assert_eq!(before.events(), batches * 7);
                let live_bytes: u64 = {
                    let mut w = WindowSource::as_they_come(
                        Source::new(),
                        WindowSpec {
                            first_event: batches * 7,
                            ..WindowSpec::default()
                        },
                    );
                    let first = all(&mut w);
                    let carried = w.found().map_or(0, |f| f.carried_in as usize);
                    first.size_bytes.iter().take(carried).sum()
                };
                assert_eq!(before.live_bytes(), live_bytes, "after {batches} batches");
                let Some(mut resumed) = WindowSource::resume(src, spec, before) else {
                    // Only a window starting inside the noted events is refused.
                    assert!(
                        spec.from_ns
                            .is_some_and(|f| f <= (batches as i64 * 7 - 1) * 10),
                        "{spec:?} after {batches} batches"
                    );
                    continue;
                };
                assert_eq!(
                    all(&mut resumed),
                    expected,
                    "{spec:?} after {batches} batches"
                );
                assert_eq!(
                    resumed.found(),
                    whole.found(),
                    "{spec:?} after {batches} batches"
                );
            }
        }
        let mut before = Before::default();
        let mut src = Source::new();
        let mut b = EventBatch::default();
        src.next_batch(&mut b).unwrap();
        before.note_batch(&b);
        let early = WindowSpec {
            first_event: 3,
            ..WindowSpec::default()
        };
        assert!(!before.precedes(&early));
        assert!(WindowSource::resume(Source::new(), early, before).is_none());
    }
}
