//! Policy variants: `NAME:key=value:key=value`, so one run can ask "what if".
//!
//! `pytorch:max_split_size_mb=128`, `bfc:allow_growth=false`, `buddy:min_block=4096`: a
//! [`PolicySpec`] is a registered policy name and parameters that override the run's
//! [`PolicyConfig`] for that policy alone. Each variant is its own row and timeline, labelled
//! with the text the user wrote. [`PARAMS`] lists every key; sizes take units (`4KiB`, `2GiB`).
//!
//! Every policy takes `limit` and `align`. Values may not contain `:` except inside `[...]`
//! (PyTorch's `roundup_power2_divisions=[256:1,512:2,>:8]`), and a list of specs is split at
//! commas outside brackets ([`split_specs`]).

use crate::policy::config::{PolicyConfig, RegistryError};
use crate::policy::pytorch::PytorchSettings;
use crate::policy::registry::POLICY_NAMES;
use crate::units::parse_bytes;

/// `(policy, key, what it sets)` for every parameter; `*` is every policy.
pub const PARAMS: &[(&str, &str, &str)] = &[
    (
        "*",
        "limit",
        "memory limit in bytes (units allowed), or `none`",
    ),
    ("*", "align", "alignment of every request, a power of two"),
    (
        "bfc",
        "allow_growth",
        "grow regions on demand (true) or reserve the limit at once",
    ),
    (
        "bfc",
        "garbage_collection",
        "release free regions and retry before failing",
    ),
    (
        "buddy",
        "min_block",
        "size of an order-0 block, a power of two",
    ),
    (
        "buddy",
        "max_order",
        "highest order (top-level block = min_block << max_order)",
    ),
    ("pool", "block_size", "size of each bump block"),
    ("glibc", "mmap_threshold", "initial mmap threshold"),
    (
        "pytorch",
        "max_split_size_mb",
        "blocks at least this big are never split (> 20), or `unlimited`",
    ),
    (
        "pytorch",
        "roundup_power2_divisions",
        "divisions per power-of-two interval: N for all, or [256:1,512:2,>:8] by MiB",
    ),
    (
        "pytorch",
        "garbage_collection_threshold",
        "fraction of the limit (0..1) past which idle cached blocks are freed",
    ),
    (
        "pytorch",
        "expandable_segments",
        "grow one segment per pool by mapping pages",
    ),
    (
        "pytorch",
        "max_non_split_rounding_mb",
        "oversize blocks may exceed the request by this much (>= 20)",
    ),
    (
        "predictive",
        "lifetimes",
        "`true`: class blocks by their true lifetimes (the upper bound of prediction)",
    ),
    (
        "predictive",
        "short_allocs",
        "a block freed before this many more allocations is short-lived (default 64)",
    ),
    (
        "pytorch",
        "start",
        "`snapshot`: the state rebuilt from a snapshot (default for plain `pytorch` on one); `empty`: an empty allocator",
    ),
];

/// A registered policy with parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySpec {
    pub name: &'static str,
    /// `(key, value)` in the order written.
    pub params: Vec<(String, String)>,
}

impl PolicySpec {
    /// A policy without parameters.
    #[must_use]
    pub fn plain(name: &'static str) -> Self {
        Self {
            name,
            params: Vec::new(),
        }
    }

    /// Parses `NAME` or `NAME:key=value:...`.
    ///
    /// # Errors
    /// An unknown policy or key, a malformed parameter, or a value of the wrong kind.
    pub fn parse(text: &str) -> Result<Self, RegistryError> {
        let text_trimmed = text.trim();
        let (base, rest) = text_trimmed.split_once(':').unwrap_or((text_trimmed, ""));
        let base = base.trim();
        let parts = variant_params(rest);
        let Some(&name) = POLICY_NAMES.iter().find(|&&n| n == base) else {
            return Err(RegistryError::UnknownPolicy {
                name: base.to_owned(),
                known: POLICY_NAMES.to_vec(),
            });
        };
        let mut params = Vec::new();
        for p in parts {
            let bad = |reason: String| RegistryError::InvalidConfig {
                name: text.to_owned(),
                reason,
            };
            let Some((k, v)) = p.split_once('=') else {
                return Err(bad(format!("parameter {p:?} is not key=value")));
            };
            let (k, v) = (k.trim(), v.trim());
            if !PARAMS
                .iter()
                .any(|&(pol, key, _)| key == k && (pol == "*" || pol == name))
            {
                let known: Vec<&str> = PARAMS
                    .iter()
                    .filter(|&&(pol, _, _)| pol == "*" || pol == name)
                    .map(|&(_, key, _)| key)
                    .collect();
                return Err(bad(format!(
                    "{name} has no parameter {k:?}; it takes: {}",
                    known.join(", ")
                )));
            }
            if params.iter().any(|(pk, _): &(String, String)| pk == k) {
                return Err(bad(format!("parameter {k:?} given twice")));
            }
            params.push((k.to_owned(), v.to_owned()));
        }
        let spec = Self { name, params };
        // Validate the values now, against a default configuration, so a typo fails before
        // any replay starts.
        spec.apply(&PolicyConfig::default())?;
        Ok(spec)
    }

