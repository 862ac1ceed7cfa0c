//! The protocol-buffers wire format, the little of it `profile.proto` needs: varints,
//! length-delimited fields and packed repeated integers. Writing it here keeps a code
//! generator and its build step out of the tree for one message family.

/// A message being written.
#[derive(Default)]
pub struct Message {
    bytes: Vec<u8>,
}

const WIRE_VARINT: u64 = 0;
const WIRE_LEN: u64 = 2;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

impl Message {
    fn key(&mut self, field: u32, wire: u64) {
        put_varint(&mut self.bytes, (u64::from(field) << 3) | wire);
    }

    /// An unsigned integer field; zero (the default) is left out, as encoders do.
    pub fn uint(&mut self, field: u32, v: u64) -> &mut Self {
        if v != 0 {
            self.key(field, WIRE_VARINT);
            put_varint(&mut self.bytes, v);
        }
        self
    }

    /// A signed `int64` field (two's complement, not zigzag).
    pub fn int(&mut self, field: u32, v: i64) -> &mut Self {
        self.uint(field, v as u64)
    }

    /// A `bool` field.
    pub fn flag(&mut self, field: u32, v: bool) -> &mut Self {
        self.uint(field, u64::from(v))
    }

    /// A length-delimited field: bytes, a string or an embedded message.
    pub fn bytes(&mut self, field: u32, v: &[u8]) -> &mut Self {
        self.key(field, WIRE_LEN);
        put_varint(&mut self.bytes, v.len() as u64);
        self.bytes.extend_from_slice(v);
        self
    }

    /// An embedded message.
    pub fn message(&mut self, field: u32, m: &Message) -> &mut Self {
        self.bytes(field, &m.bytes)
    }

    /// A packed repeated integer field (nothing when empty).
    pub fn packed(&mut self, field: u32, values: impl IntoIterator<Item = u64>) -> &mut Self {
        let mut body = Vec::new();
        for v in values {
            put_varint(&mut body, v);
        }
        if !body.is_empty() {
            self.bytes(field, &body);
        }
        self
    }

    /// The encoded message.
    #[must_use]
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_encode_as_the_wire_format_says() {
        let mut inner = Message::default();
        inner.uint(1, 150);
        let mut m = Message::default();
        m.uint(1, 0)
            .int(2, -1)
            .bytes(3, b"hi")
            .message(4, &inner)
            .packed(5, [3, 270]);
        assert_eq!(
            m.into_bytes(),
            [
                0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, // 2: -1
                0x1a, 2, b'h', b'i', // 3: "hi"
                0x22, 3, 0x08, 0x96, 0x01, // 4: {1: 150}
                0x2a, 3, 3, 0x8e, 0x02, // 5: [3, 270]
            ]
        );
    }
}
