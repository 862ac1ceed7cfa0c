//! Every policy against a naive reference implementation (issue 20, item 18), slow and
//! obviously correct: `first-fit`, `best-fit`, `pool`, `buddy`, `predictive` (fed the true
//! lifetimes), `oracle` and `pytorch` (default settings) here, `glibc` in `glibc.rs`. The fit references keep only the live blocks in
//! address order; the free space is the gaps between them below the heap top (the end of the
//! highest live block), which is what immediate coalescing and top trimming leave. The pool
//! reference is a cursor in the current block and the arena's end. The buddy reference keeps
//! the live blocks and the number of top-level blocks: a free block of order j is an aligned
//! block of that size that no live block touches while its parent is touched (what immediate
//! merging leaves), found by trying every position. Random sequences, with and without a
//! limit, must get the same placement or the same out of memory from both, and the same
//! footprint, at every step. The `predictive` reference is two best-fit references and the
//! module's arena rules, its classes counted from the trace's future event by event; the
//! `oracle` reference plans by the greedy-by-size rule, scanning every placed buffer.
// Helpers outside #[test] functions unwrap too: a failed unwrap is a failed test here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

mod glibc;

use allocview_sim::heap::{AllocError, Request};
use allocview_sim::policy::Policy;
use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::registry::build;
use allocview_sim::testing::{Op, ops_to_trace};
use allocview_sim::trace::{EventKind, TraceView};
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
    /// `predictive`: the limit of both arenas together (`limit` is one arena's room).
    limit_total: Option<u64>,
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

/// A naive reference heap, driven beside a policy by [`lockstep`].
trait NaiveHeap {
    /// The address for allocation `id` of `size_bytes`, or `None` for out of memory.
    fn alloc(&mut self, id: u32, size_bytes: u64) -> Option<u64>;
    fn free(&mut self, addr: u64);
    fn footprint(&self) -> u64;
}

impl NaiveHeap for Reference {
    fn alloc(&mut self, _id: u32, size_bytes: u64) -> Option<u64> {
        Reference::alloc(self, size_bytes)
    }
    fn free(&mut self, addr: u64) {
        Reference::free(self, addr);
    }
    fn footprint(&self) -> u64 {
        Reference::footprint(self)
    }
}

/// Replays `ops` through the policy `name` (built with `config`) and `reference` side by
/// side: at every allocation the same address, or out of memory from both; after every event
/// the same footprint, never past the limit.
fn lockstep(
    name: &str,
    config: &PolicyConfig,
    view: &TraceView<'_>,
    reference: &mut dyn NaiveHeap,
) -> Result<(), TestCaseError> {
    let mut policy: Box<dyn Policy> = build(name, config, view).unwrap();
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
                let want = reference.alloc(id, size_bytes);
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
        let footprint = reference.footprint();
        prop_assert_eq!(
            policy.counters().footprint_bytes,
            footprint,
            "{} event {}",
            name,
            i
        );
        if let Some(l) = config.limit_bytes {
            prop_assert!(
                footprint <= l,
                "{} event {}: footprint {} over the limit {}",
                name,
                i,
                footprint,
                l
            );
        }
    }
    Ok(())
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
    let mut reference = Reference {
        rule,
        align: config.align_bytes,
        limit,
        limit_total: None,
        live: BTreeMap::new(),
        arena_end: 0,
        cursor: 0,
        block_end: 0,
    };
    lockstep(name, &config, &view, &mut reference)
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

/// A block's true lifetime class, counted the slow way: short when fewer than `short_allocs`
/// allocations happen between its allocation and its free; never freed is long.
fn true_classes(view: &TraceView<'_>, short_allocs: u64) -> Vec<bool> {
    let mut short = vec![false; view.num_allocs as usize];
    for i in 0..view.len() {
        if view.kind_at(i) != Some(EventKind::Alloc) {
            continue;
        }
        let id = view.alloc_id[i];
        let free_at = (i + 1..view.len())
            .find(|&j| view.kind_at(j) == Some(EventKind::Free) && view.alloc_id[j] == id);
        if let Some(j) = free_at {
            let between = (i + 1..j)
                .filter(|&k| view.kind_at(k) == Some(EventKind::Alloc))
                .count() as u64;
            short[id as usize] = between < short_allocs;
        }
    }
    short
}

