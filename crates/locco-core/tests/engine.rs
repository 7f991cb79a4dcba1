//! The lock state machine on a manual clock: every time rule is driven by moving the clock,
//! never by sleeping.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use futures_executor::LocalPool;
use futures_util::task::LocalSpawnExt;
use locco_core::*;

struct Spawner(futures_executor::LocalSpawner);
impl Spawn for Spawner {
    fn spawn(&self, task: LocalFuture<()>) {
        self.0.spawn_local(task).unwrap();
    }
}

/// The in-memory backend, with answers that can be held in flight or made to fail.
///
/// A held request is applied when its gate opens (a request stuck on the way there); with
/// `apply_early` it is applied at once and only its answer waits (stuck on the way back),
/// the case where a late "granted" matters.
struct Gated {
    inner: Rc<MemoryBackend>,
    hold: Cell<bool>,
    /// With `hold`: hold only this many more requests, then answer at once again.
    hold_next: Cell<Option<u32>>,
    /// With `hold`: hold only requests of this verb.
    hold_verb: Cell<Option<&'static str>>,
    apply_early: Cell<bool>,
    gates: RefCell<Vec<Rc<Gate>>>,
    fail: Cell<bool>,
    /// Apply the request, then answer an error anyway (the reply was lost).
    fail_after_apply: Rc<Cell<bool>>,
    calls: RefCell<Vec<&'static str>>,
    /// The size of each `extend_many` call.
    batches: RefCell<Vec<usize>>,
    /// Opened when the session that keeps every lease ends (`watch_lost`).
    session_gone: Rc<Gate>,
    /// Answers `Queue::joins_on_first_try` (as a queue in this process does).
    joins_first: Cell<bool>,
    /// The next `jumps` grant requests move this clock on by `jump_by` while they are on their
    /// way, and answer a turn later (a request that took longer than its lease).
    jump_clock: RefCell<Option<Rc<ManualClock>>>,
    jump_by: Cell<f64>,
    jumps: Cell<u32>,
}

/// Pending once, having woken itself: an answer that comes a turn after the request.
struct NextTurn(bool);

impl std::future::Future for NextTurn {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

#[derive(Default)]
struct Gate {
    open: Cell<bool>,
    waker: RefCell<Option<std::task::Waker>>,
}

impl Gate {
    async fn opened(&self) {
        std::future::poll_fn(|cx| {
            if self.open.get() {
                std::task::Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        })
        .await
    }

    fn open(&self) {
        self.open.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

fn injected() -> Error {
    Error::backend("test", BackendErrorKind::Io, "injected failure")
}

impl Gated {
    fn new(inner: Rc<MemoryBackend>) -> Self {
        Gated {
            inner,
            hold: Cell::new(false),
            hold_next: Cell::new(None),
            hold_verb: Cell::new(None),
            apply_early: Cell::new(false),
            gates: RefCell::default(),
            fail: Cell::new(false),
            fail_after_apply: Rc::default(),
            calls: RefCell::default(),
            batches: RefCell::default(),
            session_gone: Rc::default(),
            joins_first: Cell::new(false),
            jump_clock: RefCell::default(),
            jump_by: Cell::new(0.0),
            jumps: Cell::new(0),
        }
    }

    fn count(&self, verb: &str) -> usize {
        self.calls.borrow().iter().filter(|v| **v == verb).count()
    }

    fn gate<T: 'static>(&self, verb: &'static str, run: impl FnOnce() -> Op<T> + 'static) -> Op<T> {
        self.calls.borrow_mut().push(verb);
        if self.fail.get() {
            return Op::ready(Err(injected()));
        }
        if verb == "acquire" && self.jumps.get() > 0 {
            self.jumps.set(self.jumps.get() - 1);
            if let Some(clock) = &*self.jump_clock.borrow() {
                clock.advance(self.jump_by.get());
            }
            let answer = run();
            return Op::pending(async move {
                NextTurn(false).await;
                answer.await
            });
        }
        let holding = self.hold.get()
            && self.hold_next.get() != Some(0)
            && self.hold_verb.get().is_none_or(|v| v == verb);
        if let (true, Some(n)) = (holding, self.hold_next.get()) {
            self.hold_next.set(Some(n - 1));
        }
        let fail_after = self.fail_after_apply.clone();
        if !holding && !fail_after.get() {
            return run();
        }
        let gate = Rc::new(Gate {
            open: Cell::new(!holding),
            ..Default::default()
        });
        self.gates.borrow_mut().push(gate.clone());
        let answer: Box<dyn FnOnce() -> Op<T>> = if self.apply_early.get() || !holding {
            let applied = run();
            Box::new(move || applied)
        } else {
            Box::new(run)
        };
        Op::pending(async move {
            gate.opened().await;
            let answer = answer().await;
            // Read when the answer comes: a test may decide late how a stuck request ends.
            if fail_after.get() {
                return answer.and(Err(injected()));
            }
            answer
        })
    }
}

impl Backend for Gated {
    fn name(&self) -> &str {
        "gated"
    }
    fn watch_lost(&self, _key: &str, _token: &str) -> Option<Op<()>> {
        let gone = self.session_gone.clone();
        Some(Op::pending(async move {
            gone.opened().await;
            Ok(())
        }))
    }
    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let (me, k, t) = (self.inner.clone(), key.to_owned(), token.to_owned());
        self.gate("acquire", move || me.acquire(&k, &t, ttl))
    }
    fn release(&self, key: &str, token: &str) -> Op<bool> {
        let (me, k, t) = (self.inner.clone(), key.to_owned(), token.to_owned());
        self.gate("release", move || me.release(&k, &t))
    }
    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let (me, k, t) = (self.inner.clone(), key.to_owned(), token.to_owned());
        self.gate("extend", move || me.extend(&k, &t, ttl))
    }
    fn extend_many(&self, renewals: &[Renewal<'_>]) -> Op<Vec<Result<bool>>> {
        self.batches.borrow_mut().push(renewals.len());
        extend_each(self, renewals)
    }
    fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        self.inner.is_held(key, token)
    }
    fn supports_fencing(&self) -> bool {
        true
    }
    fn acquire_fenced(&self, key: &str, token: &str, ttl: u32) -> Op<Option<u64>> {
        let (me, k, t) = (self.inner.clone(), key.to_owned(), token.to_owned());
        self.gate("acquire", move || me.acquire_fenced(&k, &t, ttl))
    }
    fn waiter(&self, key: &str) -> Option<Box<dyn Waiter>> {
        self.inner.waiter(key)
    }
    fn queue(&self) -> Option<&dyn Queue> {
        Some(self)
    }
    // Held only when a test asks for this verb: other tests hold every answer to study the
    // attempts, and the read after them would then wait out its bound.
    fn inspect(&self, key: &str) -> Op<KeyInfo> {
        if self.hold_verb.get() == Some("inspect") {
            let (me, k) = (self.inner.clone(), key.to_owned());
            return self.gate("inspect", move || me.inspect(&k));
        }
        self.calls.borrow_mut().push("inspect");
        self.inner.inspect(key)
    }
}

impl Queue for Gated {
    fn acquire_queued(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: &str,
        lease: u32,
        fenced: bool,
    ) -> Op<Queued> {
        let (me, k, t, w) = (
            self.inner.clone(),
            key.to_owned(),
            token.to_owned(),
            waiter.to_owned(),
        );
        self.calls.borrow_mut().push("queued");
        self.gate("acquire", move || {
            me.queue()
                .unwrap()
                .acquire_queued(&k, &t, ttl, &w, lease, fenced)
        })
    }
    fn leave(&self, key: &str, waiter: &str) -> Op<()> {
        self.calls.borrow_mut().push("leave");
        self.inner.queue().unwrap().leave(key, waiter)
    }
    fn wakeups(&self, key: &str, waiter: &str) -> Box<dyn Waiter> {
        self.inner.queue().unwrap().wakeups(key, waiter)
    }
    fn joins_on_first_try(&self) -> bool {
        self.joins_first.get()
    }
}

#[derive(Default)]
struct Events(RefCell<Vec<String>>);
impl EventSink for Events {
    fn emit(&self, e: &Event<'_>) {
        let detail = match e {
            Event::Contended { reason, .. } => format!("contended:{}", reason.as_str()),
            Event::Lost { reason, .. } => format!("lost:{}", reason.as_str()),
            other => other.kind().to_string(),
        };
        self.0.borrow_mut().push(detail);
    }
}

/// The manual clock, unless a test makes it read something else (NaN, infinity).
struct Overridable {
    base: Rc<ManualClock>,
    value: Cell<Option<f64>>,
}

impl Clock for Overridable {
    fn now(&self) -> f64 {
        self.value.get().unwrap_or_else(|| self.base.now())
    }
}

struct Harness {
    pool: LocalPool,
    clock: Rc<ManualClock>,
    locker_clock: Rc<Overridable>,
    backend: Rc<Gated>,
    events: Rc<Events>,
    locker: Locker,
}

impl Harness {
    fn new() -> Self {
        Self::with(|_| {})
    }

