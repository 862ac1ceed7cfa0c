//! TensorFlow's `strings::HumanReadableNumBytes`, both ways.
//!
//! TF prints a byte count below 1024 as `<n>B`. Otherwise it divides by 1024, truncating,
//! while the value is at least 1 MiB (stepping through the units K, M, G, T, P, E), then prints
//! the remaining mantissa (1024 ..= 1048575) divided by 1024.0 with one decimal for KiB and
//! two for the larger units (`1.0KiB`, `509.99MiB`). printf rounds the exact binary value to
//! nearest, ties to even. So a printed figure stands for a range of byte counts, which
//! [`parse_bytes`] returns; dump cross-checks use the range, not a guessed value.

const UNITS: [char; 6] = ['K', 'M', 'G', 'T', 'P', 'E'];

/// `HumanReadableNumBytes(n)`.
#[must_use]
pub fn format_bytes(n: i64) -> String {
    let sign = if n < 0 { "-" } else { "" };
    let abs = n.unsigned_abs();
    if abs < 1024 {
        return format!("{sign}{abs}B");
    }
    let mut mantissa = abs;
    let mut unit = 0usize;
    while mantissa >= 1 << 20 {
        mantissa /= 1024;
        unit += 1;
    }
    let decimals = if unit == 0 { 1 } else { 2 };
    let scale = 10u64.pow(decimals);
    let q = round_scaled(mantissa, decimals);
    let letter = UNITS.get(unit).copied().unwrap_or('E');
    format!(
        "{sign}{}.{:0w$}{letter}iB",
        q / scale,
        q % scale,
        w = decimals as usize
    )
}

/// `mantissa / 1024` to `decimals` places, as an integer count of `10^-decimals`, rounded to
/// nearest with ties to even (the exact binary value is what printf rounds).
fn round_scaled(mantissa: u64, decimals: u32) -> u64 {
    let scaled = u128::from(mantissa) * u128::from(10u64.pow(decimals));
    let q = scaled / 1024;
    let r = scaled % 1024;
    let up = r > 512 || (r == 512 && q % 2 == 1);
    u64::try_from(q + u128::from(up)).unwrap_or(u64::MAX)
}

/// A byte count read from a dump: exact for raw integers, a range for human-readable figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteCount {
    /// The figure as printed, in bytes (`509.99MiB` -> 509.99 * 2^20, truncated, kept inside
    /// the range): the best single value to show.
    pub bytes: u64,
    /// Smallest byte count TF would print this way.
    pub min_bytes: u64,
    /// Largest byte count TF would print this way.
    pub max_bytes: u64,
}

impl ByteCount {
    /// An exact count.
    #[must_use]
    pub fn exact(bytes: u64) -> Self {
        Self {
            bytes,
            min_bytes: bytes,
            max_bytes: bytes,
        }
    }

    /// True when the text was a raw integer or a count below 1 KiB.
    #[must_use]
    pub fn is_exact(&self) -> bool {
        self.min_bytes == self.max_bytes
    }

    /// True when `n` bytes would print as this figure.
    #[must_use]
    pub fn contains(&self, n: u64) -> bool {
        (self.min_bytes..=self.max_bytes).contains(&n)
    }
}

