//! The OS swap baseline: 4 KiB pages, LRU page frames (the model is in the module docs of
//! [`crate::spill`]).
//!
//! LRU is a queue of (stamp, page) with lazy deletion: a touch pushes a fresh stamp, and an
//! entry whose stamp is no longer its page's is skipped when it reaches the front. The queue
//! is compacted when stale entries outnumber live ones, so it stays O(resident pages).

use std::collections::VecDeque;

use super::{IoModel, OsSwapStats, PAGE_BYTES, SpillError, Units, swap_remove_at};
use crate::hash::FastMap;
use crate::heap::Request;
use crate::policy::Policy;
use crate::trace::{EventKind, NO_ALLOC_ID, TraceView};

/// Most 4 KiB pages the baseline tracks (64 GiB of live blocks): each costs a map entry, and
/// a file's sizes must not size the model's memory.
pub const MAX_PAGES: u64 = 1 << 24;

#[derive(Clone, Copy, Debug)]
struct Page {
    /// Live blocks overlapping the page.
    refs: u32,
    /// `Some(stamp)` while in memory, `None` while swapped out.
    stamp: Option<u64>,
}

struct Frames {
    pages: FastMap<u64, Page>,
    queue: VecDeque<(u64, u64)>,
    frames: u64,
    resident: u64,
    next_stamp: u64,
    page_ins: u64,
    page_outs: u64,
}

impl Frames {
    /// `limit_bytes` of page frames (at least one), all empty.
    fn new(limit_bytes: u64) -> Self {
        Self {
            pages: FastMap::default(),
            queue: VecDeque::new(),
            frames: (limit_bytes / PAGE_BYTES).max(1),
            resident: 0,
            next_stamp: 0,
            page_ins: 0,
            page_outs: 0,
        }
    }

    /// Swaps out the least recently used page; false when nothing is in memory.
    fn evict_lru(&mut self) -> bool {
        while let Some((stamp, page)) = self.queue.pop_front() {
            if let Some(p) = self.pages.get_mut(&page)
                && p.stamp == Some(stamp)
            {
                p.stamp = None;
                self.resident -= 1;
                self.page_outs += 1;
                return true;
            }
        }
        false
    }

    fn make_room(&mut self) {
        while self.resident >= self.frames && self.evict_lru() {}
    }

    fn touch(&mut self, page: u64) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let Some(p) = self.pages.get_mut(&page) else {
            return;
        };
        if p.stamp.is_none() {
            // Every page is born in memory, so one out of it was swapped out: read it back.
            self.page_ins += 1;
            self.make_room();
            self.resident += 1;
        }
        if let Some(p) = self.pages.get_mut(&page) {
            p.stamp = Some(stamp);
        }
        self.queue.push_back((stamp, page));
        if self.queue.len() as u64 > 2 * self.resident + 1024 {
            let pages = &self.pages;
            self.queue
                .retain(|&(s, pg)| pages.get(&pg).is_some_and(|p| p.stamp == Some(s)));
        }
    }

    fn pages_of(addr: u64, len_bytes: u64) -> std::ops::RangeInclusive<u64> {
        let first = addr / PAGE_BYTES;
        let last = addr.saturating_add(len_bytes.max(1) - 1) / PAGE_BYTES;
        first..=last
    }

    /// A block is born: its pages gain a reference (new pages start in memory, unread).
    /// `Err(pages)` when the pages tracked would pass [`MAX_PAGES`].
    fn add_block(&mut self, addr: u64, len_bytes: u64) -> Result<(), u64> {
        let pages = Self::pages_of(addr, len_bytes);
        let tracked = (self.pages.len() as u64)
            .saturating_add(pages.end().saturating_sub(*pages.start()))
            .saturating_add(1);
        if tracked > MAX_PAGES {
            return Err(tracked);
        }
        for page in pages {
            match self.pages.get_mut(&page) {
                Some(p) => {
                    p.refs += 1;
                    self.touch(page);
                }
                None => {
                    self.make_room();
                    let stamp = self.next_stamp;
                    self.next_stamp += 1;
                    self.pages.insert(
                        page,
                        Page {
                            refs: 1,
                            stamp: Some(stamp),
                        },
                    );
                    self.resident += 1;
                    self.queue.push_back((stamp, page));
                }
            }
        }
        Ok(())
    }

    fn touch_block(&mut self, addr: u64, len_bytes: u64) {
        for page in Self::pages_of(addr, len_bytes) {
            self.touch(page);
        }
    }

    /// A block dies: pages no live block overlaps are dropped from memory and swap.
    fn remove_block(&mut self, addr: u64, len_bytes: u64) {
        for page in Self::pages_of(addr, len_bytes) {
            if let Some(p) = self.pages.get_mut(&page) {
                p.refs -= 1;
                if p.refs == 0 {
                    if p.stamp.is_some() {
                        self.resident -= 1;
                    }
                    self.pages.remove(&page);
                }
            }
        }
    }
}

