//! Exports for adapters: building the built-in backends, their own verbs (connect, sweep,
//! close), direct calls of the adapter contract, and coordination records.

use std::rc::Rc;

use locco_core::etcd::{EtcdBackend, EtcdOptions};
use locco_core::mongo::{locks_indexes_json, MongoBackend, MongoOptions};
use locco_core::postgres::{locks_ddl, PostgresBackend, PostgresOptions};
use locco_core::redis::{RedisBackend, RedisOptions, WaitForReplicas};
use locco_core::{validate_ttl, Error, LocalWakeups, MemoryBackend};
use napi_derive::napi;

pub mod js;
pub mod redlock;

use self::js::JsClock;
use crate::js::text::Key;
use crate::registry::*;
use crate::run::ops::{self, Answer, Raw};

/// Forgets a built-in adapter whose object was collected. Lockers over it keep its backend.
#[napi(catch_unwind)]
pub fn drop_adapter(adapter_id: f64) {
    let gone = REG.with(|r| r.borrow_mut().adapters.remove(&(adapter_id as u64)));
    drop(gone);
}

/// An optional whole number of at least 1 (milliseconds, a pool size).
pub(crate) fn at_least_one(field: &str, v: Option<f64>) -> Result<Option<u64>, Error> {
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
    crate::run::executor::drain();
}

/// A push from a JavaScript adapter's `watchQueue`: its waiter `waiter` may try now.
#[napi(catch_unwind)]
pub fn adapter_wake(adapter_id: f64, waiter: String) {
    js_adapter_wake(adapter_id, &waiter);
    crate::run::executor::drain();
}

/// A Redis adapter, as the facade describes it (times in ms; unset: the engine's defaults).
#[napi(object, object_to_js = false)]
pub struct RedisSpec {
    pub urls: Vec<String>,
    pub cluster: bool,
    pub connect_timeout: Option<f64>,
    pub command_timeout: Option<f64>,
    pub wait_for_replicas: Option<ReplicasSpec>,
    /// PEM certificates to trust for rediss://.
    pub tls_ca: Option<String>,
}

#[napi(object, object_to_js = false)]
pub struct ReplicasSpec {
    pub replicas: Option<f64>,
    pub timeout: Option<f64>,
}

/// A Redis adapter; checks its options now and connects on first use (or `redisConnect`).
#[napi(catch_unwind)]
pub fn create_redis_adapter(spec: RedisSpec) -> Raw {
    id_or_fail((|| {
        let mut options = RedisOptions::new(String::new());
        options.urls = spec.urls;
        options.cluster = spec.cluster;
        if let Some(ms) = at_least_one("connectTimeout", spec.connect_timeout)? {
            options.connect_timeout_ms = ms;
        }
        if let Some(ms) = at_least_one("commandTimeout", spec.command_timeout)? {
            options.command_timeout_ms = ms;
        }
        options.tls_ca = spec.tls_ca.map(String::into_bytes);
        if let Some(w) = spec.wait_for_replicas {
            let replicas =
                at_least_one("waitForReplicas.replicas", w.replicas)?.ok_or_else(|| {
                    Error::validation(
                        "waitForReplicas.replicas",
                        "is required: how many replicas must acknowledge",
                    )
                })?;
            options.wait_for_replicas = Some(WaitForReplicas {
                replicas: replicas as u32,
                timeout_ms: at_least_one("waitForReplicas.timeout", w.timeout)?.unwrap_or(0),
            });
        }
        let mut backend = RedisBackend::new(options)?;
        backend.on_warning(Rc::new(|text: String| {
            let code = crate::js::string("LOCCO_REDIS_EVICTION");
            let _ = crate::js::call(
                crate::js::Trampoline::Warn,
                &[code, crate::js::string(&text)],
            );
        }));
        // LOCCO_REDIS_PORTABLE=1 keeps the connection every platform has (the driver's, on
        // the I/O thread), so that the path Windows takes is tested on Linux too.
        #[cfg(unix)]
        if std::env::var_os("LOCCO_REDIS_PORTABLE").is_none_or(|v| v != "1") {
            let event_loop = crate::sys::uv_loop::UvLoop::current()
                .map_err(|e| Error::Internal(format!("the Redis adapter: {e}")))?;
            backend.on_event_loop(Rc::new(event_loop));
        }
        Ok(register(Adapter::Redis(Rc::new(LocalWakeups::new(
            backend,
        )))))
    })())
}

