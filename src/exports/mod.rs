//! What the facade calls: Lockers, locks, the raw per-lock functions, retry policies and the
//! operator's doctor. (Adapter constructors are in `crate::backends`.)

pub mod doctor;
pub mod fast;
pub mod lock;
pub mod locker;
pub mod retry;
