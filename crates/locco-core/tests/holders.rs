//! Counting semaphores and read-write locks on a manual clock: room is counted, leases are each
//! holder's own, a waiting writer keeps new readers out, and a random run of readers, writers,
//! releases and crashes never shows a writer beside anyone.

use std::cell::Cell;
use std::rc::Rc;

use futures_executor::LocalPool;
use futures_util::future::RemoteHandle;
use futures_util::task::LocalSpawnExt;
use locco_core::*;

struct Spawner(futures_executor::LocalSpawner);
impl Spawn for Spawner {
    fn spawn(&self, task: LocalFuture<()>) {
        self.0.spawn_local(task).unwrap();
    }
}

/// The in-memory backend, with extensions that can be made to fail (a transient error), and
/// looks at read slots and releases that can be made slow (the clock moves on while one is
/// answered).
struct Flaky {
    inner: Rc<MemoryBackend>,
    fail_extend: Cell<bool>,
    clock: Rc<ManualClock>,
    read_takes_ms: Cell<f64>,
    release_takes_ms: Cell<f64>,
}

impl Backend for Flaky {
    fn name(&self) -> &str {
        "flaky"
    }
    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let answer = self.inner.acquire(key, token, ttl);
        if key.contains(":read:") {
            self.clock.advance(self.read_takes_ms.get());
        }
        answer
    }
    fn release(&self, key: &str, token: &str) -> Op<bool> {
        let takes = self.release_takes_ms.get();
        if takes > 0.0 {
            let answered = Timer::sleep(&self.clock, takes);
            let (inner, key, token) = (self.inner.clone(), key.to_owned(), token.to_owned());
            return Op::pending(async move {
                answered.await;
                inner.release(&key, &token).await
            });
        }
        self.inner.release(key, token)
    }
    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        if self.fail_extend.get() {
            return Op::ready(Err(Error::backend(
                "flaky",
                BackendErrorKind::Io,
                "connection reset",
            )));
        }
        self.inner.extend(key, token, ttl)
    }
    fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        self.inner.is_held(key, token)
    }
    fn supports_fencing(&self) -> bool {
        true
    }
    fn acquire_fenced(&self, key: &str, token: &str, ttl: u32) -> Op<Option<u64>> {
        self.inner.acquire_fenced(key, token, ttl)
    }
    fn queue(&self) -> Option<&dyn Queue> {
        self.inner.queue()
    }
    fn inspect(&self, key: &str) -> Op<KeyInfo> {
        self.inner.inspect(key)
    }
    fn force_release(&self, key: &str) -> Op<bool> {
        self.inner.force_release(key)
    }
}

struct Harness {
    pool: LocalPool,
    clock: Rc<ManualClock>,
    backend: Rc<Flaky>,
    locker: Locker,
}

impl Harness {
    fn new(fencing: bool) -> Self {
        let pool = LocalPool::new();
        let clock = ManualClock::new(1000.0);
        let backend = Rc::new(Flaky {
            inner: Rc::new(MemoryBackend::new(clock.clone())),
            fail_extend: Cell::new(false),
            clock: clock.clone(),
            read_takes_ms: Cell::new(0.0),
            release_takes_ms: Cell::new(0.0),
        });
        let rt = Runtime::system(Rc::new(Spawner(pool.spawner())))
            .with_clock(clock.clone())
            .with_timer(Rc::new(clock.clone()));
        let options = LockerOptions {
            fencing,
            ..Default::default()
        };
        let locker = Locker::new(backend.clone(), rt, options).unwrap();
        Harness {
            pool,
            clock,
            backend,
            locker,
        }
    }

    fn run_to(&mut self, t: f64) {
        while self.clock.now() < t {
            self.pool.run_until_stalled();
            self.clock.advance(1.0);
        }
        self.pool.run_until_stalled();
    }

    fn try_take(&mut self, holders: Slot, ttl: u32) -> Option<Lock> {
        let locker = self.locker.clone();
        self.pool.run_until(async move {
            locker
                .acquire_holder("r", holders, AcquireOptions::new(ttl), None, true)
                .await
                .unwrap()
        })
    }