/// `predictive`'s placement with true lifetimes, from two best-fit references: the long
/// arena at 0, the short one at 2^44; a short block tries its own arena's holes, the long
/// arena's holes, its own arena grown, the long arena grown; a long block its own arena, then
/// the short one; an arena grows only into what the other leaves of the limit (the long one
/// also never past 2^44).
fn predictive_alloc(arenas: &mut [Reference; 2], short: bool, size_bytes: u64) -> Option<u64> {
    const SHORT_BASE: u64 = 1 << 44;
    let (long_arena, short_arena) = (0, 1);
    let attempts: &[(usize, bool)] = if short {
        &[
            (short_arena, false),
            (long_arena, false),
            (short_arena, true),
            (long_arena, true),
        ]
    } else {
        &[(long_arena, true), (short_arena, true)]
    };
    let limit = arenas[0].limit_total;
    for &(arena, grow) in attempts {
        let other_top = arenas[1 - arena].footprint();
        let mut room = limit.map(|l| l.saturating_sub(other_top));
        if arena == long_arena {
            room = Some(room.map_or(SHORT_BASE, |r| r.min(SHORT_BASE)));
        }
        let top = arenas[arena].footprint();
        if !grow {
            room = Some(room.map_or(top, |r| r.min(top)));
        }
        arenas[arena].limit = room;
        if let Some(addr) = arenas[arena].alloc(size_bytes) {
            return Some(addr + if arena == short_arena { SHORT_BASE } else { 0 });
        }
    }
    None
}

/// `predictive`'s two arenas and every allocation's true class.
struct PredictiveReference {
    arenas: [Reference; 2],
    classes: Vec<bool>,
}

impl NaiveHeap for PredictiveReference {
    fn alloc(&mut self, id: u32, size_bytes: u64) -> Option<u64> {
        predictive_alloc(&mut self.arenas, self.classes[id as usize], size_bytes)
    }
    fn free(&mut self, addr: u64) {
        const SHORT_BASE: u64 = 1 << 44;
        let arena = usize::from(addr >= SHORT_BASE);
        self.arenas[arena].free(addr - if arena == 1 { SHORT_BASE } else { 0 });
    }
    fn footprint(&self) -> u64 {
        self.arenas[0].footprint() + self.arenas[1].footprint()
    }
}

fn compare_predictive(
    ops: &[Op],
    limit: Option<u64>,
    short_allocs: u64,
) -> Result<(), TestCaseError> {
    let trace = ops_to_trace(ops);
    let view = trace.view().unwrap();
    let config = PolicyConfig {
        limit_bytes: limit,
        predictive_short_allocs: short_allocs,
        predictive_true_lifetimes: true,
        ..PolicyConfig::default()
    };
    let heap = || Reference {
        rule: Rule::Best,
        align: config.align_bytes,
        limit: None,
        limit_total: limit,
        live: BTreeMap::new(),
        arena_end: 0,
        cursor: 0,
        block_end: 0,
    };
    let mut reference = PredictiveReference {
        arenas: [heap(), heap()],
        classes: true_classes(&view, short_allocs),
    };
    lockstep("predictive", &config, &view, &mut reference)
}

