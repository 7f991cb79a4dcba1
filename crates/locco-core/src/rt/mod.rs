//! The floor everything stands on: errors, the lease clock (with its drift margin), timers,
//! tasks and spawning, ids and tokens, the host's event loop, and the runtime that bundles
//! them. It imports nothing else of the crate.

pub(crate) mod clock;
pub(crate) mod error;
pub(crate) mod event_loop;
pub(crate) mod ids;
pub(crate) mod runtime;
pub(crate) mod task;
pub(crate) mod timer;
