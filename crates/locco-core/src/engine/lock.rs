//! A held lease and its state machine: held → lost | released, reported once.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use futures_util::FutureExt;

use crate::engine::events::Event;
use crate::engine::options::validate_ttl;
use crate::engine::scheduler::{Due, Scheduled, TICK_EARLY_MS};
use crate::engine::shared::Shared;
use crate::rt::clock::{checked_now, lease_end};
use crate::rt::error::{Error, LostReason, Result};
use crate::rt::task::{first, First};
use crate::rt::timer::sleep_until;

/// The state of a lock, as `lock.state` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockState {
    Held,
    Lost,
    Released,
}

impl LockState {
    pub fn as_str(self) -> &'static str {
        match self {
            LockState::Held => "held",
            LockState::Lost => "lost",
            LockState::Released => "released",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Heartbeat {
    pub interval: f64,
    pub max_lag: f64,
}

pub(crate) struct LockInner {
    pub id: u64,
    pub shared: Rc<Shared>,
    pub key: String,
    pub token: String,
    pub fence: Option<u64>,
    /// When the request for the first lease left.
    pub acquired_at: f64,
    /// The hold deadline (`maxHold`), with auto-extension.
    pub deadline: Option<f64>,
    pub heartbeat: Option<Heartbeat>,
    /// The latest lease length asked for.
    pub ttl: Cell<u32>,
    pub lease_end: Cell<f64>,
    /// The current lease was shortened to fit the deadline.
    pub clamped: Cell<bool>,
    pub state: Cell<LockState>,
    pub lost_reason: Cell<Option<LostReason>>,
    pub lost_cause: RefCell<Option<Error>>,
    pub ended_at: Cell<Option<f64>>,
    /// `lost` or `released` was reported; a lock reports its ending once.
    pub ending_reported: Cell<bool>,
    pub releasing: Cell<bool>,
    pub extending: Cell<u32>,
    /// The earliest lease end any extension of the current overlapping group (requests in
    /// flight at the same time, transitively) would give.
    pub group_min: Cell<f64>,
    pub last_extend_error: RefCell<Option<Error>>,
    pub heartbeat_stopped: Cell<bool>,
    /// Somebody listens for the loss: expiry is checked on a timer, not only when read.
    pub watched: Cell<bool>,
    /// When the one live expiry check of this lock is due (infinite: none is).
    pub expiry_at: Cell<f64>,
}

/// A held lock. Cheap to clone: clones share one state.
#[derive(Clone)]
pub struct Lock(pub(crate) Rc<LockInner>);

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("id", &self.0.id)
            .field("key", &self.0.key)
            .field("state", &self.0.state.get())
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
        self.0.id
    }
    /// The key, prefix included.
    pub fn key(&self) -> &str {
        &self.0.key
    }
    pub fn token(&self) -> &str {
        &self.0.token
    }
    /// The fencing token of this grant, when the Locker takes them.
    pub fn fence(&self) -> Option<u64> {
        self.0.fence
    }
    /// The latest lease length asked for, in ms.
    pub fn ttl(&self) -> u32 {
        self.0.ttl.get()
    }
    /// The state now: reading it checks the lease clock.
    pub fn state(&self) -> LockState {
        self.0.refresh();
        self.0.state.get()
    }
    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.0.refresh();
        self.0.lost_reason.get()
    }
    /// What caused the loss (the last extension error for `extend-failed`).
    pub fn lost_cause(&self) -> Option<Error> {
        self.0.lost_cause.borrow().clone()
    }
    /// How long the lock has been held; stops counting at loss or release.
    pub fn held_ms(&self) -> f64 {
        self.0.refresh();
        self.0.held_ms()
    }
    /// When the local lease ends, on the Locker's clock.
    pub fn lease_end(&self) -> f64 {
        self.0.lease_end.get()
    }

    /// Checks the lease on a timer from now on, so a loss is reported when it happens.
    pub fn watch(&self) {
        let inner = &self.0;
        if !inner.watched.replace(true) && inner.state.get() == LockState::Held {
            inner.check_expiry_by(inner.lease_end.get());
        }
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
        if inner.state.get() == LockState::Released || inner.releasing.get() {
            return Releasing::Done(Ok(false));
        }
        // No clock read before sending: a lease that already ran out is found by the read after.
        let was_held = inner.state.get() == LockState::Held;
        inner.releasing.set(true);
        let mut op = inner.shared.backend.release(&inner.key, &inner.token);
        if op.is_ready() {
            let answer = (&mut op).now_or_never().expect("a ready answer");
            return Releasing::Done(self.released(answer, final_attempt));
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
        let rt = &inner.shared.rt;
        let lost_until = (!was_held).then(|| rt.clock.now() + f64::from(inner.ttl.get()));
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
        self.released(answer, final_attempt)
    }

    /// Applies a release's answer to the lock.
    fn released(&self, answer: Result<bool>, final_attempt: bool) -> Result<bool> {
        let inner = &self.0;
        inner.releasing.set(false);
        match answer {
            Ok(deleted) => {
                let now = inner.now();
                inner.refresh_at(now);
                if inner.state.get() == LockState::Held {
                    if deleted {
                        inner.ended_at.set(Some(now));
                        inner.report_end(|held_ms, key, ttl| Event::Released { key, ttl, held_ms });
                    } else {
                        inner.lose(LostReason::Release, None, now);
                    }
                }
                if inner.ended_at.get().is_none() {
                    inner.ended_at.set(Some(now));
                }
                inner.state.set(LockState::Released);
                inner.heartbeat_stopped.set(true);
                Ok(deleted)
            }
            Err(e) => {
                if final_attempt {
                    inner.heartbeat_stopped.set(true);
                }
                inner.emit(|held_ms, key, ttl| Event::ReleaseFailed {
                    key,
                    ttl,
                    held_ms,
                    error: &e,
                });
                Err(e)
            }
        }
    }

    /// A new lease of `ttl` ms from now, clamped to the hold deadline.
    pub async fn extend(&self, ttl: u32) -> Result<()> {
        validate_ttl("ttl", ttl as f64)?;
        let inner = &self.0;
        if inner.state.get() == LockState::Released || inner.releasing.get() {
            return Err(Error::State(format!(
                "lock {:?} is released or being released; it cannot be extended",
                inner.key
            )));
        }
        // Checked before the lease is judged by it: a NaN reading would pass for "expired".
        let now = checked_now(&*inner.shared.rt.clock)?;
        inner.refresh_at(now);
        if inner.state.get() == LockState::Lost {
            return Err(inner.lost_error());
        }
        inner.ttl.set(ttl);
        extend_once(&self.0, false).await
    }

    /// One look at the backend. A `false` while held marks the lock lost (`observed`).
    pub async fn is_held(&self) -> Result<bool> {
        let inner = &self.0;
        let held = inner
            .shared
            .backend
            .is_held(&inner.key, &inner.token)
            .await?;
        inner.refresh();
        if !held && inner.state.get() == LockState::Held {
            inner.lose(LostReason::Observed, None, inner.now());
        }
        Ok(held)
    }

    /// Stops the heartbeat for good (the caller gave up on releasing the lock).
    pub fn stop_heartbeat(&self) {
        self.0.heartbeat_stopped.set(true);
    }
}

