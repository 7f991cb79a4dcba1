//! A bounded busy-poll of the event loop while an answer is due.
//!
//! A request to a server on the same host is answered in tens of microseconds, but a loop that
//! sleeps meanwhile must be woken, and on a virtual machine a halted vCPU takes longer to wake
//! than the server takes to answer: a sequential Redis acquire-release pair cost about 200 us
//! asleep and 70 us awake here. So after a socket writes, the loop polls for events without
//! sleeping (an active libuv idle handle makes its wait return at once) for up to [`WINDOW`],
//! and then sleeps as usual. Only a request written soon after an answer opens a window
//! ([`HOT`]): after an idle spell the server sleeps too. It does not poll when many requests
//! are out (under load the answers gathered while it sleeps are read in one batch, which a
//! poll would break up), and a server that keeps answering after the window (a remote one)
//! turns polling off for a growing number of requests.
//!
//! The cost is at most one window of CPU per request that waits on an idle loop.

use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::time::{Duration, Instant};

extern "C" {
    fn uv_idle_start(handle: *mut c_void, cb: unsafe extern "C" fn(*mut c_void)) -> c_int;
    fn uv_idle_stop(handle: *mut c_void) -> c_int;
}

/// How long the loop polls after a socket's first write since it was last readable.
const WINDOW: Duration = Duration::from_micros(100);
/// A write opens a window only this soon after the last answer: a request that follows an
/// answer at once (a release after its acquire, the next step of a sequence) finds the server
/// awake, while after an idle spell the server's vCPU must wake too, and a poll for its answer
/// would mostly run out in vain. (Paced 1 ms apart, pairs took the same time either way,
/// within this machine's noise.)
const HOT: Duration = Duration::from_micros(200);
/// With more than this written and unanswered, the loop sleeps as usual.
const MAX_UNANSWERED_BYTES: usize = 1024;
/// The most requests that sleep at once after polls in vain, before one polls again.
const MAX_BACKOFF: u32 = 1024;

struct Poll {
    /// The loop's idle handle (unreferenced: it never keeps the process alive).
    idle: Cell<*mut c_void>,
    polling: Cell<bool>,
    /// What sockets wrote since they were last readable (a write is never empty, so an answer
    /// is awaited exactly while this is above 0).
    unanswered: Cell<usize>,
    /// When the newest window began. A steady stream of writes to a slow server does not
    /// extend it: only a socket's first write since it was last readable starts one.
    window_start: Cell<Option<Instant>>,
    /// When the last answer arrived.
    last_answer: Cell<Option<Instant>>,
    /// Windows left to skip after polls in vain.
    skip: Cell<u32>,
    backoff: Cell<u32>,
}

thread_local! {
    static POLL: Poll = const { Poll {
        idle: Cell::new(ptr::null_mut()),
        polling: Cell::new(false),
        unanswered: Cell::new(0),
        window_start: Cell::new(None),
        last_answer: Cell::new(None),
        skip: Cell::new(0),
        backoff: Cell::new(0),
    } };
}

/// The loop's idle handle, initialised and unreferenced, not started.
pub fn started(idle: *mut c_void) {
    POLL.with(|p| p.idle.set(idle));
}

/// The handle was closed with the loop's others (the environment is going away).
pub fn closed() {
    let _ = POLL.try_with(|p| {
        p.idle.set(ptr::null_mut());
        p.polling.set(false);
    });
}

/// A socket wrote `bytes`; `first`: its first write since it was last readable.
pub fn wrote(first: bool, bytes: usize) {
    POLL.with(|p| {
        p.unanswered.set(p.unanswered.get() + bytes);
        if !first {
            return;
        }
        let now = Instant::now();
        if p.last_answer.get().is_none_or(|t| now - t >= HOT) {
            return;
        }
        if p.skip.get() > 0 {
            p.skip.set(p.skip.get() - 1);
        } else {
            p.window_start.set(Some(now));
        }
    });
}

/// A socket that wrote `bytes` became readable (or was closed).
pub fn answered(bytes: usize) {
    let _ = POLL.try_with(|p| {
        p.last_answer.set(Some(Instant::now()));
        p.unanswered.set(p.unanswered.get() - bytes);
        if p.polling.get() {
            p.backoff.set(0);
        }
    });
}

/// Runs just before the loop waits for events: keeps it polling while an answer may be
/// near, and lets it sleep once the window has passed.
pub fn before_wait() {
    POLL.with(|p| {
        let idle = p.idle.get();
        if idle.is_null() {
            return;
        }
        let unanswered = p.unanswered.get();
        let awaiting = unanswered > 0;
        let in_window = p.window_start.get().is_some_and(|t| t.elapsed() < WINDOW);
        let poll = awaiting && in_window && unanswered <= MAX_UNANSWERED_BYTES;
        if poll == p.polling.get() {
            return;
        }
        p.polling.set(poll);
        if poll {
            unsafe { uv_idle_start(idle, nothing) };
            return;
        }
        unsafe { uv_idle_stop(idle) };
        if awaiting && !in_window {
            // Polled a whole window in vain: the server is farther away than polling pays
            // for. The next windows (twice as many each time) are skipped.
            let backoff = (p.backoff.get() * 2).clamp(1, MAX_BACKOFF);
            p.backoff.set(backoff);
            p.skip.set(backoff);
        }
    });
}

/// The idle handle's callback: its being active is what keeps the loop from sleeping.
unsafe extern "C" fn nothing(_: *mut c_void) {}
