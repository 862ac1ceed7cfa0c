//! The replay loop's state and step ([`Run`]), shared by the in-memory replay and the
//! streaming one ([`crate::stream`]).
//!
//! The loop runs inside the policy's own [`Policy::replay_span`], instantiated for each policy
//! type, so that its `alloc`, `free` and `counters` are direct calls: through the trait object
//! they were three calls an event. Only checkpoints, taken between spans, use the trait object.
//! The loop keeps the state after each event of a stretch of 256 and measures the stretch
//! afterwards ([`Meter::measure`]), in runs of one time bucket, where the running extremes stay
//! in registers instead of being loaded and stored around every call into the policy.

use super::peaks::Peaks;
use super::{
    AddrTable, Checkpoint, FAILED, FreeFailure, Oom, Replay, ReplayOptions, Summary, apply,
};
use crate::heap::{AllocError, Counters, Request};
use crate::layout::LayoutRecorder;
use crate::metrics;
use crate::policy::Policy;
use crate::series::{Bucketing, SeriesBuilder, State};
use crate::trace::EventKind;

/// The replay loop's state: the policy, what is measured after every event, and the
/// checkpoints. Shared by the replay of a trace in memory ([`replay_observed`]) and the
/// streaming one ([`crate::stream::replay_stream`]), so both give the same figures.
pub(crate) struct Run {
    policy: Box<dyn Policy>,
    meter: Meter,
}

/// A stretch of consecutive events for [`Policy::replay_span`]: columns of equal length, the
/// first being event number `first`.
#[derive(Clone, Copy)]
pub struct Span<'a> {
    pub(crate) first: usize,
    pub(crate) kind: &'a [u8],
    pub(crate) alloc_id: &'a [u32],
    /// Each event's slot of the address table; `None` when it is the allocation id (in memory).
    pub(crate) slot: Option<&'a [u32]>,
    pub(crate) size_bytes: &'a [u64],
    pub(crate) t_ns: &'a [i64],
}

impl<'a> Span<'a> {
    /// The events from `first` on in these columns, as many as the shortest holds (the
    /// columns are of one length in a valid trace or batch).
    pub(crate) fn new(
        first: usize,
        kind: &'a [u8],
        alloc_id: &'a [u32],
        slot: Option<&'a [u32]>,
        size_bytes: &'a [u64],
        t_ns: &'a [i64],
    ) -> Self {
        let n = [kind.len(), alloc_id.len(), size_bytes.len(), t_ns.len()]
            .into_iter()
            .chain(slot.map(<[u32]>::len))
            .min()
            .unwrap_or(0);
        Span {
            first,
            kind,
            alloc_id,
            slot,
            size_bytes,
            t_ns,
        }
        .part(0, n)
    }

    /// Every event of a trace in memory (allocation ids are their own slots).
    pub(crate) fn of_trace(trace: &crate::trace::TraceView<'a>) -> Self {
        Self::new(
            0,
            trace.kind,
            trace.alloc_id,
            None,
            trace.size_bytes,
            trace.t_ns,
        )
    }

    pub(crate) fn len(&self) -> usize {
        self.kind.len()
    }

    /// Events `from..to` of the span.
    pub(crate) fn part(&self, from: usize, to: usize) -> Self {
        let (a, b) = (from, to.max(from));
        Span {
            first: self.first + a,
            kind: self.kind.get(a..b).unwrap_or_default(),
            alloc_id: self.alloc_id.get(a..b).unwrap_or_default(),
            slot: self.slot.map(|s| s.get(a..b).unwrap_or_default()),
            size_bytes: self.size_bytes.get(a..b).unwrap_or_default(),
            t_ns: self.t_ns.get(a..b).unwrap_or_default(),
        }
    }
}

/// What a replay measures, apart from the policy: the state [`Policy::replay_span`] updates.
/// Only the replay engine makes one.
pub struct Meter {
    align_bytes: u64,
    series: SeriesBuilder,
    /// Address of each allocation slot (its id in memory; a recycled slot when streaming).
    addrs: AddrTable,
    /// How the slots of the address table come.
    slots: Slots,
    ooms: Vec<Oom>,
    oom_count: u64,
    /// At most this many [`Oom`]s are kept (all of them in memory; a bounded number when
    /// streaming, where a low limit could fail a billion allocations).
    max_ooms_kept: usize,
    free_failures: Vec<FreeFailure>,
    first_oom_state: Option<Box<dyn Policy>>,
    checkpoints: Vec<Checkpoint>,
    checkpoint_bytes: u64,
    checkpoint_budget_bytes: u64,
    /// See [`ReplayOptions::checkpoint_min_copies`] (0 with a layout index).
    checkpoint_min_copies: u64,
    interval: usize,
    next_checkpoint: usize,
    peaks: Peaks,
    /// The states after the events of the stretch in progress, measured at its end.
    states: Vec<State>,
    layout: Option<LayoutRecorder>,
}

