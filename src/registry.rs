//! The native objects JavaScript refers to by number: adapters, lockers, locks, abort
//! handles and delay functions, with the exports that act on them.

use locco_core::IdMap;
use std::cell::RefCell;
use std::rc::{Rc, Weak};

use locco_core::mongo::{locks_indexes_json, MongoBackend, MongoOptions};
use locco_core::postgres::{locks_ddl, PostgresBackend, PostgresOptions};
use locco_core::redis::{RedisBackend, RedisOptions, WaitForReplicas};
use locco_core::{
    validate_ttl, Abort, AcquireOptions, AutoExtend, Backend, Backoff, Delay, Error, LocalWakeups,
    Lock, LockState, Locker, LockerOptions, MemoryBackend, RetryOverrides, Runtime,
};
use napi::bindgen_prelude::Either;
use napi_derive::napi;

use crate::executor::Spawner;
use crate::host::{self, Hooks, JsBackend, JsClock, JsDelay};
use crate::ops::{self, Answer, Raw};
use crate::text::Key;

/// Backends that cannot report releases get this process's release wake-ups.
enum Adapter {
    Memory(Rc<MemoryBackend>),
    Redis(Rc<LocalWakeups<RedisBackend>>),
    Postgres(Rc<LocalWakeups<PostgresBackend>>),
    Mongo(Rc<LocalWakeups<MongoBackend>>),
}

impl Adapter {
    fn backend(&self) -> Rc<dyn Backend> {
        match self {
            Adapter::Memory(m) => m.clone(),
            Adapter::Redis(r) => r.clone(),
            Adapter::Postgres(p) => p.clone(),
            Adapter::Mongo(m) => m.clone(),
        }
    }
}

#[derive(Default)]
struct Registry {
    next: u64,
    adapters: IdMap<u64, Adapter>,
    /// Adapters written in JavaScript, by the facade's id, alive while a Locker uses one.
    js_adapters: IdMap<u64, Weak<LocalWakeups<JsBackend>>>,
    lockers: IdMap<u64, Locker>,
    /// Locks by id, with the id of the Locker that took each.
    locks: IdMap<u64, (u64, Lock)>,
    /// Held locks whose objects were collected; see `drop_locks`.
    detached: Vec<(u64, Lock)>,
    aborts: IdMap<u64, Abort>,
    delays: IdMap<u64, Delay>,
}

thread_local! {
    // Never dropped at thread exit; emptied by `teardown` at the environment's cleanup.
    static REG: std::mem::ManuallyDrop<RefCell<Registry>> = std::mem::ManuallyDrop::default();
}

/// Drops every native object at the environment's teardown, outside the registry's borrow.
pub fn teardown() {
    let reg = REG.with(|r| std::mem::take(&mut *r.borrow_mut()));
    drop(reg);
}

/// A fresh id for JavaScript: a u64 counter, exact as a JavaScript number up to 2^53.
fn next_id() -> f64 {
    REG.with(|r| {
        let mut r = r.borrow_mut();
        r.next += 1;
        r.next as f64
    })
}

