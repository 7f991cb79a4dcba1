//! The engine: leases and their state machine, acquisition with retries and the fair queue,
//! heartbeats and batched renewals, permits and read-write locks, options and events. It uses
//! [`crate::rt`] and knows backends only through [`crate::contract`].

pub(crate) mod events;
pub(crate) mod lock;
pub(crate) mod locker;
pub(crate) mod options;
pub(crate) mod renewals;
pub(crate) mod retry;
pub(crate) mod scheduler;
pub(crate) mod shared;
