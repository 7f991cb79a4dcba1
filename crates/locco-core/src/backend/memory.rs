//! The in-memory backend: one process, no I/O, every answer ready at once.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};

use crate::backend::holder::holder_of;
use crate::backend::queue::{Queue, Queued};
use crate::backend::{Backend, Coordination, KeyInfo, Op, Waiter};
use crate::engine::clock::{Clock, MonotonicClock};
use crate::engine::ids::KeyMap;

struct Entry {
    token: String,
    expires_at: f64,
}

/// Whether two waiter ids are the same. Ids share a long prefix and differ in their serial
/// number at the end, so the last byte is compared first (the queue is scanned for an id on
/// every join), then the whole at once.
fn same_waiter(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.as_bytes().last() == b.as_bytes().last() && a == b
}

impl Entry {
    /// Whether its lease still runs at `now` (a released entry kept for the next waiter's
    /// grant never does).
    fn live(&self, now: f64) -> bool {
        self.expires_at > now
    }

    /// Whether `token` holds this entry with its lease still running at `now`.
    fn held_by(&self, token: &str, now: f64) -> bool {
        self.token == token && self.live(now)
    }
}

/// A waiter's place in a key's queue, with the slot its listener hears "try now" in: a wake
/// goes straight to the head's slot, with no lookup by waiter id (the backend and its waiters
/// share one thread).
struct Place {
    waiter: String,
    expires_at: f64,
    wake: Rc<Wake>,
}

#[derive(Default)]
struct Wake {
    /// Woken and not yet seen by the listener (or woken before anyone listened).
    woken: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Wake {
    fn wake(&self) {
        self.woken.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

/// A key's queue: its places in order, and a time no place's lease ends before, so that a
/// look at the queue drops the places that ran out only when one may have (every grant and
/// release looks).
struct Line {
    places: VecDeque<Place>,
    first_end: f64,
}

impl Line {
    fn new() -> Self {
        Line {
            places: VecDeque::new(),
            first_end: f64::INFINITY,
        }
    }
}

/// What `wakeups` answers: the slot of the waiter's place.
struct Listener(Rc<Wake>);

impl Waiter for Listener {
    fn released(&mut self) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(std::future::poll_fn(move |cx| {
            if self.0.woken.replace(false) {
                return Poll::Ready(());
            }
            self.0.waker.set(Some(cx.waker().clone()));
            Poll::Pending
        }))
    }
}

/// Locks in a `HashMap`, with a fair queue of waiters per key (see [`Queue`]): a free key goes
/// to its longest waiter, so under contention ownership rotates instead of going to whoever
/// polls first.
pub struct MemoryBackend {
    clock: Rc<dyn Clock>,
    entries: RefCell<KeyMap<String, Entry>>,
    fences: RefCell<KeyMap<String, u64>>,
    queues: RefCell<KeyMap<String, Line>>,
    /// Listeners whose waiter has no place: it ran out (a stalled waiter), or the join never
    /// arrived (a wrapper that loses requests). The waiter's next join takes its slot back.
    unplaced: RefCell<KeyMap<String, Rc<Wake>>>,
    /// Coordination records: value and expiry.
    records: RefCell<KeyMap<String, (String, f64)>>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new(Rc::new(MonotonicClock))
    }
}

impl MemoryBackend {
    /// A backend whose leases run on `clock` (milliseconds).
    pub fn new(clock: Rc<dyn Clock>) -> Self {
        MemoryBackend {
            clock,
            entries: RefCell::default(),
            fences: RefCell::default(),
            queues: RefCell::default(),
            unplaced: RefCell::default(),
            records: RefCell::default(),
        }
    }

    /// Forgets every lock. Fencing counters stay, so tokens keep growing.
    pub fn clear(&self) {
        self.entries.borrow_mut().clear();
        let keys: Vec<String> = self.queues.borrow().keys().cloned().collect();
        keys.iter().for_each(|k| self.wake_head(k));
    }

