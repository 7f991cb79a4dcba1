//! One scheduler per Locker drives every heartbeat tick and lease-expiry check of its locks,
//! from two heaps and one pending sleep, instead of a timer per lock. It knows a lock only as
//! something [`Scheduled`] that it tells what fell due. A tick may run a little early, beside
//! the ticks due by then, so that their extensions leave together.

use std::cell::{Cell, RefCell};
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};

use crate::engine::runtime::Runtime;
use crate::engine::task::first;

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
    seq: u64,
    due: Due,
    lock: Weak<dyn Scheduled>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.total_cmp(&other.at).then(self.seq.cmp(&other.seq))
    }
}

type Heap = RefCell<BinaryHeap<Reverse<Entry>>>;

#[derive(Default)]
pub(crate) struct Scheduler {
    ticks: Heap,
    expiries: Heap,
    seq: Cell<u64>,
    running: Cell<bool>,
    /// The driver's waker while it sleeps, to wake it for an earlier entry.
    sleeper: RefCell<Option<(f64, Waker)>>,
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
        let seq = self.seq.get() + 1;
        self.seq.set(seq);
        let heap = match due {
            Due::Tick => &self.ticks,
            Due::Expiry => &self.expiries,
        };
        heap.borrow_mut().push(Reverse(Entry {
            at,
            early,
            seq,
            due,
            lock: Rc::downgrade(lock) as Weak<dyn Scheduled>,
        }));
        if !self.running.replace(true) {
            rt.spawner.spawn(Box::pin(drive(self.clone(), rt.clone())));
            return;
        }
        let wake = match &*self.sleeper.borrow() {
            Some((until, w)) if at < *until => Some(w.clone()),
            _ => None,
        };
        if let Some(w) = wake {
            w.wake();
        }
    }

    /// The next entry of `heap` that may run at `now`, if any.
    fn pop_due(heap: &Heap, now: f64) -> Option<(f64, Due, Rc<dyn Scheduled>)> {
        let mut heap = heap.borrow_mut();
        while let Some(Reverse(top)) = heap.peek() {
            if top.at - top.early > now {
                return None;
            }
            let Reverse(e) = heap.pop().expect("peeked");
            if let Some(lock) = e.lock.upgrade() {
                return Some((e.at, e.due, lock));
            }
        }
        None
    }

    /// When the earliest entry is due.
    fn next_at(&self) -> Option<f64> {
        let head = |heap: &Heap| heap.borrow().peek().map(|Reverse(e)| e.at);
        match (head(&self.ticks), head(&self.expiries)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The scheduler's one task: runs due entries, then sleeps until the earliest one.
async fn drive(s: Rc<Scheduler>, rt: Runtime) {
    loop {
        let now = rt.clock.now();
        while let Some((at, due, lock)) = Scheduler::pop_due(&s.expiries, now) {
            lock.on_due(due, at);
        }
        // Ticks leave early only beside one that is due: a wake for an expiry check must not
        // split the ticks into small batches.
        if s.ticks.borrow().peek().is_some_and(|Reverse(e)| e.at <= now) {
            while let Some((at, due, lock)) = Scheduler::pop_due(&s.ticks, now) {
                lock.on_due(due, at);
            }
        }
        let Some(next) = s.next_at() else {
            s.running.set(false);
            return;
        };
        let wait = rt.timer.sleep(next - rt.clock.now());
        let earlier = std::future::poll_fn(|cx| {
            if s.next_at().is_some_and(|h| h < next) {
                return Poll::Ready(());
            }
            *s.sleeper.borrow_mut() = Some((next, cx.waker().clone()));
            Poll::Pending
        });
        first(wait, earlier).await;
        *s.sleeper.borrow_mut() = None;
    }
}
