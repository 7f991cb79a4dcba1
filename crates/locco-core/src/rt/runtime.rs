//! What the engine needs from its host: a clock, a timer, a way to run background work, and a
//! way to hear that the caller gave up.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};

use crate::rt::clock::{Clock, LeaseClock};
use crate::rt::task::Spawn;
use crate::rt::timer::{LocalTimer, ThreadTimer, Timer};

/// The host services of one Locker.
#[derive(Clone)]
pub struct Runtime {
    pub clock: Rc<dyn Clock>,
    pub timer: Rc<dyn Timer>,
    pub spawner: Rc<dyn Spawn>,
}

impl Runtime {
    /// The system lease clock, and this thread's sleeps over the process-wide timer thread.
    pub fn system(spawner: Rc<dyn Spawn>) -> Self {
        Runtime {
            clock: Rc::new(LeaseClock::system()),
            timer: Rc::new(LocalTimer::new(Rc::new(ThreadTimer), spawner.clone())),
            spawner,
        }
    }

    pub fn with_clock(mut self, clock: Rc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn with_timer(mut self, timer: Rc<dyn Timer>) -> Self {
        self.timer = timer;
        self
    }
}

/// A one-way "the caller gave up" flag (an `AbortSignal`'s Rust side).
#[derive(Clone, Default)]
pub struct Abort(Rc<AbortState>);

#[derive(Default)]
struct AbortState {
    aborted: Cell<bool>,
    /// The wakers of the waits in progress. A wait takes its slot back when it is dropped,
    /// so a long-lived abort (a Locker's `closed`, watched by every acquisition that waits)
    /// holds as many as there are waits, not one for every wait it ever had.
    wakers: RefCell<WakerSlots>,
    /// Aborts that fire with this one (see [`Abort::follow`]); weak, so that one that is
    /// done with costs a slot until the next pruning, not its state.
    followers: RefCell<Vec<Weak<AbortState>>>,
}

#[derive(Default)]
struct WakerSlots {
    slots: Vec<Option<Waker>>,
    free: Vec<usize>,
}

impl WakerSlots {
    fn insert(&mut self, waker: Waker) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(waker);
                i
            }
            None => {
                self.slots.push(Some(waker));
                self.slots.len() - 1
            }
        }
    }

    fn remove(&mut self, i: usize) {
        if self.slots.get_mut(i).and_then(Option::take).is_some() {
            self.free.push(i);
        }
    }

    fn take_all(&mut self) -> Vec<Waker> {
        self.free.clear();
        self.slots.drain(..).flatten().collect()
    }
}

impl AbortState {
    fn abort(&self) {
        if !self.aborted.replace(true) {
            let wakers = self.wakers.borrow_mut().take_all();
            wakers.into_iter().for_each(Waker::wake);
            let followers = std::mem::take(&mut *self.followers.borrow_mut());
            for f in followers.iter().filter_map(Weak::upgrade) {
                f.abort();
            }
        }
    }
}

impl Abort {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn abort(&self) {
        self.0.abort();
    }

    /// Makes this abort fire when `leader` does too (at once if it already has): one abort
    /// that an acquisition watches for every reason to stop.
    pub fn follow(&self, leader: &Abort) {
        if leader.is_aborted() {
            self.abort();
            return;
        }
        let mut followers = leader.0.followers.borrow_mut();
        // Pruned when full, so a long-lived leader keeps about as many slots as live followers.
        if followers.len() == followers.capacity() {
            followers.retain(|f| f.strong_count() > 0);
        }
        followers.push(Rc::downgrade(&self.0));
    }

    pub fn is_aborted(&self) -> bool {
        self.0.aborted.get()
    }

    /// Whether `other` is this very abort (a clone of it), not one that merely follows it.
    pub fn is(&self, other: &Abort) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }

    /// Resolves once [`Abort::abort`] was called.
    pub fn aborted(&self) -> Aborted<'_> {
        Aborted {
            abort: self,
            slot: None,
        }
    }
}

/// A wait for an [`Abort`]: one waker slot while it waits (not one per poll: a contended
/// acquisition is polled many times), given back when it is dropped.
pub struct Aborted<'a> {
    abort: &'a Abort,
    slot: Option<usize>,
}

impl Future for Aborted<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let state = &this.abort.0;
        if state.aborted.get() {
            return Poll::Ready(());
        }
        let mut wakers = state.wakers.borrow_mut();
        match this.slot {
            Some(i) => {
                let slot = &mut wakers.slots[i];
                if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *slot = Some(cx.waker().clone());
                }
            }
            None => this.slot = Some(wakers.insert(cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for Aborted<'_> {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            self.abort.0.wakers.borrow_mut().remove(i);
        }
    }
}

/// Waits for an optional abort; never resolves without one.
pub(crate) async fn aborted(abort: Option<&Abort>) {
    match abort {
        Some(a) => a.aborted().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::task::Context;

    #[test]
    fn a_wait_polled_many_times_keeps_one_waker() {
        let abort = Abort::new();
        let mut wait = pin!(abort.aborted());
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        for _ in 0..1000 {
            assert!(wait.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(waiting(&abort), 1);
        abort.abort();
        assert!(wait.as_mut().poll(&mut cx).is_ready());
    }

    fn noop_waker() -> Waker {
        struct Task;
        impl std::task::Wake for Task {
            fn wake(self: std::sync::Arc<Self>) {}
        }
        Waker::from(std::sync::Arc::new(Task))
    }

    fn waiting(abort: &Abort) -> usize {
        abort.0.wakers.borrow().slots.iter().flatten().count()
    }

    #[test]
    fn a_wait_that_ends_gives_its_waker_back() {
        let abort = Abort::new();
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        // A long-lived abort watched by many waits in turn keeps one slot, not one per wait.
        for _ in 0..1000 {
            let mut wait = pin!(abort.aborted());
            assert!(wait.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(waiting(&abort), 0);
        assert!(abort.0.wakers.borrow().slots.len() <= 1);
        // Waits still going are woken by the abort, after others came and went.
        let mut first = Box::pin(abort.aborted());
        let mut second = Box::pin(abort.aborted());
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        drop(first);
        assert_eq!(waiting(&abort), 1);
        abort.abort();
        assert!(second.as_mut().poll(&mut cx).is_ready());
    }
}
