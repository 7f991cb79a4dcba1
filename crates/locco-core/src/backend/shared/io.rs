//! What the network backends share: one I/O thread with a Tokio runtime, and the bridge from
//! its tasks to the engine's thread.

use std::sync::{Arc, Mutex, OnceLock};

use futures_util::FutureExt;

use crate::contract::Op;
use crate::rt::error::{BackendErrorKind, Error};

/// The runtime every connection of the process runs on: one thread is enough for I/O, and
/// leaves the other core to JavaScript.
pub(crate) fn runtime() -> &'static tokio::runtime::Handle {
    static RT: OnceLock<tokio::runtime::Handle> = OnceLock::new();
    RT.get_or_init(|| {
        // rustls needs one crypto provider per process; another library may have installed
        // one already, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("start the locco I/O runtime");
        let handle = rt.handle().clone();
        std::thread::Builder::new()
            .name("locco-io".into())
            .spawn(move || rt.block_on(std::future::pending::<()>()))
            .expect("start the locco I/O thread");
        handle
    })
}

/// A failure on the I/O thread, in a form that can cross threads.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub backend: &'static str,
    pub kind: BackendErrorKind,
    pub message: String,
    pub code: Option<String>,
    pub replication: Option<(u32, u32)>,
    /// A set-up problem the server revealed (a missing table): a `ValidationError` on this field.
    pub validation: Option<&'static str>,
}

impl Failure {
    pub fn new(backend: &'static str, kind: BackendErrorKind, message: impl Into<String>) -> Self {
        Failure {
            backend,
            kind,
            message: message.into(),
            code: None,
            replication: None,
            validation: None,
        }
    }

    pub fn into_error(self) -> Error {
        if let Some(field) = self.validation {
            return Error::validation(field, self.message);
        }
        if let Some((replicas, acknowledged)) = self.replication {
            return Error::Replication {
                replicas,
                acknowledged,
            };
        }
        Error::Backend {
            backend: self.backend.into(),
            kind: self.kind,
            message: self.message,
            code: self.code,
            held_in_part: false,
        }
    }
}

/// How to stop an operation nobody needs in time any more (the engine gave up on it, or
/// dropped it): a backend registers a canceller once its request is on the wire, and checks
/// [`OnAbandon::is_abandoned`] before sending one.
#[derive(Clone, Default)]
pub(crate) struct OnAbandon(Arc<AbandonState>);

#[derive(Default)]
pub(crate) struct AbandonState {
    abandoned: std::sync::atomic::AtomicBool,
    cancel: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

// Only the Postgres backend cancels statements (`set`, `clear`); the others have nothing to stop.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
impl OnAbandon {
    /// Registers the canceller; runs it at once when the operation was already abandoned.
    pub fn set(&self, f: impl FnOnce() + Send + 'static) {
        if let Ok(mut slot) = self.0.cancel.lock() {
            *slot = Some(Box::new(f));
        }
        if self.is_abandoned() {
            self.cancel();
        }
    }

    pub fn clear(&self) {
        if let Ok(mut slot) = self.0.cancel.lock() {
            slot.take();
        }
    }

