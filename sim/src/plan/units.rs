//! Checks planner input and turns buffers into planning units.
//!
//! Overwrite specs link buffers into chains (a parent has at most one child, a child one parent):
//! each chain's root is planned as one unit of the root's size, live from the chain's first start
//! to its last end, and every member sits at the root's offset plus the sum of the declared
//! offsets down the chain. Because each child fits inside its parent, the members nest, so at any
//! time the memory a chain holds is the range of its shallowest live member: [`live_pieces`]
//! cuts each chain's time into such pieces for the validator and the max-live bound.
//! Everything here is O(n log n).

use std::collections::BTreeSet;

use super::{Buffer, Plan, PlanError, align_up};

/// Where each buffer sits relative to the root of its overwrite chain.
#[derive(Clone, Debug)]
pub(crate) struct Structure {
    /// Root of each buffer's chain (itself for a buffer that overwrites nothing).
    pub root: Vec<usize>,
    /// Offset of each buffer inside its root.
    pub rel_offset: Vec<u64>,
    /// Distance from the root (0 for roots).
    pub depth: Vec<usize>,
}

/// Checks lifetimes, alignments and overwrite specs, and resolves every chain.
pub(crate) fn structure(buffers: &[Buffer]) -> Result<Structure, PlanError> {
    let n = buffers.len();
    let mut has_child = vec![false; n];
    for (index, b) in buffers.iter().enumerate() {
        if b.lower > b.upper {
            return Err(PlanError::BadLifetime {
                index,
                lower: b.lower,
                upper: b.upper,
            });
        }
        if !b.align_bytes.is_power_of_two() {
            return Err(PlanError::BadAlign {
                index,
                align_bytes: b.align_bytes,
            });
        }
        if let Some(ow) = b.overwrite {
            let bad = |reason: String| PlanError::BadOverwrite { index, reason };
            let parent = buffers
                .get(ow.parent)
                .ok_or_else(|| bad(format!("parent {} does not exist", ow.parent)))?;
            if ow.parent == index {
                return Err(bad("a buffer cannot overwrite itself".to_owned()));
            }
            let end = ow.offset_bytes.checked_add(b.size_bytes);
            if end.is_none_or(|e| e > parent.size_bytes) {
                return Err(bad(format!(
                    "{} B at offset {} do not fit in parent {} ({} B)",
                    b.size_bytes, ow.offset_bytes, ow.parent, parent.size_bytes
                )));
            }
            match has_child.get_mut(ow.parent) {
                Some(flag) if *flag => {
                    return Err(bad(format!(
                        "parent {} is already overwritten by another buffer",
                        ow.parent
                    )));
                }
                Some(flag) => *flag = true,
                None => {}
            }
        }
    }

    // Resolve chains by walking up from each unresolved buffer; a walk that meets itself is a
    // cycle (the one-child rule makes every other shape a simple chain).
    const UNSEEN: u8 = 0;
    const ON_PATH: u8 = 1;
    const DONE: u8 = 2;
    let mut state = vec![UNSEEN; n];
    let mut root: Vec<usize> = (0..n).collect();
    let mut rel_offset = vec![0u64; n];
    let mut depth = vec![0usize; n];
    let mut path: Vec<usize> = Vec::new();
    for start in 0..n {
        path.clear();
        let mut cur = start;
        // The base every buffer on `path` hangs from: (root, offset inside it, depth).
        let base = loop {
            match state.get(cur).copied() {
                Some(DONE) => {
                    break (
                        root.get(cur).copied().unwrap_or(cur),
                        rel_offset.get(cur).copied().unwrap_or(0),
                        depth.get(cur).copied().unwrap_or(0),
                    );
                }
                Some(ON_PATH) => {
                    return Err(PlanError::BadOverwrite {
                        index: cur,
                        reason: "overwrite specs form a cycle".to_owned(),
                    });
                }
                _ => {}
            }
            if let Some(s) = state.get_mut(cur) {
                *s = ON_PATH;
            }
            path.push(cur);
            match buffers.get(cur).and_then(|b| b.overwrite) {
                Some(ow) => cur = ow.parent,
                None => {
                    // `cur` is a root: it is the base, the walk ends one step early.
                    path.pop();
                    if let Some(s) = state.get_mut(cur) {
                        *s = DONE;
                    }
                    break (cur, 0, 0);
                }
            }
        };
        let (base_root, mut off, mut d) = base;
        for &i in path.iter().rev() {
            let ow_off = buffers
                .get(i)
                .and_then(|b| b.overwrite)
                .map_or(0, |ow| ow.offset_bytes);
            off = off.checked_add(ow_off).ok_or(PlanError::Overflow)?;
            d += 1;
            let align = buffers.get(i).map_or(1, |b| b.align_bytes);
            if off % align != 0 {
                return Err(PlanError::BadOverwrite {
                    index: i,
                    reason: format!(
                        "its place inside root {base_root} (offset {off}) breaks its \
                         alignment {align}"
                    ),
                });
            }
            if let Some(r) = root.get_mut(i) {
                *r = base_root;
            }
            if let Some(r) = rel_offset.get_mut(i) {
                *r = off;
            }
            if let Some(r) = depth.get_mut(i) {
                *r = d;
            }
            if let Some(s) = state.get_mut(i) {
                *s = DONE;
            }
        }
    }
    Ok(Structure {
        root,
        rel_offset,
        depth,
    })
}

