//! Reading the protocol-buffers wire format: the fields of one message, in order, each with
//! the offset it starts at so that an error can name it. Nothing is allocated by a length
//! the input claims: a length-delimited field borrows its bytes, after checking they exist.

/// One field of a message.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

impl<'a> Value<'a> {
    /// The field as an unsigned integer (a varint or a fixed-width one).
    pub fn uint(self) -> Option<u64> {
        match self {
            Self::Varint(v) | Self::Fixed64(v) => Some(v),
            Self::Fixed32(v) => Some(u64::from(v)),
            Self::Bytes(_) => None,
        }
    }

    /// The field's bytes (a string, bytes or an embedded message).
    pub fn bytes(self) -> Option<&'a [u8]> {
        match self {
            Self::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// A repeated integer field's values: packed (one length-delimited field) or one.
    pub fn uints(self) -> Result<Vec<u64>, String> {
        match self {
            Self::Bytes(b) => {
                let mut r = Reader::new(b, 0);
                let mut out = Vec::new();
                while !r.done() {
                    out.push(r.varint()?);
                }
                Ok(out)
            }
            v => Ok(v.uint().into_iter().collect()),
        }
    }
}

/// The fields of one message.
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Where `bytes` starts in the file (for errors).
    base: usize,
}

impl<'a> Reader<'a> {
    /// A reader of `bytes`, which start at `base` in the file.
    pub fn new(bytes: &'a [u8], base: usize) -> Self {
        Self { bytes, at: 0, base }
    }

    /// Whether every field was read.
    pub fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    /// The offset in the file of the next byte.
    pub fn offset(&self) -> usize {
        self.base + self.at
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.bytes.get(self.at) else {
                return Err(format!("a varint cut at byte {}", self.offset()));
            };
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!(
            "a varint longer than 10 bytes at byte {}",
            self.offset()
        ))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "a field of {n} bytes at byte {} runs past the end of its message",
                    self.offset()
                )
            })?;
        let out = self.bytes.get(self.at..end).unwrap_or(&[]);
        self.at = end;
        Ok(out)
    }

    /// The next field: its number, its value and the offset it starts at; `None` at the end.
    pub fn field(&mut self) -> Result<Option<(u32, Value<'a>, usize)>, String> {
        if self.done() {
            return Ok(None);
        }
        let start = self.offset();
        let key = self.varint()?;
        let number = u32::try_from(key >> 3)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("a field numbered {} at byte {start}", key >> 3))?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                let b = self.take(8)?;
                Value::Fixed64(b.iter().rev().fold(0, |v, &x| (v << 8) | u64::from(x)))
            }
            2 => {
                let n = self.varint()?;
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                Value::Bytes(self.take(n)?)
            }
            5 => {
                let b = self.take(4)?;
                Value::Fixed32(b.iter().rev().fold(0, |v, &x| (v << 8) | u32::from(x)))
            }
            w => return Err(format!("wire type {w} (of no known kind) at byte {start}")),
        };
        Ok(Some((number, value, start)))
    }

    /// A reader of an embedded message's bytes `b`, read by this reader just before.
    pub fn nested(&self, b: &'a [u8]) -> Reader<'a> {
        Reader::new(b, self.offset() - b.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_back_and_a_cut_one_says_where() {
        // 1: 150; 2: "hi"; 3: packed [3, 270]
        let bytes = [
            0x08, 0x96, 0x01, 0x12, 2, b'h', b'i', 0x1a, 3, 3, 0x8e, 0x02,
        ];
        let mut r = Reader::new(&bytes, 100);
        let (n, v, at) = r.field().unwrap().unwrap();
        assert_eq!((n, v.uint(), at), (1, Some(150), 100));
        let (n, v, _) = r.field().unwrap().unwrap();
        assert_eq!((n, v.bytes()), (2, Some(&b"hi"[..])));
        let (_, v, _) = r.field().unwrap().unwrap();
        assert_eq!(v.uints().unwrap(), [3, 270]);
        assert!(r.field().unwrap().is_none());
        let cut = [0x12, 100, b'x'];
        let err = Reader::new(&cut, 7).field().unwrap_err();
        assert!(err.contains("100 bytes at byte 9"), "{err}");
    }
}