    fn with(configure: impl FnOnce(&mut LockerOptions)) -> Self {
        let pool = LocalPool::new();
        let clock = ManualClock::new(1000.0);
        let backend = Rc::new(Gated::new(Rc::new(MemoryBackend::new(clock.clone()))));
        let events = Rc::new(Events::default());
        let locker_clock = Rc::new(Overridable {
            base: clock.clone(),
            value: Cell::new(None),
        });
        let rt = Runtime::system(Rc::new(Spawner(pool.spawner())))
            .with_clock(locker_clock.clone())
            .with_timer(Rc::new(clock.clone()));
        let mut options = LockerOptions {
            events: Some(events.clone()),
            ..Default::default()
        };
        configure(&mut options);
        let locker = Locker::new(backend.clone(), rt, options).unwrap();
        Harness {
            pool,
            clock,
            locker_clock,
            backend,
            events,
            locker,
        }
    }

    /// Moves the clock to `t` in steps of 1 ms, running whatever becomes due on the way.
    fn run_to(&mut self, t: f64) {
        while self.clock.now() < t {
            self.pool.run_until_stalled();
            self.clock.advance(1.0);
        }
        self.pool.run_until_stalled();
    }

    fn hold_answers(&self) {
        self.backend.hold.set(true);
    }

    fn let_answers_through(&mut self) {
        self.backend.hold.set(false);
        self.open_gates();
        self.pool.run_until_stalled();
    }

    /// Lets the `n`th request held so far through, and runs what follows.
    fn open_gate(&mut self, n: usize) {
        let gate = self.backend.gates.borrow()[n].clone();
        gate.open();
        self.pool.run_until_stalled();
    }

    /// Lets every held answer through without running anything yet.
    fn open_gates(&self) {
        let gates = std::mem::take(&mut *self.backend.gates.borrow_mut());
        for g in gates {
            g.open();
        }
    }

    fn acquire(&mut self, key: &str, options: AcquireOptions) -> Lock {
        let locker = self.locker.clone();
        let key = key.to_owned();
        self.pool
            .run_until(async move { locker.acquire(&key, options, None).await.unwrap() })
    }

    /// Starts an acquisition in the background, to be driven by moving the clock.
    fn spawn_acquire(
        &self,
        key: &str,
        options: AcquireOptions,
    ) -> futures_util::future::RemoteHandle<Result<Lock>> {
        let (locker, key) = (self.locker.clone(), key.to_owned());
        self.pool
            .spawner()
            .spawn_local_with_handle(async move { locker.acquire(&key, options, None).await })
            .unwrap()
    }

