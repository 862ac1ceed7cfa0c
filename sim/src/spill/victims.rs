//! The units that hold resident bytes, ordered for the eviction policy's choice.
//!
//! One ordered set keyed by what the policy ranks (last use for `lru`, next use for `furthest`
//! and `executor`, resident bytes for `largest`); `executor` also keeps them by last use, to
//! find the least recently used unit with no use in its queue. That scan skips only units
//! with a use in the queue, and each of those has an event among the next
//! [`EXECUTOR_QUEUE_EVENTS`], so it looks at no more than that many (plus the pinned unit).

use std::collections::BTreeSet;

use super::{EXECUTOR_QUEUE_EVENTS, Evict};

/// What the policies rank a unit by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct UnitKeys {
    pub last_use: u64,
    pub next_use: u64,
    pub resident_bytes: u64,
}

pub(super) struct Victims {
    evict: Evict,
    main: BTreeSet<(u64, u32)>,
    by_last_use: BTreeSet<(u64, u32)>,
    /// The keys each unit is filed under, to find its entries again.
    filed: Vec<Option<(u64, u64)>>,
}

impl Victims {
    pub(super) fn new(evict: Evict) -> Self {
        Self {
            evict,
            main: BTreeSet::new(),
            by_last_use: BTreeSet::new(),
            filed: Vec::new(),
        }
    }

    fn main_key(&self, k: &UnitKeys) -> u64 {
        match self.evict {
            Evict::Lru => k.last_use,
            Evict::Furthest | Evict::Executor => k.next_use,
            Evict::Largest => k.resident_bytes,
        }
    }

    /// Files `unit` under its current keys (or removes it when it holds nothing resident).
    pub(super) fn update(&mut self, unit: u32, k: &UnitKeys) {
        let i = unit as usize;
        if self.filed.len() <= i {
            self.filed.resize(i + 1, None);
        }
        let new = (k.resident_bytes > 0).then(|| (self.main_key(k), k.last_use));
        let Some(slot) = self.filed.get_mut(i) else {
            return;
        };
        if *slot == new {
            return;
        }
        if let Some((m, l)) = slot.take() {
            self.main.remove(&(m, unit));
            self.by_last_use.remove(&(l, unit));
        }
        if let Some((m, l)) = new {
            self.main.insert((m, unit));
            if self.evict == Evict::Executor {
                self.by_last_use.insert((l, unit));
            }
            *slot = Some((m, l));
        }
    }

    /// The unit to evict at event `now`, never `pinned`; `next_use` gives a unit's next use.
    pub(super) fn pick(&self, now: u64, pinned: u32, next_use: impl Fn(u32) -> u64) -> Option<u32> {
        let free = |&&(_, u): &&(u64, u32)| u != pinned;
        match self.evict {
            Evict::Lru => self.main.iter().find(free).map(|&(_, u)| u),
            Evict::Furthest | Evict::Largest => self.main.iter().rev().find(free).map(|&(_, u)| u),
            Evict::Executor => {
                let horizon = now.saturating_add(EXECUTOR_QUEUE_EVENTS);
                self.by_last_use
                    .iter()
                    .filter(free)
                    .find(|&&(_, u)| next_use(u) > horizon)
                    .or_else(|| self.main.iter().rev().find(free))
                    .map(|&(_, u)| u)
            }
        }
    }
}
