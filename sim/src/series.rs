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

/// The metrics of one state, computed once per event.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Values {
    live: u64,
    allocated: u64,
    waste: u64,
    footprint: u64,
    free_blocks: u64,
    pub(crate) frag: f64,
    ext_frag: f64,
}

impl Values {
    pub(crate) fn of(c: &Counters) -> Self {
        Self {
            live: metrics::live_bytes(c),
            allocated: metrics::allocated_bytes(c),
            waste: metrics::internal_waste_bytes(c),
            footprint: metrics::footprint_bytes(c),
            free_blocks: metrics::free_block_count(c),
            frag: metrics::fragmentation(c),
            ext_frag: metrics::external_fragmentation(c),
        }
    }

    fn min(&self, o: &Self) -> Self {
        Self {
            live: self.live.min(o.live),
            allocated: self.allocated.min(o.allocated),
            waste: self.waste.min(o.waste),
            footprint: self.footprint.min(o.footprint),
            free_blocks: self.free_blocks.min(o.free_blocks),
            frag: self.frag.min(o.frag),
            ext_frag: self.ext_frag.min(o.ext_frag),
        }
    }

    fn max(&self, o: &Self) -> Self {
        Self {
            live: self.live.max(o.live),
            allocated: self.allocated.max(o.allocated),
            waste: self.waste.max(o.waste),
            footprint: self.footprint.max(o.footprint),
            free_blocks: self.free_blocks.max(o.free_blocks),
            frag: self.frag.max(o.frag),
            ext_frag: self.ext_frag.max(o.ext_frag),
        }
    }
}

/// Builds a [`Series`] one event at a time, in O(1) per event and without allocating (the
/// bucket arrays are reserved up front).
pub(crate) struct SeriesBuilder {
    series: Series,
    bucket: usize,
    next_start_ns: i64,
    count: u64,
    ooms: u64,
    first_event: usize,
    last_event: usize,
    min: Values,
    max: Values,
    last: Values,
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
            count: 0,
            ooms: 0,
            first_event: 0,
            last_event: 0,
            min: Values::default(),
            max: Values::default(),
            last: Values::default(),
        }
    }

    /// Records the state after event `event` at time `t_ns`.
    #[inline]
    pub(crate) fn push(&mut self, event: usize, t_ns: i64, v: &Values, oom: bool) {
        if t_ns >= self.next_start_ns && self.bucket + 1 < self.series.bucketing.buckets {
            self.advance_to(self.series.bucketing.bucket_of(t_ns));
        }
        if self.count == 0 {
            self.min = *v;
            self.max = *v;
            self.first_event = event;
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
        self.last = *v;
        self.last_event = event;
        self.count += 1;
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
        if self.count == 0 {
            // Nothing happened: the state in effect is the last one seen.
            self.min = self.last;
            self.max = self.last;
            self.first_event = self.last_event;
        }
        let s = &mut self.series;
        s.first_event.push(self.first_event);
        s.last_event.push(self.last_event);
        s.event_count.push(self.count);
        s.ooms.push(self.ooms);
        let (lo, hi, last) = (&self.min, &self.max, &self.last);
        s.live_bytes.push(lo.live, hi.live, last.live);
        s.allocated_bytes
            .push(lo.allocated, hi.allocated, last.allocated);
        s.internal_waste_bytes.push(lo.waste, hi.waste, last.waste);
        s.footprint_bytes
            .push(lo.footprint, hi.footprint, last.footprint);
        s.free_blocks
            .push(lo.free_blocks, hi.free_blocks, last.free_blocks);
        s.fragmentation.push(lo.frag, hi.frag, last.frag);
        s.external_fragmentation
            .push(lo.ext_frag, hi.ext_frag, last.ext_frag);
        self.count = 0;
        self.ooms = 0;
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
        sb.push(0, 0, &Values::of(&counters(10, 100)), false);
        sb.push(1, 3, &Values::of(&counters(50, 100)), true);
        sb.push(2, 9, &Values::of(&counters(20, 100)), false);
        sb.push(3, 25, &Values::of(&counters(5, 40)), false);
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
