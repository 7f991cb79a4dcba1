//! The Node.js binding of locco-core. It converts types and maps errors; the engine's logic
//! lives in `crates/locco-core`. Exports are synchronous: see `ops` for how they answer.

#![deny(clippy::all)]
// Under `cargo test` the napi exports are compiled out, which leaves their helpers unused.
#![cfg_attr(test, allow(dead_code, unused_imports))]

#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: sys::alloc::ThreadCached = sys::alloc::ThreadCached;

// From the bottom up: `sys` (the host's event loop, busy polling, the allocator), `js` (the
// facade's trampolines, values, errors, text), `run` (the executor and operations), `backends`
// (one constructor per adapter, and adapters written in JavaScript), `exports` (what the
// facade calls). `registry` holds the native objects JavaScript refers to by number.
mod backends;
mod exports;
mod js;
mod registry;
mod run;
mod sys;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use run::executor;
use run::ops::{self, Raw};

/// Registers the facade's trampolines (an object of functions) and the function the timer
/// thread calls to wake the event loop; answers the raw per-lock functions (see `fast`) and
/// the facade's `realm` (see `js::REALM_SPAN`).
#[napi(catch_unwind)]
pub fn init(env: Env, hub_fns: Object, wake: Function<(), ()>, end_values: Unknown) -> Result<Raw> {
    let names = [
        "settle",
        "event",
        "lost",
        "callAdapter",
        "callDelay",
        "now",
        "token",
        "makeError",
        "forgetError",
        "warn",
        "resume",
    ];
    let mut fns = Vec::with_capacity(names.len());
    for name in names {
        let f: Unknown = hub_fns.get_named_property(name)?;
        fns.push(f.raw());
    }
    let realm = js::register(env.raw(), &fns, torn_down)?;
    let tsfn = wake
        .build_threadsafe_function::<()>()
        .weak::<true>()
        .build_callback(|_ctx| {
            locco_core::LOOP_ACTIVITY.working();
            executor::drain_on_wake();
            Ok(())
        })?;
    executor::EXECUTOR.with(|e| e.set_wake(tsfn));
    exports::fast::functions(env.raw(), end_values.raw(), realm).map(Raw)
}

/// The error behind the last `FAILED` answer, made by facade `realm`'s classes (by default
/// the newest facade's).
#[napi(catch_unwind)]
pub fn take_error(realm: Option<u32>) -> Raw {
    ops::take_error(realm)
}

/// JavaScript's answer to a host call: `kind` 0 boolean, 1 number, 2 null, 3 error (`value`
/// is then the facade's id for the thrown value). `false` when nobody waits any more.
#[napi(catch_unwind)]
pub fn host_done(op_id: f64, kind: u32, value: f64) -> bool {
    let answer = match kind {
        0 => Ok(ops::HostValue::Bool(value != 0.0)),
        1 => Ok(ops::HostValue::Number(value)),
        2 => Ok(ops::HostValue::Null),
        _ => Err(js::foreign(value)),
    };
    ops::host_done(op_id, answer)
}

/// What the engine let go of since the last call, as flat (kind, id) pairs (see `backends::js::Kept`).
#[napi(catch_unwind)]
pub fn take_released() -> Vec<f64> {
    backends::js::take_released()
}

/// Runs the executor's work left over by a drain that used up its budget (`resume`).
#[napi(catch_unwind)]
pub fn run_pending() {
    executor::drain_later();
}

/// Panics inside the engine's executor, to prove a panic surfaces as an error.
#[napi(catch_unwind)]
pub fn panic_for_test(op_id: f64) -> Raw {
    ops::run(op_id, async { panic!("deliberate panic for a test") })
}

/// Panics in the export itself.
#[napi(catch_unwind)]
pub fn panic_sync_for_test() {
    panic!("deliberate synchronous panic for a test")
}

/// The environment's teardown, in a fixed order: first nothing may call into JavaScript any
/// more; then the tasks go (so that late wakes find nothing to run); then the operations and
/// native objects. libuv handles are closed by their own hook (`sys::uv_loop`).
unsafe extern "C" fn torn_down(_arg: *mut std::ffi::c_void) {
    js::calls::forget_realms();
    run::executor::teardown();
    run::ops::teardown();
    registry::teardown();
    run::executor::teardown();
    #[cfg(target_os = "linux")]
    sys::alloc::close_this_thread();
}
