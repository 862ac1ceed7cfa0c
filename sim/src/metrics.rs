//! The metrics allocview measures every policy by, as pure functions of [`Counters`].
//!
//! One place for each formula; the replay engine, the series and the frontends all call these.
//!
//! | metric | formula |
//! |---|---|
//! | live bytes | sum of the requested sizes of live allocations |
//! | allocated bytes | sum of the bytes the policy reserved for live allocations (after rounding, headers, padding) |
//! | internal waste | allocated − live |
//! | footprint bytes | bytes the policy holds from the system (regions, heap top, top-level blocks, plan size) |
//! | fragmentation | 1 − live / footprint (0 when the footprint is 0) |
//! | external fragmentation | 1 − largest free block / free bytes (0 when nothing is free), TensorFlow profiler's definition |
//! | free blocks | number of free, reusable blocks (holes) |

use crate::heap::Counters;

/// Sum of the requested sizes of live allocations.
#[must_use]
pub fn live_bytes(c: &Counters) -> u64 {
    c.live_bytes
}

/// Bytes the policy reserved for live allocations, after its rounding.
#[must_use]
pub fn allocated_bytes(c: &Counters) -> u64 {
    c.allocated_bytes
}

/// Internal waste: `allocated − live` (rounding and headers charged to live allocations).
#[must_use]
pub fn internal_waste_bytes(c: &Counters) -> u64 {
    c.allocated_bytes.saturating_sub(c.live_bytes)
}

/// Bytes the policy holds from the system.
#[must_use]
pub fn footprint_bytes(c: &Counters) -> u64 {
    c.footprint_bytes
}

/// `1 − live / footprint`: the share of the footprint that does not hold requested bytes
/// (internal waste, holes, dead space, untouched reserve). 0 when the footprint is 0.
#[must_use]
pub fn fragmentation(c: &Counters) -> f64 {
    if c.footprint_bytes == 0 {
        0.0
    } else {
        1.0 - c.live_bytes as f64 / c.footprint_bytes as f64
    }
}

/// Sum of [`fragmentation`] over `states` states that share one `footprint_bytes` and whose live
/// bytes add up to `live_sum`: `states − live_sum / footprint` (0 when the footprint is 0). Lets
/// the replay average fragmentation with one division per footprint change instead of one per
/// event.
#[must_use]
pub fn fragmentation_sum(live_sum: u128, states: u64, footprint_bytes: u64) -> f64 {
    if footprint_bytes == 0 {
        0.0
    } else {
        states as f64 - live_sum as f64 / footprint_bytes as f64
    }
}

/// `1 − largest free block / free bytes` (TensorFlow profiler): 0 when all free space is one
/// block, close to 1 when it is split into many small holes. 0 when nothing is free.
#[must_use]
pub fn external_fragmentation(c: &Counters) -> f64 {
    if c.free_bytes == 0 {
        0.0
    } else {
        1.0 - c.largest_free_bytes as f64 / c.free_bytes as f64
    }
}

/// Number of free blocks (holes).
#[must_use]
pub fn free_block_count(c: &Counters) -> u64 {
    c.free_blocks
}

/// Every metric, for frontends that list or plot them generically.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Metric {
    LiveBytes,
    AllocatedBytes,
    InternalWasteBytes,
    FootprintBytes,
    Fragmentation,
    ExternalFragmentation,
    FreeBlocks,
}

impl Metric {
    /// All metrics, in display order.
    pub const ALL: [Self; 7] = [
        Self::LiveBytes,
        Self::AllocatedBytes,
        Self::InternalWasteBytes,
        Self::FootprintBytes,
        Self::Fragmentation,
        Self::ExternalFragmentation,
        Self::FreeBlocks,
    ];

