//! Timers: one background thread drives every sleep of the process.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::clock::Clock;

pub type Sleep = Pin<Box<dyn Future<Output = ()>>>;

/// Sleeps for a number of milliseconds. The engine re-reads its [`Clock`] when a sleep ends,
/// so a timer only needs to be roughly right.
pub trait Timer {
    fn sleep(&self, ms: f64) -> Sleep;
}

/// Sleeps until `clock` reads at least `deadline`, whatever the clock is (an injected clock
/// that does not move keeps this waiting, as a fake clock should).
pub async fn sleep_until(clock: &dyn Clock, timer: &dyn Timer, deadline: f64) {
    loop {
        let left = deadline - clock.now();
        if left <= 0.0 {
            return;
        }
        timer.sleep(left).await;
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
    wakers: HashMap<u64, Waker>,
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
