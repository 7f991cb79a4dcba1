//! Maps keyed by the serial numbers this library hands out (lock, task and timer ids).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for integer ids. The ids are ours, not an attacker's, so SipHash's protection
/// against chosen keys buys nothing; a multiply spreads serial numbers over the buckets.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A `HashMap` keyed by an id.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A `HashMap` keyed by lock keys or waiter ids on the hot path of every hand-off. Keys may
/// come from users' input, so the hash is still seeded at random per process (foldhash), but
/// it costs a fraction of SipHash's on keys this short.
pub type KeyMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
/// A set of such keys.
pub type KeySet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// 16 random bytes as 32 hex digits.
pub fn random_token() -> String {
    use rand::RngCore;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // Filled in one call: drawing a `[u8; 16]` draws a word per byte.
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    let mut out = [0u8; 32];
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[(b >> 4) as usize];
        pair[1] = HEX[(b & 15) as usize];
    }
    // SAFETY: every byte is one of HEX's ASCII digits. (Checking them cost a third as much as
    // drawing the random bytes, on every acquisition.)
    unsafe { String::from_utf8_unchecked(out.to_vec()) }
}

#[cfg(test)]
mod tests {
    use super::random_token;

    #[test]
    fn a_random_token_is_32_lowercase_hex_digits_and_new_each_time() {
        let (a, b) = (random_token(), random_token());
        for t in [&a, &b] {
            assert_eq!(t.len(), 32);
            assert!(t
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        }
        assert_ne!(a, b);
    }
}
