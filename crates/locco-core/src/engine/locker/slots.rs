//! Locks with more than one holder, built from plain leases: a counting semaphore's permits
//! are `limit` slot keys, and a read-write lock is one write key beside `max_readers` read
//! slots. Every holder's lease is a lock of its own, so what a lock does (extension, loss,
//! fencing, release) holds for a permit, a reader and a writer alike, on every backend.
//!
//! Read-write exclusion needs nothing from the backend but acquire and release: a reader takes
//! a read slot and then looks whether the write key is free; a writer takes the write key and
//! then looks whether every read slot is free. Each takes its own key before it looks at the
//! other's, so of a reader and a writer that overlap, at least one sees the other (the
//! backend orders their requests). The reader steps back; the writer waits, holding the write
//! key, for the readers to leave, and no new reader gets in meanwhile: writers are preferred.
//! A "look" is a short acquire that is given back at once, because that is the one question
//! every backend (an adapter written in JavaScript too) can answer.

use crate::contract::value::labelled;
use crate::contract::Waiter;
use crate::engine::events::Event;
use crate::engine::lock::{Lock, LockState};
use crate::engine::locker::acquire::{
    is_transient, may_have_granted, naming, Attempt, Bounded, MIN_WAIT_MS,
};
use crate::engine::locker::grant::{GrantAnswer, GrantOp};
use crate::engine::locker::{Locker, QUEUE_LEASE_MS};
use crate::engine::options::{validate_key, AcquireOptions};
use crate::engine::retry::{Delay, DelayInput};
use crate::rt::clock::lease_end;
use crate::rt::error::{Error, HeldReason, Result, Wanted};
use crate::rt::ids::random_token;
use crate::rt::runtime::{aborted, Abort};
use crate::rt::task::{first, First};
use crate::rt::timer::{sleep_until, sleep_until_from};

/// The largest `limit` / `maxReaders`: a writer looks at every read slot, and a full
/// semaphore is tried slot by slot.
pub const MAX_HOLDERS: u32 = 1024;
/// The lease of a look at a key: it is given back as soon as the answer comes, so this only
/// bounds how long a look of a process that died in between keeps the key.
const LOOK_TTL_MS: u32 = 2000;
/// The holder label of a look, so that `inspect` can tell a look from a holder: a reader's
/// look at the write key (or a writer's at a read slot) holds it for an instant.
pub const LOOK_HOLDER: &str = "locco:look";
/// How many read slots a writer looks at together: a few requests in flight at once, not one
/// per slot, since a look may need a connection of its own (PostgreSQL's advisory mode).
const LOOKS_AT_ONCE: usize = 4;
/// The longest pause between a waiting writer's looks at the read slots, and between the
/// first waiter's tries for a permit.
const HOLDER_RECHECK_MS: f64 = 100.0;

/// Which kind of slot of a key an acquisition wants: a permit, a read or the write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// One of `limit` permits of a counting semaphore.
    Permit { limit: u32 },
    /// A reader of a read-write lock that lets up to `max_readers` read at once.
    Read { max_readers: u32 },
    /// The writer of a read-write lock (alone: no reader, no other writer).
    Write { max_readers: u32 },
}

impl Slot {
    /// Checks a count from the host: a whole number from 1 to [`MAX_HOLDERS`].
    pub fn count(field: &str, value: f64) -> Result<u32> {
        if value.is_finite() && value.fract() == 0.0 && (1.0..=MAX_HOLDERS as f64).contains(&value)
        {
            Ok(value as u32)
        } else {
            Err(Error::validation(
                field,
                format!("must be a whole number from 1 to {MAX_HOLDERS}, got {value}"),
            ))
        }
    }
}

impl Slot {
    /// What an acquisition of this slot wants, as its error names it.
    fn wanted(self) -> Wanted {
        match self {
            Slot::Permit { limit } => Wanted::Permit { limit },
            Slot::Read { max_readers } => Wanted::Read { max_readers },
            Slot::Write { .. } => Wanted::Write,
        }
    }
}

