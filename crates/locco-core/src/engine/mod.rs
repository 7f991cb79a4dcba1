//! The engine: leases and their state machine, acquisition with retries, the lease clock,
//! heartbeats, errors and events, and what it needs from its host. It knows backends only
//! through the [`crate::Backend`] trait.

pub(crate) mod clock;
pub(crate) mod error;
pub(crate) mod event_loop;
pub(crate) mod events;
pub(crate) mod ids;
pub(crate) mod lock;
pub(crate) mod locker;
pub(crate) mod options;
pub(crate) mod renewals;
pub(crate) mod retry;
pub(crate) mod runtime;
pub(crate) mod scheduler;
pub(crate) mod shared;
pub(crate) mod task;
pub(crate) mod timer;
