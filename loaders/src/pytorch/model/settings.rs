//! `allocator_settings`: every key with its value as bounded text, and the values the
//! `pytorch` policy reads.

use super::render::{CUT, SETTINGS_TEXT_BYTES, VALUE_TEXT_BYTES, render};
use super::{Reader, Settings, short};
use crate::pytorch::pickle::Val;

impl Reader {
    pub(super) fn settings(&mut self, s: Val<'_>) -> Settings {
        let mut out = Settings {
            present: true,
            ..Settings::default()
        };
        let Some(items) = s.dict_items() else {
            self.skip(format!("allocator_settings is a {}", s.kind_name()));
            return out;
        };
        // Values render to a bounded text each, and all of them together too.
        let mut text_left = SETTINGS_TEXT_BYTES;
        for (k, v) in items {
            let Some(key) = k.as_str() else { continue };
            let text = if text_left > 0 {
                render(v, VALUE_TEXT_BYTES.min(text_left))
            } else {
                CUT.to_owned()
            };
            text_left = text_left.saturating_sub(text.len());
            if !self.budget.charge(key.len() + text.len(), || {
                format!("setting {:?}", short(key))
            }) {
                return out;
            }
            out.raw.push((key.to_owned(), text));
            let p = &mut out.policy;
            match key {
                // -1 (SIZE_MAX as int64) means unlimited.
                "max_split_size" => {
                    p.max_split_size_bytes = v.as_i64().filter(|&m| m > 0).map(|m| m as u64);
                }
                "garbage_collection_threshold" => {
                    let t = v.as_f64().unwrap_or(0.0).clamp(0.0, 1.0);
                    p.garbage_collection_threshold_ppm = (t * 1e6).round() as u32;
                }
                "expandable_segments" => {
                    p.expandable_segments = v.as_bool().unwrap_or(false);
                }
                "max_non_split_rounding_size" => {
                    if let Some(b) = v.as_u64().filter(|&b| b > 0) {
                        p.max_non_split_rounding_bytes = b;
                    }
                }
                "roundup_power2_divisions" => read_divisions(v, &mut p.roundup_power2_divisions),
                _ => {}
            }
        }
        out
    }
}

/// `roundup_power2_divisions`: a dict keyed by the MiB start of each power-of-two interval
/// (`'1'` .. `'32768'`), or one number for every interval.
fn read_divisions(v: Val<'_>, out: &mut [u32; 16]) {
    if let Some(n) = v.as_u64() {
        out.fill(u32::try_from(n).unwrap_or(0));
        return;
    }
    if let Some(items) = v.dict_items() {
        for (k, d) in items {
            let mib = k
                .as_str()
                .and_then(|s| s.parse::<u64>().ok())
                .or_else(|| k.as_u64());
            let (Some(mib), Some(d)) = (mib, d.as_u64()) else {
                continue;
            };
            if mib.is_power_of_two() {
                let interval = mib.trailing_zeros() as usize;
                if let Some(slot) = out.get_mut(interval) {
                    *slot = u32::try_from(d).unwrap_or(0);
                }
            }
        }
    } else if let Some(seq) = v.seq() {
        // A list by interval, as some builds print it.
        for (slot, d) in out.iter_mut().zip(seq) {
            *slot = d.as_u64().and_then(|d| u32::try_from(d).ok()).unwrap_or(0);
        }
    }
}
