//! Running the engine's futures on the JavaScript thread: the executor, and operations as the
//! facade sees them (a value at once, or `PENDING` and a later settle).

pub mod executor;
pub mod ops;
