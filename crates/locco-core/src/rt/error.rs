//! The one error type of the engine.

use std::fmt;
use std::rc::Rc;

/// Why a lock was lost. `as_str` gives the stable name the JavaScript API uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// The backend answered that the key was not ours when we extended it.
    Extend,
    /// The lease ran out while extension requests kept failing.
    ExtendFailed,
    /// The lease ran out while an extension was still waiting for its answer.
    LateExtend,
    /// The lease ran out and nothing extended it.
    Expired,
    /// The `maxHold` deadline passed.
    MaxHold,
    /// A release found the key gone or another holder's.
    Release,
    /// `is_held` found the key gone or another holder's.
    Observed,
    /// The backend's session that kept the lease ended (a dropped connection, an expired
    /// etcd lease), which it reported at once (see `Backend::watch_lost`).
    Session,
}

impl LostReason {
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::Extend => "extend",
            LostReason::ExtendFailed => "extend-failed",
            LostReason::LateExtend => "late-extend",
            LostReason::Expired => "expired",
            LostReason::MaxHold => "max-hold",
            LostReason::Release => "release",
            LostReason::Observed => "observed",
            LostReason::Session => "session",
        }
    }
}

/// Why an acquisition yielded no lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldReason {
    /// Another holder had the key.
    Held,
    /// The backend granted the key but answered after the lease could have ended. An attempt
    /// that got no answer at all is not this: it is a backend timeout.
    Late,
    /// `try_acquire`'s single attempt was granted too late; the key was given back.
    LateAcquire,
}

/// What an acquisition that gave up wanted, so that its message names it: a full semaphore
/// is not "held elsewhere" when the caller's own Locker holds its permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wanted {
    /// A plain lock's key.
    #[default]
    Key,
    /// One of `limit` permits of a counting semaphore.
    Permit { limit: u32 },
    /// A reader's place in a read-write lock that admits `max_readers`.
    Read { max_readers: u32 },
    /// The write of a read-write lock.
    Write,
}

impl HeldReason {
    pub fn as_str(self) -> &'static str {
        match self {
            HeldReason::Held => "held",
            HeldReason::Late => "late",
            HeldReason::LateAcquire => "late-acquire",
        }
    }
}

/// The broad class of a backend failure, so callers never match on message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    Io,
    Timeout,
    Auth,
    Tls,
    Protocol,
    Script,
    Config,
    Other,
}

impl BackendErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendErrorKind::Io => "io",
            BackendErrorKind::Timeout => "timeout",
            BackendErrorKind::Auth => "auth",
            BackendErrorKind::Tls => "tls",
            BackendErrorKind::Protocol => "protocol",
            BackendErrorKind::Script => "script",
            BackendErrorKind::Config => "config",
            BackendErrorKind::Other => "other",
        }
    }
}

/// An error raised by the host (for example a JavaScript adapter's exception), carried through
/// the engine untouched. The host keeps the original object under `id` and frees it on drop.
pub struct ForeignError {
    pub id: u64,
    on_drop: Box<dyn Fn(u64)>,
}

impl ForeignError {
    pub fn new(id: u64, on_drop: impl Fn(u64) + 'static) -> Rc<Self> {
        Rc::new(ForeignError {
            id,
            on_drop: Box::new(on_drop),
        })
    }
}

impl Drop for ForeignError {
    fn drop(&mut self) {
        (self.on_drop)(self.id)
    }
}

impl fmt::Debug for ForeignError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ForeignError({})", self.id)
    }
}

/// Every failure the engine reports.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key could not be taken within the retry budget: another holder had it, or the
    /// backend's grant came too late to use (see `reason`).
    #[error("{}", held_message(key, *attempts, *elapsed_ms, *reason, *wanted, holder.as_deref()))]
    Held {
        key: String,
        attempts: u32,
        elapsed_ms: f64,
        reason: HeldReason,
        /// A plain key, a permit, a read or the write.
        wanted: Wanted,
        /// The label of the holder that had the key when the acquisition gave up, when it
        /// gave one and the backend could tell (read once, after the last attempt).
        holder: Option<String>,
    },
    /// The lease was lost.
    #[error("lock {key:?} was lost ({})", reason.as_str())]
    Lost {
        key: String,
        reason: LostReason,
        cause: Option<Box<Error>>,
    },
    /// An operation that the lock's state does not allow (extend after release).
    #[error("{0}")]
    State(String),
    /// A wrong argument or a backend set up wrong. `field` names the culprit.
    #[error("invalid {field}: {message}")]
    Validation { field: String, message: String },
    /// The backend failed: not contention.
    #[error("{backend} backend error ({}): {message}", kind.as_str())]
    Backend {
        backend: String,
        kind: BackendErrorKind,
        message: String,
        code: Option<String>,
        /// A grant that found the key held by another on some servers, with too many silent
        /// or failed ones to prove contention (a Redlock split vote with a server down): a
        /// later attempt, within the retry budget, may well win.
        held_in_part: bool,
    },
    /// `waitForReplicas`: fewer replicas acknowledged a grant or extension than asked for.
    /// Not contention: an acquire gives the key back, an extension keeps the lock.
    #[error("only {acknowledged} of {replicas} replicas acknowledged the write in time")]
    Replication { replicas: u32, acknowledged: u32 },
    /// An error raised by host code (a JavaScript adapter or delay function), passed through.
    #[error("error raised by host code")]
    Foreign(Rc<ForeignError>),
    /// The caller's abort signal fired.
    #[error("aborted")]
    Aborted,
    /// A bug: a panic caught at the boundary, or a broken invariant.
    #[error("internal error: {0}")]
    Internal(String),
}

fn held_message(
    key: &str,
    attempts: u32,
    elapsed_ms: f64,
    reason: HeldReason,
    wanted: Wanted,
    holder: Option<&str>,
) -> String {
    let gave_up = format!("gave up after {attempts} attempt(s) in {elapsed_ms:.0} ms");
    match (reason, wanted, holder) {
        (HeldReason::Held, Wanted::Permit { limit }, _) => {
            format!("all {limit} permits of semaphore {key:?} are held: {gave_up} (held)")
        }
        (HeldReason::Held, Wanted::Read { max_readers }, _) => format!(
            "read-write lock {key:?} has a writer, or all {max_readers} readers it admits: {gave_up} (held)"
        ),
        (HeldReason::Held, Wanted::Write, _) => {
            format!("read-write lock {key:?} has readers or a writer: {gave_up} (held)")
        }
        (HeldReason::Held, Wanted::Key, Some(holder)) => {
            format!("lock {key:?} is held by {holder:?}: {gave_up} (held)")
        }
        (HeldReason::Held, Wanted::Key, None) => {
            format!("lock {key:?} is held elsewhere: {gave_up} (held)")
        }
        // Nobody else has the key: the grant arrived after its lease could have ended, so it
        // was given back. Saying "held elsewhere" would send the reader after a rival.
        (late, _, _) => format!(
            "lock {key:?} was not taken: the backend answered too slowly, after the lease could have ended \
             (the grant was given back); {gave_up} ({})",
            late.as_str()
        ),
    }
}

impl Error {
    pub fn validation(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Validation {
            field: field.into(),
            message: message.into(),
        }
    }

    pub fn backend(
        backend: impl Into<String>,
        kind: BackendErrorKind,
        message: impl Into<String>,
    ) -> Self {
        Error::Backend {
            backend: backend.into(),
            kind,
            message: message.into(),
            code: None,
            held_in_part: false,
        }
    }

    pub fn is_contention(&self) -> bool {
        matches!(self, Error::Held { .. })
    }

    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost { .. })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
