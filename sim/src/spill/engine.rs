//! The spill simulation of one eviction policy (the model is in the module docs of
//! [`crate::spill`]).

use super::victims::{UnitKeys, Victims};
use super::{Evict, IoModel, SpillError, SpillStats, Units, next_same_unit, swap_remove_at};
use crate::heap::{AllocError, Request};
use crate::policy::Policy;
use crate::trace::{EventKind, NO_ALLOC_ID, TraceView};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Not allocated yet.
    Absent,
    Resident,
    Spilled,
    /// Its allocation failed, or its data was lost to a failed reload: later uses are skipped.
    Dropped,
    Freed,
}

#[derive(Clone, Copy, Debug)]
struct Blk {
    size_bytes: u64,
    unit: u32,
    state: State,
    addr: u64,
}

#[derive(Clone, Debug, Default)]
struct Unit {
    resident: Vec<u32>,
    spilled: Vec<u32>,
    keys: UnitKeys,
}

struct Sim {
    policy: Box<dyn Policy>,
    align_bytes: u64,
    blocks: Vec<Blk>,
    /// Each block's index in its unit's `resident` or `spilled` list.
    pos: Vec<u32>,
    units: Vec<Unit>,
    victims: Victims,
    now: u64,
    waited: bool,
    on_disk_bytes: u64,
    stats: SpillStats,
}

/// Replays `trace` through `policy` (built with the limit), spilling with `evict`.
///
/// # Errors
/// When `units` does not give one unit per event, or the policy rejects a free (a policy bug).
pub fn simulate(
    trace: &TraceView<'_>,
    units: Units<'_>,
    policy: Box<dyn Policy>,
    align_bytes: u64,
    evict: Evict,
    io: &IoModel,
) -> Result<SpillStats, SpillError> {
    let n = trace.len();
    let (unit_of_event, next_same) = match units {
        Units::Blocks => (None, Vec::new()),
        Units::Executors(u) if u.len() == n => (Some(u), next_same_unit(u)),
        Units::Executors(u) => {
            return Err(SpillError::UnitsLength {
                units: u.len(),
                events: n,
            });
        }
    };
    // Block units: a block's next use after its allocation is its free.
    let mut free_at = vec![u64::MAX; trace.num_allocs as usize];
    if unit_of_event.is_none() {
        for (i, (&k, &id)) in trace.kind.iter().zip(trace.alloc_id).enumerate() {
            if k == EventKind::Free as u8
                && let Some(f) = free_at.get_mut(id as usize)
            {
                *f = i as u64;
            }
        }
    }
    let unit_count = match unit_of_event {
        Some(u) => u.iter().map(|&x| x as usize + 1).max().unwrap_or(0),
        None => trace.num_allocs as usize,
    };
    let mut sim = Sim {
        policy,
        align_bytes,
        blocks: vec![
            Blk {
                size_bytes: 0,
                unit: 0,
                state: State::Absent,
                addr: 0,
            };
            trace.num_allocs as usize
        ],
        pos: vec![0; trace.num_allocs as usize],
        units: vec![Unit::default(); unit_count],
        victims: Victims::new(evict),
        now: 0,
        waited: false,
        on_disk_bytes: 0,
        stats: SpillStats::zero(evict),
    };
    for i in 0..n {
        sim.now = i as u64;
        sim.waited = false;
        let (Some(&code), Some(&id)) = (trace.kind.get(i), trace.alloc_id.get(i)) else {
            break;
        };
        let unit = match unit_of_event {
            Some(u) => {
                let unit = u.get(i).copied().unwrap_or(0);
                let next = next_same.get(i).copied().unwrap_or(u64::MAX);
                sim.activate(unit, next)?;
                unit
            }
            None => id,
        };
        if id != NO_ALLOC_ID {
            if code == EventKind::Alloc as u8 {
                let size = trace.size_bytes.get(i).copied().unwrap_or(0);
                // A block unit is born here; an executor's keys were set by `activate`.
                let next = unit_of_event
                    .is_none()
                    .then(|| free_at.get(id as usize).copied().unwrap_or(u64::MAX));
                sim.alloc(id, size, unit, next)?;
            } else if code == EventKind::Free as u8 {
                sim.free(id, unit)?;
            }
        }
        if sim.waited {
            sim.stats.stalls += 1;
        }
    }
    let s = &mut sim.stats;
    s.estimated_io_seconds =
        io.seconds(s.spilled_bytes + s.reloaded_bytes, s.evictions + s.reloads);
    Ok(sim.stats)
}

/// Frees `addr` in the policy; a rejected free is a policy bug, reported with its event.
fn release(policy: &mut dyn Policy, addr: u64, event: u64) -> Result<(), SpillError> {
    policy.free(addr).map_err(|e| SpillError::FreeRejected {
        event: event as usize,
        reason: e.to_string(),
    })
}

impl Sim {
    fn refile(&mut self, unit: u32) {
        if let Some(u) = self.units.get(unit as usize) {
            let keys = u.keys;
            self.victims.update(unit, &keys);
        }
    }

    /// Executor units: the unit has an event, so all its data must be resident.
    fn activate(&mut self, unit: u32, next_use: u64) -> Result<(), SpillError> {
        let spilled = self
            .units
            .get(unit as usize)
            .map(|u| u.spilled.clone())
            .unwrap_or_default();
        let mut any = false;
        for b in spilled {
            any |= self.reload(b, unit)?;
        }
        if any {
            self.stats.reloads += 1;
        }
        if let Some(u) = self.units.get_mut(unit as usize) {
            u.keys.last_use = self.now;
            u.keys.next_use = next_use;
        }
        self.refile(unit);
        Ok(())
    }

