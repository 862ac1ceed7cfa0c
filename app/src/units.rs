//! Parsing byte sizes given on the command line (`512MiB`, `1.5GiB`, `2G`, `100000`).

/// Parses a byte count. Binary units: `KiB MiB GiB TiB` and the single letters `K M G T`;
/// decimal units: `KB MB GB TB`; plain numbers and a `B` suffix are bytes. Case-insensitive.
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
    let value: f64 = num
        .parse()
        .map_err(|_| format!("expected a size such as 512MiB, 1.5GiB or 1000000, got {text:?}"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB)"
            ));
        }
    };
    let bytes = (value * mult).round();
    if !(0.0..=u64::MAX as f64).contains(&bytes) {
        return Err(format!("size out of range: {text:?}"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn units() {
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("512mib"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("100000"), Ok(100_000));
        assert_eq!(parse_bytes("1_000B"), Ok(1000));
        assert_eq!(parse_bytes("3MB"), Ok(3_000_000));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("5 parsecs").is_err());
    }
}
