//! The engine: leases and their state machine, acquisition with retries and the fair queue,
//! heartbeats and batched renewals, permits and read-write locks, options and events. It uses
//! [`crate::rt`] and knows backends only through [`crate::contract`].
//!
//! [`lock`] is a held lease: its handle, its state machine and its batched renewals. It knows
//! nothing of the [`locker`], which takes keys and makes locks.

pub(crate) mod events;
pub(crate) mod lock;
pub(crate) mod locker;
pub(crate) mod options;
pub(crate) mod retry;
pub(crate) mod scheduler;
