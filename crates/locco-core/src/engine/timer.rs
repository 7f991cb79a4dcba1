//! Timers: one background thread drives every sleep of the process.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::engine::clock::Clock;

pub type Sleep = Pin<Box<dyn Future<Output = ()>>>;

/// Sleeps for a number of milliseconds. The engine re-reads its [`Clock`] when a sleep ends,
/// so a timer only needs to be roughly right.
pub trait Timer {
    fn sleep(&self, ms: f64) -> Sleep;
}

/// Sleeps until `clock` reads at least `deadline`, whatever the clock is (an injected clock
/// that does not move keeps this waiting, as a fake clock should).
pub async fn sleep_until(clock: &dyn Clock, timer: &dyn Timer, deadline: f64) {
    sleep_until_from(clock, timer, deadline, clock.now()).await
}

/// [`sleep_until`] for a caller that has just read the clock (`now`).
pub async fn sleep_until_from(clock: &dyn Clock, timer: &dyn Timer, deadline: f64, now: f64) {
    let mut left = deadline - now;
    while left > 0.0 {
        timer.sleep(left).await;
        left = deadline - clock.now();
    }
}

/// The process-wide timer: one thread, a heap of deadlines, wakers called when they pass.
/// The thread never keeps a Node.js process alive: wakers reach JavaScript through an
/// unreferenced handle.
#[derive(Clone, Copy, Default)]
pub struct ThreadTimer;

struct Shared {
    state: Mutex<TimerState>,
    changed: Condvar,
}

#[derive(Default)]
struct TimerState {
    next_id: u64,
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    wakers: crate::IdMap<u64, Waker>,
}

fn shared() -> &'static Arc<Shared> {
    static SHARED: OnceLock<Arc<Shared>> = OnceLock::new();
    SHARED.get_or_init(|| {
        let shared = Arc::new(Shared {
            state: Mutex::new(TimerState::default()),
            changed: Condvar::new(),
        });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("locco-timer".into())
            .spawn(move || run(&worker))
            .expect("spawn the locco timer thread");
        shared
    })
}

fn run(shared: &Shared) {
    let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(Reverse((at, id))) = state.heap.peek().copied() {
            if at > now {
                break;
            }
            state.heap.pop();
            if let Some(w) = state.wakers.remove(&id) {
                due.push(w);
            }
        }
        if !due.is_empty() {
            drop(state);
            due.into_iter().for_each(Waker::wake);
            state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            continue;
        }
        state = match state.heap.peek() {
            Some(Reverse((at, _))) => {
                let wait = at.saturating_duration_since(now);
                shared
                    .changed
                    .wait_timeout(state, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => shared
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner()),
        };
    }
}

struct ThreadSleep {
    at: Instant,
    id: Option<u64>,
}

impl Future for ThreadSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        let shared = shared();
        let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        match self.id {
            Some(id) => {
                // Still registered: refresh the waker; re-register if the thread already fired it.
                let at = self.at;
                match state.wakers.get_mut(&id) {
                    Some(w) => w.clone_from(cx.waker()),
                    None => {
                        state.wakers.insert(id, cx.waker().clone());
                        state.heap.push(Reverse((at, id)));
                        shared.changed.notify_one();
                    }
                }
            }
            None => {
                let id = state.next_id;
                state.next_id += 1;
                let earliest = state
                    .heap
                    .peek()
                    .is_none_or(|Reverse((at, _))| self.at < *at);
                state.heap.push(Reverse((self.at, id)));
                state.wakers.insert(id, cx.waker().clone());
                if earliest {
                    shared.changed.notify_one();
                }
                self.id = Some(id);
            }
        }
        Poll::Pending
    }
}

impl Drop for ThreadSleep {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            // The heap entry stays and is skipped when it comes up.
            let mut state = shared().state.lock().unwrap_or_else(|e| e.into_inner());
            state.wakers.remove(&id);
        }
    }
}

impl Timer for ThreadTimer {
    fn sleep(&self, ms: f64) -> Sleep {
        let ms = if ms.is_finite() { ms.max(0.0) } else { 1e12 };
        Box::pin(ThreadSleep {
            at: Instant::now() + Duration::from_micros((ms * 1000.0) as u64),
            id: None,
        })
    }
}

/// A clock and timer that move only when told: time rules are tested with it, without sleeps.
#[derive(Default)]
pub struct ManualClock {
    now: Cell<f64>,
    sleepers: RefCell<Vec<(f64, Waker)>>,
}

impl ManualClock {
    pub fn new(start: f64) -> Rc<Self> {
        let clock = ManualClock::default();
        clock.now.set(start);
        Rc::new(clock)
    }

    pub fn set(&self, now: f64) {
        self.now.set(now);
        let due: Vec<Waker> = {
            let mut sleepers = self.sleepers.borrow_mut();
            let (due, keep): (Vec<_>, Vec<_>) = sleepers.drain(..).partition(|(at, _)| *at <= now);
            *sleepers = keep;
            due.into_iter().map(|(_, w)| w).collect()
        };
        due.into_iter().for_each(Waker::wake);
    }