impl LockInner {
    pub(crate) fn now(&self) -> f64 {
        self.shared.rt.clock.now()
    }

    fn schedule(self: &Rc<Self>, at: f64, due: Due) {
        self.shared.scheduler.push(&self.shared.rt, at, due, self);
    }

    /// Makes sure the lease is checked no later than `end`. A lock keeps one live check: one
    /// already due by then is enough, and when it finds the lease moved on it schedules the
    /// next, so extensions add no entries.
    pub(crate) fn check_expiry_by(self: &Rc<Self>, end: f64) {
        if self.expiry_at.get() <= end {
            return;
        }
        self.expiry_at.set(end);
        self.schedule(end, Due::Expiry);
    }

    /// Schedules the next heartbeat tick at `at`. The scheduler may run it up to a twentieth of
    /// the interval (at most [`TICK_EARLY_MS`]) early, beside other ticks due by then, so that
    /// ticks close in time leave as one batch. Early is safe: a lease counts from when its
    /// request left.
    pub(crate) fn schedule_tick(self: &Rc<Self>, at: f64, hb: Heartbeat) {
        let early = (hb.interval / 20.0).min(TICK_EARLY_MS);
        self.shared
            .scheduler
            .push_tick(&self.shared.rt, at, early, self);
    }

    /// Resolves when the clock passes the current lease end (re-reading it, since an extension
    /// can move it).
    async fn lease_over(&self) {
        loop {
            let end = self.lease_end.get();
            sleep_until(&*self.shared.rt.clock, &*self.shared.rt.timer, end).await;
            if self.lease_end.get() <= end {
                return;
            }
        }
    }

