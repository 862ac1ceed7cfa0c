//! Live allocations per size class over time. Policy-independent: it reads only the trace.
//!
//! The class of a request is [`size_class`] (the bit length of its size). For every time bucket
//! (the same [`Bucketing`] as the replay's [`crate::series::Series`]) and every class, the
//! [`ClassSeries`] keeps the live count and the live bytes after the bucket's last event and
//! their maxima within the bucket. Every allocation of the trace counts, including those a
//! policy under a limit failed to serve (they are live in the traced program).
//!
//! [`ClassSeries::histogram_at`] gives the exact histogram after any event: histograms are
//! snapshotted every `snapshot_every` events (about 1 KiB each) and the seek replays at most
//! that many events.

use crate::replay::SeekError;
use crate::series::Bucketing;
use crate::trace::{EventKind, NUM_SIZE_CLASSES, TraceView, size_class};

/// Live count and live bytes per size class at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassHistogram {
    /// Live allocations per class (index = class, 0..=64).
    pub live_count: [u64; NUM_SIZE_CLASSES],
    /// Sum of the requested sizes of live allocations per class.
    pub live_bytes: [u64; NUM_SIZE_CLASSES],
}

impl Default for ClassHistogram {
    fn default() -> Self {
        Self {
            live_count: [0; NUM_SIZE_CLASSES],
            live_bytes: [0; NUM_SIZE_CLASSES],
        }
    }
}

impl ClassHistogram {
    /// Applies event `kind` of `size_bytes`; returns the class it touched, if any.
    #[inline]
    fn apply(&mut self, code: u8, size_bytes: u64) -> Option<usize> {
        let class = usize::from(size_class(size_bytes));
        let (count, bytes) = (
            self.live_count.get_mut(class)?,
            self.live_bytes.get_mut(class)?,
        );
        if code == EventKind::Alloc as u8 {
            *count += 1;
            *bytes += size_bytes;
        } else if code == EventKind::Free as u8 {
            *count = count.saturating_sub(1);
            *bytes = bytes.saturating_sub(size_bytes);
        } else {
            return None;
        }
        Some(class)
    }
}

/// Per-bucket, per-class live counts and bytes of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassSeries {
    pub bucketing: Bucketing,
    /// `[bucket * NUM_SIZE_CLASSES + class]`: live count after the bucket's last event.
    pub live_count_last: Vec<u64>,
    /// `[bucket * NUM_SIZE_CLASSES + class]`: highest live count within the bucket.
    pub live_count_max: Vec<u64>,
    /// `[bucket * NUM_SIZE_CLASSES + class]`: live bytes after the bucket's last event.
    pub live_bytes_last: Vec<u64>,
    /// `[bucket * NUM_SIZE_CLASSES + class]`: highest live bytes within the bucket.
    pub live_bytes_max: Vec<u64>,
    snapshot_every: usize,
    /// `snapshots[k]`: the histogram before event `k * snapshot_every`.
    snapshots: Vec<ClassHistogram>,
    events: usize,
}

impl ClassSeries {
    /// Scans the trace once. `snapshot_every` (at least 1) bounds the cost of
    /// [`Self::histogram_at`].
    #[must_use]
    pub fn build(trace: &TraceView<'_>, bucketing: Bucketing, snapshot_every: usize) -> Self {
        let mut b = ClassSeriesBuilder::new(bucketing, snapshot_every);
        b.out
            .snapshots
            .reserve(trace.len() / b.out.snapshot_every + 1);
        let events = trace.kind.iter().zip(trace.size_bytes).zip(trace.t_ns);
        for ((&code, &size), &t) in events {
            b.push(code, size, t);
        }
        b.finish()
    }

    fn flush(&mut self, hist: &ClassHistogram, max: &mut ClassHistogram) {
        self.live_count_last.extend_from_slice(&hist.live_count);
        self.live_bytes_last.extend_from_slice(&hist.live_bytes);
        self.live_count_max.extend_from_slice(&max.live_count);
        self.live_bytes_max.extend_from_slice(&max.live_bytes);
        // The next bucket's maxima start from the state in effect when it begins.
        *max = *hist;
    }