/// What the planners place: one per overwrite chain that needs memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unit {
    pub size_bytes: u64,
    pub lower: u64,
    pub upper: u64,
    pub align_bytes: u64,
}

/// The planning units of a buffer slice and the way back to per-buffer offsets.
#[derive(Clone, Debug)]
pub(crate) struct Units {
    /// In order of their root buffer's index, so "file order" tie-breaks carry over.
    pub units: Vec<Unit>,
    /// Unit of each root buffer (`None` for non-roots and for chains needing no memory).
    unit_of_root: Vec<Option<usize>>,
    structure: Structure,
}

/// Checks `buffers` and builds their units; `min_align` is the planner's alignment option.
pub(crate) fn prepare(buffers: &[Buffer], min_align: u64) -> Result<Units, PlanError> {
    if !min_align.is_power_of_two() {
        return Err(PlanError::BadAlignOption(min_align));
    }
    let structure = structure(buffers)?;
    let n = buffers.len();
    // Per root: (lower, upper, align) over the chain's members that are ever live.
    let mut span: Vec<Option<(u64, u64)>> = vec![None; n];
    let mut align = vec![min_align; n];
    for (i, b) in buffers.iter().enumerate() {
        let r = structure.root.get(i).copied().unwrap_or(i);
        if let Some(a) = align.get_mut(r) {
            *a = (*a).max(b.align_bytes);
        }
        if b.lower < b.upper
            && let Some(s) = span.get_mut(r)
        {
            *s = Some(match *s {
                Some((lo, hi)) => (lo.min(b.lower), hi.max(b.upper)),
                None => (b.lower, b.upper),
            });
        }
    }
    let mut units = Vec::new();
    let mut unit_of_root = vec![None; n];
    // Every offset any planner here produces is at most the naive total, so checking that it
    // fits in 64 bits once makes the planners' offset arithmetic overflow-free.
    let mut naive_total: u64 = 0;
    for (i, b) in buffers.iter().enumerate() {
        if structure.root.get(i) != Some(&i) || b.size_bytes == 0 {
            continue;
        }
        let (Some(Some((lower, upper))), Some(&align_bytes)) = (span.get(i), align.get(i)) else {
            continue;
        };
        naive_total = align_up(naive_total, align_bytes)
            .and_then(|t| t.checked_add(b.size_bytes))
            .and_then(|t| t.checked_add(align_bytes))
            .ok_or(PlanError::Overflow)?;
        if let Some(u) = unit_of_root.get_mut(i) {
            *u = Some(units.len());
        }
        units.push(Unit {
            size_bytes: b.size_bytes,
            lower: *lower,
            upper: *upper,
            align_bytes,
        });
    }
    Ok(Units {
        units,
        unit_of_root,
        structure,
    })
}

