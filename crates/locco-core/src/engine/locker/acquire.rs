//! Taking keys: the first try within the call, then the retry loop with the lease clock,
//! the fair queue and give-backs of grants nobody will use; `try_acquire` and `acquire_many`.

use futures_util::future::Either;
use futures_util::FutureExt;

use crate::contract::value::labelled;
use crate::contract::Waiter;
use crate::engine::events::Event;
use crate::engine::lock::{Lock, LockInner, LockState};
use crate::engine::locker::grant::{GrantAnswer, GrantOp};
use crate::engine::locker::waiter_id::{next_waiter_id, WaiterId};
use crate::engine::locker::{Locker, QUEUE_LEASE_MS, QUEUE_RECHECK_MS};
use crate::engine::options::AcquireOptions;
use crate::engine::retry::{Delay, DelayInput, OnBackendError};
use crate::rt::clock::lease_end;
use crate::rt::error::{BackendErrorKind, Error, HeldReason, Result, Wanted};
use crate::rt::runtime::{aborted, Abort};
use crate::rt::task::{boxed, first, First};
use crate::rt::timer::{sleep_until, sleep_until_from};

/// The shortest wait between attempts: one timer tick, so retries never spin.
pub(super) const MIN_WAIT_MS: f64 = 1.0;

/// The longest an acquisition that failed on contention waits to learn who holds the key.
const HOLDER_READ_MS: f64 = 250.0;

/// How one attempt ended.
pub(super) enum Attempt {
    /// Granted under the attempt's token, sent at its `sent_at`.
    Won {
        fence: Option<u64>,
        /// The clock reading that judged the grant in time.
        at: f64,
    },
    /// Answered: held by another, or granted too late to use (and given back); with the
    /// latest useful moment to try again (ms), when the backend's queue knows it.
    Missed(HeldReason, Option<f64>),
    /// No answer before the lease (or the budget) ran out.
    NoAnswer,
}

impl Locker {
    /// Acquires `key`, retrying while another holder has it, within `options.retry`.
    /// `abort` stops the retry loop; a grant in flight at that moment is given back.
    pub async fn acquire(
        &self,
        key: impl Into<String>,
        options: AcquireOptions,
        abort: Option<Abort>,
    ) -> Result<Lock> {
        options.validate()?;
        let key = self.prefixed(key.into())?;
        let stop = self.stop(abort.as_ref());
        let outcome = self.acquire_key(key, &options, Some(&stop)).await;
        self.stopped(abort.as_ref(), outcome)
    }

    /// [`Self::acquire`] of a key already prefixed, with options already checked.
    pub(super) async fn acquire_key(
        &self,
        key: String,
        options: &AcquireOptions,
        abort: Option<&Abort>,
    ) -> Result<Lock> {
        match self.begin_key(key, options, abort)? {
            Begun::Acquired(lock) => Ok(lock),
            Begun::Pending(pending) => self.finish_acquire(pending, options, abort).await,
        }
    }

    /// The start of [`Self::acquire`], within the call: the first try, which is the whole
    /// acquisition when the backend answered at once and the key was free (the common call
    /// on the in-memory backend, which then builds no future at all). Anything else goes on
    /// in [`Self::finish_acquire`].
    pub fn begin_acquire(
        &self,
        key: String,
        options: &AcquireOptions,
        abort: Option<&Abort>,
    ) -> Result<Begun> {
        options.validate()?;
        let key = self.prefixed(key)?;
        self.begin_key(key, options, abort)
    }

