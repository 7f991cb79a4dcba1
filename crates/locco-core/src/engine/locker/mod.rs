//! The Locker: acquisition with retries and the lease clock, over any backend. The front
//! (this file) holds what its clones share; [`acquire`] takes keys, [`grant`] is one grant
//! request, [`slots`] builds permits and read-write locks from plain leases, and
//! [`waiter_id`] names a place in a fair queue.

use std::rc::Rc;

use crate::contract::value::validate_token;
use crate::contract::{Backend, KeyInfo};
use crate::engine::events::Event;
use crate::engine::lock::Env;
use crate::engine::options::{validate_key, LockerOptions};
use crate::engine::retry::RetryPolicy;
use crate::rt::clock::checked_now;
use crate::rt::error::{Error, Result};
use crate::rt::ids::random_token;
use crate::rt::runtime::{Abort, Runtime};

pub(crate) mod acquire;
pub(crate) mod grant;
pub(crate) mod slots;
mod waiter_id;

pub use acquire::{Begun, Pending};

/// How long a place in a backend's fair queue lives without its waiter's next attempt: a
/// waiter that died holds up the queue for at most this long.
pub const QUEUE_LEASE_MS: u32 = 3000;
/// The longest wait between attempts of a queued waiter: the backstop for a lost push, and
/// how its place is renewed (well within [`QUEUE_LEASE_MS`]).
pub const QUEUE_RECHECK_MS: f64 = 1000.0;

/// Takes and holds leases on one backend.
///
/// ```
/// use std::rc::Rc;
/// use futures_executor::LocalPool;
/// use futures_util::task::LocalSpawnExt;
/// use locco_core::{AcquireOptions, Locker, LockerOptions, MemoryBackend, Runtime, Spawn};
///
/// struct Spawner(futures_executor::LocalSpawner);
/// impl Spawn for Spawner {
///     fn spawn(&self, task: locco_core::LocalFuture<()>) {
///         self.0.spawn_local(task).unwrap();
///     }
/// }
///
/// let mut pool = LocalPool::new();
/// let rt = Runtime::system(Rc::new(Spawner(pool.spawner())));
/// let locker = Locker::new(Rc::new(MemoryBackend::default()), rt, LockerOptions::default()).unwrap();
/// pool.run_until(async {
///     let lock = locker.acquire("order:1", AcquireOptions::new(10_000), None).await.unwrap();
///     assert!(lock.release(true).await.unwrap());
/// });
/// ```
///
/// # Behavior
/// - A lease starts when the request leaves and ends 1% of the TTL early on the Locker's clock;
///   an answer that arrives after that is a failure, and a grant is given back.
/// - Contention is [`Error::Held`]; a backend failure is never mistaken for it.
/// - A lock is not re-entrant: a second acquire of a held key waits like anyone else.
#[derive(Clone)]
pub struct Locker {
    core: Rc<LockerCore>,
}

/// What the clones of a Locker share.
pub(crate) struct LockerCore {
    /// What its locks use of it.
    env: Rc<Env>,
    options: LockerOptions,
    retry: RetryPolicy,
    /// Fired by [`Locker::close`]: every acquisition still going stops, and takes nothing.
    closed: Abort,
}

impl Locker {
    pub fn new(backend: Rc<dyn Backend>, rt: Runtime, options: LockerOptions) -> Result<Self> {
        if options.fencing && !backend.supports_fencing() {
            return Err(Error::validation(
                "fencing",
                backend.no_fencing_reason().unwrap_or_else(|| {
                    format!(
                        "the {} adapter has no acquireFenced method, so it cannot hand out fencing tokens",
                        backend.name()
                    )
                }),
            ));
        }
        let retry = RetryPolicy::default().merged(&options.retry);
        let env = Rc::new(Env {
            backend,
            rt,
            events: options.events.clone(),
            loss: options.loss.clone(),
            scheduler: Rc::default(),
            renewals: Default::default(),
        });
        Ok(Locker {
            core: Rc::new(LockerCore {
                env,
                options,
                retry,
                closed: Abort::new(),
            }),
        })
    }

    /// The Locker's retry policy (built-in defaults under the Locker's options).
    pub fn retry(&self) -> &RetryPolicy {
        &self.core.retry
    }

