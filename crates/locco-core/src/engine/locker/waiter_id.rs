//! Waiter ids: a place in a backend's fair queue, unique across processes and not the token
//! (the queue may be read by others).

use std::cell::Cell;

use crate::rt::ids::random_token;

thread_local! {
    /// Waiter ids: a prefix unique across processes (so ids from two hosts never meet in
    /// one queue), and the next serial number. One thread-local: a first try that may join a
    /// queue makes an id, won or not.
    static WAITERS: Cell<([u8; 16], u64)> = Cell::new((waiter_prefix(), 1));
}

fn waiter_prefix() -> [u8; 16] {
    let mut prefix = [0; 16];
    prefix.copy_from_slice(&random_token().as_bytes()[..16]);
    prefix
}

/// A waiter id: unique, and not the token (the queue may be read by others). Made on the
/// stack: a first try that joins a queue in this process makes one, and most of them win
/// and keep none.
pub(super) struct WaiterId {
    bytes: [u8; 16 + 1 + 16],
    len: usize,
}

impl WaiterId {
    pub(super) fn next() -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let (prefix, n) = WAITERS.with(|w| {
            let (prefix, n) = w.get();
            w.set((prefix, n.wrapping_add(1)));
            (prefix, n)
        });
        // By hand: `format!` cost a fiftieth of a contended hand-off.
        let mut id = WaiterId {
            bytes: [0; 33],
            len: 17,
        };
        id.bytes[..16].copy_from_slice(&prefix);
        id.bytes[16] = b'.';
        let digits = (64 - n.leading_zeros()).div_ceil(4).max(1);
        for shift in (0..digits).rev() {
            id.bytes[id.len] = HEX[((n >> (shift * 4)) & 0xf) as usize];
            id.len += 1;
        }
        id
    }

    pub(super) fn as_str(&self) -> &str {
        // SAFETY: the prefix is hex digits (a random token's), then '.' and hex digits.
        unsafe { std::str::from_utf8_unchecked(&self.bytes[..self.len]) }
    }
}

pub(super) fn next_waiter_id() -> String {
    WaiterId::next().as_str().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_serial(n: u64) {
        WAITERS.with(|w| w.set((w.get().0, n)));
    }

    #[test]
    fn waiter_ids_are_the_prefix_and_the_serial_number_in_hex() {
        let (a, b) = (next_waiter_id(), next_waiter_id());
        let prefix = WAITERS.with(|w| String::from_utf8(w.get().0.to_vec()).unwrap());
        let serial = |id: &str| {
            let (p, n) = id.split_once('.').expect("a dot");
            assert_eq!(p, prefix);
            u64::from_str_radix(n, 16).expect("hex")
        };
        assert_eq!(serial(&b), serial(&a) + 1);
        set_serial(0xfedc_ba98_7654_3210);
        assert_eq!(next_waiter_id(), format!("{prefix}.fedcba9876543210"));
        set_serial(0);
        assert_eq!(next_waiter_id(), format!("{prefix}.0"));
        set_serial(0x10);
        assert_eq!(next_waiter_id(), format!("{prefix}.10"));
    }
}
