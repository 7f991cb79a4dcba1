//! Calls into the JavaScript facade. The facade registers its trampolines once (`init`);
//! Rust never holds user functions, only these. Every call happens on the JavaScript thread.

use std::cell::{Cell, RefCell};
use std::mem::ManuallyDrop;
use std::ptr;

use napi::sys;

/// The facade's trampolines, in `init`'s argument order.
#[derive(Clone, Copy)]
pub enum Trampoline {
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
    // Never dropped at thread exit (see `crate::torn_down`).
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

/// Keeps a facade's trampolines; answers its realm. `teardown` runs when the environment
/// ends (see `crate::torn_down` for its order).
pub fn register(
    env: sys::napi_env,
    fns: &[sys::napi_value],
    teardown: unsafe extern "C" fn(*mut std::ffi::c_void),
) -> napi::Result<u32> {
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
            unsafe { sys::napi_add_env_cleanup_hook(env, Some(teardown), ptr::null_mut()) },
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

/// Calls a trampoline of the newest facade; see `call_in`.
pub fn call(
    which: Trampoline,
    args: &[sys::napi_value],
) -> Result<sys::napi_value, sys::napi_value> {
    call_in(newest_realm(), which, args)
}

/// Calls a trampoline of facade `realm`; a JavaScript exception is cleared and reported as
/// `Err`. After teardown every call is an `Err`.
pub fn call_in(
    realm: u32,
    which: Trampoline,
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
        let status = sys::napi_call_function(
            env,
            super::undefined(),
            func,
            args.len(),
            args.as_ptr(),
            &mut out,
        );
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

/// The newest facade's realm: the one that made the last `init`.
pub fn newest_realm() -> u32 {
    REALMS.with(|r| r.borrow().len().saturating_sub(1)) as u32
}

/// Forgets every facade at the environment's teardown: nothing may call into JavaScript any
/// more. The references die with the environment; deleting them now would call into it.
pub fn forget_realms() {
    ENV.with(|e| e.set(ptr::null_mut()));
    let realms = REALMS.with(|r| std::mem::take(&mut *r.borrow_mut()));
    std::mem::forget(realms);
}