    pub fn backend(&self) -> &Rc<dyn Backend> {
        &self.core.env.backend
    }

    /// The prefixed key, checked.
    pub fn full_key(&self, key: &str) -> Result<String> {
        self.prefixed(key.to_owned())
    }

    /// [`Self::full_key`] of a key the caller hands over: without a prefix it is the key itself,
    /// no copy made.
    fn prefixed(&self, mut key: String) -> Result<String> {
        if key.is_empty() {
            return Err(Error::validation("key", "must be a non-empty string"));
        }
        key.insert_str(0, &self.core.options.key_prefix);
        validate_key(&key)?;
        Ok(key)
    }

    /// What the backend knows about `key` (the Locker's prefix added): held or not, the
    /// lease's time left, the key's last fence, the holder's label. Never the token.
    pub async fn inspect(&self, key: &str) -> Result<KeyInfo> {
        let key = self.full_key(key)?;
        self.core.env.backend.inspect(&key).await
    }

    /// The held keys that start with the Locker's prefix and `prefix`, at most `limit`.
    /// Their `key` is given without the Locker's prefix.
    pub async fn list(&self, prefix: &str, limit: u32) -> Result<Vec<KeyInfo>> {
        let own = &self.core.options.key_prefix;
        let full = format!("{own}{prefix}");
        let mut found = self.core.env.backend.list(&full, limit).await?;
        for info in &mut found {
            if let Some(rest) = info.key.strip_prefix(own.as_str()) {
                info.key = rest.to_owned();
            }
        }
        Ok(found)
    }

    /// Deletes whatever lease holds `key` (the Locker's prefix added), whatever its token:
    /// `true` when a live lease was removed. An operator's tool: the holder is not told, and
    /// learns it only at its next extend or `is_held`.
    pub async fn force_release(&self, key: &str) -> Result<bool> {
        let key = self.full_key(key)?;
        self.core.env.backend.force_release(&key).await
    }

    /// Closes the Locker: acquisitions still waiting end with [`Error::State`], a grant still
    /// in flight is given back when it arrives, and later acquisitions are refused. Locks
    /// already held stay with their holders (release them). Calling it again does nothing.
    pub fn close(&self) {
        self.core.closed.abort();
    }

    pub fn is_closed(&self) -> bool {
        self.core.closed.is_aborted()
    }

    fn closed_error() -> Error {
        Error::State("this Locker is closed: make a new one to take more locks".into())
    }

    /// What an acquisition watches to stop: the caller's abort, and the Locker's closing.
    fn stop(&self, caller: Option<&Abort>) -> Abort {
        // Without a caller's abort the Locker's own is the whole answer: no abort of its own
        // to make, follow and free for every acquisition (its waits give their wakers back).
        let closed = &self.core.closed;
        // Also when the caller's is the Locker's own (a stop made by an outer call).
        let Some(caller) = caller.filter(|c| !c.is(closed)) else {
            return closed.clone();
        };
        let stop = Abort::new();
        stop.follow(closed);
        stop.follow(caller);
        stop
    }

    /// An acquisition's outcome once it stopped: stopped by the Locker's closing (and not by
    /// the caller), it is the closed Locker's error.
    fn stopped<T>(&self, caller: Option<&Abort>, outcome: Result<T>) -> Result<T> {
        match outcome {
            Err(Error::Aborted) if self.is_closed() && !caller.is_some_and(Abort::is_aborted) => {
                Err(Self::closed_error())
            }
            outcome => outcome,
        }
    }

    /// A fresh token: every attempt sends its own, so a give-back of one attempt's grant can
    /// never delete the grant of another attempt of the same acquisition.
    fn token(&self) -> Result<String> {
        match &self.core.options.token {
            Some(make) => {
                let token = make()?;
                validate_token(&token)?;
                Ok(token)
            }
            None => Ok(random_token()),
        }
    }

    fn now(&self) -> Result<f64> {
        checked_now(&*self.core.env.rt.clock)
    }

    /// Builds and sends an event only when somebody listens.
    fn emit<'a>(&self, make: impl FnOnce() -> Event<'a>) {
        if let Some(sink) = &self.core.options.events {
            sink.emit(&make());
        }
    }
}