    fn spawn_take(
        &self,
        holders: Slot,
        options: AcquireOptions,
    ) -> RemoteHandle<Result<Option<Lock>>> {
        let locker = self.locker.clone();
        self.pool
            .spawner()
            .spawn_local_with_handle(async move {
                locker
                    .acquire_holder("r", holders, options, None, false)
                    .await
            })
            .unwrap()
    }

    fn release(&mut self, lock: &Lock) -> bool {
        let lock = lock.clone();
        self.pool
            .run_until(async move { lock.release(true).await.unwrap() })
    }
}

fn patient(ttl: u32) -> AcquireOptions {
    AcquireOptions::new(ttl).with_retry(RetryPolicy {
        retries: None,
        delay: Delay::Fixed(50.0),
        timeout: Some(60_000.0),
        ..Default::default()
    })
}

const PERMITS: Slot = Slot::Permit { limit: 3 };
const READ: Slot = Slot::Read { max_readers: 4 };
const WRITE: Slot = Slot::Write { max_readers: 4 };

#[test]
fn a_semaphore_admits_limit_holders_each_on_its_own_slot() {
    let mut h = Harness::new(false);
    let held: Vec<Lock> = (0..3)
        .map(|_| h.try_take(PERMITS, 10_000).unwrap())
        .collect();
    let mut keys: Vec<&str> = held.iter().map(|l| l.key()).collect();
    keys.sort();
    assert_eq!(keys, ["r:permit:0", "r:permit:1", "r:permit:2"]);
    assert!(h.try_take(PERMITS, 10_000).is_none(), "a fourth permit");
    assert!(h.release(&held[1]));
    let again = h.try_take(PERMITS, 10_000).expect("the freed permit");
    assert_eq!(again.key(), held[1].key());
}

#[test]
fn a_crashed_holders_permit_frees_when_its_lease_ends_and_not_before() {
    let mut h = Harness::new(false);
    let _a = h.try_take(PERMITS, 10_000).unwrap();
    let _b = h.try_take(PERMITS, 10_000).unwrap();
    let _crashed = h.try_take(PERMITS, 2_000).unwrap(); // never released nor extended
    let mut waiter = h.spawn_take(PERMITS, patient(10_000));
    h.run_to(2_900.0);
    let early = h
        .pool
        .run_until(futures_util::future::poll_immediate(&mut waiter));
    assert!(
        early.is_none(),
        "a permit came before the crashed holder's lease ended"
    );
    h.run_to(3_200.0);
    let lock = h.pool.run_until(waiter).unwrap().expect("a permit");
    assert_eq!(lock.state(), LockState::Held);
}

#[test]
fn readers_share_and_a_writer_is_alone() {
    let mut h = Harness::new(true);
    let r1 = h.try_take(READ, 10_000).unwrap();
    let r2 = h.try_take(READ, 10_000).unwrap();
    assert_ne!(r1.key(), r2.key());
    assert!(
        h.try_take(WRITE, 10_000).is_none(),
        "a writer beside readers"
    );
    // The failed try left neither the write key nor a look behind.
    assert!(h.release(&r1) && h.release(&r2));
    let w = h
        .try_take(WRITE, 10_000)
        .expect("the writer, once readers left");
    assert_eq!(w.key(), "r:write");
    assert!(w.fence().is_some(), "a fenced Locker gives writers fences");
    assert!(
        h.try_take(READ, 10_000).is_none(),
        "a reader beside the writer"
    );
    assert!(h.try_take(WRITE, 10_000).is_none(), "a second writer");
    assert!(h.release(&w));
    let w2 = h.try_take(WRITE, 10_000).unwrap();
    assert!(w2.fence() > w.fence(), "writer fences grow");
}

#[test]
fn a_waiting_writer_keeps_new_readers_out_and_gets_in_when_readers_leave() {
    let mut h = Harness::new(false);
    let reader = h.try_take(READ, 10_000).unwrap();
    let writer = h.spawn_take(WRITE, patient(5_000));
    h.run_to(1_500.0);
    assert!(
        h.try_take(READ, 10_000).is_none(),
        "a new reader got in past a waiting writer"
    );
    assert!(h.release(&reader));
    h.run_to(1_700.0);
    let w = h.pool.run_until(writer).unwrap().expect("the writer");
    // It waited, so its lease was renewed in full once the readers were gone.
    assert!(
        w.lease_end() > 1_500.0 + 5_000.0 * 0.99,
        "{}",
        w.lease_end()
    );
    assert!(h.try_take(READ, 10_000).is_none());
}