    /// [`Self::begin_acquire`] of a key already prefixed, with options already checked.
    fn begin_key(
        &self,
        key: String,
        options: &AcquireOptions,
        abort: Option<&Abort>,
    ) -> Result<Begun> {
        let start = self.now()?;
        if abort.is_some_and(Abort::is_aborted) {
            return Err(Error::Aborted);
        }
        if self.is_closed() {
            return Err(Self::closed_error());
        }
        // The token source is asked once, when the acquisition starts (a source may depend on
        // what runs then, as MutexManager's does).
        let first_token = self.token()?;
        let first_len = first_token.len();
        let token = labelled(first_token, options.holder.as_deref());
        let ttl = options.first_ttl();
        // The first try joins a queue kept in this process when it may wait: the join costs
        // no more than a plain try, and a second request at once after it.
        let joins = options.retry.retries != Some(0)
            && (self.core.env.backend.queue()).is_some_and(|q| q.joins_on_first_try());
        let waiter = joins.then(WaiterId::next);
        let waiter_id = waiter.as_ref().map(WaiterId::as_str);
        let first = match self.attempt_now(&key, &token, ttl, start, abort, waiter_id) {
            Ok(Ok(Attempt::Won { fence, at })) => {
                let lock = self.won(key, token, fence, start, options, start, 1, Some(at))?;
                return Ok(Begun::Acquired(lock));
            }
            Ok(answered) => FirstTry::Answered(answered),
            Err(op) => FirstTry::Sent(op),
        };
        Ok(Begun::Pending(Pending {
            key,
            start,
            place: waiter_id.map(str::to_owned),
            turns: Turns {
                token,
                first_len,
                first,
            },
        }))
    }

    /// The rest of an acquisition that [`Self::begin_acquire`] could not finish: the first
    /// try's answer, then the attempts of the retry policy until one wins.
    pub async fn finish_acquire(
        &self,
        pending: Pending,
        options: &AcquireOptions,
        abort: Option<&Abort>,
    ) -> Result<Lock> {
        let stop = self.stop(abort);
        let outcome = self.finish_pending(pending, options, Some(&stop)).await;
        self.stopped(abort, outcome)
    }

    /// [`Self::finish_acquire`], stopped by `abort`.
    async fn finish_pending(
        &self,
        pending: Pending,
        options: &AcquireOptions,
        abort: Option<&Abort>,
    ) -> Result<Lock> {
        let Pending {
            key,
            start,
            mut place,
            turns:
                Turns {
                    token,
                    first_len,
                    first,
                },
        } = pending;
        let first = match first {
            FirstTry::Answered(answered) => answered,
            FirstTry::Sent(op) => {
                let budget_end = options.retry.timeout.map(|t| start + t);
                let (key, token, ttl) = (&key, &token, options.first_ttl());
                boxed(|| self.attempt_later(op, key, token, ttl, start, budget_end, abort)).await
            }
        };
        let turns = match first {
            Ok(Attempt::Won { fence, at }) => Ok(WinningTry {
                token,
                sent_at: start,
                fence,
                attempts: 1,
                at,
            }),
            // Boxed: a first try answered later that wins (the common call on a network
            // backend) never builds the retry loop's state, and this future is much smaller
            // without it.
            first => {
                let turns = Turns {
                    token,
                    first_len,
                    first,
                };
                let (key, place) = (&key, &mut place);
                boxed(|| self.retry_turns(key, options, abort, start, place, turns)).await
            }
        };
        match turns {
            Ok(won) => self.won(
                key,
                won.token,
                won.fence,
                won.sent_at,
                options,
                start,
                won.attempts,
                Some(won.at),
            ),
            Err(mut e) => {
                // Whatever ended the wait, our place must not hold up the queue.
                if let (Some(queue), Some(waiter)) = (self.core.env.backend.queue(), &place) {
                    let op = queue.leave(&key, waiter);
                    self.core.env.rt.spawner.spawn(Box::pin(async move {
                        let _ = op.await;
                    }));
                }
                // Who holds the key: one read, only now that the acquisition failed (never on
                // a retry), and bounded, so that it cannot hold the error back past the retry
                // budget by much. A backend that cannot tell, fails to, or is slow to, leaves
                // it unknown.
                if let Error::Held {
                    reason: HeldReason::Held,
                    holder,
                    ..
                } = &mut e
                {
                    let read = self.core.env.backend.inspect(&key);
                    let until = self.now().ok().map(|now| now + HOLDER_READ_MS);
                    if let (Some(until), true) = (until, holder.is_none()) {
                        let read = Box::pin(self.bounded(read, Some(until), None));
                        if let Bounded::Done(Ok(info)) = read.await {
                            *holder = info.holder;
                        }
                    }
                }
                Err(e)
            }
        }
    }

