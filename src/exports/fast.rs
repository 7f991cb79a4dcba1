//! Raw N-API entry points for the calls every lock makes (acquire with a ttl, release, and
//! forgetting a released lock). The `#[napi]` wrappers open a borrow scope per call, which
//! cost a twentieth of a contended in-memory acquisition; these convert their few arguments
//! by hand. `init` hands them to the facade.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use napi::sys;

use crate::run::ops::{self, Raw};

/// A facade's Float64Array of numbers the fast calls hand back beside their answer; one per
/// load of the facade, handed to the functions as their callback data. Slots 0-2: a forgotten
/// lock's held time, fence and ttl (`lockEnd`); slot 3 and on: the operations that finished
/// within a call (see [`ops::deferring`]).
struct FacadeNumbers {
    data: *mut f64,
    len: usize,
    realm: u32,
}

/// Where the deferred answers start in the array: a count, then (opId, value) pairs.
const DEFERRED_AT: usize = 3;

/// The functions, as an object `{ acquireTtl, release, lockEnd, realm }`, after keeping
/// `end_values` (a Float64Array the facade owns for good).
pub fn functions(
    env: sys::napi_env,
    end_values: sys::napi_value,
    realm: u32,
) -> napi::Result<sys::napi_value> {
    unsafe {
        let mut data = ptr::null_mut();
        let (mut kind, mut length) = (0, 0);
        let status = sys::napi_get_typedarray_info(
            env,
            end_values,
            &mut kind,
            &mut length,
            &mut data,
            ptr::null_mut(),
            ptr::null_mut(),
        );
        if status != sys::Status::napi_ok
            || kind != sys::TypedarrayType::float64_array
            || length < DEFERRED_AT + 1
        {
            return Err(napi::Error::from_reason(
                "init: endValues must be a Float64Array with room for the deferred answers",
            ));
        }
        // The array lives as long as the facade; a reference keeps it even so, and the small
        // record pointing at it lives as long (one per load of the facade).
        let mut keep = ptr::null_mut();
        crate::js::check(
            sys::napi_create_reference(env, end_values, 1, &mut keep),
            "keep the facade's array",
        )?;
        let end = Box::into_raw(Box::new(FacadeNumbers {
            data: data.cast(),
            len: length,
            realm,
        }));

        let mut object = ptr::null_mut();
        sys::napi_create_object(env, &mut object);
        let entries: [(&std::ffi::CStr, sys::napi_callback); 3] = [
            (c"acquireTtl", Some(acquire_ttl)),
            (c"release", Some(release)),
            (c"lockEnd", Some(lock_end)),
        ];
        for (name, cb) in entries {
            let mut f = ptr::null_mut();
            crate::js::check(
                sys::napi_create_function(
                    env,
                    name.as_ptr(),
                    name.count_bytes() as isize,
                    cb,
                    end.cast(),
                    &mut f,
                ),
                "make a function",
            )?;
            crate::js::check(
                sys::napi_set_named_property(env, object, name.as_ptr(), f),
                "set a property",
            )?;
        }
        let mut realm_value = ptr::null_mut();
        sys::napi_create_uint32(env, realm, &mut realm_value);
        sys::napi_set_named_property(env, object, c"realm".as_ptr(), realm_value);
        Ok(object)
    }
}