/// The backend of adapter `adapter_id` when `pick` accepts its kind; otherwise the failure
/// to answer, naming `kind`.
pub(crate) fn backend_of<T>(
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

/// A PostgreSQL adapter, as the facade describes it (unset: the engine's defaults).
#[napi(object, object_to_js = false)]
pub struct PostgresSpec {
    pub url: String,
    pub table_name: Option<String>,
    pub create_table: Option<bool>,
    pub pool_size: Option<f64>,
    pub connect_timeout: Option<f64>,
    pub tls_ca: Option<String>,
    /// 'table' (unset) or 'advisory'.
    pub mode: Option<String>,
    /// Advisory mode: 'hash' (unset) or 'integer'.
    pub keys: Option<String>,
}

/// A PostgreSQL adapter; checks its options now and connects on first use.
#[napi(catch_unwind)]
pub fn create_postgres_adapter(spec: PostgresSpec) -> Raw {
    id_or_fail((|| {
        let mut options = PostgresOptions::new(spec.url);
        if let Some(t) = spec.table_name {
            options.table_name = t;
        }
        if let Some(c) = spec.create_table {
            options.create_table = c;
        }
        if let Some(n) = at_least_one("poolSize", spec.pool_size)? {
            options.pool_size = n as usize;
        }
        if let Some(ms) = at_least_one("connectTimeout", spec.connect_timeout)? {
            options.connect_timeout_ms = ms;
        }
        options.tls_ca = spec.tls_ca.map(String::into_bytes);
        (options.mode, options.keys) = postgres_mode(spec.mode, spec.keys)?;
        let backend = PostgresBackend::new(options)?;
        Ok(register(Adapter::Postgres(Rc::new(LocalWakeups::new(
            backend,
        )))))
    })())
}

fn postgres_mode(
    mode: Option<String>,
    keys: Option<String>,
) -> Result<(locco_core::postgres::Mode, locco_core::postgres::Keys), Error> {
    use locco_core::postgres::{Keys, Mode};
    let mode = match mode.as_deref() {
        None | Some("table") => Mode::Table,
        Some("advisory") => Mode::Advisory,
        Some(m) => {
            return Err(Error::validation(
                "mode",
                format!("must be 'table' or 'advisory', got {m:?}"),
            ))
        }
    };
    let keys = match (keys.as_deref(), mode) {
        (None, _) => Keys::Hash,
        (Some(_), Mode::Table) => {
            return Err(Error::validation(
                "keys",
                "applies only to mode: 'advisory'",
            ))
        }
        (Some("hash"), _) => Keys::Hash,
        (Some("integer"), _) => Keys::Integer,
        (Some(k), _) => {
            return Err(Error::validation(
                "keys",
                format!("must be 'hash' or 'integer', got {k:?}"),
            ))
        }
    };
    Ok((mode, keys))
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
        Ok(ddl) => Raw(crate::js::string(&ddl)),
        Err(e) => ops::fail(e),
    }
}

/// A MongoDB adapter, as the facade describes it (unset: the engine's defaults). `w`: the
/// write concern's number of nodes; unset for majority.
#[napi(object, object_to_js = false)]
pub struct MongoSpec {
    pub url: String,
    pub db_name: Option<String>,
    pub collection_name: Option<String>,
    pub create_indexes: Option<bool>,
    pub w: Option<f64>,
    pub connect_timeout: Option<f64>,
}

/// A MongoDB adapter; checks its options now and connects on first use.
#[napi(catch_unwind)]
pub fn create_mongo_adapter(spec: MongoSpec) -> Raw {
    id_or_fail((|| {
        let mut options = MongoOptions::new(spec.url);
        options.db_name = spec.db_name;
        if let Some(c) = spec.collection_name {
            options.collection_name = c;
        }
        if let Some(c) = spec.create_indexes {
            options.create_indexes = c;
        }
        options.write_concern_w = at_least_one("writeConcern.w", spec.w)?.map(|n| n as u32);
        if let Some(ms) = at_least_one("connectTimeout", spec.connect_timeout)? {
            options.connect_timeout_ms = ms;
        }
        let backend = MongoBackend::new(options)?;
        Ok(register(Adapter::Mongo(Rc::new(LocalWakeups::new(
            backend,
        )))))
    })())
}

/// An etcd adapter, as the facade describes it (unset: the engine's defaults; times in ms).
#[napi(object, object_to_js = false)]
pub struct EtcdSpec {
    pub endpoints: Vec<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub ca: Option<String>,
    pub prefix: Option<String>,
    pub session_ttl: Option<f64>,
    pub connect_timeout: Option<f64>,
    pub request_timeout: Option<f64>,
}

/// An etcd adapter; checks its options now and connects on first use.
#[napi(catch_unwind)]
pub fn create_etcd_adapter(spec: EtcdSpec) -> Raw {
    id_or_fail((|| {
        let mut options = EtcdOptions::new(spec.endpoints);
        options.username = spec.username;
        options.password = spec.password;
        options.ca = spec.ca;
        if let Some(p) = spec.prefix {
            options.prefix = p;
        }
        if let Some(ms) = at_least_one("sessionTtl", spec.session_ttl)? {
            // etcd leases are whole seconds; round up so the session is never shorter.
            options.session_ttl_s = ms.div_ceil(1000).min(u64::from(u32::MAX)) as u32;
        }
        if let Some(ms) = at_least_one("connectTimeout", spec.connect_timeout)? {
            options.connect_timeout_ms = ms;
        }
        if let Some(ms) = at_least_one("requestTimeout", spec.request_timeout)? {
            options.request_timeout_ms = ms;
        }
        let backend = EtcdBackend::new(options)?;
        Ok(register(Adapter::Etcd(Rc::new(LocalWakeups::new(backend)))))
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
        Some(Adapter::Redlock(b)) => b.inner().close(),
        Some(Adapter::Etcd(b)) => b.inner().close(),
        _ => {}
    });
}

/// The lock collection's index specs, as JSON.
#[napi(catch_unwind)]
pub fn mongo_indexes() -> String {
    locks_indexes_json()
}

/// Calls one method of a built-in adapter directly (`method` as in `js::ACQUIRE`…).
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
    let takes_ttl = method != js::RELEASE && method != js::IS_HELD;
    if takes_ttl {
        if let Err(e) = validate_ttl("ttl", ttl) {
            return ops::fail(e);
        }
    }
    let ttl = ttl as u32;
    let boolean = |op: locco_core::Op<bool>| async move { op.await.map(Answer::Bool) };
    match method {
        m if m == js::ACQUIRE => ops::run(op_id, boolean(backend.acquire(&key, &token, ttl))),
        m if m == js::RELEASE => ops::run(op_id, boolean(backend.release(&key, &token))),
        m if m == js::EXTEND => ops::run(op_id, boolean(backend.extend(&key, &token, ttl))),
        m if m == js::IS_HELD => ops::run(op_id, boolean(backend.is_held(&key, &token))),
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
