//! Byte-level encoding shared by the tracer's buffers and spool headers: LEB128 and prefix
//! varints, short little-endian integers, zigzag, and decimal formatting, all into
//! caller-provided memory (nothing here allocates).

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

/// Bytes [`put_prefix_varint`] may write (it stores whole words, past the encoding's end).
pub const PREFIX_VARINT_STORE_BYTES: usize = 9;

/// Writes `v` as a prefix varint at `dst` and returns its length: `n` bytes (1 to 8) holding
/// `v << n | 1 << (n - 1)` little-endian, so the first byte's trailing zero bits, plus one,
/// give `n`; values from 2^56 on take a zero byte and the 8 bytes of `v`. Unlike LEB128 the
/// common case has no loop and no branch on the length (no mispredictions on sizes that vary).
///
/// # Safety
/// `dst` must be valid for [`PREFIX_VARINT_STORE_BYTES`] bytes of writes.
#[inline(always)]
pub unsafe fn put_prefix_varint(dst: *mut u8, v: u64) -> usize {
    // A table lookup rather than the division by 7: the length is on the hot path's longest
    // dependency chain (the cursor of one event is where the next one starts).
    let n = PREFIX_LEN[(v | 1).ilog2() as usize & 63];
    if n > 8 {
        // SAFETY: 9 bytes, as the caller guarantees.
        unsafe {
            dst.write(0);
            dst.add(1).cast::<u64>().write_unaligned(v.to_le());
        }
        return 9;
    }
    // SAFETY: 8 bytes, as the caller guarantees.
    unsafe {
        dst.cast::<u64>()
            .write_unaligned(((v << n) | (1 << (n - 1))).to_le())
    };
    n as usize
}

/// [`put_prefix_varint`]'s length by the index of the value's highest set bit (of `v | 1`).
static PREFIX_LEN: [u32; 64] = {
    let mut t = [0; 64];
    let mut top = 0;
    while top < 64 {
        t[top] = (top as u32 + 1).div_ceil(7);
        top += 1;
    }
    t
};

/// Bytes [`put_short_u64`] writes (a whole word, whatever the length).
pub const SHORT_U64_STORE_BYTES: usize = 8;

/// Writes `v` as its low bytes, little-endian, with no zero bytes above it; returns a length
/// code for the reader (0 to 6 for that many bytes, 7 for all 8) and the length.
///
/// # Safety
/// `dst` must be valid for [`SHORT_U64_STORE_BYTES`] bytes of writes.
#[inline(always)]
pub unsafe fn put_short_u64(dst: *mut u8, v: u64) -> (u8, usize) {
    // SAFETY: 8 bytes, as the caller guarantees.
    unsafe { dst.cast::<u64>().write_unaligned(v.to_le()) };
    // A table lookup rather than arithmetic and a select: the length is on the hot path's
    // longest dependency chain (the cursor of one event is where the next one starts).
    let e = SHORT_CODE_LEN[v.leading_zeros() as usize & 127];
    (e >> 5, (e & 15) as usize)
}

/// [`put_short_u64`]'s length code (bits 5-7, where the op byte has it, so that the caller's
/// shift cancels out) and length (bits 0-3) by the value's leading zero bits (0 to 64; the
/// table has 128 entries so the index needs no bounds check).
static SHORT_CODE_LEN: [u8; 128] = {
    let mut t = [0; 128];
    let mut lz = 0;
    while lz <= 64 {
        let bytes = (71 - lz as u32) / 8;
        let code = if bytes < 7 { bytes } else { 7 };
        let len = if code == 7 { 8 } else { code };
        t[lz] = (code << 5 | len) as u8;
        lz += 1;
    }
    t
};

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

    fn prefix(v: u64) -> Vec<u8> {
        let mut b = [0u8; PREFIX_VARINT_STORE_BYTES];
        let n = unsafe { put_prefix_varint(b.as_mut_ptr(), v) };
        b[..n].to_vec()
    }

    #[test]
    fn prefix_varints_carry_their_length_in_the_first_byte() {
        assert_eq!(prefix(0), [0x01]);
        assert_eq!(prefix(127), [0xff]);
        assert_eq!(prefix(128), [0x02, 0x02]);
        assert_eq!(prefix(16), [0x21]);
        assert_eq!(prefix((1 << 56) - 1).len(), 8);
        assert_eq!(
            prefix((1 << 56) - 1),
            [0x80, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
        );
        let mut big = vec![0];
        big.extend(u64::MAX.to_le_bytes());
        assert_eq!(prefix(u64::MAX), big);
        for shift in 0..64 {
            let v = 1u64 << shift;
            let b = prefix(v);
            let n = if b[0] == 0 {
                9
            } else {
                b[0].trailing_zeros() as usize + 1
            };
            assert_eq!(b.len(), n, "{v}");
        }
    }

    #[test]
    fn short_u64s_drop_high_zero_bytes() {
        let short = |v: u64| {
            let mut b = [0u8; SHORT_U64_STORE_BYTES];
            let (code, n) = unsafe { put_short_u64(b.as_mut_ptr(), v) };
            (code, b[..n].to_vec())
        };
        assert_eq!(short(0), (0, vec![]));
        assert_eq!(short(0xff), (1, vec![0xff]));
        assert_eq!(short(0x1234), (2, vec![0x34, 0x12]));
        assert_eq!(short(1 << 48), (7, (1u64 << 48).to_le_bytes().to_vec()));
        assert_eq!(short(u64::MAX), (7, vec![0xff; 8]));
        assert_eq!(short((1 << 48) - 1).0, 6);
        // The table against the arithmetic it replaces, at every length boundary.
        for shift in 0..64 {
            for v in [
                1u64 << shift,
                (1u64 << shift) - 1,
                (2u64 << shift).wrapping_sub(1),
            ] {
                let bytes = (71 - v.leading_zeros()) / 8;
                let code = bytes.min(7);
                let len = if code == 7 { 8 } else { code };
                let (c, b) = short(v);
                assert_eq!((c as u32, b.len() as u32), (code, len), "{v}");
                assert_eq!(b, v.to_le_bytes()[..b.len()], "{v}");
            }
        }
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