/// Reads `256B`, `1.0KiB`, `509.99MiB`, ... (what [`format_bytes`] prints) or a plain decimal
/// integer. `None` for anything else, negative figures included.
#[must_use]
pub fn parse_bytes(text: &str) -> Option<ByteCount> {
    let s = text.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().ok().map(ByteCount::exact);
    }
    if let Some(n) = s.strip_suffix('B')
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
    {
        return n.parse().ok().map(ByteCount::exact);
    }
    let number = s.strip_suffix("iB")?;
    // The unit letter is one byte; anything else there (a multi-byte character) is no unit.
    let (number, letter) = number.split_at_checked(number.len().checked_sub(1)?)?;
    let unit = UNITS.iter().position(|&u| letter.starts_with(u))?;
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty()
        || frac.len() > 3
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let decimals = u32::try_from(frac.len()).ok()?;
    let q: u64 = format!("{whole}{frac}").parse().ok()?;
    // The mantissa range that rounds to q, within what TF can print (1024 ..= 1048575).
    let lowest = first_mantissa_at_least(q, decimals).max(1024);
    let highest = first_mantissa_at_least(q.checked_add(1)?, decimals)
        .checked_sub(1)?
        .min((1 << 20) - 1);
    if lowest > highest {
        return None;
    }
    // Each step below the printed unit was a truncating division by 1024.
    let step = 1u64.checked_shl(10 * u32::try_from(unit).ok()?)?;
    let min_bytes = lowest.checked_mul(step)?;
    let max_bytes = highest.checked_add(1)?.checked_mul(step)?.checked_sub(1)?;
    let unit_bytes = u128::from(step) * 1024;
    let bytes = u128::from(q) * unit_bytes / u128::from(10u64.pow(decimals));
    // `1024.0KiB` reads as 1 MiB, one byte more than any count TF prints that way.
    Some(ByteCount {
        bytes: u64::try_from(bytes).ok()?.clamp(min_bytes, max_bytes),
        min_bytes,
        max_bytes,
    })
}

/// Smallest mantissa whose rounded value is at least `q` (rounding is monotonic).
fn first_mantissa_at_least(q: u64, decimals: u32) -> u64 {
    let (mut lo, mut hi) = (0u64, 1u64 << 40);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if round_scaled(mid, decimals) < q {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_tensorflow() {
        assert_eq!(format_bytes(0), "0B");
        assert_eq!(format_bytes(256), "256B");
        assert_eq!(format_bytes(1023), "1023B");
        assert_eq!(format_bytes(1024), "1.0KiB");
        assert_eq!(format_bytes(2 << 20), "2.00MiB");
        assert_eq!(format_bytes(1536 << 20), "1.50GiB");
        assert_eq!(format_bytes(-2048), "-2.0KiB");
        // 558.5KiB and 119.7KiB appear in the MobileNetV2 dumps for 2234 chunks of 256 B.
        assert_eq!(format_bytes(2234 * 256), "558.5KiB");
        // Truncation before printing: 1 MiB - 1 is still KiB.
        assert_eq!(format_bytes((1 << 20) - 1), "1024.0KiB");
        // Ties go to even: 0.125 MiB of mantissa 1152/1024 = 1.125 -> 1.12.
        assert_eq!(format_bytes(1152 << 10), "1.12MiB");
        assert_eq!(format_bytes(1_393_082_624), "1.30GiB");
    }

    #[test]
    fn parses_to_the_range_that_prints_the_same() {
        for text in [
            "509.99MiB",
            "1.0KiB",
            "151.91MiB",
            "98.00MiB",
            "14.90GiB",
            "1024.0KiB",
        ] {
            let c = parse_bytes(text).unwrap();
            assert!(c.min_bytes <= c.bytes && c.bytes <= c.max_bytes, "{text}");
            assert_eq!(format_bytes(c.min_bytes as i64), text);
            assert_eq!(format_bytes(c.max_bytes as i64), text);
            assert_ne!(format_bytes(c.min_bytes as i64 - 1), text);
            assert_ne!(format_bytes(c.max_bytes as i64 + 1), text);
        }
        assert_eq!(parse_bytes("256B"), Some(ByteCount::exact(256)));
        assert_eq!(
            parse_bytes("16000000000"),
            Some(ByteCount::exact(16_000_000_000))
        );
        assert_eq!(parse_bytes("512.00MiB").unwrap().bytes, 512 << 20);
        assert!(parse_bytes("512.00MiB").unwrap().contains(536_870_912));
        assert!(parse_bytes("98.00MiB").unwrap().contains(102_760_448));
        // "1Ͻ" + "iB": the byte before "iB" is inside a two-byte character (found by the
        // tf_dump fuzz target, which panicked slicing there).
        for bad in [
            "", "MiB", "1.0XiB", "-5B", "1.2.3MiB", "abc", "12 B", "1ϽiB", "9€iB",
        ] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }
}