    /// The attempts of an acquisition whose first try did not win, within the retry policy.
    /// `place` gets our waiter id once we ask for a place in the backend's fair queue, when it
    /// keeps one.
    async fn retry_turns(
        &self,
        key: &str,
        options: &AcquireOptions,
        abort: Option<&Abort>,
        start: f64,
        place: &mut Option<String>,
        turns: Turns<Result<Attempt>>,
    ) -> Result<WinningTry> {
        let policy = &options.retry;
        let budget_end = policy.timeout.map(|t| start + t);
        let ttl = options.first_ttl();
        let mut wakeups: Option<Box<dyn Waiter>> = None;
        let mut previous_delay = 0.0;
        let mut attempt = 0u32;
        let mut next_sent_at = start;
        // What the last attempt that got an answer said; `None` while the backend has not
        // answered any attempt, which makes giving up a timeout rather than contention.
        let mut answered: Option<HeldReason> = None;
        // The failure of the last attempt, when a queued waiter went on after it.
        let mut failed: Option<Error>;
        // An attempt answered "held" left nothing under its token, so the next attempt sends
        // it again; after any other miss (late, no answer) a grant may exist under it, so the
        // next attempt sends a token of its own.
        let Turns {
            mut token,
            first_len,
            first: first_try,
        } = turns;
        let holder = options.holder.as_deref();
        let mut first_try = Some(first_try);
        let mut renewals = 0u32;
        loop {
            attempt += 1;
            let mut retry_in = None;
            let mut outcome = match first_try.take() {
                Some(outcome) => outcome,
                None => {
                    if abort.is_some_and(Abort::is_aborted) {
                        return Err(Error::Aborted);
                    }
                    self.attempt(
                        key,
                        &token,
                        ttl,
                        next_sent_at,
                        budget_end,
                        abort,
                        place.as_deref(),
                    )
                    .await
                }
            };
            // The first attempt is a plain try, as cheap as without a queue (a try never takes
            // a key promised to a waiter). When we may wait, later attempts are queued; when
            // the try found the key taken, we join the queue at once, in the same attempt.
            // A first try that won needs no place, so it makes no waiter id either. (A queue
            // in this process was joined by the first try itself: `place` is set.)
            if attempt == 1
                && place.is_none()
                && self.core.env.backend.queue().is_some()
                && policy.retries != Some(0)
                && !matches!(outcome, Ok(Attempt::Won { .. }))
            {
                *place = Some(next_waiter_id());
                if matches!(outcome, Ok(Attempt::Missed(HeldReason::Held, _))) {
                    // The join's lease is counted from the acquisition's start, before it was
                    // sent: early, which is the safe side, and one clock reading fewer.
                    outcome = self
                        .attempt(
                            key,
                            &token,
                            ttl,
                            next_sent_at,
                            budget_end,
                            abort,
                            place.as_deref(),
                        )
                        .await;
                }
            }
            let joined = place.is_some();
            // A queued waiter rides out a connection that drops or a server that restarts:
            // its place (or the queue) may be gone, but its next attempt asks again, and
            // the budget still bounds the wait. So does any acquisition whose policy says
            // `OnBackendError::Retry`, and an attempt that found the key held on some servers
            // but could not tell for sure (a Redlock split vote with a server down), which a
            // later attempt may win. Anything else ends the acquisition; a failure ridden out
            // is still the error when the budget runs out. (A failed grant was given back.)
            let outcome = match outcome {
                Err(e)
                    if ((joined && answered.is_some())
                        || policy.on_backend_error == OnBackendError::Retry)
                        && is_transient(&e)
                        || held_in_part(&e) =>
                {
                    self.emit(|| Event::BackendRetry {
                        key,
                        ttl: options.ttl,
                        attempt,
                        elapsed_ms: self.now().map_or(f64::NAN, |now| now - start),
                        error: &e,
                    });
                    failed = Some(e);
                    Attempt::NoAnswer
                }
                other => {
                    failed = None;
                    other?
                }
            };
            let missed = match outcome {
                Attempt::Won { fence, at } => {
                    return Ok(WinningTry {
                        token,
                        sent_at: next_sent_at,
                        fence,
                        attempts: attempt,
                        at,
                    })
                }
                Attempt::Missed(reason, hint) => {
                    retry_in = hint;
                    Some(reason)
                }
                Attempt::NoAnswer => None,
            };
            if missed != Some(HeldReason::Held) {
                renewals += 1;
                // Every token of the acquisition starts with the source's first one.
                token = labelled(format!("{}~{renewals}", &token[..first_len]), holder);
            }
            // The clock is read once per step: each read costs more than the arithmetic around it.
            let now = self.now()?;
            let elapsed_ms = now - start;
            // No answer is no news about other holders: not a `contended` event.
            if let Some(reason) = missed {
                answered = Some(reason);
                self.emit(|| Event::Contended {
                    key,
                    ttl: options.ttl,
                    attempt,
                    elapsed_ms,
                    reason,
                });
            }
            let give_up = |now: f64| match answered {
                _ if failed.is_some() => failed.clone().expect("checked"),
                Some(reason) => Error::Held {
                    key: key.to_owned(),
                    attempts: attempt,
                    elapsed_ms: now - start,
                    reason,
                    wanted: Wanted::Key,
                    holder: None,
                },
                None => self.no_answer(key, attempt, now - start),
            };
            let out_of_time = |now: f64| budget_end.is_some_and(|end| now >= end);
            if policy.retries.is_some_and(|r| attempt > r) || out_of_time(now) {
                return Err(give_up(now));
            }
            let input = DelayInput {
                attempt,
                elapsed_ms,
                previous_delay,
            };
            // The last clock reading, for the sleep below: still `now` unless a delay
            // function (which may be async JavaScript) took time.
            let mut read_at = now;
            let delay = match &policy.delay {
                Delay::Custom(_) => {
                    match Box::pin(self.bounded(policy.delay.next(input), budget_end, abort)).await
                    {
                        Bounded::Done(d) => {
                            read_at = self.now()?;
                            d?
                        }
                        Bounded::Aborted => return Err(Error::Aborted),
                        Bounded::OutOfTime => return Err(give_up(self.now()?)),
                    }
                }
                computed => computed.next(input).await?,
            };
            previous_delay = delay;
            // A delay of 0 still yields to the event loop, so a busy key cannot starve it.
            let mut wait = delay.max(MIN_WAIT_MS);
            if joined {
                // In a fair queue a push wakes us; the wait is only the backstop, and renews
                // our place. At the head, the holder's lease end is worth a look too.
                wait = wait.min(QUEUE_RECHECK_MS);
                if let Some(hint) = retry_in {
                    wait = wait.min(hint.max(MIN_WAIT_MS));
                }
            }
            let wake_at = now + wait;
            let wake_at = budget_end.map_or(wake_at, |e| e.min(wake_at));
            let wakeups = wakeups.get_or_insert_with(|| {
                let backend = &self.core.env.backend;
                match (backend.queue(), place.as_deref()) {
                    (Some(queue), Some(id)) => queue.wakeups(key, id),
                    _ => backend
                        .waiter(key)
                        .unwrap_or_else(|| Box::new(NeverReleased)),
                }
            });
            let clock = &*self.core.env.rt.clock;
            let sleep = sleep_until_from(clock, &*self.core.env.rt.timer, wake_at, read_at);
            // Boxed, like the custom delay above: a first try that wins never waits, and the
            // timers would make every acquisition's future (moved on each call) larger.
            // The wake is looked at first: after a push the sleep is then not polled, which
            // would read the clock to see whether it is over.
            let wait = first(wakeups.released(), sleep);
            if let First::Right(_) = boxed(|| first(wait, aborted(abort))).await {
                return Err(Error::Aborted);
            }
            let now = self.now()?;
            if out_of_time(now) {
                return Err(give_up(now));
            }
            next_sent_at = now;
        }
    }

