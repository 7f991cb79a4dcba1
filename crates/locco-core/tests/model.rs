//! A model-based test of the engine: random sequences of acquire, try_acquire, acquire_many,
//! extend, release, abort, clock steps and jumps, over a backend whose answers may come late,
//! never, or as failures. After every step it checks the two promises of a lock:
//!
//! - never two live holders: two locks of one key never both read `held` at one instant;
//! - a lock reads `held` only within its lease: whenever it does, the backend (the reference
//!   state of who holds what) has its key under its token, unexpired;
//! - what an acquisition returns is held at that moment, and fencing tokens grow per key.
//!
//! Cases in which releases are never faulty also check, once everything settled, that no
//! grant was left behind that no lock knows of (a give-back that never happened).
//!
//! A seeded generator, not a shrinking framework: a failure prints its seed and the steps of
//! its case, and `LOCCO_MODEL_SEED=<seed>` replays just that case.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use futures_executor::LocalPool;
use futures_util::task::LocalSpawnExt;
use locco_core::*;

/// splitmix64: small, fast, and the same sequence on every machine.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

struct Spawner(futures_executor::LocalSpawner);
impl Spawn for Spawner {
    fn spawn(&self, task: LocalFuture<()>) {
        self.0.spawn_local(task).unwrap();
    }
}

/// What happens to one request.
#[derive(Debug, Clone, Copy)]
enum Fate {
    Prompt,
    /// The answer comes `ms` later; the request was applied at once or only then.
    Late {
        ms: f64,
        applied_first: bool,
    },
    /// No answer ever; the request may still have been applied.
    Never {
        applied: bool,
    },
    /// An error answer; the request may still have been applied (the reply was lost).
    Fail {
        applied: bool,
    },
}

/// The chance that a request of each verb meets a fault.
#[derive(Clone, Copy, Debug)]
struct Faults {
    acquire: f64,
    extend: f64,
    release: f64,
}

/// The in-memory backend behind a network that may delay, lose or fail any request.
struct Faulty {
    inner: Rc<MemoryBackend>,
    clock: Rc<ManualClock>,
    rng: RefCell<Rng>,
    faults: Cell<Faults>,
    log: Rc<RefCell<Vec<String>>>,
    /// Tokens with a grant request still waiting for its answer.
    asking: Rc<RefCell<HashMap<String, u32>>>,
}

/// Counts a grant request as waiting for its answer until it has one.
struct Asking {
    token: String,
    asking: Rc<RefCell<HashMap<String, u32>>>,
}

impl Drop for Asking {
    fn drop(&mut self) {
        let mut asking = self.asking.borrow_mut();
        let n = asking.get_mut(&self.token).expect("counted");
        *n -= 1;
        if *n == 0 {
            asking.remove(&self.token);
        }
    }
}

fn now_of<T>(op: Op<T>) -> Result<T> {
    // The in-memory backend answers at once (and this may run inside the pool, where
    // blocking on a future is not allowed).
    match op {
        Op::Ready(Some(answer)) => answer,
        _ => panic!("the in-memory backend answered later"),
    }
}

impl Faulty {
    fn fate(&self, p: f64) -> Fate {
        let mut rng = self.rng.borrow_mut();
        if !rng.chance(p) {
            return Fate::Prompt;
        }
        match rng.below(8) {
            0..=3 => Fate::Late {
                ms: rng.range(1, 400) as f64,
                applied_first: rng.chance(0.5),
            },
            4 | 5 => Fate::Never {
                applied: rng.chance(0.5),
            },
            _ => Fate::Fail {
                applied: rng.chance(0.5),
            },
        }
    }