    /// How many keys carry a live lease.
    pub fn len(&self) -> usize {
        let now = self.clock.now();
        let entries = self.entries.borrow();
        entries.values().filter(|e| e.live(now)).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on `key`'s queue after dropping the places that ran out, and forgets the queue
    /// when it is left empty. `None` when the key has no queue.
    fn live_queue<R>(
        &self,
        key: &str,
        now: f64,
        f: impl FnOnce(&mut VecDeque<Place>) -> R,
    ) -> Option<R> {
        let mut queues = self.queues.borrow_mut();
        let line = queues.get_mut(key)?;
        if line.first_end <= now {
            let mut first_end = f64::INFINITY;
            line.places.retain(|p| {
                let live = p.expires_at > now;
                // Somebody still listens on a place that ran out: the slot waits for its rejoin.
                if !live && Rc::strong_count(&p.wake) > 1 {
                    self.keep_unplaced(&p.waiter, p.wake.clone());
                }
                if live {
                    first_end = first_end.min(p.expires_at);
                }
                live
            });
            line.first_end = first_end;
        }
        let answer = f(&mut line.places);
        if line.places.is_empty() {
            queues.remove(key);
        }
        Some(answer)
    }

    /// The slot of the live head of `key`'s queue.
    fn head(&self, key: &str, now: f64) -> Option<Rc<Wake>> {
        self.live_queue(key, now, |q| q.front().map(|p| p.wake.clone()))
            .flatten()
    }

    /// Keeps the slot of a listener whose waiter has no place, forgetting those nobody
    /// listens on any more (their waiter ended).
    fn keep_unplaced(&self, waiter: &str, wake: Rc<Wake>) {
        let mut unplaced = self.unplaced.borrow_mut();
        unplaced.retain(|_, w| Rc::strong_count(w) > 1);
        unplaced.insert(waiter.to_owned(), wake);
    }

    /// The slot for a new place of `waiter`: its listener's, when it listened while it had
    /// no place.
    fn slot_for(&self, waiter: &str) -> Rc<Wake> {
        let mut unplaced = self.unplaced.borrow_mut();
        if unplaced.is_empty() {
            return Rc::default();
        }
        unplaced.remove(waiter).unwrap_or_default()
    }

    /// Pushes a wake to the head of `key`'s queue, when the key is free.
    fn wake_head(&self, key: &str) {
        self.wake_head_at(key, self.clock.now());
    }

    /// [`Self::wake_head`] with the clock already read: each reading costs more than the
    /// map lookups of a whole release.
    fn wake_head_at(&self, key: &str, now: f64) {
        if self.live_until(key, now).is_none() {
            // Woken outside the queue's borrow: a waker may reach back into the backend.
            if let Some(head) = self.head(key, now) {
                head.wake();
            }
        }
    }

    fn live_until(&self, key: &str, now: f64) -> Option<f64> {
        let entries = self.entries.borrow();
        entries
            .get(key)
            .filter(|e| e.live(now))
            .map(|e| e.expires_at)
    }

    /// A grant for `key`, when it is free and `waiter` may take it: nobody waits, or it is
    /// the head of the queue (then it leaves the queue). The key is looked up once: a
    /// hand-off makes three grants, and each lookup hashes the key.
    fn grant_in_turn(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: Option<&str>,
        now: f64,
    ) -> bool {
        let mut entries = self.entries.borrow_mut();
        let entry = entries.get_mut(key);
        if entry.as_ref().is_some_and(|e| e.live(now)) {
            return false;
        }
        // The head is compared in place: cloning it cost an allocation per hand-off.
        let our_turn = self.live_queue(key, now, |queue| match queue.front() {
            None => true,
            Some(head) if waiter.is_some_and(|w| same_waiter(&head.waiter, w)) => {
                queue.pop_front();
                true
            }
            Some(_) => false,
        });
        if our_turn == Some(false) {
            return false;
        }
        let expires_at = now + ttl as f64;
        match entry {
            // An entry whose lease ended (or that a release left for the next waiter) is
            // refilled: no new key or token is allocated.
            Some(e) => {
                e.token.clear();
                e.token.push_str(token);
                e.expires_at = expires_at;
            }
            None => {
                let entry = Entry {
                    token: token.to_owned(),
                    expires_at,
                };
                entries.insert(key.to_owned(), entry);
            }
        }
        true
    }

    fn fence_next(&self, key: &str) -> u64 {
        let mut fences = self.fences.borrow_mut();
        let fence = fences.entry(key.to_owned()).or_insert(0);
        *fence += 1;
        *fence
    }

    /// What an operator sees of `key` at `now`.
    fn info(&self, key: &str, entry: Option<&Entry>, now: f64) -> KeyInfo {
        let live = entry.filter(|e| e.live(now));
        KeyInfo {
            key: key.to_owned(),
            held: live.is_some(),
            ttl_left: live.map(|e| e.expires_at - now),
            fence: self.fences.borrow().get(key).copied(),
            holder: live.and_then(|e| holder_of(&e.token)),
        }
    }

    /// Runs `f` on the entry when `key` carries `token` and a live lease.
    fn ours<R>(&self, key: &str, token: &str, f: impl FnOnce(&mut Entry, f64) -> R) -> Option<R> {
        let now = self.clock.now();
        let mut entries = self.entries.borrow_mut();
        match entries.get_mut(key) {
            Some(e) if e.held_by(token, now) => Some(f(e, now)),
            _ => None,
        }
    }
}

impl Backend for MemoryBackend {
    fn name(&self) -> &str {
        "memory"
    }

    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let now = self.clock.now();
        Op::ready(Ok(self.grant_in_turn(key, token, ttl, None, now)))
    }

