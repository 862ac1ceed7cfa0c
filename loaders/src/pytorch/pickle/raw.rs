//! A decoded value in 8 bytes ([`Raw`]): a 3-bit tag and a payload. The graph's containers,
//! the interned tables and the machine all hold values in this form.

pub(super) const TAG_BITS: u32 = 3;
pub(super) const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
pub(super) const TAG_INT: u64 = 0;
pub(super) const TAG_STR: u64 = 1;
pub(super) const TAG_CONTAINER: u64 = 2;
pub(super) const TAG_CONST: u64 = 3;
pub(super) const TAG_FLOAT: u64 = 4;
pub(super) const TAG_WIDE: u64 = 5;
pub(super) const TAG_BYTES: u64 = 6;
pub(super) const TAG_BIG: u64 = 7;

/// One decoded value in 8 bytes: a 3-bit tag and a payload (an inline integer of up to 61
/// bits, a constant, or an id into one of [`super::graph::Pickle`]'s tables).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Raw(pub(super) u64);

impl Raw {
    pub(super) const NONE: Raw = Raw(TAG_CONST);
    pub(super) const FALSE: Raw = Raw((1 << TAG_BITS) | TAG_CONST);
    pub(super) const TRUE: Raw = Raw((2 << TAG_BITS) | TAG_CONST);
    /// An empty memo slot; never a value.
    pub(super) const HOLE: Raw = Raw((0xff << TAG_BITS) | TAG_CONST);
    /// Constants from this id on are not values but, in a narrow run, escapes: value
    /// `id - ESCAPE_BASE` of [`Pickle::escaped`] (see [`Items::Narrow`]).
    pub(super) const ESCAPE_BASE: u32 = 0x100;

    #[inline]
    pub(super) fn tag(self) -> u64 {
        self.0 & TAG_MASK
    }
    #[inline]
    pub(super) fn id(self) -> u32 {
        // Ids are created from u32s.
        (self.0 >> TAG_BITS) as u32
    }
    #[inline]
    pub(super) fn with_id(tag: u64, id: u32) -> Raw {
        Raw((u64::from(id) << TAG_BITS) | tag)
    }
    /// The inline form of `v`, when it fits in 61 bits.
    #[inline]
    pub(super) fn small_int(v: i64) -> Option<Raw> {
        let shifted = v.wrapping_shl(TAG_BITS);
        (shifted >> TAG_BITS == v).then_some(Raw(shifted as u64 | TAG_INT))
    }
    #[inline]
    pub(super) fn inline_int(self) -> i64 {
        (self.0 as i64) >> TAG_BITS
    }
    /// The 4-byte form: ids below 2^29, integers in -2^28..2^28.
    #[inline]
    pub(super) fn narrow(self) -> Option<u32> {
        let n = self.0 as u32;
        (Raw::widen(n) == self).then_some(n)
    }
    #[inline]
    pub(super) fn widen(n: u32) -> Raw {
        if u64::from(n) & TAG_MASK == TAG_INT {
            Raw(i64::from(n as i32) as u64)
        } else {
            Raw(u64::from(n))
        }
    }
    /// The narrow escape to value `index` of [`Pickle::escaped`], if the index fits.
    #[inline]
    pub(super) fn escape(index: usize) -> Option<u32> {
        let id = u32::try_from(index).ok()?.checked_add(Raw::ESCAPE_BASE)?;
        (id < 1 << (32 - TAG_BITS)).then_some((id << TAG_BITS) | TAG_CONST as u32)
    }
    /// A narrow run's entry `n`, its escape resolved in `escaped`.
    #[inline]
    pub(super) fn unescape(n: u32, escaped: &[Raw]) -> Raw {
        let raw = Raw::widen(n);
        if raw.tag() == TAG_CONST && raw.id() >= Raw::ESCAPE_BASE {
            let i = (raw.id() - Raw::ESCAPE_BASE) as usize;
            escaped.get(i).copied().unwrap_or(Raw::NONE)
        } else {
            raw
        }
    }
}