    fn run<T: 'static>(
        &self,
        verb: &str,
        key: &str,
        token: &str,
        p: f64,
        apply: impl FnOnce() -> Result<T> + 'static,
    ) -> Op<T> {
        let fate = self.fate(p);
        let op = self.answer(fate, verb, key, token, apply);
        if !verb.starts_with("acquire") || matches!(op, Op::Ready(_)) {
            return op;
        }
        *self
            .asking
            .borrow_mut()
            .entry(token.to_owned())
            .or_default() += 1;
        let asking = Asking {
            token: token.to_owned(),
            asking: self.asking.clone(),
        };
        Op::pending(async move {
            let answer = op.await;
            drop(asking);
            answer
        })
    }

    fn answer<T: 'static>(
        &self,
        fate: Fate,
        verb: &str,
        key: &str,
        token: &str,
        apply: impl FnOnce() -> Result<T> + 'static,
    ) -> Op<T> {
        if !matches!(fate, Fate::Prompt) {
            self.log.borrow_mut().push(format!(
                "  @{} {verb}({key}, {token}) -> {fate:?}",
                self.clock.now()
            ));
        }
        let failure = || Err(Error::backend("faulty", BackendErrorKind::Io, "injected"));
        match fate {
            Fate::Prompt => Op::ready(apply()),
            Fate::Late {
                ms,
                applied_first: true,
            } => {
                let answer = apply();
                let wait = Timer::sleep(&self.clock, ms);
                Op::pending(async move {
                    wait.await;
                    answer
                })
            }
            Fate::Late { ms, .. } => {
                let wait = Timer::sleep(&self.clock, ms);
                Op::pending(async move {
                    wait.await;
                    apply()
                })
            }
            Fate::Never { applied } => {
                if applied {
                    let _ = apply();
                }
                Op::pending(std::future::pending())
            }
            Fate::Fail { applied } => {
                if applied {
                    let _ = apply();
                }
                Op::ready(failure())
            }
        }
    }
}

impl Backend for Faulty {
    fn name(&self) -> &str {
        "faulty"
    }
    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let (me, k, t) = (self.inner.clone(), key.to_owned(), token.to_owned());
        let p = self.faults.get().acquire;
        self.run("acquire", key, token, p, move || {
            now_of(me.acquire(&k, &t, ttl))
        })
    }
    fn release(&self, key: &str, token: &str) -> Op<bool> {
        let (me, k, t) = (self.inner.clone(), key.to_owned(), token.to_owned());
        let p = self.faults.get().release;
        self.run("release", key, token, p, move || now_of(me.release(&k, &t)))
    }
    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let (me, k, t) = (self.inner.clone(), key.to_owned(), token.to_owned());
        let p = self.faults.get().extend;
        self.run("extend", key, token, p, move || {
            now_of(me.extend(&k, &t, ttl))
        })
    }
    fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        self.inner.is_held(key, token)
    }
    fn supports_fencing(&self) -> bool {
        true
    }
    fn acquire_fenced(&self, key: &str, token: &str, ttl: u32) -> Op<Option<u64>> {
        let (me, k, t) = (self.inner.clone(), key.to_owned(), token.to_owned());
        let p = self.faults.get().acquire;
        self.run("acquireFenced", key, token, p, move || {
            now_of(me.acquire_fenced(&k, &t, ttl))
        })
    }
    fn waiter(&self, key: &str) -> Option<Box<dyn Waiter>> {
        self.inner.waiter(key)
    }
}

/// A lock the test got, and whether the test has given it up (called release). A holder that
/// asked to release no longer acts as one, whatever the answer, so it is not counted.
struct Tracked {
    lock: Lock,
    given_up: Rc<Cell<bool>>,
}

#[derive(Default)]
struct World {
    locks: RefCell<Vec<Tracked>>,
    /// Acquisitions still running.
    running: Cell<u32>,
    /// Results the engine must never give here.
    wrong: RefCell<Vec<String>>,
    /// The largest fencing token handed out per key.
    fences: RefCell<HashMap<String, u64>>,
}

const KEYS: [&str; 2] = ["a", "b"];

