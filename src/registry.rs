//! The native objects JavaScript refers to by number (adapters, Lockers, locks, abort handles,
//! delays), and the look-ups the exports share.

use locco_core::IdMap;
use std::cell::RefCell;
use std::rc::{Rc, Weak};

use locco_core::etcd::EtcdBackend;
use locco_core::mongo::MongoBackend;
use locco_core::postgres::PostgresBackend;
use locco_core::redis::RedisBackend;
use locco_core::redlock::RedlockBackend;
use locco_core::{Abort, Backend, Delay, Error, LocalWakeups, Lock, Locker, MemoryBackend};
use napi_derive::napi;

use crate::backends::js::JsBackend;
use crate::run::ops::{self, Raw};

/// Backends that cannot report releases get this process's release wake-ups.
pub(crate) enum Adapter {
    Memory(Rc<MemoryBackend>),
    Redis(Rc<LocalWakeups<RedisBackend>>),
    Postgres(Rc<LocalWakeups<PostgresBackend>>),
    Mongo(Rc<LocalWakeups<MongoBackend>>),
    Redlock(Rc<LocalWakeups<RedlockBackend>>),
    Etcd(Rc<LocalWakeups<EtcdBackend>>),
}

impl Adapter {
    fn backend(&self) -> Rc<dyn Backend> {
        match self {
            Adapter::Memory(m) => m.clone(),
            Adapter::Redis(r) => r.clone(),
            Adapter::Postgres(p) => p.clone(),
            Adapter::Mongo(m) => m.clone(),
            Adapter::Redlock(r) => r.clone(),
            Adapter::Etcd(e) => e.clone(),
        }
    }
}

#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) next: u64,
    pub(crate) adapters: IdMap<u64, Adapter>,
    /// Adapters written in JavaScript, by the facade's id, alive while a Locker uses one.
    pub(crate) js_adapters: IdMap<u64, Weak<LocalWakeups<JsBackend>>>,
    pub(crate) lockers: IdMap<u64, Locker>,
    /// Locks by id, with the id of the Locker that took each.
    pub(crate) locks: IdMap<u64, (u64, Lock)>,
    /// Held locks whose objects were collected; see `drop_locks`.
    pub(crate) detached: Vec<(u64, Lock)>,
    pub(crate) aborts: IdMap<u64, Abort>,
    pub(crate) delays: IdMap<u64, Delay>,
}

thread_local! {
    // Never dropped at thread exit; emptied by `teardown` at the environment's cleanup.
    pub(crate) static REG: std::mem::ManuallyDrop<RefCell<Registry>> = std::mem::ManuallyDrop::default();
}

/// Drops every native object at the environment's teardown, outside the registry's borrow.
pub fn teardown() {
    let reg = REG.with(|r| std::mem::take(&mut *r.borrow_mut()));
    drop(reg);
}

/// A fresh id for JavaScript: a u64 counter, exact as a JavaScript number up to 2^53.
pub(crate) fn next_id() -> f64 {
    REG.with(|r| {
        let mut r = r.borrow_mut();
        r.next += 1;
        r.next as f64
    })
}

pub(crate) fn adapter(id: f64) -> Result<Rc<dyn Backend>, Error> {
    let id = id as u64;
    REG.with(|r| {
        let r = r.borrow();
        r.adapters.get(&id).map(Adapter::backend).or_else(|| {
            let js = r.js_adapters.get(&id).and_then(Weak::upgrade)?;
            Some(js as Rc<dyn Backend>)
        })
    })
    .ok_or_else(|| Error::validation("adapter", "is not a locco-rs adapter (unknown id)"))
}

/// The adapter written in JavaScript that the facade keeps under `id`: the one Lockers over
/// it share (so they wake each other's waiters), or a new one when none is alive. When the
/// last Locker over it goes, the facade hears of it (`host::released`) and forgets the object.
pub(crate) fn js_adapter(id: f64, fenced: bool, queued: bool) -> Rc<LocalWakeups<JsBackend>> {
    REG.with(|r| {
        let mut r = r.borrow_mut();
        if let Some(live) = r.js_adapters.get(&(id as u64)).and_then(Weak::upgrade) {
            return live;
        }
        let backend = Rc::new(LocalWakeups::new(JsBackend {
            id,
            fenced,
            queued,
            board: Default::default(),
        }));
        r.js_adapters.retain(|_, w| w.strong_count() > 0);
        r.js_adapters.insert(id as u64, Rc::downgrade(&backend));
        backend
    })
}

/// Tells a waiter of the JavaScript adapter `id` that it may try now (its `watchQueue`
/// callback). Nothing happens when no Locker uses the adapter.
pub(crate) fn js_adapter_wake(id: f64, waiter: &str) {
    REG.with(|r| {
        let r = r.borrow();
        if let Some(live) = r.js_adapters.get(&(id as u64)).and_then(Weak::upgrade) {
            live.inner().board.wake(waiter);
        }
    })
}

pub(crate) fn locker(id: f64) -> Result<Locker, Error> {
    REG.with(|r| r.borrow().lockers.get(&(id as u64)).cloned())
        .ok_or_else(|| {
            Error::State("this Locker is closed: make a new one to take more locks".into())
        })
}

pub(crate) fn lock(id: f64) -> Option<Lock> {
    REG.with(|r| r.borrow().locks.get(&(id as u64)).map(|(_, l)| l.clone()))
}

/// Keeps a lock of Locker `locker_id`; answers its id.
pub(crate) fn keep(locker_id: f64, lock: Lock) -> f64 {
    let id = lock.id();
    REG.with(|r| r.borrow_mut().locks.insert(id, (locker_id as u64, lock)));
    id as f64
}

/// Keeps an adapter; answers its id.
pub(crate) fn register(adapter: Adapter) -> f64 {
    let id = next_id();
    REG.with(|r| r.borrow_mut().adapters.insert(id as u64, adapter));
    id
}

/// An id for JavaScript, or `FAILED` with the error.
pub(crate) fn id_or_fail(built: Result<f64, Error>) -> Raw {
    match built {
        Ok(id) => Raw(crate::js::num(id)),
        Err(e) => ops::fail(e),
    }
}

/// How many native objects the registry holds, by kind: for the tests that check they are
/// freed (`adapters, lockers, locks, detached, delays, aborts, jsAdapters`).
#[napi(catch_unwind)]
pub fn registry_sizes_for_test() -> Vec<u32> {
    REG.with(|r| {
        let r = r.borrow();
        [
            r.adapters.len(),
            r.lockers.len(),
            r.locks.len(),
            r.detached.len(),
            r.delays.len(),
            r.aborts.len(),
            r.js_adapters.len(),
        ]
        .map(|n| n as u32)
        .to_vec()
    })
}
