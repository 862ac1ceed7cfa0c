//! The layout index: a policy's block list at any event without replaying the policy.
//!
//! Seeking by checkpoint costs a copy of the policy plus up to `checkpoint_every` replayed
//! events, and both grow with the live set: a PyTorch snapshot with a million live blocks takes
//! seconds a seek. For policies whose free space is exactly the gaps between live allocations
//! inside the ranges they hold (every free block coalesced with its free neighbours, as in
//! PyTorch's caching allocator: [`Policy::held_ranges`]), the block list at an event follows
//! from two records the replay keeps anyway. Two variants: heaps that hold `[base, end of their
//! highest live allocation)` (first-fit, best-fit, predictive: [`Policy::held_up_to_tops`])
//! record no range, their tops being found at each lookup from the live allocations; a buddy
//! allocator cuts each gap into the buddy blocks that tile it
//! ([`Policy::gap_block_max_bytes`]). The records:
//! - every served allocation: address, reserved length, requested bytes, and the events it was
//!   born and freed at;
//! - every change of the held ranges (a segment allocated, freed, mapped or unmapped), which
//!   are rare.
//!
//! [`LayoutIndex::blocks_at`] finds the allocations live at the event and lays them, in address
//! order, into the held ranges, the gaps becoming free blocks. Allocations that live a short
//! while (a 64th of the trace, kept between 64 and 32,768 events) are kept in birth order: those
//! live at an event were born within that span, found by a binary search and sorted by address.
//! The others are kept in address order in runs of 256 with each run's earliest birth and
//! latest death, so runs all unborn or all dead are skipped, and the live ones of a run are
//! picked by a bit mask. Big heaps are laid out in two halves of the address space on two
//! threads. A seek thus costs a pass over the long-lived allocations' birth and death (8 bytes
//! each) and the output, instead of a policy replay. The result is checked against the policy's
//! own [`Policy::blocks`] by the conformance suite. The columns are kept small, as millions of
//! allocations make the index's size (`layout/columns.rs`): about 14 bytes a short-lived
//! allocation and 20 a long-lived one where addresses fit in 32 bits, lengths in 16 bits (in
//! units of their largest common power of two) and the short tier's births and ids step by
//! less than 65,536 over 64 allocations; 28 at most (and the rare lengths kept aside). Where
//! the index cannot be built (a policy without held ranges, such as glibc's with its fast bins,
//! an initial state holding allocations, more than `u32::MAX` events) the replay keeps only its
//! checkpoints.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::heap::{Addr, Block, BlockState, Counters};
use crate::policy::Policy;

mod columns;
mod emit;
mod point;

use columns::{Lengths, Tier};
pub use emit::BlockSink;
use emit::Emitter;

/// Allocations per skip run.
const CHUNK: usize = 256;
/// Held ranges plus long-lived allocations past which a lookup runs on two threads.
const PARALLEL_WORK: usize = 200_000;
/// Most events an allocation may live to be kept in birth order (see [`LayoutIndex`]): a
/// lookup sorts at most this many. Short traces use a 64th of their length, so both tiers
/// carry allocations in small tests too.
const SHORT_LIFE_MAX: u32 = 32_768;
// Short lives are kept in 16 bits.
const _: () = assert!(SHORT_LIFE_MAX <= u16::MAX as u32);
/// Range deltas between two copies of the whole range set, at least (see `finish`).
const RANGE_SNAPSHOT_EVERY: usize = 1024;
/// "Never freed" as a death position.
const NEVER: u32 = u32::MAX;
/// "Never served" as a birth position.
const UNBORN: u32 = u32::MAX;

/// Positions: 0 is the state before the first event, `i + 1` the state after event `i`.
fn position(event: usize) -> Option<u32> {
    u32::try_from(event).ok()?.checked_add(1)
}

/// A held range appearing (`added`) or disappearing at a position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RangeDelta {
    pos: u32,
    addr: Addr,
    len_bytes: u64,
    added: bool,
}

/// Collects what [`LayoutIndex`] needs while a replay runs.
#[derive(Debug)]
pub struct LayoutRecorder {
    birth: Vec<u32>,
    death: Vec<u32>,
    addr: Vec<Addr>,
    lengths: Lengths,
    /// The held ranges before the first event.
    initial: Vec<(Addr, u64)>,
    deltas: Vec<RangeDelta>,
    ranges: Vec<(Addr, u64)>,
    scratch: Vec<(Addr, u64)>,
    /// Events in the trace (they fit in `u32`).
    events: u32,
    epoch: u64,
    footprint_bytes: u64,
    /// The policy holds `[base, end of its highest live allocation)` from each of these
    /// ([`Policy::held_up_to_tops`]): no range is recorded.
    top_bases: Option<Vec<Addr>>,
    /// [`Policy::gap_block_max_bytes`].
    gap_max: Option<u64>,
}