impl Units {
    /// Per-buffer offsets from per-unit offsets; the total is the highest end unless the
    /// planner reserved more (`min_total`, e.g. alignment padding of shared objects).
    pub fn expand(&self, unit_offsets: &[u64], min_total: u64) -> Result<Plan, PlanError> {
        let mut total = min_total;
        for (u, &off) in self.units.iter().zip(unit_offsets) {
            total = total.max(off.checked_add(u.size_bytes).ok_or(PlanError::Overflow)?);
        }
        let mut offsets = Vec::with_capacity(self.structure.root.len());
        for (&r, &rel) in self.structure.root.iter().zip(&self.structure.rel_offset) {
            let base = self
                .unit_of_root
                .get(r)
                .copied()
                .flatten()
                .and_then(|u| unit_offsets.get(u).copied())
                .unwrap_or(0);
            offsets.push(base.checked_add(rel).ok_or(PlanError::Overflow)?);
        }
        Ok(Plan {
            offsets,
            total_bytes: total,
        })
    }

    /// The unit of buffer `i`'s chain, if it needs memory.
    pub fn unit_of_buffer(&self, i: usize) -> Option<usize> {
        let r = self.structure.root.get(i).copied()?;
        self.unit_of_root.get(r).copied().flatten()
    }

    /// Number of buffers the units came from.
    pub fn num_buffers(&self) -> usize {
        self.structure.root.len()
    }
}

/// A stretch of time during which buffer `buffer` is the outermost live member of its chain, so
/// the chain holds exactly that buffer's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub buffer: usize,
    pub lower: u64,
    pub upper: u64,
}

/// Cuts every chain's lifetime into [`Piece`]s; members that hold no memory are skipped. A
/// buffer that is alone in its chain gives one piece. O(n log n).
pub(crate) fn live_pieces(buffers: &[Buffer], s: &Structure) -> Vec<Piece> {
    let mut pieces = Vec::with_capacity(buffers.len());
    let mut members: Vec<(usize, usize)> = buffers
        .iter()
        .enumerate()
        .filter(|(_, b)| b.needs_memory())
        .map(|(i, _)| (s.root.get(i).copied().unwrap_or(i), i))
        .collect();
    members.sort_unstable();
    for chain in members.chunk_by(|a, b| a.0 == b.0) {
        match chain {
            [(_, i)] => {
                if let Some(b) = buffers.get(*i) {
                    pieces.push(Piece {
                        buffer: *i,
                        lower: b.lower,
                        upper: b.upper,
                    });
                }
            }
            _ => chain_pieces(buffers, s, chain, &mut pieces),
        }
    }
    pieces
}

fn chain_pieces(
    buffers: &[Buffer],
    s: &Structure,
    members: &[(usize, usize)],
    out: &mut Vec<Piece>,
) {
    // Sweep the chain's starts and ends; the live member of least depth owns each stretch.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(members.len() * 2);
    for &(_, i) in members {
        if let Some(b) = buffers.get(i) {
            events.push((b.lower, true, i));
            events.push((b.upper, false, i));
        }
    }
    events.sort_unstable_by_key(|e| e.0);
    let mut live: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut owner: Option<(usize, u64)> = None;
    let mut k = 0;
    while k < events.len() {
        let t = events.get(k).map_or(0, |e| e.0);
        while let Some(&(et, is_start, i)) = events.get(k) {
            if et != t {
                break;
            }
            let d = s.depth.get(i).copied().unwrap_or(0);
            if is_start {
                live.insert((d, i));
            } else {
                live.remove(&(d, i));
            }
            k += 1;
        }
        let now = live.first().map(|&(_, i)| i);
        if owner.map(|o| o.0) != now {
            if let Some((b, since)) = owner
                && since < t
            {
                out.push(Piece {
                    buffer: b,
                    lower: since,
                    upper: t,
                });
            }
            owner = now.map(|b| (b, t));
        }
    }
}
