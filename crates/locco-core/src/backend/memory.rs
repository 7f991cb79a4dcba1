//! The in-memory backend: one process, no I/O, every answer ready at once.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::backend::waiters::LocalWaiters;
use crate::backend::{Backend, Coordination, Op, Waiter};
use crate::engine::clock::{Clock, MonotonicClock};

struct Entry {
    token: String,
    expires_at: f64,
}

/// Locks in a `HashMap`, with a FIFO queue of waiters per key: a release wakes the longest
/// waiter, so under contention ownership rotates instead of going to whoever polls first.
pub struct MemoryBackend {
    clock: Rc<dyn Clock>,
    entries: RefCell<HashMap<String, Entry>>,
    fences: RefCell<HashMap<String, u64>>,
    waiters: LocalWaiters,
    /// Coordination records: value and expiry.
    records: RefCell<HashMap<String, (String, f64)>>,
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
            waiters: LocalWaiters::default(),
            records: RefCell::default(),
        }
    }

    /// Forgets every lock. Fencing counters stay, so tokens keep growing.
    pub fn clear(&self) {
        self.entries.borrow_mut().clear();
        self.waiters.wake_all();
    }

    /// How many keys carry a live lease.
    pub fn len(&self) -> usize {
        let now = self.clock.now();
        let entries = self.entries.borrow();
        entries.values().filter(|e| e.expires_at > now).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn grant(&self, key: &str, token: &str, ttl: u32) -> bool {
        let now = self.clock.now();
        let expires_at = now + ttl as f64;
        let mut entries = self.entries.borrow_mut();
        match entries.get_mut(key) {
            Some(e) if e.expires_at > now => false,
            Some(e) => {
                e.token.clear();
                e.token.push_str(token);
                e.expires_at = expires_at;
                true
            }
            None => {
                let entry = Entry {
                    token: token.to_owned(),
                    expires_at,
                };
                entries.insert(key.to_owned(), entry);
                true
            }
        }
    }

    /// Runs `f` on the entry when `key` carries `token` and a live lease.
    fn ours<R>(&self, key: &str, token: &str, f: impl FnOnce(&mut Entry, f64) -> R) -> Option<R> {
        let now = self.clock.now();
        let mut entries = self.entries.borrow_mut();
        match entries.get_mut(key) {
            Some(e) if e.token == token && e.expires_at > now => Some(f(e, now)),
            _ => None,
        }
    }
}

impl Backend for MemoryBackend {
    fn name(&self) -> &str {
        "memory"
    }

    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        Op::ready(Ok(self.grant(key, token, ttl)))
    }

    fn release(&self, key: &str, token: &str) -> Op<bool> {
        let ours = self.ours(key, token, |_, _| ()).is_some();
        if ours {
            self.entries.borrow_mut().remove(key);
            self.waiters.wake_next(key);
        }
        Op::ready(Ok(ours))
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
        if !self.grant(key, token, ttl) {
            return Op::ready(Ok(None));
        }
        let mut fences = self.fences.borrow_mut();
        let fence = fences.entry(key.to_owned()).or_insert(0);
        *fence += 1;
        Op::ready(Ok(Some(*fence)))
    }

    fn waiter(&self, key: &str) -> Option<Box<dyn Waiter>> {
        Some(self.waiters.waiter(key))
    }

    fn coordination(&self) -> Option<&dyn Coordination> {
        Some(self)
    }
}

impl Coordination for MemoryBackend {
    fn peek(&self, key: &str) -> Op<Option<String>> {
        let now = self.clock.now();
        let entries = self.entries.borrow();
        let live = entries.get(key).filter(|e| e.expires_at > now);
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
