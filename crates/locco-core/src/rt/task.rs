//! Work on the engine's thread: the future type it runs, how a host runs background tasks,
//! [`first`], the race of two futures that every deadline and abort is built on, and
//! [`yield_now`], how long work lets the rest of the turn (and the host's loop) run.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

/// The future `make` builds, boxed where it is built: `Box::pin(fut)` builds it on the stack
/// and then copies all of it, its largest state and not only what it captured.
#[inline(always)]
pub fn boxed<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

/// Runs background work (a heartbeat's request, giving back a late grant) on the engine's
/// thread. The engine is single-threaded by design: all its state lives on one thread, the
/// JavaScript thread in Node.js, so it needs no locks.
pub trait Spawn {
    fn spawn(&self, task: LocalFuture<()>);
}

/// Which of two futures finished first; the other is dropped.
pub(crate) enum First<A, B> {
    Left(A),
    Right(B),
}

/// Polls both, left first.
pub(crate) fn first<A: Future, B: Future>(a: A, b: B) -> Race<A, B> {
    Race { a, b }
}

pin_project_lite::pin_project! {
    /// What [`first`] answers: a struct rather than an `async fn`, whose state held each
    /// future twice (as an argument and pinned), so that every race nested in another
    /// doubled in size (a queued waiter's wait was 632 bytes, copied into its box per wait).
    pub(crate) struct Race<A, B> {
        #[pin]
        a: A,
        #[pin]
        b: B,
    }
}

impl<A: Future, B: Future> Future for Race<A, B> {
    type Output = First<A::Output, B::Output>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.a.poll(cx) {
            return Poll::Ready(First::Left(v));
        }
        if let Poll::Ready(v) = this.b.poll(cx) {
            return Poll::Ready(First::Right(v));
        }
        Poll::Pending
    }
}

/// Returns `Pending` once, after waking itself: the task goes on after everything already
/// woken (and, when the host's executor has used up its turn, after the host's event loop).
pub(crate) fn yield_now() -> impl Future<Output = ()> {
    YieldOnce(false)
}

struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
