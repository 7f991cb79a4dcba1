//! The fair waiter queue a backend may keep: one FIFO queue per key, shared by every process
//! that uses the backend, so that a contended key goes to whoever asked first.
//!
//! Rules every implementation keeps:
//! - Only the longest *live* waiter may take a free key; a plain [`crate::contract::Backend::acquire`]
//!   (a try, which never queues) is refused while anyone waits.
//! - A place lives `lease` ms and is renewed by each attempt of its waiter, so a waiter that
//!   died (killed, partitioned) holds up the others for at most that lease.
//! - A release (or a head leaving a free key) pushes a wake to the new head. A push only says
//!   "try now": the grant is still the waiter's own attempt, so the lease clock rule holds.

use crate::contract::{Op, Waiter};

/// What a queued attempt got.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Queued {
    /// The key is ours; the fencing token when the attempt asked for one.
    Granted(Option<u64>),
    /// Held, or free but promised to an earlier waiter: we are (still) in the queue.
    /// `retry_in`: the latest useful moment to try again, in ms, when the backend knows it
    /// (at the head, when the holder's lease runs out).
    Waiting { retry_in: Option<f64> },
}

/// A backend's queue of waiters (see the module documentation).
pub trait Queue {
    /// One attempt as `waiter`: a grant when the key is free and nobody live waits ahead of
    /// us (we leave the queue then); otherwise we join the queue, or keep our place, for
    /// `lease` ms. `fenced` takes a fencing token with the grant.
    fn acquire_queued(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: &str,
        lease: u32,
        fenced: bool,
    ) -> Op<Queued>;

    /// Leaves `key`'s queue at once (aborted, out of time, failed). Passes the wake on when
    /// we were the head of a free key. Nothing happens when we are not in it.
    fn leave(&self, key: &str, waiter: &str) -> Op<()>;

    /// Where `waiter` hears that it may try now. Made before the first attempt, so that no
    /// push can arrive before anyone listens; dropping it stops listening.
    fn wakeups(&self, key: &str, waiter: &str) -> Box<dyn Waiter>;

    /// Whether an acquisition's first try should be a queued attempt, which joins the queue
    /// when the key is taken: for a queue kept in this process, where that costs no more
    /// than a plain try. Otherwise the first try is plain (across the network the cheaper
    /// request, and most first tries win), and the join comes with the next attempt.
    fn joins_on_first_try(&self) -> bool {
        false
    }
}
