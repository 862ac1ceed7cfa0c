//! The summary's exact scalars ([`Peaks`]): the peaks of footprint, live and allocated bytes
//! with the events that reach them, and the sum behind the mean fragmentation. Measured over
//! runs of states ([`State`]) rather than event by event, so that a run of one footprint, what
//! most runs are, costs a pass over its live bytes and a few comparisons.

use crate::metrics;
use crate::series::{RunExtremes, State};

#[derive(Clone, Debug, Default)]
pub(crate) struct Peaks {
    pub(crate) footprint_bytes: u64,
    /// The first event at the peak footprint (`None` before any event).
    pub(crate) footprint_event: Option<usize>,
    /// The most live bytes at the peak footprint: the least fragmented moment there (a
    /// division for the figure once, not one an event at the peak).
    pub(crate) live_at_peak_bytes: u64,
    pub(crate) live_bytes: u64,
    /// The first event at the peak of live bytes.
    pub(crate) live_event: Option<usize>,
    pub(crate) allocated_bytes: u64,
    frag_sum: f64,
    // States since the footprint last changed: their fragmentations are summed in one go.
    run_footprint_bytes: u64,
    run_live_sum: u128,
    run_states: u64,
}

impl Peaks {
    /// Takes in the states after events `first..first + run.len()`, whose extremes are `x`.
    pub(crate) fn absorb(&mut self, first: usize, run: &[State], x: &RunExtremes) {
        if run.is_empty() {
            return;
        }
        if x.footprint_lo == x.footprint_hi {
            self.absorb_one_footprint(first, run, x);
        } else {
            for (k, s) in run.iter().enumerate() {
                self.note_footprint(first + k, s.footprint_bytes, s.live_bytes);
                self.note_live_sum(s.footprint_bytes, u128::from(s.live_bytes), 1);
            }
        }
        // The peak's event is the first to reach it: the first of the run at the run's most.
        if (x.live_hi > self.live_bytes || self.live_event.is_none())
            && let Some(k) = run.iter().position(|s| s.live_bytes == x.live_hi)
        {
            self.live_bytes = x.live_hi;
            self.live_event = Some(first + k);
        }
        self.allocated_bytes = self.allocated_bytes.max(x.allocated_hi);
    }

    /// [`Self::absorb`]'s footprint and fragmentation part for a run of one footprint.
    fn absorb_one_footprint(&mut self, first: usize, run: &[State], x: &RunExtremes) {
        let footprint = x.footprint_lo;
        let mut live_sum = 0u128;
        for s in run {
            live_sum += u128::from(s.live_bytes);
        }
        // Every state of the run is at the run's footprint: the first may set the peak, and
        // then all of them count for the live bytes at it.
        if let Some(s) = run.first() {
            self.note_footprint(first, footprint, s.live_bytes);
        }
        if footprint == self.footprint_bytes {
            self.live_at_peak_bytes = self.live_at_peak_bytes.max(x.live_hi);
        }
        self.note_live_sum(footprint, live_sum, run.len() as u64);
    }

    #[inline]
    fn note_footprint(&mut self, event: usize, footprint: u64, live: u64) {
        if footprint > self.footprint_bytes || self.footprint_event.is_none() {
            self.footprint_bytes = footprint;
            self.footprint_event = Some(event);
            self.live_at_peak_bytes = live;
        } else if footprint == self.footprint_bytes {
            // A policy that never shrinks reaches its peak early (BFC's first region, almost
            // empty): judge the peak by its best-used moment, not its first. Fragmentation at
            // one footprint falls as live bytes grow (and so does its rounding), so the most
            // live bytes give the least fragmentation, to the bit.
            self.live_at_peak_bytes = self.live_at_peak_bytes.max(live);
        }
    }

    #[inline]
    fn note_live_sum(&mut self, footprint: u64, live_sum: u128, states: u64) {
        if footprint != self.run_footprint_bytes {
            self.frag_sum += metrics::fragmentation_sum(
                self.run_live_sum,
                self.run_states,
                self.run_footprint_bytes,
            );
            self.run_footprint_bytes = footprint;
            self.run_live_sum = 0;
            self.run_states = 0;
        }
        self.run_live_sum += live_sum;
        self.run_states += states;
    }

