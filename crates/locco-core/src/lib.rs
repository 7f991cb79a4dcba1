//! The lock engine of locco-rs, in plain Rust: leases with random tokens, retries within a
//! budget, auto-extension with a hard deadline, fencing tokens, and the lease clock.
//!
//! Backends implement [`Backend`]: a few atomic verbs over `(key, token, ttl)`. The
//! [`Locker`] holds everything else: retries, the lease clock, heartbeats, events.
//!
//! The engine is single-threaded: its futures are `!Send` and run on one thread (in Node.js,
//! the JavaScript thread). Timers come from one background thread ([`ThreadTimer`]) and I/O
//! from the backends; everything else needs no locks.

mod backend;
mod engine;

// The backends with options of their own, at the paths the binding uses.
#[cfg(feature = "etcd")]
pub use backend::etcd;
#[cfg(feature = "mongo")]
pub use backend::mongo;
#[cfg(feature = "postgres")]
pub use backend::postgres;
#[cfg(feature = "redis")]
pub use backend::redis;
#[cfg(feature = "redis")]
pub use backend::redlock;

pub use backend::holder::{
    holder_of, labelled, validate_holder, validate_token, HOLDER_MARK, MAX_HOLDER_BYTES,
};
pub use backend::memory::MemoryBackend;
pub use backend::queue::WakeBoard;
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mongo",
    feature = "etcd"
))]
pub use backend::safety;
pub use backend::waiters::{LocalWaiters, LocalWakeups};
pub use backend::{
    extend_each, unsupported, Backend, Coordination, KeyInfo, Op, Queue, Queued, Renewal, Waiter,
};
pub use engine::clock::{
    fresh_reading, monotonic_ms, monotonic_reading, one_reading, Clock, LeaseClock, MonotonicClock,
    SystemSource, TimeSource,
};
pub use engine::error::{BackendErrorKind, Error, ForeignError, HeldReason, LostReason, Result};
pub use engine::event_loop::{EventLoop, LoopActivity, SocketWatch, LOOP_ACTIVITY};
pub use engine::events::{Event, EventSink, LossListener};
pub use engine::ids::{IdHasher, IdMap};
pub use engine::lock::{lease_end, Lock, LockState, Releasing, SentRelease, CLOCK_DRIFT_FACTOR};
pub use engine::locker::holders::{permit_key, read_key, write_key, Holders, MAX_HOLDERS};
pub use engine::locker::{Begun, Locker, Waiting, QUEUE_LEASE_MS, QUEUE_RECHECK_MS};
pub use engine::options::{
    random_token, validate_key, validate_ttl, AcquireOptions, AutoExtend, LockerOptions,
    TokenSource, MAX_KEY_BYTES, MAX_TTL_MS,
};
pub use engine::retry::{Backoff, Delay, DelayFn, DelayInput, RetryOverrides, RetryPolicy};
pub use engine::runtime::{Abort, Runtime};
pub use engine::task::{boxed, LocalFuture, Spawn};
pub use engine::timer::{sleep_until, LocalTimer, ManualClock, Sleep, ThreadTimer, Timer};
