//! The backends: in memory, Redis/Valkey (standalone, Cluster, Redlock), PostgreSQL (table and
//! advisory), MongoDB and etcd, with what they share: the I/O thread of the networked ones,
//! the per-key queues of local waiters, the board of pushed wake-ups and the safety checks.
//! They implement [`crate::contract`] and use [`crate::rt`]; never the engine.

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mongo",
    feature = "etcd"
))]
pub(crate) mod io;
pub(crate) mod memory;
#[cfg(feature = "mongo")]
pub mod mongo;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "postgres")]
mod postgres_queue;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub mod redlock;
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mongo",
    feature = "etcd"
))]
pub mod safety;
pub(crate) mod waiters;
pub(crate) mod wake_board;
