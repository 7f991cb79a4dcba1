//! What a Locker reports as it works.

use crate::rt::error::{Error, HeldReason, LostReason};

/// One event. Every event names the key (prefix included) and the lease length.
#[derive(Debug, Clone)]
pub enum Event<'a> {
    Acquired {
        key: &'a str,
        ttl: u32,
        waited_ms: f64,
        attempts: u32,
    },
    Contended {
        key: &'a str,
        ttl: u32,
        attempt: u32,
        elapsed_ms: f64,
        reason: HeldReason,
    },
    /// An attempt failed on the backend and the acquisition goes on (`onBackendError: retry`,
    /// or a queued waiter keeping its place through a dropped connection).
    BackendRetry {
        key: &'a str,
        ttl: u32,
        attempt: u32,
        elapsed_ms: f64,
        error: &'a Error,
    },
    Extended {
        key: &'a str,
        ttl: u32,
        held_ms: f64,
    },
    ExtendFailed {
        key: &'a str,
        ttl: u32,
        held_ms: f64,
        error: &'a Error,
    },
    Released {
        key: &'a str,
        ttl: u32,
        held_ms: f64,
    },
    Lost {
        key: &'a str,
        ttl: u32,
        held_ms: f64,
        reason: LostReason,
        error: Option<&'a Error>,
    },
    ReleaseFailed {
        key: &'a str,
        ttl: u32,
        held_ms: f64,
        error: &'a Error,
    },
}

impl Event<'_> {
    /// The stable name of the event type, as JavaScript sees it.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Acquired { .. } => "acquired",
            Event::Contended { .. } => "contended",
            Event::BackendRetry { .. } => "backendRetry",
            Event::Extended { .. } => "extended",
            Event::ExtendFailed { .. } => "extendFailed",
            Event::Released { .. } => "released",
            Event::Lost { .. } => "lost",
            Event::ReleaseFailed { .. } => "releaseFailed",
        }
    }
}

/// Receives events. It must not fail; whatever a host callback throws is its own to drop.
pub trait EventSink {
    fn emit(&self, event: &Event<'_>);
}

/// Told the moment a lock is known lost, so the host can abort its signal.
pub trait LossListener {
    fn lost(&self, lock_id: u64, reason: LostReason, cause: Option<&Error>);
}
