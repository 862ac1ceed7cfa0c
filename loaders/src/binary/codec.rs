//! Byte-level decoding and encoding: a cursor over decoded bytes, LEB128 varints, zigzag, and
//! the spool's prefix varints and short little-endian integers.

/// A cursor over decoded bytes.
pub struct Cursor<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Cursor<'a> {
    #[must_use]
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(super) fn at_end(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    pub(super) fn u8(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }

    pub(super) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    pub(super) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    /// The LEB128 varint at the cursor; `None` when cut short or over 64 bits.
    #[inline]
    pub fn varint(&mut self) -> Option<u64> {
        let mut v: u64 = 0;
        let mut shift = 0u32;
        loop {
            let b = *self.bytes.get(self.pos)?;
            self.pos += 1;
            if shift == 63 && b > 1 {
                return None;
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(v);
            }
            shift += 7;
            if shift > 63 {
                return None;
            }
        }
    }

    /// A zigzag-coded varint.
    #[inline]
    pub fn zigzag(&mut self) -> Option<i64> {
        Some(unzigzag(self.varint()?))
    }
}

/// Appends `v` as a LEB128 varint.
#[inline]
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// `v` with its sign in the low bit, small in magnitude either way.
#[must_use]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

impl Cursor<'_> {
    /// A prefix varint: the first byte's trailing zeros, plus one, give the length in bytes
    /// (1 to 8, the value above those bits); a zero byte is followed by 8 bytes of value.
    #[inline]
    pub(super) fn prefix_varint(&mut self) -> Option<u64> {
        let first = *self.bytes.get(self.pos)?;
        if first == 0 {
            self.pos += 1;
            return self.u64();
        }
        let n = first.trailing_zeros() as usize + 1;
        // Eight bytes at hand (all but a segment's last few values): one load, one mask.
        if let Some(raw) = self.bytes.get(self.pos..self.pos + 8) {
            let word = u64::from_le_bytes(raw.try_into().ok()?);
            self.pos += n;
            let value = if n == 8 {
                word
            } else {
                word & ((1u64 << (8 * n)) - 1)
            };
            return Some(value >> n);
        }
        let raw = self.take(n)?;
        let mut word = [0u8; 8];
        word.get_mut(..n)?.copy_from_slice(raw);
        Some(u64::from_le_bytes(word) >> n)
    }

    /// `n` little-endian bytes (0 to 8).
    #[inline]
    pub(super) fn short_u64(&mut self, n: usize) -> Option<u64> {
        if n < 8
            && let Some(raw) = self.bytes.get(self.pos..self.pos + 8)
        {
            let word = u64::from_le_bytes(raw.try_into().ok()?);
            self.pos += n;
            return Some(word & ((1u64 << (8 * n)) - 1));
        }
        let raw = self.take(n)?;
        let mut word = [0u8; 8];
        word.get_mut(..n)?.copy_from_slice(raw);
        Some(u64::from_le_bytes(word))
    }
}

/// The inverse of [`zigzag`].
#[must_use]
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}
