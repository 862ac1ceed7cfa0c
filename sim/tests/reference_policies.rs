//! `first-fit`, `best-fit`, `pool` and `buddy` against naive reference implementations (issue
//! 20, item 18), slow and obviously correct. The fit references keep only the live blocks in
//! address order; the free space is the gaps between them below the heap top (the end of the
//! highest live block), which is what immediate coalescing and top trimming leave. The pool
//! reference is a cursor in the current block and the arena's end. The buddy reference keeps
//! the live blocks and the number of top-level blocks: a free block of order j is an aligned
//! block of that size that no live block touches while its parent is touched (what immediate
//! merging leaves), found by trying every position. Random sequences, with and without a
//! limit, must get the same placement or the same out of memory from both, and the same
//! footprint, at every step.
// Helpers outside #[test] functions unwrap too: a failed unwrap is a failed test here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use allocview_sim::policy::registry::{PolicyConfig, build};
use allocview_sim::policy::{AllocError, Policy, Request};
use allocview_sim::testing::{Op, ops_to_trace};
use allocview_sim::trace::EventKind;
use proptest::prelude::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rule {
    First,
    Best,
    /// A bump pool with blocks of this many bytes.
    Pool(u64),
    /// A buddy allocator: minimum block and highest order.
    Buddy(u64, u32),
}

/// The reference heap: live blocks by address (reserved lengths).
struct Reference {
    rule: Rule,
    align: u64,
    limit: Option<u64>,
    live: BTreeMap<u64, u64>,
    /// Pool: the arena's end, and the current block's cursor and end. Buddy: the number of
    /// top-level blocks times their size.
    arena_end: u64,
    cursor: u64,
    block_end: u64,
}

impl Reference {
    fn footprint(&self) -> u64 {
        match self.rule {
            Rule::Pool(_) | Rule::Buddy(..) => self.arena_end,
            Rule::First | Rule::Best => self.live.iter().next_back().map_or(0, |(&a, &l)| a + l),
        }
    }

    /// True when a live block overlaps `[addr, addr + len)`.
    fn touched(&self, addr: u64, len: u64) -> bool {
        self.live
            .range(..addr + len)
            .next_back()
            .is_some_and(|(&a, &l)| a + l > addr)
    }

    /// The buddy: the lowest free block of the smallest order that holds the request, split
    /// down; one more top-level block when there is none; a request past a top-level block
    /// takes the lowest run of wholly free top-level blocks (new ones past the end count).
    fn buddy_alloc(&mut self, min: u64, max_order: u32, size_bytes: u64) -> Option<(u64, u64)> {
        let top = min << max_order;
        let need = size_bytes.max(self.align).max(1);
        let fits = |end: u64| self.limit.is_none_or(|l| end <= l);
        if need > top {
            let run = need.next_power_of_two();
            let mut at = 0;
            while at < self.arena_end
                && (at..at + run)
                    .step_by(top as usize)
                    .any(|b| b < self.arena_end && self.touched(b, top))
            {
                at += top;
            }
            if !fits(self.arena_end.max(at + run)) {
                return None;
            }
            self.arena_end = self.arena_end.max(at + run);
            return Some((at, run));
        }
        let len = need.next_power_of_two().max(min);
        let mut size = len;
        while size <= top {
            let free = (0..self.arena_end).step_by(size as usize).find(|&b| {
                !self.touched(b, size)
                    && (size == top || self.touched(b & !(2 * size - 1), 2 * size))
            });
            if let Some(b) = free {
                return Some((b, len));
            }
            size *= 2;
        }
        if !fits(self.arena_end + top) {
            return None;
        }
        self.arena_end += top;
        Some((self.arena_end - top, len))
    }

    /// The pool: the current block's cursor, else a new block (or a block of its own for a
    /// request larger than a block) at the arena's end.
    fn pool_alloc(&mut self, block: u64, reserved: u64) -> Option<u64> {
        if self.cursor + reserved <= self.block_end {
            self.cursor += reserved;
            return Some(self.cursor - reserved);
        }
        let len = reserved.max(block);
        if self.limit.is_some_and(|l| self.arena_end + len > l) {
            return None;
        }
        let addr = self.arena_end;
        self.arena_end += len;
        if reserved <= block {
            (self.cursor, self.block_end) = (addr + reserved, addr + block);
        }
        Some(addr)
    }

    /// The gaps between live blocks below the top, as (addr, len).
    fn holes(&self) -> Vec<(u64, u64)> {
        let mut holes = Vec::new();
        let mut end = 0;
        for (&a, &l) in &self.live {
            if a > end {
                holes.push((end, a - end));
            }
            end = a + l;
        }
        holes
    }