fn adapter(id: f64) -> Result<Rc<dyn Backend>, Error> {
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
fn js_adapter(id: f64, fenced: bool) -> Rc<LocalWakeups<JsBackend>> {
    REG.with(|r| {
        let mut r = r.borrow_mut();
        if let Some(live) = r.js_adapters.get(&(id as u64)).and_then(Weak::upgrade) {
            return live;
        }
        let backend = Rc::new(LocalWakeups::new(JsBackend { id, fenced }));
        r.js_adapters.retain(|_, w| w.strong_count() > 0);
        r.js_adapters.insert(id as u64, Rc::downgrade(&backend));
        backend
    })
}

fn locker(id: f64) -> Result<Locker, Error> {
    REG.with(|r| r.borrow().lockers.get(&(id as u64)).cloned())
        .ok_or_else(|| {
            Error::State("this Locker is closed: make a new one to take more locks".into())
        })
}

fn lock(id: f64) -> Option<Lock> {
    REG.with(|r| r.borrow().locks.get(&(id as u64)).map(|(_, l)| l.clone()))
}

/// Keeps a lock of Locker `locker_id`; answers its id.
fn keep(locker_id: f64, lock: Lock) -> f64 {
    let id = lock.id();
    REG.with(|r| r.borrow_mut().locks.insert(id, (locker_id as u64, lock)));
    id as f64
}

/// Keeps an adapter; answers its id.
fn register(adapter: Adapter) -> f64 {
    let id = next_id();
    REG.with(|r| r.borrow_mut().adapters.insert(id as u64, adapter));
    id
}

/// An id for JavaScript, or `FAILED` with the error.
fn id_or_fail(built: Result<f64, Error>) -> Raw {
    match built {
        Ok(id) => Raw(crate::hub::num(id)),
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

/// Forgets a built-in adapter whose object was collected. Lockers over it keep its backend.
#[napi(catch_unwind)]
pub fn drop_adapter(adapter_id: f64) {
    let gone = REG.with(|r| r.borrow_mut().adapters.remove(&(adapter_id as u64)));
    drop(gone);
}

/// Forgets a Locker whose object was collected. Its locks still alive keep what they need.
#[napi(catch_unwind)]
pub fn drop_locker(locker_id: f64) {
    let gone = REG.with(|r| r.borrow_mut().lockers.remove(&(locker_id as u64)));
    drop(gone);
}

/// Forgets a native backoff whose function was collected.
#[napi(catch_unwind)]
pub fn drop_delay(delay_id: f64) {
    let gone = REG.with(|r| r.borrow_mut().delays.remove(&(delay_id as u64)));
    drop(gone);
}

/// Closes a Locker: it takes no more locks, and every lock it still holds is released (which
/// also ends its heartbeat). Answers how many were released.
#[napi(catch_unwind)]
pub fn close_locker(locker_id: f64, op_id: f64) -> Raw {
    let owner = locker_id as u64;
    let (gone, held) = REG.with(|r| {
        let mut r = r.borrow_mut();
        let gone = r.lockers.remove(&owner);
        let mut held: Vec<Lock> = r
            .locks
            .values()
            .filter(|(o, l)| *o == owner && l.state() == LockState::Held)
            .map(|(_, l)| l.clone())
            .collect();
        held.extend(
            r.detached
                .iter()
                .filter(|(o, l)| *o == owner && l.state() == LockState::Held)
                .map(|(_, l)| l.clone()),
        );
        (gone, held)
    });
    drop(gone);
    ops::run(op_id, async move {
        let mut released = 0.0;
        let mut failure = None;
        for lock in held {
            match lock.release(true).await {
                Ok(_) => released += 1.0,
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(Answer::Number(released)),
        }
    })
}

/// An optional whole number of at least 1 (milliseconds, a pool size).
fn at_least_one(field: &str, v: Option<f64>) -> Result<Option<u64>, Error> {
    match v {
        None => Ok(None),
        Some(n) if n.is_finite() && n >= 1.0 && n.fract() == 0.0 => Ok(Some(n as u64)),
        Some(n) => Err(Error::validation(
            field,
            format!("must be a whole number >= 1, got {n}"),
        )),
    }
}

/// An in-memory adapter. `clock_id`: an injected clock (see `now`), else the monotonic clock.
#[napi(catch_unwind)]
pub fn create_memory_adapter(clock_id: Option<f64>) -> f64 {
    let backend = match clock_id {
        Some(id) => MemoryBackend::new(Rc::new(JsClock { id })),
        None => MemoryBackend::default(),
    };
    register(Adapter::Memory(Rc::new(backend)))
}

/// Forgets every lock of an in-memory adapter; its fencing counters stay.
#[napi(catch_unwind)]
pub fn memory_clear(adapter_id: f64) {
    let backend = REG.with(|r| match r.borrow().adapters.get(&(adapter_id as u64)) {
        Some(Adapter::Memory(m)) => Some(m.clone()),
        _ => None,
    });
    if let Some(m) = backend {
        m.clear();
    }
    crate::executor::drain();
}

/// A Redis adapter; checks its options now and connects on first use (or `redisConnect`).
#[napi(catch_unwind)]
#[allow(clippy::too_many_arguments)]
pub fn create_redis_adapter(
    urls: Vec<String>,
    cluster: bool,
    connect_timeout: Option<f64>,
    command_timeout: Option<f64>,
    replicas: Option<f64>,
    replicas_timeout: Option<f64>,
    tls_ca: Option<String>,
) -> Raw {
    id_or_fail((|| {
        let mut options = RedisOptions::new(String::new());
        options.urls = urls;
        options.cluster = cluster;
        options.connect_timeout_ms =
            at_least_one("connectTimeout", connect_timeout)?.unwrap_or(5000);
        options.command_timeout_ms =
            at_least_one("commandTimeout", command_timeout)?.unwrap_or(5000);
        options.tls_ca = tls_ca.map(String::into_bytes);
        if let Some(r) = at_least_one("waitForReplicas.replicas", replicas)? {
            options.wait_for_replicas = Some(WaitForReplicas {
                replicas: r as u32,
                timeout_ms: at_least_one("waitForReplicas.timeout", replicas_timeout)?.unwrap_or(0),
            });
        }
        #[cfg_attr(not(unix), allow(unused_mut))]
        let mut backend = RedisBackend::new(options)?;
        #[cfg(unix)]
        let event_loop = crate::uv_loop::UvLoop::current()
            .map_err(|e| Error::Internal(format!("the Redis adapter: {e}")))?;
        #[cfg(unix)]
        backend.on_event_loop(Rc::new(event_loop));
        Ok(register(Adapter::Redis(Rc::new(LocalWakeups::new(
            backend,
        )))))
    })())
}

/// The backend of adapter `adapter_id` when `pick` accepts its kind; otherwise the failure
/// to answer, naming `kind`.
fn backend_of<T>(
    adapter_id: f64,
    kind: &str,
    pick: impl FnOnce(&Adapter) -> Option<T>,
) -> Result<T, Raw> {
    REG.with(|r| r.borrow().adapters.get(&(adapter_id as u64)).and_then(pick))
        .ok_or_else(|| {
            ops::fail(Error::Internal(format!(
                "unknown {kind} adapter {adapter_id}"
            )))
        })
}

/// Connects a Redis adapter; answers the warning found at connect, or null.
#[napi(catch_unwind)]
pub fn redis_connect(adapter_id: f64, op_id: f64) -> Raw {
    let backend = match backend_of(adapter_id, "Redis", |a| match a {
        Adapter::Redis(b) => Some(b.inner().clone()),
        _ => None,
    }) {
        Ok(b) => b,
        Err(failed) => return failed,
    };
    let op = backend.connect();
    ops::run(op_id, async move {
        Ok(op.await?.map_or(Answer::Null, Answer::Text))
    })
}

/// A PostgreSQL adapter; checks its options now and connects on first use.
#[napi(catch_unwind)]
pub fn create_postgres_adapter(
    url: String,
    table_name: Option<String>,
    create_table: Option<bool>,
    pool_size: Option<f64>,
    connect_timeout: Option<f64>,
    tls_ca: Option<String>,
) -> Raw {
    id_or_fail((|| {
        let mut options = PostgresOptions::new(url);
        if let Some(t) = table_name {
            options.table_name = t;
        }
        options.create_table = create_table.unwrap_or(true);
        if let Some(n) = at_least_one("poolSize", pool_size)? {
            options.pool_size = n as usize;
        }
        if let Some(ms) = at_least_one("connectTimeout", connect_timeout)? {
            options.connect_timeout_ms = ms;
        }
        options.tls_ca = tls_ca.map(String::into_bytes);
        let backend = PostgresBackend::new(options)?;
        Ok(register(Adapter::Postgres(Rc::new(LocalWakeups::new(
            backend,
        )))))
    })())
}

/// Deletes expired rows; answers how many.
#[napi(catch_unwind)]
pub fn postgres_sweep(adapter_id: f64, op_id: f64) -> Raw {
    let backend = match backend_of(adapter_id, "Postgres", |a| match a {
        Adapter::Postgres(b) => Some(b.inner().clone()),
        _ => None,
    }) {
        Ok(b) => b,
        Err(failed) => return failed,
    };
    let op = backend.sweep_expired();
    ops::run(op_id, async move { Ok(Answer::Number(op.await? as f64)) })
}

/// The migration statements for a lock table.
#[napi(catch_unwind)]
pub fn postgres_ddl(table_name: String) -> Raw {
    match locks_ddl(&table_name) {
        Ok(ddl) => Raw(crate::hub::string(&ddl)),
        Err(e) => ops::fail(e),
    }
}

/// A MongoDB adapter; checks its options now and connects on first use. `w`: the write
/// concern's number of nodes, or undefined for majority.
#[napi(catch_unwind)]
pub fn create_mongo_adapter(
    url: String,
    db_name: Option<String>,
    collection_name: Option<String>,
    create_indexes: Option<bool>,
    w: Option<f64>,
    connect_timeout: Option<f64>,
) -> Raw {
    id_or_fail((|| {
        let mut options = MongoOptions::new(url);
        options.db_name = db_name;
        if let Some(c) = collection_name {
            options.collection_name = c;
        }
        options.create_indexes = create_indexes.unwrap_or(true);
        options.write_concern_w = at_least_one("writeConcern.w", w)?.map(|n| n as u32);
        if let Some(ms) = at_least_one("connectTimeout", connect_timeout)? {
            options.connect_timeout_ms = ms;
        }
        let backend = MongoBackend::new(options)?;
        Ok(register(Adapter::Mongo(Rc::new(LocalWakeups::new(
            backend,
        )))))
    })())
}

/// Closes a network adapter's connections (Redis, PostgreSQL, MongoDB); operations
/// afterwards fail. Other adapters have nothing to close.
#[napi(catch_unwind)]
pub fn close_adapter(adapter_id: f64) {
    REG.with(|r| match r.borrow().adapters.get(&(adapter_id as u64)) {
        Some(Adapter::Redis(b)) => b.inner().close(),
        Some(Adapter::Postgres(b)) => b.inner().close(),
        Some(Adapter::Mongo(b)) => b.inner().close(),
        _ => {}
    });
}

/// The lock collection's index specs, as JSON.
#[napi(catch_unwind)]
pub fn mongo_indexes() -> String {
    locks_indexes_json()
}

/// Calls one method of a built-in adapter directly (`method` as in `host::ACQUIRE`…).
#[napi(catch_unwind)]
pub fn adapter_call(
    adapter_id: f64,
    method: f64,
    key: Key,
    token: Key,
    ttl: f64,
    op_id: f64,
) -> Raw {
    let checked = (|| Ok((adapter(adapter_id)?, key.get("key")?, token.get("token")?)))();
    let (backend, key, token) = match checked {
        Ok(c) => c,
        Err(e) => return ops::fail(e),
    };
    let takes_ttl = method != host::RELEASE && method != host::IS_HELD;
    if takes_ttl {
        if let Err(e) = validate_ttl("ttl", ttl) {
            return ops::fail(e);
        }
    }
    let ttl = ttl as u32;
    let boolean = |op: locco_core::Op<bool>| async move { op.await.map(Answer::Bool) };
    match method {
        m if m == host::ACQUIRE => ops::run(op_id, boolean(backend.acquire(&key, &token, ttl))),
        m if m == host::RELEASE => ops::run(op_id, boolean(backend.release(&key, &token))),
        m if m == host::EXTEND => ops::run(op_id, boolean(backend.extend(&key, &token, ttl))),
        m if m == host::IS_HELD => ops::run(op_id, boolean(backend.is_held(&key, &token))),
        _ => {
            let op = backend.acquire_fenced(&key, &token, ttl);
            ops::run(op_id, async move {
                op.await
                    .map(|f| f.map_or(Answer::Null, |n| Answer::Number(n as f64)))
            })
        }
    }
}

/// Whether an adapter keeps coordination records (wait-for edges between processes).
#[napi(catch_unwind)]
pub fn supports_coordination(adapter_id: f64) -> bool {
    adapter(adapter_id).is_ok_and(|b| b.coordination().is_some())
}

/// A coordination verb: 0 peek (the token under a live lock key), 1 put, 2 get, 3 delete.
/// Answers a string or null (peek, get), or undefined.
#[napi(catch_unwind)]
pub fn coordinate(
    adapter_id: f64,
    verb: u32,
    key: String,
    value: String,
    ttl: f64,
    op_id: f64,
) -> Raw {
    let backend = match adapter(adapter_id) {
        Ok(b) => b,
        Err(e) => return ops::fail(e),
    };
    let Some(c) = backend.coordination() else {
        return ops::fail(Error::validation(
            "adapter",
            "keeps no coordination records",
        ));
    };
    let text = |op: locco_core::Op<Option<String>>| async move {
        op.await.map(|v| v.map_or(Answer::Null, Answer::Text))
    };
    let unit = |op: locco_core::Op<()>| async move { op.await.map(|()| Answer::Undefined) };
    match verb {
        0 => ops::run(op_id, text(c.peek(&key))),
        1 => match validate_ttl("ttl", ttl) {
            Ok(()) => ops::run(op_id, unit(c.put(&key, &value, ttl as u32))),
            Err(e) => ops::fail(e),
        },
        2 => ops::run(op_id, text(c.get(&key))),
        _ => ops::run(op_id, unit(c.delete(&key))),
    }
}

/// A native exponential backoff; answers a delay id.
#[napi(catch_unwind)]
pub fn create_backoff(base: f64, max: f64, factor: f64, jitter: bool) -> Raw {
    match Backoff::new(base, max).and_then(|b| {
        let b = b.with_factor(factor).with_jitter(jitter);
        b.validate().map(|()| b)
    }) {
        Ok(b) => {
            let id = next_id();
            REG.with(|r| r.borrow_mut().delays.insert(id as u64, Delay::Backoff(b)));
            Raw(crate::hub::num(id))
        }
        Err(e) => ops::fail(e),
    }
}

/// A delay function written in JavaScript, for one Locker or one call (the retry policy
/// that names it takes it); the facade keeps the function under the returned id until the
/// engine lets go of it (`host::released`).
#[napi(catch_unwind)]
pub fn create_delay_fn() -> f64 {
    let id = next_id();
    REG.with(|r| {
        r.borrow_mut()
            .delays
            .insert(id as u64, Delay::Custom(Rc::new(JsDelay { id })))
    });
    id
}

fn retry_layer(
    retries: Option<f64>,
    delay_ms: Option<f64>,
    delay_id: Option<f64>,
    timeout: Option<f64>,
) -> Result<RetryOverrides, Error> {
    let retries = match retries {
        None => None,
        Some(r) if r == f64::INFINITY => Some(None),
        Some(r) if r >= 0.0 && r.fract() == 0.0 && r <= u32::MAX as f64 => Some(Some(r as u32)),
        Some(r) => {
            return Err(Error::validation(
                "retry.retries",
                format!("must be a whole number >= 0 or Infinity, got {r}"),
            ))
        }
    };
    let delay = match (delay_ms, delay_id) {
        (_, Some(id)) => Some(
            REG.with(|r| {
                let mut r = r.borrow_mut();
                let key = id as u64;
                match r.delays.get(&key) {
                    // A JavaScript function is taken by the one policy it was made for.
                    Some(Delay::Custom(_)) => r.delays.remove(&key),
                    other => other.cloned(),
                }
            })
            .ok_or_else(|| Error::Internal(format!("unknown delay {id}")))?,
        ),
        (Some(ms), None) if ms.is_finite() && ms >= 0.0 => Some(Delay::Fixed(ms)),
        (Some(ms), None) => {
            return Err(Error::validation(
                "retry.delay",
                format!("must be a finite number >= 0 or a function, got {ms}"),
            ))
        }
        (None, None) => None,
    };
    let timeout = match timeout {
        None => None,
        Some(t) if t == f64::INFINITY => Some(None),
        Some(t) if t.is_finite() && t >= 0.0 => Some(Some(t)),
        Some(t) => {
            return Err(Error::validation(
                "retry.timeout",
                format!("must be a number of ms >= 0, got {t}"),
            ))
        }
    };
    Ok(RetryOverrides {
        retries,
        delay,
        timeout,
    })
}

/// A Locker over adapter `adapter_id` (a built-in adapter's id, or with `js_fenced` the
/// facade's id for an adapter written in JavaScript, and whether it has acquireFenced).
/// `clock_id` and `custom_token` say whether the facade injects a clock or a token source;
/// `events` whether anyone listens to events.
#[napi(catch_unwind)]
#[allow(clippy::too_many_arguments)]
pub fn create_locker(
    adapter_id: f64,
    js_fenced: Option<bool>,
    key_prefix: Key,
    fencing: bool,
    retries: Option<f64>,
    delay_ms: Option<f64>,
    delay_id: Option<f64>,
    timeout: Option<f64>,
    events: bool,
    clock_id: Option<f64>,
    custom_token: bool,
) -> Raw {
    let build = || -> Result<f64, Error> {
        // First, so that a delay function it names is taken even if a later check fails.
        let retry = retry_layer(retries, delay_ms, delay_id, timeout)?;
        let backend = match js_fenced {
            Some(fenced) => js_adapter(adapter_id, fenced) as Rc<dyn Backend>,
            None => adapter(adapter_id)?,
        };
        let key_prefix = key_prefix.get("keyPrefix")?;
        let id = next_id();
        let hooks = Rc::new(Hooks {
            locker_id: id,
            events,
        });
        let mut rt = Runtime::system(Rc::new(Spawner));
        if let Some(clock) = clock_id {
            rt = rt.with_clock(Rc::new(JsClock { id: clock }));
        }
        let options = LockerOptions {
            key_prefix,
            fencing,
            retry,
            events: events.then(|| hooks.clone() as _),
            loss: Some(hooks),
            token: custom_token.then(|| Rc::new(move || host::js_token(id)) as _),
        };
        let locker = Locker::new(backend, rt, options)?;
        REG.with(|r| r.borrow_mut().lockers.insert(id as u64, locker));
        Ok(id)
    };
    id_or_fail(build())
}

/// Builds one acquisition's options from the call's fields over the Locker's policy.
#[allow(clippy::too_many_arguments)]
fn acquire_options(
    locker: &Locker,
    ttl: f64,
    layer: &RetryOverrides,
    auto_extend: bool,
    interval: Option<f64>,
    max_hold: Option<f64>,
    max_lag: Option<f64>,
) -> Result<AcquireOptions, Error> {
    validate_ttl("ttl", ttl)?;
    let retry = locker.retry().clone().merged(layer);
    let mut options = AcquireOptions::new(ttl as u32).with_retry(retry);
    if auto_extend {
        let max_hold = max_hold.ok_or_else(|| {
            Error::validation(
                "autoExtend.maxHold",
                "is required with autoExtend: a heartbeat needs a deadline",
            )
        })?;
        options = options.with_auto_extend(AutoExtend {
            interval,
            max_hold,
            max_event_loop_lag: max_lag,
        });
    }
    options.validate()?;
    Ok(options)
}

/// Acquires. `mode`: 0 acquire (retries), 1 tryAcquire (one attempt, null when held), 2
/// acquireMany (`keys` is then an array). Answers a lock id, null, or the ids in key order.
#[napi(catch_unwind)]
#[allow(clippy::too_many_arguments)]
pub fn acquire(
    locker_id: f64,
    mode: u32,
    keys: Either<Key, Vec<Key>>,
    ttl: f64,
    retries: Option<f64>,
    delay_ms: Option<f64>,
    delay_id: Option<f64>,
    timeout: Option<f64>,
    auto_extend: bool,
    interval: Option<f64>,
    max_hold: Option<f64>,
    max_lag: Option<f64>,
    abort_id: Option<f64>,
    op_id: f64,
) -> Raw {
    // The retry layer first, so that a delay function it names is taken even if a later
    // check fails (the facade then hears that the engine let go of it).
    let layer = retry_layer(retries, delay_ms, delay_id, timeout);
    let prepared = layer
        .and_then(|layer| Ok((layer, locker(locker_id)?)))
        .and_then(|(layer, l)| {
            let keys = match keys {
                Either::A(k) => Either::A(k.get("key")?),
                Either::B(ks) => Either::B(ks.into_iter().map(|k| k.get("key")).collect::<Result<
                    Vec<_>,
                    _,
                >>(
                )?),
            };
            let o = acquire_options(&l, ttl, &layer, auto_extend, interval, max_hold, max_lag)?;
            Ok((l, keys, o))
        });
    let (locker, keys, options) = match prepared {
        Ok(p) => p,
        Err(e) => return ops::fail(e),
    };
    let abort = abort_id.and_then(|id| REG.with(|r| r.borrow().aborts.get(&(id as u64)).cloned()));
    start_acquire(locker_id, locker, mode, keys, options, abort, op_id)
}

/// `acquire` with only a ttl: the Locker's retry policy, no heartbeat, no signal. The common
/// call, kept to five arguments because each argument costs a conversion (see `fast`).
pub fn acquire_ttl(locker_id: f64, mode: u32, key: String, ttl: f64, op_id: f64) -> Raw {
    let prepared = locker(locker_id).and_then(|l| {
        validate_ttl("ttl", ttl)?;
        let options = AcquireOptions::new(ttl as u32).with_retry(l.retry().clone());
        Ok((l, options))
    });
    match prepared {
        Ok((locker, options)) => start_acquire(
            locker_id,
            locker,
            mode,
            Either::A(key),
            options,
            None,
            op_id,
        ),
        Err(e) => ops::fail(e),
    }
}

fn start_acquire(
    locker_id: f64,
    locker: Locker,
    mode: u32,
    keys: Either<String, Vec<String>>,
    options: AcquireOptions,
    abort: Option<Abort>,
    op_id: f64,
) -> Raw {
    ops::run(op_id, async move {
        match (mode, keys) {
            (_, Either::B(keys)) => {
                let locks = locker.acquire_many(&keys, options, abort).await?;
                Ok(Answer::Numbers(
                    locks.into_iter().map(|l| keep(locker_id, l)).collect(),
                ))
            }
            (1, Either::A(key)) => {
                let lock = locker.try_acquire(&key, options).await?;
                Ok(lock.map_or(Answer::Null, |l| Answer::Number(keep(locker_id, l))))
            }
            (_, Either::A(key)) => {
                let lock = locker.acquire(&key, options, abort).await?;
                Ok(Answer::Number(keep(locker_id, lock)))
            }
        }
    })
}

/// A fresh abort handle for one acquisition.
#[napi(catch_unwind)]
pub fn create_abort() -> f64 {
    let id = next_id();
    REG.with(|r| r.borrow_mut().aborts.insert(id as u64, Abort::new()));
    id
}

/// Fires an abort handle (the caller's `AbortSignal` aborted).
#[napi(catch_unwind)]
pub fn abort(abort_id: f64) {
    let a = REG.with(|r| r.borrow().aborts.get(&(abort_id as u64)).cloned());
    if let Some(a) = a {
        a.abort();
    }
    crate::executor::drain();
}

/// Forgets an abort handle once its acquisition is over.
#[napi(catch_unwind)]
pub fn drop_abort(abort_id: f64) {
    REG.with(|r| r.borrow_mut().aborts.remove(&(abort_id as u64)));
}

/// The state of a lock, read on the clock: 0 held, 1 lost, 2 released, -1 unknown.
#[napi(catch_unwind)]
pub fn lock_state(lock_id: f64) -> i32 {
    let state = lock(lock_id).map(|l| l.state());
    crate::executor::drain();
    match state {
        Some(LockState::Held) => 0,
        Some(LockState::Lost) => 1,
        Some(LockState::Released) => 2,
        None => -1,
    }
}

/// Why a lock was lost, or undefined.
#[napi(catch_unwind)]
pub fn lock_lost_reason(lock_id: f64) -> Option<String> {
    let reason = lock(lock_id).and_then(|l| l.lost_reason());
    crate::executor::drain();
    reason.map(|r| r.as_str().to_string())
}

/// What caused the loss (the last extension error), or undefined.
#[napi(catch_unwind)]
pub fn lock_lost_cause(lock_id: f64) -> Raw {
    match lock(lock_id).and_then(|l| l.lost_cause()) {
        Some(e) => Raw(crate::hub::error_value(&e)),
        None => Raw(crate::hub::undefined()),
    }
}

#[napi(catch_unwind)]
pub fn lock_held_ms(lock_id: f64) -> f64 {
    let ms = lock(lock_id).map_or(0.0, |l| l.held_ms());
    crate::executor::drain();
    ms
}

#[napi(catch_unwind)]
pub fn lock_token(lock_id: f64) -> Option<String> {
    lock(lock_id).map(|l| l.token().to_string())
}

#[napi(catch_unwind)]
pub fn lock_fence(lock_id: f64) -> Option<f64> {
    lock(lock_id).and_then(|l| l.fence()).map(|f| f as f64)
}

#[napi(catch_unwind)]
pub fn lock_ttl(lock_id: f64) -> f64 {
    lock(lock_id).map_or(0.0, |l| l.ttl() as f64)
}

/// Reports this lock's loss from a timer from now on (its signal has a listener).
#[napi(catch_unwind)]
pub fn lock_watch(lock_id: f64) {
    if let Some(l) = lock(lock_id) {
        l.watch();
    }
    crate::executor::drain();
}

/// Stops a lock's heartbeat for good.
#[napi(catch_unwind)]
pub fn lock_stop_heartbeat(lock_id: f64) {
    if let Some(l) = lock(lock_id) {
        l.stop_heartbeat();
    }
}

/// Forgets locks the facade no longer refers to. A lock still held stays alive in the engine
/// (detached) until it ends: its heartbeat must go on, and its loss must still be reported,
/// whether or not anyone kept the object.
#[napi(catch_unwind)]
pub fn drop_locks(lock_ids: Vec<f64>) {
    let ended = REG.with(|r| {
        let mut reg = r.borrow_mut();
        let reg = &mut *reg;
        for id in lock_ids {
            if let Some(entry) = reg.locks.remove(&(id as u64)) {
                reg.detached.push(entry);
            }
        }
        // Reading the state consults the clock, so a lease that ran out reads lost here.
        let (live, ended): (Vec<_>, Vec<_>) = std::mem::take(&mut reg.detached)
            .into_iter()
            .partition(|(_, l)| l.state() == LockState::Held);
        reg.detached = live;
        ended
    });
    // Dropped outside the registry's borrow: a lock's drop may reach other native objects.
    drop(ended);
}

fn with_lock(lock_id: f64, op_id: f64, f: impl FnOnce(Lock) -> Raw) -> Raw {
    match lock(lock_id) {
        Some(l) => f(l),
        None => ops::run(op_id, async {
            Err(Error::State("this lock is no longer known".into()))
        }),
    }
}

/// Releases a lock; answers whether our key was deleted. `final_attempt`: nobody will try
/// again (await using, withLock), so a failure also stops the heartbeat (see `fast`).
pub fn release(lock_id: f64, final_attempt: bool, op_id: f64) -> Raw {
    with_lock(lock_id, op_id, |l| {
        ops::run(op_id, async move {
            l.release(final_attempt).await.map(Answer::Bool)
        })
    })
}

/// Extends a lock to a new lease of `ttl` ms from now.
#[napi(catch_unwind)]
pub fn extend(lock_id: f64, ttl: f64, op_id: f64) -> Raw {
    if let Err(e) = validate_ttl("ttl", ttl) {
        return ops::fail(e);
    }
    with_lock(lock_id, op_id, |l| {
        ops::run(op_id, async move {
            l.extend(ttl as u32).await.map(|()| Answer::Undefined)
        })
    })
}

/// One look at the backend.
#[napi(catch_unwind)]
pub fn is_held(lock_id: f64, op_id: f64) -> Raw {
    with_lock(lock_id, op_id, |l| {
        ops::run(op_id, async move { l.is_held().await.map(Answer::Bool) })
    })
}

#[napi(catch_unwind)]
pub fn lock_key(lock_id: f64) -> Option<String> {
    lock(lock_id).map(|l| l.key().to_string())
}

/// The wait a native backoff gives before the attempt after `attempt`.
#[napi(catch_unwind)]
pub fn backoff_delay(delay_id: f64, attempt: u32) -> f64 {
    match REG.with(|r| r.borrow().delays.get(&(delay_id as u64)).cloned()) {
        Some(Delay::Backoff(b)) => b.delay(attempt),
        _ => f64::NAN,
    }
}

/// Forgets a cleanly released lock (released, never lost), so the facade answers for it from
/// then on: writes its held time, fence (NaN for none) and ttl into `out` and answers its
/// token. Any other lock stays, and the answer is `None` (see `fast`).
pub fn lock_end(lock_id: f64, out: &mut [f64]) -> Option<String> {
    let l =
        lock(lock_id).filter(|l| l.state() == LockState::Released && l.lost_reason().is_none())?;
    let values = [
        l.held_ms(),
        l.fence().map_or(f64::NAN, |f| f as f64),
        l.ttl() as f64,
    ];
    out.get_mut(..values.len())?.copy_from_slice(&values);
    REG.with(|r| r.borrow_mut().locks.remove(&(lock_id as u64)));
    Some(l.token().to_string())
}
