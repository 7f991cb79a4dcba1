//! Calls into the JavaScript facade. The facade registers its trampolines once (`init`);
//! Rust never holds user functions, only these. Every call happens on the JavaScript thread.

use std::cell::{Cell, RefCell};
use std::mem::ManuallyDrop;
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
    /// `warn(code, text)`: a warning for the process (emitted on the next tick).
    Warn,
    /// `resume()`: runs the executor's remaining work after this turn of the event loop.
    Resume,
}

const COUNT: usize = 11;

/// The ids a facade makes (operations, clocks, thrown values) start at `realm * REALM_SPAN`,
/// so that two loads of the facade in one environment (a cleared require cache, a test
/// runner's module registry) never take each other's ids, and each hears of its own.
pub const REALM_SPAN: f64 = 1_099_511_627_776.0; // 2^40: 8,192 realms within 2^53

/// One load of the facade: its environment handle and trampolines.
struct Realm {
    env: sys::napi_env,
    fns: Vec<sys::napi_ref>,
}

thread_local! {
    /// The newest realm's environment: the one values are made in.
    static ENV: Cell<sys::napi_env> = const { Cell::new(ptr::null_mut()) };
    // Never dropped at thread exit (see `torn_down`).
    static REALMS: ManuallyDrop<RefCell<Vec<Realm>>> = const { ManuallyDrop::new(RefCell::new(Vec::new())) };
    static HOOKED: Cell<bool> = const { Cell::new(false) };
}

pub fn env() -> sys::napi_env {
    ENV.with(|e| e.get())
}

/// The realm that made `id`.
pub fn realm_of(id: f64) -> u32 {
    (id / REALM_SPAN) as u32
}

/// Keeps a facade's trampolines; answers its realm.
pub fn register(env: sys::napi_env, fns: &[sys::napi_value]) -> napi::Result<u32> {
    if fns.len() != COUNT {
        return Err(napi::Error::from_reason(
            "init: wrong number of trampolines",
        ));
    }
    ENV.with(|e| e.set(env));
    // One teardown per environment, however often the facade is loaded: Node aborts on a
    // cleanup hook registered twice.
    if !HOOKED.replace(true) {
        check(
            unsafe { sys::napi_add_env_cleanup_hook(env, Some(torn_down), ptr::null_mut()) },
            "register the environment's cleanup hook",
        )?;
    }
    let mut refs = Vec::with_capacity(fns.len());
    for &f in fns {
        let mut r = ptr::null_mut();
        check(
            unsafe { sys::napi_create_reference(env, f, 1, &mut r) },
            "keep a trampoline",
        )?;
        refs.push(r);
    }
    REALMS.with(|realms| {
        let mut realms = realms.borrow_mut();
        realms.push(Realm { env, fns: refs });
        Ok(realms.len() as u32 - 1)
    })
}

/// An N-API status as a result.
pub fn check(status: sys::napi_status, what: &str) -> napi::Result<()> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(napi::Error::from_reason(format!(
            "locco-rs could not {what} (N-API status {status})"
        )))
    }
}

/// The environment's teardown, in a fixed order: first nothing may call into JavaScript any
/// more; then the tasks go (so that late wakes find nothing to run); then the operations and
/// native objects. libuv handles are closed by their own hook (`uv_loop`).
unsafe extern "C" fn torn_down(_arg: *mut std::ffi::c_void) {
    ENV.with(|e| e.set(ptr::null_mut()));
    let realms = REALMS.with(|r| std::mem::take(&mut *r.borrow_mut()));
    // The references die with the environment; deleting them now would call into it.
    std::mem::forget(realms);
    crate::executor::teardown();
    crate::ops::teardown();
    crate::registry::teardown();
    crate::executor::teardown();
    #[cfg(target_os = "linux")]
    crate::alloc::close_this_thread();
}

/// Calls a trampoline of the newest facade; see `call_in`.
pub fn call(which: Fn_, args: &[sys::napi_value]) -> Result<sys::napi_value, sys::napi_value> {
    let newest = REALMS.with(|r| r.borrow().len().saturating_sub(1)) as u32;
    call_in(newest, which, args)
}

