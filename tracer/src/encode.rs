//! Byte-level encoding shared by the tracer's buffers and spool headers: LEB128 varints,
//! zigzag, and decimal formatting, all into caller-provided memory (nothing here allocates).

/// Longest LEB128 encoding of a `u64`.
pub const MAX_VARINT_BYTES: usize = 10;

/// Maps signed deltas to unsigned so small magnitudes of either sign stay short.
#[inline(always)]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Writes `v` as LEB128 at `dst` and returns the number of bytes written.
///
/// # Safety
/// `dst` must be valid for [`MAX_VARINT_BYTES`] bytes of writes.
#[inline(always)]
pub unsafe fn put_varint(dst: *mut u8, mut v: u64) -> usize {
    let mut n = 0;
    while v >= 0x80 {
        // SAFETY: n < MAX_VARINT_BYTES because each step consumes 7 of the 64 bits.
        unsafe { dst.add(n).write((v as u8) | 0x80) };
        v >>= 7;
        n += 1;
    }
    // SAFETY: as above; this is at most the tenth byte.
    unsafe { dst.add(n).write(v as u8) };
    n + 1
}

/// A fixed-capacity byte writer over a stack buffer; writes past the end are dropped and
/// remembered, so a header that does not fit is detected rather than overflowing.
pub struct StackWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
    overflow: bool,
}

impl<'a> StackWriter<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self {
            buf,
            len: 0,
            overflow: false,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    pub fn bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }

    pub fn put(&mut self, bytes: &[u8]) {
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            None => self.overflow = true,
        }
    }

    pub fn put_u8(&mut self, v: u8) {
        self.put(&[v]);
    }

    pub fn put_u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }

    pub fn put_u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }

    /// Decimal text of an unsigned integer.
    pub fn put_dec(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            if let Some(d) = digits.get_mut(i) {
                *d = b'0' + (v % 10) as u8;
            }
            v /= 10;
            if v == 0 || i == 0 {
                break;
            }
        }
        let tail = digits.get(i..).unwrap_or(&[]);
        let mut tmp = [0u8; 20];
        let n = tail.len();
        if let Some(dst) = tmp.get_mut(..n) {
            dst.copy_from_slice(tail);
        }
        self.put(tmp.get(..n).unwrap_or(&[]));
    }

    /// Decimal text of a signed integer.
    pub fn put_dec_i64(&mut self, v: i64) {
        if v < 0 {
            self.put_u8(b'-');
        }
        self.put_dec(v.unsigned_abs());
    }

    /// Overwrites four bytes at `at` (used to patch a frame length once it is known).
    pub fn patch_u32(&mut self, at: usize, v: u32) {
        if let Some(dst) = self.buf.get_mut(at..at + 4) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(v: u64) -> Vec<u8> {
        let mut b = [0u8; MAX_VARINT_BYTES];
        let n = unsafe { put_varint(b.as_mut_ptr(), v) };
        b[..n].to_vec()
    }

    #[test]
    fn varints_are_leb128() {
        assert_eq!(varint(0), [0]);
        assert_eq!(varint(127), [127]);
        assert_eq!(varint(128), [0x80, 1]);
        assert_eq!(varint(300), [0xac, 0x02]);
        assert_eq!(varint(u64::MAX).len(), MAX_VARINT_BYTES);
    }

    #[test]
    fn zigzag_interleaves_signs() {
        assert_eq!(zigzag(0), 0);
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
        assert_eq!(zigzag(-2), 3);
        assert_eq!(zigzag(i64::MIN), u64::MAX);
    }

    #[test]
    fn stack_writer_formats_and_detects_overflow() {
        let mut buf = [0u8; 16];
        let mut w = StackWriter::new(&mut buf);
        w.put_dec(0);
        w.put_u8(b' ');
        w.put_dec(18_446_744_073_709_551_615);
        assert!(w.overflowed());
        let mut buf = [0u8; 32];
        let mut w = StackWriter::new(&mut buf);
        w.put_dec(1234);
        w.put_u8(b',');
        w.put_dec_i64(-56);
        assert_eq!(w.bytes(), b"1234,-56");
        assert!(!w.overflowed());
    }
}