    fn events(&self) -> Vec<String> {
        self.events.0.borrow().clone()
    }
}

fn heartbeat(ttl: u32, max_hold: f64) -> AcquireOptions {
    AcquireOptions::new(ttl).with_auto_extend(AutoExtend {
        interval: None,
        max_hold,
        max_event_loop_lag: None,
    })
}

#[test]
fn the_local_lease_ends_one_percent_early() {
    let mut h = Harness::new();
    let lock = h.acquire("k", AcquireOptions::new(1000));
    h.run_to(1989.0);
    assert_eq!(lock.state(), LockState::Held);
    h.run_to(1990.0);
    assert_eq!(lock.state(), LockState::Lost);
    assert_eq!(lock.lost_reason(), Some(LostReason::Expired));
    assert_eq!(lock.held_ms(), 990.0);
    assert_eq!(h.events(), ["acquired", "lost:expired"]);
}

#[test]
fn a_grant_answered_after_the_lease_is_given_back() {
    let mut h = Harness::new();
    h.hold_answers();
    let locker = h.locker.clone();
    let attempt = h.pool.spawner().spawn_local_with_handle(async move {
        locker.try_acquire("k", AcquireOptions::new(100)).await
    });
    let attempt = attempt.unwrap();
    h.pool.run_until_stalled();
    // The answer "granted" arrives in the same turn as the clock passes the lease end: it did
    // arrive, too late to use.
    h.backend.hold.set(false);
    h.clock.set(1100.0);
    h.open_gates();
    let result = h.pool.run_until(attempt);
    match &result {
        Err(Error::Held { reason, .. }) => assert_eq!(*reason, HeldReason::LateAcquire),
        other => panic!("expected late-acquire, got {other:?}"),
    }
    let message = result.unwrap_err().to_string();
    assert!(!message.contains("held elsewhere"), "{message}");
    assert!(message.contains("too slow"), "{message}");
    // The key was given back: another caller gets it at once.
    let other = h
        .pool
        .run_until(h.locker.try_acquire("k", AcquireOptions::new(100)));
    assert!(other.unwrap().is_some());
    assert!(h.events().contains(&"contended:late".to_string()));
}

#[test]
fn a_heartbeat_ticks_from_when_the_previous_request_left() {
    let mut h = Harness::new();
    let lock = h.acquire("k", heartbeat(900, 60_000.0));
    // Tick due at 1300 (a third of 900 after the request left at 1000). Its answer is slow.
    h.run_to(1299.0);
    h.hold_answers();
    h.run_to(1300.0);
    h.run_to(1400.0);
    h.let_answers_through();
    assert_eq!(h.events().iter().filter(|e| *e == "extended").count(), 1);
    // The lease now counts from 1300, not 1400.
    assert_eq!(lock.lease_end(), 1300.0 + 891.0);
    // The next tick comes at 1600 (1300 + 300), not 1700.
    h.run_to(1599.0);
    assert_eq!(h.events().iter().filter(|e| *e == "extended").count(), 1);
    h.run_to(1600.0);
    assert_eq!(h.events().iter().filter(|e| *e == "extended").count(), 2);
}

#[test]
fn heartbeats_due_close_together_leave_as_one_batch() {
    let mut h = Harness::new();
    // 40 locks taken 1 ms apart: their ticks fall due from 1300 to 1339. A tick may run a
    // twentieth of the interval (15 ms) early, so they leave in batches, not one by one.
    let mut locks = Vec::new();
    for i in 0..40 {
        locks.push(h.acquire(&format!("k{i}"), heartbeat(900, 60_000.0)));
        h.clock.advance(1.0);
    }
    h.run_to(1340.0);
    let batches = h.backend.batches.borrow().clone();
    assert_eq!(batches.iter().sum::<usize>(), 40, "{batches:?}");
    assert!(batches.len() <= 3, "{batches:?}");
    // Each new lease counts from when its batch left: the first batch left at 1300.
    assert_eq!(locks[0].lease_end(), 1300.0 + 891.0);
    assert_eq!(locks[10].lease_end(), 1300.0 + 891.0);
    assert!(locks.iter().all(|l| l.state() == LockState::Held));
}

#[test]
fn a_key_lost_among_a_batch_ends_only_its_own_lock() {
    let mut h = Harness::new();
    let locks: Vec<Lock> = (0..10)
        .map(|i| h.acquire(&format!("k{i}"), heartbeat(900, 60_000.0)))
        .collect();
    // Another holder's delete behind our back.
    assert!(h
        .pool
        .run_until(h.backend.inner.release("k3", locks[3].token()))
        .unwrap());
    h.run_to(1300.0);
    assert_eq!(h.backend.batches.borrow().as_slice(), &[10]);
    assert_eq!(locks[3].state(), LockState::Lost);
    assert_eq!(locks[3].lost_reason(), Some(LostReason::Extend));
    for (i, lock) in locks.iter().enumerate().filter(|(i, _)| *i != 3) {
        assert_eq!(lock.state(), LockState::Held, "lock {i}");
        assert_eq!(lock.lease_end(), 1300.0 + 891.0, "lock {i}");
    }
}

#[test]
fn failing_extensions_keep_the_lock_then_end_it_extend_failed() {
    let mut h = Harness::new();
    let lock = h.acquire("k", heartbeat(900, 60_000.0));
    h.backend.fail.set(true);
    h.run_to(1300.0);
    assert_eq!(lock.state(), LockState::Held);
    assert_eq!(h.events().last().unwrap(), "extendFailed");
    // Retried a third of the interval (100 ms) later.
    h.run_to(1399.0);
    assert_eq!(
        h.events().iter().filter(|e| *e == "extendFailed").count(),
        1
    );
    h.run_to(1400.0);
    assert_eq!(
        h.events().iter().filter(|e| *e == "extendFailed").count(),
        2
    );
    h.run_to(1891.0);
    assert_eq!(lock.state(), LockState::Lost);
    assert_eq!(lock.lost_reason(), Some(LostReason::ExtendFailed));
    assert!(matches!(lock.lost_cause(), Some(Error::Backend { .. })));
}

#[test]
fn an_extension_still_in_flight_at_the_lease_end_is_late_extend() {
    let mut h = Harness::new();
    let lock = h.acquire("k", heartbeat(900, 60_000.0));
    h.run_to(1299.0);
    h.hold_answers();
    h.run_to(1891.0);
    assert_eq!(lock.lost_reason(), Some(LostReason::LateExtend));
    h.let_answers_through();
    assert_eq!(
        lock.state(),
        LockState::Lost,
        "a late answer does not revive the lock"
    );
    assert_eq!(
        h.events().iter().filter(|e| e.starts_with("lost")).count(),
        1
    );
}

#[test]
fn an_extension_refused_by_the_backend_is_lost_extend() {
    let mut h = Harness::new();
    let lock = h.acquire("k", heartbeat(900, 60_000.0));
    h.backend.inner.clear();
    h.run_to(1300.0);
    assert_eq!(lock.lost_reason(), Some(LostReason::Extend));
}

#[test]
fn max_hold_clamps_every_extension_and_ends_the_lock() {
    let mut h = Harness::new();
    let lock = h.acquire("k", heartbeat(900, 1000.0));
    h.run_to(1900.0);
    // The extension at 1900 could only ask for 100 ms: the deadline is 2000.
    assert_eq!(lock.state(), LockState::Held);
    h.run_to(2000.0);
    assert_eq!(lock.state(), LockState::Lost);
    assert_eq!(lock.lost_reason(), Some(LostReason::MaxHold));
    assert!(lock.held_ms() <= 1000.0);
    // The backend lease does not outlive the deadline by more than the last request's flight.
    h.run_to(2001.0);
    let other = h
        .pool
        .run_until(h.locker.try_acquire("k", AcquireOptions::new(100)));
    assert!(other.unwrap().is_some());
}

#[test]
fn a_manual_extend_is_clamped_and_refused_after_the_deadline() {
    let mut h = Harness::new();
    let lock = h.acquire("k", heartbeat(900, 1000.0));
    h.pool.run_until(lock.extend(5000)).unwrap();
    assert!(lock.lease_end() <= 2000.0);
    assert_eq!(lock.ttl(), 5000);
    h.run_to(2000.0);
    let err = h.pool.run_until(lock.extend(5000)).unwrap_err();
    assert!(matches!(
        err,
        Error::Lost {
            reason: LostReason::MaxHold,
            ..
        }
    ));
}

#[test]
fn a_lease_that_runs_out_during_release_reports_lost_only() {
    let mut h = Harness::new();
    let lock = h.acquire("k", AcquireOptions::new(100));
    h.hold_answers();
    let l2 = lock.clone();
    let release = h
        .pool
        .spawner()
        .spawn_local_with_handle(async move { l2.release(false).await })
        .unwrap();
    h.run_to(1100.0);
    h.let_answers_through();
    let deleted = h.pool.run_until(release).unwrap();
    assert!(!deleted, "past the lease the answer no longer counts");
    assert_eq!(lock.state(), LockState::Released);
    assert_eq!(lock.lost_reason(), Some(LostReason::Expired));
    let ends: Vec<_> = h
        .events()
        .into_iter()
        .filter(|e| e == "released" || e.starts_with("lost"))
        .collect();
    assert_eq!(ends, ["lost:expired"]);
}

// The release of a lock already lost only tidies up: a backend that never answers it must not
// hold the caller (withLock, a permit's turn, a MutexManager operation) for ever.
#[test]
fn the_release_of_a_lost_lock_waits_at_most_one_ttl() {
    use futures_util::FutureExt;
    let mut h = Harness::new();
    let lock = h.acquire("k", AcquireOptions::new(100));
    h.run_to(1100.0);
    assert_eq!(lock.state(), LockState::Lost);
    h.hold_answers();
    let l2 = lock.clone();
    let mut release = h
        .pool
        .spawner()
        .spawn_local_with_handle(async move { l2.release(false).await })
        .unwrap();
    h.run_to(1150.0);
    assert!(
        (&mut release).now_or_never().is_none(),
        "an answer that may still come is waited for a while"
    );
    h.run_to(1201.0);
    let answer = (&mut release)
        .now_or_never()
        .expect("settled one ttl after it was sent");
    assert!(
        !answer.unwrap(),
        "a lost lock's release deletes nothing of ours"
    );
    assert_eq!(lock.state(), LockState::Released);
    assert_eq!(lock.lost_reason(), Some(LostReason::Expired));
}

#[test]
fn release_then_release_again() {
    let mut h = Harness::new();
    let lock = h.acquire("k", AcquireOptions::new(1000));
    assert!(h.pool.run_until(lock.release(false)).unwrap());
    assert!(!h.pool.run_until(lock.release(false)).unwrap());
    assert!(matches!(
        h.pool.run_until(lock.extend(100)),
        Err(Error::State(_))
    ));
    assert_eq!(h.events(), ["acquired", "released"]);
}

#[test]
fn a_failed_release_keeps_the_lock_and_can_be_retried() {
    let mut h = Harness::new();
    let lock = h.acquire("k", AcquireOptions::new(1000));
    h.backend.fail.set(true);
    assert!(h.pool.run_until(lock.release(false)).is_err());
    assert_eq!(lock.state(), LockState::Held);
    h.backend.fail.set(false);
    assert!(h.pool.run_until(lock.release(false)).unwrap());
    assert_eq!(h.events(), ["acquired", "releaseFailed", "released"]);
}

#[test]
fn a_backend_failure_ends_an_acquisition_at_once_by_default() {
    let mut h = Harness::new();
    h.backend.fail.set(true);
    let policy = RetryPolicy {
        retries: Some(10),
        delay: Delay::Fixed(100.0),
        ..Default::default()
    };
    let task = h.spawn_acquire("k", AcquireOptions::new(1000).with_retry(policy));
    h.run_to(1010.0);
    match h.pool.run_until(task) {
        Err(Error::Backend { kind, .. }) => assert_eq!(kind, BackendErrorKind::Io),
        other => panic!("expected the backend's failure, got {other:?}"),
    }
    assert_eq!(h.backend.count("acquire"), 1);
}

#[test]
fn on_backend_error_retry_rides_out_a_failure_within_the_budget() {
    let mut h = Harness::new();
    h.backend.fail.set(true);
    let policy = RetryPolicy {
        retries: None,
        delay: Delay::Fixed(100.0),
        timeout: Some(2000.0),
        on_backend_error: OnBackendError::Retry,
    };
    let task = h.spawn_acquire("k", AcquireOptions::new(1000).with_retry(policy.clone()));
    h.run_to(1350.0);
    h.backend.fail.set(false);
    h.run_to(1500.0);
    let lock = h
        .pool
        .run_until(task)
        .expect("taken once the backend answered");
    assert_eq!(lock.state(), LockState::Held);
    let retried = h.events().iter().filter(|e| *e == "backendRetry").count();
    assert!((3..=5).contains(&retried), "{:?}", h.events());
    assert_eq!(h.events().last().map(String::as_str), Some("acquired"));
    // A failure that outlasts the budget is the answer when the budget is spent, not
    // contention.
    h.pool.run_until(lock.release(false)).unwrap();
    h.backend.fail.set(true);
    let task = h.spawn_acquire("k", AcquireOptions::new(1000).with_retry(policy));
    h.run_to(3600.0);
    match h.pool.run_until(task) {
        Err(Error::Backend { kind, .. }) => assert_eq!(kind, BackendErrorKind::Io),
        other => panic!("expected the backend's failure, got {other:?}"),
    }
}

#[test]
fn is_held_false_marks_the_lock_observed() {
    let mut h = Harness::new();
    let lock = h.acquire("k", AcquireOptions::new(1000));
    assert!(h.pool.run_until(lock.is_held()).unwrap());
    h.backend.inner.clear();
    assert!(!h.pool.run_until(lock.is_held()).unwrap());
    assert_eq!(lock.lost_reason(), Some(LostReason::Observed));
}

#[test]
fn retries_count_attempts_and_give_up_with_held() {
    let mut h = Harness::new();
    let _holder = h.acquire("k", AcquireOptions::new(10_000));
    let policy = RetryPolicy {
        retries: Some(2),
        delay: Delay::Fixed(100.0),
        timeout: None,
        ..Default::default()
    };
    let task = h.spawn_acquire("k", AcquireOptions::new(100).with_retry(policy));
    h.run_to(1300.0);
    match h.pool.run_until(task) {
        Err(Error::Held {
            attempts, reason, ..
        }) => {
            assert_eq!(attempts, 3);
            assert_eq!(reason, HeldReason::Held);
        }
        other => panic!("expected Held, got {other:?}"),
    }
}

#[test]
fn the_timeout_is_one_budget_and_no_wait_starts_after_it() {
    let mut h = Harness::new();
    let _holder = h.acquire("k", AcquireOptions::new(10_000));
    let policy = RetryPolicy {
        retries: None,
        delay: Delay::Fixed(100.0),
        timeout: Some(250.0),
        ..Default::default()
    };
    let task = h.spawn_acquire("k", AcquireOptions::new(100).with_retry(policy));
    h.run_to(1250.0);
    match h.pool.run_until(task) {
        Err(Error::Held {
            attempts,
            elapsed_ms,
            ..
        }) => {
            assert_eq!(attempts, 3);
            assert_eq!(elapsed_ms, 250.0);
        }
        other => panic!("expected Held, got {other:?}"),
    }
}

#[test]
fn a_release_wakes_the_longest_waiter_before_its_next_poll() {
    let mut h = Harness::new();
    let holder = h.acquire("k", AcquireOptions::new(10_000));
    let order = Rc::new(RefCell::new(Vec::new()));
    for n in 0..3 {
        let (locker, order) = (h.locker.clone(), order.clone());
        let policy = RetryPolicy {
            retries: None,
            delay: Delay::Fixed(60_000.0),
            timeout: None,
            ..Default::default()
        };
        h.pool
            .spawner()
            .spawn_local(async move {
                let lock = locker
                    .acquire("k", AcquireOptions::new(10_000).with_retry(policy), None)
                    .await
                    .unwrap();
                order.borrow_mut().push(n);
                lock.release(false).await.unwrap();
            })
            .unwrap();
        h.pool.run_until_stalled();
    }
    h.pool.run_until(holder.release(false)).unwrap();
    h.pool.run_until_stalled();
    assert_eq!(*order.borrow(), [0, 1, 2], "FIFO, without the clock moving");
}

#[test]
fn a_queue_in_this_process_is_joined_by_the_first_try() {
    let mut h = Harness::new();
    h.backend.joins_first.set(true);
    // (A queued attempt is counted as "queued" and its request as "acquire".)
    let holder = h.acquire("k", AcquireOptions::new(10_000));
    assert_eq!(
        *h.backend.calls.borrow(),
        ["queued", "acquire"],
        "a free key: one request"
    );
    h.backend.calls.borrow_mut().clear();
    let waits = RetryPolicy {
        retries: None,
        delay: Delay::Fixed(60_000.0),
        timeout: None,
        ..Default::default()
    };
    let waiter = h.spawn_acquire("k", AcquireOptions::new(10_000).with_retry(waits));
    h.pool.run_until_stalled();
    assert_eq!(
        *h.backend.calls.borrow(),
        ["queued", "acquire"],
        "a taken key: the first try is the join, not a plain try and then the join"
    );
    h.backend.calls.borrow_mut().clear();
    // An acquisition that may not wait never queues: its try stays plain.
    let once = RetryPolicy {
        retries: Some(0),
        delay: Delay::Fixed(0.0),
        timeout: None,
        ..Default::default()
    };
    let tried = h.spawn_acquire("k", AcquireOptions::new(10_000).with_retry(once));
    assert!(matches!(h.pool.run_until(tried), Err(Error::Held { .. })));
    assert_eq!(h.backend.count("queued"), 0);
    assert_eq!(h.backend.count("acquire"), 1);
    // The waiter that joined is the one the release hands the key to.
    h.pool.run_until(holder.release(false)).unwrap();
    let lock = h.pool.run_until(waiter).unwrap();
    assert_eq!(lock.state(), LockState::Held);
}

#[test]
fn an_abort_stops_the_loop_and_gives_back_a_grant_in_flight() {
    let mut h = Harness::new();
    h.hold_answers();
    let abort = Abort::new();
    let (locker, a) = (h.locker.clone(), abort.clone());
    let task = h
        .pool
        .spawner()
        .spawn_local_with_handle(async move {
            locker
                .acquire("k", AcquireOptions::new(10_000), Some(a))
                .await
        })
        .unwrap();
    h.pool.run_until_stalled();
    abort.abort();
    assert!(matches!(h.pool.run_until(task), Err(Error::Aborted)));
    h.let_answers_through();
    assert!(
        h.backend.inner.is_empty(),
        "the grant that arrived after the abort was given back"
    );
}

#[test]
fn acquire_many_sorts_dedupes_and_releases_all_on_failure() {
    let mut h = Harness::new();
    let keys: Vec<String> = ["b", "a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let locks = h
        .pool
        .run_until(
            h.locker
                .acquire_many(&keys, AcquireOptions::new(1000), None),
        )
        .unwrap();
    assert_eq!(
        locks.iter().map(|l| l.key()).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    for l in &locks {
        h.pool.run_until(l.release(false)).unwrap();
    }
    let _c = h.acquire("c", AcquireOptions::new(10_000));
    let policy = RetryPolicy {
        retries: Some(0),
        ..Default::default()
    };
    let err = h
        .pool
        .run_until(
            h.locker
                .acquire_many(&keys, AcquireOptions::new(1000).with_retry(policy), None),
        )
        .unwrap_err();
    assert!(err.is_contention());
    assert_eq!(h.backend.inner.len(), 1, "a and b were released again");
}

#[test]
fn fencing_tokens_grow_per_key_and_survive_clear() {
    let mut h = Harness::with(|o| o.fencing = true);
    let mut last = 0;
    for _ in 0..3 {
        let lock = h.acquire("k", AcquireOptions::new(1000));
        let fence = lock.fence().unwrap();
        assert!(fence > last);
        last = fence;
        h.pool.run_until(lock.release(false)).unwrap();
    }
    h.backend.inner.clear();
    let lock = h.acquire("k", AcquireOptions::new(1000));
    assert!(lock.fence().unwrap() > last);
}

fn lag_limited(max_lag: f64) -> AcquireOptions {
    AcquireOptions::new(900).with_auto_extend(AutoExtend {
        interval: None,
        max_hold: 60_000.0,
        max_event_loop_lag: Some(max_lag),
    })
}

#[test]
fn a_tick_that_runs_too_late_sends_nothing_until_the_loop_is_healthy() {
    let mut h = Harness::new();
    let lock = h.acquire("k", lag_limited(50.0));
    // Nothing runs between 1000 and 1400: the tick due at 1300 runs 100 ms late.
    h.clock.set(1400.0);
    h.pool.run_until_stalled();
    assert!(
        !h.events().contains(&"extended".to_string()),
        "no extension vouches for a stalled loop"
    );
    // The retry a third of an interval later runs on time: the loop is healthy again.
    h.run_to(1500.0);
    assert!(h.events().contains(&"extended".to_string()));
    assert_eq!(lock.state(), LockState::Held);
}

#[test]
fn a_loop_stalled_past_the_lease_finds_the_lock_expired() {
    let mut h = Harness::new();
    let lock = h.acquire("k", lag_limited(300.0));
    h.clock.set(2500.0);
    h.pool.run_until_stalled();
    assert_eq!(lock.lost_reason(), Some(LostReason::Expired));
    assert!(!h.events().contains(&"extended".to_string()));
    let other = h
        .pool
        .run_until(h.locker.try_acquire("k", AcquireOptions::new(100)));
    assert!(
        other.unwrap().is_some(),
        "the key was free for others during the stall"
    );
}

#[test]
fn validation_names_the_field() {
    let h = Harness::new();
    let err = h.locker.full_key("").unwrap_err();
    assert!(matches!(err, Error::Validation { ref field, .. } if field == "key"));
    let long = "x".repeat(MAX_KEY_BYTES + 1);
    assert!(matches!(
        h.locker.full_key(&long),
        Err(Error::Validation { .. })
    ));
    let bad = AcquireOptions::new(900).with_auto_extend(AutoExtend {
        interval: Some(451.0),
        max_hold: 1000.0,
        max_event_loop_lag: None,
    });
    assert!(
        matches!(bad.validate(), Err(Error::Validation { ref field, .. }) if field == "autoExtend.interval")
    );
    assert!(validate_ttl("ttl", 0.0).is_err());
    assert!(validate_ttl("ttl", 1.5).is_err());
    assert!(validate_ttl("ttl", 2_147_483_648.0).is_err());
}

fn retries(n: u32, delay: f64) -> RetryPolicy {
    RetryPolicy {
        retries: Some(n),
        delay: Delay::Fixed(delay),
        timeout: None,
        ..Default::default()
    }
}

fn is_held_in_backend(h: &mut Harness, lock: &Lock) -> bool {
    h.pool
        .run_until(h.backend.inner.is_held(lock.key(), lock.token()))
        .unwrap()
}

#[test]
fn a_late_grant_of_an_abandoned_attempt_never_releases_the_winner() {
    let mut h = Harness::new();
    // The first grant is applied at 1000 (backend lease until 1100) but its answer is stuck.
    h.backend.apply_early.set(true);
    h.backend.hold_next.set(Some(1));
    h.hold_answers();
    let task = h.spawn_acquire("k", AcquireOptions::new(100).with_retry(retries(3, 10.0)));
    // Attempt 1 is abandoned at 1099; attempt 2 leaves at 1109, after the first lease ran out.
    h.run_to(1120.0);
    let lock = h.pool.run_until(task).unwrap();
    assert_eq!(lock.state(), LockState::Held);
    // Now the first attempt's "granted" arrives, and is given back.
    h.let_answers_through();
    assert!(
        is_held_in_backend(&mut h, &lock),
        "the give-back of attempt 1 deleted the lock of attempt 2"
    );
    let rival = h
        .pool
        .run_until(h.locker.try_acquire("k", AcquireOptions::new(100)))
        .unwrap();
    assert!(rival.is_none(), "a second holder was granted the key");
    assert_eq!(lock.state(), LockState::Held);
}

#[test]
fn the_token_source_is_asked_once_and_only_a_refused_token_is_sent_again() {
    let made = Rc::new(Cell::new(0u32));
    let m = made.clone();
    let mut h = Harness::with(move |o| {
        o.token = Some(Rc::new(move || {
            m.set(m.get() + 1);
            Ok(format!("t{}", m.get()))
        }))
    });
    let _holder = h.acquire("k", AcquireOptions::new(150));
    let task = h.spawn_acquire("k", AcquireOptions::new(100).with_retry(retries(5, 100.0)));
    h.run_to(1400.0);
    let lock = h.pool.run_until(task).unwrap();
    // The holder took t1. The waiter's source was asked once, when it started (t2); its
    // attempts at 1000 and 1100 were refused, which leaves nothing under t2, so 1200 won
    // with t2 again.
    assert_eq!(lock.token(), "t2");
    assert_eq!(made.get(), 2);
}

#[test]
fn a_grant_whose_answer_failed_is_given_back() {
    let mut h = Harness::with(|o| o.fencing = true);
    // The grant was applied, then the answer failed (say, a fencing counter write).
    h.backend.fail_after_apply.set(true);
    let locker = h.locker.clone();
    let err = h
        .pool
        .run_until(async move { locker.acquire("k", AcquireOptions::new(10_000), None).await })
        .unwrap_err();
    match &err {
        Error::Backend { message, .. } => {
            assert_eq!(message, "acquire of \"k\": injected failure")
        }
        other => panic!("expected the backend's error, got {other:?}"),
    }
    h.backend.fail_after_apply.set(false);
    h.pool.run_until_stalled();
    assert!(
        h.backend.inner.is_empty(),
        "the grant nobody can use was given back"
    );
}

#[test]
fn an_abandoned_attempt_whose_late_answer_failed_is_given_back() {
    let mut h = Harness::new();
    h.backend.apply_early.set(true);
    h.hold_answers();
    let policy = RetryPolicy {
        retries: Some(0),
        delay: Delay::Fixed(10.0),
        timeout: Some(50.0),
        ..Default::default()
    };
    let task = h.spawn_acquire("k", AcquireOptions::new(10_000).with_retry(policy));
    h.run_to(1050.0);
    assert!(h.pool.run_until(task).is_err());
    // The stuck request was applied; its answer, when it comes, is an error.
    h.backend.fail_after_apply.set(true);
    h.backend.hold.set(false);
    h.let_answers_through();
    h.backend.fail_after_apply.set(false);
    h.pool.run_until_stalled();
    assert!(
        h.backend.inner.is_empty(),
        "the applied grant was given back"
    );
}

#[test]
fn a_backend_that_never_answers_is_a_timeout_not_contention() {
    let mut h = Harness::new();
    h.hold_answers();
    let task = h.spawn_acquire("k", AcquireOptions::new(100).with_retry(retries(1, 10.0)));
    h.run_to(1300.0);
    match h.pool.run_until(task) {
        Err(Error::Backend {
            kind,
            ref message,
            ref backend,
            ..
        }) => {
            assert_eq!(kind, BackendErrorKind::Timeout);
            assert_eq!(backend, "gated");
            assert!(message.contains("\"k\""), "{message}");
            assert!(message.contains("acquire"), "{message}");
        }
        other => panic!("expected a backend timeout, got {other:?}"),
    }
    assert!(!h.events().iter().any(|e| e.starts_with("contended")));
    let locker = h.locker.clone();
    let single = h.pool.spawner().spawn_local_with_handle(async move {
        locker.try_acquire("k", AcquireOptions::new(100)).await
    });
    let single = single.unwrap();
    h.run_to(1500.0);
    assert!(matches!(
        h.pool.run_until(single),
        Err(Error::Backend {
            kind: BackendErrorKind::Timeout,
            ..
        })
    ));
}

#[test]
fn contention_then_silence_is_still_contention() {
    let mut h = Harness::new();
    let _holder = h.acquire("k", AcquireOptions::new(10_000));
    let task = h.spawn_acquire("k", AcquireOptions::new(100).with_retry(retries(1, 10.0)));
    h.pool.run_until_stalled();
    // The first attempt was answered "held"; the second gets no answer.
    h.hold_answers();
    h.run_to(1300.0);
    match h.pool.run_until(task) {
        Err(Error::Held {
            reason, attempts, ..
        }) => {
            assert_eq!(reason, HeldReason::Held);
            assert_eq!(attempts, 2);
        }
        other => panic!("expected Held, got {other:?}"),
    }
}

#[test]
fn a_grant_and_an_abort_in_the_same_turn_end_aborted_and_given_back() {
    let mut h = Harness::new();
    h.hold_answers();
    let abort = Abort::new();
    let (locker, a) = (h.locker.clone(), abort.clone());
    let task = h
        .pool
        .spawner()
        .spawn_local_with_handle(async move {
            locker
                .acquire("k", AcquireOptions::new(10_000), Some(a))
                .await
        })
        .unwrap();
    h.pool.run_until_stalled();
    h.backend.hold.set(false);
    h.open_gates();
    abort.abort();
    assert!(matches!(h.pool.run_until(task), Err(Error::Aborted)));
    h.pool.run_until_stalled();
    assert!(h.backend.inner.is_empty());
}

fn is_closed_error(result: Result<Lock>) -> bool {
    matches!(result, Err(Error::State(ref m)) if m.contains("closed"))
}

#[test]
fn close_ends_waiting_acquisitions_and_gives_back_a_grant_in_flight() {
    let mut h = Harness::new();
    let holder = h.acquire("k", AcquireOptions::new(10_000));
    let waiting = h.spawn_acquire(
        "k",
        AcquireOptions::new(1000).with_retry(retries(1000, 50.0)),
    );
    h.pool.run_until_stalled();
    // A grant applied by the backend whose answer is still on its way back.
    h.backend.apply_early.set(true);
    h.hold_answers();
    let in_flight = h.spawn_acquire("j", AcquireOptions::new(1000));
    h.pool.run_until_stalled();
    assert_eq!(h.backend.inner.len(), 2, "k held, j granted in the backend");
    h.locker.close();
    // Both end at once, before any clock moves: nobody waits out a retry or a lease.
    h.pool.run_until_stalled();
    let mut waiting = waiting;
    let mut in_flight = in_flight;
    let waited = h
        .pool
        .run_until(futures_util::future::poll_immediate(&mut waiting));
    let flew = h
        .pool
        .run_until(futures_util::future::poll_immediate(&mut in_flight));
    assert!(
        waited.is_some_and(is_closed_error),
        "the waiting acquisition"
    );
    assert!(
        flew.is_some_and(is_closed_error),
        "the acquisition in flight"
    );
    h.let_answers_through();
    h.backend.apply_early.set(false);
    assert!(h.pool.run_until(holder.release(true)).unwrap());
    h.run_to(1200.0);
    assert!(h.backend.inner.is_empty(), "a grant after close was kept");
    let locker = h.locker.clone();
    let later = h
        .pool
        .run_until(async move { locker.acquire("m", AcquireOptions::new(1000), None).await });
    assert!(is_closed_error(later), "an acquisition after close");
}

#[test]
fn an_abort_while_acquire_many_refreshes_its_leases_gives_every_lock_back() {
    let mut h = Harness::new();
    h.backend.hold_verb.set(Some("extend"));
    h.hold_answers();
    let abort = Abort::new();
    let keys: Vec<String> = vec!["a".into(), "b".into()];
    let (locker, a) = (h.locker.clone(), abort.clone());
    let task = h
        .pool
        .spawner()
        .spawn_local_with_handle(async move {
            locker
                .acquire_many(&keys, AcquireOptions::new(10_000), Some(a))
                .await
        })
        .unwrap();
    h.pool.run_until_stalled();
    assert_eq!(
        h.backend.inner.len(),
        2,
        "both keys taken, a's refresh in flight"
    );
    abort.abort();
    h.let_answers_through();
    assert!(matches!(h.pool.run_until(task), Err(Error::Aborted)));
    h.pool.run_until_stalled();
    assert!(h.backend.inner.is_empty());
}

#[test]
fn manual_extends_do_not_start_more_heartbeats() {
    let mut h = Harness::new();
    let lock = h.acquire("k", heartbeat(900, 60_000.0));
    for _ in 0..5 {
        h.pool.run_until(lock.extend(900)).unwrap();
    }
    h.run_to(4000.0);
    assert_eq!(lock.state(), LockState::Held);
    // Ten heartbeat ticks (1300, 1600, … 4000) and the five manual calls.
    assert_eq!(h.backend.count("extend"), 15);
    h.pool.run_until(lock.extend(900)).unwrap();
    h.run_to(7000.0);
    assert_eq!(h.backend.count("extend"), 26);
}

#[test]
fn a_clock_that_is_not_finite_is_refused_not_spun() {
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut h = Harness::new();
        let holder = h.acquire("k", heartbeat(900, 60_000.0));
        let before = h.backend.count("acquire");
        h.locker_clock.value.set(Some(bad));
        let policy = retries(1_000, 0.0);
        let locker = h.locker.clone();
        let err = h
            .pool
            .run_until(async move {
                locker
                    .acquire("k", AcquireOptions::new(100).with_retry(policy), None)
                    .await
            })
            .unwrap_err();
        match &err {
            Error::Validation { field, message } => {
                assert_eq!(field, "now");
                assert!(message.contains("finite"), "{message}");
            }
            other => panic!("expected a ValidationError on now, got {other:?}"),
        }
        assert!(h.backend.count("acquire") - before <= 1, "the loop spun");
        let err = h
            .pool
            .run_until(h.locker.try_acquire("j", AcquireOptions::new(100)))
            .unwrap_err();
        assert!(matches!(err, Error::Validation { ref field, .. } if field == "now"));
        let keys = vec!["x".to_string(), "y".to_string()];
        let err = h
            .pool
            .run_until(h.locker.acquire_many(&keys, AcquireOptions::new(100), None))
            .unwrap_err();
        assert!(matches!(err, Error::Validation { ref field, .. } if field == "now"));
        let extends = h.backend.count("extend");
        let err = h.pool.run_until(holder.extend(900)).unwrap_err();
        assert!(matches!(err, Error::Validation { ref field, .. } if field == "now"));
        assert_eq!(
            h.backend.count("extend"),
            extends,
            "no extension with a made-up ttl"
        );
    }
    let mut h = Harness::new();
    h.locker_clock.value.set(Some(f64::NAN));
    let locker = h.locker.clone();
    let err = h
        .pool
        .run_until(async move { locker.acquire("k", AcquireOptions::new(100), None).await })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid now: the injected clock returned NaN; it must return a finite number of ms"
    );
}

#[test]
fn a_shorter_extension_still_in_flight_shortens_the_lease_at_once() {
    let mut h = Harness::new();
    let lock = h.acquire("k", AcquireOptions::new(1000));
    // Applied at once (backend lease until 1100), answer stuck.
    h.backend.apply_early.set(true);
    h.hold_answers();
    let l2 = lock.clone();
    let _extend = h
        .pool
        .spawner()
        .spawn_local_with_handle(async move { l2.extend(100).await })
        .unwrap();
    h.run_to(1098.0);
    assert_eq!(lock.state(), LockState::Held);
    h.run_to(1100.0);
    assert!(!is_held_in_backend(&mut h, &lock));
    assert_eq!(
        lock.state(),
        LockState::Lost,
        "the lock read held after the lease the backend may have applied"
    );
    assert_eq!(lock.lost_reason(), Some(LostReason::LateExtend));
}

#[test]
fn extensions_answered_out_of_order_keep_the_earlier_lease_end() {
    let mut h = Harness::new();
    let lock = h.acquire("k", AcquireOptions::new(1000));
    h.hold_answers();
    // The first extension (300 ms) is stuck on its way to the backend; the second (600 ms) is
    // applied at once but its answer is stuck on the way back.
    for (ttl, early) in [(300, false), (600, true)] {
        h.backend.apply_early.set(early);
        let l = lock.clone();
        h.pool
            .spawner()
            .spawn_local(async move {
                let _ = l.extend(ttl).await;
            })
            .unwrap();
        h.pool.run_until_stalled();
    }
    assert_eq!(h.backend.gates.borrow().len(), 2);
    // At 1010 the first is applied, last (the backend now holds the key until 1310), and
    // answered; at 1020 the second's answer arrives.
    h.run_to(1010.0);
    h.open_gate(0);
    h.run_to(1020.0);
    h.open_gate(1);
    h.run_to(1297.0);
    assert_eq!(
        lock.state(),
        LockState::Lost,
        "ends with the earlier of the two leases"
    );
    h.run_to(1400.0);
    assert!(!is_held_in_backend(&mut h, &lock));
}

#[test]
fn acquire_many_does_not_wait_for_the_release_of_a_lost_lock() {
    use futures_util::FutureExt;
    let mut h = Harness::new();
    let _holder = h.acquire("b", AcquireOptions::new(10_000));
    let keys: Vec<String> = vec!["a".into(), "b".into()];
    let locker = h.locker.clone();
    let task = h
        .pool
        .spawner()
        .spawn_local_with_handle(async move {
            locker
                .acquire_many(
                    &keys,
                    AcquireOptions::new(100).with_retry(retries(1, 200.0)),
                    None,
                )
                .await
        })
        .unwrap();
    h.pool.run_until_stalled();
    // a's lease runs out while b is awaited; the release of a then gets no answer.
    h.backend.hold_verb.set(Some("release"));
    h.hold_answers();
    h.run_to(1300.0);
    match task.now_or_never() {
        Some(Err(e)) => assert!(e.is_contention(), "{e:?}"),
        other => panic!("acquire_many is still waiting: {other:?}"),
    }
}

#[test]
fn an_attempt_abandoned_without_an_answer_is_given_back_at_once() {
    let mut h = Harness::new();
    // Applied at once; the answer never comes. Releases go through.
    h.backend.apply_early.set(true);
    h.backend.hold_verb.set(Some("acquire"));
    h.hold_answers();
    let task = h.spawn_acquire(
        "k",
        AcquireOptions::new(10_000).with_retry(retries(0, 10.0)),
    );
    h.run_to(10_899.0);
    h.run_to(10_900.0);
    assert!(matches!(
        h.pool.run_until(task),
        Err(Error::Backend {
            kind: BackendErrorKind::Timeout,
            ..
        })
    ));
    assert!(
        h.backend.inner.is_empty(),
        "the grant stays until its TTL although nobody can use it"
    );
}

/// Starts an acquisition that notes `name` in `order` when it wins, then holds the lock.
fn queue_up(
    h: &mut Harness,
    name: &'static str,
    order: &Rc<RefCell<Vec<&'static str>>>,
    abort: Option<Abort>,
) -> Rc<RefCell<Option<Lock>>> {
    let (locker, order) = (h.locker.clone(), order.clone());
    let held = Rc::new(RefCell::new(None));
    let slot = held.clone();
    let options = AcquireOptions::new(10_000).with_retry(retries(1000, 60_000.0));
    h.pool
        .spawner()
        .spawn_local(async move {
            if let Ok(lock) = locker.acquire("k", options, abort).await {
                order.borrow_mut().push(name);
                *slot.borrow_mut() = Some(lock);
            }
        })
        .unwrap();
    h.pool.run_until_stalled();
    held
}

fn release(h: &mut Harness, held: &Rc<RefCell<Option<Lock>>>) {
    let lock = held.borrow_mut().take().expect("held");
    h.pool.run_until(lock.release(false)).unwrap();
    h.pool.run_until_stalled();
}

#[test]
fn a_free_key_goes_to_its_longest_waiter_not_to_a_newcomer() {
    let mut h = Harness::new();
    let order = Rc::new(RefCell::new(Vec::new()));
    let first = queue_up(&mut h, "first", &order, None);
    let second = queue_up(&mut h, "second", &order, None);
    let third = queue_up(&mut h, "third", &order, None);
    assert_eq!(*order.borrow(), ["first"]);
    // The holder asks again the moment it releases: it goes behind the two waiters.
    let locker = h.locker.clone();
    let again = h
        .pool
        .spawner()
        .spawn_local_with_handle(async move {
            locker
                .acquire(
                    "k",
                    AcquireOptions::new(10_000).with_retry(retries(1000, 60_000.0)),
                    None,
                )
                .await
        })
        .unwrap();
    release(&mut h, &first);
    let tried = h
        .pool
        .run_until(h.locker.try_acquire("k", AcquireOptions::new(10_000)));
    assert!(
        tried.unwrap().is_none(),
        "a try does not take a key promised to a waiter"
    );
    assert_eq!(*order.borrow(), ["first", "second"]);
    release(&mut h, &second);
    assert_eq!(*order.borrow(), ["first", "second", "third"]);
    release(&mut h, &third);
    let lock = h.pool.run_until(again).unwrap();
    assert!(h.pool.run_until(lock.release(false)).unwrap());
    assert_eq!(
        h.clock.now(),
        1000.0,
        "every hand-off was a push, not a poll"
    );
}

#[test]
fn a_session_the_backend_reports_gone_loses_its_locks_at_once() {
    let mut h = Harness::new();
    let released = h.acquire("a", AcquireOptions::new(10_000));
    assert!(h.pool.run_until(released.release(false)).unwrap());
    let held = h.acquire("b", AcquireOptions::new(10_000));
    h.run_to(500.0);
    h.backend.session_gone.open();
    h.pool.run_until_stalled();
    assert_eq!(held.state(), LockState::Lost);
    assert_eq!(held.lost_reason(), Some(LostReason::Session));
    assert_eq!(
        h.events(),
        ["acquired", "released", "acquired", "lost:session"],
        "long before the lease ends, and nothing for the released lock"
    );
}

#[test]
fn a_waiter_joins_the_queue_only_when_its_plain_try_finds_the_key_taken() {
    let mut h = Harness::new();
    let order = Rc::new(RefCell::new(Vec::new()));
    let holder = queue_up(&mut h, "holder", &order, None);
    let calls = |h: &Harness| (h.backend.count("acquire"), h.backend.count("queued"));
    assert_eq!(
        calls(&h),
        (1, 0),
        "a free key: one plain try, as without a queue"
    );
    let _waiter = queue_up(&mut h, "waiter", &order, None);
    assert_eq!(calls(&h), (3, 1), "a taken key: the waiter joins at once");
    assert_eq!(h.events(), ["acquired", "contended:held"], "in one attempt");
    // A try, or an acquisition that may not retry, never joins (so never has to leave).
    let tried = h
        .pool
        .run_until(h.locker.try_acquire("k", AcquireOptions::new(10_000)));
    assert!(tried.unwrap().is_none());
    let once = AcquireOptions::new(10_000).with_retry(retries(0, 10.0));
    let once = h.pool.run_until(h.locker.acquire("k", once, None));
    assert!(once.unwrap_err().is_contention());
    assert_eq!(calls(&h), (5, 1));
    assert_eq!(h.backend.count("leave"), 0);
    release(&mut h, &holder);
    assert_eq!(*order.borrow(), ["holder", "waiter"]);
}

#[test]
fn an_aborted_waiter_leaves_the_queue_at_once() {
    let mut h = Harness::new();
    let order = Rc::new(RefCell::new(Vec::new()));
    let holder = queue_up(&mut h, "holder", &order, None);
    let abort = Abort::new();
    let _quitter = queue_up(&mut h, "quitter", &order, Some(abort.clone()));
    let _next = queue_up(&mut h, "next", &order, None);
    abort.abort();
    h.pool.run_until_stalled();
    release(&mut h, &holder);
    assert_eq!(*order.borrow(), ["holder", "next"]);
    assert!(h.backend.count("leave") >= 1);
}

#[test]
fn a_dead_waiter_holds_up_the_queue_for_at_most_its_place_lease() {
    let mut h = Harness::new();
    let order = Rc::new(RefCell::new(Vec::new()));
    let holder = queue_up(&mut h, "holder", &order, None);
    // A waiter of another process that dies in the queue: it asked once, never again.
    let queue = h.backend.inner.queue().unwrap();
    let ghost =
        h.pool
            .run_until(queue.acquire_queued("k", "t", 10_000, "ghost", QUEUE_LEASE_MS, false));
    assert_eq!(
        ghost.unwrap(),
        Queued::Waiting {
            retry_in: Some(10_000.0)
        }
    );
    let _live = queue_up(&mut h, "live", &order, None);
    release(&mut h, &holder);
    h.run_to(1000.0 + QUEUE_LEASE_MS as f64 - 10.0);
    assert_eq!(*order.borrow(), ["holder"], "the ghost's place still lives");
    h.run_to(1000.0 + QUEUE_LEASE_MS as f64 + QUEUE_RECHECK_MS + 10.0);
    assert_eq!(*order.borrow(), ["holder", "live"]);
}

#[test]
fn the_head_tries_again_when_the_holders_lease_ends() {
    let mut h = Harness::new();
    let _lost = h.acquire("k", AcquireOptions::new(300));
    let order = Rc::new(RefCell::new(Vec::new()));
    let _head = queue_up(&mut h, "head", &order, None);
    h.run_to(1310.0);
    assert_eq!(
        *order.borrow(),
        ["head"],
        "woken at the lease end, not the 1 s re-check"
    );
}

#[test]
fn a_queued_waiter_rides_out_a_failing_backend_within_its_budget() {
    let mut h = Harness::new();
    let holder = h.acquire("k", AcquireOptions::new(10_000));
    let policy = RetryPolicy {
        retries: None,
        delay: Delay::Fixed(100.0),
        timeout: Some(5_000.0),
        ..Default::default()
    };
    let waiting = h.spawn_acquire("k", AcquireOptions::new(10_000).with_retry(policy.clone()));
    h.pool.run_until_stalled();
    h.backend.fail.set(true);
    h.run_to(1350.0);
    h.backend.fail.set(false);
    h.pool.run_until(holder.release(false)).unwrap();
    let lock = h
        .pool
        .run_until(waiting)
        .expect("the wait went on after the failures");
    assert!(h.pool.run_until(lock.release(false)).unwrap());

    // A backend that stays down until the budget ends: the failure, not contention.
    let _holder = h.acquire("k", AcquireOptions::new(10_000));
    let waiting = h.spawn_acquire("k", AcquireOptions::new(10_000).with_retry(policy));
    h.pool.run_until_stalled();
    h.backend.fail.set(true);
    h.run_to(h.clock.now() + 5_100.0);
    let err = h.pool.run_until(waiting).err().unwrap();
    assert!(
        matches!(
            err,
            Error::Backend {
                kind: BackendErrorKind::Io,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_failed_acquisition_reads_the_holder_once_after_its_last_attempt() {
    let mut h = Harness::new();
    let _held = h.acquire("k", AcquireOptions::new(10_000).with_holder("worker-a"));
    let policy = RetryPolicy {
        retries: Some(3),
        delay: Delay::Fixed(100.0),
        timeout: None,
        ..Default::default()
    };
    let task = h.spawn_acquire("k", AcquireOptions::new(100).with_retry(policy));
    h.run_to(1250.0);
    assert_eq!(h.backend.count("inspect"), 0, "no read while retrying");
    h.run_to(1400.0);
    match h.pool.run_until(task) {
        Err(Error::Held {
            holder, attempts, ..
        }) => {
            assert_eq!(holder.as_deref(), Some("worker-a"));
            assert_eq!(attempts, 4);
        }
        other => panic!("expected Held, got {other:?}"),
    }
    assert_eq!(h.backend.count("inspect"), 1);
}

#[test]
fn a_slow_holder_read_does_not_hold_the_error_back_by_more_than_250_ms() {
    let mut h = Harness::new();
    let _held = h.acquire("k", AcquireOptions::new(10_000).with_holder("worker-a"));
    h.backend.hold_verb.set(Some("inspect"));
    h.hold_answers();
    let policy = RetryPolicy {
        retries: Some(1),
        delay: Delay::Fixed(100.0),
        timeout: None,
        ..Default::default()
    };
    let started = h.clock.now();
    let (locker, clock) = (h.locker.clone(), h.clock.clone());
    // When the acquisition ended, and how (an error's text).
    type Outcome = Option<(f64, Option<String>)>;
    let outcome: Rc<RefCell<Outcome>> = Rc::default();
    let seen = outcome.clone();
    h.pool
        .spawner()
        .spawn_local(async move {
            let options = AcquireOptions::new(100).with_retry(policy);
            match locker.acquire("k", options, None).await {
                Err(Error::Held { holder, .. }) => *seen.borrow_mut() = Some((clock.now(), holder)),
                other => panic!("expected Held, got {other:?}"),
            }
        })
        .unwrap();
    h.run_to(started + 1000.0);
    // The last attempt fails at +100; the stuck read is given up 250 ms later.
    let (at, holder) = outcome
        .borrow()
        .clone()
        .expect("the acquisition never ended");
    assert_eq!(holder, None);
    assert!(
        (at - (started + 350.0)).abs() <= 2.0,
        "ended at +{}",
        at - started
    );
    assert_eq!(h.backend.count("inspect"), 1);
}

#[test]
fn a_custom_token_with_the_stored_values_marks_is_refused() {
    for bad in [
        "locco:reserved|w1",
        "abc|locco:waited",
        "abc|locco:holder=me",
        "",
    ] {
        let mut h = Harness::with(move |o| o.token = Some(Rc::new(move || Ok(bad.to_owned()))));
        let locker = h.locker.clone();
        let got = h
            .pool
            .run_until(async move { locker.acquire("k", AcquireOptions::new(1000), None).await });
        match got {
            Err(Error::Validation { field, .. }) => assert_eq!(field, "token", "{bad:?}"),
            other => panic!("{bad:?}: expected a ValidationError, got {other:?}"),
        }
        assert!(h.backend.inner.is_empty(), "{bad:?} was sent");
    }
    let mut h = Harness::with(|o| o.token = Some(Rc::new(|| Ok("host-7|pid-42".to_owned()))));
    let lock = h.acquire("k", AcquireOptions::new(1000));
    assert_eq!(lock.token(), "host-7|pid-42");
}

#[test]
fn a_grant_answered_after_the_clock_passed_its_lease_in_flight_is_late_not_unanswered() {
    let mut h = Harness::new();
    *h.backend.jump_clock.borrow_mut() = Some(h.clock.clone());
    h.backend.jump_by.set(250.0);
    // tryAcquire: the grant is given back, and the error says late-acquire.
    h.backend.jumps.set(1);
    let locker = h.locker.clone();
    let single = h
        .pool
        .run_until(async move { locker.try_acquire("k", AcquireOptions::new(100)).await });
    match single {
        Err(Error::Held { reason, .. }) => assert_eq!(reason, HeldReason::LateAcquire),
        other => panic!("expected late-acquire, got {other:?}"),
    }
    assert_eq!(h.events(), ["contended:late"]);
    assert_eq!(
        h.backend.count("release"),
        1,
        "the late grant was not given back"
    );
    // acquire: `contended` with reason late, then a retry that wins.
    h.backend.jumps.set(1);
    let task = h.spawn_acquire("j", AcquireOptions::new(100).with_retry(retries(3, 10.0)));
    h.run_to(h.clock.now() + 50.0);
    let lock = h.pool.run_until(task).expect("the retry wins");
    assert_eq!(lock.state(), LockState::Held);
    assert_eq!(h.events(), ["contended:late", "contended:late", "acquired"]);
    // No answer at all is still a backend timeout.
    h.hold_answers();
    let locker = h.locker.clone();
    let silent = h.pool.spawner().spawn_local_with_handle(async move {
        locker.try_acquire("m", AcquireOptions::new(100)).await
    });
    let silent = silent.unwrap();
    h.run_to(h.clock.now() + 200.0);
    assert!(matches!(
        h.pool.run_until(silent),
        Err(Error::Backend {
            kind: BackendErrorKind::Timeout,
            ..
        })
    ));
}