/// How a run's allocation slots come, which decides how its address table grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slots {
    /// One slot per allocation id of a trace in memory: the table is sized upfront.
    Fixed,
    /// Slots recycled as their allocations are freed (streaming): the table grows with the
    /// slots seen, and a freed slot is unplaced for its next allocation.
    Recycled,
    /// One slot per allocation id of a trace still growing ([`super::LiveReplay`]): the table
    /// grows with the ids seen and keeps every address, for seeking.
    Growing,
}

/// Events replayed before their states are measured (see [`Meter::measure`]): their states
/// stay in the first-level cache.
const STRETCH: usize = 256;

/// [`Oom`]s a streaming replay keeps (the count stays exact).
pub const STREAM_OOMS_KEPT: usize = 1 << 16;

impl Run {
    /// A run over `events` events (`None` when streaming: unknown, and only the initial
    /// state is kept, as no seek can replay a trace that is not in memory).
    pub(crate) fn new(
        policy: Box<dyn Policy>,
        opts: &ReplayOptions,
        bucketing: Bucketing,
        num_allocs: usize,
        events: Option<usize>,
    ) -> Self {
        // Without checkpoints the interval is the whole trace: only the initial state is kept.
        let interval = match (opts.checkpoint_every, events) {
            (_, None) => usize::MAX,
            (0, Some(n)) => n.max(1),
            (k, Some(_)) => k,
        };
        let layout = match events {
            Some(n) if opts.layout_index => LayoutRecorder::start(policy.as_ref(), num_allocs, n),
            _ => None,
        };
        // With a layout index, seeks for the block list do not need checkpoints (the explorers
        // seek no other way): keep a 64th, for a caller that asks for the policy's own state.
        let checkpoint_budget_bytes = if layout.is_some() {
            opts.checkpoint_budget_bytes / 64
        } else {
            opts.checkpoint_budget_bytes
        };
        let meter = Meter {
            align_bytes: opts.align_bytes,
            series: SeriesBuilder::new(bucketing),
            addrs: AddrTable::unplaced(num_allocs),
            slots: if events.is_none() {
                Slots::Recycled
            } else {
                Slots::Fixed
            },
            ooms: Vec::new(),
            oom_count: 0,
            max_ooms_kept: if events.is_some() {
                usize::MAX
            } else {
                STREAM_OOMS_KEPT
            },
            free_failures: Vec::new(),
            first_oom_state: None,
            checkpoints: Vec::with_capacity(events.map_or(1, |n| n / interval + 1)),
            checkpoint_bytes: 0,
            checkpoint_budget_bytes,
            checkpoint_min_copies: if layout.is_some() {
                0
            } else {
                opts.checkpoint_min_copies
            },
            interval,
            next_checkpoint: 0,
            peaks: Peaks::default(),
            states: Vec::with_capacity(STRETCH),
            layout,
        };
        Self { policy, meter }
    }

    /// Replays `span` (events in order, the next ones of the run), with a checkpoint where one
    /// falls due.
    pub(crate) fn run(&mut self, span: &Span<'_>) {
        let mut from = 0;
        while from < span.len() {
            let i = span.first + from;
            if i == self.meter.next_checkpoint {
                self.meter.checkpoint(i, self.policy.as_ref());
            }
            // The part runs up to the next checkpoint, which is past `i` now.
            let to = if self.meter.next_checkpoint > i {
                (self.meter.next_checkpoint - span.first).min(span.len())
            } else {
                span.len()
            };
            self.policy
                .replay_span(&mut self.meter, &span.part(from, to));
            from = to;
        }
    }
}

impl Meter {
    fn checkpoint(&mut self, i: usize, policy: &dyn Policy) {
        let approx = policy.state_bytes();
        let floor = approx
            .saturating_mul(self.checkpoint_min_copies)
            .min(super::DEFAULT_CHECKPOINT_BUDGET_BYTES);
        self.checkpoint_budget_bytes = self.checkpoint_budget_bytes.max(floor);
        // A copy that alone would overrun the budget is not made (the initial state's
        // always is): a buddy heap of terabytes holds gigabytes of bitmaps.
        if self.checkpoints.is_empty() || approx <= self.checkpoint_budget_bytes {
            self.checkpoints.push(Checkpoint {
                next_event: i,
                policy: policy.clone_box().into(),
                approx_bytes: approx,
            });
            self.checkpoint_bytes += approx;
            while self.checkpoint_bytes > self.checkpoint_budget_bytes && self.checkpoints.len() > 1
            {
                self.interval = self.interval.saturating_mul(2);
                let interval = self.interval;
                self.checkpoints.retain(|c| c.next_event % interval == 0);
                self.checkpoint_bytes = self.checkpoints.iter().map(|c| c.approx_bytes).sum();
            }
        }
        self.next_checkpoint = (i / self.interval)
            .saturating_add(1)
            .saturating_mul(self.interval);
    }

