//! What the engine needs from its host: a clock, a timer, a way to run background work, and a
//! way to hear that the caller gave up.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::task::{Poll, Waker};

use crate::engine::clock::{Clock, LeaseClock};
use crate::engine::task::Spawn;
use crate::engine::timer::{LocalTimer, ThreadTimer, Timer};

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
}

impl Abort {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn abort(&self) {
        if !self.0.aborted.replace(true) {
            let wakers = std::mem::take(&mut *self.0.wakers.borrow_mut());
            wakers.into_iter().for_each(Waker::wake);
        }
    }

    pub fn is_aborted(&self) -> bool {
        self.0.aborted.get()
    }

    /// Resolves once [`Abort::abort`] was called.
    pub fn aborted(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.0.aborted.get() {
                return Poll::Ready(());
            }
            self.0.wakers.borrow_mut().push(cx.waker().clone());
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
