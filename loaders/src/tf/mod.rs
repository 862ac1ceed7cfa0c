//! TensorFlow inputs: BFC out-of-memory dumps and `__LOG_MEMORY__` memory logs. The replay of
//! TensorFlow's BFC allocator against them is [`crate::analysis::tf_fidelity`].
//!
//! - [`dump`]: [`dump::load_bfc_dump`] reads the allocator dump TensorFlow prints when BFC runs
//!   out of memory (any amount of other log text around it);
//! - [`memlog`]: [`memlog::load_memory_log`] reads a memory log into the same event DataFrame
//!   as malloc traces, plus the BFC's region growth, `MEMINFO` lines and a trailing dump;
//! - [`human`]: TensorFlow's `HumanReadableNumBytes` (`509.99MiB`), both ways.
//!
//! Exact formats: `reference/allocators.md` sections 1.10, 1.11 and 2.

mod detect;
pub mod dump;
pub mod human;
pub mod memlog;

/// The TensorFlow input kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TfKind {
    /// A log with `__LOG_MEMORY__` records (and possibly a dump at its end).
    MemoryLog,
    /// A log with a BFC allocator dump and no memory-log records.
    BfcDump,
}

pub use detect::{DETECT_LIMIT_BYTES, detect_kind, detect_kind_in};

/// A log line split into its logging prefix and its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogLine<'a> {
    /// Time from the prefix, in nanoseconds (absl/glog: time of day, or seconds as printed
    /// when TF's absl prints `00:00:<epoch seconds>`; TF's own logger: since the Unix epoch).
    pub t_ns: Option<i64>,
    /// Thread id from an absl/glog prefix.
    pub tid: Option<u64>,
    /// `I`, `W`, `E` or `F`.
    pub severity: Option<char>,
    /// The text after the prefix (the whole line when there is no prefix).
    pub message: &'a str,
}

/// Splits a TensorFlow log line. Recognised prefixes:
/// - absl / glog: `I0000 00:00:1795287711.119285   12875 bfc_allocator.cc:1049] `;
/// - TF's C++ logger: `2017-11-06 08:55:24.919606: I tensorflow/core/...cc:273] `;
/// - bare: `I tensorflow/core/common_runtime/bfc_allocator.cc:685] `.
///
/// Anything else (continuation lines, the `Stats:` block, Python output) is all message.
#[must_use]
pub fn split_log_line(line: &str) -> LogLine<'_> {
    let whole = LogLine {
        t_ns: None,
        tid: None,
        severity: None,
        message: line,
    };
    let Some(close) = line.find("] ") else {
        return whole;
    };
    let head = &line[..close];
    let message = &line[close + 2..];
    let tokens: Vec<&str> = head.split_whitespace().collect();
    let Some((&source, rest)) = tokens.split_last() else {
        return whole;
    };
    if !is_source_location(source) {
        return whole;
    }
    match rest {
        // bare: `I file:line`
        [sev] => match severity_only(sev) {
            Some(severity) => LogLine {
                t_ns: None,
                tid: None,
                severity: Some(severity),
                message,
            },
            None => whole,
        },
        // TF's logger: `2017-11-06 08:55:24.919606: I file:line`
        [date, time, sev] if date.contains('-') => {
            let (Some(severity), Some(days), Some(tod_ns)) = (
                severity_only(sev),
                parse_date(date),
                time.strip_suffix(':').and_then(parse_time_of_day),
            ) else {
                return whole;
            };
            LogLine {
                t_ns: Some(
                    days.saturating_mul(86_400)
                        .saturating_mul(1_000_000_000)
                        .saturating_add(tod_ns),
                ),
                tid: None,
                severity: Some(severity),
                message,
            }
        }
        // absl/glog: `I0105 09:48:28.755177 110350 file:line`
        [sev_date, time, tid] => {
            let mut chars = sev_date.chars();
            let Some(severity) = chars.next().filter(|c| "IWEF".contains(*c)) else {
                return whole;
            };
            let date = chars.as_str();
            if date.len() != 4 || !date.bytes().all(|b| b.is_ascii_digit()) {
                return whole;
            }
            let (Some(tod_ns), Ok(tid)) = (parse_time_of_day(time), tid.parse::<u64>()) else {
                return whole;
            };
            let month: i64 = date.get(..2).and_then(|m| m.parse().ok()).unwrap_or(0);
            let day: i64 = date.get(2..).and_then(|d| d.parse().ok()).unwrap_or(0);
            // The year is not printed; a day count inside the year keeps logs that cross
            // midnight in order.
            let day_ns = if month >= 1 && day >= 1 {
                // Year 1970 keeps the count small: it cannot overflow.
                days_from_civil(1970, month, day)
                    .map_or(0, |d| (d * 86_400).saturating_mul(1_000_000_000))
            } else {
                0
            };
            LogLine {
                t_ns: Some(day_ns.saturating_add(tod_ns)),
                tid: Some(tid),
                severity: Some(severity),
                message,
            }
        }
        _ => whole,
    }
}

fn severity_only(s: &str) -> Option<char> {
    let mut chars = s.chars();
    let c = chars.next()?;
    (chars.next().is_none() && "IWEF".contains(c)).then_some(c)
}