/// Up to `N` arguments (missing ones `undefined`) and the function's callback data.
unsafe fn args_and_data<const N: usize>(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> ([sys::napi_value; N], *mut std::ffi::c_void) {
    let mut argv = [ptr::null_mut(); N];
    let mut argc = N;
    let mut data = ptr::null_mut();
    sys::napi_get_cb_info(
        env,
        info,
        &mut argc,
        argv.as_mut_ptr(),
        ptr::null_mut(),
        &mut data,
    );
    if argc < N {
        let mut undefined = ptr::null_mut();
        sys::napi_get_undefined(env, &mut undefined);
        argv[argc..].iter_mut().for_each(|a| *a = undefined);
    }
    (argv, data)
}

unsafe fn number(env: sys::napi_env, v: sys::napi_value) -> f64 {
    let mut n = f64::NAN;
    sys::napi_get_value_double(env, v, &mut n);
    n
}

unsafe fn boolean(env: sys::napi_env, v: sys::napi_value) -> bool {
    let mut b = false;
    sys::napi_get_value_bool(env, v, &mut b);
    b
}

/// Runs `body`; a panic becomes a thrown error instead of unwinding into Node.
unsafe fn guarded(env: sys::napi_env, body: impl FnOnce() -> sys::napi_value) -> sys::napi_value {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(panic) => {
            let text = format!(
                "panic in locco-rs: {}",
                crate::run::executor::panic_message(panic)
            );
            let text = std::ffi::CString::new(text.replace('\0', " ")).unwrap_or_default();
            sys::napi_throw_error(env, ptr::null(), text.as_ptr());
            ptr::null_mut()
        }
    }
}

/// `acquireTtl(lockerId, mode, key, ttl, opId)`.
unsafe extern "C" fn acquire_ttl(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    guarded(env, || {
        let ([locker, mode, key, ttl, op], end) = args_and_data::<5>(env, info);
        let key = match crate::js::text::read(env, key) {
            Ok(key) => key,
            Err(bad) => return ops::fail(bad.error("key")).0,
        };
        let locker = number(env, locker);
        let mode = number(env, mode) as u32;
        deferring(end, || {
            crate::exports::locker::acquire_ttl(
                locker,
                mode,
                key,
                number(env, ttl),
                number(env, op),
            )
            .0
        })
    })
}

/// `release(lockId, finalAttempt, opId)`: as the binding's release, or the token of a lock
/// released and forgotten within the call (its numbers are in the facade's array then).
unsafe extern "C" fn release(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    guarded(env, || {
        let ([lock, final_attempt, op], end) = args_and_data::<3>(env, info);
        deferring(end, || {
            crate::exports::lock::release(
                number(env, lock),
                boolean(env, final_attempt),
                number(env, op),
                end_values(end),
            )
            .0
        })
    })
}

/// Runs `call` with the numeric answers of operations that finish within it written into the
/// facade's array, which the facade reads when the call returns: a hand-off on release then
/// makes no call into JavaScript.
///
/// # Safety
/// As for [`end_values`].
unsafe fn deferring(
    end: *mut std::ffi::c_void,
    call: impl FnOnce() -> sys::napi_value,
) -> sys::napi_value {
    match (end as *const FacadeNumbers).as_ref() {
        Some(e) if !e.data.is_null() => {
            ops::deferring(e.realm, e.data.add(DEFERRED_AT), e.len - DEFERRED_AT, call)
        }
        _ => call(),
    }
}

/// The end-value slots of the facade's array behind a function's callback data (apart from
/// the deferred answers, which are written through their own pointer meanwhile).
///
/// # Safety
/// `end` is this facade's record (never freed), and its Float64Array, kept alive by a
/// reference, has `len` slots.
unsafe fn end_values<'a>(end: *mut std::ffi::c_void) -> &'a mut [f64] {
    match (end as *const FacadeNumbers).as_ref() {
        Some(e) if !e.data.is_null() => std::slice::from_raw_parts_mut(e.data, DEFERRED_AT),
        _ => &mut [][..],
    }
}

/// `lockEnd(lockId)`: the token of a cleanly released lock, which the engine then forgets
/// (its held time, fence and ttl are in the facade's array); null for any other lock.
unsafe extern "C" fn lock_end(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    guarded(env, || {
        let ([lock], end) = args_and_data::<1>(env, info);
        let answer: Raw = match crate::exports::lock::lock_end(number(env, lock), end_values(end)) {
            Some(token) => Raw(token),
            None => Raw(crate::js::null()),
        };
        answer.0
    })
}
