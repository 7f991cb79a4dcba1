//! A lock's state and every change to it: held → lost | released, the ending reported once.
//! The fields are private to this file: the handle ([`super::Lock`]) and the renewal batch
//! read them through methods and change them only through the methods here.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::contract::Backend;
use crate::engine::events::{Event, EventSink, LossListener};
use crate::engine::lock::renewals::Renewals;
use crate::engine::options::AcquireOptions;
use crate::engine::scheduler::{Due, Scheduled, Scheduler, TICK_EARLY_MS};
use crate::rt::clock::{checked_now, lease_end};
use crate::rt::error::{Error, LostReason, Result};
use crate::rt::runtime::Runtime;
use crate::rt::task::{first, First};
use crate::rt::timer::sleep_until;

thread_local! {
    static NEXT_LOCK_ID: Cell<u64> = const { Cell::new(1) };
}

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

/// What a held lock uses of the Locker that made it: one per Locker, shared by its locks.
pub(crate) struct Env {
    pub backend: Rc<dyn Backend>,
    pub rt: Runtime,
    pub events: Option<Rc<dyn EventSink>>,
    pub loss: Option<Rc<dyn LossListener>>,
    /// Heartbeat ticks and expiry checks of every lock of the Locker.
    pub scheduler: Rc<Scheduler>,
    /// The heartbeat extensions due in this turn of the engine.
    pub renewals: Renewals,
}

pub(crate) struct LockInner {
    id: u64,
    env: Rc<Env>,
    key: String,
    token: String,
    fence: Option<u64>,
    /// When the request for the first lease left.
    acquired_at: f64,
    /// The hold deadline (`maxHold`), with auto-extension.
    deadline: Option<f64>,
    heartbeat: Option<Heartbeat>,
    /// The latest lease length asked for.
    ttl: Cell<u32>,
    lease_end: Cell<f64>,
    /// The current lease was shortened to fit the deadline.
    clamped: Cell<bool>,
    state: Cell<LockState>,
    lost_reason: Cell<Option<LostReason>>,
    lost_cause: RefCell<Option<Error>>,
    ended_at: Cell<Option<f64>>,
    /// `lost` or `released` was reported; a lock reports its ending once.
    ending_reported: Cell<bool>,
    releasing: Cell<bool>,
    extending: Cell<u32>,
    /// The earliest lease end any extension of the current overlapping group (requests in
    /// flight at the same time, transitively) would give.
    group_min: Cell<f64>,
    last_extend_error: RefCell<Option<Error>>,
    heartbeat_stopped: Cell<bool>,
    /// Somebody listens for the loss: expiry is checked on a timer, not only when read.
    watched: Cell<bool>,
    /// When the one live expiry check of this lock is due (infinite: none is).
    expiry_at: Cell<f64>,
}

