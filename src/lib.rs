//! The Node.js binding of locco-core. It converts types and maps errors; the engine's logic
//! lives in `crates/locco-core`. Exports are synchronous: see `ops` for how they answer.

#![deny(clippy::all)]
// Under `cargo test` the napi exports are compiled out, which leaves their helpers unused.
#![cfg_attr(test, allow(dead_code, unused_imports))]

#[cfg(target_os = "linux")]
mod alloc;
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: alloc::ThreadCached = alloc::ThreadCached;

mod adapters;
mod busy_poll;
mod doctor;
mod executor;
mod fast;
mod host;
mod hub;
mod lock;
mod locker;
mod ops;
mod redlock;
mod registry;
mod retry;
mod text;
#[cfg(unix)]
mod uv_loop;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use ops::Raw;

/// Registers the facade's trampolines (an object of functions) and the function the timer
/// thread calls to wake the event loop; answers the raw per-lock functions (see `fast`) and
/// the facade's `realm` (see `hub::REALM_SPAN`).
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
    let realm = hub::register(env.raw(), &fns)?;
    let tsfn = wake
        .build_threadsafe_function::<()>()
        .weak::<true>()
        .build_callback(|_ctx| {
            locco_core::LOOP_ACTIVITY.working();
            executor::drain_on_wake();
            Ok(())
        })?;
    executor::EXECUTOR.with(|e| e.set_wake(tsfn));
    fast::functions(env.raw(), end_values.raw(), realm).map(Raw)
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
        _ => Err(hub::foreign(value)),
    };
    ops::host_done(op_id, answer)
}

/// What the engine let go of since the last call, as flat (kind, id) pairs (see `host::Kept`).
#[napi(catch_unwind)]
pub fn take_released() -> Vec<f64> {
    host::take_released()
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
