//! The in-memory backend: one process, no I/O, every answer ready at once.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};

use crate::contract::queue::{Queue, Queued};
use crate::contract::value::holder_of;
use crate::contract::{Backend, Coordination, KeyInfo, Op, Waiter};
use crate::rt::clock::{Clock, MonotonicClock};
use crate::rt::ids::KeyMap;

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

    /// Drops the places that ran out by `now`. A slot somebody still listens on waits in
    /// `backend` for its waiter's rejoin.
    fn prune(&mut self, now: f64, backend: &MemoryBackend) {
        if self.first_end > now {
            return;
        }
        let mut first_end = f64::INFINITY;
        self.places.retain(|p| {
            let live = p.expires_at > now;
            if !live && Rc::strong_count(&p.wake) > 1 {
                backend.keep_unplaced(&p.waiter, p.wake.clone());
            }
            if live {
                first_end = first_end.min(p.expires_at);
            }
            live
        });
        self.first_end = first_end;
    }

    /// The slot of the live head.
    fn head(&mut self, now: f64, backend: &MemoryBackend) -> Option<Rc<Wake>> {
        self.prune(now, backend);
        self.places.front().map(|p| p.wake.clone())
    }

    /// Renews `waiter`'s place until `expires_at`, or gives it a new one at the back with the
    /// slot `slot` makes.
    fn join(&mut self, waiter: &str, expires_at: f64, slot: impl FnOnce() -> Rc<Wake>) {
        match self
            .places
            .iter_mut()
            .position(|p| same_waiter(&p.waiter, waiter))
        {
            // A later end: `first_end` stays a time no place ends before.
            Some(i) => self.places[i].expires_at = expires_at,
            None => {
                self.places.push_back(Place {
                    waiter: waiter.to_owned(),
                    expires_at,
                    wake: slot(),
                });
                self.first_end = self.first_end.min(expires_at);
            }
        }
    }

    fn at_head(&self, waiter: &str) -> bool {
        self.places
            .front()
            .is_some_and(|p| same_waiter(&p.waiter, waiter))
    }
}

/// What the backend keeps of one key: its lease and its queue, under one key of one map, so
/// that a grant, a join or a release looks the key up once.
struct KeyState {
    /// The lease: live, run out, or left by a release for the next waiter's grant to refill
    /// (which then allocates neither the key nor the token again).
    entry: Option<Entry>,
    line: Line,
}

impl KeyState {
    /// The live lease, if any. The one test of the operator verbs (`inspect`, `list`,
    /// `force_release`): an entry a release left for the next waiter's grant, a lease that ran
    /// out and a queue without a lease are none (nor are coordination records, kept apart).
    fn live_entry(&self, now: f64) -> Option<&Entry> {
        self.entry.as_ref().filter(|e| e.live(now))
    }