    /// Marks the lock lost when its lease ran out on the clock.
    pub(crate) fn refresh(&self) {
        if self.state.get() == LockState::Held {
            self.refresh_at(self.now());
        }
    }

    /// [`LockInner::refresh`] with the clock already read.
    pub(crate) fn refresh_at(&self, now: f64) {
        let end = self.lease_end.get();
        if self.state.get() != LockState::Held {
            return;
        }
        if now < end {
            // A lease on a session ends with it, whatever its own end says.
            let session_over = self
                .shared
                .backend
                .session_left(&self.key, &self.token)
                .is_some_and(|left| left <= 0.0);
            if session_over {
                self.lose(LostReason::Session, None, now);
            }
            return;
        }
        let failed = self.last_extend_error.borrow().clone();
        let (reason, cause) = if self.clamped.get() {
            (LostReason::MaxHold, None)
        } else if self.extending.get() > 0 {
            (LostReason::LateExtend, None)
        } else if failed.is_some() {
            (LostReason::ExtendFailed, failed)
        } else {
            (LostReason::Expired, None)
        };
        self.lose(reason, cause, end);
    }

    pub(crate) fn lose(&self, reason: LostReason, cause: Option<Error>, at: f64) {
        if self.state.get() != LockState::Held {
            return;
        }
        self.state.set(LockState::Lost);
        self.lost_reason.set(Some(reason));
        *self.lost_cause.borrow_mut() = cause.clone();
        self.ended_at.set(Some(at));
        self.heartbeat_stopped.set(true);
        self.report_end(|held_ms, key, ttl| Event::Lost {
            key,
            ttl,
            held_ms,
            reason,
            error: cause.as_ref(),
        });
        if let Some(l) = &self.shared.options.loss {
            l.lost(self.id, reason, cause.as_ref());
        }
    }

    pub(crate) fn lost_error(&self) -> Error {
        Error::Lost {
            key: self.key.clone(),
            reason: self.lost_reason.get().unwrap_or(LostReason::Expired),
            cause: self.lost_cause.borrow().clone().map(Box::new),
        }
    }

    fn held_ms(&self) -> f64 {
        let end = self.ended_at.get().unwrap_or_else(|| self.now());
        (end - self.acquired_at).max(0.0)
    }

    pub(crate) fn emit<'a>(&'a self, make: impl FnOnce(f64, &'a str, u32) -> Event<'a>) {
        if let Some(sink) = &self.shared.options.events {
            sink.emit(&make(self.held_ms(), &self.key, self.ttl.get()));
        }
    }

    fn report_end<'a>(&'a self, make: impl FnOnce(f64, &'a str, u32) -> Event<'a>) {
        if !self.ending_reported.replace(true) {
            self.emit(make);
        }
    }
}

impl Scheduled for LockInner {
    fn on_due(self: Rc<Self>, due: Due, at: f64) {
        on_due(&self, due, at);
    }
}

/// Runs what the scheduler says is due for `lock`.
fn on_due(lock: &Rc<LockInner>, due: Due, at: f64) {
    if due == Due::Expiry {
        // Only the live check counts; an earlier one made it stale.
        if at != lock.expiry_at.get() {
            return;
        }
        lock.expiry_at.set(f64::INFINITY);
        lock.refresh();
        if lock.state.get() == LockState::Held {
            lock.check_expiry_by(lock.lease_end.get());
        }
        return;
    }
    lock.refresh();
    if lock.state.get() != LockState::Held || lock.heartbeat_stopped.get() {
        return;
    }
    let Some(hb) = lock.heartbeat else { return };
    let now = lock.now();
    if now - at > hb.max_lag {
        // The event loop stalled past the allowed lag: do not vouch for this process. The lease
        // runs out unless a later tick finds the loop healthy again.
        lock.schedule(now + hb.interval / 3.0, Due::Tick);
        return;
    }
    lock.shared.renewals.add(lock.clone());
}