    /// Replays `span` through `policy`, which [`Policy::replay_span`] calls with its own type
    /// so that the policy's calls are direct. The caller takes the checkpoints.
    #[inline]
    pub(crate) fn replay_span<P: Policy + ?Sized>(&mut self, policy: &mut P, span: &Span<'_>) {
        let mut from = 0;
        while from < span.len() {
            let to = (from + STRETCH).min(span.len());
            let part = span.part(from, to);
            self.states.clear();
            let events = part
                .kind
                .iter()
                .zip(part.alloc_id)
                .zip(part.size_bytes)
                .zip(part.t_ns)
                .enumerate();
            match part.slot {
                None => {
                    for (k, (((&code, &id), &size), &t)) in events {
                        self.step(policy, part.first + k, code, id, id, size, t);
                    }
                }
                Some(slots) => {
                    for ((k, (((&code, &id), &size), &t)), &slot) in events.zip(slots) {
                        self.step(policy, part.first + k, code, id, slot, size, t);
                    }
                }
            }
            self.measure(part.first, part.t_ns);
            from = to;
        }
    }

    /// Applies event `i` (allocation `id`, whose address goes in `slot` of the table) and
    /// returns the state after it, for [`Self::measure`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn step<P: Policy + ?Sized>(
        &mut self,
        policy: &mut P,
        i: usize,
        code: u8,
        id: u32,
        slot: u32,
        size: u64,
        t: i64,
    ) {
        if self.slots != Slots::Fixed
            && slot as usize >= self.addrs.len()
            && slot != crate::trace::NO_ALLOC_ID
        {
            self.addrs.grow_to(slot as usize + 1);
        }
        let mut failed = false;
        match apply(policy, code, id, slot, size, self.align_bytes, &self.addrs) {
            Ok(Some(p)) => {
                self.addrs.set(slot as usize, p.addr);
                if let Some(l) = &mut self.layout {
                    l.on_alloc(i, id, p.addr, p.reserved_bytes, size);
                }
            }
            Ok(None) => {
                if code == EventKind::Free as u8 {
                    if let Some(l) = &mut self.layout {
                        l.on_free(i, id);
                    }
                    if self.slots == Slots::Recycled {
                        // The slot is reused by a later allocation, which may fail.
                        self.addrs.set(slot as usize, FAILED);
                    }
                }
            }
            Err(Ok(error)) => {
                failed = true;
                let request = Request {
                    id,
                    size_bytes: size,
                    align_bytes: self.align_bytes,
                };
                self.failed_alloc(policy, i, t, slot, request, error);
            }
            Err(Err(error)) => self.free_failures.push(FreeFailure { event: i, error }),
        }
        let counters = policy.counters();
        if let Some(l) = &mut self.layout {
            l.after_event(i, policy, &counters);
        }
        self.states.push(State::of(&counters, failed));
    }

    /// Records allocation `request`'s failure at event `i`.
    #[cold]
    fn failed_alloc<P: Policy + ?Sized>(
        &mut self,
        policy: &P,
        i: usize,
        t_ns: i64,
        slot: u32,
        request: Request,
        error: AllocError,
    ) {
        if self.slots != Slots::Fixed {
            self.addrs.set(slot as usize, FAILED);
        }
        if self.first_oom_state.is_none() {
            self.first_oom_state = Some(policy.clone_box());
        }
        self.oom_count += 1;
        if self.ooms.len() < self.max_ooms_kept {
            self.ooms.push(Oom {
                event: i,
                t_ns,
                request,
                error,
                counters_at_failure: policy.counters(),
            });
        }
    }

    /// Measures the states after the events from `first` on, collected by [`Self::step`],
    /// which happened at `t_ns`: run by run of one time bucket, so that the running extremes
    /// stay in registers instead of being loaded and stored around every policy call.
    fn measure(&mut self, first: usize, t_ns: &[i64]) {
        let n = self.states.len().min(t_ns.len());
        let t_ns = t_ns.get(..n).unwrap_or_default();
        let mut from = 0;
        while from < n {
            let to = self.series.bucket_run_end(t_ns, from);
            let run = self.states.get(from..to).unwrap_or_default();
            let extremes = self.series.absorb(run);
            self.peaks.absorb(first + from, run, &extremes);
            from = to;
        }
    }
}

