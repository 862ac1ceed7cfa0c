//! The line a Python frame was executing: memray records a frame as its code object and the
//! instruction offset, and the code object's line table as CPython laid it out, whose form
//! depends on the recording interpreter's version (3.11's location table, 3.10's `co_linetable`,
//! older `co_lnotab`). Each walk here stops at the end of the table, whatever it holds.

/// The line of the instruction at `instruction_offset` (as memray records it: bytes from 3.11
/// on, 2-byte code units in 3.10, bytes before) of a code object that starts at `first_line`, for a capture made by CPython `python_version` (`PY_VERSION_HEX`).
/// `None` when the table holds no entry for the offset.
pub(super) fn line_of(
    python_version: i32,
    table: &[u8],
    instruction_offset: i64,
    first_line: i32,
) -> Option<i64> {
    if table.is_empty() {
        return Some(i64::from(first_line));
    }
    if instruction_offset < 0 {
        return None;
    }
    let offset = u64::try_from(instruction_offset).ok()?;
    if python_version >= 0x030B_0000 {
        location_table_line(table, offset / 2, first_line)
    } else if python_version >= 0x030A_0000 {
        Some(linetable_310_line(table, offset, first_line))
    } else {
        Some(lnotab_line(table, offset, first_line))
    }
}

/// CPython 3.11+ location table: entries of a first byte `1cccclll` (code `cccc`, `lll + 1`
/// code units) and code-specific operands in 6-bit varints.
fn location_table_line(table: &[u8], offset_units: u64, first_line: i32) -> Option<i64> {
    let mut pos = 0usize;
    let mut line = i64::from(first_line);
    let mut addr = 0u64;
    let mut next = || -> Option<u8> {
        let b = table.get(pos).copied();
        pos += 1;
        b
    };
    // The 6-bit varint of the location table (bit 6 says more follows).
    fn varint(next: &mut dyn FnMut() -> Option<u8>) -> Option<u64> {
        let mut read = next()?;
        let mut value = u64::from(read & 63);
        let mut shift = 0u32;
        while read & 64 != 0 {
            read = next()?;
            shift += 6;
            if shift > 60 {
                return None;
            }
            value |= u64::from(read & 63) << shift;
        }
        Some(value)
    }
    fn signed(next: &mut dyn FnMut() -> Option<u8>) -> Option<i64> {
        let u = varint(next)?;
        let magnitude = i64::try_from(u >> 1).ok()?;
        Some(if u & 1 == 1 { -magnitude } else { magnitude })
    }
    loop {
        let first = next()?;
        let code = (first >> 3) & 15;
        let end = addr + u64::from(first & 7) + 1;
        match code {
            // No location.
            15 => {}
            // Long form: line delta, end line delta, column, end column.
            14 => {
                line += signed(&mut next)?;
                for _ in 0..3 {
                    varint(&mut next)?;
                }
            }
            // No columns: a line delta.
            13 => line += signed(&mut next)?,
            // One line, delta 0, 1 or 2, with two column bytes.
            10..=12 => {
                line += i64::from(code) - 10;
                next()?;
                next()?;
            }
            // Short form: same line, one column byte.
            _ => {
                next()?;
            }
        }
        if addr <= offset_units && offset_units < end {
            return Some(line);
        }
        addr = end;
    }
}

/// CPython 3.10's `co_linetable`: (byte delta, signed line delta) pairs; -128 is "no line".
fn linetable_310_line(table: &[u8], offset_units: u64, first_line: i32) -> i64 {
    let last = offset_units.saturating_mul(2);
    let mut line = i64::from(first_line);
    let mut addr = 0u64;
    for pair in table.chunks_exact(2) {
        addr += u64::from(pair[0]);
        let delta = i8::from_ne_bytes([pair[1]]);
        if delta != -128 {
            line += i64::from(delta);
        }
        if addr > last {
            break;
        }
    }
    line
}

/// CPython 3.9's `co_lnotab`: (byte delta, signed line delta) pairs.
fn lnotab_line(table: &[u8], offset: u64, first_line: i32) -> i64 {
    let mut line = i64::from(first_line);
    let mut addr = 0u64;
    for pair in table.chunks_exact(2) {
        addr += u64::from(pair[0]);
        if addr > offset {
            break;
        }
        line += i64::from(i8::from_ne_bytes([pair[1]]));
    }
    line
}
