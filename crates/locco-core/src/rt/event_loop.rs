//! The host's event loop, for connections whose I/O runs on the engine's thread.
//!
//! A network round trip through a thread of our own costs two thread wake-ups, which is most
//! of a fast server's answer time. A host that runs an event loop on the engine's thread (in
//! Node.js, libuv) can instead report when a socket is ready, and the engine then reads and
//! writes it there, as a JavaScript client would.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::task::Context;
use std::time::Instant;

use crate::rt::task::LocalFuture;

/// Readiness of one non-blocking socket, reported by the host's event loop.
pub trait SocketWatch {
    /// Wakes `cx`'s waker once, on the engine's thread, when the socket becomes readable.
    fn wait_readable(&mut self, cx: &mut Context<'_>);
    /// Queues bytes for the socket. With `now` they are written at once; otherwise before
    /// the loop next waits for events, so the requests of one turn of the loop leave in one
    /// write. Fails when an earlier write failed.
    fn send(&mut self, bytes: &[u8], now: bool) -> std::io::Result<()>;
}

/// The event loop that the engine's thread runs.
pub trait EventLoop {
    /// Starts watching a socket. The watch ends when it is dropped; the socket stays open.
    fn watch(&self, fd: i32) -> std::io::Result<Box<dyn SocketWatch>>;
    /// Runs a task on the engine's thread.
    fn spawn(&self, task: LocalFuture<()>);
}

/// What the host's loop is doing, for watchdogs on other threads: a connection that has waited
/// long for an answer is dead only if the loop was free to read it. While JavaScript runs a long
/// task, requests stay queued and answers unread, and that is no fault of the server's.
///
/// The host reports when the loop starts to wait for events and when it stops; a host that
/// never reports leaves every watchdog as it would be without this.
pub struct LoopActivity {
    reported: AtomicBool,
    waiting: AtomicBool,
    /// When the loop last stopped waiting (ms on [`LoopActivity::now_ms`]).
    woke_ms: AtomicU64,
    /// When the loop last began to wait after a long stretch of work.
    stall_end_ms: AtomicU64,
}

/// A stretch of work this long counts as a stall of the loop.
const STALL_MS: u64 = 50;

pub static LOOP_ACTIVITY: LoopActivity = LoopActivity {
    reported: AtomicBool::new(false),
    waiting: AtomicBool::new(false),
    woke_ms: AtomicU64::new(0),
    stall_end_ms: AtomicU64::new(0),
};

impl LoopActivity {
    /// Milliseconds since a process-wide origin.
    pub fn now_ms() -> u64 {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64
    }

    /// The loop is about to wait for events.
    pub fn waiting(&self) {
        let now = Self::now_ms();
        if now.saturating_sub(self.woke_ms.load(Ordering::Acquire)) >= STALL_MS {
            self.stall_end_ms.store(now, Ordering::Release);
        }
        self.waiting.store(true, Ordering::Release);
        self.reported.store(true, Ordering::Release);
    }

    /// The loop stopped waiting: it runs callbacks now.
    pub fn working(&self) {
        self.woke_ms.store(Self::now_ms(), Ordering::Release);
        self.waiting.store(false, Ordering::Release);
    }

    /// How long the loop has been busy without waiting for events (0 while it waits).
    pub fn busy_ms(&self, now: u64) -> u64 {
        if !self.reported.load(Ordering::Acquire) || self.waiting.load(Ordering::Acquire) {
            return 0;
        }
        now.saturating_sub(self.woke_ms.load(Ordering::Acquire))
    }

    /// When the loop last came back from a stall (0: never).
    pub fn stall_end_ms(&self) -> u64 {
        self.stall_end_ms.load(Ordering::Acquire)
    }
}
