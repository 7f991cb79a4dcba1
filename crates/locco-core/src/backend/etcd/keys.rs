//! Where this adapter's records live under `prefix`: lock keys, the places of a key's queue, and
//! the refusal marks of attempts.

use std::sync::atomic::Ordering;

use super::Inner;

impl Inner {
    pub(super) fn key(&self, key: &str) -> String {
        format!("{}{}", self.options.prefix, key)
    }

    /// Where the places of `key`'s queue live: `<prefix>\x01q/<key>\x00<waiter>`.
    pub(super) fn queue_prefix(&self, key: &str) -> String {
        format!("{}\u{1}q/{}\u{0}", self.options.prefix, key)
    }

    /// An attempt's refusal mark, `<prefix>\x01x/<token>/<n>`: every copy of the attempt
    /// requires it absent. Put once the attempt's answer is lost (see [`Unsure`]), so that a
    /// copy still on its way cannot write after the clean-up looked.
    ///
    /// [`Unsure`]: super::Unsure
    pub(super) fn refusal_key(&self, token: &str) -> String {
        let n = self.generation.fetch_add(1, Ordering::Relaxed);
        format!("{}\u{1}x/{}/{}", self.options.prefix, token, n)
    }

    pub(super) fn place_key(&self, key: &str, waiter: &str) -> String {
        format!("{}{}", self.queue_prefix(key), waiter)
    }
}

/// The end of the range of keys that start with `prefix`: its last byte below 0xff plus one.
pub(super) fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}
