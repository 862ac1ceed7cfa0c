//! Byte sizes as people write them (`512MiB`, `1.5GiB`, `2G`, `3MB`, `100000`), for command-line
//! flags and policy parameters alike.

/// Parses a byte count. Binary units: `KiB MiB GiB TiB` and the single letters `K M G T`;
/// decimal units: `KB MB GB TB`; plain numbers and a `B` suffix are bytes. Case-insensitive;
/// `_` may group digits.
///
/// Whole numbers are computed exactly in integers (so `18446744073709551615` is accepted and
/// `18446744073709551616` refused); a fraction (`1.5GiB`) must come to a whole number of bytes
/// within a byte.
///
/// # Errors
/// A message saying what was expected.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    let expected = || format!("expected a size such as 512MiB, 1.5GiB or 1000000, got {text:?}");
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB)"
            ));
        }
    };
    let out_of_range = || format!("size out of range (at most {} bytes): {text:?}", u64::MAX);
    let (whole, frac) = match num.split_once('.') {
        Some((w, f)) => (w, f),
        None => (num.as_str(), ""),
    };
    if (whole.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(expected());
    }
    let whole_value: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| out_of_range())?
    };
    // The fraction as an exact ratio: digits / 10^len.
    let frac = frac.trim_end_matches('0');
    if frac.len() > 18 {
        return Err(format!("too many decimal places in {text:?}"));
    }
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| expected())?
    };
    let denom = 10u128.pow(frac.len() as u32);
    let mult = u128::from(mult);
    let bytes = whole_value
        .checked_mul(mult)
        .and_then(|w| w.checked_add((frac_value * mult + denom / 2) / denom))
        .ok_or_else(out_of_range)?;
    u64::try_from(bytes).map_err(|_| out_of_range())
}

/// Parses a time offset with its unit (`1.5s`, `20ms`, `300us`, `7ns`) into nanoseconds.
///
/// # Errors
/// A message saying what was expected.
pub fn parse_duration_ns(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("expected a time like 1.5s or 20ms, got {t:?}"))?;
    let scale = match unit.trim() {
        "s" => 1e9,
        "ms" => 1e6,
        "us" | "µs" => 1e3,
        "ns" => 1.0,
        other => return Err(format!("unknown time unit {other:?}: use s, ms, us or ns")),
    };
    Ok(value * scale)
}

/// Parses a transfer rate, a size per second (`500MB/s`, `1.5GiB/s`), into bytes per second.
///
/// # Errors
/// A message saying what was expected.
pub fn parse_bandwidth(text: &str) -> Result<f64, String> {
    let expected = || format!("expected a rate such as 500MB/s or 1GiB/s, got {text:?}");
    let size = text.trim().strip_suffix("/s").ok_or_else(expected)?;
    match parse_bytes(size)? {
        0 => Err(format!(
            "a rate must be more than 0 bytes a second, got {text:?}"
        )),
        b => Ok(b as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_bandwidth, parse_bytes, parse_duration_ns};

    #[test]
    fn bandwidths() {
        assert_eq!(parse_bandwidth("500MB/s"), Ok(5e8));
        assert_eq!(parse_bandwidth("1GiB/s"), Ok(1_073_741_824.0));
        assert!(parse_bandwidth("500MB").is_err());
        assert!(parse_bandwidth("0B/s").is_err());
        assert!(parse_bandwidth("fast/s").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("1.5s"), Ok(1.5e9));
        assert_eq!(parse_duration_ns("20ms"), Ok(2e7));
        assert_eq!(parse_duration_ns("3us"), Ok(3e3));
        assert_eq!(parse_duration_ns("7ns"), Ok(7.0));
        assert!(parse_duration_ns("7 parsecs").is_err());
        assert!(parse_duration_ns("ms").is_err());
    }

    #[test]
    fn units() {
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("512mib"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("100000"), Ok(100_000));
        assert_eq!(parse_bytes("1_000B"), Ok(1000));
        assert_eq!(parse_bytes("3MB"), Ok(3_000_000));
        assert_eq!(parse_bytes("0.5KiB"), Ok(512));
        assert_eq!(parse_bytes(".5K"), Ok(512));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("5 parsecs").is_err());
        assert!(parse_bytes(".").is_err());
        assert!(parse_bytes("1.2.3").is_err());
    }

    #[test]
    fn whole_numbers_are_exact_to_the_last_bit() {
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
        assert!(parse_bytes("18446744073709551616").is_err());
        // 2^53 + 1 is not representable as f64; it must not be rounded.
        assert_eq!(parse_bytes("9007199254740993"), Ok(9_007_199_254_740_993));
        assert!(parse_bytes("16777216TiB").is_err());
        assert_eq!(parse_bytes("16777215TiB"), Ok(16_777_215 << 40));
    }
}