/// The greedy-by-size plan of the trace, TFLite's way: buffers largest first (equal sizes in
/// allocation order), each placed in the smallest hole (the lowest on a tie) between the
/// placed buffers whose lifetimes meet its own, scanned by offset with the highest end so far
/// rounded up to the alignment, else on top of them all. A buffer lives from its allocation
/// event to its free event (the trace's end if never freed), and is at least one byte.
fn greedy_by_size_plan(view: &TraceView<'_>, align: u64) -> (Vec<u64>, u64) {
    let n = view.num_allocs as usize;
    let mut life = vec![(0u64, 0u64, view.len() as u64); n];
    for i in 0..view.len() {
        let id = view.alloc_id[i] as usize;
        match view.kind_at(i) {
            Some(EventKind::Alloc) => {
                life[id] = (view.size_bytes[i].max(1), i as u64, view.len() as u64)
            }
            Some(EventKind::Free) => life[id].2 = i as u64,
            _ => {}
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&id| std::cmp::Reverse(life[id].0));
    let round = |x: u64| x.div_ceil(align) * align;
    let mut offsets = vec![0u64; n];
    let mut placed: Vec<usize> = Vec::new();
    let mut total = 0;
    for id in order {
        let (size, lower, upper) = life[id];
        let mut met: Vec<usize> = placed
            .iter()
            .copied()
            .filter(|&p| life[p].1 < upper && lower < life[p].2)
            .collect();
        met.sort_by_key(|&p| offsets[p]);
        let mut prev_end = 0;
        let mut best: Option<(u64, u64)> = None;
        for p in met {
            let start = round(prev_end);
            if offsets[p] >= start {
                let hole = offsets[p] - start;
                if hole >= size && best.is_none_or(|(h, _)| hole < h) {
                    best = Some((hole, start));
                }
            }
            prev_end = prev_end.max(offsets[p] + life[p].0);
        }
        offsets[id] = best.map_or(round(prev_end), |(_, at)| at);
        total = total.max(offsets[id] + size);
        placed.push(id);
    }
    (offsets, total)
}

/// The oracle's plan as a static pool: the whole plan from the start, or the limit when it is
/// smaller; an allocation the plan puts past it is out of memory.
struct OracleReference {
    offsets: Vec<u64>,
    footprint: u64,
}

impl NaiveHeap for OracleReference {
    fn alloc(&mut self, id: u32, size_bytes: u64) -> Option<u64> {
        let at = self.offsets[id as usize];
        (at + size_bytes.max(1) <= self.footprint).then_some(at)
    }
    fn free(&mut self, _addr: u64) {}
    fn footprint(&self) -> u64 {
        self.footprint
    }
}

fn compare_oracle(ops: &[Op], limit: Option<u64>, align: u64) -> Result<(), TestCaseError> {
    let trace = ops_to_trace(ops);
    let view = trace.view().unwrap();
    let config = PolicyConfig {
        limit_bytes: limit,
        align_bytes: align,
        ..PolicyConfig::default()
    };
    let (offsets, total) = greedy_by_size_plan(&view, align);
    let mut reference = OracleReference {
        offsets,
        footprint: limit.map_or(total, |l| l.min(total)),
    };
    lockstep("oracle", &config, &view, &mut reference)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn predictive_with_true_lifetimes_matches_its_reference(
        ops in ops_strategy(),
        limit_kib in prop::option::of(1u64..=4096),
        short_allocs in 1u64..=24,
    ) {
        compare_predictive(&ops, limit_kib.map(|k| k << 10), short_allocs)?;
    }

    /// Small blocks under a tight limit: the arenas run into each other, so blocks spill into
    /// the other arena's holes.
    #[test]
    fn predictive_under_a_tight_limit_matches_its_reference(
        ops in prop::collection::vec(
            prop_oneof![
                3 => (1u64..=2048).prop_map(|size_bytes| Op::Alloc { size_bytes }),
                2 => any::<usize>().prop_map(|victim| Op::Free { victim }),
            ],
            1..300,
        ),
        limit_kib in 4u64..=32,
        short_allocs in 1u64..=8,
    ) {
        compare_predictive(&ops, Some(limit_kib << 10), short_allocs)?;
    }

    #[test]
    fn oracle_matches_its_reference(
        ops in ops_strategy(),
        limit_kib in prop::option::of(1u64..=4096),
        align_shift in 0u32..=6,
    ) {
        compare_oracle(&ops, limit_kib.map(|k| k << 10), 1 << align_shift)?;
    }
}

/// `pytorch` (default settings: one stream, no `max_split_size`, no expandable segments, no
/// garbage-collection threshold) by the caching allocator's rules, kept the slow way: every
/// segment a list of blocks in address order. A request rounds up to 512 B; up to 1 MiB it
/// uses the small pool, else the large one; the smallest free block of its pool that fits
/// (lowest address on a tie) is split when the rest is at least 512 B (small pool) or more
/// than 1 MiB (large pool), else taken whole; without one, a new segment of 2 MiB (small), 20
/// MiB (large, under 10 MiB) or the size rounded up to 2 MiB goes at the lowest 2 MiB-aligned
/// free address from the device's base. Under a limit that a new segment would pass, every
/// wholly free segment is released first, if that makes room; otherwise nothing changes and
/// the request fails. A free merges the block with free neighbours in its segment.
#[derive(Default)]
struct TorchReference {
    /// Segments by base.
    segments: BTreeMap<u64, TorchSegment>,
    limit: Option<u64>,
}

/// A segment of [`TorchReference`]: whether it is the small pool's, and its blocks as (offset,
/// length, requested bytes or `None` when free) in address order.
type TorchSegment = (bool, Vec<(u64, u64, Option<u64>)>);

impl TorchReference {
    const BASE: u64 = 0x7f00_0000_0000;
    const MIB: u64 = 1 << 20;

    fn reserved(&self) -> u64 {
        self.segments
            .values()
            .map(|(_, blocks)| blocks.iter().map(|b| b.1).sum::<u64>())
            .sum()
    }

    fn alloc(&mut self, size_bytes: u64) -> Option<u64> {
        let rounded = size_bytes.max(1).div_ceil(512) * 512;
        let small = rounded <= Self::MIB;
        // The best free block: (len, address) smallest.
        let best = self
            .segments
            .iter()
            .filter(|(_, (s, _))| *s == small)
            .flat_map(|(&base, (_, blocks))| {
                blocks
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.2.is_none() && b.1 >= rounded)
                    .map(move |(i, b)| (b.1, base + b.0, base, i))
            })
            .min();
        let (base, i) = match best {
            Some((_, _, base, i)) => (base, i),
            None => {
                let seg = if small {
                    2 * Self::MIB
                } else if rounded < 10 * Self::MIB {
                    20 * Self::MIB
                } else {
                    rounded.div_ceil(2 * Self::MIB) * 2 * Self::MIB
                };
                if let Some(l) = self.limit
                    && self.reserved() + seg > l
                {
                    let cached: u64 = self
                        .segments
                        .values()
                        .filter(|(_, b)| b.len() == 1 && b[0].2.is_none())
                        .map(|(_, b)| b[0].1)
                        .sum();
                    if self.reserved() - cached + seg > l {
                        return None;
                    }
                    self.segments
                        .retain(|_, (_, b)| !(b.len() == 1 && b[0].2.is_none()));
                }
                // The lowest aligned gap between segments that holds it.
                let mut at = Self::BASE;
                for (&b, (_, blocks)) in &self.segments {
                    if b >= at + seg {
                        break;
                    }
                    let end = b + blocks.iter().map(|x| x.1).sum::<u64>();
                    at = at.max(end.div_ceil(2 * Self::MIB) * 2 * Self::MIB);
                }
                self.segments.insert(at, (small, vec![(0, seg, None)]));
                (at, 0)
            }
        };
        let (_, blocks) = self.segments.get_mut(&base).unwrap();
        let (off, len, _) = blocks[i];
        let rest = len - rounded;
        let split = if small { rest >= 512 } else { rest > Self::MIB };
        if split {
            blocks[i] = (off, rounded, Some(size_bytes));
            blocks.insert(i + 1, (off + rounded, rest, None));
        } else {
            blocks[i] = (off, len, Some(size_bytes));
        }
        Some(base + off)
    }

    fn free(&mut self, addr: u64) {
        let (&base, (_, blocks)) = self.segments.range_mut(..=addr).next_back().unwrap();
        let i = blocks.iter().position(|b| base + b.0 == addr).unwrap();
        blocks[i].2 = None;
        if i + 1 < blocks.len() && blocks[i + 1].2.is_none() {
            blocks[i].1 += blocks[i + 1].1;
            blocks.remove(i + 1);
        }
        if i > 0 && blocks[i - 1].2.is_none() {
            blocks[i - 1].1 += blocks[i].1;
            blocks.remove(i);
        }
    }
}