/// Calls a trampoline of facade `realm`; a JavaScript exception is cleared and reported as
/// `Err`. After teardown every call is an `Err`.
pub fn call_in(
    realm: u32,
    which: Fn_,
    args: &[sys::napi_value],
) -> Result<sys::napi_value, sys::napi_value> {
    let target = REALMS.with(|r| {
        r.borrow()
            .get(realm as usize)
            .map(|realm| (realm.env, realm.fns[which as usize]))
    });
    let Some((env, func_ref)) = target.filter(|(env, _)| !env.is_null() && !self::env().is_null())
    else {
        return Err(ptr::null_mut());
    };
    // JavaScript may take any time: a clock reading shared before the call is stale after it.
    locco_core::fresh_reading();
    unsafe {
        let mut func = ptr::null_mut();
        if sys::napi_get_reference_value(env, func_ref, &mut func) != sys::Status::napi_ok
            || func.is_null()
        {
            return Err(ptr::null_mut());
        }
        let mut out = ptr::null_mut();
        let status =
            sys::napi_call_function(env, undefined(), func, args.len(), args.as_ptr(), &mut out);
        // Nor is one taken during the call (JavaScript may have called the engine) fresh now.
        locco_core::fresh_reading();
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
    let (text, len) = (s.as_ptr().cast(), s.len() as isize);
    // ASCII (tokens, most keys) is its own Latin-1: V8 copies it as it is, where UTF-8 is
    // decoded first (every release hands its token back).
    unsafe {
        if s.is_ascii() {
            sys::napi_create_string_latin1(env(), text, len, &mut v)
        } else {
            sys::napi_create_string_utf8(env(), text, len, &mut v)
        }
    };
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

/// `{ key, held, ttlLeft?, fence?, holder? }`: what an operator may see of a key (never the
/// token). Absent fields are left out, not set to undefined.
pub fn key_info(info: &locco_core::KeyInfo) -> sys::napi_value {
    let o = object();
    set(o, "key", string(&info.key));
    set(o, "held", boolean(info.held));
    if let Some(ms) = info.ttl_left {
        set(o, "ttlLeft", num(ms.round()));
    }
    if let Some(f) = info.fence {
        set(o, "fence", num(f as f64));
    }
    if let Some(h) = &info.holder {
        set(o, "holder", string(h));
    }
    o
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

/// The JavaScript error object for `err`, built by the newest facade's classes.
pub fn error_value(err: &Error) -> sys::napi_value {
    let newest = REALMS.with(|r| r.borrow().len().saturating_sub(1)) as u32;
    error_value_in(newest, err)
}

/// The JavaScript error object for `err`, built by the classes of facade `realm`. A host
/// error is the very object the host threw, kept by the facade that received it.
pub fn error_value_in(realm: u32, err: &Error) -> sys::napi_value {
    let mut realm = realm;
    let d = object();
    let code = match err {
        Error::Held {
            key,
            attempts,
            elapsed_ms,
            reason,
            holder,
        } => {
            set(d, "key", string(key));
            set(d, "attempts", num(*attempts as f64));
            set(d, "elapsedMs", num(*elapsed_ms));
            set(d, "reason", string(reason.as_str()));
            if let Some(h) = holder {
                set(d, "holder", string(h));
            }
            "LOCK_HELD"
        }
        Error::Lost { key, reason, cause } => {
            set(d, "key", string(key));
            set(d, "reason", string(reason.as_str()));
            if let Some(c) = cause {
                set(d, "cause", error_value_in(realm, c));
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
            realm = realm_of(f.id as f64);
            set(d, "foreignId", num(f.id as f64));
            "FOREIGN"
        }
        Error::Aborted => "ABORTED",
        _ => "LOCK_INTERNAL",
    };
    set(d, "code", string(code));
    set(d, "message", string(&err.to_string()));
    call_in(realm, Fn_::MakeError, &[d]).unwrap_or_else(|exc| exc)
}

/// Wraps a host error id that the facade stored.
pub fn foreign(id: f64) -> Error {
    Error::Foreign(ForeignError::new(id as u64, |id| {
        let _ = call_in(realm_of(id as f64), Fn_::ForgetError, &[num(id as f64)]);
    }))
}
