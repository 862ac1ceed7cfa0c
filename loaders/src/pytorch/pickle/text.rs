//! Integer and string arguments: two's complement bytes, decimal text, Python string escapes.

/// An integer as decoded, before it is stored.
pub(super) enum Int {
    Small(i128),
    /// Little-endian two's complement, wider than 128 bits.
    Big(Vec<u8>),
}

/// Decodes little-endian two's complement (LONG1, LONG4).
pub(super) fn int_from_le(bytes: &[u8]) -> Int {
    let mut len = bytes.len();
    // Drop redundant sign bytes.
    while len > 16 {
        match (bytes.get(len - 1), bytes.get(len - 2)) {
            (Some(0x00), Some(b)) if b & 0x80 == 0 => len -= 1,
            (Some(0xff), Some(b)) if b & 0x80 != 0 => len -= 1,
            _ => break,
        }
    }
    let bytes = bytes.get(..len).unwrap_or_default();
    if len > 16 {
        return Int::Big(bytes.to_vec());
    }
    let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
    let mut full = if negative { [0xff; 16] } else { [0; 16] };
    for (d, s) in full.iter_mut().zip(bytes) {
        *d = *s;
    }
    Int::Small(i128::from_le_bytes(full))
}

/// CPython's limit on the digits of an integer read from text.
pub(super) const MAX_INT_DIGITS: usize = 4300;

/// Parses a decimal integer as Python's `int()` would for pickle text (`-12`, `+7`, ` 3 `).
pub(super) fn int_from_text(text: &[u8]) -> Option<Int> {
    let text = text.trim_ascii();
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > MAX_INT_DIGITS || !digits.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    // Magnitude in base-2^32 limbs, least significant first.
    let mut limbs: Vec<u32> = vec![0];
    for &d in digits {
        let mut carry = u64::from(d - b'0');
        for limb in &mut limbs {
            let x = u64::from(*limb) * 10 + carry;
            *limb = x as u32;
            carry = x >> 32;
        }
        if carry > 0 {
            limbs.push(carry as u32);
        }
    }
    // Two's complement bytes, with room for the sign bit.
    let mut bytes: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    bytes.push(0);
    if negative {
        let mut carry = true;
        for b in &mut bytes {
            let (x, c) = (!*b).overflowing_add(u8::from(carry));
            *b = x;
            carry = c;
        }
    }
    Some(int_from_le(&bytes))
}

/// Decodes `raw-unicode-escape` (the UNICODE opcode): bytes are Latin-1 code points, except
/// `\uXXXX` and `\UXXXXXXXX` after an odd number of backslashes.
pub(super) fn raw_unicode_escape(bytes: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b != b'\\' {
            out.push(char::from(b));
            i += 1;
            continue;
        }
        let run = bytes.get(i..)?.iter().take_while(|&&c| c == b'\\').count();
        let next = bytes.get(i + run).copied();
        let digits = match next {
            Some(b'u') => 4,
            Some(b'U') => 8,
            _ => 0,
        };
        if run % 2 == 0 || digits == 0 {
            out.extend(std::iter::repeat_n('\\', run));
            i += run;
            continue;
        }
        out.extend(std::iter::repeat_n('\\', run - 1));
        let hex = bytes.get(i + run + 1..i + run + 1 + digits)?;
        let code = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
        out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
        i += run + 1 + digits;
    }
    Some(out)
}

/// Decodes a STRING argument: a quoted Python 2 literal with backslash escapes.
pub(super) fn string_literal(text: &[u8]) -> Option<Vec<u8>> {
    let (&q, rest) = text.split_first()?;
    let (&q2, body) = rest.split_last()?;
    if q != q2 || (q != b'\'' && q != b'"') {
        return None;
    }
    let mut out = Vec::with_capacity(body.len());
    let mut iter = body.iter().copied().peekable();
    while let Some(b) = iter.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let e = iter.next()?;
        match e {
            b'\n' => {}
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'x' => {
                let hi = char::from(iter.next()?).to_digit(16)?;
                let lo = char::from(iter.next()?).to_digit(16)?;
                out.push((hi * 16 + lo) as u8);
            }
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match iter.peek() {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            iter.next();
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            other => {
                if !matches!(other, b'\\' | b'\'' | b'"') {
                    out.push(b'\\');
                }
                out.push(other);
            }
        }
    }
    Some(out)
}
