//! Pushes to this process's queued waiters: a backend that hears "your turn" (a Redis or
//! PostgreSQL notification, a MongoDB change) wakes the waiter it names here.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use crate::contract::Waiter;
use crate::rt::ids::{KeyMap, KeySet};

/// The waiters of this process that listen for pushes, by waiter id. Thread-safe, because a
/// network backend hears its pushes on the I/O thread.
#[derive(Clone, Default)]
pub struct WakeBoard(Arc<Mutex<Board>>);

#[derive(Default)]
struct Board {
    listening: KeyMap<String, Arc<Slot>>,
    /// Pushes for waiters that do not listen yet: a push can overtake the answer that put the
    /// waiter in the queue. Ids are unique, so an old entry can only go unused.
    early: KeySet<String>,
}

/// Early pushes kept at most; past this the set starts again (a lost push costs one re-check).
const EARLY_MAX: usize = 4096;

#[derive(Default)]
struct Slot {
    woken: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Slot {
    fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        if let Some(w) = self.waker.lock().ok().and_then(|mut w| w.take()) {
            w.wake();
        }
    }
}

impl WakeBoard {
    /// Tells `waiter` to try now.
    pub fn wake(&self, waiter: &str) {
        let Ok(mut board) = self.0.lock() else { return };
        match board.listening.get(waiter) {
            Some(slot) => slot.wake(),
            None => {
                if board.early.len() >= EARLY_MAX {
                    board.early.clear();
                }
                board.early.insert(waiter.to_owned());
            }
        }
    }

    /// Tells every listening waiter to try now: pushes may have been missed (a subscription
    /// that dropped, or was not yet in place).
    pub fn wake_all(&self) {
        if let Ok(board) = self.0.lock() {
            board.listening.values().for_each(|s| s.wake());
        }
    }

    /// Whether no waiter listens (a network backend keeps its push channel only then).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub fn is_empty(&self) -> bool {
        self.0.lock().map_or(true, |b| b.listening.is_empty())
    }

    pub fn listen(&self, waiter: &str) -> Box<dyn Waiter> {
        let slot = Arc::new(Slot::default());
        if let Ok(mut board) = self.0.lock() {
            if board.early.remove(waiter) {
                slot.woken.store(true, Ordering::Release);
            }
            board.listening.insert(waiter.to_owned(), slot.clone());
        }
        Box::new(Listener {
            board: self.clone(),
            waiter: waiter.to_owned(),
            slot,
        })
    }
}

struct Listener {
    board: WakeBoard,
    waiter: String,
    slot: Arc<Slot>,
}

impl Waiter for Listener {
    fn released(&mut self) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(std::future::poll_fn(move |cx| {
            if self.slot.woken.swap(false, Ordering::AcqRel) {
                return Poll::Ready(());
            }
            if let Ok(mut w) = self.slot.waker.lock() {
                *w = Some(cx.waker().clone());
            }
            // A push between the check and storing the waker would be missed without this.
            if self.slot.woken.swap(false, Ordering::AcqRel) {
                return Poll::Ready(());
            }
            Poll::Pending
        }))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Ok(mut board) = self.board.0.lock() {
            board.listening.remove(&self.waiter);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[test]
    fn a_push_that_overtakes_its_waiter_is_kept_for_it() {
        let board = WakeBoard::default();
        board.wake("early");
        let mut early = board.listen("early");
        assert!(early.released().now_or_never().is_some());
        let mut other = board.listen("other");
        assert!(
            other.released().now_or_never().is_none(),
            "a push is for its waiter only"
        );
        board.wake("other");
        assert!(other.released().now_or_never().is_some());
        assert!(
            other.released().now_or_never().is_none(),
            "one push, one wake"
        );
    }

    #[test]
    fn a_waiter_that_stopped_listening_is_forgotten() {
        let board = WakeBoard::default();
        drop(board.listen("gone"));
        board.wake_all();
        assert!(board.0.lock().unwrap().listening.is_empty());
    }
}
