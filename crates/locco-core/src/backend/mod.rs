//! The backends, one folder each: in memory, Redis/Valkey (standalone, Cluster and Redlock),
//! PostgreSQL (table and advisory mode), MongoDB and etcd, and what they share ([`shared`]).
//! They implement [`crate::contract`] and use [`crate::rt`]; never the engine.

#[cfg(feature = "etcd")]
pub mod etcd;
pub(crate) mod memory;
#[cfg(feature = "mongo")]
pub mod mongo;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
pub(crate) mod shared;