    pub fn is_abandoned(&self) -> bool {
        self.0.abandoned.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks the operation abandoned and cancels what is on the wire. True when a canceller ran.
    fn trigger(&self) -> bool {
        self.0
            .abandoned
            .store(true, std::sync::atomic::Ordering::Release);
        self.cancel()
    }

    fn cancel(&self) -> bool {
        let f = self.0.cancel.lock().ok().and_then(|mut s| s.take());
        f.map(|f| f()).is_some()
    }
}

impl OnAbandon {
    /// Err when the engine gave the operation up: for a request about to start, or a grant
    /// about to be sent after a wait of its own (a first connection, a session), which would
    /// land after the engine's release of its token.
    pub fn still_wanted(&self, backend: &'static str) -> Result<(), Failure> {
        match self.is_abandoned() {
            true => Err(not_sent(backend)),
            false => Ok(()),
        }
    }
}

/// How many of one backend's requests run on the I/O thread at once (see [`Lane`]).
pub(crate) const LANE_WIDTH: usize = 128;

/// A backend's share of the I/O thread: at most [`LANE_WIDTH`] of its requests run at once
/// (fewer where its driver would queue the rest itself: MongoDB's pool), the rest wait their
/// turn, in order, on the engine's side. The thread serves the tasks sent to it in the order
/// they came, and between its own tasks, so a heartbeat sent behind 8,000 acquisitions started
/// seconds later, after its lock's lease had run out. Heartbeats ([`run`]) do not wait for a
/// place. Only short requests take one: a place held for as long as a lock lives would shut
/// the lane.
#[derive(Clone)]
pub(crate) struct Lane(Arc<tokio::sync::Semaphore>);

impl Default for Lane {
    fn default() -> Self {
        Lane::new(LANE_WIDTH)
    }
}

impl Lane {
    /// A lane for `width` requests at once (at least one).
    pub(crate) fn new(width: usize) -> Self {
        Lane(Arc::new(tokio::sync::Semaphore::new(width.max(1))))
    }
}

/// [`run`] for an ordinary request: it starts once `lane` has room for it.
pub(crate) fn run_in<T: Send + 'static, F>(
    lane: &Lane,
    backend: &'static str,
    work: impl FnOnce(OnAbandon) -> F,
) -> Op<T>
where
    F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
{
    spawn(Some(lane), backend, work)
}

/// Runs `work` on the I/O thread and answers on the engine's thread. When the engine stops
/// waiting, a registered [`OnAbandon`] runs (a cancel request) and the work is awaited to its
/// end, so a connection goes back to its pool healthy; without one the work is dropped.
/// It starts at once: for heartbeats, and for work that lasts (see [`Lane`]).
pub(crate) fn run<T: Send + 'static, F>(
    backend: &'static str,
    work: impl FnOnce(OnAbandon) -> F,
) -> Op<T>
where
    F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
{
    spawn(None, backend, work)
}

fn spawn<T: Send + 'static, F>(
    lane: Option<&Lane>,
    backend: &'static str,
    work: impl FnOnce(OnAbandon) -> F,
) -> Op<T>
where
    F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
{
    let (mut tx, rx) = tokio::sync::oneshot::channel();
    let abandon = OnAbandon::default();
    let trigger_abandon = abandon.clone();
    let fut = std::panic::AssertUnwindSafe(work(abandon.clone())).catch_unwind();
    let task = async move {
        // Given up before it started (it waited for room in its lane, or behind other work on
        // the I/O thread): not sent. Only grants are given up, and one sent this late would
        // land after the engine's release of its token.
        if let Err(given_up) = trigger_abandon.still_wanted(backend) {
            let _ = tx.send(Err(given_up));
            return;
        }
        let mut fut = std::pin::pin!(fut);
        let answer = tokio::select! {
            answer = &mut fut => answer,
            () = tx.closed() => {
                if trigger_abandon.trigger() {
                    let _ = fut.await;
                }
                return;
            }
        };
        // A panic in a driver or in TLS set-up becomes an error, not a lost answer.
        let _ = tx.send(answer.unwrap_or_else(|panic| {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(Failure::new(
                backend,
                BackendErrorKind::Other,
                format!("the {backend} driver panicked: {text}"),
            ))
        }));
    };
    // A request without room waits here, on the engine's side: the I/O thread takes tasks
    // sent from other threads only between its own, so a waiting task there would still
    // queue ahead of a heartbeat. Dropped while it waits, it never starts.
    let waiting = match lane.map(|l| l.0.clone().try_acquire_owned().map_err(|_| l)) {
        None => {
            runtime().spawn(task);
            None
        }
        Some(Ok(place)) => {
            runtime().spawn(holding(place, task));
            None
        }
        Some(Err(lane)) => {
            let lane = lane.0.clone();
            Some(async move {
                if let Ok(place) = lane.acquire_owned().await {
                    runtime().spawn(holding(place, task));
                }
            })
        }
    };
    Op::pending(async move {
        if let Some(waiting) = waiting {
            waiting.await;
        }
        match rx.await {
            Ok(r) => r.map_err(Failure::into_error),
            Err(_) => Err(Error::Internal(format!(
                "the {backend} task ended without an answer"
            ))),
        }
    })
    .with_abandon(move || {
        abandon.trigger();
    })
}

