//! Where a lock's keys live: its hash tag and Cluster slot, and the keys kept beside it (its
//! queue, its places' deadlines, its fencing counter).

/// The hash tag of a key (the part Redis Cluster hashes), when it has a valid one.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

/// The Cluster hash slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key.
pub(super) fn slot_of(key: &str) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in hashed.as_bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// A key beside a lock's, in the same hash slot: `suffix` after the lock's key, which is
/// wrapped in a hash tag when it has none.
fn beside(key: &str, suffix: &str) -> String {
    if hash_tag(key).is_some() {
        suffixed(key, suffix)
    } else {
        format!("{{{key}}}:{suffix}")
    }
}

/// `<key>:<suffix>`, without the formatting machinery: it runs for every release.
fn suffixed(key: &str, suffix: &str) -> String {
    let mut s = String::with_capacity(key.len() + 1 + suffix.len());
    s.push_str(key);
    s.push(':');
    s.push_str(suffix);
    s
}

/// The key of a lock's fencing counter, in the same hash slot as the lock.
pub fn fence_key(key: &str) -> String {
    beside(key, "locco-fence")
}

/// The keys the scripts take: the lock, its queue, its places' deadlines, and its fence
/// counter when `fenced` (an ACL may not allow it). The queue's keys start with the lock's key
/// where they can (not on a Cluster, where a key without a hash tag needs one), so ACL key
/// patterns that allow the lock allow its queue.
pub(super) fn lock_keys(key: &str, cluster: bool, fenced: bool) -> Vec<String> {
    let queue = |suffix: &str| match cluster {
        true => beside(key, suffix),
        false => suffixed(key, suffix),
    };
    let mut keys = Vec::with_capacity(4);
    keys.extend([key.to_owned(), queue("locco-q"), queue("locco-qt")]);
    if fenced {
        keys.push(fence_key(key));
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("123456789"), 12739);
    }

    #[test]
    fn fence_counters_share_the_lock_slot() {
        assert_eq!(fence_key("order:1"), "{order:1}:locco-fence");
        assert_eq!(fence_key("{order}:1"), "{order}:1:locco-fence");
        assert_eq!(hash_tag("a{}b"), None);
        assert_eq!(hash_tag("a{b}c"), Some("b"));
    }
}