    /// The error when no attempt got an answer in time: the backend is slow or gone, which
    /// says nothing about other holders.
    pub(super) fn no_answer(&self, key: &str, attempts: u32, elapsed_ms: f64) -> Error {
        Error::backend(
            self.core.env.backend.name(),
            BackendErrorKind::Timeout,
            format!(
                "acquire of {key:?} got no answer from the backend: {attempts} attempt(s) in \
                 {elapsed_ms:.0} ms, each waiting until its lease would have ended"
            ),
        )
    }

    /// Turns a winning attempt into the lock. `at`: the clock reading that judged the grant,
    /// when nothing ran since (else the clock is read here). A clock that fails now still
    /// leaves a grant behind, so it is given back.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn won(
        &self,
        key: String,
        token: String,
        fence: Option<u64>,
        sent_at: f64,
        options: &AcquireOptions,
        start: f64,
        attempts: u32,
        at: Option<f64>,
    ) -> Result<Lock> {
        let now = match at.map_or_else(|| self.now(), Ok) {
            Ok(now) => now,
            Err(e) => {
                self.give_back_now(&key, &token);
                return Err(e);
            }
        };
        // Closed while the grant was on its way: nobody may hold a lock of a closed Locker.
        if self.is_closed() {
            self.give_back_now(&key, &token);
            return Err(Self::closed_error());
        }
        let lock = Lock(LockInner::granted(
            &self.core.env,
            key,
            token,
            fence,
            sent_at,
            options,
        ));
        self.emit(|| Event::Acquired {
            key: lock.key(),
            ttl: options.ttl,
            waited_ms: now - start,
            attempts,
        });
        Ok(lock)
    }

    /// One attempt with its own token, bounded by the lease (a later answer is useless) and
    /// the budget. Whatever else happens to a grant, it is given back by that token: the
    /// engine alone decides a grant's fate. `waiter`: our id in the backend's fair queue.
    /// Sent at the call, not at the first poll. Not an `async fn`: its state would be held
    /// inline in the retry loop's (232 bytes, copied into the loop's box on every wait); an
    /// answer ready at once is kept as it is, and a later one is waited for in a box.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attempt<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: u32,
        sent_at: f64,
        budget_end: Option<f64>,
        abort: Option<&'a Abort>,
        waiter: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Attempt>> + 'a {
        match self.attempt_now(key, token, ttl, sent_at, abort, waiter) {
            Ok(answered) => Either::Left(std::future::ready(answered)),
            Err(op) => Either::Right(boxed(|| {
                self.attempt_later(op, key, token, ttl, sent_at, budget_end, abort)
            })),
        }
    }

    /// Sends an attempt and judges it when the backend answered within the call; else the
    /// request, for [`Self::attempt_later`].
    fn attempt_now(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        sent_at: f64,
        abort: Option<&Abort>,
        waiter: Option<&str>,
    ) -> std::result::Result<Result<Attempt>, GrantOp> {
        let mut op = self.grant_op(key, token, ttl, waiter);
        if !op.is_ready() {
            return Err(op);
        }
        let answer = (&mut op).now_or_never().expect("a ready answer");
        let end = lease_end(sent_at, ttl);
        Ok(self.judge(First::Left(answer), op, key, token, end, abort))
    }

    /// Waits for the answer of an attempt sent by [`Self::attempt_now`], within the lease and
    /// the budget, and judges it. Callers box it: their futures are built and moved about on
    /// every acquisition, and the deadline's timer would make them several times larger.
    #[allow(clippy::too_many_arguments)]
    async fn attempt_later(
        &self,
        mut op: GrantOp,
        key: &str,
        token: &str,
        ttl: u32,
        sent_at: f64,
        budget_end: Option<f64>,
        abort: Option<&Abort>,
    ) -> Result<Attempt> {
        let end = lease_end(sent_at, ttl);
        let limit = budget_end.map_or(end, |b| b.min(end));
        // At least one tick from now: a limit that passed while the request was being sent
        // (the call itself outlasted the lease, or the clock jumped) says nothing about whether
        // an answer comes; one already on its way is then judged (late), not taken for none.
        // (Read unchecked: a reading that is not a number is judged with the answer, whose
        // grant is then given back; returning here would drop the request unanswered.)
        let rt = &self.core.env.rt;
        let now = rt.clock.now();
        let limit = limit.max(now + MIN_WAIT_MS);
        // The answer, unless the limit passes (`Right(Left)`) or `abort` fires first.
        let deadline = sleep_until_from(&*rt.clock, &*rt.timer, limit, now);
        let answer = first(&mut op, first(deadline, aborted(abort))).await;
        self.judge(answer, op, key, token, end, abort)
    }

    /// What an attempt's answer (or what ended its wait first) makes of it. `end`: when the
    /// lease it asked for would end.
    fn judge(
        &self,
        answer: First<Result<GrantAnswer>, First<(), ()>>,
        mut op: GrantOp,
        key: &str,
        token: &str,
        end: f64,
        abort: Option<&Abort>,
    ) -> Result<Attempt> {
        let answer = match answer {
            First::Left(Ok(answer)) => answer,
            First::Left(Err(e)) => {
                // The server may have granted before the failure (a fenced grant whose counter
                // write failed, a reply lost on the way back).
                if may_have_granted(&e) {
                    self.give_back_now(key, token);
                }
                return Err(naming(e, key));
            }
            First::Right(why) => {
                op.abandon();
                self.give_back_later(op, key, token.to_owned());
                return match why {
                    First::Left(()) => Ok(Attempt::NoAnswer),
                    First::Right(()) => Err(Error::Aborted),
                };
            }
        };
        let fence = match answer {
            GrantAnswer::Granted(fence) => fence,
            GrantAnswer::Held(retry_in) => return Ok(Attempt::Missed(HeldReason::Held, retry_in)),
        };
        let now = match self.now() {
            Ok(now) => now,
            Err(e) => {
                self.give_back_now(key, token);
                return Err(e);
            }
        };
        if now >= end {
            self.give_back_now(key, token);
            return Ok(Attempt::Missed(HeldReason::Late, None));
        }
        if abort.is_some_and(Abort::is_aborted) {
            self.give_back_now(key, token);
            return Err(Error::Aborted);
        }
        Ok(Attempt::Won { fence, at: now })
    }

    /// The grant request, in the fair queue as `waiter` when there is one.
    fn grant_op(&self, key: &str, token: &str, ttl: u32, waiter: Option<&str>) -> GrantOp {
        let backend = &self.core.env.backend;
        let fencing = self.core.options.fencing;
        if let (Some(queue), Some(waiter)) = (backend.queue(), waiter) {
            let lease = QUEUE_LEASE_MS;
            GrantOp::Queued(queue.acquire_queued(key, token, ttl, waiter, lease, fencing))
        } else if fencing {
            GrantOp::Fenced(backend.acquire_fenced(key, token, ttl))
        } else {
            GrantOp::Plain(backend.acquire(key, token, ttl))
        }
    }

    /// Releases a grant nobody will use, without making anyone wait for it.
    pub(super) fn give_back_now(&self, key: &str, token: &str) {
        let op = self.core.env.backend.release(key, token);
        self.core.env.rt.spawner.spawn(Box::pin(async move {
            let _ = op.await;
        }));
    }

    /// Gives back the grant of an attempt nobody waits for any more. A release goes out at once
    /// (a backend that applies requests in order then frees the key even if the answer never
    /// comes), and again once the answer says granted or failed, for a request applied late.
    /// The token is this attempt's alone, so neither can touch a later attempt's lock.
    pub(super) fn give_back_later(&self, op: GrantOp, key: &str, token: String) {
        let backend = self.core.env.backend.clone();
        let key = key.to_owned();
        let now = backend.release(&key, &token);
        self.core.env.rt.spawner.spawn(Box::pin(async move {
            let _ = now.await;
            match op.await {
                Ok(GrantAnswer::Held(_)) => {}
                Ok(GrantAnswer::Granted(_)) | Err(_) => {
                    let _ = backend.release(&key, &token).await;
                }
            }
        }));
    }

    pub(super) async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = T>,
        budget_end: Option<f64>,
        abort: Option<&Abort>,
    ) -> Bounded<T> {
        let clock = &*self.core.env.rt.clock;
        let out_of_time = async {
            match budget_end {
                Some(end) => sleep_until(clock, &*self.core.env.rt.timer, end).await,
                None => std::future::pending().await,
            }
        };
        match first(fut, first(out_of_time, aborted(abort))).await {
            First::Left(v) => Bounded::Done(v),
            First::Right(First::Left(())) => Bounded::OutOfTime,
            First::Right(First::Right(())) => Bounded::Aborted,
        }
    }

    /// One attempt: the lock, or `None` when another holder has the key. A grant that came
    /// too late is given back and reported as [`HeldReason::LateAcquire`], because then nobody
    /// holds the key and "someone else has it" would be wrong; no answer at all is a backend
    /// timeout.
    pub async fn try_acquire(
        &self,
        key: impl Into<String>,
        options: AcquireOptions,
    ) -> Result<Option<Lock>> {
        options.validate()?;
        let key = self.prefixed(key.into())?;
        let stop = self.stop(None);
        let outcome = self.try_acquire_key(key, &options, &stop).await;
        self.stopped(None, outcome)
    }

    /// [`Self::try_acquire`] of a key already prefixed; `stop` ends a wait for the answer.
    pub(super) async fn try_acquire_key(
        &self,
        key: String,
        options: &AcquireOptions,
        stop: &Abort,
    ) -> Result<Option<Lock>> {
        let start = self.now()?;
        if self.is_closed() {
            return Err(Self::closed_error());
        }
        let token = labelled(self.token()?, options.holder.as_deref());
        let ttl = options.first_ttl();
        match self
            .attempt(&key, &token, ttl, start, None, Some(stop), None)
            .await?
        {
            Attempt::Won { fence, at } => self
                .won(key, token, fence, start, options, start, 1, Some(at))
                .map(Some),
            Attempt::NoAnswer => {
                let elapsed_ms = self.now()? - start;
                Err(self.no_answer(&key, 1, elapsed_ms))
            }
            Attempt::Missed(reason, _) => {
                let elapsed_ms = self.now()? - start;
                self.emit(|| Event::Contended {
                    key: &key,
                    ttl: options.ttl,
                    attempt: 1,
                    elapsed_ms,
                    reason,
                });
                match reason {
                    HeldReason::Held => Ok(None),
                    _ => Err(Error::Held {
                        key,
                        attempts: 1,
                        elapsed_ms,
                        reason: HeldReason::LateAcquire,
                        wanted: Wanted::Key,
                        holder: None,
                    }),
                }
            }
        }
    }

    /// Acquires every key, in sorted order without duplicates so that overlapping sets cannot
    /// deadlock. `retry.timeout` is one budget for the set; `retry.retries` applies per key.
    /// Every lease is refreshed before the set is returned, so the leases overlap. On any
    /// failure, every lock taken is released and the error is returned; an abort that fires
    /// before the set is complete releases them too.
    pub async fn acquire_many(
        &self,
        keys: &[String],
        options: AcquireOptions,
        abort: Option<Abort>,
    ) -> Result<Vec<Lock>> {
        options.validate()?;
        if keys.is_empty() {
            return Err(Error::validation("keys", "must name at least one key"));
        }
        let mut full: Vec<String> = keys
            .iter()
            .map(|k| self.full_key(k))
            .collect::<Result<_>>()?;
        full.sort();
        full.dedup();
        let caller = abort;
        let abort = Some(self.stop(caller.as_ref()));
        let start = self.now()?;
        let mut locks: Vec<Lock> = Vec::with_capacity(full.len());
        let outcome = async {
            for key in full {
                let mut per_key = options.clone();
                if let Some(t) = options.retry.timeout {
                    per_key.retry.timeout = Some((start + t - self.now()?).max(0.0));
                }
                let lock = self.acquire_key(key, &per_key, abort.as_ref()).await?;
                locks.push(lock);
            }
            let last = locks.len() - 1;
            for lock in &locks[..last] {
                lock.extend(lock.ttl()).await?;
            }
            // The refreshes above do not watch the signal: an abort during them still wins.
            if abort.as_ref().is_some_and(Abort::is_aborted) {
                return Err(Error::Aborted);
            }
            Ok(())
        }
        .await;
        match self.stopped(caller.as_ref(), outcome) {
            Ok(()) => Ok(locks),
            Err(e) => {
                for lock in locks {
                    // A held lock's release is bounded by its lease; any other's answer can
                    // take as long as the backend likes, and the error should not wait for it.
                    if lock.state() == LockState::Held {
                        let _ = lock.release(true).await;
                    } else {
                        self.core.env.rt.spawner.spawn(Box::pin(async move {
                            let _ = lock.release(true).await;
                        }));
                    }
                }
                Err(e)
            }
        }
    }
}

