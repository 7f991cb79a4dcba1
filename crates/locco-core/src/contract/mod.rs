//! What a backend must do: a few atomic verbs over `(key, token, ttl)`, with optional
//! capabilities (a fair queue, fencing, sessions, operator verbs), the [`Op`] an answer comes
//! in, and the stored value's format ([`value`]). The engine drives backends only through
//! this; backends know nothing else of the engine.

pub mod queue;
pub mod value;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::rt::error::Result;
pub use queue::{Queue, Queued};

/// The longest lease: what a 32-bit signed millisecond timer holds.
pub const MAX_TTL_MS: f64 = 2_147_483_647.0;

/// The answer of one backend operation: ready at once (the in-memory backend) or later.
/// Being an enum keeps the synchronous path free of allocations.
pub enum Op<T> {
    Ready(Option<Result<T>>),
    /// A request in flight, and how to ask the backend to stop it early.
    Pending(
        Pin<Box<dyn Future<Output = Result<T>>>>,
        Option<Box<dyn FnOnce()>>,
    ),
}

impl<T> Op<T> {
    pub fn ready(value: Result<T>) -> Self {
        Op::Ready(Some(value))
    }
    pub fn pending(fut: impl Future<Output = Result<T>> + 'static) -> Self {
        Op::Pending(Box::pin(fut), None)
    }

    /// The answer is already there (an in-memory backend's): awaiting it needs no deadline.
    pub fn is_ready(&self) -> bool {
        matches!(self, Op::Ready(Some(_)))
    }

    /// Registers how to stop this request early (a cancel request to the server). A second
    /// registration runs after the first, not instead of it: an I/O-thread request's own stop
    /// (see `io::run`) must still run when a backend adds a [`GivenUp`] on top.
    pub fn with_abandon(mut self, stop: impl FnOnce() + 'static) -> Self {
        if let Op::Pending(_, slot) = &mut self {
            *slot = Some(match slot.take() {
                None => Box::new(stop),
                Some(first) => Box::new(move || {
                    first();
                    stop();
                }),
            });
        }
        self
    }

    /// Sets `given_up` when this request is abandoned (see [`GivenUp`]).
    pub fn given_up_by(self, given_up: GivenUp) -> Self {
        self.with_abandon(move || given_up.0.store(true, Ordering::Release))
    }

    /// Asks the backend to stop this request as soon as it can, because nobody needs its
    /// answer in time any more. The answer still arrives: a grant that slipped through can
    /// then be given back.
    pub fn abandon(&mut self) {
        if let Op::Pending(_, slot) = self {
            if let Some(stop) = slot.take() {
                stop();
            }
        }
    }
}

/// Whether the caller gave an operation up ([`Op::abandon`], through [`Op::given_up_by`]). A
/// grant that has not left yet (it waits for a connection or for room on one) checks it just
/// before it writes and sends nothing: sent late, it would land after the caller's give-back
/// and leave a grant nobody releases in time.
#[derive(Clone, Default)]
pub struct GivenUp(Arc<AtomicBool>);

impl GivenUp {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl<T> Unpin for Op<T> {}

impl<T> Future for Op<T> {
    type Output = Result<T>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        match &mut *self {
            Op::Ready(v) => Poll::Ready(v.take().expect("Op polled after completion")),
            Op::Pending(f, _) => f.as_mut().poll(cx),
        }
    }
}