    /// Stable snake_case name for JSON and CSV columns.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::LiveBytes => "live_bytes",
            Self::AllocatedBytes => "allocated_bytes",
            Self::InternalWasteBytes => "internal_waste_bytes",
            Self::FootprintBytes => "footprint_bytes",
            Self::Fragmentation => "fragmentation",
            Self::ExternalFragmentation => "external_fragmentation",
            Self::FreeBlocks => "free_blocks",
        }
    }

    /// True for the metrics measured in bytes (the others are ratios or counts).
    #[must_use]
    pub fn is_bytes(self) -> bool {
        matches!(
            self,
            Self::LiveBytes
                | Self::AllocatedBytes
                | Self::InternalWasteBytes
                | Self::FootprintBytes
        )
    }

    /// The metric's value for `c`, as a float.
    #[must_use]
    pub fn value(self, c: &Counters) -> f64 {
        match self {
            Self::LiveBytes => live_bytes(c) as f64,
            Self::AllocatedBytes => allocated_bytes(c) as f64,
            Self::InternalWasteBytes => internal_waste_bytes(c) as f64,
            Self::FootprintBytes => footprint_bytes(c) as f64,
            Self::Fragmentation => fragmentation(c),
            Self::ExternalFragmentation => external_fragmentation(c),
            Self::FreeBlocks => free_block_count(c) as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Counters {
        // 3 live allocations asking 1000 B in total, rounded to 1024 B, inside a 4096 B heap
        // whose 3072 free bytes are split into holes of 2048, 768 and 256 B.
        Counters {
            live_allocs: 3,
            live_bytes: 1000,
            allocated_bytes: 1024,
            footprint_bytes: 4096,
            free_bytes: 3072,
            free_blocks: 3,
            largest_free_bytes: 2048,
        }
    }

    #[test]
    fn byte_metrics() {
        let c = sample();
        assert_eq!(live_bytes(&c), 1000);
        assert_eq!(allocated_bytes(&c), 1024);
        assert_eq!(internal_waste_bytes(&c), 24);
        assert_eq!(footprint_bytes(&c), 4096);
        assert_eq!(free_block_count(&c), 3);
    }

    #[test]
    fn fragmentation_is_one_minus_live_over_footprint() {
        let c = sample();
        assert!((fragmentation(&c) - (1.0 - 1000.0 / 4096.0)).abs() < 1e-12);
        let full = Counters {
            live_bytes: 4096,
            ..c
        };
        assert_eq!(fragmentation(&full), 0.0);
        assert_eq!(fragmentation(&Counters::default()), 0.0);
    }

    #[test]
    fn fragmentation_sum_equals_the_sum_of_fragmentations() {
        let states = [(100u64, 400u64), (300, 400), (0, 400)];
        let by_state: f64 = states
            .iter()
            .map(|&(live, fp)| {
                fragmentation(&Counters {
                    live_bytes: live,
                    footprint_bytes: fp,
                    ..Counters::default()
                })
            })
            .sum();
        // 0.75 + 0.25 + 1 = 2
        assert!((fragmentation_sum(400, 3, 400) - 2.0).abs() < 1e-12);
        assert!((by_state - 2.0).abs() < 1e-12);
        assert_eq!(fragmentation_sum(0, 5, 0), 0.0);
    }

    #[test]
    fn external_fragmentation_is_tensorflows() {
        let c = sample();
        // 1 - 2048/3072 = 1/3
        assert!((external_fragmentation(&c) - 1.0 / 3.0).abs() < 1e-12);
        let one_hole = Counters {
            free_blocks: 1,
            largest_free_bytes: 3072,
            ..c
        };
        assert_eq!(external_fragmentation(&one_hole), 0.0);
        assert_eq!(external_fragmentation(&Counters::default()), 0.0);
    }

    #[test]
    fn metric_enum_matches_the_functions() {
        let c = sample();
        assert_eq!(Metric::InternalWasteBytes.value(&c), 24.0);
        assert_eq!(Metric::Fragmentation.value(&c), fragmentation(&c));
        assert_eq!(
            Metric::ExternalFragmentation.value(&c),
            external_fragmentation(&c)
        );
        let names: std::collections::HashSet<_> = Metric::ALL.iter().map(|m| m.name()).collect();
        assert_eq!(names.len(), Metric::ALL.len());
        assert!(Metric::FootprintBytes.is_bytes() && !Metric::FreeBlocks.is_bytes());
    }
}
