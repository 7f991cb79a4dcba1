//! A FIFO queue of waiters per key, woken one at a time when the key is released, so that
//! under contention ownership rotates instead of going to whoever polls first.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};

use crate::contract::Waiter;

/// The waiters of one backend in this process. A backend that sees every release (the
/// in-memory one) wakes them all; one that sees only this process's releases (an adapter
/// written in JavaScript) wakes them for those, and its waiters poll for the rest.
#[derive(Clone, Default)]
pub struct LocalWaiters(Rc<Queues>);

impl LocalWaiters {
    /// A place at the back of `key`'s queue.
    pub fn waiter(&self, key: &str) -> Box<dyn Waiter> {
        let slot = Rc::new(Slot::default());
        let mut queues = self.0 .0.borrow_mut();
        queues
            .entry(key.to_owned())
            .or_default()
            .push_back(slot.clone());
        Box::new(QueuedWaiter {
            slot,
            key: key.to_owned(),
            queues: self.0.clone(),
        })
    }

    /// Wakes the longest waiter of `key`.
    pub fn wake_next(&self, key: &str) {
        self.0.wake_next(key)
    }

    /// Wakes the longest waiter of every key.
    pub fn wake_all(&self) {
        let keys: Vec<String> = self.0 .0.borrow().keys().cloned().collect();
        keys.iter().for_each(|k| self.0.wake_next(k));
    }
}

#[derive(Default)]
struct Slot {
    /// Woken and not yet seen by its waiter.
    released: Cell<bool>,
    /// The waiter left the queue.
    gone: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

/// Waiters per key, oldest first.
#[derive(Default)]
struct Queues(RefCell<HashMap<String, VecDeque<Rc<Slot>>>>);

impl Queues {
    /// Wakes the oldest waiter of `key` that has not been woken yet.
    fn wake_next(&self, key: &str) {
        let waker = {
            let mut queues = self.0.borrow_mut();
            let Some(queue) = queues.get_mut(key) else {
                return;
            };
            queue.retain(|s| !s.gone.get());
            let next = queue.iter().find(|s| !s.released.get()).cloned();
            if queue.is_empty() {
                queues.remove(key);
            }
            next.and_then(|slot| {
                slot.released.set(true);
                slot.waker.borrow_mut().take()
            })
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

struct QueuedWaiter {
    slot: Rc<Slot>,
    key: String,
    queues: Rc<Queues>,
}

impl Waiter for QueuedWaiter {
    fn released(&mut self) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(std::future::poll_fn(move |cx| {
            if self.slot.released.replace(false) {
                return Poll::Ready(());
            }
            *self.slot.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        }))
    }
}

impl Drop for QueuedWaiter {
    fn drop(&mut self) {
        self.slot.gone.set(true);
        // A wake this waiter never used goes to the next one in line.
        if self.slot.released.get() {
            self.queues.wake_next(&self.key);
        }
    }
}

/// Woken by whichever of two waiters is woken first.
struct EitherWaiter(Box<dyn Waiter>, Box<dyn Waiter>);

impl Waiter for EitherWaiter {
    fn released(&mut self) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        let (a, b) = (self.0.released(), self.1.released());
        Box::pin(async move {
            futures_util::future::select(a, b).await;
        })
    }
}

/// Adds this process's release wake-ups to a backend that cannot report releases itself:
/// waiters are woken when a lock of this process releases the key, and poll for the rest.
pub struct LocalWakeups<B> {
    inner: B,
    waiters: LocalWaiters,
}

impl<B> LocalWakeups<B> {
    pub fn new(inner: B) -> Self {
        LocalWakeups {
            inner,
            waiters: LocalWaiters::default(),
        }
    }

    pub fn inner(&self) -> &B {
        &self.inner
    }
}

impl<B: crate::contract::Backend> crate::contract::Backend for LocalWakeups<B> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn acquire(&self, key: &str, token: &str, ttl: u32) -> crate::contract::Op<bool> {
        self.inner.acquire(key, token, ttl)
    }
    fn release(&self, key: &str, token: &str) -> crate::contract::Op<bool> {
        let op = self.inner.release(key, token);
        let (waiters, key) = (self.waiters.clone(), key.to_owned());
        crate::contract::Op::pending(async move {
            let deleted = op.await?;
            if deleted {
                waiters.wake_next(&key);
            }
            Ok(deleted)
        })
    }
    fn extend(&self, key: &str, token: &str, ttl: u32) -> crate::contract::Op<bool> {
        self.inner.extend(key, token, ttl)
    }
    // Without this the default would send one `extend` per renewal through the wrapper.
    fn extend_many(
        &self,
        renewals: &[crate::contract::Renewal<'_>],
    ) -> crate::contract::Op<Vec<crate::rt::error::Result<bool>>> {
        self.inner.extend_many(renewals)
    }
    fn is_held(&self, key: &str, token: &str) -> crate::contract::Op<bool> {
        self.inner.is_held(key, token)
    }
    fn supports_fencing(&self) -> bool {
        self.inner.supports_fencing()
    }
    fn acquire_fenced(&self, key: &str, token: &str, ttl: u32) -> crate::contract::Op<Option<u64>> {
        self.inner.acquire_fenced(key, token, ttl)
    }
    fn no_fencing_reason(&self) -> Option<String> {
        self.inner.no_fencing_reason()
    }
    fn waiter(&self, key: &str) -> Option<Box<dyn Waiter>> {
        let local = self.waiters.waiter(key);
        Some(match self.inner.waiter(key) {
            // The backend also tells of other processes' releases (etcd's watch).
            Some(remote) => Box::new(EitherWaiter(local, remote)),
            None => local,
        })
    }
    fn queue(&self) -> Option<&dyn crate::contract::Queue> {
        self.inner.queue()
    }
    fn watch_lost(&self, key: &str, token: &str) -> Option<crate::contract::Op<()>> {
        self.inner.watch_lost(key, token)
    }
    fn session_left(&self, key: &str, token: &str) -> Option<f64> {
        self.inner.session_left(key, token)
    }
    fn coordination(&self) -> Option<&dyn crate::contract::Coordination> {
        self.inner.coordination()
    }
    fn inspect(&self, key: &str) -> crate::contract::Op<crate::contract::KeyInfo> {
        self.inner.inspect(key)
    }
    fn list(&self, prefix: &str, limit: u32) -> crate::contract::Op<Vec<crate::contract::KeyInfo>> {
        self.inner.list(prefix, limit)
    }
    // Like `release`: a removed lease wakes this process's next waiter for the key.
    fn force_release(&self, key: &str) -> crate::contract::Op<bool> {
        let op = self.inner.force_release(key);
        let (waiters, key) = (self.waiters.clone(), key.to_owned());
        crate::contract::Op::pending(async move {
            let deleted = op.await?;
            if deleted {
                waiters.wake_next(&key);
            }
            Ok(deleted)
        })
    }
}
