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
pub struct ClassSeriesBuilder {
    out: ClassSeries,
    hist: ClassHistogram,
    max: ClassHistogram,
    bucket: usize,
    next_start: i64,
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
        }
    }

    /// Counts the next event.
    #[inline]
    pub fn push(&mut self, code: u8, size: u64, t: i64) {
        let bucketing = self.out.bucketing;
        if self.out.events.is_multiple_of(self.out.snapshot_every) {
            self.out.snapshots.push(self.hist);
        }
        self.out.events += 1;
        if t >= self.next_start && self.bucket + 1 < bucketing.buckets {
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
        while self.bucket < self.out.bucketing.buckets {
            self.out.flush(&self.hist, &mut self.max);
            self.bucket += 1;
        }
        self.out
    }
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
}
