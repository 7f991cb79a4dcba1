//! Exports for retry policies: native backoffs, delay functions written in JavaScript, and
//! one call's retry layer.

use std::rc::Rc;

use locco_core::{Backoff, Delay, Error, OnBackendError, RetryOverrides};
use napi_derive::napi;

use crate::backends::js::JsDelay;
use crate::registry::*;
use crate::run::ops::{self, Raw};

/// Forgets a native backoff whose function was collected.
#[napi(catch_unwind)]
pub fn drop_delay(delay_id: f64) {
    let gone = REG.with(|r| r.borrow_mut().delays.remove(&(delay_id as u64)));
    drop(gone);
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
            Raw(crate::js::num(id))
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

/// One layer of retry options, as the facade passes it: each field unset keeps the layer
/// below (the Locker's, then the built-in defaults).
#[napi(object, object_to_js = false)]
pub struct RetrySpec {
    /// Attempts after the first; `Infinity` for no limit.
    pub retries: Option<f64>,
    /// A fixed wait between attempts, in ms.
    pub delay_ms: Option<f64>,
    /// Or a delay function: a native backoff's id or one from `createDelayFn`.
    pub delay_id: Option<f64>,
    /// The whole acquisition's budget, in ms; `Infinity` for none.
    pub timeout: Option<f64>,
    /// `"fail"` or `"retry"`: what a transient backend failure does to an acquisition.
    pub on_backend_error: Option<String>,
}

/// The engine's view of a retry layer (absent: nothing overridden), checked.
pub(crate) fn retry_layer(spec: Option<RetrySpec>) -> Result<RetryOverrides, Error> {
    let Some(RetrySpec {
        retries,
        delay_ms,
        delay_id,
        timeout,
        on_backend_error,
    }) = spec
    else {
        return Ok(RetryOverrides::default());
    };
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
    let on_backend_error = match on_backend_error.as_deref() {
        None => None,
        Some("fail") => Some(OnBackendError::Fail),
        Some("retry") => Some(OnBackendError::Retry),
        Some(other) => {
            return Err(Error::validation(
                "retry.onBackendError",
                format!("must be 'fail' or 'retry', got {other:?}"),
            ))
        }
    };
    Ok(RetryOverrides {
        retries,
        delay,
        timeout,
        on_backend_error,
    })
}

/// The wait a native backoff gives before the attempt after `attempt`.
#[napi(catch_unwind)]
pub fn backoff_delay(delay_id: f64, attempt: u32) -> f64 {
    match REG.with(|r| r.borrow().delays.get(&(delay_id as u64)).cloned()) {
        Some(Delay::Backoff(b)) => b.delay(attempt),
        _ => f64::NAN,
    }
}
