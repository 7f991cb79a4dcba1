//! Backpressure in front of a Redis connection: at most `limit` operations written and not yet
//! answered, and a queue for the rest in which renewals of held locks go first.
//!
//! Without a bound, a flood of acquires is written to the connection at once, and a held
//! lock's renewal waits behind all of it in the server's input: its lease can run out before
//! the server reaches it. With the bound, the renewal waits behind at most `limit` requests.
//! The gate lives on the engine's thread (the backend is not `Send`), so it needs no lock.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// Operations in flight on one connection: enough to keep a server busy, even one that
/// answers in bursts (a throttled test server drained 256 in flight at a third of the rate of
/// 1,024), few enough that a renewal waits only milliseconds behind them on a healthy server.
pub(crate) const DEFAULT_IN_FLIGHT: usize = 1024;

/// Which queue an operation waits in when the connection is full.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Priority {
    /// Extending held locks: their leases run out while they wait.
    Renewal,
    /// Everything else (acquires, releases, reads).
    Other,
}

pub(crate) struct Gate {
    limit: usize,
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    in_flight: usize,
    renewals: VecDeque<Rc<Slot>>,
    others: VecDeque<Rc<Slot>>,
}

/// One operation waiting for room.
#[derive(Default)]
struct Slot {
    /// Set when a finished operation hands its room to this one.
    granted: Cell<bool>,
    /// Set when the waiting operation was dropped: the slot is skipped.
    gone: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Gate {
    pub fn new(limit: usize) -> Rc<Gate> {
        Rc::new(Gate {
            limit: limit.max(1),
            state: RefCell::default(),
        })
    }

    /// Room for one operation: at once while the connection has room and nobody waits.
    pub fn enter(self: &Rc<Self>, priority: Priority) -> Enter {
        let mut state = self.state.borrow_mut();
        let queued = !state.renewals.is_empty() || !state.others.is_empty();
        if state.in_flight < self.limit && !queued {
            state.in_flight += 1;
            return Enter {
                gate: self.clone(),
                slot: None,
            };
        }
        let slot = Rc::new(Slot::default());
        match priority {
            Priority::Renewal => state.renewals.push_back(slot.clone()),
            Priority::Other => state.others.push_back(slot.clone()),
        }
        Enter {
            gate: self.clone(),
            slot: Some(slot),
        }
    }

    /// One operation finished: its room goes to the next waiter, renewals first.
    fn leave(&self) {
        let next = {
            let mut state = self.state.borrow_mut();
            let next = std::iter::from_fn(|| {
                state
                    .renewals
                    .pop_front()
                    .or_else(|| state.others.pop_front())
            })
            .find(|s| !s.gone.get());
            if next.is_none() {
                state.in_flight -= 1;
            }
            next
        };
        if let Some(slot) = next {
            slot.granted.set(true);
            if let Some(w) = slot.waker.take() {
                w.wake();
            }
        }
    }

    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.state.borrow().in_flight
    }
}

/// Waits for room; answers the [`Permit`] that holds it.
pub(crate) struct Enter {
    gate: Rc<Gate>,
    slot: Option<Rc<Slot>>,
}

impl Future for Enter {
    type Output = Permit;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit> {
        match &self.slot {
            Some(slot) if !slot.granted.get() => {
                slot.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
            _ => {
                self.slot = None;
                Poll::Ready(Permit(Some(self.gate.clone())))
            }
        }
    }
}

impl Drop for Enter {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            // Room handed over but never taken up goes on to the next waiter.
            if slot.granted.get() {
                self.gate.leave();
            } else {
                slot.gone.set(true);
            }
        }
    }
}

/// Room for one operation on the connection, given back when dropped.
pub(crate) struct Permit(Option<Rc<Gate>>);

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(gate) = self.0.take() {
            gate.leave();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    fn now(enter: &mut Enter) -> Option<Permit> {
        let waker = futures_util::task::noop_waker();
        match Pin::new(enter).poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(p) => Some(p),
            Poll::Pending => None,
        }
    }

    #[test]
    fn renewals_take_freed_room_before_earlier_acquires() {
        let gate = Gate::new(2);
        let a = gate.enter(Priority::Other).now_or_never().unwrap();
        let _b = gate.enter(Priority::Other).now_or_never().unwrap();
        let mut acquire = gate.enter(Priority::Other);
        let mut renewal = gate.enter(Priority::Renewal);
        assert!(now(&mut acquire).is_none() && now(&mut renewal).is_none());
        drop(a);
        assert!(now(&mut acquire).is_none(), "the renewal goes first");
        let renewed = now(&mut renewal).expect("the freed room is the renewal's");
        assert_eq!(gate.in_flight(), 2);
        drop(renewed);
        assert!(now(&mut acquire).is_some());
    }

    #[test]
    fn a_newcomer_does_not_pass_the_queue() {
        let gate = Gate::new(1);
        let a = gate.enter(Priority::Other).now_or_never().unwrap();
        let mut queued = gate.enter(Priority::Other);
        assert!(now(&mut queued).is_none());
        drop(a);
        let mut late = gate.enter(Priority::Other);
        assert!(
            now(&mut late).is_none(),
            "room freed for the queue is not a newcomer's"
        );
        assert!(now(&mut queued).is_some());
    }

    #[test]
    fn a_dropped_waiter_passes_its_room_on() {
        let gate = Gate::new(1);
        let a = gate.enter(Priority::Other).now_or_never().unwrap();
        let gone = gate.enter(Priority::Renewal);
        let mut granted_unpolled = gate.enter(Priority::Other);
        let mut last = gate.enter(Priority::Other);
        drop(gone);
        drop(a);
        // The room went to `granted_unpolled`, which is dropped before taking it up.
        drop(std::mem::replace(
            &mut granted_unpolled,
            gate.enter(Priority::Other),
        ));
        let p = now(&mut last).expect("handed on past the dropped waiters");
        drop(p);
        assert!(now(&mut granted_unpolled).is_some());
        drop(granted_unpolled);
        assert_eq!(gate.in_flight(), 0);
    }
}