    /// The label of this variant's row: the name, then `:key=value` per parameter.
    #[must_use]
    pub fn label(&self) -> String {
        let mut s = self.name.to_owned();
        for (k, v) in &self.params {
            s.push(':');
            s.push_str(k);
            s.push('=');
            s.push_str(v);
        }
        s
    }

    /// True for a policy without parameters.
    #[must_use]
    pub fn is_plain(&self) -> bool {
        self.params.is_empty()
    }

    /// The configuration this variant runs with: `base` with the parameters applied. A
    /// `pytorch` variant that changes a setting replays from an empty allocator (the rebuilt
    /// snapshot state was made under the recorded settings), unless asked otherwise.
    ///
    /// # Errors
    /// A value of the wrong kind or out of range.
    pub fn apply(&self, base: &PolicyConfig) -> Result<PolicyConfig, RegistryError> {
        let mut c = base.clone();
        let mut changes_settings = false;
        let mut start: Option<&str> = None;
        for (k, v) in &self.params {
            let bad = |reason: String| RegistryError::InvalidConfig {
                name: self.label(),
                reason: format!("{k}={v}: {reason}"),
            };
            match k.as_str() {
                "limit" => {
                    c.limit_bytes = if v.eq_ignore_ascii_case("none") {
                        None
                    } else {
                        Some(parse_bytes(v).map_err(bad)?)
                    };
                }
                "align" => {
                    let a = parse_bytes(v).map_err(bad)?;
                    if !a.is_power_of_two() {
                        return Err(bad("must be a power of two".to_owned()));
                    }
                    c.align_bytes = a;
                }
                "allow_growth" => c.bfc_allow_growth = parse_bool(v).map_err(bad)?,
                "garbage_collection" => c.bfc_garbage_collection = parse_bool(v).map_err(bad)?,
                "min_block" => {
                    let b = parse_bytes(v).map_err(bad)?;
                    if !b.is_power_of_two() {
                        return Err(bad("must be a power of two".to_owned()));
                    }
                    c.buddy_min_block_bytes = b;
                }
                "max_order" => {
                    c.buddy_max_order =
                        v.parse().map_err(|_| bad("expected a number".to_owned()))?;
                }
                "block_size" => c.pool_block_bytes = parse_bytes(v).map_err(bad)?,
                "mmap_threshold" => c.glibc_mmap_threshold_bytes = parse_bytes(v).map_err(bad)?,
                "lifetimes" => c.predictive_true_lifetimes = parse_bool(v).map_err(bad)?,
                "short_allocs" => {
                    let n: u64 = v.parse().map_err(|_| bad("expected a number".to_owned()))?;
                    if n == 0 {
                        return Err(bad("must be at least 1".to_owned()));
                    }
                    c.predictive_short_allocs = n;
                }
                "start" => {
                    start = Some(match v.as_str() {
                        "snapshot" => "snapshot",
                        "empty" => "empty",
                        _ => return Err(bad("expected `snapshot` or `empty`".to_owned())),
                    });
                }
                _ => {
                    apply_pytorch(&mut c.pytorch, k, v).map_err(bad)?;
                    changes_settings = true;
                }
            }
        }
        if self.name == "pytorch" {
            match start {
                Some("snapshot") if changes_settings => {
                    return Err(RegistryError::InvalidConfig {
                        name: self.label(),
                        reason: "start=snapshot replays the snapshot's own settings; a variant \
                                 that changes a setting starts empty"
                            .to_owned(),
                    });
                }
                Some("empty") => c.pytorch_script = None,
                Some(_) => {}
                None if changes_settings => c.pytorch_script = None,
                None => {}
            }
        }
        Ok(c)
    }
}

/// Splits a `--policy` list at commas outside brackets.
#[must_use]
pub fn split_specs(text: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    let mut ends: Vec<(usize, usize)> = Vec::new();
    for piece in split_outside_brackets(text, ',') {
        let trimmed = piece.trim();
        if trimmed.is_empty() {
            continue;
        }
        let start = trimmed.as_ptr() as usize - text.as_ptr() as usize;
        let end = start + trimmed.len();
        // `real-jemalloc:dirty_decay_ms=0,narenas=2`: a piece that starts with a `key=value`
        // (no policy name has `=`) goes on with the variant before it.
        let head = trimmed.split(':').next().unwrap_or_default();
        if head.contains('=')
            && let Some(last) = ends.last_mut()
        {
            last.1 = end;
            continue;
        }
        ends.push((start, end));
    }
    for (start, end) in ends {
        if let Some(s) = text.get(start..end) {
            out.push(s);
        }
    }
    out
}

