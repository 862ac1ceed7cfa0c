//! Metric series downsampled into time buckets, so a chart of any width shows every peak.
//!
//! [`Bucketing`] cuts the trace's time range `[t_first, t_last]` into `buckets` equal spans;
//! bucket `b` covers `[start_ns(b), start_ns(b + 1))`. For every bucket and every metric the
//! [`Series`] keeps the minimum and the maximum over the states after each event of the bucket,
//! and the value after its last event, plus the bucket's first and last event indices. A bucket
//! with no event carries the state in effect (the previous bucket's last value) and has
//! `event_count == 0`.

use crate::metrics;
use crate::policy::Counters;
use crate::trace::TraceView;

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
        let b = u128::from(offset) * self.buckets as u128 / u128::from(self.span_ns);
        usize::try_from(b).map_or(self.buckets - 1, |b| b.min(self.buckets - 1))
    }

    /// First time of bucket `b` (`b == buckets` gives the end of the last bucket).
    #[must_use]
    pub fn start_ns(&self, b: usize) -> i64 {
        let num = b as u128 * u128::from(self.span_ns);
        let offset = num.div_ceil(self.buckets as u128);
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        self.t0_ns.saturating_add(offset)
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

/// The integer metrics of a state, in a fixed order, for branch-free min/max.
const LIVE: usize = 0;
const ALLOCATED: usize = 1;
const WASTE: usize = 2;
const FOOTPRINT: usize = 3;
const FREE_BLOCKS: usize = 4;
const INTS: usize = 5;

#[inline]
fn ints_of(c: &Counters) -> [u64; INTS] {
    let mut v = [0; INTS];
    v[LIVE] = metrics::live_bytes(c);
    v[ALLOCATED] = metrics::allocated_bytes(c);
    v[WASTE] = metrics::internal_waste_bytes(c);
    v[FOOTPRINT] = metrics::footprint_bytes(c);
    v[FREE_BLOCKS] = metrics::free_block_count(c);
    v
}

/// Builds a [`Series`] one event at a time, in O(1) per event and without allocating (the
/// bucket arrays are reserved up front). Fragmentations are tracked as integer ratios and turned
/// into floats once per bucket.
pub(crate) struct SeriesBuilder {
    series: Series,
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
    last: Counters,
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
            last: Counters::default(),
        }
    }

    /// Records the state `c` after the next event, which happened at `t_ns`. Always inlined into
    /// the replay loop, where the counters are still in registers: as a call it cost the
    /// python trace's `compare` replay of bfc 29.8 instead of 33.9 M events/s.
    #[inline(always)]
    pub(crate) fn push(&mut self, t_ns: i64, c: &Counters, oom: bool) {
        if t_ns >= self.next_start_ns && self.bucket + 1 < self.series.bucketing.buckets {
            self.advance_to(self.series.bucketing.bucket_of(t_ns));
        }
        let v = ints_of(c);
        for ((lo, hi), x) in self.min.iter_mut().zip(&mut self.max).zip(v) {
            *lo = (*lo).min(x);
            *hi = (*hi).max(x);
        }
        let live = Ratio::new(c.live_bytes, c.footprint_bytes);
        if live.less(self.live_lo) {
            self.live_lo = live;
        }
        if self.live_hi.less(live) {
            self.live_hi = live;
        }
        let largest = Ratio::new(c.largest_free_bytes, c.free_bytes);
        if largest.less(self.largest_lo) {
            self.largest_lo = largest;
        }
        if self.largest_hi.less(largest) {
            self.largest_hi = largest;
        }
        self.last = *c;
        self.count += 1;
        self.events += 1;
        self.ooms += u64::from(oom);
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
        let last_ints = ints_of(&self.last);
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
mod tests {
    use super::*;
    use crate::trace::OwnedTrace;

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
    }

    fn counters(live: u64, footprint: u64) -> Counters {
        Counters {
            live_bytes: live,
            allocated_bytes: live,
            footprint_bytes: footprint,
            ..Counters::default()
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
        sb.push(0, &counters(10, 100), false);
        sb.push(3, &counters(50, 100), true);
        sb.push(9, &counters(20, 100), false);
        sb.push(25, &counters(5, 40), false);
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
}