#[test]
fn an_expired_reader_holds_a_writer_only_until_its_own_lease_ends() {
    let mut h = Harness::new(false);
    let _dead = h.try_take(READ, 3_000).unwrap(); // crashes: never released; its lease ends at 4000
    let mut writer = h.spawn_take(WRITE, patient(5_000));
    h.run_to(3_900.0);
    let early = h
        .pool
        .run_until(futures_util::future::poll_immediate(&mut writer));
    assert!(early.is_none(), "the writer got in beside a live reader");
    h.run_to(4_200.0);
    let w = h.pool.run_until(writer).unwrap().expect("the writer");
    assert_eq!(w.state(), LockState::Held);
}

#[test]
fn a_writer_waiting_longer_than_its_ttl_keeps_its_write_key() {
    let mut h = Harness::new(false);
    let reader = h.try_take(READ, 60_000).unwrap();
    let mut writer = h.spawn_take(WRITE, patient(2_000));
    h.run_to(8_000.0);
    let pending = h
        .pool
        .run_until(futures_util::future::poll_immediate(&mut writer));
    assert!(pending.is_none(), "the writer got in beside a live reader");
    assert!(
        h.try_take(READ, 1_000).is_none(),
        "the waiting writer's key ran out"
    );
    assert!(h.release(&reader));
    h.run_to(8_300.0);
    let w = h.pool.run_until(writer).unwrap().expect("the writer");
    assert_eq!(w.state(), LockState::Held);
    assert!(w.lease_end() > 8_000.0 + 1_900.0, "{}", w.lease_end());
}

#[test]
fn a_writer_that_cannot_drain_in_time_gives_the_write_key_back() {
    let mut h = Harness::new(false);
    let _reader = h.try_take(READ, 60_000).unwrap();
    let options = AcquireOptions::new(5_000).with_retry(RetryPolicy {
        retries: None,
        delay: Delay::Fixed(50.0),
        timeout: Some(500.0),
        ..Default::default()
    });
    let writer = h.spawn_take(WRITE, options);
    h.run_to(1_600.0);
    match h.pool.run_until(writer) {
        Err(Error::Held { key, .. }) => assert_eq!(key, "r"),
        other => panic!("expected Held, got {other:?}"),
    }
    h.run_to(1_700.0);
    assert!(
        h.try_take(READ, 1_000).is_some(),
        "the write key was left held"
    );
}

#[test]
fn a_writer_whose_renewal_fails_once_the_readers_left_gives_the_write_key_back() {
    let mut h = Harness::new(false);
    let reader = h.try_take(READ, 60_000).unwrap();
    let writer = h.spawn_take(WRITE, patient(5_000));
    h.run_to(1_500.0);
    // The writer waited, so it renews its lease once the readers are gone: that fails.
    h.backend.fail_extend.set(true);
    assert!(h.release(&reader));
    h.run_to(1_700.0);
    match h.pool.run_until(writer) {
        Err(Error::Backend { kind, .. }) => assert_eq!(kind, BackendErrorKind::Io),
        other => panic!("expected the renewal's failure, got {other:?}"),
    }
    h.backend.fail_extend.set(false);
    h.pool.run_until_stalled();
    assert!(
        h.try_take(READ, 1_000).is_some(),
        "the write key was left held for the writer's whole ttl"
    );
}

#[test]
fn a_writer_dropped_while_it_waits_gives_the_write_key_back() {
    let mut h = Harness::new(false);
    let _reader = h.try_take(READ, 60_000).unwrap();
    let writer = h.spawn_take(WRITE, patient(5_000));
    h.run_to(1_500.0);
    drop(writer); // the caller went away (a worker torn down, a process exiting)
    h.run_to(1_700.0);
    assert!(
        h.try_take(READ, 1_000).is_some(),
        "the write key was left held for the writer's whole ttl"
    );
}