    /// The address, or `None` for out of memory.
    fn alloc(&mut self, size_bytes: u64) -> Option<u64> {
        if let Rule::Buddy(min, max_order) = self.rule {
            let (addr, len) = self.buddy_alloc(min, max_order, size_bytes)?;
            self.live.insert(addr, len);
            return Some(addr);
        }
        let reserved = size_bytes.max(1).div_ceil(self.align) * self.align;
        if let Rule::Pool(block) = self.rule {
            let addr = self.pool_alloc(block, reserved)?;
            self.live.insert(addr, reserved);
            return Some(addr);
        }
        let fitting = self.holes().into_iter().filter(|&(_, l)| l >= reserved);
        let hole = match self.rule {
            Rule::First => fitting.min_by_key(|&(a, _)| a),
            Rule::Best => fitting.min_by_key(|&(a, l)| (l, a)),
            Rule::Pool(_) | Rule::Buddy(..) => None,
        };
        let addr = match hole {
            Some((a, _)) => a,
            None => {
                let top = self.footprint();
                if self.limit.is_some_and(|l| top + reserved > l) {
                    return None;
                }
                top
            }
        };
        self.live.insert(addr, reserved);
        Some(addr)
    }

    fn free(&mut self, addr: u64) {
        assert!(self.live.remove(&addr).is_some(), "free of {addr:#x}");
    }
}

fn compare(name: &str, rule: Rule, ops: &[Op], limit: Option<u64>) -> Result<(), TestCaseError> {
    let trace = ops_to_trace(ops);
    let view = trace.view().unwrap();
    let config = PolicyConfig {
        limit_bytes: limit,
        pool_block_bytes: match rule {
            Rule::Pool(block) => block,
            _ => PolicyConfig::default().pool_block_bytes,
        },
        buddy_min_block_bytes: match rule {
            Rule::Buddy(min, _) => min,
            _ => PolicyConfig::default().buddy_min_block_bytes,
        },
        buddy_max_order: match rule {
            Rule::Buddy(_, max_order) => max_order,
            _ => PolicyConfig::default().buddy_max_order,
        },
        ..PolicyConfig::default()
    };
    let mut policy: Box<dyn Policy> = build(name, &config, &view).unwrap();
    let mut reference = Reference {
        rule,
        align: config.align_bytes,
        limit,
        live: BTreeMap::new(),
        arena_end: 0,
        cursor: 0,
        block_end: 0,
    };
    let mut addr_of = vec![None; view.num_allocs as usize];
    for i in 0..view.len() {
        let id = view.alloc_id[i];
        match view.kind_at(i).unwrap() {
            EventKind::Alloc => {
                let size_bytes = view.size_bytes[i];
                let got = policy.alloc(Request {
                    id,
                    size_bytes,
                    align_bytes: config.align_bytes,
                });
                let want = reference.alloc(size_bytes);
                match (got, want) {
                    (Ok(p), Some(a)) => prop_assert_eq!(p.addr, a, "{} event {}", name, i),
                    (Err(AllocError::OutOfMemory { .. }), None) => {}
                    (got, want) => {
                        return Err(TestCaseError::fail(format!(
                            "{name} event {i}: policy {got:?}, reference {want:?}"
                        )));
                    }
                }
                addr_of[id as usize] = want;
            }
            EventKind::Free => {
                if let Some(a) = addr_of[id as usize] {
                    policy.free(a).unwrap();
                    reference.free(a);
                }
            }
            _ => {}
        }
        prop_assert_eq!(
            policy.counters().footprint_bytes,
            reference.footprint(),
            "{} event {}",
            name,
            i
        );
    }
    Ok(())
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0u64..=256,
        3 => 257u64..=16_384,
        1 => 16_385u64..=(1 << 20),
    ]
}

fn ops_strategy() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            3 => size_strategy().prop_map(|size_bytes| Op::Alloc { size_bytes }),
            2 => any::<usize>().prop_map(|victim| Op::Free { victim }),
        ],
        1..200,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn first_fit_matches_its_reference(ops in ops_strategy(), limit_kib in prop::option::of(1u64..=4096)) {
        compare("first-fit", Rule::First, &ops, limit_kib.map(|k| k << 10))?;
    }

    #[test]
    fn best_fit_matches_its_reference(ops in ops_strategy(), limit_kib in prop::option::of(1u64..=4096)) {
        compare("best-fit", Rule::Best, &ops, limit_kib.map(|k| k << 10))?;
    }

    #[test]
    fn pool_matches_its_reference(
        ops in ops_strategy(),
        limit_kib in prop::option::of(1u64..=4096),
        block_kib in 1u64..=256,
    ) {
        compare("pool", Rule::Pool(block_kib << 10), &ops, limit_kib.map(|k| k << 10))?;
    }
}

proptest! {
    // The reference tries every block position: fewer cases.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn buddy_matches_its_reference(
        ops in ops_strategy(),
        limit_kib in prop::option::of(1u64..=1024),
        min_shift in 6u32..=9,
        max_order in 0u32..=6,
    ) {
        compare("buddy", Rule::Buddy(1 << min_shift, max_order), &ops, limit_kib.map(|k| k << 10))?;
    }
}