/// The answer to a request given up before anything of it was sent.
pub(crate) fn not_sent(backend: &'static str) -> Failure {
    Failure::new(
        backend,
        BackendErrorKind::Timeout,
        "given up before it was sent; nothing reached the server",
    )
}

/// `task`, giving its place in a lane back when it ends.
async fn holding(place: tokio::sync::OwnedSemaphorePermit, task: impl std::future::Future) {
    task.await;
    drop(place);
}

/// Sleeps on the I/O thread's timer; for a bound on something that runs elsewhere.
#[cfg_attr(any(not(feature = "redis"), not(unix)), allow(dead_code))]
pub(crate) fn sleep(d: std::time::Duration) -> Op<()> {
    run("timer", move |_| async move {
        tokio::time::sleep(d).await;
        Ok(())
    })
}

/// Removes every secret from a message.
///
/// A short secret (under 4 characters) is replaced only where it stands as a word of its own:
/// replaced inside words, a password such as `p` would turn "provided" into "***rovided".
pub(crate) fn redact(secrets: &[String], mut message: String) -> String {
    for s in secrets.iter().filter(|s| !s.is_empty()) {
        message = if s.chars().count() >= 4 {
            message.replace(s.as_str(), "***")
        } else {
            replace_word(&message, s)
        };
    }
    message
}

/// `message` with each occurrence of `word` not inside a longer run of letters and digits
/// replaced by `***`.
fn replace_word(message: &str, word: &str) -> String {
    let is_word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(word) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + word.len()..].chars().next();
        out.push_str(&rest[..at]);
        if is_word(before) || is_word(after) {
            out.push_str(word);
        } else {
            out.push_str("***");
        }
        rest = &rest[at + word.len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_request_given_up_while_its_lane_is_full_never_starts() {
        let lane = Lane::default();
        // Every place taken by requests that wait for a signal.
        let (open, opened) = tokio::sync::watch::channel(false);
        let busy: Vec<Op<()>> = (0..LANE_WIDTH)
            .map(|_| {
                let mut opened = opened.clone();
                run_in(&lane, "test", move |_| async move {
                    let _ = opened.wait_for(|o| *o).await;
                    Ok(())
                })
            })
            .collect();
        let started = Arc::new(AtomicBool::new(false));
        let seen = started.clone();
        let mut late = run_in(&lane, "test", move |_| async move {
            seen.store(true, Ordering::SeqCst);
            Ok(())
        });
        // Polled once, it waits for a place; then the engine gives it up.
        assert!((&mut late).now_or_never().is_none());
        late.abandon();
        let _ = open.send(true);
        let here = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        here.block_on(futures_util::future::join_all(busy));
        let answer = here.block_on(late);
        assert!(!started.load(Ordering::SeqCst), "the request ran");
        match answer {
            Err(Error::Backend { kind, .. }) => assert_eq!(kind, BackendErrorKind::Timeout),
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    #[test]
    fn redacts_long_secrets_everywhere_and_short_ones_as_words() {
        let secrets = vec!["hunter2-pw".to_string(), "p".to_string()];
        let text = "auth as u:hunter2-pw failed; provided password p was refused (p)".to_string();
        assert_eq!(
            redact(&secrets, text),
            "auth as u:*** failed; provided password *** was refused (***)"
        );
    }
}