#[test]
fn a_permit_waiter_dropped_while_it_waits_gives_its_turn_back() {
    let mut h = Harness::new(false);
    let held: Vec<Lock> = (0..3)
        .map(|_| h.try_take(PERMITS, 60_000).unwrap())
        .collect();
    let waiter = h.spawn_take(PERMITS, patient(10_000));
    h.run_to(1_500.0);
    drop(waiter);
    h.run_to(1_700.0);
    assert!(h.release(&held[0]));
    assert!(
        h.try_take(PERMITS, 1_000).is_some(),
        "the waiters' turn was left held: nobody may take the free permit"
    );
}

#[test]
fn a_permit_waiter_with_a_ttl_below_the_recheck_pause_keeps_its_turn() {
    let mut h = Harness::new(false);
    let held: Vec<Lock> = (0..3)
        .map(|_| h.try_take(PERMITS, 60_000).unwrap())
        .collect();
    let waiter = h.spawn_take(PERMITS, patient(50));
    h.run_to(1_600.0);
    assert!(h.release(&held[1]));
    h.run_to(1_700.0);
    match h.pool.run_until(waiter) {
        Ok(Some(lock)) => assert_eq!(lock.key(), held[1].key()),
        other => panic!("expected the freed permit, got {other:?}"),
    }
}

#[test]
fn a_writer_with_a_ttl_below_the_recheck_pause_keeps_its_write_key() {
    let mut h = Harness::new(false);
    let reader = h.try_take(READ, 60_000).unwrap();
    let writer = h.spawn_take(WRITE, patient(50));
    h.run_to(1_600.0);
    assert!(
        h.try_take(READ, 1_000).is_none(),
        "a new reader got in past a waiting writer"
    );
    assert!(h.release(&reader));
    h.run_to(1_700.0);
    match h.pool.run_until(writer) {
        Ok(Some(lock)) => assert_eq!(lock.key(), "r:write"),
        other => panic!("expected the write, got {other:?}"),
    }
}

#[test]
fn a_write_key_lost_while_waiting_is_taken_again_not_reported() {
    let mut h = Harness::new(false);
    let reader = h.try_take(READ, 60_000).unwrap();
    let writer = h.spawn_take(WRITE, patient(400));
    h.run_to(1_500.0);
    // An operator (or a restart without persistence) takes the write key away.
    let forced = h.backend.inner.force_release("r:write");
    assert!(h.pool.run_until(forced).unwrap());
    h.run_to(2_000.0);
    assert!(
        h.try_take(READ, 1_000).is_none(),
        "the writer did not take its key again"
    );
    assert!(h.release(&reader));
    h.run_to(2_200.0);
    match h.pool.run_until(writer) {
        Ok(Some(lock)) => assert_eq!(lock.state(), LockState::Held),
        other => panic!("expected the write, got {other:?}"),
    }
}

#[test]
fn a_turn_lost_while_waiting_is_taken_again_not_reported() {
    let mut h = Harness::new(false);
    let held: Vec<Lock> = (0..3)
        .map(|_| h.try_take(PERMITS, 60_000).unwrap())
        .collect();
    let waiter = h.spawn_take(PERMITS, patient(400));
    h.run_to(1_500.0);
    let forced = h.backend.inner.force_release("r:turn");
    assert!(h.pool.run_until(forced).unwrap());
    h.run_to(2_000.0);
    assert!(h.release(&held[2]));
    h.run_to(2_200.0);
    match h.pool.run_until(waiter) {
        Ok(Some(lock)) => assert_eq!(lock.key(), held[2].key()),
        other => panic!("expected the freed permit, got {other:?}"),
    }
}

#[test]
fn a_write_key_lost_while_a_single_try_looks_at_the_readers_is_a_late_grant() {
    let mut h = Harness::new(false);
    // Each look at a read slot is answered 300 ms on: the write key's 100 ms lease runs out.
    h.backend.read_takes_ms.set(300.0);
    let locker = h.locker.clone();
    let answer = h.pool.run_until(async move {
        locker
            .acquire_holder("r", WRITE, AcquireOptions::new(100), None, true)
            .await
    });
    match answer {
        Err(Error::Held {
            reason: HeldReason::LateAcquire,
            ..
        }) => {}
        other => panic!("expected a late grant (LockHeldError late-acquire), got {other:?}"),
    }
    h.backend.read_takes_ms.set(0.0);
    assert!(
        h.try_take(WRITE, 1_000).is_some(),
        "the write key was not given back"
    );
}