/// A lock backend. Every method is one atomic step on the backend, and answers `true` only when
/// it applied to *our* key (the key carries `token`). `false` means another holder, or no
/// holder, had it. An `Err` is a failure of the backend, never contention.
pub trait Backend {
    /// A short name for messages and `BackendError.backend` ("memory", "redis", …).
    fn name(&self) -> &str;
    /// Sets `key = token` with a lease of `ttl` ms when the key is free or expired.
    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool>;
    /// Deletes `key` when it carries `token`.
    fn release(&self, key: &str, token: &str) -> Op<bool>;
    /// Gives `key` a new lease of `ttl` ms from now when it carries `token` and is live.
    /// Never re-creates an expired key.
    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool>;
    /// [`Backend::extend`] for many locks at once (the heartbeats that fell due together), in as
    /// few operations as the backend allows. Answers one outcome per renewal, in order, each
    /// what `extend` would have answered for it: a key lost among many renewed ones is `false`
    /// for that renewal only, and so is an `Err` of one renewal. A failure of the whole
    /// operation is its `Err`. The default sends one `extend` per renewal, all at once.
    fn extend_many(&self, renewals: &[Renewal<'_>]) -> Op<Vec<Result<bool>>> {
        extend_each(self, renewals)
    }
    /// Whether `key` carries `token` and a live lease.
    fn is_held(&self, key: &str, token: &str) -> Op<bool>;
    /// Whether [`Backend::acquire_fenced`] is implemented.
    fn supports_fencing(&self) -> bool {
        false
    }
    /// Why `fencing: true` is refused, when the backend can say better than "no
    /// acquire_fenced" (and where to look instead).
    fn no_fencing_reason(&self) -> Option<String> {
        None
    }
    /// Acquires like [`Backend::acquire`] and takes the key's next fencing token: a positive
    /// integer below 2^53, larger than any the key had before. `None` when the key is held.
    fn acquire_fenced(&self, _key: &str, _token: &str, _ttl: u32) -> Op<Option<u64>> {
        Op::ready(Err(crate::rt::error::Error::validation(
            "fencing",
            format!(
                "the {} backend has no fencing tokens (acquire_fenced)",
                self.name()
            ),
        )))
    }
    /// Coordination records beside the locks (wait-for edges between processes), when the
    /// backend keeps them. `None` when it does not.
    fn coordination(&self) -> Option<&dyn Coordination> {
        None
    }
    /// A place in the queue of callers waiting for `key`, woken when it is released, so a
    /// waiter does not depend on its next poll. `None` when the backend cannot tell.
    fn waiter(&self, _key: &str) -> Option<Box<dyn Waiter>> {
        None
    }
    /// Settles when the backend learns that the lease `token` holds on `key` is gone (the
    /// session or connection that kept it ended), so that the lock is lost at once rather than
    /// at its next extension: `Ok` means lost. It settles at the latest when the lease ends for
    /// any other reason (an `Err`, or `Ok` after a release, is then ignored). `None`, the
    /// default, when the backend cannot tell.
    fn watch_lost(&self, _key: &str, _token: &str) -> Option<Op<()>> {
        None
    }
    /// Milliseconds until the session or connection that keeps `token`'s lease on `key` may
    /// end by the backend's own reckoning (0 once it may have), read at once, without I/O.
    /// A holder's state is read on the clock: this lets a read right after a blocked event
    /// loop answer "lost" before [`Backend::watch_lost`]'s news could arrive. `None`, the
    /// default, when the lease rests on no session or the backend cannot tell.
    fn session_left(&self, _key: &str, _token: &str) -> Option<f64> {
        None
    }
    /// The fair queue of waiters, shared by every process, when the backend keeps one. Then
    /// waiters take their turn in it instead of racing for a free key (see [`Queue`]).
    fn queue(&self) -> Option<&dyn Queue> {
        None
    }
    /// What the backend knows about `key` now, for operators: whether a live lease holds it,
    /// how long that lease has left, the key's last fencing token and the holder's label.
    /// Never the token. The default refuses, naming the backend.
    fn inspect(&self, _key: &str) -> Op<KeyInfo> {
        Op::ready(Err(unsupported(self.name(), "inspect")))
    }
    /// The keys starting with `prefix` that a live lease holds, at most `limit` of them, in
    /// the order the backend finds them. The default refuses, naming the backend.
    fn list(&self, _prefix: &str, _limit: u32) -> Op<Vec<KeyInfo>> {
        Op::ready(Err(unsupported(self.name(), "list")))
    }
    /// Deletes whatever lease holds `key`, whatever its token: an operator's tool. `true` when
    /// a live lease was removed. Its holder learns it at its next extend or `is_held`; a
    /// waiter queued for the key takes its turn as after a release. The default refuses.
    fn force_release(&self, _key: &str) -> Op<bool> {
        Op::ready(Err(unsupported(self.name(), "forceRelease")))
    }
}

/// What [`Backend::inspect`] and [`Backend::list`] tell about one key. Never the token.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyInfo {
    /// The key as the backend stores it (the Locker's prefix included).
    pub key: String,
    /// A live lease holds the key.
    pub held: bool,
    /// Milliseconds until the lease ends, by the backend's clock, when held and known.
    pub ttl_left: Option<f64>,
    /// The key's last fencing token, when the backend keeps one per key.
    pub fence: Option<u64>,
    /// The holder's label (the `holder` option of its acquisition), when it gave one.
    pub holder: Option<String>,
}

/// The refusal of an operator verb a backend does not implement.
pub fn unsupported(backend: &str, verb: &str) -> crate::rt::error::Error {
    crate::rt::error::Error::validation(
        "adapter",
        format!("the {backend} backend cannot {verb} keys (it has no {verb} method)"),
    )
}

/// One lock to renew in [`Backend::extend_many`].
#[derive(Debug, Clone, Copy)]
pub struct Renewal<'a> {
    pub key: &'a str,
    pub token: &'a str,
    pub ttl: u32,
}

/// The default [`Backend::extend_many`]: one `extend` per renewal, sent together. Answers at
/// once when every one of them did (the in-memory backend).
pub fn extend_each<B: Backend + ?Sized>(
    backend: &B,
    renewals: &[Renewal<'_>],
) -> Op<Vec<Result<bool>>> {
    let mut ops: Vec<Op<bool>> = renewals
        .iter()
        .map(|r| backend.extend(r.key, r.token, r.ttl))
        .collect();
    if ops.iter().all(|op| matches!(op, Op::Ready(_))) {
        let answers = ops
            .iter_mut()
            .map(|op| match op {
                Op::Ready(v) => v.take().expect("a ready answer is read once"),
                Op::Pending(..) => unreachable!("checked above"),
            })
            .collect();
        return Op::ready(Ok(answers));
    }
    Op::pending(async move { Ok(futures_util::future::join_all(ops).await) })
}

/// A queued waiter for one key (see [`Backend::waiter`]). Dropping it leaves the queue.
pub trait Waiter {
    /// Resolves when the key was released since the last call (or since the waiter was made).
    fn released(&mut self) -> Pin<Box<dyn Future<Output = ()> + '_>>;
}

/// Small records with a lifetime, kept beside the locks so that processes can see each other's
/// waits (for deadlock detection across processes).
pub trait Coordination {
    /// The token stored under a live lock `key`, if any.
    fn peek(&self, key: &str) -> Op<Option<String>>;
    /// Stores `value` under `key` for `ttl` ms.
    fn put(&self, key: &str, value: &str, ttl: u32) -> Op<()>;
    /// The live value under `key`, if any.
    fn get(&self, key: &str) -> Op<Option<String>>;
    /// Removes `key`.
    fn delete(&self, key: &str) -> Op<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abandoning_runs_every_registered_stop_in_order() {
        let given_up = GivenUp::default();
        let order = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let first = order.clone();
        let mut op = Op::<()>::pending(std::future::pending())
            .with_abandon(move || first.borrow_mut().push("first"))
            .given_up_by(given_up.clone());
        op.abandon();
        assert_eq!(*order.borrow(), ["first"]);
        assert!(given_up.get());
    }
}
