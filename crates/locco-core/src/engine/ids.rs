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
