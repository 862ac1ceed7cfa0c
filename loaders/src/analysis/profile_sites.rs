//! Memory by allocation site in a heap profile ([`crate::profile`]): the rows `sites` and
//! `diff` print and the folded stacks of `flamegraph`, from the profile's samples as
//! [`super::site_stats`] makes them from events, with the same grouping.

use std::collections::HashMap;

use super::site_stats::{GroupBy, SiteRow, fold_lines, group_key, group_name};
use crate::profile::{HeapProfile, ProfileSample};

/// Which of a profile's moments is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileMoment {
    /// What the profile holds as live: pprof's `inuse_*`, DHAT's at the end.
    Live,
    /// DHAT's global peak.
    Peak,
}

impl ProfileMoment {
    /// The moment `--at` names: `peak` is the profile's peak where it has one (DHAT), else its
    /// one moment; `end` its live figures. Events and times name nothing in a profile.
    ///
    /// # Errors
    /// Any other `--at`, with what the profile holds.
    pub fn parse(at: &str, p: &HeapProfile) -> Result<Self, String> {
        match at.trim() {
            "peak" if p.has.peak => Ok(Self::Peak),
            "peak" | "end" => Ok(Self::Live),
            other => Err(format!(
                "--at {other}: a {} heap profile holds {}, not events or times",
                p.format.name(),
                if p.has.peak {
                    "two moments, `peak` and `end`"
                } else {
                    "one moment (`peak` and `end` both read it)"
                }
            )),
        }
    }

    /// The live bytes and objects of `s` at this moment.
    #[must_use]
    pub fn live(self, s: &ProfileSample) -> (u64, u64) {
        match self {
            Self::Live => (s.live_bytes, s.live_objects),
            Self::Peak => (s.peak_bytes, s.peak_objects),
        }
    }
}

/// The profile's sites at `moment`, grouped `by`, sorted by live bytes then allocated bytes
/// (largest first), as [`super::site_stats::by_site`] sorts them.
#[must_use]
pub fn profile_rows(p: &HeapProfile, moment: ProfileMoment, by: GroupBy) -> Vec<SiteRow> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut rows: Vec<SiteRow> = Vec::new();
    let mut best: Vec<u64> = Vec::new();
    for s in &p.samples {
        let key = group_key(&p.stacks, s.stack, by);
        let i = *index.entry(key).or_insert_with(|| {
            rows.push(SiteRow {
                name: group_name(&p.stacks, s.stack, by),
                stack: s.stack,
                ..SiteRow::default()
            });
            best.push(0);
            rows.len() - 1
        });
        let (bytes, objects) = moment.live(s);
        if let Some(r) = rows.get_mut(i) {
            r.live_bytes += bytes;
            r.live_blocks += objects;
            r.alloc_bytes += s.alloc_bytes;
            r.alloc_count += s.alloc_objects;
            // The group's stack: the one with the most live bytes.
            if let Some(b) = best.get_mut(i)
                && bytes > *b
            {
                *b = bytes;
                r.stack = s.stack;
            }
        }
    }
    rows.sort_by(|a, b| {
        b.live_bytes
            .cmp(&a.live_bytes)
            .then(b.alloc_bytes.cmp(&a.alloc_bytes))
            .then_with(|| a.name.cmp(&b.name))
    });
    rows
}

/// Folded stacks of the profile: `live` at `moment`, `allocated` bytes or allocation `count`.
#[must_use]
pub fn profile_folded(
    p: &HeapProfile,
    moment: ProfileMoment,
    metric: &str,
    frame: &dyn Fn(&str) -> String,
) -> Vec<String> {
    let mut by_stack: HashMap<u32, u64> = HashMap::new();
    for s in &p.samples {
        let v = match metric {
            "live" => moment.live(s).0,
            "count" => s.alloc_objects,
            _ => s.alloc_bytes,
        };
        *by_stack.entry(s.stack).or_insert(0) += v;
    }
    fold_lines(&p.stacks, by_stack, frame)
}
