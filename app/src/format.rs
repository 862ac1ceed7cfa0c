//! Number formatting shared by every output (tables, TUI, GUI, reports), so they agree, and
//! the one rule that makes text from a trace (function names, files, annotations) safe to print.

use std::borrow::Cow;

/// Bytes in binary units with three significant figures: `512 B`, `1.50 KiB`, `20.3 MiB`.
#[must_use]
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in UNITS.iter().skip(1) {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    if v < 10.0 {
        format!("{v:.2} {unit}")
    } else if v < 100.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.0} {unit}")
    }
}

/// A power-of-two size in at most four characters: `256`, `1K`, `512K`, `256M`.
#[must_use]
pub fn bytes_compact(n: u64) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    let mut v = n;
    let mut unit = 0;
    while v >= 1024 && v.is_multiple_of(1024) && unit + 1 < UNITS.len() {
        v /= 1024;
        unit += 1;
    }
    format!("{v}{}", UNITS[unit])
}

/// An integer with thousands separators: `1,145,773`.
#[must_use]
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds with a unit that keeps three significant figures: `812 ns`, `1.25 ms`, `12.3 s`.
#[must_use]
pub fn seconds(s: f64) -> String {
    if s < 0.0 {
        // A moment before the reference (a mark put before the first recorded event).
        return format!("-{}", seconds(-s));
    }
    if s < 1e-6 {
        format!("{:.0} ns", s * 1e9)
    } else if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

/// Seconds with microsecond precision, for event times: `12.344411s`.
#[must_use]
pub fn seconds_fixed(s: f64) -> String {
    format!("{s:.6}s")
}

/// A rate per second with an SI suffix: `950`, `12.3 k`, `45.1 M`.
#[must_use]
pub fn rate(per_s: f64) -> String {
    if per_s >= 1e9 {
        format!("{:.1} G", per_s / 1e9)
    } else if per_s >= 1e6 {
        format!("{:.1} M", per_s / 1e6)
    } else if per_s >= 1e3 {
        format!("{:.1} k", per_s / 1e3)
    } else {
        format!("{per_s:.0}")
    }
}

/// The size range of a size class: `[2^(c-1), 2^c)`.
#[must_use]
pub fn class_range(class: u8) -> String {
    match class {
        0 => "0".to_owned(),
        1 => "1".to_owned(),
        c => {
            let lo = 1u128 << (c - 1);
            let hi = (1u128 << c) - 1;
            let fmt = |v: u128| u64::try_from(v).map_or_else(|_| v.to_string(), bytes);
            format!("{}..{}", fmt(lo), fmt(hi))
        }
    }
}

/// Text a trace supplies (a function or file name, a module, an annotation, a setting) made
/// safe to print in a table, a terminal or an SVG: every control character (an escape sequence
/// would reach the terminal; a line break would inject lines into a table or folded stacks)
/// and every bidirectional-override character (it reorders the text shown around it) becomes
/// U+FFFD. Everything else, and a clean name, passes through unchanged (and unallocated).
#[must_use]
pub fn trace_text(s: &str) -> Cow<'_, str> {
    if s.chars().any(unsafe_to_print) {
        Cow::Owned(
            s.chars()
                .map(|c| if unsafe_to_print(c) { '\u{fffd}' } else { c })
                .collect(),
        )
    } else {
        Cow::Borrowed(s)
    }
}

/// A function name as one frame of folded stacks (`outer;...;inner value`): [`trace_text`],
/// and `;`, which separates the frames, as `:`.
#[must_use]
pub fn folded_frame(s: &str) -> String {
    trace_text(s).replace(';', ":")
}

/// C0 and C1 controls and DEL, and the bidirectional marks, embeddings, overrides and
/// isolates.
fn unsafe_to_print(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(60_436_060), "57.6 MiB");
        assert_eq!(bytes(195_323_906), "186 MiB");
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_145_773), "1,145,773");
        assert_eq!(seconds(0.00125), "1.2 ms");
        assert_eq!(seconds(-0.0093), "-9.3 ms");
        assert_eq!(class_range(1), "1");
        assert_eq!(class_range(3), "4 B..7 B");
    }

    #[test]
    fn trace_text_is_safe_to_print() {
        assert!(matches!(
            trace_text("operator new(unsigned long)"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            trace_text("a\u{1b}[31mb\nc\td\u{7f}\u{9b}e"),
            "a\u{fffd}[31mb\u{fffd}c\u{fffd}d\u{fffd}\u{fffd}e"
        );
        assert_eq!(trace_text("x\u{202e}y\u{2066}z"), "x\u{fffd}y\u{fffd}z");
        assert_eq!(trace_text("größe<T>::∞"), "größe<T>::∞");
        assert_eq!(folded_frame("a;b\nc"), "a:b\u{fffd}c");
    }
}