/// `file.cc:123`: something, a colon, and a line number.
fn is_source_location(s: &str) -> bool {
    s.rsplit_once(':').is_some_and(|(file, line)| {
        !file.is_empty() && !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit())
    })
}

/// `HH:MM:SS[.frac]` (seconds may be any size: TF's absl prints `00:00:<epoch seconds>`).
fn parse_time_of_day(s: &str) -> Option<i64> {
    let mut parts = s.splitn(3, ':');
    let h: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let sec_ns = parse_seconds_ns(parts.next()?)?;
    // Hours and minutes are the file's digits, as long as it likes: every step is checked.
    h.checked_mul(3600)?
        .checked_add(m.checked_mul(60)?)?
        .checked_mul(1_000_000_000)?
        .checked_add(sec_ns)
}

/// `123.456789` into nanoseconds (at most nine fraction digits are kept).
pub(crate) fn parse_seconds_ns(s: &str) -> Option<i64> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: i64 = whole.parse().ok()?;
    let mut frac_ns: i64 = 0;
    for (i, b) in frac.bytes().take(9).enumerate() {
        frac_ns += i64::from(b - b'0') * 10_i64.pow(8 - i as u32);
    }
    secs.checked_mul(1_000_000_000)?.checked_add(frac_ns)
}

fn parse_date(s: &str) -> Option<i64> {
    let mut parts = s.splitn(3, '-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let d: i64 = parts.next()?.parse().ok()?;
    if !((1..=12).contains(&m) && (1..=31).contains(&d)) {
        return None;
    }
    days_from_civil(y, m, d)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm); `None`
/// for a year so far out that the count overflows (a damaged log line).
fn days_from_civil(y: i64, m: i64, d: i64) -> Option<i64> {
    let y = if m <= 2 { y.checked_sub(1)? } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era.checked_mul(146_097)?.checked_add(doe - 719_468)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fuzzed log's date with a year of 19 digits is refused, not a multiplication overflow.
    #[test]
    fn dates_far_out_are_refused_and_near_ones_counted() {
        assert_eq!(parse_date("1970-01-01"), Some(0));
        assert_eq!(parse_date("2025-01-05"), Some(20_093));
        assert_eq!(parse_date("1969-12-31"), Some(-1));
        assert_eq!(parse_date("9223372036854775807-01-05"), None);
        assert_eq!(parse_date("-9223372036854775808-01-05"), None);
    }

    #[test]
    fn splits_the_three_prefixes() {
        let l = split_log_line(
            "I0000 00:00:1795287711.119285   12875 bfc_allocator.cc:1049] BFCAllocator dump for x",
        );
        assert_eq!(l.message, "BFCAllocator dump for x");
        assert_eq!(l.tid, Some(12875));
        assert_eq!(l.t_ns, Some(1_795_287_711_119_285_000));
        assert_eq!(l.severity, Some('I'));

        let l = split_log_line(
            "2017-11-06 08:55:24.919606: W tensorflow/core/common_runtime/bfc_allocator.cc:273] Allocator (GPU_0_bfc) ran",
        );
        assert_eq!(l.message, "Allocator (GPU_0_bfc) ran");
        assert_eq!(l.severity, Some('W'));
        let day = days_from_civil(2017, 11, 6).unwrap();
        assert_eq!(day, 17_476);
        assert_eq!(
            l.t_ns,
            Some((day * 86_400 + 8 * 3600 + 55 * 60 + 24) * 1_000_000_000 + 919_606_000)
        );

        let l = split_log_line(
            "I tensorflow/core/common_runtime/bfc_allocator.cc:685]      Summary of in-use Chunks by size: ",
        );
        assert_eq!(l.message, "     Summary of in-use Chunks by size: ");
        assert_eq!((l.t_ns, l.tid), (None, None));

        let l = split_log_line(
            "E0105 09:48:28.755177  110350 pjrt_stream_executor_client.cc:3088] Execution failed",
        );
        assert_eq!(l.tid, Some(110_350));
        assert_eq!(l.message, "Execution failed");
    }

    /// Issue 43: hours and minutes of any length were multiplied unchecked (a panic in a
    /// debug build, a wrapped time in a release one); such a prefix is not a time.
    #[test]
    fn hours_past_the_i64_range_are_not_a_time() {
        for line in [
            "I0000 9999999999999999:00:00.0 1 log_memory.cc:34] x",
            "I0000 00:999999999999999999:00.0 1 log_memory.cc:34] x",
            "2017-11-06 9999999999999999:00:00.0: I bfc_allocator.cc:1] x",
        ] {
            let l = split_log_line(line);
            assert_eq!((l.t_ns, l.tid), (None, None), "{line}");
        }
    }

    #[test]
    fn leaves_other_lines_alone() {
        for line in [
            "Limit:                       512.00MiB",
            "\t [[{{node foo}}]] more",
            "MEMINFO after_build {\"current\": 1, \"peak\": 2}",
            "x] y",
        ] {
            let l = split_log_line(line);
            assert_eq!(l.message, line);
            assert_eq!(l.severity, None);
        }
    }
}