impl Run {
    /// The replay after `n` events, the loop having taken `replay_seconds`.
    pub(crate) fn finish(self, n: usize, replay_seconds: f64, streamed: bool) -> Replay {
        let Run {
            mut policy,
            meter: mut m,
        } = self;
        // A replay kept for seeking (the explorers') holds its final state for good.
        if m.layout.is_some() || m.checkpoints.len() > 1 {
            policy.shrink_to_fit();
        }
        let layout = m.layout.map(LayoutRecorder::finish);
        if m.checkpoints.is_empty() {
            m.checkpoints.push(Checkpoint {
                next_event: 0,
                policy: policy.clone_box().into(),
                approx_bytes: policy.state_bytes(),
            });
        }
        let summary = summary(&m.peaks, m.oom_count, policy.as_ref(), n, replay_seconds);
        Replay {
            policy_name: policy.name(),
            summary,
            series: m.series.finish(),
            ooms: m.ooms,
            first_oom_state: m.first_oom_state,
            free_failures: m.free_failures,
            final_state: policy,
            checkpoints: m.checkpoints,
            checkpoint_every: m.interval,
            addrs: if streamed {
                AddrTable::default()
            } else {
                m.addrs
            },
            align_bytes: m.align_bytes,
            layout,
            streamed,
        }
    }

    /// A run over a trace still being written ([`super::LiveReplay`]): its series grows from
    /// `t0_ns` (buckets of `bucket_width_ns` to start with), its address table with the ids
    /// seen; it keeps checkpoints every `opts.checkpoint_every` events for seeking, and no
    /// layout index (which needs the trace's length).
    pub(crate) fn growing(
        policy: Box<dyn Policy>,
        opts: &ReplayOptions,
        t0_ns: i64,
        bucket_width_ns: u64,
    ) -> Self {
        let opts = ReplayOptions {
            layout_index: false,
            ..opts.clone()
        };
        let mut run = Self::new(
            policy,
            &opts,
            Bucketing::for_span(t0_ns, t0_ns, 1),
            0,
            Some(0),
        );
        run.meter.series = SeriesBuilder::growing(t0_ns, bucket_width_ns, opts.buckets);
        run.meter.slots = Slots::Growing;
        // 0: only the initial state, as for a replay of a whole trace.
        run.meter.interval = match opts.checkpoint_every {
            0 => usize::MAX,
            k => k,
        };
        // A run that goes on for hours under a low limit could fail billions of requests.
        run.meter.max_ooms_kept = STREAM_OOMS_KEPT;
        run
    }

    /// The replay of the first `n` events, the run's `n` so far, without ending the run:
    /// copies of what a frontend reads (the policy, the checkpoints' handles, the address
    /// table, the series up to the bucket in progress).
    pub(crate) fn snapshot(&self, n: usize, replay_seconds: f64) -> Replay {
        let m = &self.meter;
        let mut checkpoints = m.checkpoints.clone();
        if checkpoints.is_empty() {
            checkpoints.push(Checkpoint {
                next_event: 0,
                policy: self.policy.clone_box().into(),
                approx_bytes: self.policy.state_bytes(),
            });
        }
        Replay {
            policy_name: self.policy.name(),
            summary: summary(
                &m.peaks,
                m.oom_count,
                self.policy.as_ref(),
                n,
                replay_seconds,
            ),
            series: m.series.snapshot(),
            ooms: m.ooms.clone(),
            first_oom_state: m.first_oom_state.as_ref().map(|p| p.clone_box()),
            free_failures: m.free_failures.clone(),
            final_state: self.policy.clone_box(),
            checkpoints,
            checkpoint_every: m.interval,
            addrs: m.addrs.clone(),
            align_bytes: m.align_bytes,
            layout: None,
            streamed: false,
        }
    }
}

/// The exact scalars after `n` events, `policy` being the policy after them.
fn summary(
    p: &Peaks,
    oom_count: u64,
    policy: &dyn Policy,
    n: usize,
    replay_seconds: f64,
) -> Summary {
    let counters = policy.counters();
    {
        Summary {
            events: n,
            peak_footprint_bytes: p.footprint_bytes,
            peak_footprint_event: p.footprint_event,
            final_footprint_bytes: counters.footprint_bytes,
            peak_live_bytes: p.live_bytes,
            peak_live_event: p.live_event,
            peak_allocated_bytes: p.allocated_bytes,
            fragmentation_at_peak: metrics::fragmentation(&Counters {
                live_bytes: p.live_at_peak_bytes,
                footprint_bytes: p.footprint_bytes,
                ..Counters::default()
            }),
            mean_fragmentation: if n == 0 {
                0.0
            } else {
                p.fragmentation_sum() / n as f64
            },
            oom_count,
            replay_seconds,
            events_per_second: if replay_seconds > 0.0 {
                n as f64 / replay_seconds
            } else {
                0.0
            },
            final_counters: counters,
        }
    }
}
