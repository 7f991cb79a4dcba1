//! Exports for locks: the state read on the clock, release, extend, one look at the backend,
//! and forgetting a lock the facade no longer refers to.

use locco_core::{validate_ttl, Error, Lock, LockState, Releasing};
use napi_derive::napi;

use crate::registry::*;
use crate::run::ops::{self, Answer, Raw};

/// The state of a lock, read on the clock: 0 held, 1 lost, 2 released, -1 unknown.
#[napi(catch_unwind)]
pub fn lock_state(lock_id: f64) -> i32 {
    let state = lock(lock_id).map(|l| l.state());
    crate::run::executor::drain();
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
    crate::run::executor::drain();
    reason.map(|r| r.as_str().to_string())
}

/// What caused the loss (the last extension error), or undefined.
#[napi(catch_unwind)]
pub fn lock_lost_cause(lock_id: f64) -> Raw {
    match lock(lock_id).and_then(|l| l.lost_cause()) {
        Some(e) => Raw(crate::js::error_value(&e)),
        None => Raw(crate::js::undefined()),
    }
}

#[napi(catch_unwind)]
pub fn lock_held_ms(lock_id: f64) -> f64 {
    let ms = lock(lock_id).map_or(0.0, |l| l.held_ms());
    crate::run::executor::drain();
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
    crate::run::executor::drain();
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

pub(crate) fn with_lock(lock_id: f64, op_id: f64, f: impl FnOnce(Lock) -> Raw) -> Raw {
    match lock(lock_id) {
        Some(l) => f(l),
        None => ops::run(op_id, async {
            Err(Error::State("this lock is no longer known".into()))
        }),
    }
}

/// Releases a lock; answers whether our key was deleted. `final_attempt`: nobody will try
/// again (await using, withLock), so a failure also stops the heartbeat (see `fast`).
///
/// A release that deleted our key within the call also forgets the lock at once, as
/// [`lock_end`] would (writing into `out`), and answers its token instead of `true`: the
/// facade then needs no second call.
pub fn release(lock_id: f64, final_attempt: bool, op_id: f64, out: &mut [f64]) -> Raw {
    with_lock(lock_id, op_id, |l| {
        // One clock reading for the release and the hand-off it may make (see `ops::start`).
        let done = locco_core::one_reading(|| match l.begin_release(final_attempt) {
            Releasing::Done(answer) => ops::finished(answer.map(Answer::Bool)),
            Releasing::Sent(sent) => ops::start(
                op_id,
                ops::guard(move || async move {
                    l.finish_release(sent, final_attempt)
                        .await
                        .map(Answer::Bool)
                }),
            ),
        });
        if let Some(Ok(Answer::Bool(true))) = done {
            if let Some(token) = lock_end(lock_id, out) {
                return Raw(token);
            }
        }
        ops::finish(done)
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

/// Forgets a cleanly released lock (released, never lost), so the facade answers for it from
/// then on: writes its held time, fence (NaN for none) and ttl into `out` and answers its
/// token, as a JavaScript string. Any other lock stays, and the answer is `None` (see `fast`).
pub fn lock_end(lock_id: f64, out: &mut [f64]) -> Option<napi::sys::napi_value> {
    let l =
        lock(lock_id).filter(|l| l.state() == LockState::Released && l.lost_reason().is_none())?;
    let values = [
        l.held_ms(),
        l.fence().map_or(f64::NAN, |f| f as f64),
        l.ttl() as f64,
    ];
    out.get_mut(..values.len())?.copy_from_slice(&values);
    let token = crate::js::string(l.token());
    REG.with(|r| r.borrow_mut().locks.remove(&(lock_id as u64)));
    Some(token)
}