    /// Serves `size` bytes for block `id`, evicting until it fits; `None` when nothing more
    /// can be evicted (or the policy cannot serve the request at all).
    fn place(&mut self, id: u32, size_bytes: u64, pinned: u32) -> Result<Option<u64>, SpillError> {
        let req = Request {
            id,
            size_bytes,
            align_bytes: self.align_bytes,
        };
        loop {
            match crate::policy::alloc_capped(self.policy.as_mut(), req) {
                Ok(p) => return Ok(Some(p.addr)),
                Err(AllocError::Unsupported(_)) => return Ok(None),
                Err(AllocError::OutOfMemory { .. }) => {
                    let units = &self.units;
                    let next = |u: u32| units.get(u as usize).map_or(u64::MAX, |x| x.keys.next_use);
                    match self.victims.pick(self.now, pinned, next) {
                        Some(v) => self.evict_unit(v)?,
                        None => return Ok(None),
                    }
                }
            }
        }
    }

    fn evict_unit(&mut self, v: u32) -> Result<(), SpillError> {
        let Some(unit) = self.units.get_mut(v as usize) else {
            return Ok(());
        };
        let resident = std::mem::take(&mut unit.resident);
        unit.keys.resident_bytes = 0;
        for b in resident {
            let Some(blk) = self.blocks.get_mut(b as usize) else {
                continue;
            };
            release(self.policy.as_mut(), blk.addr, self.now)?;
            blk.state = State::Spilled;
            self.stats.spilled_bytes += blk.size_bytes;
            self.on_disk_bytes += blk.size_bytes;
            if let (Some(unit), Some(p)) =
                (self.units.get_mut(v as usize), self.pos.get_mut(b as usize))
            {
                *p = unit.spilled.len() as u32;
                unit.spilled.push(b);
            }
        }
        self.stats.peak_spilled_bytes = self.stats.peak_spilled_bytes.max(self.on_disk_bytes);
        self.stats.evictions += 1;
        self.waited = true;
        self.refile(v);
        Ok(())
    }

    fn make_resident(&mut self, b: u32, addr: u64) {
        let Some(blk) = self.blocks.get_mut(b as usize) else {
            return;
        };
        blk.state = State::Resident;
        blk.addr = addr;
        let (unit, size) = (blk.unit, blk.size_bytes);
        if let (Some(u), Some(p)) = (
            self.units.get_mut(unit as usize),
            self.pos.get_mut(b as usize),
        ) {
            *p = u.resident.len() as u32;
            u.resident.push(b);
            u.keys.resident_bytes += size;
        }
        self.refile(unit);
    }

    /// Reads spilled block `b` back; false (and a reload failure) when it cannot fit.
    fn reload(&mut self, b: u32, pinned: u32) -> Result<bool, SpillError> {
        let Some(&blk) = self.blocks.get(b as usize) else {
            return Ok(false);
        };
        if blk.state != State::Spilled {
            return Ok(false);
        }
        if let Some(u) = self.units.get_mut(blk.unit as usize) {
            swap_remove_at(&mut u.spilled, &mut self.pos, b);
        }
        self.on_disk_bytes -= blk.size_bytes;
        self.waited = true;
        match self.place(b, blk.size_bytes, pinned)? {
            Some(addr) => {
                self.stats.reloaded_bytes += blk.size_bytes;
                self.make_resident(b, addr);
                Ok(true)
            }
            None => {
                self.stats.reload_failures += 1;
                if let Some(x) = self.blocks.get_mut(b as usize) {
                    x.state = State::Dropped;
                }
                Ok(false)
            }
        }
    }

    fn alloc(
        &mut self,
        id: u32,
        size_bytes: u64,
        unit: u32,
        block_next_use: Option<u64>,
    ) -> Result<(), SpillError> {
        if let Some(blk) = self.blocks.get_mut(id as usize) {
            blk.size_bytes = size_bytes;
            blk.unit = unit;
        }
        if let Some(next_use) = block_next_use
            && let Some(u) = self.units.get_mut(unit as usize)
        {
            u.keys.last_use = self.now;
            u.keys.next_use = next_use;
        }
        match self.place(id, size_bytes, unit)? {
            Some(addr) => self.make_resident(id, addr),
            None => {
                self.stats.failed += 1;
                if let Some(blk) = self.blocks.get_mut(id as usize) {
                    blk.state = State::Dropped;
                }
            }
        }
        Ok(())
    }

    fn free(&mut self, id: u32, pinned: u32) -> Result<(), SpillError> {
        let Some(&blk) = self.blocks.get(id as usize) else {
            return Ok(());
        };
        match blk.state {
            State::Spilled => {
                // Block units: the free is a use of the block.
                if self.reload(id, pinned)? {
                    self.stats.reloads += 1;
                } else {
                    return Ok(());
                }
            }
            State::Resident => {}
            State::Absent | State::Dropped | State::Freed => return Ok(()),
        }
        let Some(blk) = self.blocks.get_mut(id as usize) else {
            return Ok(());
        };
        release(self.policy.as_mut(), blk.addr, self.now)?;
        blk.state = State::Freed;
        let (unit, size) = (blk.unit, blk.size_bytes);
        if let Some(u) = self.units.get_mut(unit as usize) {
            swap_remove_at(&mut u.resident, &mut self.pos, id);
            u.keys.resident_bytes -= size;
        }
        self.refile(unit);
        Ok(())
    }
}
