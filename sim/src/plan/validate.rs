//! The plan checker every test runs on every instance.
//!
//! A plan is valid when (1) each offset is a multiple of its buffer's alignment and each buffer
//! that ever holds memory ends within the plan's total, (2) each overwrite child sits at its
//! parent's offset plus the declared offset, and (3) no two buffers live at the same time share a
//! byte, except members of one overwrite chain (which nest by construction). For (3) each chain is
//! cut into pieces during which its outermost live member holds all its memory
//! (`units::live_pieces`); a sweep over time then keeps the live pieces in an ordered map by
//! offset. Because the live pieces are pairwise disjoint whenever the check has passed so far, a
//! new piece only needs comparing with its two neighbours in that map. Ends are processed before
//! starts at equal times (half-open lifetimes). O(n log n).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::units::{live_pieces, structure};
use super::{Buffer, Plan, PlanError};

/// Checks `plan` against `buffers`; see the module docs for the rules.
///
/// # Errors
/// The first broken rule, or an input error of the buffers themselves.
pub fn validate(buffers: &[Buffer], plan: &Plan) -> Result<(), PlanError> {
    if plan.offsets.len() != buffers.len() {
        return Err(PlanError::LengthMismatch {
            buffers: buffers.len(),
            offsets: plan.offsets.len(),
        });
    }
    let s = structure(buffers)?;
    for (index, (b, &offset_bytes)) in buffers.iter().zip(&plan.offsets).enumerate() {
        if offset_bytes % b.align_bytes != 0 {
            return Err(PlanError::Misaligned {
                index,
                offset_bytes,
                align_bytes: b.align_bytes,
            });
        }
        let end_bytes = offset_bytes
            .checked_add(b.size_bytes)
            .ok_or(PlanError::Overflow)?;
        if b.needs_memory() && end_bytes > plan.total_bytes {
            return Err(PlanError::BeyondTotal {
                index,
                end_bytes,
                total_bytes: plan.total_bytes,
            });
        }
        if let Some(ow) = b.overwrite {
            let parent_offset = plan.offsets.get(ow.parent).copied().unwrap_or(0);
            let expected_bytes = parent_offset
                .checked_add(ow.offset_bytes)
                .ok_or(PlanError::Overflow)?;
            if offset_bytes != expected_bytes {
                return Err(PlanError::OverwriteMisplaced {
                    index,
                    offset_bytes,
                    expected_bytes,
                });
            }
        }
    }

    let pieces = live_pieces(buffers, &s);
    // (time, is_start, piece): `false < true` puts ends first at equal times.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(pieces.len() * 2);
    for (k, p) in pieces.iter().enumerate() {
        events.push((p.lower, true, k));
        events.push((p.upper, false, k));
    }
    events.sort_unstable();
    // offset -> (end, buffer) of the live pieces.
    let mut live: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    for (_, is_start, k) in events {
        let Some(p) = pieces.get(k) else { continue };
        let offset = plan.offsets.get(p.buffer).copied().unwrap_or(0);
        if !is_start {
            live.remove(&offset);
            continue;
        }
        let end = buffers
            .get(p.buffer)
            .map_or(offset, |b| offset.saturating_add(b.size_bytes));
        if let Some((_, &(prev_end, prev))) = live.range(..=offset).next_back()
            && prev_end > offset
        {
            return Err(PlanError::Overlap {
                a: prev.min(p.buffer),
                b: prev.max(p.buffer),
            });
        }
        if let Some((&next_offset, &(_, next))) = live
            .range((Bound::Excluded(offset), Bound::Unbounded))
            .next()
            && next_offset < end
        {
            return Err(PlanError::Overlap {
                a: next.min(p.buffer),
                b: next.max(p.buffer),
            });
        }
        live.insert(offset, (end, p.buffer));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(offsets: &[u64], total_bytes: u64) -> Plan {
        Plan {
            offsets: offsets.to_vec(),
            total_bytes,
        }
    }

    #[test]
    fn touching_lifetimes_may_share_memory() {
        let bufs = [Buffer::new(4, 0, 3), Buffer::new(4, 3, 9)];
        assert_eq!(validate(&bufs, &plan(&[0, 0], 4)), Ok(()));
    }

    #[test]
    fn overlapping_lifetimes_may_not() {
        let bufs = [Buffer::new(4, 0, 4), Buffer::new(4, 3, 9)];
        assert_eq!(
            validate(&bufs, &plan(&[0, 2], 6)),
            Err(PlanError::Overlap { a: 0, b: 1 })
        );
        assert_eq!(
            validate(&bufs, &plan(&[2, 0], 6)),
            Err(PlanError::Overlap { a: 0, b: 1 })
        );
        assert_eq!(validate(&bufs, &plan(&[0, 4], 8)), Ok(()));
    }

    #[test]
    fn overlap_with_the_lower_or_upper_neighbour_is_found() {
        // 2 starts last; it may hit the piece below it (0) or the one above it (1).
        let bufs = [
            Buffer::new(10, 0, 10),
            Buffer::new(2, 0, 10),
            Buffer::new(2, 5, 6),
        ];
        assert_eq!(validate(&bufs, &plan(&[0, 10, 12], 14)), Ok(()));
        assert_eq!(
            validate(&bufs, &plan(&[0, 10, 3], 13)),
            Err(PlanError::Overlap { a: 0, b: 2 })
        );
        assert_eq!(
            validate(&bufs, &plan(&[1, 11, 0], 13)),
            Err(PlanError::Overlap { a: 0, b: 2 })
        );
        assert_eq!(
            validate(&bufs, &plan(&[0, 11, 10], 13)),
            Err(PlanError::Overlap { a: 1, b: 2 })
        );
    }

    #[test]
    fn alignment_total_and_length_are_checked() {
        let bufs = [Buffer::new(4, 0, 1).with_align(8)];
        assert!(matches!(
            validate(&bufs, &plan(&[4], 8)),
            Err(PlanError::Misaligned { index: 0, .. })
        ));
        assert!(matches!(
            validate(&bufs, &plan(&[8], 8)),
            Err(PlanError::BeyondTotal { index: 0, .. })
        ));
        assert!(matches!(
            validate(&bufs, &plan(&[], 8)),
            Err(PlanError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn overwrite_child_must_sit_at_its_declared_place() {
        // Parent [0,3) of 16 B; the child overwrites it at +8 from t=2 on.
        let bufs = [
            Buffer::new(16, 0, 3),
            Buffer::new(8, 2, 6).overwriting(0, 8),
        ];
        assert_eq!(validate(&bufs, &plan(&[0, 8], 16)), Ok(()));
        assert!(matches!(
            validate(&bufs, &plan(&[0, 0], 16)),
            Err(PlanError::OverwriteMisplaced { index: 1, .. })
        ));
        // Once the parent is dead, its lower half is free for others.
        let mut with_other = bufs.to_vec();
        with_other.push(Buffer::new(8, 3, 6));
        assert_eq!(validate(&with_other, &plan(&[0, 8, 0], 16)), Ok(()));
        with_other.push(Buffer::new(8, 2, 3));
        assert_eq!(
            validate(&with_other, &plan(&[0, 8, 0, 16], 24)),
            Ok(()),
            "a fourth buffer beside the chain"
        );
        assert_eq!(
            validate(&with_other, &plan(&[0, 8, 0, 0], 24)),
            Err(PlanError::Overlap { a: 0, b: 3 })
        );
    }

    #[test]
    fn bad_overwrite_specs_are_rejected() {
        let too_big = [Buffer::new(4, 0, 2), Buffer::new(8, 1, 3).overwriting(0, 0)];
        assert!(matches!(
            validate(&too_big, &plan(&[0, 0], 8)),
            Err(PlanError::BadOverwrite { index: 1, .. })
        ));
        let cycle = [
            Buffer::new(4, 0, 2).overwriting(1, 0),
            Buffer::new(4, 1, 3).overwriting(0, 0),
        ];
        assert!(matches!(
            validate(&cycle, &plan(&[0, 0], 4)),
            Err(PlanError::BadOverwrite { .. })
        ));
        let two_children = [
            Buffer::new(4, 0, 2),
            Buffer::new(2, 1, 3).overwriting(0, 0),
            Buffer::new(2, 1, 3).overwriting(0, 2),
        ];
        assert!(matches!(
            validate(&two_children, &plan(&[0, 0, 2], 4)),
            Err(PlanError::BadOverwrite { index: 2, .. })
        ));
    }
}
