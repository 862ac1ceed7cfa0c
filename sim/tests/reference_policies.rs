//! `first-fit`, `best-fit` and `pool` against naive reference implementations (issue 20, item
//! 18), slow and obviously correct. The fit references keep only the live blocks in address
//! order; the free space is the gaps between them below the heap top (the end of the highest
//! live block), which is what immediate coalescing and top trimming leave. The pool reference
//! is a cursor in the current block and the arena's end. Random sequences, with and without a
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
}

/// The reference heap: live blocks by address (reserved lengths).
struct Reference {
    rule: Rule,
    align: u64,
    limit: Option<u64>,
    live: BTreeMap<u64, u64>,
    /// Pool: the arena's end, and the current block's cursor and end.
    arena_end: u64,
    cursor: u64,
    block_end: u64,
}

impl Reference {
    fn footprint(&self) -> u64 {
        match self.rule {
            Rule::Pool(_) => self.arena_end,
            Rule::First | Rule::Best => self.live.iter().next_back().map_or(0, |(&a, &l)| a + l),
        }
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
            Rule::Pool(_) => None,
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
            Rule::First | Rule::Best => PolicyConfig::default().pool_block_bytes,
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
