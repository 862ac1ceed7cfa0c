//! Metric series downsampled into time buckets, so a chart of any width shows every peak.
//!
//! [`Bucketing`] cuts the trace's time range `[t_first, t_last]` into `buckets` equal spans;
//! bucket `b` covers `[start_ns(b), start_ns(b + 1))`. For every bucket and every metric the
//! [`Series`] keeps the minimum and the maximum over the states after each event of the bucket,
//! and the value after its last event, plus the bucket's first and last event indices. A bucket
//! with no event carries the state in effect (the previous bucket's last value) and has
//! `event_count == 0`.

use crate::heap::Counters;
use crate::metrics;
use crate::trace::TraceView;

mod growing;
mod measured;
pub use measured::measured;

/// How event times map to buckets. Shared by [`Series`] and [`crate::classes::ClassSeries`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucketing {
    /// Time of the first event.
    pub t0_ns: i64,
    /// `t_last - t0 + 1`, at least 1.
    pub span_ns: u64,
    /// Number of buckets, at least 1.
    pub buckets: usize,
}

impl Bucketing {
    /// `buckets` equal time spans over the trace (at least one bucket).
    #[must_use]
    pub fn for_trace(trace: &TraceView<'_>, buckets: usize) -> Self {
        let t0_ns = trace.t_ns.first().copied().unwrap_or(0);
        let t_last = trace.t_ns.last().copied().unwrap_or(t0_ns);
        Self::for_span(t0_ns, t_last, buckets)
    }

    /// `buckets` equal time spans from `t0_ns` to `t_last` (at least one bucket).
    #[must_use]
    pub fn for_span(t0_ns: i64, t_last: i64, buckets: usize) -> Self {
        Self {
            t0_ns,
            span_ns: t_last.abs_diff(t0_ns).saturating_add(1),
            buckets: buckets.max(1),
        }
    }

    /// The bucket holding time `t_ns` (times outside the trace clamp to the ends).
    #[must_use]
    pub fn bucket_of(&self, t_ns: i64) -> usize {
        let offset = if t_ns <= self.t0_ns {
            0
        } else {
            t_ns.abs_diff(self.t0_ns)
        };
        // In 64 bits when the product fits, as it does for any trace shorter than 2^53 ns over
        // 2048 buckets: a 128-bit division is a call, and short traces cross a bucket every
        // few events.
        let b = match offset.checked_mul(self.buckets as u64) {
            Some(p) => u128::from(p / self.span_ns),
            None => u128::from(offset) * self.buckets as u128 / u128::from(self.span_ns),
        };
        usize::try_from(b).map_or(self.buckets - 1, |b| b.min(self.buckets - 1))
    }

    /// First time of bucket `b` (`b == buckets` gives the end of the last bucket).
    #[must_use]
    pub fn start_ns(&self, b: usize) -> i64 {
        let offset = match (b as u64).checked_mul(self.span_ns) {
            Some(num) => u128::from(num.div_ceil(self.buckets as u64)),
            None => (b as u128 * u128::from(self.span_ns)).div_ceil(self.buckets as u128),
        };
        // A span past 2^63 ns (a trace whose times cover most of i64) has offsets past i64.
        let t = i128::from(self.t0_ns).saturating_add(i128::try_from(offset).unwrap_or(i128::MAX));
        i64::try_from(t).unwrap_or(i64::MAX)
    }
}

/// Minimum, maximum and last value of one metric per bucket.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MinMaxLast<T> {
    pub min: Vec<T>,
    pub max: Vec<T>,
    pub last: Vec<T>,
}