struct Case {
    rng: Rng,
    pool: LocalPool,
    clock: Rc<ManualClock>,
    backend: Rc<Faulty>,
    lockers: Vec<Locker>,
    world: Rc<World>,
    aborts: Vec<Abort>,
    log: Rc<RefCell<Vec<String>>>,
    leak_check: bool,
}

impl Case {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let pool = LocalPool::new();
        let clock = ManualClock::new(1000.0);
        let level = [0.0, 0.1, 0.3][rng.below(3) as usize];
        let leak_check = rng.chance(0.5);
        let faults = Faults {
            acquire: level,
            extend: level,
            release: if leak_check { 0.0 } else { level },
        };
        let log = Rc::new(RefCell::new(vec![format!(
            "seed {seed}: {faults:?}, leak check {leak_check}"
        )]));
        let backend = Rc::new(Faulty {
            inner: Rc::new(MemoryBackend::new(clock.clone())),
            clock: clock.clone(),
            rng: RefCell::new(Rng(rng.next())),
            faults: Cell::new(faults),
            log: log.clone(),
            asking: Rc::default(),
        });
        let tokens = Rc::new(Cell::new(0u64));
        let lockers = (0..2)
            .map(|_| {
                let rt = Runtime {
                    clock: clock.clone(),
                    timer: Rc::new(clock.clone()),
                    spawner: Rc::new(Spawner(pool.spawner())),
                };
                let t = tokens.clone();
                let options = LockerOptions {
                    fencing: rng.chance(0.3),
                    token: Some(Rc::new(move || {
                        t.set(t.get() + 1);
                        Ok(format!("t{}", t.get()))
                    })),
                    ..Default::default()
                };
                Locker::new(backend.clone(), rt, options).unwrap()
            })
            .collect();
        Case {
            rng,
            pool,
            clock,
            backend,
            lockers,
            world: Rc::default(),
            aborts: Vec::new(),
            log,
            leak_check,
        }
    }

    fn note(&self, line: String) {
        self.log.borrow_mut().push(line);
    }

    fn options(&mut self) -> AcquireOptions {
        let r = &mut self.rng;
        let ttl = r.range(20, 300) as u32;
        let retry = RetryPolicy {
            retries: Some(r.range(0, 3) as u32),
            delay: Delay::Fixed(r.range(0, 60) as f64),
            timeout: r.chance(0.2).then(|| r.range(10, 400) as f64),
            ..Default::default()
        };
        let mut o = AcquireOptions::new(ttl).with_retry(retry);
        if r.chance(0.3) {
            o = o.with_auto_extend(AutoExtend {
                interval: None,
                max_hold: r.range(50, 1500) as f64,
                max_event_loop_lag: None,
            });
        }
        o
    }

    fn spawn_acquire(&mut self) {
        let locker = self.lockers[self.rng.below(2) as usize].clone();
        let key = KEYS[self.rng.below(2) as usize];
        let options = self.options();
        let kind = self.rng.below(4);
        let abort = (kind == 0 || self.rng.chance(0.3)).then(Abort::new);
        if let Some(a) = &abort {
            self.aborts.push(a.clone());
        }
        // A set being taken holds locks nobody outside knows of yet: not in leak-checked cases.
        let many = kind == 1 && !self.leak_check;
        let single = kind == 2;
        self.note(format!(
            "@{} {} {key} ttl {} retries {:?} delay {:?} timeout {:?} heartbeat {} abort {}",
            self.clock.now(),
            if many {
                "acquire_many a+b"
            } else if single {
                "try_acquire"
            } else {
                "acquire"
            },
            options.ttl,
            options.retry.retries,
            options.retry.delay,
            options.retry.timeout,
            options.auto_extend.is_some(),
            abort.is_some()
        ));
        let world = self.world.clone();
        world.running.set(world.running.get() + 1);
        let task = async move {
            let got: Result<Vec<Lock>> = if many {
                let keys = vec!["b".to_string(), "a".to_string()];
                locker.acquire_many(&keys, options, abort).await
            } else if single {
                locker
                    .try_acquire(key, options)
                    .await
                    .map(|l| l.into_iter().collect())
            } else {
                locker.acquire(key, options, abort).await.map(|l| vec![l])
            };
            match got {
                Ok(locks) => {
                    // What an acquisition hands over is held at that moment. (A set's last
                    // lease may run out while the others are refreshed.)
                    if !many && locks.iter().any(|l| l.state() != LockState::Held) {
                        world.wrong.borrow_mut().push(format!(
                            "an acquisition returned a lock not held: {locks:?}"
                        ));
                    }
                    for lock in locks {
                        // A key's grants are handed out in the order they were made (each
                        // ends before the next can begin), so their fences grow.
                        if let Some(fence) = lock.fence() {
                            let mut fences = world.fences.borrow_mut();
                            let last = fences.entry(lock.key().to_string()).or_insert(0);
                            if fence <= *last {
                                world
                                    .wrong
                                    .borrow_mut()
                                    .push(format!("{lock:?} got fence {fence} after fence {last}"));
                            }
                            *last = fence;
                        }
                        world.locks.borrow_mut().push(Tracked {
                            lock,
                            given_up: Rc::default(),
                        });
                    }
                }
                Err(e) => {
                    let fine = match &e {
                        Error::Held { reason, .. } => {
                            single == (*reason == HeldReason::LateAcquire)
                                || (!single && *reason == HeldReason::Held)
                        }
                        Error::Backend { .. } | Error::Aborted => true,
                        // acquire_many refreshes its first leases, which may have run out.
                        Error::Lost { .. } => many,
                        _ => false,
                    };
                    if !fine {
                        world
                            .wrong
                            .borrow_mut()
                            .push(format!("acquisition failed with {e:?}"));
                    }
                }
            }
            world.running.set(world.running.get() - 1);
        };
        self.pool.spawner().spawn_local(task).unwrap();
    }

    fn spawn_extend(&mut self, lock: Lock) {
        let ttl = self.rng.range(20, 400) as u32;
        self.note(format!("@{} extend {:?} to {ttl}", self.clock.now(), lock));
        let world = self.world.clone();
        let task = async move {
            if let Err(e) = lock.extend(ttl).await {
                if !matches!(
                    e,
                    Error::Lost { .. } | Error::State(_) | Error::Backend { .. }
                ) {
                    world
                        .wrong
                        .borrow_mut()
                        .push(format!("extend failed with {e:?}"));
                }
            }
        };
        self.pool.spawner().spawn_local(task).unwrap();
    }

    fn pick_lock(&mut self) -> Option<(Lock, Rc<Cell<bool>>)> {
        let locks = self.world.locks.borrow();
        if locks.is_empty() {
            return None;
        }
        let t = &locks[self.rng.below(locks.len() as u64) as usize];
        Some((t.lock.clone(), t.given_up.clone()))
    }

    fn step(&mut self) {
        match self.rng.below(100) {
            0..=24 => self.spawn_acquire(),
            25..=34 => {
                if let Some((lock, _)) = self.pick_lock() {
                    // Sometimes two extensions of one lock in flight at once, whose answers
                    // may come back in either order.
                    for _ in 0..self.rng.range(1, 2) {
                        self.spawn_extend(lock.clone());
                    }
                }
            }
            35..=44 => {
                if let Some((lock, given_up)) = self.pick_lock() {
                    self.note(format!("@{} release {:?}", self.clock.now(), lock));
                    given_up.set(true);
                    let last = self.rng.chance(0.5);
                    let task = async move {
                        let _ = lock.release(last).await;
                    };
                    self.pool.spawner().spawn_local(task).unwrap();
                }
            }
            45..=49 => {
                if !self.aborts.is_empty() {
                    let i = self.rng.below(self.aborts.len() as u64) as usize;
                    self.note(format!("@{} abort #{i}", self.clock.now()));
                    self.aborts.swap_remove(i).abort();
                }
            }
            50..=54 => {
                if let Some((lock, _)) = self.pick_lock() {
                    let task = async move {
                        let _ = lock.is_held().await;
                    };
                    self.pool.spawner().spawn_local(task).unwrap();
                }
            }
            55..=59 => {
                // A clock jump: a paused process, a slow event loop.
                let ms = self.rng.range(20, 400) as f64;
                self.note(format!("@{} jump {ms}", self.clock.now()));
                self.clock.advance(ms);
            }
            _ => {
                let ms = self.rng.range(1, 40);
                for _ in 0..ms {
                    self.settle();
                    self.clock.advance(1.0);
                }
            }
        }
        self.settle();
    }

    /// Runs what is ready, then checks the promises at this instant.
    fn settle(&mut self) {
        self.pool.run_until_stalled();
        if let Err(why) = self.check() {
            self.fail(&why);
        }
    }

    fn check(&self) -> std::result::Result<(), String> {
        if let Some(w) = self.world.wrong.borrow().first() {
            return Err(w.clone());
        }
        let now = self.clock.now();
        let mut holders: HashMap<&str, u64> = HashMap::new();
        for t in self.world.locks.borrow().iter() {
            if t.given_up.get() || t.lock.state() != LockState::Held {
                continue;
            }
            let (key, token) = (t.lock.key(), t.lock.token());
            if !now_of(self.backend.inner.is_held(key, token)).unwrap() {
                return Err(format!(
                    "lock {} ({key}, {token}) reads held at {now}, outside its lease in the backend",
                    t.lock.id()
                ));
            }
            if let Some(other) = holders.insert(key, t.lock.id()) {
                return Err(format!(
                    "locks {other} and {} both read held for {key} at {now}",
                    t.lock.id()
                ));
            }
        }
        if self.leak_check {
            self.check_no_leak()?;
        }
        Ok(())
    }

    /// A grant in the backend that no lock knows of, once its request has been answered, was
    /// never given back. (Releases are never faulty in these cases, so a give-back works.)
    fn check_no_leak(&self) -> std::result::Result<(), String> {
        let locks = self.world.locks.borrow();
        for key in KEYS {
            let Some(token) = now_of(Coordination::peek(&*self.backend.inner, key)).unwrap() else {
                continue;
            };
            let known = locks.iter().any(|t| t.lock.token() == token);
            if !known && !self.backend.asking.borrow().contains_key(&token) {
                return Err(format!(
                    "{key} is held in the backend by {token} at {}, a grant no lock knows of",
                    self.clock.now()
                ));
            }
        }
        Ok(())
    }

    /// Stops the faults and lets every acquisition finish and every late answer arrive, still
    /// checking at every step.
    fn finish(&mut self) {
        self.backend.faults.set(Faults {
            acquire: 0.0,
            extend: 0.0,
            release: 0.0,
        });
        for a in self.aborts.drain(..) {
            a.abort();
        }
        self.note(format!("@{} finish", self.clock.now()));
        let mut waited = 0;
        while self.world.running.get() > 0 || waited < 400 {
            self.clock.advance(5.0);
            waited += 5;
            self.settle();
            assert!(waited < 10_000, "acquisitions never finished");
        }
    }

    fn fail(&self, why: &str) -> ! {
        let log = self.log.borrow();
        let tail = log.len().saturating_sub(80);
        panic!("{why}\n{}\n{}", log[0], log[tail.max(1)..].join("\n"));
    }
}

fn run_case(seed: u64) {
    let mut case = Case::new(seed);
    let steps = case.rng.range(10, 60);
    for _ in 0..steps {
        case.step();
    }
    case.finish();
}

#[test]
fn random_histories_never_grant_a_key_twice() {
    if let Some(seed) = std::env::var("LOCCO_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        run_case(seed);
        return;
    }
    let cases: u64 = std::env::var("LOCCO_MODEL_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4000);
    let mut seeds = Rng(0x10cc0);
    for _ in 0..cases {
        run_case(seeds.next());
    }
}
