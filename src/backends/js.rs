//! Engine traits implemented by JavaScript code: adapters, clocks, delay functions, token
//! sources, event and loss hooks. Each one calls a facade trampoline with an id; the facade
//! keeps the user's functions.

use std::cell::RefCell;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;

use locco_core::{
    Backend, BackendErrorKind, Clock, DelayFn, DelayInput, Error, Event, EventSink, LossListener,
    LostReason, Op,
};

use crate::js::{self, Trampoline};
use crate::run::ops::{call_host, HostValue};

/// What the facade keeps for the engine (user functions, adapter objects), by kind: when the
/// engine drops its side, the facade is told (`take_released`) and forgets its side.
#[derive(Clone, Copy)]
pub enum Kept {
    Adapter = 0,
    Clock = 1,
    Delay = 2,
    Locker = 3,
}

thread_local! {
    // Pairs of (kind, id); never dropped at thread exit, like every thread-local here.
    static RELEASED: ManuallyDrop<RefCell<Vec<f64>>> = const { ManuallyDrop::new(RefCell::new(Vec::new())) };
}

fn released(kind: Kept, id: f64) {
    let _ = RELEASED.try_with(|r| r.borrow_mut().extend([kind as u8 as f64, id]));
}

/// The (kind, id) pairs released since the last call, flat.
pub fn take_released() -> Vec<f64> {
    RELEASED.with(|r| std::mem::take(&mut *r.borrow_mut()))
}

/// Adapter methods, as numbered for `callAdapter`.
pub const ACQUIRE: f64 = 0.0;
pub const RELEASE: f64 = 1.0;
pub const EXTEND: f64 = 2.0;
pub const IS_HELD: f64 = 3.0;
pub const ACQUIRE_FENCED: f64 = 4.0;
pub const ACQUIRE_QUEUED: f64 = 5.0;
pub const ACQUIRE_QUEUED_FENCED: f64 = 6.0;
pub const LEAVE_QUEUE: f64 = 7.0;

/// An adapter written in JavaScript. What it throws comes back as `Error::Foreign`.
pub struct JsBackend {
    /// The facade's id for the adapter object.
    pub id: f64,
    pub fenced: bool,
    /// It has the queue methods (acquireQueued, leaveQueue, watchQueue); its pushes arrive
    /// through `adapterWake` and land here.
    pub queued: bool,
    pub board: locco_core::WakeBoard,
}

impl Drop for JsBackend {
    fn drop(&mut self) {
        released(Kept::Adapter, self.id)
    }
}

fn protocol(what: &str) -> Error {
    Error::backend("custom", BackendErrorKind::Protocol, what)
}

impl JsBackend {
    fn call(&self, method: f64, key: &str, token: &str, ttl: Option<u32>) -> Op<HostValue> {
        self.call_queued(method, key, token, ttl, None)
    }

    /// `queue`: the waiter and its place's lease, for the queue methods.
    fn call_queued(
        &self,
        method: f64,
        key: &str,
        token: &str,
        ttl: Option<u32>,
        queue: Option<(&str, u32)>,
    ) -> Op<HostValue> {
        let ttl = ttl.map_or_else(js::undefined, |t| js::num(t as f64));
        let (waiter, lease) = match queue {
            Some((w, l)) => (js::string(w), js::num(l as f64)),
            None => (js::undefined(), js::undefined()),
        };
        let args = vec![
            js::num(self.id),
            js::num(method),
            js::string(key),
            js::string(token),
            ttl,
            waiter,
            lease,
        ];
        call_host(Trampoline::CallAdapter, args)
    }

    fn boolean(&self, method: f64, key: &str, token: &str, ttl: Option<u32>) -> Op<bool> {
        let op = self.call(method, key, token, ttl);
        Op::pending(async move {
            match op.await? {
                HostValue::Bool(b) => Ok(b),
                _ => Err(protocol(
                    "the adapter answered something other than a boolean",
                )),
            }
        })
    }
}

impl Backend for JsBackend {
    fn name(&self) -> &str {
        "custom"
    }
    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        self.boolean(ACQUIRE, key, token, Some(ttl))
    }
    fn release(&self, key: &str, token: &str) -> Op<bool> {
        self.boolean(RELEASE, key, token, None)
    }
    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        self.boolean(EXTEND, key, token, Some(ttl))
    }
    fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        self.boolean(IS_HELD, key, token, None)
    }
    fn supports_fencing(&self) -> bool {
        self.fenced
    }
    fn queue(&self) -> Option<&dyn locco_core::Queue> {
        self.queued.then_some(self as &dyn locco_core::Queue)
    }
    fn acquire_fenced(&self, key: &str, token: &str, ttl: u32) -> Op<Option<u64>> {
        let op = self.call(ACQUIRE_FENCED, key, token, Some(ttl));
        Op::pending(async move {
            match op.await? {
                HostValue::Null => Ok(None),
                HostValue::Number(n)
                    if n >= 1.0 && n.fract() == 0.0 && n < 9_007_199_254_740_992.0 =>
                {
                    Ok(Some(n as u64))
                }
                _ => Err(protocol(
                    "acquireFenced must answer null or a positive integer below 2^53",
                )),
            }
        })
    }
}

