//! Errors as JavaScript values, made by the facade's own classes, and errors the host threw.

use locco_core::{Error, ForeignError};
use napi::sys;

use super::calls::{call_in, newest_realm, realm_of, Trampoline};
use super::values::{num, object, set, string};

/// The JavaScript error object for `err`, built by the newest facade's classes.
pub fn error_value(err: &Error) -> sys::napi_value {
    error_value_in(newest_realm(), err)
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
            ..
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
    call_in(realm, Trampoline::MakeError, &[d]).unwrap_or_else(|exc| exc)
}

/// Wraps a host error id that the facade stored.
pub fn foreign(id: f64) -> Error {
    Error::Foreign(ForeignError::new(id as u64, |id| {
        let _ = call_in(
            realm_of(id as f64),
            Trampoline::ForgetError,
            &[num(id as f64)],
        );
    }))
}