/// A backend failure of a grant request, with the operation and the key in its message, so
/// that a log line says what failed. Host errors pass through untouched.
pub(super) fn naming(mut e: Error, key: &str) -> Error {
    if let Error::Backend { message, .. } = &mut e {
        let named = format!("acquire of {key:?}: ");
        // Redlock names the operation itself.
        if !message.starts_with(&named) {
            message.insert_str(0, &named);
        }
    }
    e
}

/// A failure that a later attempt may not meet: the connection or the server, not the
/// request or its rights.
pub(super) fn is_transient(e: &Error) -> bool {
    matches!(
        e,
        Error::Backend {
            kind: BackendErrorKind::Io | BackendErrorKind::Timeout,
            ..
        }
    )
}

/// A grant's failure that found the key held by another on some servers (see `Error::Backend`).
fn held_in_part(e: &Error) -> bool {
    matches!(
        e,
        Error::Backend {
            held_in_part: true,
            ..
        }
    )
}

/// Whether a failed grant request may still have taken the key on the server. Only a
/// validation error is raised before anything is sent.
pub(super) fn may_have_granted(e: &Error) -> bool {
    !matches!(e, Error::Validation { .. })
}
pub(super) enum Bounded<T> {
    Done(T),
    OutOfTime,
    Aborted,
}

