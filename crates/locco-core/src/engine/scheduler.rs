//! One scheduler per Locker drives every heartbeat tick and lease-expiry check of its locks,
//! with one pending sleep instead of a timer per lock. It knows a lock only as something
//! [`Scheduled`] that it tells what fell due. Entries wait in millisecond buckets (an entry due
//! at `at` runs once the clock reads `ceil(at)`), so a million locks cost a vector push each,
//! not a heap of millions. A tick may run a little early, beside the ticks due by then, so that
//! their extensions leave together.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};

use crate::rt::runtime::Runtime;
use crate::rt::task::{first, yield_now};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Due {
    /// Send the next heartbeat extension.
    Tick,
    /// The lease may have run out: read the clock.
    Expiry,
}

/// What the scheduler runs entries for (a lock). It holds it weakly: an entry of a lock that
/// is gone is skipped.
pub(crate) trait Scheduled {
    /// Runs what fell due, scheduled for clock time `at`.
    fn on_due(self: Rc<Self>, due: Due, at: f64);
}

struct Entry {
    at: f64,
    /// How much earlier than `at` it may run (ticks only).
    early: f64,
    lock: Weak<dyn Scheduled>,
}

/// Entries by the millisecond from which they may run (`ceil(at)`), in the order pushed.
type Buckets = RefCell<BTreeMap<i64, Vec<Entry>>>;

/// The bucket of an entry due at `at`: never before `at`. Far past or future times (a clock
/// test's extremes) saturate.
fn bucket(at: f64) -> i64 {
    at.ceil() as i64
}

#[derive(Default)]
pub(crate) struct Scheduler {
    ticks: Buckets,
    expiries: Buckets,
    running: Cell<bool>,
    /// The driver's waker while it sleeps, and the bucket it sleeps until.
    sleeper: RefCell<Option<(i64, Waker)>>,
}

impl Scheduler {
    /// Schedules `due` for `lock` at clock time `at`.
    pub(crate) fn push<L: Scheduled + 'static>(
        self: &Rc<Self>,
        rt: &Runtime,
        at: f64,
        due: Due,
        lock: &Rc<L>,
    ) {
        self.push_entry(rt, at, 0.0, due, lock)
    }

    /// Schedules a tick for `lock` at `at` that may run up to `early` ms before it.
    pub(crate) fn push_tick<L: Scheduled + 'static>(
        self: &Rc<Self>,
        rt: &Runtime,
        at: f64,
        early: f64,
        lock: &Rc<L>,
    ) {
        self.push_entry(rt, at, early, Due::Tick, lock)
    }

    fn push_entry<L: Scheduled + 'static>(
        self: &Rc<Self>,
        rt: &Runtime,
        at: f64,
        early: f64,
        due: Due,
        lock: &Rc<L>,
    ) {
        let key = bucket(at);
        let buckets = match due {
            Due::Tick => &self.ticks,
            Due::Expiry => &self.expiries,
        };
        buckets.borrow_mut().entry(key).or_default().push(Entry {
            at,
            early,
            lock: Rc::downgrade(lock) as Weak<dyn Scheduled>,
        });
        if !self.running.replace(true) {
            rt.spawner.spawn(Box::pin(drive(self.clone(), rt.clone())));
            return;
        }
        let wake = match &*self.sleeper.borrow() {
            Some((until, w)) if key < *until => Some(w.clone()),
            _ => None,
        };
        if let Some(w) = wake {
            w.wake();
        }
    }

    /// Takes the first bucket when it may run at `now`.
    fn take_due(buckets: &Buckets, now: f64) -> Option<Vec<Entry>> {
        let mut b = buckets.borrow_mut();
        let first = b.first_entry()?;
        (*first.key() as f64 <= now).then(|| first.remove())
    }

    /// The ticks of later buckets that may already run at `now` (their `early` allows it).
    fn take_early_ticks(&self, now: f64) -> Vec<Entry> {
        let mut b = self.ticks.borrow_mut();
        let mut out = Vec::new();
        let mut emptied = Vec::new();
        for (&key, entries) in b.range_mut(..=bucket(now + TICK_EARLY_MS)) {
            let mut i = 0;
            while i < entries.len() {
                if entries[i].at - entries[i].early <= now {
                    out.push(entries.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            if entries.is_empty() {
                emptied.push(key);
            }
        }
        emptied.iter().for_each(|k| {
            b.remove(k);
        });
        out
    }

    /// The first bucket of either kind.
    fn next_bucket(&self) -> Option<i64> {
        let first = |b: &Buckets| b.borrow().keys().next().copied();
        match (first(&self.ticks), first(&self.expiries)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The most a tick may run early (see `LockInner::schedule_tick`).
pub(crate) const TICK_EARLY_MS: f64 = 25.0;

/// Entries run in one poll of the scheduler's task.
const RUN_CHUNK: usize = 1000;

/// Runs due entries, yielding after every [`RUN_CHUNK`] of them: a million ticks due at once must
/// not hold up the host's loop for one long poll.
async fn run(entries: Vec<Entry>, due: Due) {
    let mut entries = entries.into_iter().peekable();
    while entries.peek().is_some() {
        for e in entries.by_ref().take(RUN_CHUNK) {
            if let Some(lock) = e.lock.upgrade() {
                lock.on_due(due, e.at);
            }
        }
        if entries.peek().is_some() {
            yield_now().await;
        }
    }
}

/// The scheduler's one task: runs due entries, then sleeps until the earliest bucket.
async fn drive(s: Rc<Scheduler>, rt: Runtime) {
    loop {
        let now = rt.clock.now();
        while let Some(due) = Scheduler::take_due(&s.expiries, now) {
            run(due, Due::Expiry).await;
        }
        // Ticks leave early only beside one that is due: a wake for an expiry check must not
        // split the ticks into small batches.
        let mut ticked = false;
        while let Some(due) = Scheduler::take_due(&s.ticks, now) {
            run(due, Due::Tick).await;
            ticked = true;
        }
        if ticked {
            run(s.take_early_ticks(now), Due::Tick).await;
        }
        let Some(next) = s.next_bucket() else {
            s.running.set(false);
            return;
        };
        let wait = rt.timer.sleep(next as f64 - rt.clock.now());
        let earlier = std::future::poll_fn(|cx| {
            if s.next_bucket().is_some_and(|h| h < next) {
                return Poll::Ready(());
            }
            *s.sleeper.borrow_mut() = Some((next, cx.waker().clone()));
            Poll::Pending
        });
        first(wait, earlier).await;
        *s.sleeper.borrow_mut() = None;
    }
}