    /// Neither a lease nor a waiter: the key can go.
    fn unused(&self) -> bool {
        self.entry.is_none() && self.line.places.is_empty()
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
    keys: RefCell<KeyMap<String, KeyState>>,
    fences: RefCell<KeyMap<String, u64>>,
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
            keys: RefCell::default(),
            fences: RefCell::default(),
            unplaced: RefCell::default(),
            records: RefCell::default(),
        }
    }

    /// Forgets every lock. Fencing counters stay, so tokens keep growing.
    pub fn clear(&self) {
        let now = self.clock.now();
        let heads: Vec<Rc<Wake>> = {
            let mut keys = self.keys.borrow_mut();
            keys.retain(|_, state| {
                state.entry = None;
                state.line.prune(now, self);
                !state.unused()
            });
            keys.values_mut()
                .filter_map(|state| state.line.head(now, self))
                .collect()
        };
        // Woken outside the borrow: a waker may reach back into the backend.
        heads.iter().for_each(|head| head.wake());
    }

    /// How many keys carry a live lease.
    pub fn len(&self) -> usize {
        let now = self.clock.now();
        let keys = self.keys.borrow();
        keys.values()
            .filter(|s| s.live_entry(now).is_some())
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        let now = self.clock.now();
        let head = {
            let mut keys = self.keys.borrow_mut();
            let Some(state) = keys.get_mut(key) else {
                return;
            };
            if state.live_entry(now).is_some() {
                return;
            }
            let head = state.line.head(now, self);
            if state.unused() {
                keys.remove(key);
            }
            head
        };
        // Woken outside the borrow: a waker may reach back into the backend.
        if let Some(head) = head {
            head.wake();
        }
    }

    /// Grants `key`'s lease to `token` when it is free and `waiter` may take it: nobody waits,
    /// or it is the head of the queue (then it leaves the queue).
    fn grant_in(
        &self,
        state: &mut KeyState,
        token: &str,
        ttl: u32,
        waiter: Option<&str>,
        now: f64,
    ) -> bool {
        if state.live_entry(now).is_some() {
            return false;
        }
        state.line.prune(now, self);
        if !state.line.places.is_empty() {
            // The head is compared in place: cloning it cost an allocation per hand-off.
            if !waiter.is_some_and(|w| state.line.at_head(w)) {
                return false;
            }
            state.line.places.pop_front();
        }
        let expires_at = now + ttl as f64;
        match &mut state.entry {
            // An entry whose lease ended (or that a release left for the next waiter) is
            // refilled: no new token is allocated.
            Some(e) => {
                e.token.clear();
                e.token.push_str(token);
                e.expires_at = expires_at;
            }
            None => {
                state.entry = Some(Entry {
                    token: token.to_owned(),
                    expires_at,
                })
            }
        }
        true
    }

    /// A fresh key's state, its lease granted to `token`.
    fn granted(token: &str, ttl: u32, now: f64) -> KeyState {
        KeyState {
            entry: Some(Entry {
                token: token.to_owned(),
                expires_at: now + ttl as f64,
            }),
            line: Line::new(),
        }
    }

    /// [`Self::grant_in`] for `key`, which is added when it is new.
    fn grant(&self, key: &str, token: &str, ttl: u32, now: f64) -> bool {
        let mut keys = self.keys.borrow_mut();
        match keys.get_mut(key) {
            Some(state) => self.grant_in(state, token, ttl, None, now),
            None => {
                keys.insert(key.to_owned(), Self::granted(token, ttl, now));
                true
            }
        }
    }

    fn fence_next(&self, key: &str) -> u64 {
        let mut fences = self.fences.borrow_mut();
        let fence = fences.entry(key.to_owned()).or_insert(0);
        *fence += 1;
        *fence
    }

    /// What an operator sees of `key` at `now`.
    fn info(&self, key: &str, state: Option<&KeyState>, now: f64) -> KeyInfo {
        let live = state.and_then(|s| s.live_entry(now));
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
        let mut keys = self.keys.borrow_mut();
        match keys.get_mut(key).and_then(|s| s.entry.as_mut()) {
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
        Op::ready(Ok(self.grant(key, token, ttl, now)))
    }

    fn release(&self, key: &str, token: &str) -> Op<bool> {
        let now = self.clock.now();
        let mut keys = self.keys.borrow_mut();
        let ours = |s: &&mut KeyState| s.entry.as_ref().is_some_and(|e| e.held_by(token, now));
        let Some(state) = keys.get_mut(key).filter(ours) else {
            return Op::ready(Ok(false));
        };
        // The key is free: the live head of its queue, if anybody waits, hears it.
        let head = state.line.head(now, self);
        match (&head, &mut state.entry) {
            // That waiter's grant refills this entry rather than allocate the token again.
            (Some(_), Some(entry)) => entry.expires_at = f64::NEG_INFINITY,
            _ => {
                keys.remove(key);
            }
        }
        drop(keys);
        // Woken outside the borrow: a waker may reach back into the backend.
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
        if !self.grant(key, token, ttl, self.clock.now()) {
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
        let keys = self.keys.borrow();
        Op::ready(Ok(self.info(key, keys.get(key), now)))
    }

    fn list(&self, prefix: &str, limit: u32) -> Op<Vec<KeyInfo>> {
        let now = self.clock.now();
        let keys = self.keys.borrow();
        let mut found: Vec<&String> = keys
            .iter()
            .filter(|(k, s)| k.starts_with(prefix) && s.live_entry(now).is_some())
            .map(|(k, _)| k)
            .collect();
        found.sort();
        found.truncate(limit as usize);
        let found = found
            .into_iter()
            .map(|k| self.info(k, keys.get(k), now))
            .collect();
        Op::ready(Ok(found))
    }

    fn force_release(&self, key: &str) -> Op<bool> {
        let now = self.clock.now();
        {
            let mut keys = self.keys.borrow_mut();
            let held = |s: &&mut KeyState| s.live_entry(now).is_some();
            let Some(state) = keys.get_mut(key).filter(held) else {
                return Op::ready(Ok(false));
            };
            state.entry = None;
            if state.unused() {
                keys.remove(key);
            }
        }
        self.wake_head(key);
        Op::ready(Ok(true))
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
        let mut keys = self.keys.borrow_mut();
        let granted = || Op::ready(Ok(Queued::Granted(fenced.then(|| self.fence_next(key)))));
        // One lookup for the try and the join; the key is copied only when it is new.
        let Some(state) = keys.get_mut(key) else {
            keys.insert(key.to_owned(), Self::granted(token, ttl, now));
            return granted();
        };
        if self.grant_in(state, token, ttl, Some(waiter), now) {
            return granted();
        }
        let line = &mut state.line;
        line.join(waiter, now + lease as f64, || self.slot_for(waiter));
        let retry_in = if line.at_head(waiter) {
            state.live_entry(now).map(|e| e.expires_at - now)
        } else {
            None
        };
        Op::ready(Ok(Queued::Waiting { retry_in }))
    }

    fn leave(&self, key: &str, waiter: &str) -> Op<()> {
        let was_head = {
            let mut keys = self.keys.borrow_mut();
            let Some(state) = keys.get_mut(key) else {
                return Op::ready(Ok(()));
            };
            let was_head = state.line.at_head(waiter);
            state
                .line
                .places
                .retain(|p| !same_waiter(&p.waiter, waiter));
            if state.unused() {
                keys.remove(key);
            }
            was_head
        };
        if was_head {
            self.wake_head(key);
        }
        Op::ready(Ok(()))
    }

    fn wakeups(&self, key: &str, waiter: &str) -> Box<dyn Waiter> {
        // From the back: a waiter listens right after it joined, so its place is the newest.
        let placed = self.keys.borrow().get(key).and_then(|state| {
            state
                .line
                .places
                .iter()
                .rev()
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

    fn joins_on_first_try(&self) -> bool {
        true
    }
}

impl Coordination for MemoryBackend {
    fn peek(&self, key: &str) -> Op<Option<String>> {
        let now = self.clock.now();
        let keys = self.keys.borrow();
        let live = keys.get(key).and_then(|s| s.live_entry(now));
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
    use crate::rt::timer::ManualClock;
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
    fn operator_verbs_see_and_remove_only_a_live_lease() {
        // A key a release left for its waiter is no lease: not shown, and a forced release
        // leaves the entry that the waiter's grant refills.
        let b = released_while_w1_waits();
        assert!(!ready(b.inspect("k")).held);
        assert!(ready(b.list("", 10)).is_empty());
        assert!(!ready(b.force_release("k")));
        assert!(
            b.keys.borrow().get("k").is_some_and(|s| s.entry.is_some()),
            "the forced release took the reserved entry"
        );
        assert_eq!(join(&b, "w1"), Queued::Granted(None));
        // A coordination record is no lock either.
        ready(b.put("rec", "v", 1_000));
        assert!(!ready(b.inspect("rec")).held);
        assert!(ready(b.list("rec", 10)).is_empty());
        assert!(!ready(b.force_release("rec")));
        assert_eq!(ready(b.get("rec")).as_deref(), Some("v"));
        // A live lease is shown and removed.
        assert!(ready(b.inspect("k")).held);
        assert!(ready(b.force_release("k")));
        assert!(!ready(b.is_held("k", "w1")));
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
