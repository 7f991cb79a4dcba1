//! What the engine needs from its host: a clock, a timer, a way to run background work, and a
//! way to hear that the caller gave up.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};

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
    wakers: RefCell<Vec<Waker>>,
    /// Aborts that fire with this one (see [`Abort::follow`]); weak, so that one that is
    /// done with costs a slot until the next pruning, not its state.
    followers: RefCell<Vec<Weak<AbortState>>>,
}

impl AbortState {
    fn abort(&self) {
        if !self.aborted.replace(true) {
            let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
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

    /// Resolves once [`Abort::abort`] was called.
    pub fn aborted(&self) -> impl Future<Output = ()> + '_ {
        // One waker per wait, not one per poll: a wait polled many times (a contended
        // acquisition) would otherwise grow the list, and the work, at every poll.
        let mut registered: Option<Waker> = None;
        std::future::poll_fn(move |cx| {
            if self.0.aborted.get() {
                return Poll::Ready(());
            }
            if !registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                self.0.wakers.borrow_mut().push(cx.waker().clone());
                registered = Some(cx.waker().clone());
            }
            Poll::Pending
        })
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
        struct Task;
        impl std::task::Wake for Task {
            fn wake(self: std::sync::Arc<Self>) {}
        }
        let waker = Waker::from(std::sync::Arc::new(Task));
        let mut cx = Context::from_waker(&waker);
        for _ in 0..1000 {
            assert!(wait.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(abort.0.wakers.borrow().len(), 1);
        abort.abort();
        assert!(wait.as_mut().poll(&mut cx).is_ready());
    }
}