impl<T: Copy> MinMaxLast<T> {
    fn with_capacity(n: usize) -> Self {
        Self {
            min: Vec::with_capacity(n),
            max: Vec::with_capacity(n),
            last: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, min: T, max: T, last: T) {
        self.min.push(min);
        self.max.push(max);
        self.last.push(last);
    }
}

/// Per-bucket metrics of one replay (structure of arrays, one entry per bucket).
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub bucketing: Bucketing,
    /// Index of the bucket's first event (for an empty bucket: the last event before it).
    pub first_event: Vec<usize>,
    /// Index of the bucket's last event (for an empty bucket: the last event before it).
    pub last_event: Vec<usize>,
    /// Events in the bucket.
    pub event_count: Vec<u64>,
    /// Failed allocations in the bucket.
    pub ooms: Vec<u64>,
    pub live_bytes: MinMaxLast<u64>,
    pub allocated_bytes: MinMaxLast<u64>,
    pub internal_waste_bytes: MinMaxLast<u64>,
    pub footprint_bytes: MinMaxLast<u64>,
    pub free_blocks: MinMaxLast<u64>,
    pub fragmentation: MinMaxLast<f64>,
    pub external_fragmentation: MinMaxLast<f64>,
}

impl Series {
    /// Number of buckets.
    #[must_use]
    pub fn len(&self) -> usize {
        self.event_count.len()
    }

    /// True when there are no buckets (never, for a series built by the replay).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.event_count.is_empty()
    }

    /// The bucket that holds `event` (the last bucket for events past the end).
    #[must_use]
    pub fn bucket_of_event(&self, event: usize) -> usize {
        let b = self.last_event.partition_point(|&last| last < event);
        b.min(self.len().saturating_sub(1))
    }
}

/// A ratio `num / den` kept as integers so the hot loop compares without dividing; `den == 0`
/// stands for the ratio 1 (the metric's "nothing to measure" case, where it is 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ratio {
    num: u64,
    den: u64,
}

impl Ratio {
    /// Larger than every real ratio: the starting minimum of a bucket.
    const TOP: Self = Self { num: 1, den: 0 };
    /// The starting maximum of a bucket.
    const BOTTOM: Self = Self { num: 0, den: 1 };

    #[inline]
    fn new(num: u64, den: u64) -> Self {
        if den == 0 {
            Self { num: 1, den: 1 }
        } else {
            Self { num, den }
        }
    }

    /// `self < other`, exactly (128-bit cross multiplication).
    #[inline]
    fn less(self, other: Self) -> bool {
        u128::from(self.num) * u128::from(other.den) < u128::from(other.num) * u128::from(self.den)
    }
}

/// [`metrics::fragmentation`] of a state whose live/footprint ratio is `r`.
fn fragmentation_of(r: Ratio) -> f64 {
    metrics::fragmentation(&Counters {
        live_bytes: r.num,
        footprint_bytes: r.den,
        ..Counters::default()
    })
}

/// [`metrics::external_fragmentation`] of a state whose largest/free ratio is `r`.
fn external_fragmentation_of(r: Ratio) -> f64 {
    metrics::external_fragmentation(&Counters {
        largest_free_bytes: r.num,
        free_bytes: r.den,
        ..Counters::default()
    })
}

/// Indices of [`State::ints`].
const LIVE: usize = 0;
const ALLOCATED: usize = 1;
const WASTE: usize = 2;
const FOOTPRINT: usize = 3;
const FREE_BLOCKS: usize = 4;
const INTS: usize = 5;

/// What the series and the summary need of the state after one event: its counters (but the
/// live allocation count) and whether its allocation failed. The replay collects a run of these
/// beside the policy's calls and measures them in one go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct State {
    pub(crate) live_bytes: u64,
    pub(crate) allocated_bytes: u64,
    pub(crate) footprint_bytes: u64,
    pub(crate) free_bytes: u64,
    pub(crate) free_blocks: u64,
    pub(crate) largest_free_bytes: u64,
    pub(crate) failed: bool,
}

impl State {
    #[inline(always)]
    pub(crate) fn of(c: &Counters, failed: bool) -> Self {
        Self {
            live_bytes: c.live_bytes,
            allocated_bytes: c.allocated_bytes,
            footprint_bytes: c.footprint_bytes,
            free_bytes: c.free_bytes,
            free_blocks: c.free_blocks,
            largest_free_bytes: c.largest_free_bytes,
            failed,
        }
    }

    fn counters(&self) -> Counters {
        Counters {
            live_allocs: 0,
            live_bytes: self.live_bytes,
            allocated_bytes: self.allocated_bytes,
            footprint_bytes: self.footprint_bytes,
            free_bytes: self.free_bytes,
            free_blocks: self.free_blocks,
            largest_free_bytes: self.largest_free_bytes,
        }
    }