impl LayoutRecorder {
    /// Starts recording for `policy` in its initial state, or `None` when its block list cannot
    /// be rebuilt from allocations and held ranges.
    #[must_use]
    pub fn start(policy: &dyn Policy, num_allocs: usize, events: usize) -> Option<Self> {
        // The last position (`events`) must stay below the sentinels.
        let events = u32::try_from(events).ok()?;
        if events >= UNBORN - 1 {
            return None;
        }
        let mut ranges = Vec::new();
        let mut bases = Vec::new();
        let top_bases = policy.held_up_to_tops(&mut bases).then_some(bases);
        if top_bases.is_none() && !policy.held_ranges(&mut ranges) {
            return None;
        }
        let mut blocks = Vec::new();
        policy.blocks(&mut blocks);
        if blocks.iter().any(|b| !matches!(b.state, BlockState::Free)) {
            return None;
        }
        Some(Self {
            initial: ranges.clone(),
            birth: vec![UNBORN; num_allocs],
            death: vec![NEVER; num_allocs],
            addr: vec![0; num_allocs],
            lengths: Lengths::zeroed(num_allocs),
            deltas: Vec::new(),
            ranges,
            scratch: Vec::new(),
            events,
            epoch: policy.held_ranges_epoch(),
            footprint_bytes: policy.counters().footprint_bytes,
            top_bases,
            gap_max: policy.gap_block_max_bytes(),
        })
    }

    /// Allocation `id` was served at event `event`.
    pub fn on_alloc(
        &mut self,
        event: usize,
        id: u32,
        addr: Addr,
        len_bytes: u64,
        requested_bytes: u64,
    ) {
        let i = id as usize;
        if let (Some(b), Some(a), Some(pos)) =
            (self.birth.get_mut(i), self.addr.get_mut(i), position(event))
        {
            *b = pos;
            *a = addr;
            self.lengths.set(i, len_bytes, requested_bytes);
        }
    }

    /// Allocation `id` was freed at event `event`.
    pub fn on_free(&mut self, event: usize, id: u32) {
        if let (Some(d), Some(pos)) = (self.death.get_mut(id as usize), position(event)) {
            *d = pos;
        }
    }

    /// Called after every event: records the held ranges when they may have changed.
    #[inline]
    pub fn after_event<P: Policy + ?Sized>(
        &mut self,
        event: usize,
        policy: &P,
        counters: &Counters,
    ) {
        if self.top_bases.is_some() {
            return;
        }
        let epoch = policy.held_ranges_epoch();
        if epoch == self.epoch && counters.footprint_bytes == self.footprint_bytes {
            return;
        }
        self.epoch = epoch;
        self.footprint_bytes = counters.footprint_bytes;
        let Some(pos) = position(event) else { return };
        self.scratch.clear();
        policy.held_ranges(&mut self.scratch);
        diff_sorted(&self.ranges, &self.scratch, |addr, len_bytes, added| {
            self.deltas.push(RangeDelta {
                pos,
                addr,
                len_bytes,
                added,
            });
        });
        std::mem::swap(&mut self.ranges, &mut self.scratch);
    }

    /// Splits the allocations into the two tiers and builds the index.
    #[must_use]
    pub fn finish(self) -> LayoutIndex {
        let short_life = (self.events / 64).clamp(64, SHORT_LIFE_MAX);
        let served = (0..self.birth.len()).filter(|&i| self.birth[i] != UNBORN);
        let (mut short, mut long): (Vec<usize>, Vec<usize>) =
            served.partition(|&i| self.death[i].saturating_sub(self.birth[i]) <= short_life);
        short.sort_unstable_by_key(|&i| self.birth[i]);
        long.sort_unstable_by_key(|&i| (self.addr[i], self.birth[i]));
        let gather = |order: &[usize], short| {
            Tier::gather(
                order,
                short,
                &self.addr,
                &self.lengths,
                &self.birth,
                &self.death,
            )
        };
        let (short, long) = (gather(&short, true), gather(&long, false));
        let chunk_birth = long
            .birth
            .as_slice()
            .unwrap_or_default()
            .chunks(CHUNK)
            .map(|c| c.iter().copied().min().unwrap_or(UNBORN))
            .collect();
        let chunk_death = long
            .death
            .chunks(CHUNK)
            .map(|c| c.iter().copied().max().unwrap_or(0))
            .collect();
        // A copy of the range set every `every` deltas: a lookup replays fewer deltas than
        // it copies ranges, and the copies together take about as much as the deltas.
        let every = self.initial.len().max(RANGE_SNAPSHOT_EVERY);
        let snapshots = range_snapshots(self.initial, &self.deltas, every);
        LayoutIndex {
            long,
            chunk_birth,
            chunk_death,
            short,
            short_life,
            deltas: self.deltas,
            snapshots,
            snapshot_every: every,
            top_bases: self.top_bases.clone(),
            gap_max: self.gap_max,
            scratch: Mutex::new(Vec::new()),
        }
    }
}