/// The `key=value` parameters of a variant (its text after the name): separated by `:`, or
/// by `,` as `real-jemalloc:dirty_decay_ms=0,narenas=2` writes them, outside brackets.
#[must_use]
pub fn variant_params(params: &str) -> Vec<&str> {
    split_outside_brackets(params, ':')
        .into_iter()
        .flat_map(|p| split_outside_brackets(p, ','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn split_outside_brackets(text: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, ch) in text.char_indices() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            c if c == sep && depth == 0 => {
                out.push(&text[start..i]);
                start = i + ch.len_utf8();
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

fn parse_bool(v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err("expected true or false".to_owned()),
    }
}

const MIB: u64 = 1 << 20;

/// One `pytorch` setting, with PyTorch's own checks (`PYTORCH_CUDA_ALLOC_CONF`).
fn apply_pytorch(p: &mut PytorchSettings, key: &str, v: &str) -> Result<(), String> {
    match key {
        "max_split_size_mb" => {
            if matches!(v, "unlimited" | "none" | "-1") {
                p.max_split_size_bytes = None;
                return Ok(());
            }
            let mb: u64 = v
                .parse()
                .map_err(|_| "expected MiB or `unlimited`".to_owned())?;
            if mb <= 20 {
                return Err("PyTorch requires more than 20 (MiB)".to_owned());
            }
            p.max_split_size_bytes = Some(mb.checked_mul(MIB).ok_or("too large")?);
        }
        "max_non_split_rounding_mb" => {
            let mb: u64 = v.parse().map_err(|_| "expected MiB".to_owned())?;
            if mb < 20 {
                return Err("must be at least 20 (MiB)".to_owned());
            }
            p.max_non_split_rounding_bytes = mb.checked_mul(MIB).ok_or("too large")?;
        }
        "garbage_collection_threshold" => {
            let t: f64 = v.parse().map_err(|_| "expected a fraction".to_owned())?;
            if !(t > 0.0 && t < 1.0) {
                return Err("must be between 0 and 1 (exclusive)".to_owned());
            }
            p.garbage_collection_threshold_ppm = (t * 1e6).round() as u32;
        }
        "expandable_segments" => p.expandable_segments = parse_bool(v)?,
        "roundup_power2_divisions" => p.roundup_power2_divisions = parse_divisions(v)?,
        _ => return Err("unknown parameter".to_owned()),
    }
    Ok(())
}

/// `N` for every interval, or `[K:N,...,>:N]` keyed by the MiB start of each power-of-two
/// interval. As in PyTorch's parser: the first key's value also fills every lower interval, and
/// `>` fills from the last key's interval (inclusive) upward.
fn parse_divisions(v: &str) -> Result<[u32; 16], String> {
    let check = |n: &str| -> Result<u32, String> {
        let d: u32 = n
            .trim()
            .parse()
            .map_err(|_| format!("expected a number of divisions, got {n:?}"))?;
        if d != 0 && !d.is_power_of_two() {
            return Err(format!("divisions must be a power of two or 0, got {d}"));
        }
        Ok(d)
    };
    let mut out = [0u32; 16];
    let Some(inner) = v.strip_prefix('[').and_then(|s| s.strip_suffix(']')) else {
        out.fill(check(v)?);
        return Ok(out);
    };
    let mut last_interval: Option<usize> = None;
    for item in inner.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, d) = item
            .split_once(':')
            .ok_or_else(|| format!("expected KEY:DIVISIONS, got {item:?}"))?;
        let d = check(d)?;
        if k.trim() == ">" {
            let from = last_interval.map_or(0, |i| i);
            for slot in out.iter_mut().skip(from) {
                *slot = d;
            }
            continue;
        }
        let mib: u64 = k
            .trim()
            .parse()
            .map_err(|_| format!("expected a size in MiB or `>`, got {k:?}"))?;
        if !mib.is_power_of_two() {
            return Err(format!(
                "interval keys must be powers of two (MiB), got {mib}"
            ));
        }
        let interval = (mib.trailing_zeros() as usize).min(15);
        if last_interval.is_none() {
            for slot in out.iter_mut().take(interval) {
                *slot = d;
            }
        }
        if let Some(slot) = out.get_mut(interval) {
            *slot = d;
        }
        last_interval = Some(interval);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_and_variants_parse() {
        let s = PolicySpec::parse("bfc").unwrap();
        assert!(s.is_plain());
        assert_eq!(s.label(), "bfc");
        let s =
            PolicySpec::parse("pytorch:max_split_size_mb=128:expandable_segments=true").unwrap();
        assert_eq!(
            s.label(),
            "pytorch:max_split_size_mb=128:expandable_segments=true"
        );
        let c = s.apply(&PolicyConfig::default()).unwrap();
        assert_eq!(c.pytorch.max_split_size_bytes, Some(128 << 20));
        assert!(c.pytorch.expandable_segments);
        let c = PolicySpec::parse("bfc:allow_growth=false:limit=2GiB")
            .unwrap()
            .apply(&PolicyConfig::default())
            .unwrap();
        assert!(!c.bfc_allow_growth);
        assert_eq!(c.limit_bytes, Some(2 << 30));
        let c = PolicySpec::parse("buddy:min_block=4096")
            .unwrap()
            .apply(&PolicyConfig::default())
            .unwrap();
        assert_eq!(c.buddy_min_block_bytes, 4096);
    }

    #[test]
    fn predictive_variants_parse() {
        let c = PolicySpec::parse("predictive:lifetimes=true:short_allocs=16")
            .unwrap()
            .apply(&PolicyConfig::default())
            .unwrap();
        assert!(c.predictive_true_lifetimes);
        assert_eq!(c.predictive_short_allocs, 16);
        assert!(PolicySpec::parse("predictive:short_allocs=0").is_err());
        assert!(PolicySpec::parse("predictive:lifetimes=sometimes").is_err());
        assert!(PolicySpec::parse("best-fit:lifetimes=true").is_err());
    }

    #[test]
    fn bad_variants_say_why() {
        let e = PolicySpec::parse("bfc:max_split_size_mb=128").unwrap_err();
        assert!(e.to_string().contains("allow_growth"), "{e}");
        assert!(PolicySpec::parse("tlsf").is_err());
        assert!(PolicySpec::parse("buddy:min_block=3000").is_err());
        assert!(PolicySpec::parse("pytorch:max_split_size_mb=10").is_err());
        assert!(PolicySpec::parse("pytorch:expandable_segments=maybe").is_err());
        assert!(PolicySpec::parse("bfc:limit=1G:limit=2G").is_err());
        assert!(PolicySpec::parse("bfc:limit").is_err());
        assert!(PolicySpec::parse("pytorch:start=snapshot:expandable_segments=true").is_err());
    }

    #[test]
    fn lists_split_outside_brackets() {
        let list = "pytorch,pytorch:roundup_power2_divisions=[256:1,512:2,>:8],bfc";
        assert_eq!(
            split_specs(list),
            [
                "pytorch",
                "pytorch:roundup_power2_divisions=[256:1,512:2,>:8]",
                "bfc"
            ]
        );
        let s = PolicySpec::parse(split_specs(list)[1]).unwrap();
        let c = s.apply(&PolicyConfig::default()).unwrap();
        // 256 MiB is interval 8; the first key fills 0..8; `>` fills from 512's interval (9) up.
        let d = c.pytorch.roundup_power2_divisions;
        assert_eq!(&d[..8], &[1; 8]);
        assert_eq!(d[8], 1);
        assert_eq!(&d[9..], &[8; 7]);
    }

    #[test]
    fn divisions_for_every_interval() {
        assert_eq!(parse_divisions("4").unwrap(), [4; 16]);
        assert!(parse_divisions("3").is_err());
        let d = parse_divisions("[1:2,>:4]").unwrap();
        assert_eq!(
            d, [4; 16],
            "`>` fills from the last key's interval inclusive"
        );
    }

    #[test]
    fn changing_a_pytorch_setting_drops_the_snapshot_start() {
        let base = PolicyConfig {
            pytorch_script: Some(std::sync::Arc::default()),
            ..PolicyConfig::default()
        };
        let plain = PolicySpec::parse("pytorch").unwrap().apply(&base).unwrap();
        assert!(plain.pytorch_script.is_some());
        let variant = PolicySpec::parse("pytorch:expandable_segments=true")
            .unwrap()
            .apply(&base)
            .unwrap();
        assert!(variant.pytorch_script.is_none());
        let empty = PolicySpec::parse("pytorch:start=empty")
            .unwrap()
            .apply(&base)
            .unwrap();
        assert!(empty.pytorch_script.is_none());
    }

    #[test]
    fn a_variant_s_parameters_may_be_separated_by_commas() {
        assert_eq!(
            split_specs("bfc,real-jemalloc:dirty_decay_ms=0,narenas=2, glibc"),
            ["bfc", "real-jemalloc:dirty_decay_ms=0,narenas=2", "glibc"]
        );
        let s = PolicySpec::parse("glibc:mmap_threshold=4096,align=32").unwrap();
        assert_eq!(s.label(), "glibc:mmap_threshold=4096:align=32");
        // A leading `key=value` has no variant to go on with: it is a policy name, and unknown.
        assert!(PolicySpec::parse(split_specs("limit=1,bfc")[0]).is_err());
    }
}