impl NaiveHeap for TorchReference {
    fn alloc(&mut self, _id: u32, size_bytes: u64) -> Option<u64> {
        TorchReference::alloc(self, size_bytes)
    }
    fn free(&mut self, addr: u64) {
        TorchReference::free(self, addr);
    }
    fn footprint(&self) -> u64 {
        self.reserved()
    }
}

fn compare_pytorch(ops: &[Op], limit: Option<u64>) -> Result<(), TestCaseError> {
    let trace = ops_to_trace(ops);
    let view = trace.view().unwrap();
    let config = PolicyConfig {
        limit_bytes: limit,
        ..PolicyConfig::default()
    };
    let mut reference = TorchReference {
        limit,
        ..TorchReference::default()
    };
    lockstep("pytorch", &config, &view, &mut reference)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn pytorch_matches_its_reference(
        ops in prop::collection::vec(
            prop_oneof![
                // PyTorch gives a null pointer for 0 bytes and allocates nothing.
                4 => size_strategy().prop_map(|size_bytes| Op::Alloc { size_bytes: size_bytes.max(1) }),
                1 => (1u64 << 20..=48 << 20).prop_map(|size_bytes| Op::Alloc { size_bytes }),
                // Near a 20 MiB segment: leftovers on either side of the 1 MiB split threshold.
                1 => ((19u64 << 20)..=(20 << 20)).prop_map(|size_bytes| Op::Alloc { size_bytes }),
                4 => any::<usize>().prop_map(|victim| Op::Free { victim }),
            ],
            1..200,
        ),
        limit_mib in prop::option::of(4u64..=256),
    ) {
        compare_pytorch(&ops, limit_mib.map(|m| m << 20))?;
    }
}