    /// The integer metrics, in a fixed order, for branch-free min/max.
    #[inline(always)]
    fn ints(&self) -> [u64; INTS] {
        let c = self.counters();
        let mut v = [0; INTS];
        v[LIVE] = metrics::live_bytes(&c);
        v[ALLOCATED] = metrics::allocated_bytes(&c);
        v[WASTE] = metrics::internal_waste_bytes(&c);
        v[FOOTPRINT] = metrics::footprint_bytes(&c);
        v[FREE_BLOCKS] = metrics::free_block_count(&c);
        v
    }
}

/// Extremes over one run of states given to [`SeriesBuilder::absorb`], for the summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunExtremes {
    pub(crate) live_lo: u64,
    pub(crate) live_hi: u64,
    pub(crate) footprint_lo: u64,
    pub(crate) footprint_hi: u64,
    pub(crate) allocated_hi: u64,
}

impl RunExtremes {
    /// Of an empty run.
    pub(crate) const NONE: Self = Self {
        live_lo: u64::MAX,
        live_hi: 0,
        footprint_lo: u64::MAX,
        footprint_hi: 0,
        allocated_hi: 0,
    };
}

/// Builds a [`Series`] from runs of states, in O(1) per event and without allocating (the
/// bucket arrays are reserved up front). Fragmentations are tracked as integer ratios and turned
/// into floats once per bucket.
///
/// A growing builder ([`Self::growing`]) has no last bucket: a time past its span doubles the
/// span, merging its buckets pairwise (`growing.rs`).
#[derive(Clone)]
pub(crate) struct SeriesBuilder {
    series: Series,
    /// Whether the span doubles to hold later times instead of the last bucket taking them.
    growing: bool,
    /// Of a growing builder: the buckets already written that the current one absorbed when
    /// the span doubled, merged into it when it is written.
    pending: Option<growing::Row>,
    bucket: usize,
    next_start_ns: i64,
    /// Events so far (the next event's index).
    events: usize,
    /// Events in the current bucket.
    count: u64,
    ooms: u64,
    min: [u64; INTS],
    max: [u64; INTS],
    /// Lowest and highest live/footprint ratio (highest and lowest fragmentation).
    live_lo: Ratio,
    live_hi: Ratio,
    /// Lowest and highest largest/free ratio.
    largest_lo: Ratio,
    largest_hi: Ratio,
    last: State,
}

impl SeriesBuilder {
    pub(crate) fn new(bucketing: Bucketing) -> Self {
        let n = bucketing.buckets;
        Self {
            series: Series {
                bucketing,
                first_event: Vec::with_capacity(n),
                last_event: Vec::with_capacity(n),
                event_count: Vec::with_capacity(n),
                ooms: Vec::with_capacity(n),
                live_bytes: MinMaxLast::with_capacity(n),
                allocated_bytes: MinMaxLast::with_capacity(n),
                internal_waste_bytes: MinMaxLast::with_capacity(n),
                footprint_bytes: MinMaxLast::with_capacity(n),
                free_blocks: MinMaxLast::with_capacity(n),
                fragmentation: MinMaxLast::with_capacity(n),
                external_fragmentation: MinMaxLast::with_capacity(n),
            },
            growing: false,
            pending: None,
            bucket: 0,
            next_start_ns: bucketing.start_ns(1),
            events: 0,
            count: 0,
            ooms: 0,
            min: [u64::MAX; INTS],
            max: [0; INTS],
            live_lo: Ratio::TOP,
            live_hi: Ratio::BOTTOM,
            largest_lo: Ratio::TOP,
            largest_hi: Ratio::BOTTOM,
            last: State::default(),
        }
    }