/// The key of permit `i` of the semaphore `key`.
pub fn permit_key(key: &str, i: u32) -> String {
    format!("{key}:permit:{i}")
}
/// The key of read slot `i` of the read-write lock `key`.
pub fn read_key(key: &str, i: u32) -> String {
    format!("{key}:read:{i}")
}
/// The key whose holder is the first of the waiters for a permit of the semaphore `key`.
pub fn turn_key(key: &str) -> String {
    format!("{key}:turn")
}
/// The write key of the read-write lock `key`.
pub fn write_key(key: &str) -> String {
    format!("{key}:write")
}

/// What a look at a key found.
#[derive(Debug, PartialEq, Eq)]
enum Look {
    Free,
    Taken,
}

/// What the holder of a gate key waits for.
#[derive(Clone, Copy)]
enum Goal<'a> {
    /// No read slot held: a writer, holding the write key.
    NoReaders(&'a [String]),
    /// A free permit: the first of the waiters, holding their turn.
    Permit(&'a [String]),
}

enum Reached {
    NoReaders,
    Permit(Lock),
}

/// A gate key held while its holder waits (the write key, the waiters' turn). Every way out
/// gives it back (a failure, an abort, the caller dropping the acquisition), unless
/// [`Gate::keep`] hands the lock over: left behind, it would shut every reader and writer
/// (or every later waiter) out for its whole lease.
struct Gate {
    locker: Locker,
    /// The gate key, and what it is taken (and taken again) with.
    key: String,
    options: AcquireOptions,
    /// The key a failure to take it names: the caller's, for a key the caller never asked for.
    named: String,
    lock: Option<Lock>,
}

impl Gate {
    fn new(locker: &Locker, lock: Lock, options: &AcquireOptions, named: &str) -> Self {
        Gate {
            locker: locker.clone(),
            key: lock.key().to_owned(),
            options: options.clone(),
            named: named.to_owned(),
            lock: Some(lock),
        }
    }

    /// Takes `key`, in its fair queue where the backend keeps one, within what is left of the
    /// budget of the acquisition that started at `start`.
    async fn take(
        locker: &Locker,
        key: String,
        options: &AcquireOptions,
        named: &str,
        abort: Option<&Abort>,
        start: f64,
    ) -> Result<Self> {
        let mut gate = Gate {
            locker: locker.clone(),
            key,
            options: options.clone(),
            named: named.to_owned(),
            lock: None,
        };
        gate.retake(abort, start).await?;
        Ok(gate)
    }

    fn lock(&self) -> &Lock {
        self.lock
            .as_ref()
            .expect("a gate holds its lock until it is kept or given back")
    }

    /// Whether its lease still runs.
    fn held(&self) -> bool {
        self.lock
            .as_ref()
            .is_some_and(|l| l.state() == LockState::Held)
    }

    /// Renews the lease when less than half of it is left. A lease lost meanwhile, or a
    /// renewal that failed on the way, leaves the key to be taken again at the next try.
    async fn renew(&self) -> Result<()> {
        let Some(lock) = self.lock.as_ref().filter(|_| self.held()) else {
            return Ok(());
        };
        let ttl = self.options.ttl;
        if lock.lease_end() - self.locker.now()? >= ttl as f64 / 2.0 {
            return Ok(());
        }
        match lock.extend(ttl).await {
            Err(e) if !e.is_lost() && !is_transient(&e) => Err(e),
            _ => Ok(()),
        }
    }

    /// Takes the key again after its lease was lost: back in the queue, within the budget.
    async fn retake(&mut self, abort: Option<&Abort>, start: f64) -> Result<()> {
        if let Some(lost) = self.lock.take() {
            // Its lease may still run on the backend, whose clock is not ours.
            self.locker.core.env.rt.spawner.spawn(Box::pin(async move {
                let _ = lost.release(true).await;
            }));
        }
        let locker = &self.locker;
        let mut options = self.options.clone();
        if let Some(t) = options.retry.timeout {
            options.retry.timeout = Some((start + t - locker.now()?).max(0.0));
        }
        let lock = locker
            .acquire_key(self.key.clone(), &options, abort)
            .await
            .map_err(|e| match e {
                Error::Held {
                    attempts,
                    elapsed_ms,
                    reason,
                    ..
                } => Error::Held {
                    key: self.named.clone(),
                    attempts,
                    elapsed_ms,
                    reason,
                    wanted: Wanted::Key,
                    holder: None,
                },
                other => other,
            })?;
        self.lock = Some(lock);
        Ok(())
    }

    /// The lock, for the caller to hold: no longer given back.
    fn keep(mut self) -> Lock {
        self.lock.take().expect("kept once")
    }

    /// Gives the key back and waits for the answer (bounded by the lease), so that the key is
    /// free (or its lease over) when the caller hears the outcome.
    async fn give_back(mut self) {
        if let Some(lock) = self.lock.take() {
            let _ = lock.release(true).await;
        }
    }
}

impl Drop for Gate {
    /// A way out that did not give the key back (an early return, a dropped future): the
    /// release goes out as a task of its own, since nothing can be awaited here.
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            self.locker.core.env.rt.spawner.spawn(Box::pin(async move {
                let _ = lock.release(true).await;
            }));
        }
    }
}