    fn release(&self, key: &str, token: &str) -> Op<bool> {
        let now = self.clock.now();
        let mut entries = self.entries.borrow_mut();
        let Some(entry) = entries.get_mut(key).filter(|e| e.held_by(token, now)) else {
            return Op::ready(Ok(false));
        };
        // The key is free: the live head of its queue, if anybody waits, hears it.
        let head = self.head(key, now);
        if head.is_some() {
            // That waiter's grant refills this entry rather than allocate the key and the
            // token again.
            entry.expires_at = f64::NEG_INFINITY;
        } else {
            entries.remove(key);
        }
        drop(entries);
        // Woken outside the borrows: a waker may reach back into the backend.
        if let Some(head) = head {
            head.wake();
        }
        Op::ready(Ok(true))
    }

    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let done = self.ours(key, token, |e, now| e.expires_at = now + ttl as f64);
        Op::ready(Ok(done.is_some()))
    }

    fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        Op::ready(Ok(self.ours(key, token, |_, _| ()).is_some()))
    }

    fn supports_fencing(&self) -> bool {
        true
    }

    fn acquire_fenced(&self, key: &str, token: &str, ttl: u32) -> Op<Option<u64>> {
        if !self.grant_in_turn(key, token, ttl, None, self.clock.now()) {
            return Op::ready(Ok(None));
        }
        Op::ready(Ok(Some(self.fence_next(key))))
    }

    fn queue(&self) -> Option<&dyn Queue> {
        Some(self)
    }

    fn coordination(&self) -> Option<&dyn Coordination> {
        Some(self)
    }

    fn inspect(&self, key: &str) -> Op<KeyInfo> {
        let now = self.clock.now();
        let entries = self.entries.borrow();
        Op::ready(Ok(self.info(key, entries.get(key), now)))
    }

    fn list(&self, prefix: &str, limit: u32) -> Op<Vec<KeyInfo>> {
        let now = self.clock.now();
        let entries = self.entries.borrow();
        let mut keys: Vec<&String> = entries
            .iter()
            .filter(|(k, e)| k.starts_with(prefix) && e.live(now))
            .map(|(k, _)| k)
            .collect();
        keys.sort();
        keys.truncate(limit as usize);
        let found = keys
            .into_iter()
            .map(|k| self.info(k, entries.get(k), now))
            .collect();
        Op::ready(Ok(found))
    }

    fn force_release(&self, key: &str) -> Op<bool> {
        let now = self.clock.now();
        let removed = self.entries.borrow_mut().remove(key);
        let live = removed.is_some_and(|e| e.live(now));
        if live {
            self.wake_head_at(key, now);
        }
        Op::ready(Ok(live))
    }
}

