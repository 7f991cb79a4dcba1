//! Calls into the JavaScript facade. The facade registers its trampolines once (`init`);
//! Rust never holds user functions, only these. Every call happens on the JavaScript thread.

use std::cell::{Cell, RefCell};
use std::ptr;

use locco_core::{Error, ForeignError};
use napi::sys;

/// The facade's trampolines, in `init`'s argument order.
#[derive(Clone, Copy)]
pub enum Fn_ {
    /// `settle(opId, value)`: an operation that answered `-1` has finished.
    Settle,
    /// `event(lockerId, type, key, ttl, a, b, reason, error)`.
    Event,
    /// `lost(lockId, reason, cause)`.
    Lost,
    /// `callAdapter(adapterId, method, key, token, ttl, opId)`.
    CallAdapter,
    /// `callDelay(delayId, attempt, elapsedMs, previousDelay, opId)`.
    CallDelay,
    /// `now(clockId)`: an injected clock.
    Now,
    /// `token(lockerId)`: an injected token source.
    Token,
    /// `makeError(descriptor)`: the facade's error classes.
    MakeError,
    /// `forgetError(id)`: a host error Rust no longer refers to.
    ForgetError,
}

const COUNT: usize = 9;

thread_local! {
    static ENV: Cell<sys::napi_env> = const { Cell::new(ptr::null_mut()) };
    static FNS: RefCell<Vec<sys::napi_ref>> = const { RefCell::new(Vec::new()) };
}

pub fn env() -> sys::napi_env {
    ENV.with(|e| e.get())
}

pub fn set_env(env: sys::napi_env) {
    ENV.with(|e| e.set(env));
}

pub fn register(env: sys::napi_env, fns: &[sys::napi_value]) -> napi::Result<()> {
    if fns.len() != COUNT {
        return Err(napi::Error::from_reason(
            "init: wrong number of trampolines",
        ));
    }
    set_env(env);
    // Once the environment is torn down, nothing may call into it (late drops at exit).
    unsafe extern "C" fn torn_down(_arg: *mut std::ffi::c_void) {
        let _ = FNS.try_with(|f| f.borrow_mut().clear());
        let _ = ENV.try_with(|e| e.set(ptr::null_mut()));
    }
    unsafe { sys::napi_add_env_cleanup_hook(env, Some(torn_down), ptr::null_mut()) };
    let refs = fns
        .iter()
        .map(|&f| {
            let mut r = ptr::null_mut();
            unsafe { sys::napi_create_reference(env, f, 1, &mut r) };
            r
        })
        .collect();
    FNS.with(|f| *f.borrow_mut() = refs);
    Ok(())
}

/// Calls a trampoline; a JavaScript exception is cleared and reported as `Err`.
pub fn call(which: Fn_, args: &[sys::napi_value]) -> Result<sys::napi_value, sys::napi_value> {
    let env = ENV.try_with(|e| e.get()).unwrap_or(ptr::null_mut());
    let func_ref = FNS
        .try_with(|f| f.borrow().get(which as usize).copied())
        .ok()
        .flatten();
    let (Some(func_ref), false) = (func_ref, env.is_null()) else {
        return Err(ptr::null_mut());
    };
    unsafe {
        let mut func = ptr::null_mut();
        sys::napi_get_reference_value(env, func_ref, &mut func);
        let mut out = ptr::null_mut();
        let status =
            sys::napi_call_function(env, undefined(), func, args.len(), args.as_ptr(), &mut out);
        if status == sys::Status::napi_ok {
            return Ok(out);
        }
        let mut exc = ptr::null_mut();
        sys::napi_get_and_clear_last_exception(env, &mut exc);
        Err(exc)
    }
}

pub fn undefined() -> sys::napi_value {
    let mut v = ptr::null_mut();
    unsafe { sys::napi_get_undefined(env(), &mut v) };
    v
}

pub fn null() -> sys::napi_value {
    let mut v = ptr::null_mut();
    unsafe { sys::napi_get_null(env(), &mut v) };
    v
}