/// The retry budget of one acquisition that makes several kinds of tries: counts attempts,
/// emits `contended`, and waits before the next try; the error when the budget is spent.
struct Turns<'a> {
    locker: &'a Locker,
    key: &'a str,
    options: &'a AcquireOptions,
    abort: Option<&'a Abort>,
    start: f64,
    budget_end: Option<f64>,
    attempt: u32,
    previous_delay: f64,
    /// The longest pause, when shorter than the policy's delay.
    max_pause: f64,
    /// Wakes the wait early when the key that stood in the way is released.
    wakeups: Option<Box<dyn Waiter>>,
}

impl<'a> Turns<'a> {
    fn new(
        locker: &'a Locker,
        key: &'a str,
        options: &'a AcquireOptions,
        abort: Option<&'a Abort>,
        start: f64,
    ) -> Self {
        Turns {
            locker,
            key,
            options,
            abort,
            start,
            budget_end: options.retry.timeout.map(|t| start + t),
            attempt: 0,
            previous_delay: 0.0,
            max_pause: f64::INFINITY,
            wakeups: None,
        }
    }

    /// Starts the next try; an abort ends the acquisition.
    fn next(&mut self) -> Result<()> {
        if self.abort.is_some_and(Abort::is_aborted) {
            return Err(Error::Aborted);
        }
        self.attempt += 1;
        Ok(())
    }

    /// After a try that found no room: `contended`, then the wait before the next try, or
    /// [`Error::Held`] once the retries or the time are spent.
    async fn missed(&mut self) -> Result<()> {
        let locker = self.locker;
        let now = locker.now()?;
        let elapsed_ms = now - self.start;
        locker.emit(|| Event::Contended {
            key: self.key,
            ttl: self.options.ttl,
            attempt: self.attempt,
            elapsed_ms,
            reason: HeldReason::Held,
        });
        let policy = &self.options.retry;
        if policy.retries.is_some_and(|r| self.attempt > r) || self.out_of_time(now) {
            return Err(self.held(now));
        }
        let input = DelayInput {
            attempt: self.attempt,
            elapsed_ms,
            previous_delay: self.previous_delay,
        };
        let mut read_at = now;
        let delay = match &policy.delay {
            Delay::Custom(_) => match locker
                .bounded(policy.delay.next(input), self.budget_end, self.abort)
                .await
            {
                Bounded::Done(d) => {
                    read_at = locker.now()?;
                    d?
                }
                Bounded::Aborted => return Err(Error::Aborted),
                Bounded::OutOfTime => return Err(self.held(locker.now()?)),
            },
            computed => computed.next(input).await?,
        };
        self.previous_delay = delay;
        let wait = delay.min(self.max_pause).max(MIN_WAIT_MS);
        let wake_at = self.budget_end.map_or(now + wait, |e| e.min(now + wait));
        let rt = &locker.core.env.rt;
        let sleep = sleep_until_from(&*rt.clock, &*rt.timer, wake_at, read_at);
        let woken = async {
            match self.wakeups.as_mut() {
                Some(w) => w.released().await,
                None => std::future::pending().await,
            }
        };
        if let First::Right(_) = first(first(sleep, woken), aborted(self.abort)).await {
            return Err(Error::Aborted);
        }
        let now = locker.now()?;
        if self.out_of_time(now) {
            return Err(self.held(now));
        }
        Ok(())
    }

    fn out_of_time(&self, now: f64) -> bool {
        self.budget_end.is_some_and(|end| now >= end)
    }

