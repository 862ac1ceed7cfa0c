//! Series of a trace still being written: the span doubles as times pass its end.
//!
//! A growing [`SeriesBuilder`] cuts time into buckets of a width that is a whole number of
//! nanoseconds ([`Bucketing::of_width`]), so bucket `b` starts at `t0 + b·width` exactly and
//! doubling the span (and the width) makes new bucket `k` the union of old buckets `2k` and
//! `2k + 1`. Merging two buckets' rows is exact: the extremes of the union are the extremes of
//! the halves (a bucket without events carries the state in effect, which is its neighbour's
//! last one, so only the halves with events count), its last value the later half's. The
//! series of a growing builder is therefore, bucket for bucket, the series a builder with the
//! final bucketing would have made from the same events.
//!
//! When the span doubles while the bucket in progress is odd, its partner (the bucket before
//! it) is already written: it is taken back as `pending` and merged into the bucket in
//! progress when that one is written.

use super::{Bucketing, MinMaxLast, Series, SeriesBuilder};

impl Bucketing {
    /// `buckets` buckets of `width_ns` each from `t0_ns`: a bucketing whose bucket starts are
    /// exact multiples of the width, so that doubling the span merges buckets pairwise (a
    /// series that grows with a trace still being written, [`crate::replay::LiveReplay`]).
    #[must_use]
    pub fn of_width(t0_ns: i64, width_ns: u64, buckets: usize) -> Self {
        let buckets = buckets.max(1);
        Self {
            t0_ns,
            span_ns: width_ns.max(1).saturating_mul(buckets as u64),
            buckets,
        }
    }

    /// The first `kept` buckets of a bucketing made by [`Self::of_width`] (at least one): the
    /// span a growing series has reached.
    #[must_use]
    pub fn first(self, kept: usize) -> Self {
        let width_ns = self.span_ns / self.buckets.max(1) as u64;
        Self::of_width(self.t0_ns, width_ns, kept)
    }
}

/// One bucket of a [`Series`], taken out to be merged.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Row {
    first_event: usize,
    last_event: usize,
    event_count: u64,
    ooms: u64,
    /// live, allocated, internal waste, footprint, free blocks: `(min, max, last)`.
    ints: [(u64, u64, u64); 5],
    /// fragmentation, external fragmentation: `(min, max, last)`.
    floats: [(f64, f64, f64); 2],
}

fn pop<T: Copy + Default>(m: &mut MinMaxLast<T>) -> (T, T, T) {
    (
        m.min.pop().unwrap_or_default(),
        m.max.pop().unwrap_or_default(),
        m.last.pop().unwrap_or_default(),
    )
}

fn push<T: Copy>(m: &mut MinMaxLast<T>, (min, max, last): (T, T, T)) {
    m.push(min, max, last);
}

impl Row {
    /// The bucket made of `a` and the bucket `b` right after it.
    fn merged(a: &Self, b: &Self) -> Self {
        fn ints(a: &Row, b: &Row, i: usize) -> (u64, u64, u64) {
            let (x, y) = (a.ints[i], b.ints[i]);
            match (a.event_count, b.event_count) {
                (0, _) => y,
                (_, 0) => (x.0, x.1, y.2),
                _ => (x.0.min(y.0), x.1.max(y.1), y.2),
            }
        }
        fn floats(a: &Row, b: &Row, i: usize) -> (f64, f64, f64) {
            let (x, y) = (a.floats[i], b.floats[i]);
            match (a.event_count, b.event_count) {
                (0, _) => y,
                (_, 0) => (x.0, x.1, y.2),
                _ => (x.0.min(y.0), x.1.max(y.1), y.2),
            }
        }
        Self {
            first_event: if a.event_count > 0 {
                a.first_event
            } else {
                b.first_event
            },
            last_event: b.last_event,
            event_count: a.event_count + b.event_count,
            ooms: a.ooms + b.ooms,
            ints: [0, 1, 2, 3, 4].map(|i| ints(a, b, i)),
            floats: [0, 1].map(|i| floats(a, b, i)),
        }
    }
}