/// The facade checks the adapter's answer and passes it on as: `true` granted, a positive
/// integer granted with that fence, `false` waiting, a negative number waiting with a hint
/// (`-(retryIn + 1)`).
impl locco_core::Queue for JsBackend {
    fn acquire_queued(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: &str,
        lease: u32,
        fenced: bool,
    ) -> Op<locco_core::Queued> {
        use locco_core::Queued;
        let method = if fenced {
            ACQUIRE_QUEUED_FENCED
        } else {
            ACQUIRE_QUEUED
        };
        let op = self.call_queued(method, key, token, Some(ttl), Some((waiter, lease)));
        Op::pending(async move {
            match op.await? {
                HostValue::Bool(true) => Ok(Queued::Granted(None)),
                HostValue::Bool(false) => Ok(Queued::Waiting { retry_in: None }),
                HostValue::Number(n) if n >= 1.0 => Ok(Queued::Granted(Some(n as u64))),
                HostValue::Number(n) if n < 0.0 => Ok(Queued::Waiting {
                    retry_in: Some(-n - 1.0),
                }),
                _ => Err(protocol("acquireQueued answered something unexpected")),
            }
        })
    }

    fn leave(&self, key: &str, waiter: &str) -> Op<()> {
        let op = self.call_queued(LEAVE_QUEUE, key, "", None, Some((waiter, 0)));
        Op::pending(async move { op.await.map(drop) })
    }

    fn wakeups(&self, _key: &str, waiter: &str) -> Box<dyn locco_core::Waiter> {
        self.board.listen(waiter)
    }
}

/// A clock injected as a JavaScript function.
pub struct JsClock {
    /// The facade's id for the function (see `js::REALM_SPAN`).
    pub id: f64,
}

impl Drop for JsClock {
    fn drop(&mut self) {
        released(Kept::Clock, self.id)
    }
}

impl Clock for JsClock {
    fn now(&self) -> f64 {
        match js::call_in(js::realm_of(self.id), Trampoline::Now, &[js::num(self.id)]) {
            Ok(v) => js::get_f64(v).unwrap_or(f64::NAN),
            Err(_) => f64::NAN,
        }
    }
}

/// A `DelayFn` written in JavaScript (sync or async).
pub struct JsDelay {
    pub id: f64,
}

impl Drop for JsDelay {
    fn drop(&mut self) {
        released(Kept::Delay, self.id)
    }
}

impl DelayFn for JsDelay {
    fn delay(&self, input: DelayInput) -> Pin<Box<dyn Future<Output = locco_core::Result<f64>>>> {
        let args = vec![
            js::num(self.id),
            js::num(input.attempt as f64),
            js::num(input.elapsed_ms),
            js::num(input.previous_delay),
        ];
        let op = call_host(Trampoline::CallDelay, args);
        Box::pin(async move {
            match op.await? {
                HostValue::Number(n) => Ok(n),
                _ => Err(Error::validation(
                    "retry.delay",
                    "the delay function must return a number of ms (or a promise of one)",
                )),
            }
        })
    }
}

/// Calls the facade's token source for one Locker.
pub fn js_token(locker_id: f64) -> locco_core::Result<String> {
    match js::call(Trampoline::Token, &[js::num(locker_id)]) {
        Ok(v) => js::get_string(v).filter(|s| !s.is_empty()).ok_or_else(|| {
            Error::validation("token", "the token function must return a non-empty string")
        }),
        Err(exc) => {
            let _ = exc;
            Err(Error::validation("token", "the token function threw"))
        }
    }
}

/// Forwards events and losses of one Locker to the facade.
pub struct Hooks {
    pub locker_id: f64,
    pub events: bool,
}

impl Drop for Hooks {
    fn drop(&mut self) {
        released(Kept::Locker, self.locker_id)
    }
}

impl EventSink for Hooks {
    fn emit(&self, event: &Event<'_>) {
        if !self.events {
            return;
        }
        let (key, ttl, a, b, reason, error): (&str, u32, f64, f64, Option<&str>, Option<&Error>) =
            match event {
                Event::Acquired {
                    key,
                    ttl,
                    waited_ms,
                    attempts,
                } => (key, *ttl, *waited_ms, *attempts as f64, None, None),
                Event::Contended {
                    key,
                    ttl,
                    attempt,
                    elapsed_ms,
                    reason,
                } => (
                    key,
                    *ttl,
                    *elapsed_ms,
                    *attempt as f64,
                    Some(reason.as_str()),
                    None,
                ),
                Event::BackendRetry {
                    key,
                    ttl,
                    attempt,
                    elapsed_ms,
                    error,
                } => (key, *ttl, *elapsed_ms, *attempt as f64, None, Some(*error)),
                Event::Extended { key, ttl, held_ms } | Event::Released { key, ttl, held_ms } => {
                    (key, *ttl, *held_ms, 0.0, None, None)
                }
                Event::ExtendFailed {
                    key,
                    ttl,
                    held_ms,
                    error,
                }
                | Event::ReleaseFailed {
                    key,
                    ttl,
                    held_ms,
                    error,
                } => (key, *ttl, *held_ms, 0.0, None, Some(*error)),
                Event::Lost {
                    key,
                    ttl,
                    held_ms,
                    reason,
                    error,
                } => (key, *ttl, *held_ms, 0.0, Some(reason.as_str()), *error),
            };
        let args = [
            js::num(self.locker_id),
            js::string(event.kind()),
            js::string(key),
            js::num(ttl as f64),
            js::num(a),
            js::num(b),
            reason.map_or_else(js::undefined, js::string),
            error.map_or_else(js::undefined, js::error_value),
        ];
        let _ = js::call(Trampoline::Event, &args);
    }
}

impl LossListener for Hooks {
    fn lost(&self, lock_id: u64, reason: LostReason, cause: Option<&Error>) {
        let args = [
            js::num(lock_id as f64),
            js::string(reason.as_str()),
            cause.map_or_else(js::undefined, js::error_value),
        ];
        let _ = js::call(Trampoline::Lost, &args);
    }
}