pub fn num(n: f64) -> sys::napi_value {
    let mut v = ptr::null_mut();
    unsafe { sys::napi_create_double(env(), n, &mut v) };
    v
}

pub fn boolean(b: bool) -> sys::napi_value {
    let mut v = ptr::null_mut();
    unsafe { sys::napi_get_boolean(env(), b, &mut v) };
    v
}

pub fn string(s: &str) -> sys::napi_value {
    let mut v = ptr::null_mut();
    unsafe { sys::napi_create_string_utf8(env(), s.as_ptr().cast(), s.len() as isize, &mut v) };
    v
}

pub fn get_f64(v: sys::napi_value) -> Option<f64> {
    let mut n = 0.0;
    let ok = unsafe { sys::napi_get_value_double(env(), v, &mut n) } == sys::Status::napi_ok;
    ok.then_some(n)
}

pub fn get_string(v: sys::napi_value) -> Option<String> {
    let env = env();
    let mut len = 0usize;
    unsafe {
        if sys::napi_get_value_string_utf8(env, v, ptr::null_mut(), 0, &mut len)
            != sys::Status::napi_ok
        {
            return None;
        }
        let mut buf = vec![0u8; len + 1];
        sys::napi_get_value_string_utf8(env, v, buf.as_mut_ptr().cast(), len + 1, &mut len);
        buf.truncate(len);
        String::from_utf8(buf).ok()
    }
}

fn object() -> sys::napi_value {
    let mut v = ptr::null_mut();
    unsafe { sys::napi_create_object(env(), &mut v) };
    v
}

fn set(obj: sys::napi_value, name: &str, value: sys::napi_value) {
    let key = string(name);
    unsafe { sys::napi_set_property(env(), obj, key, value) };
}

/// The JavaScript error object for `err`, built by the facade's classes. A host error is
/// the very object the host threw.
pub fn error_value(err: &Error) -> sys::napi_value {
    let d = object();
    let code = match err {
        Error::Held {
            key,
            attempts,
            elapsed_ms,
            reason,
        } => {
            set(d, "key", string(key));
            set(d, "attempts", num(*attempts as f64));
            set(d, "elapsedMs", num(*elapsed_ms));
            set(d, "reason", string(reason.as_str()));
            "LOCK_HELD"
        }
        Error::Lost { key, reason, cause } => {
            set(d, "key", string(key));
            set(d, "reason", string(reason.as_str()));
            if let Some(c) = cause {
                set(d, "cause", error_value(c));
            }
            "LOCK_LOST"
        }
        Error::State(_) => "LOCK_STATE",
        Error::Validation { field, .. } => {
            set(d, "field", string(field));
            "LOCK_VALIDATION"
        }
        Error::Backend {
            backend,
            kind,
            code,
            ..
        } => {
            set(d, "backend", string(backend));
            set(d, "kind", string(kind.as_str()));
            if let Some(c) = code {
                set(d, "serverCode", string(c));
            }
            "LOCK_BACKEND"
        }
        Error::Replication {
            replicas,
            acknowledged,
        } => {
            set(d, "replicas", num(*replicas as f64));
            set(d, "acknowledged", num(*acknowledged as f64));
            "LOCK_REDIS_REPLICATION"
        }
        Error::Foreign(f) => {
            set(d, "foreignId", num(f.id as f64));
            "FOREIGN"
        }
        Error::Aborted => "ABORTED",
        _ => "LOCK_INTERNAL",
    };
    set(d, "code", string(code));
    set(d, "message", string(&err.to_string()));
    call(Fn_::MakeError, &[d]).unwrap_or_else(|exc| exc)
}

/// Wraps a host error id that the facade stored.
pub fn foreign(id: f64) -> Error {
    Error::Foreign(ForeignError::new(id as u64, |id| {
        let _ = call(Fn_::ForgetError, &[num(id as f64)]);
    }))
}