    /// Events `from..` of `t_ns` that fall in the current bucket, after moving to the bucket of
    /// event `from` if it starts a later one: the end of the run [`Self::absorb`] takes next.
    /// Times that go backwards stay in the current bucket.
    pub(crate) fn bucket_run_end(&mut self, t_ns: &[i64], from: usize) -> usize {
        let n = t_ns.len();
        let Some(&t) = t_ns.get(from) else {
            return n;
        };
        if self.growing {
            self.grow_to_hold(t);
        }
        let last_bucket = !self.growing && self.bucket + 1 >= self.series.bucketing.buckets;
        if t >= self.next_start_ns && !last_bucket {
            self.advance_to(self.series.bucketing.bucket_of(t));
        }
        if !self.growing && self.bucket + 1 >= self.series.bucketing.buckets {
            return n;
        }
        let next = self.next_start_ns;
        t_ns.get(from + 1..)
            .and_then(|rest| rest.iter().position(|&t| t >= next))
            .map_or(n, |k| from + 1 + k)
    }

    /// Records the states after a run of events of the current bucket (see
    /// [`Self::bucket_run_end`]) and returns their extremes. In passes over the run, with the
    /// running extremes in registers, rather than event by event beside the policy's calls:
    /// buddy's `compare` replay of the python trace went from 36.5 to 41 M events/s (bfc's,
    /// whose largest free block changes at most events, stayed at 34).
    pub(crate) fn absorb(&mut self, run: &[State]) -> RunExtremes {
        let Some(last) = run.last() else {
            return RunExtremes::NONE;
        };
        let (mut lo, mut hi) = ([u64::MAX; INTS], [0; INTS]);
        let (mut largest_lo, mut largest_hi) = (u64::MAX, 0);
        let (mut free_lo, mut free_hi) = (u64::MAX, 0);
        let mut ooms = 0;
        for s in run {
            let v = s.ints();
            for ((l, h), x) in lo.iter_mut().zip(&mut hi).zip(v) {
                *l = (*l).min(x);
                *h = (*h).max(x);
            }
            ooms += u64::from(s.failed);
        }
        for s in run {
            largest_lo = largest_lo.min(s.largest_free_bytes);
            largest_hi = largest_hi.max(s.largest_free_bytes);
            free_lo = free_lo.min(s.free_bytes);
            free_hi = free_hi.max(s.free_bytes);
        }
        // Over a run of one footprint the live/footprint ratio is extreme where live bytes are,
        // and over a run of one largest free block the largest/free ratio is extreme where the
        // free bytes are: two comparisons for the run instead of two an event. A state with no
        // free bytes has the ratio 1; with a largest block of 0 the others have 0, so the
        // extremes are still at the run's least and most free bytes (a policy's counters always
        // pair them so, but a largest block above 0 with nothing free would not).
        let one_largest = largest_lo == largest_hi && (largest_lo == 0 || free_lo > 0);
        if lo[FOOTPRINT] == hi[FOOTPRINT] {
            self.note_live(Ratio::new(lo[LIVE], lo[FOOTPRINT]));
            self.note_live(Ratio::new(hi[LIVE], lo[FOOTPRINT]));
        } else {
            for s in run {
                self.note_live(Ratio::new(s.live_bytes, s.footprint_bytes));
            }
        }
        if one_largest {
            self.note_largest(Ratio::new(largest_lo, free_lo));
            self.note_largest(Ratio::new(largest_lo, free_hi));
        } else {
            for s in run {
                self.note_largest(Ratio::new(s.largest_free_bytes, s.free_bytes));
            }
        }
        for ((l, h), (rl, rh)) in self
            .min
            .iter_mut()
            .zip(&mut self.max)
            .zip(lo.iter().zip(&hi))
        {
            *l = (*l).min(*rl);
            *h = (*h).max(*rh);
        }
        self.last = *last;
        self.count += run.len() as u64;
        self.events += run.len();
        self.ooms += ooms;
        RunExtremes {
            live_lo: lo[LIVE],
            live_hi: hi[LIVE],
            footprint_lo: lo[FOOTPRINT],
            footprint_hi: hi[FOOTPRINT],
            allocated_hi: hi[ALLOCATED],
        }
    }

    #[inline]
    fn note_live(&mut self, r: Ratio) {
        if r.less(self.live_lo) {
            self.live_lo = r;
        }
        if self.live_hi.less(r) {
            self.live_hi = r;
        }
    }

    #[inline]
    fn note_largest(&mut self, r: Ratio) {
        if r.less(self.largest_lo) {
            self.largest_lo = r;
        }
        if self.largest_hi.less(r) {
            self.largest_hi = r;
        }
    }

