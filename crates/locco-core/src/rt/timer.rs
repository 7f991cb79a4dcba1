//! Timers: one background thread drives every sleep of the process.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::rt::clock::Clock;

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
    wakers: crate::rt::ids::IdMap<u64, Waker>,
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

/// The sleeps of one thread, on that thread; only the earliest is handed to the base timer.
/// Registering or cancelling a sleep is then a local operation, with no lock and no wake-up
/// of the timer thread, which matters when every contended acquisition waits.
#[derive(Clone)]
pub struct LocalTimer(Rc<LocalTimerState>);

/// How many sleeps the in-order lane holds at most. A sleep cancelled behind one still
/// running keeps its (empty) place until those before it end; this bounds such places.
const LANE_MAX: usize = 4096;

struct LocalTimerState {
    base: Rc<dyn Timer>,
    spawner: Rc<dyn crate::rt::task::Spawn>,
    /// Sleeps whose deadline came in order (at or after the last one's): most sleeps are the
    /// same backstop from now, so most land here, where registering is a push and a
    /// cancel clears a place found by its serial number, rather than a search of the map.
    lane: RefCell<VecDeque<(u64, Option<Waker>)>>,
    /// The serial number of the lane's front.
    lane_start: Cell<u64>,
    /// The other sleeps, by (deadline in monotonic microseconds, serial number).
    entries: RefCell<std::collections::BTreeMap<(u64, u64), Waker>>,
    next_id: Cell<u64>,
    driving: Cell<bool>,
    /// The deadline the driver sleeps until, and its waker, to wake it for an earlier one.
    armed: RefCell<Option<(u64, Waker)>>,
}

impl LocalTimer {
    pub fn new(base: Rc<dyn Timer>, spawner: Rc<dyn crate::rt::task::Spawn>) -> Self {
        LocalTimer(Rc::new(LocalTimerState {
            base,
            spawner,
            lane: RefCell::default(),
            lane_start: Cell::new(0),
            entries: RefCell::default(),
            next_id: Cell::new(0),
            driving: Cell::new(false),
            armed: RefCell::new(None),
        }))
    }
}

impl LocalTimerState {
    /// Registers a sleep until `at`: where it went, with its serial number.
    fn register(&self, at: u64, waker: &Waker) -> Place {
        let mut lane = self.lane.borrow_mut();
        let in_order = lane.back().is_none_or(|(last, _)| *last <= at);
        if in_order && lane.len() < LANE_MAX {
            lane.push_back((at, Some(waker.clone())));
            return Place::Lane(self.lane_start.get() + lane.len() as u64 - 1);
        }
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        self.entries.borrow_mut().insert((at, id), waker.clone());
        Place::Map(id)
    }

    /// Refreshes the waker of a registered sleep; false when it is registered no more (its
    /// deadline passed and the driver woke it).
    fn refresh(&self, at: u64, place: Place, waker: &Waker) -> bool {
        match place {
            Place::Lane(n) => {
                let mut lane = self.lane.borrow_mut();
                let Some(i) = n.checked_sub(self.lane_start.get()) else {
                    return false;
                };
                match lane.get_mut(i as usize) {
                    Some((_, w)) => {
                        *w = Some(waker.clone());
                        true
                    }
                    None => false,
                }
            }
            Place::Map(id) => match self.entries.borrow_mut().get_mut(&(at, id)) {
                Some(w) => {
                    w.clone_from(waker);
                    true
                }
                None => false,
            },
        }
    }

    fn cancel(&self, at: u64, place: Place) {
        match place {
            Place::Lane(n) => {
                let mut lane = self.lane.borrow_mut();
                if let Some(i) = n.checked_sub(self.lane_start.get()) {
                    if let Some((_, w)) = lane.get_mut(i as usize) {
                        *w = None;
                    }
                }
                self.sweep(&mut lane, 0);
            }
            Place::Map(id) => {
                self.entries.borrow_mut().remove(&(at, id));
            }
        }
    }

    /// Drops the lane's front while it is cancelled or due by `now` (0: only cancelled ones),
    /// answering the wakers of the due ones.
    fn sweep(&self, lane: &mut VecDeque<(u64, Option<Waker>)>, now: u64) -> Vec<Waker> {
        let mut due = Vec::new();
        while let Some((at, waker)) = lane.front_mut() {
            if waker.is_some() && *at > now {
                break;
            }
            due.extend(waker.take());
            lane.pop_front();
            self.lane_start.set(self.lane_start.get() + 1);
        }
        due
    }