/// The range set before deltas `0`, `every`, `2 · every`, ...
fn range_snapshots(
    initial: Vec<(Addr, u64)>,
    deltas: &[RangeDelta],
    every: usize,
) -> Vec<Vec<(Addr, u64)>> {
    let mut current: BTreeMap<Addr, u64> = initial.iter().copied().collect();
    let mut snapshots = vec![initial];
    for (k, d) in deltas.iter().enumerate() {
        if k > 0 && k % every == 0 {
            snapshots.push(current.iter().map(|(&a, &l)| (a, l)).collect());
        }
        apply_delta(&mut current, d);
    }
    snapshots
}

fn apply_delta(ranges: &mut BTreeMap<Addr, u64>, d: &RangeDelta) {
    if d.added {
        ranges.insert(d.addr, d.len_bytes);
    } else {
        ranges.remove(&d.addr);
    }
}

/// Calls `f(addr, len, added)` for every range only in `new` (added) or only in `old`.
fn diff_sorted(old: &[(Addr, u64)], new: &[(Addr, u64)], mut f: impl FnMut(Addr, u64, bool)) {
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(&o), Some(&n)) if o == n => {
                i += 1;
                j += 1;
            }
            (Some(&o), Some(&n)) if o.0 < n.0 || (o.0 == n.0 && o.1 != n.1) => {
                f(o.0, o.1, false);
                i += 1;
            }
            (Some(_), Some(&n)) | (None, Some(&n)) => {
                f(n.0, n.1, true);
                j += 1;
            }
            (Some(&o), None) => {
                f(o.0, o.1, false);
                i += 1;
            }
            (None, None) => break,
        }
    }
}

/// A replay's allocations with their lifetimes, and the held ranges over time (see the module
/// docs).
///
/// Allocations that live at most `short_life` events are kept in birth order: those live at a
/// position were born within the last `short_life`, found by a binary search and sorted by
/// address. The others are kept in address order, scanned with unborn and dead runs skipped. A
/// lookup merges the two.
#[derive(Debug)]
pub struct LayoutIndex {
    long: Tier,
    chunk_birth: Vec<u32>,
    chunk_death: Vec<u32>,
    short: Tier,
    short_life: u32,
    deltas: Vec<RangeDelta>,
    /// The range set before delta `k · snapshot_every`, sorted.
    snapshots: Vec<Vec<(Addr, u64)>>,
    snapshot_every: usize,
    /// The held ranges are `[base, end of the highest live allocation below the next base)`
    /// from each of these (no deltas are kept).
    top_bases: Option<Vec<Addr>>,
    /// How gaps split into free blocks ([`Policy::gap_block_max_bytes`]).
    gap_max: Option<u64>,
    /// The second half's blocks of a two-thread lookup, kept between lookups: a fresh vector of
    /// tens of MB costs its page faults and regrowth every seek.
    scratch: Mutex<Vec<Block>>,
}

impl Clone for LayoutIndex {
    fn clone(&self) -> Self {
        Self {
            long: self.long.clone(),
            chunk_birth: self.chunk_birth.clone(),
            chunk_death: self.chunk_death.clone(),
            short: self.short.clone(),
            short_life: self.short_life,
            deltas: self.deltas.clone(),
            snapshots: self.snapshots.clone(),
            snapshot_every: self.snapshot_every,
            top_bases: self.top_bases.clone(),
            gap_max: self.gap_max,
            scratch: Mutex::new(Vec::new()),
        }
    }
}