    fn held(&self, now: f64) -> Error {
        Error::Held {
            key: self.key.to_owned(),
            attempts: self.attempt,
            elapsed_ms: now - self.start,
            reason: HeldReason::Held,
            wanted: Wanted::Key,
            holder: None,
        }
    }
}

impl Locker {
    /// Acquires a permit, a read or the write of `key`: a lock on one of its slot keys.
    /// `once`: one try, `None` when there is no room; else retries within `options.retry`,
    /// and [`Error::Held`] when the budget is spent.
    pub async fn acquire_holder(
        &self,
        key: &str,
        slot: Slot,
        options: AcquireOptions,
        abort: Option<Abort>,
        once: bool,
    ) -> Result<Option<Lock>> {
        options.validate()?;
        let key = self.full_key(key)?;
        if self.is_closed() {
            return Err(Self::closed_error());
        }
        let stop = self.stop(abort.as_ref());
        let outcome = self.take_holder(&key, slot, &options, &stop, once).await;
        match self.stopped(abort.as_ref(), outcome) {
            // Taken before the Locker closed, but still giving its turn back when it did: no
            // lock of a closed Locker reaches its caller (close could not release it).
            Ok(Some(lock)) if self.is_closed() => {
                let _ = lock.release(true).await;
                Err(Self::closed_error())
            }
            // Whichever key stood in the way (a slot, the turn, the write key), the caller
            // wanted the semaphore or the read-write lock: the error names that.
            Err(Error::Held {
                attempts,
                elapsed_ms,
                reason,
                ..
            }) => Err(Error::Held {
                key,
                attempts,
                elapsed_ms,
                reason,
                wanted: slot.wanted(),
                holder: None,
            }),
            outcome => outcome,
        }
    }

    /// [`Self::acquire_holder`] of a key already prefixed, stopped by `stop`.
    async fn take_holder(
        &self,
        key: &str,
        slot: Slot,
        options: &AcquireOptions,
        stop: &Abort,
        once: bool,
    ) -> Result<Option<Lock>> {
        let (abort, options) = (Some(stop), options);
        let slots = |n: u32, name: fn(&str, u32) -> String| -> Result<Vec<String>> {
            let slots: Vec<String> = (0..n).map(|i| name(key, i)).collect();
            validate_key(&slots[slots.len() - 1])?;
            Ok(slots)
        };
        match slot {
            Slot::Permit { limit } => {
                let slots = slots(limit, permit_key)?;
                self.take_a_permit(key, &slots, options, abort, once).await
            }
            Slot::Read { max_readers } => {
                let slots = slots(max_readers, read_key)?;
                let gate = write_key(key);
                let start = self.now()?;
                self.take_a_slot(key, &slots, Some(&gate), options, abort, once, start)
                    .await
            }
            Slot::Write { max_readers } => {
                let slots = slots(max_readers, read_key)?;
                self.take_the_write(key, &slots, options, abort, once).await
            }
        }
    }

    /// Takes one free slot of `slots` (tried from a random one on, so that holders spread),
    /// and when `gate` is named, keeps it only if `gate` is free after it was taken.
    #[allow(clippy::too_many_arguments)]
    async fn take_a_slot(
        &self,
        key: &str,
        slots: &[String],
        gate: Option<&str>,
        options: &AcquireOptions,
        abort: Option<&Abort>,
        once: bool,
        start: f64,
    ) -> Result<Option<Lock>> {
        let mut turns = Turns::new(self, key, options, abort, start);
        if let Some(gate) = gate {
            turns.wakeups = self.core.env.backend.waiter(gate);
        }
        let ttl = options.first_ttl();
        let n = slots.len();
        loop {
            turns.next()?;
            let offset = rand::random_range(0..n);
            let mut unanswered = 0;
            for i in 0..n {
                let slot = &slots[(offset + i) % n];
                let sent_at = self.now()?;
                let token = labelled(self.token()?, options.holder.as_deref());
                let attempt = self
                    .attempt(slot, &token, ttl, sent_at, turns.budget_end, abort, None)
                    .await?;
                let fence = match attempt {
                    Attempt::Won { fence, .. } => fence,
                    Attempt::Missed(..) => continue,
                    Attempt::NoAnswer => {
                        unanswered += 1;
                        continue;
                    }
                };
                if let Some(gate) = gate {
                    let look = self.look(gate, abort).await;
                    if !matches!(look, Ok(Look::Free)) {
                        self.give_back_now(slot, &token);
                        look?;
                        break; // a writer holds or waits for the key: no slot is ours
                    }
                    if self.now()? >= lease_end(sent_at, ttl) {
                        self.give_back_now(slot, &token);
                        continue;
                    }
                }
                let lock = self.won(
                    slot.clone(),
                    token,
                    fence,
                    sent_at,
                    options,
                    start,
                    turns.attempt,
                    None,
                )?;
                return Ok(Some(lock));
            }
            if unanswered == n {
                let elapsed_ms = self.now()? - start;
                return Err(self.no_answer(key, turns.attempt, elapsed_ms));
            }
            if once {
                return Ok(None);
            }
            turns.missed().await?;
        }
    }