impl Series {
    /// Takes the last bucket out (`None` when there is none).
    fn pop_row(&mut self) -> Option<Row> {
        let event_count = self.event_count.pop()?;
        Some(Row {
            first_event: self.first_event.pop().unwrap_or_default(),
            last_event: self.last_event.pop().unwrap_or_default(),
            event_count,
            ooms: self.ooms.pop().unwrap_or_default(),
            ints: [
                pop(&mut self.live_bytes),
                pop(&mut self.allocated_bytes),
                pop(&mut self.internal_waste_bytes),
                pop(&mut self.footprint_bytes),
                pop(&mut self.free_blocks),
            ],
            floats: [
                pop(&mut self.fragmentation),
                pop(&mut self.external_fragmentation),
            ],
        })
    }

    fn push_row(&mut self, r: &Row) {
        self.first_event.push(r.first_event);
        self.last_event.push(r.last_event);
        self.event_count.push(r.event_count);
        self.ooms.push(r.ooms);
        let [live, allocated, waste, footprint, free_blocks] = r.ints;
        push(&mut self.live_bytes, live);
        push(&mut self.allocated_bytes, allocated);
        push(&mut self.internal_waste_bytes, waste);
        push(&mut self.footprint_bytes, footprint);
        push(&mut self.free_blocks, free_blocks);
        let [fragmentation, external] = r.floats;
        push(&mut self.fragmentation, fragmentation);
        push(&mut self.external_fragmentation, external);
    }

    /// Merges the last bucket with `earlier`, the bucket(s) just before it.
    pub(super) fn merge_last_after(&mut self, earlier: Row) {
        if let Some(last) = self.pop_row() {
            self.push_row(&Row::merged(&earlier, &last));
        }
    }

    /// Merges buckets `2k` and `2k + 1` into bucket `k` (an odd last bucket stays alone).
    fn merge_pairs(&mut self) {
        let mut rows = Vec::with_capacity(self.len());
        while let Some(r) = self.pop_row() {
            rows.push(r);
        }
        rows.reverse();
        for pair in rows.chunks(2) {
            match pair {
                [a, b] => self.push_row(&Row::merged(a, b)),
                [a] => self.push_row(a),
                _ => {}
            }
        }
    }
}

impl SeriesBuilder {
    /// A growing builder (see the module docs) from `t0_ns`, `buckets` buckets of `width_ns`
    /// to start with.
    pub(crate) fn growing(t0_ns: i64, width_ns: u64, buckets: usize) -> Self {
        let mut b = Self::new(Bucketing::of_width(t0_ns, width_ns, buckets.max(2)));
        b.growing = true;
        b
    }

    /// Doubles the span until it holds time `t_ns`.
    pub(super) fn grow_to_hold(&mut self, t_ns: i64) {
        loop {
            let b = self.series.bucketing;
            if t_ns < b.start_ns(b.buckets) || b.span_ns > u64::MAX / 2 {
                return;
            }
            if self.bucket % 2 == 1
                && let Some(partner) = self.series.pop_row()
            {
                self.pending = Some(match self.pending.take() {
                    Some(p) => Row::merged(&partner, &p),
                    None => partner,
                });
            }
            self.series.merge_pairs();
            self.bucket /= 2;
            self.series.bucketing.span_ns = b.span_ns * 2;
            self.next_start_ns = self.series.bucketing.start_ns(self.bucket + 1);
        }
    }

    /// The series so far, up to the bucket in progress (written as it stands): its bucketing
    /// is cut to those buckets, so a frontend draws the span the trace has reached.
    pub(crate) fn snapshot(&self) -> Series {
        let mut b = self.clone();
        b.flush();
        b.series.bucketing = b.series.bucketing.first(b.series.len());
        b.series
    }
}