#[test]
fn a_permit_taken_while_its_locker_closes_is_given_back_not_returned() {
    let mut h = Harness::new(false);
    let held: Vec<Lock> = (0..3)
        .map(|_| h.try_take(PERMITS, 60_000).unwrap())
        .collect();
    let waiter = h.spawn_take(PERMITS, patient(1_000));
    h.run_to(1_200.0);
    // The waiter holds the turn; a permit frees, and the turn's give-back is slow.
    h.backend.release_takes_ms.set(100.0);
    let freed = held[0].key();
    assert!(h
        .pool
        .run_until(h.backend.inner.force_release(freed))
        .unwrap());
    let held_now = |h: &mut Harness| {
        h.pool
            .run_until(h.backend.inner.inspect(freed))
            .unwrap()
            .held
    };
    let mut t = 1_200.0;
    while !held_now(&mut h) {
        t += 1.0;
        assert!(t < 3_000.0, "the waiter never took the freed permit");
        h.run_to(t);
    }
    // Taken, and still giving its turn back: the Locker closes now.
    h.locker.close();
    h.run_to(t + 300.0);
    match h.pool.run_until(waiter) {
        Err(Error::State(_)) => {}
        other => panic!("a closed Locker handed out a permit: {other:?}"),
    }
    assert!(!held_now(&mut h), "the permit was not given back");
}

#[test]
fn counts_are_validated_with_the_field_named() {
    for bad in [0.0, 1.5, 1025.0, f64::NAN] {
        match Slot::count("limit", bad) {
            Err(Error::Validation { field, .. }) => assert_eq!(field, "limit"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert_eq!(Slot::count("maxReaders", 1024.0).unwrap(), 1024);
}

/// splitmix64, seeded: the same run on every machine.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

#[test]
fn random_readers_writers_and_crashes_never_put_a_writer_beside_anyone() {
    for seed in 0..40u64 {
        let mut rng = Rng(seed);
        let mut h = Harness::new(false);
        type Pending = Vec<(bool, RemoteHandle<Result<Option<Lock>>>)>;
        let mut pending: Pending = Vec::new();
        let mut held: Vec<(bool, Lock)> = Vec::new();
        let mut grants = 0;
        for step in 0..300 {
            match rng.below(10) {
                0..=3 => {
                    let write = rng.below(3) == 0;
                    let ttl = 200 + rng.below(2_000) as u32;
                    let holders = if write { WRITE } else { READ };
                    let options = AcquireOptions::new(ttl).with_retry(RetryPolicy {
                        retries: None,
                        delay: Delay::Fixed(10.0 + rng.below(90) as f64),
                        timeout: Some(rng.below(3_000) as f64),
                        ..Default::default()
                    });
                    pending.push((write, h.spawn_take(holders, options)));
                }
                4..=5 if !held.is_empty() => {
                    let (_, lock) = held.remove(rng.below(held.len() as u64) as usize);
                    let _ = h.release(&lock);
                }
                6 if !held.is_empty() => {
                    // A crash: the holder vanishes, its lease runs out on its own.
                    held.remove(rng.below(held.len() as u64) as usize);
                }
                _ => {
                    let to = h.clock.now() + rng.below(300) as f64;
                    h.run_to(to);
                }
            }
            let mut still = Vec::new();
            for (write, task) in pending.drain(..) {
                let mut task = task;
                match h
                    .pool
                    .run_until(futures_util::future::poll_immediate(&mut task))
                {
                    Some(Ok(Some(lock))) => {
                        grants += 1;
                        held.push((write, lock));
                    }
                    Some(Ok(None)) => unreachable!("a waiting acquisition answers a lock"),
                    Some(Err(_)) => {}
                    None => still.push((write, task)),
                }
            }
            pending = still;
            let live: Vec<bool> = held
                .iter()
                .filter(|(_, l)| l.state() == LockState::Held)
                .map(|(w, _)| *w)
                .collect();
            let writers = live.iter().filter(|w| **w).count();
            assert!(
                writers == 0 || live.len() == 1,
                "seed {seed} step {step}: {writers} writer(s) among {} live holders",
                live.len()
            );
        }
        assert!(
            grants > 20,
            "seed {seed}: only {grants} grants: the run tests little"
        );
    }
}