    /// The earliest deadline left.
    fn earliest(&self) -> Option<u64> {
        let lane = self.lane.borrow().front().map(|(at, _)| *at);
        let map = self.entries.borrow().keys().next().map(|(at, _)| *at);
        match (lane, map) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Where a registered sleep is: the in-order lane (by serial number) or the map.
#[derive(Clone, Copy)]
enum Place {
    Lane(u64),
    Map(u64),
}

impl Timer for LocalTimer {
    fn sleep(&self, ms: f64) -> Sleep {
        let ms = if ms.is_finite() { ms.max(0.0) } else { 1e12 };
        Box::pin(LocalSleep {
            at: now_us() + (ms * 1000.0) as u64,
            place: None,
            // A sleep made for a positive time cannot be over at its first poll, which
            // follows at once: that poll need not read the clock again.
            fresh: ms > 0.0,
            state: self.0.clone(),
        })
    }
}

struct LocalSleep {
    at: u64,
    place: Option<Place>,
    fresh: bool,
    state: Rc<LocalTimerState>,
}

impl Future for LocalSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if !std::mem::take(&mut self.fresh) && now_us() >= self.at {
            if let Some(place) = self.place.take() {
                self.state.cancel(self.at, place);
            }
            return Poll::Ready(());
        }
        let at = self.at;
        let registered = self
            .place
            .is_some_and(|place| self.state.refresh(at, place, cx.waker()));
        if !registered {
            self.place = Some(self.state.register(at, cx.waker()));
        }
        let state = &self.state;
        if !state.driving.replace(true) {
            state.spawner.spawn(Box::pin(drive(state.clone())));
        } else {
            let earlier = match &*state.armed.borrow() {
                Some((armed, w)) if at < *armed => Some(w.clone()),
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
        if let Some(place) = self.place {
            self.state.cancel(self.at, place);
        }
    }
}

/// The monotonic clock in microseconds, as the engine's clocks read it (one reading shared
/// within a call from JavaScript, see [`crate::rt::clock::one_reading`]).
fn now_us() -> u64 {
    (crate::rt::clock::monotonic_reading() * 1000.0) as u64
}

/// Wakes due sleeps, then sleeps on the base timer until the earliest one left.
async fn drive(state: Rc<LocalTimerState>) {
    loop {
        let now = now_us();
        let mut due = state.sweep(&mut state.lane.borrow_mut(), now);
        {
            let mut entries = state.entries.borrow_mut();
            let later = entries.split_off(&(now, u64::MAX));
            due.extend(std::mem::replace(&mut *entries, later).into_values());
        }
        due.into_iter().for_each(Waker::wake);
        let Some(at) = state.earliest() else {
            state.driving.set(false);
            *state.armed.borrow_mut() = None;
            return;
        };
        let wait = state.base.sleep(at.saturating_sub(now) as f64 / 1000.0);
        let earlier = std::future::poll_fn(|cx| {
            if state.earliest().is_some_and(|h| h < at) {
                return Poll::Ready(());
            }
            *state.armed.borrow_mut() = Some((at, cx.waker().clone()));
            Poll::Pending
        });
        crate::rt::task::first(wait, earlier).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_executor::LocalPool;
    use futures_util::task::LocalSpawnExt;

    struct Spawner(futures_executor::LocalSpawner);
    impl crate::rt::task::Spawn for Spawner {
        fn spawn(&self, task: crate::rt::task::LocalFuture<()>) {
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
        assert!(timer.0.entries.borrow().is_empty() && timer.0.lane.borrow().is_empty());
        assert!(
            !timer.0.driving.get(),
            "the driver stops when nothing is left"
        );
    }

    #[test]
    fn sleeps_in_the_lane_and_in_the_map_wake_in_deadline_order() {
        let mut pool = LocalPool::new();
        let timer = LocalTimer::new(Rc::new(ThreadTimer), Rc::new(Spawner(pool.spawner())));
        let order = Rc::new(RefCell::new(Vec::new()));
        // 40 and 70 come in order (the lane), 10 and 55 after a later one (the map); "gone"
        // is cancelled while in the lane behind a sleep that still runs.
        for (name, ms) in [
            ("40", 40.0),
            ("10", 10.0),
            ("gone", 50.0),
            ("70", 70.0),
            ("55", 55.0),
        ] {
            let (t, o) = (timer.clone(), order.clone());
            pool.spawner()
                .spawn_local(async move {
                    if name == "gone" {
                        // Registered by one poll, then dropped before its deadline.
                        let mut sleep = t.sleep(ms);
                        let polled =
                            std::future::poll_fn(|cx| Poll::Ready(sleep.as_mut().poll(cx)));
                        assert!(polled.await.is_pending());
                        return;
                    }
                    t.sleep(ms).await;
                    o.borrow_mut().push(name);
                })
                .unwrap();
        }
        pool.run_until_stalled();
        assert_eq!(timer.0.lane.borrow().len(), 3, "40, the cancelled 50, 70");
        assert_eq!(timer.0.entries.borrow().len(), 2, "10 and 55");
        pool.run();
        assert_eq!(*order.borrow(), ["10", "40", "55", "70"]);
        assert!(timer.0.entries.borrow().is_empty() && timer.0.lane.borrow().is_empty());
    }

    #[test]
    fn a_cancelled_front_of_the_lane_is_swept_at_once() {
        let pool = LocalPool::new();
        let timer = LocalTimer::new(Rc::new(ThreadTimer), Rc::new(Spawner(pool.spawner())));
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut sleeps: Vec<Sleep> = (1..=3)
            .map(|i| timer.sleep(f64::from(i) * 1000.0))
            .collect();
        for s in &mut sleeps {
            assert!(s.as_mut().poll(&mut cx).is_pending());
        }
        // The middle one keeps its place (the first still runs); the first takes both along.
        drop(sleeps.remove(1));
        assert_eq!(timer.0.lane.borrow().len(), 3);
        drop(sleeps.remove(0));
        assert_eq!(timer.0.lane.borrow().len(), 1);
        drop(sleeps);
        assert!(timer.0.lane.borrow().is_empty());
    }
}
