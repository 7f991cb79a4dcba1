//! The host's event loop, for connections whose I/O runs on the engine's thread.
//!
//! A network round trip through a thread of our own costs two thread wake-ups, which is most
//! of a fast server's answer time. A host that runs an event loop on the engine's thread (in
//! Node.js, libuv) can instead report when a socket is ready, and the engine then reads and
//! writes it there, as a JavaScript client would.

use std::task::Context;

use crate::engine::task::LocalFuture;

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
