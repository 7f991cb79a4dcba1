//! What a Locker and its locks share: the backend, the host services, the options and the
//! scheduler of their heartbeats and expiry checks, and the batch of renewals due.

use std::rc::Rc;

use crate::contract::Backend;
use crate::engine::options::LockerOptions;
use crate::engine::renewals::Renewals;
use crate::engine::retry::RetryPolicy;
use crate::engine::scheduler::Scheduler;
use crate::rt::runtime::{Abort, Runtime};

pub(crate) struct Shared {
    pub backend: Rc<dyn Backend>,
    pub rt: Runtime,
    pub options: LockerOptions,
    pub retry: RetryPolicy,
    pub scheduler: Rc<Scheduler>,
    pub renewals: Renewals,
    /// Fired by `Locker::close`: every acquisition still going stops, and takes nothing.
    pub closed: Abort,
}
