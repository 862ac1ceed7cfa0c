//! Sampled stacks: the weights that turn a trace recorded with `record --stack-sample R`
//! into unbiased figures by site. Every reader of stacks per site (`sites`, `flamegraph`,
//! `leaks`, `diff`, `export`, the explorers' sites panel, the Python package) weighs its
//! allocations here, through [`EventSites::alloc_weight`](super::site_stats::EventSites).
//!
//! The tracer walks the stack of an allocation of `s` bytes when a point of a Poisson process
//! of rate `1/R` over the bytes its thread allocates falls in it: with probability
//! `p(s) = 1 - exp(-s/R)`, independently of the other allocations (tcmalloc's and heapprofd's
//! sampling); an allocation of R bytes or more it always walks (`p = 1`), leaving it out of
//! the process. A sampled allocation therefore stands for `1/p(s)` allocations and `s/p(s)`
//! bytes (the Horvitz-Thompson estimator): summed over a site's sampled allocations, the
//! expected value is the site's true count and bytes. Allocations not sampled carry no stack
//! and weigh nothing (their bytes are in their site's estimate through the sampled ones).
//! The events themselves are all in the trace, so totals, peaks and replays stay exact.
//!
//! The variance of a site's byte estimate is `sum over its allocations of s^2 (1-p)/p`
//! ([`StackSampling::bytes_variance`]): small allocations (`s << R`) contribute about
//! `s * R` each, large ones (`s >> R`) nearly nothing, being always sampled.

/// How a trace's stacks were sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackSampling {
    /// The mean gap between sample points, in bytes (`R`).
    pub mean_bytes: u64,
}

/// The weight of one allocation in figures by site: how many allocations and bytes it stands
/// for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Weight {
    pub count: f64,
    pub bytes: f64,
}

impl Weight {
    /// An allocation of a trace whose stacks were not sampled: itself.
    #[must_use]
    pub fn exact(size_bytes: u64) -> Self {
        Self {
            count: 1.0,
            bytes: size_bytes as f64,
        }
    }

    /// Nothing (an allocation not sampled).
    pub const NONE: Self = Self {
        count: 0.0,
        bytes: 0.0,
    };

    /// The bytes, rounded to whole bytes (what integer figures add up).
    #[must_use]
    pub fn whole_bytes(self) -> u64 {
        self.bytes.round() as u64
    }
}

impl StackSampling {
    /// The sampling a trace's META value `stack_sample_bytes` names (`None` for a trace
    /// whose every allocation has its stack, or a value that is not a positive number).
    #[must_use]
    pub fn from_meta(value: Option<&str>) -> Option<Self> {
        let mean_bytes = value?.trim().parse::<u64>().ok().filter(|&b| b > 0)?;
        Some(Self { mean_bytes })
    }

    /// The probability that an allocation of `size_bytes` is sampled: `1 - exp(-s/R)`, and 1
    /// from R bytes on (the tracer's `sample.rs`).
    #[must_use]
    pub fn probability(self, size_bytes: u64) -> f64 {
        if size_bytes >= self.mean_bytes {
            return 1.0;
        }
        -(-(size_bytes as f64) / self.mean_bytes as f64).exp_m1()
    }

    /// What a sampled allocation of `size_bytes` stands for (itself when it cannot have been
    /// sampled: size 0).
    #[must_use]
    pub fn weight(self, size_bytes: u64) -> Weight {
        let p = self.probability(size_bytes);
        if p <= 0.0 {
            return Weight::exact(size_bytes);
        }
        Weight {
            count: 1.0 / p,
            bytes: size_bytes as f64 / p,
        }
    }

    /// The variance that one allocation of `size_bytes` adds to its site's byte estimate:
    /// `s^2 (1-p)/p`.
    #[must_use]
    pub fn bytes_variance(self, size_bytes: u64) -> f64 {
        let p = self.probability(size_bytes);
        if p <= 0.0 {
            return 0.0;
        }
        let s = size_bytes as f64;
        s * s * (1.0 - p) / p
    }

    /// What reports say under figures by site.
    #[must_use]
    pub fn note(self) -> String {
        format!(
            "figures by site are estimates from sampled stacks (one stack every {} allocated \
             on average); the totals, peaks and replays are exact",
            human_bytes(self.mean_bytes)
        )
    }
}

/// `512 KiB`, `1 MiB`, or bytes.
fn human_bytes(b: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{} {unit}", b >> shift);
        }
    }
    format!("{b} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_invert_the_sampling_probability() {
        let s = StackSampling {
            mean_bytes: 512 << 10,
        };
        // 1 KiB at 512 KiB: p = 1 - exp(-1/512), about 1/512.5.
        let w = s.weight(1024);
        assert!((w.count - 512.5).abs() < 0.01, "{w:?}");
        assert!((w.bytes - 512.5 * 1024.0).abs() < 10.0, "{w:?}");
        // 256 KiB: p = 1 - exp(-1/2).
        let w = s.weight(256 << 10);
        assert!((w.count - 2.541_494).abs() < 1e-5, "{w:?}");
        // From R on, always sampled: weight 1, no variance.
        assert_eq!(s.weight(4 << 20), Weight::exact(4 << 20));
        assert_eq!(s.weight(512 << 10), Weight::exact(512 << 10));
        assert_eq!(s.bytes_variance(4 << 20), 0.0);
        assert_eq!(s.weight(0), Weight::exact(0));
        assert_eq!(s.bytes_variance(0), 0.0);
        // Small allocations: variance about s * R each.
        let v = s.bytes_variance(64);
        assert!((v / (64.0 * 512.0 * 1024.0) - 1.0).abs() < 0.01, "{v}");
    }

    #[test]
    fn meta_values_name_the_mean_interval() {
        assert_eq!(
            StackSampling::from_meta(Some("524288")),
            Some(StackSampling {
                mean_bytes: 524_288
            })
        );
        assert_eq!(StackSampling::from_meta(Some("0")), None);
        assert_eq!(StackSampling::from_meta(Some("x")), None);
        assert_eq!(StackSampling::from_meta(None), None);
        let note = StackSampling {
            mean_bytes: 512 << 10,
        }
        .note();
        assert!(note.contains("512 KiB"), "{note}");
    }
}
