//! Hashing of the simulator's integer keys (addresses, page numbers, context keys): one
//! multiplier and one hasher for every hash table in the crate, instead of a copy in each user.
//!
//! Nothing hashed here comes from an adversary, so a multiply does instead of the standard
//! library's SipHash, whose cost would show in the replay loops.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// 2^64 divided by the golden ratio: multiplying by it spreads keys that differ only in their
/// high bits, or step by a power of two, over the product's top bits (Fibonacci hashing). The
/// open-addressing tables ([`crate::policy`]'s address map, [`crate::predict`]'s context tables)
/// take their slot from those top bits.
pub(crate) const HASH_MUL: u64 = 0x9E37_79B9_7F4A_7C15;

/// Multiplicative hasher for addresses: they are multiples of the alignment, so a plain
/// identity hash would leave the low bits (which pick the bucket) all zero.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        let product = u128::from(x ^ self.0) * u128::from(HASH_MUL);
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

/// The standard hash map over integer keys, hashed by [`AddrHasher`]: the bump pool's used
/// blocks, the lifetime learner's contexts, the OS-swap model's pages.
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<AddrHasher>>;