/// The OS swap baseline for `trace` through `policy` (built without a limit), with
/// `limit_bytes` of page frames.
///
/// # Errors
/// When `units` does not give one unit per event, or the policy rejects a free.
pub fn os_swap(
    trace: &TraceView<'_>,
    units: Units<'_>,
    mut policy: Box<dyn Policy>,
    align_bytes: u64,
    limit_bytes: u64,
    io: &IoModel,
) -> Result<OsSwapStats, SpillError> {
    let n = trace.len();
    let unit_of_event = match units {
        Units::Blocks => None,
        Units::Executors(u) if u.len() == n => Some(u),
        Units::Executors(u) => {
            return Err(SpillError::UnitsLength {
                units: u.len(),
                events: n,
            });
        }
    };
    let mut f = Frames::new(limit_bytes);
    // (addr, reserved bytes, unit) of each served allocation.
    let mut placed: Vec<Option<(u64, u64, u32)>> = vec![None; trace.num_allocs as usize];
    let unit_count =
        unit_of_event.map_or(0, |u| u.iter().map(|&x| x as usize + 1).max().unwrap_or(0));
    let mut live_of_unit: Vec<Vec<u32>> = vec![Vec::new(); unit_count];
    let mut pos: Vec<u32> = vec![0; trace.num_allocs as usize];
    let mut active_unit = None;
    for i in 0..n {
        let (Some(&code), Some(&id)) = (trace.kind.get(i), trace.alloc_id.get(i)) else {
            break;
        };
        if let Some(u) = unit_of_event.and_then(|u| u.get(i).copied())
            && active_unit != Some(u)
        {
            active_unit = Some(u);
            for &b in live_of_unit.get(u as usize).map_or(&[][..], Vec::as_slice) {
                if let Some(Some((addr, len, _))) = placed.get(b as usize) {
                    f.touch_block(*addr, *len);
                }
            }
        }
        if id == NO_ALLOC_ID {
            continue;
        }
        if code == EventKind::Alloc as u8 {
            let size_bytes = trace.size_bytes.get(i).copied().unwrap_or(0);
            let req = Request {
                id,
                size_bytes,
                align_bytes,
            };
            let Ok(p) = crate::policy::alloc_capped(policy.as_mut(), req) else {
                continue;
            };
            let unit = active_unit.unwrap_or(0);
            f.add_block(p.addr, p.reserved_bytes)
                .map_err(|pages| SpillError::TooManyPages { event: i, pages })?;
            if let (Some(slot), Some(list), Some(at)) = (
                placed.get_mut(id as usize),
                live_of_unit.get_mut(unit as usize),
                pos.get_mut(id as usize),
            ) {
                *slot = Some((p.addr, p.reserved_bytes, unit));
                *at = list.len() as u32;
                list.push(id);
            } else if let Some(slot) = placed.get_mut(id as usize) {
                *slot = Some((p.addr, p.reserved_bytes, unit));
            }
        } else if code == EventKind::Free as u8 {
            let Some(Some((addr, len, unit))) = placed.get_mut(id as usize).map(Option::take)
            else {
                continue;
            };
            f.touch_block(addr, len);
            f.remove_block(addr, len);
            if let Some(list) = live_of_unit.get_mut(unit as usize) {
                swap_remove_at(list, &mut pos, id);
            }
            policy.free(addr).map_err(|e| SpillError::FreeRejected {
                event: i,
                reason: e.to_string(),
            })?;
        }
    }
    let spilled_bytes = f.page_outs * PAGE_BYTES;
    let reloaded_bytes = f.page_ins * PAGE_BYTES;
    Ok(OsSwapStats {
        spilled_bytes,
        reloaded_bytes,
        page_outs: f.page_outs,
        page_ins: f.page_ins,
        estimated_io_seconds: io.seconds(spilled_bytes + reloaded_bytes, f.page_outs + f.page_ins),
    })
}