/// What [`Locker::retry_turns`] goes on from: the first try's token (its first `first_len`
/// bytes are the token source's, the rest is the holder's label) and outcome.
/// An acquisition's token, and how its first try went (`F`: its answer, or the request
/// still out).
struct Turns<F> {
    token: String,
    first_len: usize,
    first: F,
}

/// What [`Locker::begin_acquire`] did.
pub enum Begun {
    /// The first try won.
    Acquired(Lock),
    /// The acquisition goes on in [`Locker::finish_acquire`].
    Pending(Pending),
}

/// An acquisition that [`Locker::begin_acquire`] could not finish within the call. Hand it to
/// [`Locker::finish_acquire`] at once: its first request may be out, and only that gives back
/// a grant nobody will use.
pub struct Pending {
    key: String,
    start: f64,
    /// Our waiter id, when the first try joined the backend's fair queue.
    place: Option<String>,
    turns: Turns<FirstTry>,
}

/// The first try of an acquisition: answered within the call, or still out.
enum FirstTry {
    Answered(Result<Attempt>),
    Sent(GrantOp),
}

/// A winning attempt of an acquisition.
struct WinningTry {
    token: String,
    sent_at: f64,
    fence: Option<u64>,
    attempts: u32,
    at: f64,
}

/// For backends that cannot tell when a key is released: waiters rely on their next poll.
struct NeverReleased;

impl Waiter for NeverReleased {
    fn released(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>> {
        Box::pin(std::future::pending())
    }
}
