//! What the backends share: the I/O thread of the networked ones ([`io`]), the per-key queues
//! of this process's waiters ([`waiters`]), the board that pushed wake-ups land on
//! ([`wake_board`]) and the deployment checks behind `checkSafety` and `doctor` ([`safety`]).

#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mongo",
    feature = "etcd"
))]
pub(crate) mod io;
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mongo",
    feature = "etcd"
))]
pub mod safety;
pub(crate) mod waiters;
pub(crate) mod wake_board;
