//! A held lease: the handle callers hold ([`Lock`]), its state machine ([`state`], the only
//! writer of a lock's fields) and the batch its heartbeat renewals leave in ([`renewals`]).

use std::rc::Rc;

use futures_util::FutureExt;

use crate::engine::options::validate_ttl;
use crate::rt::error::{Error, LostReason, Result};
use crate::rt::task::{first, First};
use crate::rt::timer::sleep_until;

pub(crate) mod renewals;
pub(crate) mod state;

pub use state::LockState;
pub(crate) use state::{Env, LockInner};

/// A held lock. Cheap to clone: clones share one state.
#[derive(Clone)]
pub struct Lock(pub(crate) Rc<LockInner>);

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("id", &self.0.id())
            .field("key", &self.0.key())
            .field("state", &self.0.state())
            .finish()
    }
}

/// What [`Lock::begin_release`] did.
pub enum Releasing {
    /// Answered within the call.
    Done(Result<bool>),
    /// Sent; [`Lock::finish_release`] waits for the answer.
    Sent(SentRelease),
}

/// A release request still out. Hand it to [`Lock::finish_release`] at once: until its answer
/// is applied, the lock counts as being released.
pub struct SentRelease {
    op: crate::contract::Op<bool>,
    /// Whether the lock was held when it left (a lost one's answer is awaited in full).
    was_held: bool,
}

impl Lock {
    /// A process-unique id.
    pub fn id(&self) -> u64 {
        self.0.id()
    }
    /// The key, prefix included.
    pub fn key(&self) -> &str {
        self.0.key()
    }
    pub fn token(&self) -> &str {
        self.0.token()
    }
    /// The fencing token of this grant, when the Locker takes them.
    pub fn fence(&self) -> Option<u64> {
        self.0.fence()
    }
    /// The latest lease length asked for, in ms.
    pub fn ttl(&self) -> u32 {
        self.0.ttl()
    }
    /// The state now: reading it checks the lease clock.
    pub fn state(&self) -> LockState {
        self.0.refresh();
        self.0.state()
    }
    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.0.refresh();
        self.0.lost_reason()
    }
    /// What caused the loss (the last extension error for `extend-failed`).
    pub fn lost_cause(&self) -> Option<Error> {
        self.0.lost_cause()
    }
    /// How long the lock has been held; stops counting at loss or release.
    pub fn held_ms(&self) -> f64 {
        self.0.refresh();
        self.0.held_ms()
    }
    /// When the local lease ends, on the Locker's clock.
    pub fn lease_end(&self) -> f64 {
        self.0.lease_end()
    }

    /// Checks the lease on a timer from now on, so a loss is reported when it happens.
    pub fn watch(&self) {
        self.0.watch();
    }

    /// Deletes our key. `true` when it did, `false` when the key was gone or another holder's
    /// (the lock is then reported lost). A backend error leaves the state as it was, so a later
    /// call can try again; with `final_attempt` the heartbeat stops all the same, because nobody
    /// will release the lock again.
    pub async fn release(&self, final_attempt: bool) -> Result<bool> {
        match self.begin_release(final_attempt) {
            Releasing::Done(answer) => answer,
            Releasing::Sent(sent) => self.finish_release(sent, final_attempt).await,
        }
    }

    /// The start of [`Self::release`], within the call: the whole of it when the backend
    /// answered at once (in memory), so that such a release builds no future.
    pub fn begin_release(&self, final_attempt: bool) -> Releasing {
        let inner = &self.0;
        let Some(was_held) = inner.begin_release() else {
            return Releasing::Done(Ok(false));
        };
        let mut op = inner.env().backend.release(inner.key(), inner.token());
        if op.is_ready() {
            let answer = (&mut op).now_or_never().expect("a ready answer");
            return Releasing::Done(inner.released(answer, final_attempt));
        }
        Releasing::Sent(SentRelease { op, was_held })
    }

    /// The rest of a release whose answer [`Self::begin_release`] did not have.
    pub async fn finish_release(&self, sent: SentRelease, final_attempt: bool) -> Result<bool> {
        let SentRelease { op, was_held } = sent;
        let inner = &self.0;
        // Past the lease end the answer no longer matters: the key is free either way. A lease
        // already lost leaves the release only tidying up, which waits one ttl at most: a
        // backend that never answers must not hold up the caller for ever.
        let rt = &inner.env().rt;
        let lost_until = (!was_held).then(|| rt.clock.now() + f64::from(inner.ttl()));
        let bound = async {
            match lost_until {
                None => inner.lease_over().await,
                Some(until) => sleep_until(&*rt.clock, &*rt.timer, until).await,
            }
        };
        let answer = match Box::pin(first(op, bound)).await {
            First::Left(r) => r,
            First::Right(()) => Ok(false),
        };
        inner.released(answer, final_attempt)
    }

    /// A new lease of `ttl` ms from now, clamped to the hold deadline.
    pub async fn extend(&self, ttl: u32) -> Result<()> {
        validate_ttl("ttl", ttl as f64)?;
        self.0.begin_manual_extend(ttl)?;
        state::extend_once(&self.0, false).await
    }

    /// One look at the backend. A `false` while held marks the lock lost (`observed`).
    pub async fn is_held(&self) -> Result<bool> {
        let inner = &self.0;
        let held = inner
            .env()
            .backend
            .is_held(inner.key(), inner.token())
            .await?;
        inner.observed(held);
        Ok(held)
    }

    /// Stops the heartbeat for good (the caller gave up on releasing the lock).
    pub fn stop_heartbeat(&self) {
        self.0.stop_heartbeat();
    }
}