impl LayoutIndex {
    /// The held ranges at position `pos`, sorted: the nearest copy, merged with the changes
    /// since (the last change of an address wins).
    fn ranges_at(&self, pos: u32) -> Cow<'_, [(Addr, u64)]> {
        if let Some(bases) = &self.top_bases {
            let ranges = bases.iter().enumerate().filter_map(|(k, &base)| {
                let below = bases.get(k + 1).copied().unwrap_or(Addr::MAX);
                let top = self.top_at(pos, base, below);
                (top > base).then(|| (base, top - base))
            });
            return Cow::Owned(ranges.collect());
        }
        let upto = self.deltas.partition_point(|d| d.pos <= pos);
        // The copy before delta `upto` exists only when a delta follows it.
        let k = (upto / self.snapshot_every).min(self.snapshots.len().saturating_sub(1));
        let base = self.snapshots.get(k).map_or(&[][..], Vec::as_slice);
        if upto == k * self.snapshot_every {
            // No change since the copy (a snapshot whose segments never change: every seek).
            return Cow::Borrowed(base);
        }
        let mut changes: BTreeMap<Addr, Option<u64>> = BTreeMap::new();
        for d in self
            .deltas
            .get(k * self.snapshot_every..upto)
            .unwrap_or(&[])
        {
            changes.insert(d.addr, d.added.then_some(d.len_bytes));
        }
        let mut out = Vec::with_capacity(base.len() + changes.len());
        let mut changes = changes.into_iter().peekable();
        for &(addr, len) in base {
            while let Some((a, l)) = changes.next_if(|&(a, _)| a < addr) {
                out.extend(l.map(|l| (a, l)));
            }
            match changes.next_if(|&(a, _)| a == addr) {
                Some((_, l)) => out.extend(l.map(|l| (addr, l))),
                None => out.push((addr, len)),
            }
        }
        out.extend(changes.filter_map(|(a, l)| l.map(|l| (a, l))));
        Cow::Owned(out)
    }

    /// Fills `out` with the policy's blocks just after `event`, in address order, as
    /// [`Policy::blocks`] gives them, and returns the counters they imply. `None` when the records are inconsistent (a live
    /// allocation outside every held range, or two overlapping), which a correct policy never
    /// produces; callers then fall back to a checkpoint replay.
    #[must_use]
    pub fn blocks_at(&self, event: usize, out: &mut Vec<Block>) -> Option<Counters> {
        self.blocks_at_split_above(event, out, PARALLEL_WORK)
    }

    /// [`Self::blocks_at`], on two threads when the held ranges plus the long-lived allocations
    /// number at least `work` (`blocks_at` uses 200,000; tests use 0 to check the split).
    pub fn blocks_at_split_above(
        &self,
        event: usize,
        out: &mut Vec<Block>,
        work: usize,
    ) -> Option<Counters> {
        out.clear();
        let mut scratch = match self.scratch.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let scratch: &mut Vec<Block> = &mut scratch;
        scratch.clear();
        let (second, counters) =
            self.fold_blocks_at_split_above(event, out, move |_| scratch, work)?;
        if let Some(second) = second {
            out.extend_from_slice(second);
        }
        Some(counters)
    }

    /// Passes the blocks just after `event`, in address order, to `first`, or, for a big heap,
    /// the first half to `first` and the second half to the sink `second(held_offset)` makes
    /// (`held_offset`: where the second half starts in the held space, the ranges laid end to
    /// end), filled side by side on two threads. A view that only summarises the blocks (a
    /// heap map) thus never holds the list. Returns the second sink, if made, and the
    /// counters; `None` as for [`Self::blocks_at`].
    pub fn fold_blocks_at<A, B>(
        &self,
        event: usize,
        first: &mut A,
        second: impl FnOnce(u64) -> B + Send,
    ) -> Option<(Option<B>, Counters)>
    where
        A: BlockSink + Send,
        B: BlockSink + Send,
    {
        self.fold_blocks_at_split_above(event, first, second, PARALLEL_WORK)
    }

    /// [`Self::fold_blocks_at`], split over two threads when the held ranges plus the
    /// long-lived allocations number at least `work` (tests use 0 to check the split).
    pub fn fold_blocks_at_split_above<A, B>(
        &self,
        event: usize,
        first: &mut A,
        second: impl FnOnce(u64) -> B + Send,
        work: usize,
    ) -> Option<(Option<B>, Counters)>
    where
        A: BlockSink + Send,
        B: BlockSink + Send,
    {
        let pos = position(event)?;
        let ranges = self.ranges_at(pos);
        let short = self.live_short(pos, ..);
        let n_long = self.long.addr.len();
        let (second, mut counters) = if ranges.len() < 2 || ranges.len() + n_long < work {
            (None, self.fill(pos, &ranges, &short, 0..n_long, first)?)
        } else {
            // Two halves of the address space side by side: the ranges before the middle one
            // end at or before its start, so every block falls in one half.
            let mid = ranges.len() / 2;
            let split_addr = ranges.get(mid)?.0;
            let held_before: u64 = ranges.get(..mid)?.iter().map(|&(_, l)| l).sum();
            let long_split = self.long.addr.first_at_or_above(split_addr);
            let short_split = short.partition_point(|&(a, _)| a < split_addr);
            let (first, later) = std::thread::scope(|scope| {
                let later = scope.spawn(|| {
                    let mut sink = second(held_before);
                    let long = long_split..n_long;
                    let short = short.get(short_split..).unwrap_or(&[]);
                    let c = self.fill(pos, ranges.get(mid..)?, short, long, &mut sink)?;
                    Some((sink, c))
                });
                let short = short.get(..short_split).unwrap_or(&[]);
                let first = self.fill(pos, ranges.get(..mid)?, short, 0..long_split, first);
                Some((first, later.join().ok().flatten()))
            })?;
            let (mut c, (sink, later)) = (first?, later?);
            c.live_allocs += later.live_allocs;
            c.live_bytes += later.live_bytes;
            c.allocated_bytes += later.allocated_bytes;
            c.free_bytes += later.free_bytes;
            c.free_blocks += later.free_blocks;
            c.largest_free_bytes = c.largest_free_bytes.max(later.largest_free_bytes);
            (Some(sink), c)
        };
        counters.footprint_bytes = ranges.iter().map(|&(_, l)| l).sum();
        Some((second, counters))
    }

    /// The short-lived allocations live at `pos` whose address is in `addrs`, as (address,
    /// index in the short tier), sorted by address.
    fn live_short(&self, pos: u32, addrs: impl std::ops::RangeBounds<Addr>) -> Vec<(Addr, usize)> {
        let mut short: Vec<(Addr, usize)> = self.live_short_unsorted(pos, addrs).collect();
        short.sort_unstable();
        short
    }

    /// [`Self::live_short`] in birth order: those born within the short life span before `pos`
    /// and not dead by then.
    fn live_short_unsorted(
        &self,
        pos: u32,
        addrs: impl std::ops::RangeBounds<Addr>,
    ) -> impl Iterator<Item = (Addr, usize)> {
        let s = &self.short;
        let first = s
            .birth
            .partition_point(|b| b <= pos.saturating_sub(self.short_life));
        let last = s.birth.partition_point(|b| b <= pos);
        (first..last)
            .filter(move |&i| pos < s.death_at(i) && addrs.contains(&s.addr.at(i)))
            .map(|i| (s.addr.at(i), i))
    }

    /// Bytes held just after `event` (the sum of the held ranges, the footprint), without
    /// laying out a block: the length of the whole heap's picture before it is drawn.
    #[must_use]
    pub fn held_bytes_at(&self, event: usize) -> Option<u64> {
        let pos = position(event)?;
        Some(self.ranges_at(pos).iter().map(|&(_, l)| l).sum())
    }

    /// The block holding byte `offset` of the held space (the ranges laid end to end) just
    /// after `event`: the live allocations next to it are looked up, and no more is laid out
    /// than the gap between them (the pointer's hover, every frame: laying out the range cost a
    /// millisecond a frame on a heap of 58,000 blocks held in one range). `None` past the end.
    #[must_use]
    pub fn block_at_offset(&self, event: usize, offset: u64) -> Option<Block> {
        let pos = position(event)?;
        let ranges = self.ranges_at(pos);
        let mut from = 0u64;
        let r = ranges.iter().position(|&(_, l)| {
            from += l;
            offset < from
        })?;
        let &(ra, rl) = ranges.get(r)?;
        let addr = ra + (offset - (from - rl));
        let (below, above) = self.live_around(pos, addr, ra..ra + rl);
        if let Some(b) = below
            && addr - b.addr < b.len_bytes
        {
            return Some(b);
        }
        let gap_from = below.map_or(ra, |b| b.addr + b.len_bytes);
        let gap = [(gap_from, above.unwrap_or(ra + rl).saturating_sub(gap_from))];
        let mut blocks = Vec::new();
        Emitter::new(&gap, &mut blocks, self.gap_max).finish();
        blocks
            .into_iter()
            .find(|b| addr >= b.addr && addr - b.addr < b.len_bytes)
    }

    /// Lays into `ranges` the live allocations among the long-lived ones `long` and the
    /// short-lived ones `short` (sorted by address); the counters but the footprint.
    fn fill(
        &self,
        pos: u32,
        ranges: &[(Addr, u64)],
        short: &[(Addr, usize)],
        long: std::ops::Range<usize>,
        out: &mut impl BlockSink,
    ) -> Option<Counters> {
        let (s, l) = (&self.short, &self.long);
        let mut short = short.iter().copied().peekable();
        let mut emit = Emitter::new(ranges, out, self.gap_max);
        let first_chunk = long.start / CHUNK;
        let last_chunk = long.end.div_ceil(CHUNK);
        for c in first_chunk..last_chunk {
            let (&cb, &cd) = (self.chunk_birth.get(c)?, self.chunk_death.get(c)?);
            if cb > pos || cd <= pos {
                continue;
            }
            let from = (c * CHUNK).max(long.start);
            let to = ((c + 1) * CHUNK).min(long.end);
            let births = l.birth.as_slice()?.get(from..to)?;
            let deaths = l.death.get(from..to)?;
            // Which of the run are live, as bits: a branch per allocation would be mispredicted
            // about as often as not where live and dead ones mix.
            let mut live = [0u64; CHUNK / 64];
            for (k, (&b, &d)) in births.iter().zip(deaths).enumerate() {
                live[k / 64] |= u64::from((b <= pos) & (pos < d)) << (k % 64);
            }
            for (w, mut bits) in live.into_iter().enumerate() {
                while bits != 0 {
                    let i = from + w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    while let Some((_, j)) = short.next_if(|&(a, _)| a < l.addr.at(i)) {
                        emit.used(s.block(j))?;
                    }
                    emit.used(l.block(i))?;
                }
            }
        }
        for (_, j) in short {
            emit.used(s.block(j))?;
        }
        Some(emit.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranges looked up from copies and deltas equal the deltas applied one by one from the
    /// start, whatever the copy interval.
    #[test]
    fn ranges_at_every_position_match_a_plain_replay() {
        let initial = vec![(100, 10), (200, 20), (300, 30)];
        let mut deltas = Vec::new();
        let mut x = 12_345u64;
        let mut live: BTreeMap<Addr, u64> = initial.iter().copied().collect();
        for pos in 1..200u32 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let addr = 100 * ((x >> 40) % 12);
            let d = match live.get(&addr) {
                Some(&len_bytes) => RangeDelta {
                    pos,
                    addr,
                    len_bytes,
                    added: false,
                },
                None => RangeDelta {
                    pos,
                    addr,
                    len_bytes: 1 + (x >> 50) % 90,
                    added: true,
                },
            };
            apply_delta(&mut live, &d);
            deltas.push(d);
            if pos % 3 == 0 {
                // Two changes at one position.
                let d = RangeDelta {
                    pos,
                    addr: 5,
                    len_bytes: 1,
                    added: !live.contains_key(&5),
                };
                apply_delta(&mut live, &d);
                deltas.push(d);
            }
        }
        for every in [1, 2, 7, 1000] {
            let index = LayoutIndex {
                long: Tier::default(),
                chunk_birth: Vec::new(),
                chunk_death: Vec::new(),
                short: Tier::default(),
                short_life: 64,
                snapshots: range_snapshots(initial.clone(), &deltas, every),
                deltas: deltas.clone(),
                snapshot_every: every,
                top_bases: None,
                gap_max: None,
                scratch: Mutex::new(Vec::new()),
            };
            let mut plain: BTreeMap<Addr, u64> = initial.iter().copied().collect();
            let mut next = 0;
            for pos in 0..205u32 {
                while let Some(d) = deltas.get(next).filter(|d| d.pos <= pos) {
                    apply_delta(&mut plain, d);
                    next += 1;
                }
                let want: Vec<_> = plain.iter().map(|(&a, &l)| (a, l)).collect();
                assert_eq!(index.ranges_at(pos), want, "every {every}, position {pos}");
            }
        }
    }

    #[test]
    fn diff_reports_changed_ranges() {
        let old = [(0, 10), (20, 10), (40, 5)];
        let new = [(0, 10), (20, 12), (50, 5)];
        let mut seen = Vec::new();
        diff_sorted(&old, &new, |a, l, added| seen.push((a, l, added)));
        assert_eq!(
            seen,
            vec![
                (20, 10, false),
                (20, 12, true),
                (40, 5, false),
                (50, 5, true)
            ]
        );
    }
}