impl Queue for MemoryBackend {
    fn acquire_queued(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: &str,
        lease: u32,
        fenced: bool,
    ) -> Op<Queued> {
        let now = self.clock.now();
        if self.grant_in_turn(key, token, ttl, Some(waiter), now) {
            let fence = fenced.then(|| self.fence_next(key));
            return Op::ready(Ok(Queued::Granted(fence)));
        }
        let expires_at = now + lease as f64;
        let join = |line: &mut Line| {
            let queue = &mut line.places;
            match queue
                .iter_mut()
                .position(|p| same_waiter(&p.waiter, waiter))
            {
                // A later end: `first_end` stays a time no place ends before.
                Some(i) => queue[i].expires_at = expires_at,
                None => {
                    queue.push_back(Place {
                        waiter: waiter.to_owned(),
                        expires_at,
                        wake: self.slot_for(waiter),
                    });
                    line.first_end = line.first_end.min(expires_at);
                }
            }
            queue
                .front()
                .is_some_and(|p| same_waiter(&p.waiter, waiter))
        };
        let mut queues = self.queues.borrow_mut();
        // One lookup when the key has a queue (the common case: the key was held); the key is
        // copied only for a queue that is new.
        let at_head = match queues.get_mut(key) {
            Some(queue) => join(queue),
            None => {
                let mut line = Line::new();
                let at_head = join(&mut line);
                queues.insert(key.to_owned(), line);
                at_head
            }
        };
        drop(queues);
        let retry_in = at_head
            .then(|| self.live_until(key, now).map(|end| end - now))
            .flatten();
        Op::ready(Ok(Queued::Waiting { retry_in }))
    }

    fn leave(&self, key: &str, waiter: &str) -> Op<()> {
        let was_head = {
            let mut queues = self.queues.borrow_mut();
            let Some(Line { places: queue, .. }) = queues.get_mut(key) else {
                return Op::ready(Ok(()));
            };
            let was_head = queue
                .front()
                .is_some_and(|p| same_waiter(&p.waiter, waiter));
            queue.retain(|p| !same_waiter(&p.waiter, waiter));
            if queue.is_empty() {
                queues.remove(key);
            }
            was_head
        };
        if was_head {
            self.wake_head(key);
        }
        Op::ready(Ok(()))
    }

    fn wakeups(&self, key: &str, waiter: &str) -> Box<dyn Waiter> {
        let placed = self.queues.borrow().get(key).and_then(|line| {
            line.places
                .iter()
                .find(|p| same_waiter(&p.waiter, waiter))
                .map(|p| p.wake.clone())
        });
        let wake = placed.unwrap_or_else(|| {
            // No place (yet, or any more): try now, and the rejoin takes this slot.
            let wake = Rc::new(Wake::default());
            wake.woken.set(true);
            self.keep_unplaced(waiter, wake.clone());
            wake
        });
        Box::new(Listener(wake))
    }
}

impl Coordination for MemoryBackend {
    fn peek(&self, key: &str) -> Op<Option<String>> {
        let now = self.clock.now();
        let entries = self.entries.borrow();
        let live = entries.get(key).filter(|e| e.live(now));
        Op::ready(Ok(live.map(|e| e.token.clone())))
    }

    fn put(&self, key: &str, value: &str, ttl: u32) -> Op<()> {
        let expires_at = self.clock.now() + ttl as f64;
        let mut records = self.records.borrow_mut();
        records.insert(key.to_owned(), (value.to_owned(), expires_at));
        Op::ready(Ok(()))
    }

    fn get(&self, key: &str) -> Op<Option<String>> {
        let now = self.clock.now();
        let records = self.records.borrow();
        let live = records.get(key).filter(|(_, at)| *at > now);
        Op::ready(Ok(live.map(|(v, _)| v.clone())))
    }