    /// A permit, first come, first served: a free one is taken at once only while nobody
    /// waits (the waiters' turn key is free). Otherwise the caller queues for the turn (in the
    /// backend's fair queue, where it keeps one) and, holding it, waits for a permit; then it
    /// hands the turn on.
    async fn take_a_permit(
        &self,
        key: &str,
        slots: &[String],
        options: &AcquireOptions,
        abort: Option<&Abort>,
        once: bool,
    ) -> Result<Option<Lock>> {
        let start = self.now()?;
        let turn = turn_key(key);
        validate_key(&turn)?;
        if self.look(&turn, abort).await? == Look::Free {
            let permit = self
                .take_a_slot(key, slots, None, options, abort, true, start)
                .await?;
            if permit.is_some() || once {
                return Ok(permit);
            }
        } else if once {
            return Ok(None);
        }
        // A short lease: a waiter that dies holds up the others only briefly.
        let mut turn_options = options.clone();
        turn_options.auto_extend = None;
        turn_options.ttl = options.ttl.min(QUEUE_LEASE_MS);
        let mut turn = Gate::take(self, turn, &turn_options, key, abort, start).await?;
        let outcome = self
            .wait_holding(
                key,
                &mut turn,
                Goal::Permit(slots),
                options,
                abort,
                false,
                start,
            )
            .await;
        // The next waiter's turn comes at once.
        turn.give_back().await;
        match outcome? {
            Some(Reached::Permit(lock)) => Ok(Some(lock)),
            _ => Ok(None),
        }
    }

    /// Takes the write key (in its fair queue, where the backend keeps one), then waits for
    /// the read slots to empty while holding it, so that no reader gets in meanwhile.
    async fn take_the_write(
        &self,
        key: &str,
        slots: &[String],
        options: &AcquireOptions,
        abort: Option<&Abort>,
        once: bool,
    ) -> Result<Option<Lock>> {
        let start = self.now()?;
        let write = write_key(key);
        validate_key(&write)?;
        let mut gate = if once {
            let stop = abort.expect("an acquisition of a holder always has its stop");
            match self.try_acquire_key(write, options, stop).await? {
                Some(lock) => Gate::new(self, lock, options, key),
                None => return Ok(None),
            }
        } else {
            Gate::take(self, write, options, key, abort, start).await?
        };
        loop {
            let outcome = async {
                let waited_from = self.now()?;
                let reached = self
                    .wait_holding(
                        key,
                        &mut gate,
                        Goal::NoReaders(slots),
                        options,
                        abort,
                        once,
                        start,
                    )
                    .await?;
                // A writer that had to wait gets its whole ttl from the moment it is alone.
                if reached.is_some() && self.now()? > waited_from + HOLDER_RECHECK_MS {
                    gate.lock().extend(options.ttl).await?;
                }
                Ok::<_, Error>(reached.is_some())
            }
            .await;
            match outcome {
                Ok(true) => return Ok(Some(gate.keep())),
                // Lost just as the readers left: in the queue again, and a new look.
                Err(e) if e.is_lost() && !once => continue,
                outcome => {
                    // A single try whose write key's lease ran out while it looked: the key was
                    // granted too late to be used, as a plain try's late grant.
                    let late = once
                        && (matches!(&outcome, Err(e) if e.is_lost())
                            || matches!(outcome, Ok(false)) && !gate.held());
                    gate.give_back().await;
                    if late {
                        return Err(Error::Held {
                            key: key.to_owned(),
                            attempts: 1,
                            elapsed_ms: self.now()? - start,
                            reason: HeldReason::LateAcquire,
                            wanted: Wanted::Key,
                            holder: None,
                        });
                    }
                    return outcome.map(|_| None);
                }
            }
        }
    }

