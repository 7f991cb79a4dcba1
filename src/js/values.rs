//! JavaScript values made and read in the newest facade's environment.

use std::ptr;

use napi::sys;

use super::env;

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

pub(super) fn object() -> sys::napi_value {
    let mut v = ptr::null_mut();
    unsafe { sys::napi_create_object(env(), &mut v) };
    v
}

pub(super) fn set(obj: sys::napi_value, name: &str, value: sys::napi_value) {
    let key = string(name);
    unsafe { sys::napi_set_property(env(), obj, key, value) };
}
