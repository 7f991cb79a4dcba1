//! Exports for Lockers: creating and closing one, acquiring (with its abort handles).

use std::rc::Rc;

use locco_core::{
    validate_ttl, Abort, AcquireOptions, AutoExtend, Backend, Begun, Error, Lock, LockState,
    Locker, LockerOptions, RetryOverrides, Runtime, Slot,
};
use napi::bindgen_prelude::Either;
use napi_derive::napi;

use crate::backends::js::{self as host, Hooks, JsClock};
use crate::exports::retry::{retry_layer, RetrySpec};
use crate::js::text::Key;
use crate::registry::*;
use crate::run::executor::Spawner;
use crate::run::ops::{self, Answer, Raw};

/// Forgets a Locker whose object was collected. Its locks still alive keep what they need.
#[napi(catch_unwind)]
pub fn drop_locker(locker_id: f64) {
    let gone = REG.with(|r| r.borrow_mut().lockers.remove(&(locker_id as u64)));
    drop(gone);
}

/// Closes a Locker: it takes no more locks (acquisitions still waiting end with a state error),
/// and every lock it still holds is released (which also ends its heartbeat). Answers how many
/// were released. With `release` false the locks are not released: their heartbeats stop and
/// their leases run out on the backend (a claim left to expire, as job de-duplication wants).
#[napi(catch_unwind)]
pub fn close_locker(locker_id: f64, op_id: f64, release: bool) -> Raw {
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
    if let Some(locker) = gone {
        locker.close();
    }
    if !release {
        for lock in &held {
            lock.stop_heartbeat();
        }
        return ops::run(op_id, async { Ok(Answer::Number(0.0)) });
    }
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

/// A new Locker, as the facade describes it.
#[napi(object, object_to_js = false)]
pub struct LockerSpec {
    /// A built-in adapter's id, or with `js_fenced` the facade's id for an adapter written in
    /// JavaScript.
    pub adapter_id: f64,
    /// For an adapter written in JavaScript: whether it has acquireFenced.
    pub js_fenced: Option<bool>,
    /// For an adapter written in JavaScript: whether it has the queue methods.
    pub js_queued: Option<bool>,
    pub key_prefix: Key,
    pub fencing: bool,
    pub retry: Option<RetrySpec>,
    /// Whether anyone listens to events.
    pub events: bool,
    /// The facade's id for an injected clock.
    pub clock_id: Option<f64>,
    /// Whether the facade injects a token source.
    pub custom_token: bool,
}

/// Auto-extension options of one acquisition, in ms.
#[napi(object, object_to_js = false)]
pub struct AutoExtendSpec {
    pub interval: Option<f64>,
    pub max_hold: Option<f64>,
    pub max_event_loop_lag: Option<f64>,
}

/// One acquisition's options, as the facade passes them.
#[napi(object, object_to_js = false)]
pub struct AcquireSpec {
    pub ttl: f64,
    pub retry: Option<RetrySpec>,
    pub auto_extend: Option<AutoExtendSpec>,
    /// An abort handle from `createAbort`.
    pub abort_id: Option<f64>,
    /// A label stored with the lock (`holder`).
    pub holder: Option<String>,
}

/// A Locker; answers its id.
#[napi(catch_unwind)]
pub fn create_locker(spec: LockerSpec) -> Raw {
    let LockerSpec {
        adapter_id,
        js_fenced,
        js_queued,
        key_prefix,
        fencing,
        retry,
        events,
        clock_id,
        custom_token,
    } = spec;
    let build = || -> Result<f64, Error> {
        // First, so that a delay function it names is taken even if a later check fails.
        let retry = retry_layer(retry)?;
        let backend = match js_fenced {
            Some(fenced) => {
                js_adapter(adapter_id, fenced, js_queued == Some(true)) as Rc<dyn Backend>
            }
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
pub(crate) fn acquire_options(
    locker: &Locker,
    ttl: f64,
    layer: &RetryOverrides,
    auto_extend: Option<AutoExtendSpec>,
    holder: Option<String>,
) -> Result<AcquireOptions, Error> {
    validate_ttl("ttl", ttl)?;
    let retry = locker.retry().clone().merged(layer);
    let mut options = AcquireOptions::new(ttl as u32).with_retry(retry);
    if let Some(AutoExtendSpec {
        interval,
        max_hold,
        max_event_loop_lag,
    }) = auto_extend
    {
        let max_hold = max_hold.ok_or_else(|| {
            Error::validation(
                "autoExtend.maxHold",
                "is required with autoExtend: a heartbeat needs a deadline",
            )
        })?;
        options = options.with_auto_extend(AutoExtend {
            interval,
            max_hold,
            max_event_loop_lag,
        });
    }
    if let Some(h) = holder {
        options = options.with_holder(h);
    }
    options.validate()?;
    Ok(options)
}

/// The abort handle `createAbort` made, when the call names one.
fn abort_of(abort_id: Option<f64>) -> Option<Abort> {
    abort_id.and_then(|id| REG.with(|r| r.borrow().aborts.get(&(id as u64)).cloned()))
}

/// Acquires. `mode`: 0 acquire (retries), 1 tryAcquire (one attempt, null when held), 2
/// acquireMany (`keys` is then an array). Answers a lock id, null, or the ids in key order.
#[napi(catch_unwind)]
pub fn acquire(
    locker_id: f64,
    mode: u32,
    keys: Either<Key, Vec<Key>>,
    spec: AcquireSpec,
    op_id: f64,
) -> Raw {
    let AcquireSpec {
        ttl,
        retry,
        auto_extend,
        abort_id,
        holder,
    } = spec;
    // The retry layer first, so that a delay function it names is taken even if a later
    // check fails (the facade then hears that the engine let go of it).
    let layer = retry_layer(retry);
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
            let o = acquire_options(&l, ttl, &layer, auto_extend, holder)?;
            Ok((l, keys, o))
        });
    let (locker, keys, options) = match prepared {
        Ok(p) => p,
        Err(e) => return ops::fail(e),
    };
    let abort = abort_of(abort_id);
    start_acquire(locker_id, locker, mode, keys, options, abort, op_id)
}

/// Acquires a permit (`kind` 0, `count` = the limit), a read (1) or the write (2) of a
/// read-write lock (`count` = maxReaders). `once`: one try, null when there is no room.
/// Answers a lock id or null.
#[napi(catch_unwind)]
pub fn acquire_holder(
    locker_id: f64,
    kind: u32,
    count: f64,
    once: bool,
    key: Key,
    spec: AcquireSpec,
    op_id: f64,
) -> Raw {
    let AcquireSpec {
        ttl,
        retry,
        auto_extend,
        abort_id,
        holder,
    } = spec;
    let layer = retry_layer(retry);
    let prepared = layer.and_then(|layer| {
        let locker = locker(locker_id)?;
        let key = key.get("key")?;
        let holders = match kind {
            0 => Slot::Permit {
                limit: Slot::count("limit", count)?,
            },
            1 => Slot::Read {
                max_readers: Slot::count("maxReaders", count)?,
            },
            _ => Slot::Write {
                max_readers: Slot::count("maxReaders", count)?,
            },
        };
        let options = acquire_options(&locker, ttl, &layer, auto_extend, holder)?;
        Ok((locker, key, holders, options))
    });
    let (locker, key, holders, options) = match prepared {
        Ok(p) => p,
        Err(e) => return ops::fail(e),
    };
    let abort = abort_of(abort_id);
    ops::run(op_id, async move {
        let lock = locker
            .acquire_holder(&key, holders, options, abort, once)
            .await?;
        Ok(lock.map_or(Answer::Null, |l| Answer::Number(keep(locker_id, l))))
    })
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

pub(crate) fn start_acquire(
    locker_id: f64,
    locker: Locker,
    mode: u32,
    keys: Either<String, Vec<String>>,
    options: AcquireOptions,
    abort: Option<Abort>,
    op_id: f64,
) -> Raw {
    // Boxed per kind (once, with the panic guard), so the single acquisition (the common
    // call) is not as large as the many-key one, and what ops::run moves on is a pointer:
    // moving a 3 KB future about cost an eighth of a contended hand-off in memcpy.
    let op = match (mode, keys) {
        (_, Either::B(keys)) => ops::guard(move || async move {
            let locks = locker.acquire_many(&keys, options, abort).await?;
            Ok(Answer::Numbers(
                locks.into_iter().map(|l| keep(locker_id, l)).collect(),
            ))
        }),
        (1, Either::A(key)) => ops::guard(move || async move {
            let lock = locker.try_acquire(key, options).await?;
            Ok(lock.map_or(Answer::Null, |l| Answer::Number(keep(locker_id, l))))
        }),
        (_, Either::A(key)) => return start_single(locker_id, locker, key, options, abort, op_id),
    };
    ops::run_guarded(op_id, op)
}

/// An acquisition of one key: a lock id at once when its first try won within the call (no
/// future, no task), else the rest of it as an operation. One clock reading serves both.
fn start_single(
    locker_id: f64,
    locker: Locker,
    key: String,
    options: AcquireOptions,
    abort: Option<Abort>,
    op_id: f64,
) -> Raw {
    let done = locco_core::one_reading(|| {
        let begun = locker.begin_acquire(key, &options, abort.as_ref());
        match begun {
            Ok(Begun::Acquired(lock)) => ops::finished(Ok(Answer::Number(keep(locker_id, lock)))),
            Ok(Begun::Pending(pending)) => ops::start(
                op_id,
                ops::guard(move || async move {
                    let lock = locker
                        .finish_acquire(pending, &options, abort.as_ref())
                        .await?;
                    Ok(Answer::Number(keep(locker_id, lock)))
                }),
            ),
            Err(e) => ops::finished(Err(e)),
        }
    });
    ops::finish(done)
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
    crate::run::executor::drain();
}

/// Forgets an abort handle once its acquisition is over.
#[napi(catch_unwind)]
pub fn drop_abort(abort_id: f64) {
    REG.with(|r| r.borrow_mut().aborts.remove(&(abort_id as u64)));
}

/// `locker.inspect(key)`: what the backend knows of the key, never its token.
#[napi(catch_unwind)]
pub fn inspect_key(locker_id: f64, key: Key, op_id: f64) -> Raw {
    match locker(locker_id).and_then(|l| Ok((l, key.get("key")?))) {
        Ok((l, key)) => ops::run(
            op_id,
            async move { l.inspect(&key).await.map(Answer::Info) },
        ),
        Err(e) => ops::fail(e),
    }
}

/// `locker.list({ prefix, limit })`: the held keys under the prefix.
#[napi(catch_unwind)]
pub fn list_keys(locker_id: f64, prefix: Key, limit: f64, op_id: f64) -> Raw {
    let checked = locker(locker_id).and_then(|l| {
        if !(limit.is_finite() && limit >= 1.0 && limit.fract() == 0.0 && limit <= 1e6) {
            return Err(Error::validation(
                "limit",
                format!("must be a whole number from 1 to 1000000, got {limit}"),
            ));
        }
        Ok((l, prefix.get("prefix")?))
    });
    match checked {
        Ok((l, prefix)) => ops::run(op_id, async move {
            l.list(&prefix, limit as u32).await.map(Answer::Infos)
        }),
        Err(e) => ops::fail(e),
    }
}

/// `locker.forceRelease(key)`: deletes whatever lease holds the key.
#[napi(catch_unwind)]
pub fn force_release(locker_id: f64, key: Key, op_id: f64) -> Raw {
    match locker(locker_id).and_then(|l| Ok((l, key.get("key")?))) {
        Ok((l, key)) => ops::run(op_id, async move {
            l.force_release(&key).await.map(Answer::Bool)
        }),
        Err(e) => ops::fail(e),
    }
}