    /// Number of buckets.
    #[must_use]
    pub fn buckets(&self) -> usize {
        self.bucketing.buckets
    }

    fn row(v: &[u64], bucket: usize) -> Option<&[u64]> {
        let start = bucket.checked_mul(NUM_SIZE_CLASSES)?;
        v.get(start..start + NUM_SIZE_CLASSES)
    }

    /// Live count per class after the last event of `bucket`.
    #[must_use]
    pub fn live_count_at_end(&self, bucket: usize) -> Option<&[u64]> {
        Self::row(&self.live_count_last, bucket)
    }

    /// Highest live count per class within `bucket`.
    #[must_use]
    pub fn live_count_peak(&self, bucket: usize) -> Option<&[u64]> {
        Self::row(&self.live_count_max, bucket)
    }

    /// Live bytes per class after the last event of `bucket`.
    #[must_use]
    pub fn live_bytes_at_end(&self, bucket: usize) -> Option<&[u64]> {
        Self::row(&self.live_bytes_last, bucket)
    }

    /// Highest live bytes per class within `bucket`.
    #[must_use]
    pub fn live_bytes_peak(&self, bucket: usize) -> Option<&[u64]> {
        Self::row(&self.live_bytes_max, bucket)
    }

    /// The histogram just after `event`, replaying at most `snapshot_every` events.
    ///
    /// # Errors
    /// When `event` is past the end or `trace` is not the trace this series was built from.
    pub fn histogram_at(
        &self,
        trace: &TraceView<'_>,
        event: usize,
    ) -> Result<ClassHistogram, SeekError> {
        if trace.len() != self.events {
            return Err(SeekError::TraceMismatch {
                expected: self.events,
                got: trace.len(),
            });
        }
        if event >= self.events {
            return Err(SeekError::OutOfRange {
                event,
                events: self.events,
            });
        }
        let k = event / self.snapshot_every;
        let mut hist = self.snapshots.get(k).copied().unwrap_or_default();
        let from = k * self.snapshot_every;
        let kinds = trace.kind.get(from..=event).unwrap_or_default();
        let sizes = trace.size_bytes.get(from..=event).unwrap_or_default();
        for (&code, &size) in kinds.iter().zip(sizes) {
            hist.apply(code, size);
        }
        Ok(hist)
    }
}

/// Builds a [`ClassSeries`] from events pushed in order (a trace streamed from its file: with
/// a `snapshot_every` as large as the trace, memory stays constant).
///
/// A growing builder ([`Self::growing`]) doubles its span to hold later times, merging its
/// buckets pairwise, as a growing [`crate::series::Series`] does: a bucket's maxima start from
/// the state in effect when it begins, so the maxima of two neighbours' union are the larger
/// of theirs, and its last values the later one's.
#[derive(Clone)]
pub struct ClassSeriesBuilder {
    out: ClassSeries,
    hist: ClassHistogram,
    max: ClassHistogram,
    bucket: usize,
    next_start: i64,
    growing: bool,
}

impl ClassSeriesBuilder {
    /// A builder for `bucketing`'s buckets, snapshotting every `snapshot_every` events.
    #[must_use]
    pub fn new(bucketing: Bucketing, snapshot_every: usize) -> Self {
        let cells = bucketing.buckets * NUM_SIZE_CLASSES;
        Self {
            out: ClassSeries {
                bucketing,
                live_count_last: Vec::with_capacity(cells),
                live_count_max: Vec::with_capacity(cells),
                live_bytes_last: Vec::with_capacity(cells),
                live_bytes_max: Vec::with_capacity(cells),
                snapshot_every: snapshot_every.max(1),
                snapshots: Vec::new(),
                events: 0,
            },
            hist: ClassHistogram::default(),
            max: ClassHistogram::default(),
            bucket: 0,
            next_start: bucketing.start_ns(1),
            growing: false,
        }
    }

    /// A growing builder from `t0_ns`, `buckets` buckets of `width_ns` to start with (see
    /// [`Bucketing::of_width`]).
    #[must_use]
    pub fn growing(t0_ns: i64, width_ns: u64, buckets: usize, snapshot_every: usize) -> Self {
        let mut b = Self::new(
            Bucketing::of_width(t0_ns, width_ns, buckets.max(2)),
            snapshot_every,
        );
        b.growing = true;
        b
    }

