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
mod clock;
mod error;
mod event_loop;
mod events;
mod ids;
#[cfg(any(feature = "redis", feature = "postgres", feature = "mongo"))]
mod io;
mod lock;
mod locker;
mod memory;
#[cfg(feature = "mongo")]
pub mod mongo;
mod options;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(all(feature = "redis", unix))]
mod redis_loop;
mod retry;
mod runtime;
mod scheduler;
mod timer;
mod waiters;

pub use backend::{Backend, Coordination, Op, Waiter};
pub use clock::{monotonic_ms, Clock, LeaseClock, MonotonicClock, SystemSource, TimeSource};
pub use error::{BackendErrorKind, Error, ForeignError, HeldReason, LostReason, Result};
pub use event_loop::{EventLoop, SocketWatch};
pub use events::{Event, EventSink, LossListener};
pub use ids::{IdHasher, IdMap};
pub use lock::{lease_end, Lock, LockState, CLOCK_DRIFT_FACTOR};
pub use locker::Locker;
pub use memory::MemoryBackend;
pub use options::{
    random_token, validate_key, validate_ttl, AcquireOptions, AutoExtend, LockerOptions,
    TokenSource, MAX_KEY_BYTES, MAX_TTL_MS,
};
pub use retry::{Backoff, Delay, DelayFn, DelayInput, RetryOverrides, RetryPolicy};
pub use runtime::{Abort, LocalFuture, Runtime, Spawn};
pub use timer::{sleep_until, LocalTimer, ManualClock, Sleep, ThreadTimer, Timer};
pub use waiters::{LocalWaiters, LocalWakeups};
