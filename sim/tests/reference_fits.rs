//! `first-fit` and `best-fit` against naive reference implementations (issue 20, item 18):
//! slow and obviously correct, they keep only the live blocks in address order; the free space
//! is the gaps between them below the heap top (the end of the highest live block), which is
//! what immediate coalescing and top trimming leave. Random sequences, with and without a
//! limit, must get the same placement or the same out of memory from both, at every step.
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
}

/// The reference heap: live blocks by address (reserved lengths).
struct Reference {
    rule: Rule,
    align: u64,
    limit: Option<u64>,
    live: BTreeMap<u64, u64>,
}

impl Reference {
    fn top(&self) -> u64 {
        self.live.iter().next_back().map_or(0, |(&a, &l)| a + l)
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
        let fitting = self.holes().into_iter().filter(|&(_, l)| l >= reserved);
        let hole = match self.rule {
            Rule::First => fitting.min_by_key(|&(a, _)| a),
            Rule::Best => fitting.min_by_key(|&(a, l)| (l, a)),
        };
        let addr = match hole {
            Some((a, _)) => a,
            None => {
                let top = self.top();
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
        ..PolicyConfig::default()
    };
    let mut policy: Box<dyn Policy> = build(name, &config, &view).unwrap();
    let mut reference = Reference {
        rule,
        align: config.align_bytes,
        limit,
        live: BTreeMap::new(),
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
            reference.top(),
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
}