    pub fn advance(&self, ms: f64) {
        self.set(self.now.get() + ms);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> f64 {
        self.now.get()
    }
}

impl Timer for Rc<ManualClock> {
    fn sleep(&self, ms: f64) -> Sleep {
        let clock = self.clone();
        let at = clock.now() + ms;
        Box::pin(std::future::poll_fn(move |cx| {
            if clock.now() >= at {
                return Poll::Ready(());
            }
            clock.sleepers.borrow_mut().push((at, cx.waker().clone()));
            Poll::Pending
        }))
    }
}

/// The sleeps of one thread, in an ordered map on that thread; only the earliest is handed to
/// the base timer. Registering or cancelling a sleep is then a map operation, with no lock
/// and no wake-up of the timer thread, which matters when every contended acquisition waits.
#[derive(Clone)]
pub struct LocalTimer(Rc<LocalTimerState>);

struct LocalTimerState {
    base: Rc<dyn Timer>,
    spawner: Rc<dyn crate::engine::task::Spawn>,
    /// Sleeps by (deadline in monotonic microseconds, serial number).
    entries: RefCell<std::collections::BTreeMap<(u64, u64), Waker>>,
    next_id: Cell<u64>,
    driving: Cell<bool>,
    /// The deadline the driver sleeps until, and its waker, to wake it for an earlier one.
    armed: RefCell<Option<(u64, Waker)>>,
}

impl LocalTimer {
    pub fn new(base: Rc<dyn Timer>, spawner: Rc<dyn crate::engine::task::Spawn>) -> Self {
        LocalTimer(Rc::new(LocalTimerState {
            base,
            spawner,
            entries: RefCell::default(),
            next_id: Cell::new(0),
            driving: Cell::new(false),
            armed: RefCell::new(None),
        }))
    }
}

impl Timer for LocalTimer {
    fn sleep(&self, ms: f64) -> Sleep {
        let ms = if ms.is_finite() { ms.max(0.0) } else { 1e12 };
        Box::pin(LocalSleep {
            at: now_us() + (ms * 1000.0) as u64,
            id: None,
            // A sleep made for a positive time cannot be over at its first poll, which
            // follows at once: that poll need not read the clock again.
            fresh: ms > 0.0,
            state: self.0.clone(),
        })
    }
}

struct LocalSleep {
    at: u64,
    id: Option<u64>,
    fresh: bool,
    state: Rc<LocalTimerState>,
}

impl Future for LocalSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if !std::mem::take(&mut self.fresh) && now_us() >= self.at {
            if let Some(id) = self.id.take() {
                self.state.entries.borrow_mut().remove(&(self.at, id));
            }
            return Poll::Ready(());
        }
        let id = match self.id {
            Some(id) => id,
            None => {
                let id = self.state.next_id.get();
                self.state.next_id.set(id + 1);
                self.id = Some(id);
                id
            }
        };
        self.state
            .entries
            .borrow_mut()
            .insert((self.at, id), cx.waker().clone());
        let state = &self.state;
        if !state.driving.replace(true) {
            state.spawner.spawn(Box::pin(drive(state.clone())));
        } else {
            let earlier = match &*state.armed.borrow() {
                Some((armed, w)) if self.at < *armed => Some(w.clone()),
                _ => None,
            };
            if let Some(w) = earlier {
                w.wake();
            }
        }
        Poll::Pending
    }
}

impl Drop for LocalSleep {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.state.entries.borrow_mut().remove(&(self.at, id));
        }
    }
}

/// The monotonic clock in microseconds, as the engine's clocks read it (one reading shared
/// within a call from JavaScript, see [`crate::one_reading`]).
fn now_us() -> u64 {
    (crate::engine::clock::monotonic_reading() * 1000.0) as u64
}

/// Wakes due sleeps, then sleeps on the base timer until the earliest one left.
async fn drive(state: Rc<LocalTimerState>) {
    loop {
        let now = now_us();
        let due: Vec<Waker> = {
            let mut entries = state.entries.borrow_mut();
            let later = entries.split_off(&(now, u64::MAX));
            std::mem::replace(&mut *entries, later)
                .into_values()
                .collect()
        };
        due.into_iter().for_each(Waker::wake);
        let earliest = state.entries.borrow().keys().next().map(|(at, _)| *at);
        let Some(at) = earliest else {
            state.driving.set(false);
            *state.armed.borrow_mut() = None;
            return;
        };
        let wait = state.base.sleep(at.saturating_sub(now) as f64 / 1000.0);
        let earlier = std::future::poll_fn(|cx| {
            let head = state.entries.borrow().keys().next().map(|(a, _)| *a);
            if head.is_some_and(|h| h < at) {
                return Poll::Ready(());
            }
            *state.armed.borrow_mut() = Some((at, cx.waker().clone()));
            Poll::Pending
        });
        crate::engine::task::first(wait, earlier).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_executor::LocalPool;
    use futures_util::task::LocalSpawnExt;

    struct Spawner(futures_executor::LocalSpawner);
    impl crate::engine::task::Spawn for Spawner {
        fn spawn(&self, task: crate::engine::task::LocalFuture<()>) {
            self.0.spawn_local(task).unwrap();
        }
    }

    #[test]
    fn local_sleeps_wake_in_deadline_order_and_cancel_cleanly() {
        let mut pool = LocalPool::new();
        let timer = LocalTimer::new(Rc::new(ThreadTimer), Rc::new(Spawner(pool.spawner())));
        let order = Rc::new(RefCell::new(Vec::new()));
        for (name, ms) in [("late", 60.0), ("early", 20.0)] {
            let (t, o) = (timer.clone(), order.clone());
            pool.spawner()
                .spawn_local(async move {
                    t.sleep(ms).await;
                    o.borrow_mut().push(name);
                })
                .unwrap();
        }
        // A sleep dropped before its deadline leaves nothing behind.
        drop(timer.sleep(5.0));
        let started = Instant::now();
        pool.run();
        assert_eq!(*order.borrow(), ["early", "late"]);
        assert!(started.elapsed() >= Duration::from_millis(55));
        assert!(timer.0.entries.borrow().is_empty());
        assert!(
            !timer.0.driving.get(),
            "the driver stops when nothing is left"
        );
    }
}
