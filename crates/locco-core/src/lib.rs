//! The lock engine of locco-rs, in plain Rust: leases with random tokens, retries within a
//! budget, auto-extension with a hard deadline, fencing tokens, and the lease clock.
//!
//! Backends implement [`Backend`]: a few atomic verbs over `(key, token, ttl)`. The
//! [`Locker`] holds everything else: retries, the lease clock, heartbeats, events.
//!
//! The engine is single-threaded: its futures are `!Send` and run on one thread (in Node.js,
//! the JavaScript thread). Timers come from one background thread ([`ThreadTimer`]) and I/O
//! from the backends; everything else needs no locks.
//!
//! # Layers
//!
//! Four folders, each importing only the ones below it (`tests/layers.rs` checks it):
//!
//! ```text
//! engine/    leases, the Locker, retries, heartbeats, permits    backend/   memory, Redis, …
//!        \                                                     /
//!         contract/   the Backend trait, Op, Queue, the stored value
//!              |
//!         rt/         errors, clock, timers, tasks, ids, event loop, runtime
//! ```
//!
//! `engine` and `backend` never import each other: a backend knows the engine only as the
//! caller of its contract, and the engine knows a backend only through it.

mod backend;
mod contract;
mod engine;
mod rt;

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
pub use backend::redis::redlock;

pub use backend::memory::MemoryBackend;
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mongo",
    feature = "etcd"
))]
pub use backend::shared::safety;
pub use backend::shared::waiters::{LocalWaiters, LocalWakeups};
pub use backend::shared::wake_board::WakeBoard;
pub use contract::value::{
    holder_of, labelled, validate_holder, validate_token, HOLDER_MARK, MAX_HOLDER_BYTES,
};
pub use contract::{
    extend_each, unsupported, Backend, Coordination, KeyInfo, Op, Queue, Queued, Renewal, Waiter,
    MAX_TTL_MS,
};
pub use engine::events::{Event, EventSink, LossListener};
pub use engine::lock::{Lock, LockState, Releasing, SentRelease};
pub use engine::locker::slots::{permit_key, read_key, write_key, Slot, MAX_HOLDERS};
pub use engine::locker::{Begun, Locker, Pending, QUEUE_LEASE_MS, QUEUE_RECHECK_MS};
pub use engine::options::{
    validate_key, validate_ttl, AcquireOptions, AutoExtend, LockerOptions, TokenSource,
    MAX_KEY_BYTES,
};
pub use engine::retry::{
    Backoff, Delay, DelayFn, DelayInput, OnBackendError, RetryOverrides, RetryPolicy,
};
pub use rt::clock::{
    fresh_reading, lease_end, monotonic_ms, monotonic_reading, one_reading, Clock, LeaseClock,
    MonotonicClock, SystemSource, TimeSource, CLOCK_DRIFT_FACTOR,
};
pub use rt::error::{
    BackendErrorKind, Error, ForeignError, HeldReason, LostReason, Result, Wanted,
};
pub use rt::event_loop::{EventLoop, LoopActivity, SocketWatch, LOOP_ACTIVITY};
pub use rt::ids::{random_token, IdHasher, IdMap};
pub use rt::runtime::{Abort, Runtime};
pub use rt::task::{boxed, LocalFuture, Spawn};
pub use rt::timer::{sleep_until, LocalTimer, ManualClock, Sleep, ThreadTimer, Timer};