    /// Writes the current bucket, then empty buckets up to (not including) `bucket`.
    fn advance_to(&mut self, bucket: usize) {
        while self.bucket < bucket {
            self.flush();
            self.bucket += 1;
        }
        self.next_start_ns = self.series.bucketing.start_ns(self.bucket + 1);
    }

    fn flush(&mut self) {
        let last_ints = self.last.ints();
        let last_live = Ratio::new(self.last.live_bytes, self.last.footprint_bytes);
        let last_largest = Ratio::new(self.last.largest_free_bytes, self.last.free_bytes);
        if self.count == 0 {
            // Nothing happened: the state in effect is the last one seen.
            self.min = last_ints;
            self.max = last_ints;
            self.live_lo = last_live;
            self.live_hi = last_live;
            self.largest_lo = last_largest;
            self.largest_hi = last_largest;
        }
        let last_event = self.events.saturating_sub(1);
        let first_event = if self.count == 0 {
            last_event
        } else {
            self.events - self.count as usize
        };
        let s = &mut self.series;
        s.first_event.push(first_event);
        s.last_event.push(last_event);
        s.event_count.push(self.count);
        s.ooms.push(self.ooms);
        let (lo, hi) = (&self.min, &self.max);
        s.live_bytes.push(lo[LIVE], hi[LIVE], last_ints[LIVE]);
        s.allocated_bytes
            .push(lo[ALLOCATED], hi[ALLOCATED], last_ints[ALLOCATED]);
        s.internal_waste_bytes
            .push(lo[WASTE], hi[WASTE], last_ints[WASTE]);
        s.footprint_bytes
            .push(lo[FOOTPRINT], hi[FOOTPRINT], last_ints[FOOTPRINT]);
        s.free_blocks
            .push(lo[FREE_BLOCKS], hi[FREE_BLOCKS], last_ints[FREE_BLOCKS]);
        // The highest fragmentation comes from the lowest ratio.
        s.fragmentation.push(
            fragmentation_of(self.live_hi),
            fragmentation_of(self.live_lo),
            fragmentation_of(last_live),
        );
        s.external_fragmentation.push(
            external_fragmentation_of(self.largest_hi),
            external_fragmentation_of(self.largest_lo),
            external_fragmentation_of(last_largest),
        );
        if let Some(earlier) = self.pending.take() {
            self.series.merge_last_after(earlier);
        }
        self.count = 0;
        self.ooms = 0;
        self.min = [u64::MAX; INTS];
        self.max = [0; INTS];
        self.live_lo = Ratio::TOP;
        self.live_hi = Ratio::BOTTOM;
        self.largest_lo = Ratio::TOP;
        self.largest_hi = Ratio::BOTTOM;
    }

