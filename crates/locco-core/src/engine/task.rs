//! Work on the engine's thread: the future type it runs, how a host runs background tasks,
//! and [`first`], the race of two futures that every deadline and abort is built on.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

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
pub(crate) async fn first<A: Future, B: Future>(a: A, b: B) -> First<A::Output, B::Output> {
    let mut a = std::pin::pin!(a);
    let mut b = std::pin::pin!(b);
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(v) = a.as_mut().poll(cx) {
            return Poll::Ready(First::Left(v));
        }
        if let Poll::Ready(v) = b.as_mut().poll(cx) {
            return Poll::Ready(First::Right(v));
        }
        Poll::Pending
    })
    .await
}