    /// Events pushed so far.
    #[must_use]
    pub fn events(&self) -> usize {
        self.out.events
    }

    /// Doubles the span until it holds `t_ns`.
    fn grow_to_hold(&mut self, t_ns: i64) {
        loop {
            let b = self.out.bucketing;
            if t_ns < b.start_ns(b.buckets) || b.span_ns > u64::MAX / 2 {
                return;
            }
            if self.bucket % 2 == 1 {
                // The partner of the bucket in progress is written: take its maxima back.
                let at = (self.bucket - 1) * NUM_SIZE_CLASSES;
                for (m, v) in self
                    .max
                    .live_count
                    .iter_mut()
                    .zip(self.out.live_count_max.get(at..).unwrap_or_default())
                {
                    *m = (*m).max(*v);
                }
                for (m, v) in self
                    .max
                    .live_bytes
                    .iter_mut()
                    .zip(self.out.live_bytes_max.get(at..).unwrap_or_default())
                {
                    *m = (*m).max(*v);
                }
                for v in [
                    &mut self.out.live_count_last,
                    &mut self.out.live_count_max,
                    &mut self.out.live_bytes_last,
                    &mut self.out.live_bytes_max,
                ] {
                    v.truncate(at);
                }
            }
            let o = &mut self.out;
            merge_pairs(&mut o.live_count_last, |_, b| b);
            merge_pairs(&mut o.live_bytes_last, |_, b| b);
            merge_pairs(&mut o.live_count_max, u64::max);
            merge_pairs(&mut o.live_bytes_max, u64::max);
            self.bucket /= 2;
            self.out.bucketing.span_ns = b.span_ns * 2;
            self.next_start = self.out.bucketing.start_ns(self.bucket + 1);
        }
    }

    /// The series so far, up to the bucket in progress (as it stands), its bucketing cut to
    /// those buckets; of a growing builder.
    #[must_use]
    pub fn snapshot(&self) -> ClassSeries {
        let mut b = self.clone();
        b.out.flush(&b.hist, &mut b.max);
        let kept = b.out.live_count_last.len() / NUM_SIZE_CLASSES;
        b.out.bucketing = b.out.bucketing.first(kept);
        b.out
    }

    /// Counts the next event.
    #[inline]
    pub fn push(&mut self, code: u8, size: u64, t: i64) {
        if self.out.events.is_multiple_of(self.out.snapshot_every) {
            self.out.snapshots.push(self.hist);
        }
        self.out.events += 1;
        if self.growing && t >= self.next_start {
            self.grow_to_hold(t);
        }
        let bucketing = self.out.bucketing;
        if t >= self.next_start && (self.growing || self.bucket + 1 < bucketing.buckets) {
            let target = bucketing.bucket_of(t);
            while self.bucket < target {
                self.out.flush(&self.hist, &mut self.max);
                self.bucket += 1;
            }
            self.next_start = bucketing.start_ns(self.bucket + 1);
        }
        if let Some(class) = self.hist.apply(code, size)
            && let (Some(m), Some(&c), Some(mb), Some(&b)) = (
                self.max.live_count.get_mut(class),
                self.hist.live_count.get(class),
                self.max.live_bytes.get_mut(class),
                self.hist.live_bytes.get(class),
            )
        {
            *m = (*m).max(c);
            *mb = (*mb).max(b);
        }
    }

    /// The series of the events pushed.
    #[must_use]
    pub fn finish(mut self) -> ClassSeries {
        if self.growing {
            return self.snapshot();
        }
        while self.bucket < self.out.bucketing.buckets {
            self.out.flush(&self.hist, &mut self.max);
            self.bucket += 1;
        }
        self.out
    }
}