/// Sends one extension of `lock.ttl` (clamped to the deadline) and applies its answer.
async fn extend_once(inner: &Rc<LockInner>, from_heartbeat: bool) -> Result<()> {
    // A non-finite reading would turn into a made-up ttl below: refuse it before sending.
    let sent_at = checked_now(&*inner.shared.rt.clock)?;
    let ttl = begin_extend(inner, sent_at)?;
    let op = inner.shared.backend.extend(&inner.key, &inner.token, ttl);
    let answer = match first(op, inner.lease_over()).await {
        First::Left(r) => Some(r),
        First::Right(()) => None,
    };
    finish_extend(inner, ttl, sent_at, inner.now(), answer, from_heartbeat)
}

/// The part of an extension before its request leaves at `sent_at`: the ttl to ask for
/// (clamped to the hold deadline), with the lease judged as if the request were applied now.
pub(crate) fn begin_extend(inner: &Rc<LockInner>, sent_at: f64) -> Result<u32> {
    let mut ttl = inner.ttl.get();
    if let Some(deadline) = inner.deadline {
        let left = (deadline - sent_at).floor();
        if left < 1.0 {
            inner.lose(LostReason::MaxHold, None, sent_at.min(deadline));
            return Err(inner.lost_error());
        }
        ttl = ttl.min(left as u32);
    }
    let end = lease_end(sent_at, ttl);
    // Extensions in flight together may be applied in any order, and the backend may apply one
    // before its answer comes back, or without an answer ever coming. So from now on the lease
    // can end as early as this request's lease would, and as early as any request of the same
    // overlapping group.
    let group_min = if inner.extending.get() == 0 {
        end
    } else {
        inner.group_min.get().min(end)
    };
    inner.group_min.set(group_min);
    inner.extending.set(inner.extending.get() + 1);
    if end < inner.lease_end.get() {
        inner.lease_end.set(end);
        if inner.watched.get() || inner.heartbeat.is_some() {
            inner.check_expiry_by(end);
        }
    }
    Ok(ttl)
}

/// Applies the answer to an extension of `ttl` that left at `sent_at`, read at `now`; `None`
/// when the lease ran out before any answer came.
pub(crate) fn finish_extend(
    inner: &Rc<LockInner>,
    ttl: u32,
    sent_at: f64,
    now: f64,
    answer: Option<Result<bool>>,
    from_heartbeat: bool,
) -> Result<()> {
    // Judged while the request still counts as in flight: a late answer is late-extend.
    inner.refresh_at(now);
    inner.extending.set(inner.extending.get() - 1);
    if inner.state.get() != LockState::Held {
        return Err(inner.lost_error());
    }
    match answer {
        None => Err(inner.lost_error()),
        Some(Ok(true)) => {
            // Whichever request of the group the backend applied last sets its lease, which
            // ends no earlier than the group's earliest end.
            let end = inner.group_min.get();
            inner.lease_end.set(end);
            inner.clamped.set(ttl < inner.ttl.get());
            *inner.last_extend_error.borrow_mut() = None;
            inner.emit(|held_ms, key, ttl| Event::Extended { key, ttl, held_ms });
            if inner.watched.get() || inner.heartbeat.is_some() {
                inner.check_expiry_by(end);
            }
            // Only the heartbeat's own extension schedules its next tick: a manual extend()
            // that did so would start a second chain of ticks beside the first.
            if let (true, Some(hb)) = (from_heartbeat, inner.heartbeat) {
                if !inner.heartbeat_stopped.get() {
                    inner.schedule_tick(sent_at + hb.interval, hb);
                }
            }
            Ok(())
        }
        Some(Ok(false)) => {
            inner.lose(LostReason::Extend, None, now);
            Err(inner.lost_error())
        }
        Some(Err(e)) => {
            inner.emit(|held_ms, key, ttl| Event::ExtendFailed {
                key,
                ttl,
                held_ms,
                error: &e,
            });
            *inner.last_extend_error.borrow_mut() = Some(e.clone());
            if from_heartbeat {
                if let Some(hb) = inner.heartbeat {
                    inner.schedule(now + hb.interval / 3.0, Due::Tick);
                }
            }
            Err(e)
        }
    }
}