    /// The sum of every state's fragmentation so far.
    pub(crate) fn fragmentation_sum(&self) -> f64 {
        self.frag_sum
            + metrics::fragmentation_sum(
                self.run_live_sum,
                self.run_states,
                self.run_footprint_bytes,
            )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::series::{Bucketing, SeriesBuilder};
    use proptest::prelude::*;

    /// The summary's scalars as the replay measured them before runs, event by event:
    /// (peak footprint, its event, live bytes at it, peak live, its event, peak allocated,
    /// fragmentation sum). The fragmentation sum is grouped as it was, one term for each stretch
    /// of states of one footprint, so that its bits can be compared.
    pub(crate) type Scalars = (u64, Option<usize>, u64, u64, Option<usize>, u64, f64);

    pub(crate) fn shadow(states: &[State]) -> Scalars {
        let (mut fp, mut fp_event, mut live_at) = (0, None, 0);
        let (mut live, mut live_event, mut allocated) = (0, None, 0);
        let (mut frag, mut run_fp, mut run_sum, mut run_states) = (0.0, 0, 0u128, 0);
        for (i, s) in states.iter().enumerate() {
            if s.footprint_bytes > fp || fp_event.is_none() {
                (fp, fp_event, live_at) = (s.footprint_bytes, Some(i), s.live_bytes);
            } else if s.footprint_bytes == fp {
                live_at = live_at.max(s.live_bytes);
            }
            if s.live_bytes > live || live_event.is_none() {
                (live, live_event) = (s.live_bytes, Some(i));
            }
            allocated = allocated.max(s.allocated_bytes);
            if s.footprint_bytes != run_fp {
                frag += metrics::fragmentation_sum(run_sum, run_states, run_fp);
                (run_fp, run_sum, run_states) = (s.footprint_bytes, 0, 0);
            }
            run_sum += u128::from(s.live_bytes);
            run_states += 1;
        }
        frag += metrics::fragmentation_sum(run_sum, run_states, run_fp);
        (fp, fp_event, live_at, live, live_event, allocated, frag)
    }

    /// `peaks`' scalars, in [`shadow`]'s order.
    pub(crate) fn scalars(peaks: &Peaks) -> Scalars {
        (
            peaks.footprint_bytes,
            peaks.footprint_event,
            peaks.live_at_peak_bytes,
            peaks.live_bytes,
            peaks.live_event,
            peaks.allocated_bytes,
            peaks.fragmentation_sum(),
        )
    }

    proptest! {
        /// Runs of states, as the replay cuts them, give the scalars the shadow measures event
        /// by event, the fragmentation sum to the bit.
        #[test]
        fn runs_measure_as_events_do(
            steps in prop::collection::vec((0u64..6, 0u64..600, 0u64..8), 1..400),
            cut in 1usize..60,
            buckets in 1usize..30,
        ) {
            let mut footprint = 0u64;
            let states: Vec<State> = steps
                .iter()
                .map(|&(change, live, waste)| {
                    // Footprints that hold for a while, grow, and sometimes shrink.
                    match change {
                        0 => footprint += 512,
                        1 => footprint = footprint.saturating_sub(256),
                        _ => {}
                    }
                    let live = live.min(footprint);
                    State {
                        live_bytes: live,
                        allocated_bytes: (live + waste).min(footprint),
                        footprint_bytes: footprint,
                        ..State::default()
                    }
                })
                .collect();
            let t_ns: Vec<i64> = (0..states.len() as i64).collect();
            let mut series = SeriesBuilder::new(Bucketing::for_span(0, t_ns.len() as i64, buckets));
            let mut peaks = Peaks::default();
            for (k, (t, s)) in t_ns.chunks(cut).zip(states.chunks(cut)).enumerate() {
                let mut from = 0;
                while from < t.len() {
                    let to = series.bucket_run_end(t, from);
                    let x = series.absorb(&s[from..to]);
                    peaks.absorb(k * cut + from, &s[from..to], &x);
                    from = to;
                }
            }
            let (got, want) = (scalars(&peaks), shadow(&states));
            prop_assert_eq!(got.6.to_bits(), want.6.to_bits(), "{} vs {}", got.6, want.6);
            prop_assert_eq!(got, want);
        }
    }
}
