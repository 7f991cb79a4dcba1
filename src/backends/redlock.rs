//! The Redlock adapter: several independent Redis servers, granted by a majority.

use std::rc::Rc;

use locco_core::redis::RedisOptions;
use locco_core::redlock::{RedlockBackend, RedlockOptions};
use locco_core::LocalWakeups;
use napi_derive::napi;

use crate::backends::{at_least_one, backend_of};
use crate::registry::*;
use crate::run::ops::{self, Answer, Raw};

/// A Redlock adapter, as the facade describes it (times in ms; unset: the engine's defaults).
#[napi(object, object_to_js = false)]
pub struct RedlockSpec {
    pub urls: Vec<String>,
    pub connect_timeout: Option<f64>,
    pub command_timeout: Option<f64>,
    pub server_timeout: Option<f64>,
    /// PEM certificates to trust for rediss://.
    pub tls_ca: Option<String>,
}

/// A Redlock adapter; checks its options now and connects on first use (or `redlockConnect`).
#[napi(catch_unwind)]
pub fn create_redlock_adapter(spec: RedlockSpec) -> Raw {
    id_or_fail((|| {
        let connect = at_least_one("connectTimeout", spec.connect_timeout)?;
        let command = at_least_one("commandTimeout", spec.command_timeout)?;
        let mut options = RedlockOptions::new(spec.urls);
        if let Some(ms) = at_least_one("serverTimeout", spec.server_timeout)? {
            options.server_timeout_ms = ms;
        }
        let ca = spec.tls_ca.map(String::into_bytes);
        options.servers.iter_mut().for_each(|o: &mut RedisOptions| {
            if let Some(ms) = connect {
                o.connect_timeout_ms = ms;
            }
            if let Some(ms) = command {
                o.command_timeout_ms = ms;
            }
            o.tls_ca = ca.clone();
        });
        let mut backend = RedlockBackend::new(options)?;
        backend.on_warning(Rc::new(|text: String| {
            let code = crate::js::string("LOCCO_REDIS_EVICTION");
            let _ = crate::js::call(
                crate::js::Trampoline::Warn,
                &[code, crate::js::string(&text)],
            );
        }));
        #[cfg(unix)]
        let event_loop = crate::sys::uv_loop::UvLoop::current()
            .map_err(|e| locco_core::Error::Internal(format!("the Redlock adapter: {e}")))?;
        #[cfg(unix)]
        backend.on_event_loop(Rc::new(event_loop));
        Ok(register(Adapter::Redlock(Rc::new(LocalWakeups::new(
            backend,
        )))))
    })())
}

/// Connects a Redlock adapter to every server; answers the first warning found, or null.
#[napi(catch_unwind)]
pub fn redlock_connect(adapter_id: f64, op_id: f64) -> Raw {
    let backend = match backend_of(adapter_id, "Redlock", |a| match a {
        Adapter::Redlock(b) => Some(b.inner().clone()),
        _ => None,
    }) {
        Ok(b) => b,
        Err(failed) => return failed,
    };
    let op = backend.connect();
    ops::run(op_id, async move {
        Ok(op.await?.map_or(Answer::Null, Answer::Text))
    })
}

/// Resolves once the answers a Redlock adapter still waits for after earlier verdicts have come
/// (or timed out): the facade's `close` waits for it before closing the connections.
#[napi(catch_unwind)]
pub fn redlock_drain(adapter_id: f64, op_id: f64) -> Raw {
    let backend = match backend_of(adapter_id, "Redlock", |a| match a {
        Adapter::Redlock(b) => Some(b.inner().clone()),
        _ => None,
    }) {
        Ok(b) => b,
        Err(failed) => return failed,
    };
    let op = backend.drained();
    ops::run(op_id, async move {
        op.await?;
        Ok(Answer::Null)
    })
}