impl LockInner {
    /// The lock of a grant whose request left at `sent_at`: held, its lease checked on a timer
    /// when somebody listens, its heartbeat scheduled, and its session watched.
    pub(crate) fn granted(
        env: &Rc<Env>,
        key: String,
        token: String,
        fence: Option<u64>,
        sent_at: f64,
        options: &AcquireOptions,
    ) -> Rc<LockInner> {
        let ttl = options.first_ttl();
        let heartbeat = options.auto_extend.map(|ax| {
            let interval = ax.interval.unwrap_or(options.ttl as f64 / 3.0);
            Heartbeat {
                interval,
                max_lag: ax.max_event_loop_lag.unwrap_or(interval),
            }
        });
        let id = NEXT_LOCK_ID.with(|n| n.replace(n.get() + 1));
        let watched = env.events.is_some() || heartbeat.is_some();
        let inner = Rc::new(LockInner {
            id,
            env: env.clone(),
            key,
            token,
            fence,
            acquired_at: sent_at,
            deadline: options.auto_extend.map(|ax| sent_at + ax.max_hold),
            heartbeat,
            ttl: Cell::new(options.ttl),
            lease_end: Cell::new(lease_end(sent_at, ttl)),
            clamped: Cell::new(ttl < options.ttl),
            state: Cell::new(LockState::Held),
            lost_reason: Cell::new(None),
            lost_cause: RefCell::new(None),
            ended_at: Cell::new(None),
            ending_reported: Cell::new(false),
            releasing: Cell::new(false),
            extending: Cell::new(0),
            group_min: Cell::new(f64::INFINITY),
            last_extend_error: RefCell::new(None),
            heartbeat_stopped: Cell::new(false),
            watched: Cell::new(watched),
            expiry_at: Cell::new(f64::INFINITY),
        });
        if watched {
            inner.check_expiry_by(inner.lease_end.get());
        }
        if let Some(hb) = heartbeat {
            inner.schedule_tick(sent_at + hb.interval, hb);
        }
        if let Some(gone) = env.backend.watch_lost(&inner.key, &inner.token) {
            // Weak: a lock nobody holds any more needs no news of its session.
            let lock = Rc::downgrade(&inner);
            env.rt.spawner.spawn(Box::pin(async move {
                if gone.await.is_ok() {
                    if let Some(lock) = lock.upgrade() {
                        lock.lose(LostReason::Session, None, lock.now());
                    }
                }
            }));
        }
        inner
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }
    pub(crate) fn env(&self) -> &Rc<Env> {
        &self.env
    }
    pub(crate) fn key(&self) -> &str {
        &self.key
    }
    pub(crate) fn token(&self) -> &str {
        &self.token
    }
    pub(crate) fn fence(&self) -> Option<u64> {
        self.fence
    }
    pub(crate) fn ttl(&self) -> u32 {
        self.ttl.get()
    }
    pub(crate) fn lease_end(&self) -> f64 {
        self.lease_end.get()
    }
    /// The state as last judged (read [`Self::refresh`] first to judge it now).
    pub(crate) fn state(&self) -> LockState {
        self.state.get()
    }
    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.lost_reason.get()
    }
    pub(crate) fn lost_cause(&self) -> Option<Error> {
        self.lost_cause.borrow().clone()
    }

    /// Checks the lease on a timer from now on, so a loss is reported when it happens.
    pub(super) fn watch(self: &Rc<Self>) {
        if !self.watched.replace(true) && self.state.get() == LockState::Held {
            self.check_expiry_by(self.lease_end.get());
        }
    }

    /// Stops the heartbeat for good.
    pub(super) fn stop_heartbeat(&self) {
        self.heartbeat_stopped.set(true);
    }

    /// Marks a release as begun: `Some(held)` with whether the lock was held then, `None` when
    /// it is released or a release is already out.
    pub(super) fn begin_release(&self) -> Option<bool> {
        if self.state.get() == LockState::Released || self.releasing.get() {
            return None;
        }
        self.releasing.set(true);
        // No clock read before sending: a lease that already ran out is found by the read after.
        Some(self.state.get() == LockState::Held)
    }

    /// Applies a release's answer to the lock.
    pub(super) fn released(&self, answer: Result<bool>, final_attempt: bool) -> Result<bool> {
        self.releasing.set(false);
        match answer {
            Ok(deleted) => {
                let now = self.now();
                self.refresh_at(now);
                if self.state.get() == LockState::Held {
                    if deleted {
                        self.ended_at.set(Some(now));
                        self.report_end(|held_ms, key, ttl| Event::Released { key, ttl, held_ms });
                    } else {
                        self.lose(LostReason::Release, None, now);
                    }
                }
                if self.ended_at.get().is_none() {
                    self.ended_at.set(Some(now));
                }
                self.state.set(LockState::Released);
                self.heartbeat_stopped.set(true);
                Ok(deleted)
            }
            Err(e) => {
                if final_attempt {
                    self.heartbeat_stopped.set(true);
                }
                self.emit(|held_ms, key, ttl| Event::ReleaseFailed {
                    key,
                    ttl,
                    held_ms,
                    error: &e,
                });
                Err(e)
            }
        }
    }

    /// Takes `ttl` as the lease length of the next extensions, once the lock is found held.
    pub(super) fn begin_manual_extend(&self, ttl: u32) -> Result<()> {
        if self.state.get() == LockState::Released || self.releasing.get() {
            return Err(Error::State(format!(
                "lock {:?} is released or being released; it cannot be extended",
                self.key
            )));
        }
        // Checked before the lease is judged by it: a NaN reading would pass for "expired".
        let now = checked_now(&*self.env.rt.clock)?;
        self.refresh_at(now);
        if self.state.get() == LockState::Lost {
            return Err(self.lost_error());
        }
        self.ttl.set(ttl);
        Ok(())
    }

    /// Applies what a look at the backend found: a key no longer ours while held is a loss.
    pub(super) fn observed(&self, held: bool) {
        self.refresh();
        if !held && self.state.get() == LockState::Held {
            self.lose(LostReason::Observed, None, self.now());
        }
    }

    /// Whether a heartbeat renewal sent at `now` should include this lock: held, not being
    /// released, heartbeat going.
    pub(super) fn renews_at(&self, now: f64) -> bool {
        self.refresh_at(now);
        self.state.get() == LockState::Held
            && !self.releasing.get()
            && !self.heartbeat_stopped.get()
    }

    pub(crate) fn now(&self) -> f64 {
        self.env.rt.clock.now()
    }

    fn schedule(self: &Rc<Self>, at: f64, due: Due) {
        self.env.scheduler.push(&self.env.rt, at, due, self);
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
        self.env.scheduler.push_tick(&self.env.rt, at, early, self);
    }

    /// Resolves when the clock passes the current lease end (re-reading it, since an extension
    /// can move it).
    pub(super) async fn lease_over(&self) {
        loop {
            let end = self.lease_end.get();
            sleep_until(&*self.env.rt.clock, &*self.env.rt.timer, end).await;
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
                .env
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
        if let Some(l) = &self.env.loss {
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

    pub(crate) fn held_ms(&self) -> f64 {
        let end = self.ended_at.get().unwrap_or_else(|| self.now());
        (end - self.acquired_at).max(0.0)
    }

    pub(crate) fn emit<'a>(&'a self, make: impl FnOnce(f64, &'a str, u32) -> Event<'a>) {
        if let Some(sink) = &self.env.events {
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
    lock.env.renewals.add(lock.clone());
}

/// Sends one extension of `lock.ttl` (clamped to the deadline) and applies its answer.
pub(super) async fn extend_once(inner: &Rc<LockInner>, from_heartbeat: bool) -> Result<()> {
    // A non-finite reading would turn into a made-up ttl below: refuse it before sending.
    let sent_at = checked_now(&*inner.env.rt.clock)?;
    let ttl = begin_extend(inner, sent_at)?;
    let op = inner.env.backend.extend(&inner.key, &inner.token, ttl);
    let answer = match first(op, inner.lease_over()).await {
        First::Left(r) => Some(r),
        First::Right(()) => None,
    };
    finish_extend(inner, ttl, sent_at, inner.now(), answer, from_heartbeat)
}

/// The part of an extension before its request leaves at `sent_at`: the ttl to ask for
/// (clamped to the hold deadline), with the lease judged as if the request were applied now.
pub(super) fn begin_extend(inner: &Rc<LockInner>, sent_at: f64) -> Result<u32> {
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
pub(super) fn finish_extend(
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