    pub(crate) fn finish(mut self) -> Series {
        let buckets = self.series.bucketing.buckets;
        self.advance_to(buckets - 1);
        self.flush();
        self.series
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::trace::OwnedTrace;
    use proptest::prelude::*;

    #[test]
    fn bucketing_splits_time_evenly() {
        let mut t = OwnedTrace::new();
        t.alloc(100, 1);
        t.alloc(199, 1);
        let view = t.view().unwrap();
        let b = Bucketing::for_trace(&view, 4);
        assert_eq!(b.span_ns, 100);
        assert_eq!(b.bucket_of(100), 0);
        assert_eq!(b.bucket_of(124), 0);
        assert_eq!(b.bucket_of(125), 1);
        assert_eq!(b.bucket_of(199), 3);
        assert_eq!(b.bucket_of(5000), 3);
        assert_eq!(b.bucket_of(0), 0);
        for k in 0..=4 {
            let s = b.start_ns(k);
            assert_eq!(b.start_ns(k), 100 + 25 * k as i64);
            if k < 4 {
                assert_eq!(b.bucket_of(s), k);
            }
            if k > 0 {
                assert_eq!(b.bucket_of(s - 1), k - 1);
            }
        }
    }

    #[test]
    fn bucket_starts_are_exact_when_the_span_does_not_divide() {
        let b = Bucketing {
            t0_ns: -7,
            span_ns: 10,
            buckets: 3,
        };
        for k in 1..3 {
            let s = b.start_ns(k);
            assert_eq!(b.bucket_of(s), k);
            assert_eq!(b.bucket_of(s - 1), k - 1);
        }
        // Spans whose products pass 64 bits (the 128-bit path) and just stay under it.
        for span_ns in [u64::MAX, u64::MAX / 2047, (1 << 53) + 7] {
            let b = Bucketing {
                t0_ns: i64::MIN,
                span_ns,
                buckets: 2048,
            };
            for k in [1, 2, 1000, 2047] {
                let s = b.start_ns(k);
                assert_eq!(b.bucket_of(s), k, "span {span_ns} bucket {k}");
                assert_eq!(b.bucket_of(s - 1), k - 1, "span {span_ns} bucket {k}");
            }
        }
    }

    fn state(live: u64, footprint: u64, failed: bool) -> State {
        State {
            live_bytes: live,
            allocated_bytes: live,
            footprint_bytes: footprint,
            failed,
            ..State::default()
        }
    }

    /// Feeds `states` (happening at `t_ns`) to `sb` the way the replay does, in runs of one
    /// bucket.
    pub(crate) fn feed(sb: &mut SeriesBuilder, t_ns: &[i64], states: &[State]) {
        let mut from = 0;
        while from < t_ns.len() {
            let to = sb.bucket_run_end(t_ns, from);
            sb.absorb(&states[from..to]);
            from = to;
        }
    }

    #[test]
    fn builder_keeps_min_max_last_and_fills_gaps() {
        let b = Bucketing {
            t0_ns: 0,
            span_ns: 40,
            buckets: 4,
        };
        let mut sb = SeriesBuilder::new(b);
        // bucket 0: live 10, 50, 20; bucket 1 empty; bucket 2: 5; bucket 3 empty.
        let states = [
            state(10, 100, false),
            state(50, 100, true),
            state(20, 100, false),
            state(5, 40, false),
        ];
        feed(&mut sb, &[0, 3, 9, 25], &states);
        let s = sb.finish();
        assert_eq!(s.len(), 4);
        assert_eq!(s.live_bytes.max, vec![50, 20, 5, 5]);
        assert_eq!(s.live_bytes.min, vec![10, 20, 5, 5]);
        assert_eq!(s.live_bytes.last, vec![20, 20, 5, 5]);
        assert_eq!(s.footprint_bytes.min, vec![100, 100, 40, 40]);
        assert_eq!(s.event_count, vec![3, 0, 1, 0]);
        assert_eq!(s.ooms, vec![1, 0, 0, 0]);
        assert_eq!(s.first_event, vec![0, 2, 3, 3]);
        assert_eq!(s.last_event, vec![2, 2, 3, 3]);
        assert!((s.fragmentation.max[0] - 0.9).abs() < 1e-12);
        assert!((s.fragmentation.min[0] - 0.5).abs() < 1e-12);
        assert_eq!(s.bucket_of_event(1), 0);
        assert_eq!(s.bucket_of_event(3), 2);
    }

    /// The series as the replay measured it before runs: event by event, each fragmentation a
    /// float of its own (exact here: every value is under 2^40, so the floats order as the
    /// ratios do).
    pub(crate) fn shadow(b: Bucketing, t_ns: &[i64], states: &[State]) -> Series {
        let mut buckets: Vec<Vec<(usize, State)>> = vec![Vec::new(); b.buckets];
        let mut bucket = 0;
        for (i, (&t, s)) in t_ns.iter().zip(states).enumerate() {
            // Time never moves a state to an earlier bucket.
            bucket = bucket.max(b.bucket_of(t));
            buckets[bucket].push((i, *s));
        }
        let mut out = SeriesBuilder::new(b).series;
        let mut prev: Option<(usize, State)> = None;
        for states in &buckets {
            let (first, last) = match (states.first(), states.last(), prev) {
                (Some(f), Some(l), _) => (f.0, l.0),
                (None, None, Some(p)) => (p.0, p.0),
                _ => (0, 0),
            };
            out.first_event.push(first);
            out.last_event.push(last);
            out.event_count.push(states.len() as u64);
            out.ooms
                .push(states.iter().filter(|s| s.1.failed).count() as u64);
            let seen: Vec<State> = if states.is_empty() {
                vec![prev.map_or(State::default(), |p| p.1)]
            } else {
                states.iter().map(|s| s.1).collect()
            };
            let last_state = *seen.last().unwrap();
            let ints: Vec<[u64; INTS]> = seen.iter().map(State::ints).collect();
            let col = |k: usize| {
                let v = ints.iter().map(|x| x[k]);
                (
                    v.clone().min().unwrap(),
                    v.clone().max().unwrap(),
                    last_state.ints()[k],
                )
            };
            for (k, m) in [
                (LIVE, &mut out.live_bytes),
                (ALLOCATED, &mut out.allocated_bytes),
                (WASTE, &mut out.internal_waste_bytes),
                (FOOTPRINT, &mut out.footprint_bytes),
                (FREE_BLOCKS, &mut out.free_blocks),
            ] {
                let (lo, hi, l) = col(k);
                m.push(lo, hi, l);
            }
            let frag: Vec<f64> = seen
                .iter()
                .map(|s| metrics::fragmentation(&s.counters()))
                .collect();
            let ext: Vec<f64> = seen
                .iter()
                .map(|s| metrics::external_fragmentation(&s.counters()))
                .collect();
            let lo = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            out.fragmentation.push(
                lo(&frag),
                hi(&frag),
                metrics::fragmentation(&last_state.counters()),
            );
            out.external_fragmentation.push(
                lo(&ext),
                hi(&ext),
                metrics::external_fragmentation(&last_state.counters()),
            );
            if let Some(l) = states.last() {
                prev = Some(*l);
            }
        }
        out
    }

    /// States that hold one footprint or one largest free block for a while, as real ones
    /// do, sometimes full or empty, with times that sometimes go backwards.
    fn states_strategy() -> impl Strategy<Value = (Vec<i64>, Vec<State>)> {
        prop::collection::vec(
            (
                0i64..40,
                0u64..6,
                0u64..1000,
                0u64..3,
                0u64..500,
                any::<bool>(),
            ),
            1..300,
        )
        .prop_map(|steps| {
            let (mut t, mut footprint, mut largest) = (0i64, 4096u64, 0u64);
            let mut times = Vec::new();
            let mut states = Vec::new();
            for (dt, change, live, waste, free_part, failed) in steps {
                t += dt - 3;
                if change == 0 {
                    // Grows, or starts over (a policy that releases memory), under 2^40.
                    footprint = if footprint < 1 << 36 {
                        footprint * 2 + live
                    } else {
                        4096
                    };
                }
                if change == 3 {
                    // Everything released: a zero footprint.
                    footprint = 0;
                }
                let live = live.min(footprint);
                // Sometimes full: no free bytes, and so a largest free block of 0.
                let allocated = if change == 2 {
                    footprint
                } else {
                    (live + waste).min(footprint)
                };
                let free = footprint - allocated;
                // Sometimes the largest block is kept past the free bytes: counters no policy
                // gives, which the replay still measures as they are.
                if change == 1 || (largest > free && change < 4) {
                    largest = free_part.min(free);
                }
                times.push(t);
                states.push(State {
                    live_bytes: live,
                    allocated_bytes: allocated,
                    footprint_bytes: footprint,
                    free_bytes: free,
                    free_blocks: u64::from(free > 0) + waste,
                    largest_free_bytes: largest,
                    failed,
                });
            }
            (times, states)
        })
    }

    proptest! {
        /// Runs of one bucket give the series the shadow measures event by event, however the
        /// replay cuts its stretches.
        #[test]
        fn runs_measure_as_events_do(
            (t_ns, states) in states_strategy(),
            buckets in 1usize..40,
            cut in 1usize..50,
        ) {
            let b = Bucketing::for_span(t_ns[0], *t_ns.last().unwrap(), buckets);
            let mut sb = SeriesBuilder::new(b);
            for (t, s) in t_ns.chunks(cut).zip(states.chunks(cut)) {
                feed(&mut sb, t, s);
            }
            prop_assert_eq!(sb.finish(), shadow(b, &t_ns, &states));
        }
    }
}