    /// Waits, within the acquisition's budget, for `goal` while holding `gate` (the write key,
    /// or the waiters' turn): renewed before each pause, and taken again when its lease was
    /// lost anyway. `None` when `once` and the goal is not reached at the first look.
    #[allow(clippy::too_many_arguments)]
    async fn wait_holding(
        &self,
        key: &str,
        gate: &mut Gate,
        goal: Goal<'_>,
        options: &AcquireOptions,
        abort: Option<&Abort>,
        once: bool,
        start: f64,
    ) -> Result<Option<Reached>> {
        let mut turns = Turns::new(self, key, options, abort, start);
        // A pause is at most a third of the gate's lease, so that a renewal before it (at half
        // the lease) keeps the lease running through it.
        turns.max_pause = HOLDER_RECHECK_MS.min(gate.options.ttl as f64 / 3.0);
        // Where the last look found a reader: most likely still there, so looked at first.
        let mut from = 0;
        loop {
            turns.next()?;
            if !gate.held() {
                if once {
                    return Ok(None);
                }
                gate.retake(abort, start).await?;
            }
            let reached = match goal {
                // Readers gone counts only while the write key still kept new ones out.
                Goal::NoReaders(slots) => (self.no_readers(slots, &mut from, abort).await?
                    && gate.held())
                .then_some(Reached::NoReaders),
                Goal::Permit(slots) => self
                    .take_a_slot(key, slots, None, options, abort, true, start)
                    .await?
                    .map(Reached::Permit),
            };
            if reached.is_some() || once {
                return Ok(reached);
            }
            gate.renew().await?;
            turns.missed().await?;
        }
    }

    /// Whether every read slot is free, looking from slot `from` on, a few at a time; `from`
    /// becomes the first slot found held.
    async fn no_readers(
        &self,
        slots: &[String],
        from: &mut usize,
        abort: Option<&Abort>,
    ) -> Result<bool> {
        let order: Vec<usize> = (0..slots.len())
            .map(|i| (*from + i) % slots.len())
            .collect();
        for chunk in order.chunks(LOOKS_AT_ONCE) {
            let looks = chunk.iter().map(|&i| self.look(&slots[i], abort));
            let looks = futures_util::future::join_all(looks).await;
            let mut taken = None;
            for (&i, look) in chunk.iter().zip(looks) {
                if look? == Look::Taken {
                    taken = taken.or(Some(i));
                }
            }
            if let Some(i) = taken {
                *from = i;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether `key` is free now: a plain acquire under a token of its own (never fenced: a
    /// look must not move the key's fence), given back at once when it took the key.
    async fn look(&self, key: &str, abort: Option<&Abort>) -> Result<Look> {
        let token = labelled(random_token(), Some(LOOK_HOLDER));
        let mut op = GrantOp::Plain(self.core.env.backend.acquire(key, &token, LOOK_TTL_MS));
        let rt = &self.core.env.rt;
        let limit = self.now()? + LOOK_TTL_MS as f64;
        let deadline = sleep_until(&*rt.clock, &*rt.timer, limit);
        match first(&mut op, first(deadline, aborted(abort))).await {
            First::Left(Ok(GrantAnswer::Granted(_))) => {
                self.give_back_now(key, &token);
                Ok(Look::Free)
            }
            First::Left(Ok(GrantAnswer::Held(_))) => Ok(Look::Taken),
            First::Left(Err(e)) => {
                if may_have_granted(&e) {
                    self.give_back_now(key, &token);
                }
                Err(naming(e, key))
            }
            First::Right(why) => {
                op.abandon();
                self.give_back_later(op, key, token);
                match why {
                    First::Left(()) => Err(self.no_answer(key, 1, LOOK_TTL_MS as f64)),
                    First::Right(()) => Err(Error::Aborted),
                }
            }
        }
    }
}