    fn delete(&self, key: &str) -> Op<()> {
        self.records.borrow_mut().remove(key);
        Op::ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::timer::ManualClock;
    use futures_util::FutureExt;

    const LEASE: u32 = 3_000;

    fn backend() -> (MemoryBackend, Rc<ManualClock>) {
        let clock = ManualClock::new(0.0);
        (MemoryBackend::new(clock.clone()), clock)
    }

    fn ready<T>(op: Op<T>) -> T {
        op.now_or_never()
            .expect("answered at once")
            .expect("no error")
    }

    fn join(b: &MemoryBackend, waiter: &str) -> Queued {
        ready(b.acquire_queued("k", waiter, 1_000, waiter, LEASE, false))
    }

    fn woken(listener: &mut Box<dyn Waiter>) -> bool {
        listener.released().now_or_never().is_some()
    }

    /// A backend where "holder" took "k", "w1" joined its queue, and "holder" released it.
    fn released_while_w1_waits() -> MemoryBackend {
        let (b, _) = backend();
        assert!(ready(b.acquire("k", "holder", 1_000)));
        join(&b, "w1");
        assert!(ready(b.release("k", "holder")));
        b
    }

    #[test]
    fn a_release_wakes_the_head_only_and_once() {
        let (b, _) = backend();
        assert!(ready(b.acquire("k", "holder", 1_000)));
        assert!(matches!(join(&b, "w1"), Queued::Waiting { .. }));
        assert!(matches!(join(&b, "w2"), Queued::Waiting { .. }));
        let (mut w1, mut w2) = (b.wakeups("k", "w1"), b.wakeups("k", "w2"));
        assert!(!woken(&mut w1) && !woken(&mut w2));
        assert!(ready(b.release("k", "holder")));
        assert!(woken(&mut w1), "the head hears the release");
        assert!(!woken(&mut w1), "one release, one wake");
        assert!(!woken(&mut w2), "the second in line waits for its turn");
        assert_eq!(join(&b, "w1"), Queued::Granted(None));
        assert!(ready(b.release("k", "w1")));
        assert!(woken(&mut w2));
    }

    #[test]
    fn a_key_released_while_others_wait_is_free_and_its_old_token_gone() {
        let b = released_while_w1_waits();
        let info = ready(b.inspect("k"));
        assert!(!info.held && info.ttl_left.is_none());
        assert!(ready(b.list("", 10)).is_empty());
        assert!(!ready(b.is_held("k", "holder")));
        assert!(!ready(b.release("k", "holder")), "released once only");
        assert!(
            !ready(b.acquire("k", "late", 1_000)),
            "the key is the waiter's turn"
        );
        assert_eq!(join(&b, "w1"), Queued::Granted(None));
        assert!(ready(b.is_held("k", "w1")));
        assert!(ready(b.release("k", "w1")));
        assert!(
            ready(b.acquire("k", "next", 1_000)),
            "nobody waits: free to all"
        );
    }

    #[test]
    fn a_wake_before_anyone_listens_is_kept() {
        let b = released_while_w1_waits();
        let mut w1 = b.wakeups("k", "w1");
        assert!(woken(&mut w1));
    }

    #[test]
    fn a_listener_whose_place_ran_out_hears_releases_after_it_rejoins() {
        let (b, clock) = backend();
        assert!(ready(b.acquire("k", "holder", 10_000)));
        join(&b, "w1");
        let mut w1 = b.wakeups("k", "w1");
        // The waiter stalled past its place's lease: the release's look at the queue drops it.
        clock.advance(LEASE as f64 + 1.0);
        join(&b, "w2");
        assert!(ready(b.release("k", "holder")));
        assert!(!woken(&mut w1), "w1's place ran out: w2 is the head");
        assert!(
            matches!(join(&b, "w1"), Queued::Waiting { .. }),
            "back in the queue, behind w2"
        );
        assert_eq!(join(&b, "w2"), Queued::Granted(None));
        assert!(ready(b.release("k", "w2")));
        assert!(
            woken(&mut w1),
            "the rejoined place kept the listener's slot"
        );
    }

    #[test]
    fn a_listener_without_a_place_tries_at_once_and_keeps_its_slot_for_the_join() {
        let (b, _) = backend();
        assert!(ready(b.acquire("k", "holder", 1_000)));
        // The join never arrived (a request lost on the way).
        let mut w1 = b.wakeups("k", "w1");
        assert!(woken(&mut w1), "no place: the waiter should try now");
        join(&b, "w1");
        assert!(!woken(&mut w1));
        assert!(ready(b.release("k", "holder")));
        assert!(woken(&mut w1));
    }

    #[test]
    fn slots_nobody_listens_on_are_forgotten() {
        let (b, _) = backend();
        for i in 0..100 {
            drop(b.wakeups("k", &format!("gone{i}")));
        }
        drop(b.wakeups("k", "last"));
        assert!(
            b.unplaced.borrow().len() <= 1,
            "dead slots are dropped on the next keep"
        );
    }
}
