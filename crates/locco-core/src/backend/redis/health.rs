//! What the watchdog of a connection driven by the event loop knows of it: requests in
//! flight and the last progress. Portable: the watchdog runs on the I/O thread.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::rt::event_loop::LoopActivity;

/// Milliseconds since a process-wide origin (the watchdog reads it on the I/O thread).
pub(super) fn now_ms() -> u64 {
    LoopActivity::now_ms()
}

/// What the watchdog on the I/O thread knows of a connection.
pub(super) struct Health {
    pub(super) sock: Arc<TcpStream>,
    pub(super) in_flight: AtomicUsize,
    /// Whether an operation has used the connection yet.
    pub(super) used: AtomicBool,
    /// Whether the watchdog closed the connection for want of an answer.
    pub(super) timed_out: AtomicBool,
    /// When the connection last received bytes or finished an operation, or got busy after
    /// being idle: answers come in order, so the oldest request written has waited since.
    pub(super) progress_ms: AtomicU64,
    pub(super) ended: AtomicBool,
}

impl Health {
    pub(super) fn busy(self: &Arc<Self>) -> Busy {
        if self.in_flight.fetch_add(1, Ordering::AcqRel) == 0 {
            self.progress_ms.store(now_ms(), Ordering::Release);
        }
        Busy(self.clone())
    }

    pub(super) fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }
}

/// One request in flight; an answer (or giving up on it) counts as progress.
pub(super) struct Busy(Arc<Health>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.progress_ms.store(now_ms(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