/// Merges rows `2k` and `2k + 1` (of [`NUM_SIZE_CLASSES`] cells) of `v` into row `k` with
/// `f(earlier, later)`; an odd last row stays as it is.
fn merge_pairs(v: &mut Vec<u64>, f: impl Fn(u64, u64) -> u64) {
    let rows = v.len() / NUM_SIZE_CLASSES;
    for k in 0..rows.div_ceil(2) {
        for c in 0..NUM_SIZE_CLASSES {
            let a = v.get(2 * k * NUM_SIZE_CLASSES + c).copied().unwrap_or(0);
            let merged = match v.get((2 * k + 1) * NUM_SIZE_CLASSES + c) {
                Some(&b) => f(a, b),
                None => a,
            };
            if let Some(cell) = v.get_mut(k * NUM_SIZE_CLASSES + c) {
                *cell = merged;
            }
        }
    }
    v.truncate(rows.div_ceil(2) * NUM_SIZE_CLASSES);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::OwnedTrace;

    #[test]
    fn counts_per_class_per_bucket() {
        let mut t = OwnedTrace::new();
        let a = t.alloc(0, 5); // class 3
        let b = t.alloc(1, 6); // class 3
        t.free(2, a);
        t.alloc(10, 1000); // class 10, bucket 1
        t.free(11, b);
        let view = t.view().unwrap();
        let bucketing = Bucketing::for_trace(&view, 2);
        let cs = ClassSeries::build(&view, bucketing, 2);
        assert_eq!(cs.live_count_peak(0).unwrap()[3], 2);
        assert_eq!(cs.live_count_at_end(0).unwrap()[3], 1);
        assert_eq!(cs.live_bytes_peak(0).unwrap()[3], 11);
        assert_eq!(cs.live_bytes_at_end(0).unwrap()[3], 6);
        assert_eq!(cs.live_count_at_end(1).unwrap()[3], 0);
        assert_eq!(cs.live_count_peak(1).unwrap()[3], 1);
        assert_eq!(cs.live_bytes_at_end(1).unwrap()[10], 1000);
        assert!(cs.live_count_at_end(2).is_none());

        let h = cs.histogram_at(&view, 2).unwrap();
        assert_eq!(h.live_count[3], 1);
        assert_eq!(h.live_bytes[3], 6);
        let h = cs.histogram_at(&view, 4).unwrap();
        assert_eq!(h.live_count[10], 1);
        assert_eq!(h.live_count[3], 0);
        assert!(matches!(
            cs.histogram_at(&view, 5),
            Err(SeekError::OutOfRange { .. })
        ));
    }

    #[test]
    fn a_growing_series_equals_one_built_with_its_final_bucketing() {
        let mut t = OwnedTrace::new();
        let (mut time, mut x, mut live) = (100_i64, 7_u64, Vec::new());
        for i in 0..30_000_u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            time += (x % 9_000) as i64 * if i.is_multiple_of(211) { 300 } else { 1 };
            if x.is_multiple_of(3) && !live.is_empty() {
                t.free(time, live.swap_remove(x as usize % live.len()));
            } else {
                live.push(t.alloc(time, 1 + x % 70_000));
            }
        }
        let view = t.view().unwrap();
        let mut grown = ClassSeriesBuilder::growing(100, 1024, 2048, 4096);
        for (k, ((&code, &size), &t)) in view
            .kind
            .iter()
            .zip(view.size_bytes)
            .zip(view.t_ns)
            .enumerate()
        {
            grown.push(code, size, t);
            // Snapshots along the way leave the builder as it was.
            if k % 7_919 == 0 {
                let _ = grown.snapshot();
            }
        }
        let got = grown.snapshot();
        let b = got.bucketing;
        assert!(b.buckets > 1024 && b.buckets <= 2048, "{b:?}");
        let full = Bucketing::of_width(b.t0_ns, b.span_ns / b.buckets as u64, 2048);
        let want = ClassSeries::build(&view, full, 4096);
        let cells = b.buckets * NUM_SIZE_CLASSES;
        assert_eq!(got.live_count_last, want.live_count_last[..cells]);
        assert_eq!(got.live_count_max, want.live_count_max[..cells]);
        assert_eq!(got.live_bytes_last, want.live_bytes_last[..cells]);
        assert_eq!(got.live_bytes_max, want.live_bytes_max[..cells]);
        assert_eq!(
            got.histogram_at(&view, 12_345),
            want.histogram_at(&view, 12_345)
        );
    }
}
