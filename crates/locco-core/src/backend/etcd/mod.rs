//! The etcd backend: a lock is a key under `prefix`, attached to the adapter's session lease.
//!
//! ## Grants and fencing
//!
//! A grant is one transaction, `create_revision(key) == 0 → put(key, token, lease)`. etcd runs
//! it through Raft, so two callers can never both see the key absent: while a majority of the
//! members lives there is no double grant, and a member cut off from the majority commits
//! nothing (with `require_leader`, it refuses at once once it has no leader). The fencing
//! token is the revision of the granting transaction, which is the key's create revision:
//! revisions grow across the whole cluster, so every later grant of the key has a larger one.
//!
//! ## One session lease, and the per-lock TTL
//!
//! The adapter holds one etcd lease (its *session*, `sessionTtl`, whole seconds) with one
//! keep-alive stream; every key it grants is attached to it, so a thousand locks cost one
//! keep-alive, not a thousand. The engine's per-lock TTL (often far below etcd's minimum lease
//! granularity of a second) is kept by this adapter: each grant or extension records the lock's
//! deadline (measured from the moment the request left), and a timer on the I/O thread deletes
//! the key (`value == token → delete`) when a deadline passes without a newer extension. The
//! timer runs on the I/O thread, not the JavaScript thread, so a stalled event loop does not
//! stop it. `extend` and `isHeld` also check the deadline, so a lock is never reported held
//! past it even while the delete is still in flight. An extension reads the key (value and
//! lease must be ours); the extensions that fall due together read all their keys in one
//! transaction of gets (128 a transaction, etcd's default `--max-txn-ops`).
//!
//! Why not one etcd lease per lock: a lease TTL is whole seconds (and at least ~2 s with the
//! default election timeout), which would make a 100 ms lock live 20 times too long; and each
//! lock would need its own keep-alive. The price of the session design: when the *process*
//! dies, its keys live until the session lease expires (`sessionTtl`), not until their own TTL.
//!
//! ## Losing the session
//!
//! The keep-alive loop sends a beat every third of the lease TTL. The session counts as lost
//! when the cluster answers that the lease is gone (a keep-alive, or a write that names it:
//! "requested lease not found", after a member's restart or a long pause), or when no beat was
//! acknowledged for a TTL, less 1% for clock drift, measured from when the last acknowledged
//! beat was sent, so never later than the cluster's own expiry. That end is read on the clock
//! wherever it matters, not only when the keep-alive task gets round to it. Then every lock on
//! it is reported lost at once ([`Backend::watch_lost`], reason 'session'), `extend` and
//! `isHeld` answer false for them, the old lease is revoked (best effort; a cluster that
//! changed leaders may have renewed it), and the next grant opens a new session; a grant
//! refused for a lease the cluster no longer knows is sent once more on the new one.
//!
//! ## Through a leader election
//!
//! While the cluster elects a leader, requests fail with "leader changed", "no leader", a
//! cancelled stream or a broken connection, and a failed request may still have been
//! applied. Each request is sent again within `requestTimeout` (see [`retryable`]): every one
//! is safe to repeat. A grant's second copy reads the key back and answers granted when it
//! holds our token; a queued attempt's copy does the same before it would put a place.
//!
//! A record whose answer is lost for good (the engine gave the attempt up, or the resends ran
//! out) is tracked here until it is gone, by [`Unsure`]. A copy of the request may still be on
//! its way (a member that lost its leader can apply it seconds later), so first the attempt's
//! refusal mark is put: every copy of an attempt requires its own mark absent, so none writes
//! after that. Then a lock key is deleted by its token, again and again, until that is
//! confirmed or its session ends; a place is kept as ours, and its timer deletes it once its
//! waiter stops renewing it (3 s), again until confirmed. A release or a queue's leave that
//! fails is carried on the same way in the background. The marks stay, a few bytes each, until
//! the session ends: as long as a copy could still be applied. So no
//! lock key outlives its TTL, and no place its lease, by more than the time to reach the new
//! leader, while the process lives; when it dies, both go with the session lease.
//!
//! Why track rather than give each record its own etcd lease (a lease per lock, one per
//! place): a lease is whole seconds (at least about two with etcd's default election timeout),
//! so a 600 ms lock orphaned that way would still stand for seconds; it costs a lease grant
//! and a revoke beside each grant, and a keep-alive per held lock; and a new leader restarts
//! every lease's countdown, so a record still outlives an election by its lease. The session
//! already lives exactly as long as this process can clean up after itself.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions,
    LeaseKeepAliveStream, LeaseKeeper, PutOptions, TlsOptions, Txn, TxnOp, WatchFilterType,
    WatchOptions,
};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::shared::io::{self, redact, Failure};
use crate::contract::value::holder_of;
use crate::contract::{Backend, KeyInfo, Op, Queue, Queued, Renewal, Waiter};
use crate::rt::error::{BackendErrorKind, Error};

mod doctor;

/// How to reach etcd and where the locks live.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// `host:port` or `http(s)://host:port`, one per member.
    pub endpoints: Vec<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// PEM of the CA that signed the members' certificates; TLS is on when set.
    pub ca: Option<String>,
    /// Prefix of every lock key. Default `locco/`.
    pub prefix: String,
    /// TTL of the session lease, in seconds. Default 10, at least 2.
    pub session_ttl_s: u32,
    /// Milliseconds to connect. Default 5000.
    pub connect_timeout_ms: u64,
    /// Milliseconds for one request. Default 5000.
    pub request_timeout_ms: u64,
}

impl EtcdOptions {
    pub fn new(endpoints: Vec<String>) -> Self {
        EtcdOptions {
            endpoints,
            username: None,
            password: None,
            ca: None,
            prefix: "locco/".into(),
            session_ttl_s: 10,
            connect_timeout_ms: 5000,
            request_timeout_ms: 5000,
        }
    }
}

/// The adapter's session: one lease, kept alive by one task.
struct Session {
    id: i64,
    /// Becomes true once, when the session is lost or closed.
    lost: watch::Sender<bool>,
    /// The earliest moment the cluster may drop the lease, as far as this process can tell:
    /// when the last acknowledged keep-alive (or the grant) was sent, plus the TTL, less the
    /// drift margin. Each acknowledged beat moves it on. Read on the clock, so a keep-alive
    /// task that runs late (a busy I/O thread) cannot make a lock look held past it.
    ends: Mutex<Instant>,
}

impl Session {
    fn new(id: i64, ends: Instant) -> Self {
        Session {
            id,
            lost: watch::channel(false).0,
            ends: Mutex::new(ends),
        }
    }

    fn ends(&self) -> Instant {
        *self.ends.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An acknowledged beat: the lease lives on until `ends` at least.
    fn renewed(&self, ends: Instant) {
        let mut slot = self.ends.lock().unwrap_or_else(|p| p.into_inner());
        *slot = (*slot).max(ends);
    }

    fn is_lost(&self) -> bool {
        *self.lost.borrow() || Instant::now() >= self.ends()
    }

    /// Marks the session lost: its locks are reported lost at once, and the next grant opens
    /// a new session.
    fn end(&self) {
        let _ = self.lost.send(true);
    }

    /// Resolves once the session is lost: told so, or past its end on the clock.
    async fn over(&self) {
        let mut lost = self.lost.subscribe();
        while !self.is_lost() {
            tokio::select! {
                _ = lost.wait_for(|v| *v) => {}
                () = tokio::time::sleep_until(self.ends()) => {}
            }
        }
    }
}

/// The share of a TTL by which a lease counts as ended early on this side (clock rates
/// differ), as the engine's local lease does.
fn drift_margin(ttl: Duration) -> Duration {
    ttl / 100
}

/// A lock this adapter granted or extended.
struct Held {
    token: String,
    deadline: Instant,
    /// Which grant or extension set `deadline`; a timer acts only for the newest.
    generation: u64,
    session: Arc<Session>,
    /// Dropped with the entry: tells `watch_lost` the lock ended for another reason.
    alive: watch::Sender<()>,
}

struct Inner {
    options: EtcdOptions,
    lane: io::Lane,
    client: tokio::sync::OnceCell<Client>,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    held: Mutex<HashMap<String, Held>>,
    generation: AtomicU64,
    secrets: Vec<String>,
    closed: AtomicBool,
    /// Tokens this adapter released itself: their deletes already woke this process's next
    /// waiter (the engine's local wake-ups), so the watch does not wake them all again.
    released: Mutex<HashSet<String>>,
    /// This adapter's places in queues, by (key, waiter).
    places: Mutex<HashMap<(String, String), Place>>,
}

/// A place of ours in a key's queue.
struct Place {
    /// The place's create revision, its rank in the queue; `None` when an attempt's answer
    /// was lost and the place may or may not be there.
    revision: Option<i64>,
    deadline: Instant,
    generation: u64,
    session: Arc<Session>,
}

/// Operations in one transaction at most: etcd refuses more than `--max-txn-ops` (128 by
/// default), so a batch of extensions is sent as transactions of this many gets.
const MAX_TXN_OPS: usize = 128;

/// The pause before a request is sent again after an election's or a connection's failure:
/// an election takes a few hundred ms.
const RESEND_PAUSE: Duration = Duration::from_millis(50);

/// The pause between two attempts to delete a record of ours that nobody will use.
const SWEEP_PAUSE: Duration = Duration::from_millis(200);

/// Released tokens remembered at most; past this the set starts again (a spare wake costs one
/// attempt).
const RELEASED_MAX: usize = 4096;

/// Locks in etcd.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

fn failure_of(secrets: &[String], e: etcd_client::Error) -> Failure {
    use etcd_client::Error as E;
    let (kind, message, code) = match &e {
        E::GRpcStatus(s) => {
            use tonic::Code;
            let kind = match s.code() {
                Code::Unauthenticated | Code::PermissionDenied => BackendErrorKind::Auth,
                Code::InvalidArgument
                    if s.message().contains("authentication failed")
                        || s.message().contains("user name is empty") =>
                {
                    BackendErrorKind::Auth
                }
                Code::DeadlineExceeded => BackendErrorKind::Timeout,
                Code::Unavailable if s.message().contains("certificate") => BackendErrorKind::Tls,
                Code::Unavailable => BackendErrorKind::Io,
                _ => BackendErrorKind::Other,
            };
            let mut message = s.message().to_string();
            if message.is_empty() {
                message = format!("{:?}", s.code());
            }
            (kind, message, Some(format!("{:?}", s.code())))
        }
        E::TransportError(t) => {
            let text = format!(
                "{t}: {}",
                std::error::Error::source(t)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            );
            let kind =
                if text.contains("certificate") || text.contains("tls") || text.contains("TLS") {
                    BackendErrorKind::Tls
                } else {
                    BackendErrorKind::Io
                };
            (kind, text, None)
        }
        E::IoError(_) => (BackendErrorKind::Io, e.to_string(), None),
        E::InvalidArgs(_) | E::InvalidUri(_) | E::EndpointError(_) => {
            (BackendErrorKind::Config, e.to_string(), None)
        }
        _ => (BackendErrorKind::Other, e.to_string(), None),
    };
    Failure {
        code,
        ..Failure::new("etcd", kind, redact(secrets, format!("etcd: {message}")))
    }
}

/// What a leader election or a dropped connection answers: the leader changed or is being
/// elected, the member has none, the stream was cancelled, the connection broke. The request
/// may or may not have been applied; every request this adapter sends is safe to send again
/// (a grant finds its own token and answers granted, a delete compares the token, reads and
/// keep-alives change nothing), so it is sent again within `requestTimeout`.
fn retryable(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    use tonic::Code;
    let tls =
        |text: &str| text.contains("certificate") || text.contains("tls") || text.contains("TLS");
    match e {
        E::GRpcStatus(s) => match s.code() {
            Code::Unavailable => !tls(s.message()),
            Code::Cancelled | Code::Aborted => true,
            Code::Unknown => {
                let m = s.message();
                !tls(m)
                    && [
                        "transport",
                        "connection",
                        "h2 protocol",
                        "broken pipe",
                        "reset",
                    ]
                    .iter()
                    .any(|w| m.contains(w))
            }
            _ => false,
        },
        E::TransportError(t) => !tls(&format!("{t:?}")),
        E::IoError(_) => true,
        _ => false,
    }
}

/// A failure to connect: the request was never delivered.
fn not_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable && s.message().contains("connect")
        }
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

fn timeout_failure(what: &str, ms: u64, last: Option<&Failure>) -> Failure {
    let last = last.map_or(String::new(), |f| {
        format!("; the last answer: {}", f.message)
    });
    Failure::new(
        "etcd",
        BackendErrorKind::Timeout,
        format!("etcd: no answer to {what} within {ms} ms (requestTimeout){last}"),
    )
}

/// The cluster no longer knows the session's lease (expired during a long pause, or lost
/// with a member's restart): nothing was written, and a new session is needed.
fn lease_gone(f: &Failure) -> bool {
    f.message.contains("requested lease not found")
}

impl EtcdBackend {
    /// Checks the options; connects on first use.
    pub fn new(options: EtcdOptions) -> Result<Self, Error> {
        if options.endpoints.is_empty() {
            return Err(Error::validation(
                "endpoints",
                "needs at least one endpoint",
            ));
        }
        for e in &options.endpoints {
            let rest = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"))
                .unwrap_or(e);
            let port = rest.rsplit_once(':').map(|(_, p)| p);
            if rest.is_empty()
                || rest.contains('/')
                || !port.is_some_and(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
            {
                return Err(Error::validation(
                    "endpoints",
                    format!("{e:?} is not host:port or http(s)://host:port"),
                ));
            }
            if e.starts_with("https://") && options.ca.is_none() {
                // rustls needs roots; without a CA there are none.
                return Err(Error::validation(
                    "tls.ca",
                    "an https:// endpoint needs tls.ca (the PEM of the members' CA)",
                ));
            }
        }
        if options.username.is_some() != options.password.is_some() {
            return Err(Error::validation(
                "auth",
                "needs both username and password",
            ));
        }
        if options.session_ttl_s < 2 {
            return Err(Error::validation(
                "sessionTtl",
                "must be at least 2000 ms (etcd's lease granularity is a second)",
            ));
        }
        if options.prefix.is_empty() {
            return Err(Error::validation("prefix", "must not be empty"));
        }
        let secrets = options
            .password
            .iter()
            .filter(|p| !p.is_empty())
            .cloned()
            .collect();
        Ok(EtcdBackend {
            inner: Arc::new(Inner {
                options,
                lane: io::Lane::default(),
                client: tokio::sync::OnceCell::new(),
                session: tokio::sync::Mutex::new(None),
                held: Mutex::new(HashMap::new()),
                generation: AtomicU64::new(0),
                secrets,
                closed: AtomicBool::new(false),
                released: Mutex::new(HashSet::new()),
                places: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Ends the session (its lease is revoked, so its keys go at once; the locks on it are
    /// lost) and refuses operations afterwards.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        let inner = self.inner.clone();
        io::runtime().spawn(async move {
            let session = inner.session.lock().await.take();
            if let Some(s) = session {
                s.end();
                if let Some(client) = inner.client.get() {
                    let mut lease = client.lease_client();
                    let _ = tokio::time::timeout(Duration::from_secs(2), lease.revoke(s.id)).await;
                }
            }
        });
    }

    /// Milliseconds until the session that keeps `token`'s lock of `key` may end (0 once it
    /// has), by this adapter's reckoning ([`Session`]'s end, counted from the last acknowledged
    /// keep-alive); `None` when the adapter knows no such lock. A holder's local lease ends no
    /// later than this.
    pub fn session_left(&self, key: &str, token: &str) -> Option<f64> {
        let session = self.inner.session_of(key, token)?;
        if session.is_lost() {
            return Some(0.0);
        }
        let left = session.ends().saturating_duration_since(Instant::now());
        Some(left.as_secs_f64() * 1000.0)
    }

    /// `work` on the I/O thread, in this backend's lane; a grant checks the [`io::OnAbandon`]
    /// before it sends (see [`io::OnAbandon::still_wanted`]).
    fn run<T: Send + 'static, F>(&self, work: impl FnOnce(Arc<Inner>, io::OnAbandon) -> F) -> Op<T>
    where
        F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let inner = self.inner.clone();
        io::run_in(&self.inner.lane, "etcd", move |abandon| {
            work(inner, abandon)
        })
    }
}

impl Inner {
    fn key(&self, key: &str) -> String {
        format!("{}{}", self.options.prefix, key)
    }

    /// Where the places of `key`'s queue live: `<prefix>\x01q/<key>\x00<waiter>`.
    fn queue_prefix(&self, key: &str) -> String {
        format!("{}\u{1}q/{}\u{0}", self.options.prefix, key)
    }

    /// An attempt's refusal mark, `<prefix>\x01x/<token>/<n>`: every copy of the attempt
    /// requires it absent. Put once the attempt's answer is lost (see [`Unsure`]), so that a
    /// copy still on its way cannot write after the clean-up looked.
    fn refusal_key(&self, token: &str) -> String {
        let n = self.generation.fetch_add(1, Ordering::Relaxed);
        format!("{}\u{1}x/{}/{}", self.options.prefix, token, n)
    }

    fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.options.request_timeout_ms)
    }

    /// One request, bounded by `requestTimeout`, sent again after a failure that an election
    /// or a dropped connection gives (see [`retryable`]).
    async fn bounded<T, F>(&self, what: &str, send: impl FnMut() -> F) -> Result<T, Failure>
    where
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        self.bounded_while(what, None, send).await
    }

    /// [`Inner::bounded`] for a grant: sent again only while the engine still wants it, since
    /// one that leaves after the engine gave it up lands after the release of its token.
    async fn bounded_while<T, F>(
        &self,
        what: &str,
        wanted: Option<&io::OnAbandon>,
        mut send: impl FnMut() -> F,
    ) -> Result<T, Failure>
    where
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut last: Option<Failure> = None;
        // One copy waits this long at most: a member that forwarded it to a leader that died
        // holds it until its own timeout, long after the new leader could have answered.
        let per_copy = (self.request_timeout() / 5).max(Duration::from_millis(500));
        let attempts = async {
            loop {
                let answer = match tokio::time::timeout(per_copy, send()).await {
                    Ok(answer) => Err(answer),
                    Err(_) => Ok(timeout_failure(what, per_copy.as_millis() as u64, None)),
                };
                match answer {
                    // No answer in time: it may still be applied, like an election's failure.
                    Ok(silent) => {
                        last = Some(silent);
                        if let Some(wanted) = wanted {
                            if wanted.is_abandoned() {
                                return Err(last.clone().expect("just set"));
                            }
                        }
                    }
                    Err(Err(e)) if retryable(&e) => {
                        let delivered = !not_sent(&e);
                        last = Some(failure_of(&self.secrets, e));
                        tokio::time::sleep(RESEND_PAUSE).await;
                        if let Some(wanted) = wanted {
                            if delivered && wanted.is_abandoned() {
                                return Err(Failure::new(
                                    "etcd",
                                    BackendErrorKind::Timeout,
                                    format!(
                                        "etcd: {what} given up while it was being sent again; \
                                         the last answer: {}",
                                        last.as_ref().map_or("", |f| f.message.as_str())
                                    ),
                                ));
                            }
                            wanted.still_wanted("etcd")?;
                        }
                    }
                    Err(r) => return r.map_err(|e| failure_of(&self.secrets, e)),
                }
            }
        };
        let answer = tokio::time::timeout(self.request_timeout(), attempts).await;
        match answer {
            Ok(r) => r,
            Err(_) => Err(timeout_failure(
                what,
                self.options.request_timeout_ms,
                last.as_ref(),
            )),
        }
    }

    async fn client(&self) -> Result<Client, Failure> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Failure::new(
                "etcd",
                BackendErrorKind::Config,
                "the etcd adapter is closed",
            ));
        }
        let ms = self.options.connect_timeout_ms;
        self.client
            .get_or_try_init(|| async {
                let o = &self.options;
                let mut options = ConnectOptions::new()
                    .with_connect_timeout(Duration::from_millis(ms))
                    .with_timeout(self.request_timeout())
                    .with_keep_alive(Duration::from_secs(1), Duration::from_millis(ms.min(3000)))
                    .with_keep_alive_while_idle(true)
                    // A member without a leader refuses at once instead of waiting.
                    .with_require_leader(true);
                if let (Some(u), Some(p)) = (&o.username, &o.password) {
                    options = options
                        .with_user(u.clone(), p.clone())
                        .with_auto_token_refresh(true);
                }
                if let Some(ca) = &o.ca {
                    options = options.with_tls(
                        TlsOptions::new().ca_certificate(Certificate::from_pem(ca.as_bytes())),
                    );
                }
                let endpoints: Vec<String> = o
                    .endpoints
                    .iter()
                    .map(|e| {
                        if e.contains("://") {
                            e.clone()
                        } else if o.ca.is_some() {
                            format!("https://{e}")
                        } else {
                            format!("http://{e}")
                        }
                    })
                    .collect();
                match tokio::time::timeout(
                    Duration::from_millis(ms),
                    Client::connect(endpoints, Some(options)),
                )
                .await
                {
                    Ok(r) => r.map_err(|e| failure_of(&self.secrets, e)),
                    Err(_) => Err(Failure::new(
                        "etcd",
                        BackendErrorKind::Timeout,
                        format!("etcd: could not connect within {ms} ms (connectTimeout)"),
                    )),
                }
            })
            .await
            .cloned()
    }

    /// The live session, opened (lease granted, keep-alive started) when there is none.
    async fn session(self: &Arc<Self>) -> Result<Arc<Session>, Failure> {
        let client = self.client().await?;
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.as_ref().filter(|s| !s.is_lost()) {
            return Ok(s.clone());
        }
        let lease = client.lease_client();
        let ttl = i64::from(self.options.session_ttl_s);
        let sent = Instant::now();
        let granted = self
            .bounded("a lease grant", || {
                let mut lease = lease.clone();
                async move { lease.grant(ttl, None).await }
            })
            .await?;
        let (keeper, stream) = self
            .bounded("a keep-alive stream", || {
                let mut lease = lease.clone();
                let id = granted.id();
                async move { lease.keep_alive(id).await }
            })
            .await?;
        let ttl = Duration::from_secs(granted.ttl().max(1) as u64);
        let session = Arc::new(Session::new(granted.id(), sent + ttl - drift_margin(ttl)));
        tokio::spawn(keep_alive(
            Arc::downgrade(self),
            client,
            session.clone(),
            ttl,
            Some((keeper, stream)),
        ));
        *slot = Some(session.clone());
        Ok(session)
    }

    /// Records (or renews) a lock's deadline and arms its timer.
    fn hold(self: &Arc<Self>, key: &str, token: &str, deadline: Instant, session: Arc<Session>) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            match held.get_mut(key) {
                Some(h) if h.token == token => {
                    h.deadline = deadline;
                    h.generation = generation;
                    h.session = session;
                }
                _ => {
                    held.insert(
                        key.to_owned(),
                        Held {
                            token: token.to_owned(),
                            deadline,
                            generation,
                            session,
                            alive: watch::channel(()).0,
                        },
                    );
                }
            }
        }
        let inner = Arc::downgrade(self);
        let (key, token) = (key.to_owned(), token.to_owned());
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            let Some(inner) = inner.upgrade() else { return };
            let current = {
                let held = inner.held.lock().unwrap_or_else(|p| p.into_inner());
                held.get(&key)
                    .is_some_and(|h| h.token == token && h.generation == generation)
            };
            if current {
                inner.expire(&key, &token).await;
            }
        });
    }

    /// Forgets a lock this adapter knew.
    fn forget(&self, key: &str, token: &str) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.get(key).is_some_and(|h| h.token == token) {
            held.remove(key);
        }
    }

    /// What this adapter knows of `key` held by `token`: `Some(false)` when its deadline
    /// passed or its session was lost, `Some(true)` when it runs, `None` when it knows nothing.
    fn local(&self, key: &str, token: &str) -> Option<bool> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let h = held.get(key).filter(|h| h.token == token)?;
        Some(h.deadline > Instant::now() && !h.session.is_lost())
    }

    /// A known lock whose deadline passed: forgotten, and deleted by value until that is
    /// confirmed or its session is lost.
    async fn expire(self: &Arc<Self>, key: &str, token: &str) {
        let session = {
            let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.get(key)
                .filter(|h| h.token == token)
                .map(|h| h.session.clone())
        };
        if let Some(session) = session {
            self.clone()
                .sweep(key.to_owned(), token.to_owned(), session)
                .await;
        }
        self.forget(key, token);
    }

    /// Deletes a lock key of ours that nobody will use (`value == token → delete`), again and
    /// again until the delete is confirmed or the session that keeps the key is lost: the key
    /// then goes with the session's lease.
    async fn sweep(self: Arc<Self>, key: String, token: String, session: Arc<Session>) {
        while !session.is_lost() && !self.closed.load(Ordering::Acquire) {
            if self.delete_ours(&key, &token).await.is_ok() {
                return;
            }
            tokio::time::sleep(SWEEP_PAUSE).await;
        }
    }

    /// Puts an attempt's refusal mark, again until that is confirmed or the session is lost:
    /// from then on no copy of the attempt can write (a copy on a lost session's lease goes
    /// with it). The mark is on the session's lease, so it lasts as long as a copy could.
    async fn refuse(&self, refusal: &str, session: &Arc<Session>) {
        while !session.is_lost() && !self.closed.load(Ordering::Acquire) {
            let put = async {
                let kv = self.client().await?.kv_client();
                self.bounded("a refusal", || {
                    let mut kv = kv.clone();
                    let options = PutOptions::new().with_lease(session.id);
                    async move { kv.put(refusal, "", Some(options)).await }
                })
                .await
            };
            if put.await.is_ok() {
                return;
            }
            tokio::time::sleep(SWEEP_PAUSE).await;
        }
    }

    /// [`Inner::sweep`] in the background.
    fn sweep_later(self: &Arc<Self>, key: &str, token: &str, session: Arc<Session>) {
        let (key, token) = (key.to_owned(), token.to_owned());
        io::runtime().spawn(self.clone().sweep(key, token, session));
    }

    /// The session a known lock is on.
    fn session_of(&self, key: &str, token: &str) -> Option<Arc<Session>> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(key)
            .filter(|h| h.token == token)
            .map(|h| h.session.clone())
    }

    /// `value == token → delete`.
    async fn delete_ours(&self, key: &str, token: &str) -> Result<bool, Failure> {
        let kv = self.client().await?.kv_client();
        let k = self.key(key);
        let txn = Txn::new()
            .when([Compare::value(k.clone(), CompareOp::Equal, token)])
            .and_then([TxnOp::delete(k, None)]);
        Ok(self
            .bounded("a release", || {
                let (mut kv, txn) = (kv.clone(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await?
            .succeeded())
    }

    /// The grant: the revision that created the key, or `None` when it is held. Not sent
    /// when the engine gave it up while the session was being opened. Sent again after an
    /// election's failure: a copy that was applied left our token in the key, which the next
    /// copy reads back as granted. A grant whose answer is lost for good is swept (see
    /// [`Unsure`]).
    async fn grant(
        self: &Arc<Self>,
        key: &str,
        token: &str,
        ttl: u32,
        abandon: &io::OnAbandon,
    ) -> Result<Option<u64>, Failure> {
        let start = Instant::now();
        // A lock of ours whose deadline passed but whose delete has not landed yet.
        let expired = {
            let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.get(key)
                .filter(|h| h.deadline <= start || h.session.is_lost())
                .map(|h| (h.token.clone(), h.session.clone()))
        };
        if let Some((old, session)) = expired {
            self.forget(key, &old);
            if self.delete_ours(key, &old).await.is_err() {
                self.sweep_later(key, &old, session);
            }
        }
        let mut replaced = false;
        loop {
            let session = self.session().await?;
            let kv = self.client().await?.kv_client();
            abandon.still_wanted("etcd")?;
            let k = self.key(key);
            let refusal = self.refusal_key(token);
            // Free, and nobody waits in the key's queue (a try never takes a promised key).
            let txn = Txn::new()
                .when([
                    Compare::create_revision(k.clone(), CompareOp::Equal, 0),
                    Compare::create_revision(self.queue_prefix(key), CompareOp::Equal, 0)
                        .with_prefix(),
                    Compare::version(refusal.clone(), CompareOp::Equal, 0),
                ])
                .and_then([TxnOp::put(
                    k.clone(),
                    token,
                    Some(PutOptions::new().with_lease(session.id)),
                )])
                .or_else([TxnOp::get(k.clone(), None)]);
            let unsure = Unsure::new(self, key, token, refusal, None, &session);
            let mut copies = 0u32;
            let sent = self
                .bounded_while("a grant", Some(abandon), || {
                    copies += 1;
                    let (mut kv, txn) = (kv.clone(), txn.clone());
                    async move { kv.txn(txn).await }
                })
                .await;
            let fence = match sent {
                Ok(resp) if resp.succeeded() => {
                    Some(resp.header().map(|h| h.revision()).unwrap_or(0))
                }
                // Held, unless an earlier copy of this grant was applied. With one copy sent,
                // our token under the key is an earlier grant's: acquire is not re-entrant.
                Ok(resp) if copies > 1 => ours_in(resp.op_responses(), k.as_bytes(), token),
                Ok(_) => None,
                // Refused as a whole: nothing was written. The session is replaced once.
                Err(f) if !replaced && lease_gone(&f) => {
                    unsure.settled();
                    session.end();
                    replaced = true;
                    continue;
                }
                Err(f) => return Err(f),
            };
            unsure.settled();
            let Some(fence) = fence else { return Ok(None) };
            self.hold(
                key,
                token,
                start + Duration::from_millis(u64::from(ttl)),
                session,
            );
            return Ok(Some(fence.max(1) as u64));
        }
    }

    async fn extend(self: &Arc<Self>, key: &str, token: &str, ttl: u32) -> Result<bool, Failure> {
        let start = Instant::now();
        if self.local(key, token) == Some(false) {
            return Ok(false);
        }
        let session = self.session().await?;
        let kv = self.client().await?.kv_client();
        let k = self.key(key);
        // Ours, and on the live session (a key on a lost session is not extended).
        let txn = Txn::new().when([
            Compare::value(k.clone(), CompareOp::Equal, token),
            Compare::lease(k, CompareOp::Equal, session.id),
        ]);
        let ok = self
            .bounded("an extension", || {
                let (mut kv, txn) = (kv.clone(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await?
            .succeeded();
        if ok && self.local(key, token) != Some(false) {
            self.hold(
                key,
                token,
                start + Duration::from_millis(u64::from(ttl)),
                session,
            );
            return Ok(true);
        }
        Ok(false)
    }

    /// [`Inner::extend`] for many locks: one read-only transaction without compares whose
    /// operations get every key (in pieces of [`MAX_TXN_OPS`], sent together), then the value
    /// and lease compared here, per key, as the single extension's compares would, with the
    /// same bookkeeping before and after. The reads are linearizable, as the single one's.
    async fn extend_many(
        self: &Arc<Self>,
        renewals: &[(String, String, u32)],
    ) -> Result<Vec<bool>, Failure> {
        let start = Instant::now();
        let mut answers = vec![false; renewals.len()];
        // Locks whose deadline passed or whose session was lost are not asked about.
        let asked: Vec<usize> = (0..renewals.len())
            .filter(|&i| self.local(&renewals[i].0, &renewals[i].1) != Some(false))
            .collect();
        if asked.is_empty() {
            return Ok(answers);
        }
        let session = self.session().await?;
        let kv = self.client().await?.kv_client();
        let pieces: Vec<&[usize]> = asked.chunks(MAX_TXN_OPS).collect();
        let sent = pieces.iter().map(|piece| {
            let txn = Txn::new().and_then(
                piece
                    .iter()
                    .map(|&i| TxnOp::get(self.key(&renewals[i].0), None))
                    .collect::<Vec<_>>(),
            );
            let kv = kv.clone();
            self.bounded("an extension", move || {
                let (mut kv, txn) = (kv.clone(), txn.clone());
                async move { kv.txn(txn).await }
            })
        });
        let responses = futures_util::future::try_join_all(sent).await?;
        for (piece, resp) in pieces.iter().zip(responses) {
            let gets = resp.op_responses();
            for (n, &i) in piece.iter().enumerate() {
                let (key, token, ttl) = &renewals[i];
                // Ours, and on the live session (a key on a lost session is not extended).
                let ours = match gets.get(n) {
                    Some(etcd_client::TxnOpResponse::Get(g)) => g.kvs().first().is_some_and(|kv| {
                        kv.value() == token.as_bytes() && kv.lease() == session.id
                    }),
                    _ => false,
                };
                if ours && self.local(key, token) != Some(false) {
                    self.hold(
                        key,
                        token,
                        start + Duration::from_millis(u64::from(*ttl)),
                        session.clone(),
                    );
                    answers[i] = true;
                }
            }
        }
        Ok(answers)
    }

    async fn is_held(&self, key: &str, token: &str) -> Result<bool, Failure> {
        if self.local(key, token) == Some(false) {
            return Ok(false);
        }
        let kv = self.client().await?.kv_client();
        // A linearizable read (the default): it goes through the leader's read index.
        let got = self
            .bounded("a read", || {
                let (mut kv, k) = (kv.clone(), self.key(key));
                async move { kv.get(k, None::<GetOptions>).await }
            })
            .await?;
        let ours = got
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == token.as_bytes());
        Ok(ours && self.local(key, token) != Some(false))
    }
}

impl Inner {
    /// What an operator sees of one stored key (`full`, the prefix included). The lease's
    /// time left is known only for a lock this adapter holds: each holder keeps its locks'
    /// deadlines itself (see the module docs), the key carries only the session lease.
    fn info_of(&self, key: String, kv: &etcd_client::KeyValue) -> KeyInfo {
        let value = String::from_utf8_lossy(kv.value());
        let ttl_left = {
            let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.get(&key)
                .filter(|h| h.token.as_bytes() == kv.value() && !h.session.is_lost())
                .map(|h| {
                    h.deadline
                        .min(h.session.ends())
                        .saturating_duration_since(Instant::now())
                        .as_secs_f64()
                        * 1000.0
                })
        };
        KeyInfo {
            key,
            held: ttl_left != Some(0.0),
            ttl_left,
            // The fence of a grant is the key's create revision.
            fence: Some(kv.create_revision() as u64),
            holder: holder_of(&value),
        }
    }

    /// Whether a stored key is a lock this library wrote: a key of the lock namespace (under
    /// the prefix, outside the queues' `\x01` range), attached to a lease (every lock is on
    /// its adapter's session; an application's plain key has none), holding a token (UTF-8,
    /// not empty). `inspect`, `list` and `forceRelease` all judge by it, so the preview and
    /// the action agree, and anything else is left alone.
    fn is_lock(&self, kv: &etcd_client::KeyValue) -> bool {
        let name = kv.key().strip_prefix(self.options.prefix.as_bytes());
        name.is_some_and(|n| !n.is_empty() && n[0] != 1)
            && kv.lease() != 0
            && !kv.value().is_empty()
            && std::str::from_utf8(kv.value()).is_ok()
    }

    /// The stored key for `key`, when it is a lock ([`Inner::is_lock`]).
    async fn read_lock(&self, key: &str) -> Result<Option<etcd_client::KeyValue>, Failure> {
        let kv = self.client().await?.kv_client();
        let got = self
            .bounded("a read", || {
                let (mut kv, k) = (kv.clone(), self.key(key));
                async move { kv.get(k, None::<GetOptions>).await }
            })
            .await?;
        Ok(got.kvs().first().filter(|kv| self.is_lock(kv)).cloned())
    }

    async fn inspect(&self, key: &str) -> Result<KeyInfo, Failure> {
        Ok(match self.read_lock(key).await? {
            Some(found) => self.info_of(key.to_owned(), &found),
            None => KeyInfo {
                key: key.to_owned(),
                ..KeyInfo::default()
            },
        })
    }

    /// A range read from `<prefix><wanted>` to the end of that prefix; the queues' keys
    /// (`<prefix>\x01q/…`) and whatever is not a lock are left out.
    async fn list(&self, wanted: &str, limit: u32) -> Result<Vec<KeyInfo>, Failure> {
        let kv = self.client().await?.kv_client();
        let start = self.key(wanted);
        let end = range_end(start.as_bytes());
        let from = match wanted.is_empty() {
            true => format!("{}\u{2}", self.options.prefix),
            false => start,
        };
        let mut found = Vec::new();
        let mut from = from.into_bytes();
        // Pages of `limit` keys, until `limit` locks are found: keys that are not locks
        // would otherwise take places in the answer.
        loop {
            let got = self
                .bounded("a read", || {
                    let (mut kv, from, end) = (kv.clone(), from.clone(), end.clone());
                    let options = GetOptions::new()
                        .with_range(end)
                        .with_limit(i64::from(limit));
                    async move { kv.get(from, Some(options)).await }
                })
                .await?;
            let prefix = self.options.prefix.as_bytes();
            for kv in got.kvs().iter().filter(|kv| self.is_lock(kv)) {
                let Some(key) = kv.key().strip_prefix(prefix) else {
                    continue;
                };
                let Ok(key) = String::from_utf8(key.to_vec()) else {
                    continue;
                };
                let info = self.info_of(key, kv);
                if info.held && found.len() < limit as usize {
                    found.push(info);
                }
            }
            match got.kvs().last() {
                Some(last) if got.more() && found.len() < limit as usize => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(found),
            }
        }
    }

    /// Deletes the lock under `key`, whatever its token; `true` when it did. Only a lock
    /// ([`Inner::is_lock`]) is deleted, and only the very one that was judged: the delete
    /// compares the key's revision with the read's. A holder here forgets it (its next
    /// extend reads the key, so it would fail anyway); waiters watching the key see the
    /// delete as a release.
    async fn force_release(&self, key: &str) -> Result<bool, Failure> {
        let Some(found) = self.read_lock(key).await? else {
            return Ok(false);
        };
        let kv = self.client().await?.kv_client();
        let k = self.key(key);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                k.clone(),
                CompareOp::Equal,
                found.mod_revision(),
            )])
            .and_then([TxnOp::delete(k, None)]);
        Ok(self
            .bounded("a release", || {
                let (mut kv, txn) = (kv.clone(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await?
            .succeeded())
    }
}

/// The end of the range of keys that start with `prefix`: its last byte below 0xff plus one.
fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// What a grant or a queued attempt may have written while its answer is lost: the lock key
/// under its token and, for a queued attempt, our place. Until [`Unsure::settled`], dropping
/// it (any error, the engine giving the request up, the request dropped) hands both to this
/// adapter's own clean-up, which outlasts the engine's one give-back: the key is deleted by
/// its token until that is confirmed or the session ends ([`Inner::sweep`]), and the place is
/// kept as ours, so that its timer removes it once its waiter stops renewing it
/// ([`Inner::keep_place`]). A guard rather than a call on each error path, so that no exit
/// path can leave a record nobody tracks.
struct Unsure {
    inner: Arc<Inner>,
    key: String,
    token: String,
    /// The attempt's refusal mark ([`Inner::refusal_key`]).
    refusal: String,
    /// The waiter, its place's lease in ms, and its rank when known.
    place: Option<(String, u32, Option<i64>)>,
    session: Arc<Session>,
    settled: bool,
}

impl Unsure {
    fn new(
        inner: &Arc<Inner>,
        key: &str,
        token: &str,
        refusal: String,
        place: Option<(String, u32, Option<i64>)>,
        session: &Arc<Session>,
    ) -> Self {
        Unsure {
            inner: inner.clone(),
            key: key.to_owned(),
            token: token.to_owned(),
            refusal,
            place,
            session: session.clone(),
            settled: false,
        }
    }

    /// The answer came: whatever was written is known.
    fn settled(mut self) {
        self.settled = true;
    }
}

impl Drop for Unsure {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Some((waiter, lease, rank)) = self.place.take() {
            self.inner
                .keep_place(&self.key, &waiter, rank, lease, self.session.clone());
        }
        let (inner, session) = (self.inner.clone(), self.session.clone());
        let (key, token) = (
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        );
        let refusal = std::mem::take(&mut self.refusal);
        io::runtime().spawn(async move {
            inner.refuse(&refusal, &session).await;
            inner.sweep(key, token, session).await;
        });
    }
}

/// The fence of our own grant found in a transaction's reads (nested ones included): the
/// create revision of `key` when it carries `token`.
fn ours_in(responses: Vec<etcd_client::TxnOpResponse>, key: &[u8], token: &str) -> Option<i64> {
    responses.into_iter().find_map(|r| match r {
        etcd_client::TxnOpResponse::Get(g) => g
            .kvs()
            .iter()
            .find(|kv| kv.key() == key && kv.value() == token.as_bytes())
            .map(|kv| kv.create_revision()),
        etcd_client::TxnOpResponse::Txn(t) => ours_in(t.op_responses(), key, token),
        _ => None,
    })
}

/// The create revision of `place` among a transaction's reads (nested ones included).
fn rank_in(responses: Vec<etcd_client::TxnOpResponse>, place: &[u8]) -> Option<i64> {
    responses.into_iter().find_map(|r| match r {
        etcd_client::TxnOpResponse::Get(g) => g
            .kvs()
            .iter()
            .find(|kv| kv.key() == place)
            .map(|kv| kv.create_revision()),
        etcd_client::TxnOpResponse::Txn(t) => rank_in(t.op_responses(), place),
        _ => None,
    })
}

/// A waiter's watch on its key; dropping it cancels the watch.
struct KeyWatch {
    rx: watch::Receiver<u64>,
    task: tokio::task::AbortHandle,
}

impl Waiter for KeyWatch {
    fn released(&mut self) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(async move {
            // A watch that ended (no connection) wakes nobody: the poll is the backstop.
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Keeps the session's lease alive until the session is lost or the adapter closed.
async fn keep_alive(
    inner: Weak<Inner>,
    client: Client,
    session: Arc<Session>,
    ttl: Duration,
    mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
) {
    let interval = (ttl / 3).max(Duration::from_millis(300));
    let mut lease = client.lease_client();
    loop {
        let alive = inner
            .upgrade()
            .is_some_and(|i| !i.closed.load(Ordering::Acquire));
        if !alive || session.is_lost() {
            break;
        }
        let expiry = session.ends();
        let sent = Instant::now();
        let beat = async {
            if stream.is_none() {
                stream = Some(lease.keep_alive(session.id).await?);
            }
            let (keeper, messages) = stream.as_mut().expect("a keep-alive stream");
            keeper.keep_alive().await?;
            messages.message().await
        };
        match tokio::time::timeout_at(expiry.min(sent + interval), beat).await {
            Ok(Ok(Some(r))) if r.ttl() > 0 => {
                // Counted from when the beat left: never later than the cluster's own count.
                session.renewed(sent + ttl - drift_margin(ttl));
                tokio::time::sleep_until(sent + interval).await;
            }
            // The cluster no longer knows the lease.
            Ok(Ok(Some(_))) => break,
            Ok(Ok(None)) | Ok(Err(_)) => {
                stream = None;
                let pause = Instant::now() + Duration::from_millis(100);
                tokio::time::sleep_until(pause.min(expiry)).await;
            }
            // No answer in time: the stream may hang on a dead member; open another.
            Err(_) => stream = None,
        }
    }
    session.end();
    if let Some(inner) = inner.upgrade() {
        let mut slot = inner.session.lock().await;
        if slot.as_ref().is_some_and(|s| s.id == session.id) {
            *slot = None;
        }
    }
    // The keys on it must go now: a cluster that elected a new leader restarted the lease's
    // countdown, and a record this adapter still meant to delete stopped being tracked when
    // the session was lost. Sent again through an election, until the cluster says the lease
    // is gone or it would have expired anyway.
    let until = Instant::now() + ttl + ttl;
    while Instant::now() < until {
        match tokio::time::timeout(ttl / 3, lease.revoke(session.id)).await {
            Ok(Ok(_)) => break,
            Ok(Err(e)) if !retryable(&e) => break,
            _ => tokio::time::sleep(RESEND_PAUSE).await,
        }
    }
}

impl Backend for EtcdBackend {
    fn name(&self) -> &str {
        "etcd"
    }

    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(move |inner, abandon| async move {
            Ok(inner.grant(&key, &token, ttl, &abandon).await?.is_some())
        })
    }

    fn release(&self, key: &str, token: &str) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(move |inner, _| async move {
            let was_live = inner.local(&key, &token);
            {
                let mut released = inner.released.lock().unwrap_or_else(|p| p.into_inner());
                if released.len() >= RELEASED_MAX {
                    released.clear();
                }
                released.insert(token.clone());
            }
            let deleted = match inner.delete_ours(&key, &token).await {
                Ok(deleted) => deleted,
                Err(f) => {
                    // Not confirmed: deleted in the background until it is, or until the
                    // session ends.
                    if let Some(session) = inner.session_of(&key, &token) {
                        inner.sweep_later(&key, &token, session);
                    }
                    inner.forget(&key, &token);
                    return Err(f);
                }
            };
            inner.forget(&key, &token);
            // A key whose deadline passed is no longer ours to release, even if it was there.
            Ok(deleted && was_live != Some(false))
        })
    }

    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(move |inner, _| async move { inner.extend(&key, &token, ttl).await })
    }

    /// The gets of every key in one transaction (see [`Inner::extend_many`]); each lock's
    /// value and lease compared here.
    fn extend_many(&self, renewals: &[Renewal<'_>]) -> Op<Vec<crate::rt::error::Result<bool>>> {
        if renewals.is_empty() {
            return Op::ready(Ok(Vec::new()));
        }
        let renewals: Vec<(String, String, u32)> = renewals
            .iter()
            .map(|r| (r.key.to_owned(), r.token.to_owned(), r.ttl))
            .collect();
        // A heartbeat does not wait for room in the lane.
        let inner = self.inner.clone();
        let op = io::run("etcd", move |_| async move {
            inner.extend_many(&renewals).await
        });
        match op {
            Op::Ready(answer) => {
                Op::Ready(answer.map(|all| all.map(|v| v.into_iter().map(Ok).collect())))
            }
            Op::Pending(fut, stop) => Op::Pending(
                Box::pin(async move { fut.await.map(|v| v.into_iter().map(Ok).collect()) }),
                stop,
            ),
        }
    }

    fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(move |inner, _| async move { inner.is_held(&key, &token).await })
    }

    fn supports_fencing(&self) -> bool {
        true
    }

    /// The fence is the key's create revision, taken in the same transaction as the grant.
    fn acquire_fenced(&self, key: &str, token: &str, ttl: u32) -> Op<Option<u64>> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(
            move |inner, abandon| async move { inner.grant(&key, &token, ttl, &abandon).await },
        )
    }

    /// A watch on the key: wakes the waiter when another process's lock on it ends (released,
    /// expired by its holder's timer, or gone with its session). Waits for locks this adapter
    /// releases are woken by the engine's local wake-ups instead, next waiter first.
    fn waiter(&self, key: &str) -> Option<Box<dyn Waiter>> {
        Some(self.watch_deletes(key, false, true))
    }

    fn queue(&self) -> Option<&dyn Queue> {
        Some(self)
    }

    fn inspect(&self, key: &str) -> Op<KeyInfo> {
        let key = key.to_owned();
        self.run(move |inner, _| async move { inner.inspect(&key).await })
    }

    fn list(&self, prefix: &str, limit: u32) -> Op<Vec<KeyInfo>> {
        let prefix = prefix.to_owned();
        self.run(move |inner, _| async move { inner.list(&prefix, limit).await })
    }

    fn force_release(&self, key: &str) -> Op<bool> {
        let key = key.to_owned();
        self.run(move |inner, _| async move { inner.force_release(&key).await })
    }

    fn session_left(&self, key: &str, token: &str) -> Option<f64> {
        EtcdBackend::session_left(self, key, token)
    }

    fn watch_lost(&self, key: &str, token: &str) -> Option<Op<()>> {
        let (session, mut alive) = {
            let held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
            let h = held.get(key).filter(|h| h.token == token)?;
            (h.session.clone(), h.alive.subscribe())
        };
        Some(io::run("etcd", move |_| async move {
            // At the session's end on the clock at the latest, whether or not the keep-alive
            // task has noticed yet.
            let lost_now = tokio::select! {
                biased;
                () = session.over() => true,
                // The lock ended (released, expired); a loss at the same moment still wins.
                _ = alive.changed() => false,
            };
            if lost_now || session.is_lost() {
                Ok(())
            } else {
                Err(Failure::new(
                    "etcd",
                    BackendErrorKind::Other,
                    "the lock ended",
                ))
            }
        }))
    }
}

// ## The fair queue
//
// A key's queue is a range of place keys, `<prefix>\x01q/<key>\x00<waiter>`, each attached to
// the waiter's session lease; a place's create revision is its rank, so the queue is ordered by
// arrival across the whole cluster. The head takes a free key in one transaction: "the key was
// never created, our place still has its revision, and every place in the range has a revision
// at least ours" → put the key, delete our place. A try (and a waiter's first attempt) needs an
// empty range. A place lives `lease` ms from its last renewal (an I/O-thread timer deletes it
// after that, as for locks), or until its session ends when its process died.
impl Inner {
    fn place_key(&self, key: &str, waiter: &str) -> String {
        format!("{}{}", self.queue_prefix(key), waiter)
    }

    /// Records (or renews) our place and arms the timer that deletes it after `lease` ms.
    fn keep_place(
        self: &Arc<Self>,
        key: &str,
        waiter: &str,
        revision: Option<i64>,
        lease: u32,
        session: Arc<Session>,
    ) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_millis(u64::from(lease));
        let id = (key.to_owned(), waiter.to_owned());
        self.places
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id.clone(),
                Place {
                    revision,
                    deadline,
                    generation,
                    session,
                },
            );
        let inner = Arc::downgrade(self);
        io::runtime().spawn(async move {
            tokio::time::sleep_until(deadline).await;
            let Some(inner) = inner.upgrade() else { return };
            let current = inner
                .places
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&id)
                .is_some_and(|p| p.generation == generation);
            if current {
                let _ = inner.leave_queue(&id.0, &id.1).await;
            }
        });
    }

    /// Deletes our place. One that cannot be deleted now is deleted in the background until
    /// that is confirmed, its session ends, or its waiter takes a place again.
    async fn leave_queue(self: &Arc<Self>, key: &str, waiter: &str) -> Result<(), Failure> {
        let id = (key.to_owned(), waiter.to_owned());
        let known = self
            .places
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
            .map(|p| p.session);
        let first = self.delete_place(key, waiter).await;
        if first.is_err() {
            let session = match known {
                Some(s) => Some(s),
                None => self.session.try_lock().ok().and_then(|s| s.clone()),
            };
            if let Some(session) = session {
                let inner = self.clone();
                io::runtime().spawn(async move {
                    loop {
                        tokio::time::sleep(SWEEP_PAUSE).await;
                        let back = inner
                            .places
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .contains_key(&id);
                        if back || session.is_lost() || inner.closed.load(Ordering::Acquire) {
                            return;
                        }
                        if inner.delete_place(&id.0, &id.1).await.is_ok() {
                            return;
                        }
                    }
                });
            }
        }
        first
    }

    async fn delete_place(&self, key: &str, waiter: &str) -> Result<(), Failure> {
        let kv = self.client().await?.kv_client();
        let place = self.place_key(key, waiter);
        self.bounded("leaving a queue", || {
            let (mut kv, place) = (kv.clone(), place.clone());
            async move { kv.delete(place, None).await }
        })
        .await?;
        Ok(())
    }

    /// One queued attempt (see the section's comment). Sent again after an election's failure,
    /// as a plain grant is; a lost answer leaves an [`Unsure`] record behind.
    async fn acquire_queued(
        self: &Arc<Self>,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: &str,
        lease: u32,
        abandon: &io::OnAbandon,
    ) -> Result<Queued, Failure> {
        let start = Instant::now();
        let mut replaced = false;
        loop {
            let session = self.session().await?;
            let kv = self.client().await?.kv_client();
            abandon.still_wanted("etcd")?;
            let (k, range, place) = (
                self.key(key),
                self.queue_prefix(key),
                self.place_key(key, waiter),
            );
            let known = {
                let places = self.places.lock().unwrap_or_else(|p| p.into_inner());
                places
                    .get(&(key.to_owned(), waiter.to_owned()))
                    .filter(|p| {
                        p.deadline > start && !p.session.is_lost() && p.session.id == session.id
                    })
                    .and_then(|p| p.revision)
            };
            let put_lock = TxnOp::put(
                k.clone(),
                token,
                Some(PutOptions::new().with_lease(session.id)),
            );
            let refusal = self.refusal_key(token);
            let txn = match known {
                // In the queue: the head takes a free key.
                Some(rank) => Txn::new()
                    .when([
                        Compare::create_revision(k.clone(), CompareOp::Equal, 0),
                        Compare::create_revision(place.clone(), CompareOp::Equal, rank),
                        Compare::create_revision(range.clone(), CompareOp::Greater, rank - 1)
                            .with_prefix(),
                    ])
                    .and_then([put_lock, TxnOp::delete(place.clone(), None)])
                    .or_else([TxnOp::get(place.clone(), None), TxnOp::get(k.clone(), None)]),
                // Not yet: a free key with nobody waiting is ours, else we join at the back,
                // unless an earlier copy of this attempt was applied and took the key (a
                // place put then would hold the queue up behind our own lock).
                None => Txn::new()
                    .when([
                        Compare::create_revision(k.clone(), CompareOp::Equal, 0),
                        Compare::create_revision(range.clone(), CompareOp::Equal, 0).with_prefix(),
                    ])
                    .and_then([put_lock, TxnOp::delete(place.clone(), None)])
                    .or_else([TxnOp::txn(
                        Txn::new()
                            .when([Compare::value(k.clone(), CompareOp::Equal, token)])
                            .and_then([TxnOp::get(k.clone(), None)])
                            .or_else([
                                TxnOp::put(
                                    place.clone(),
                                    waiter,
                                    Some(PutOptions::new().with_lease(session.id)),
                                ),
                                TxnOp::get(place.clone(), None),
                            ]),
                    )]),
            };
            // Every copy of this attempt needs its refusal mark absent (see [`Unsure`]).
            let txn = Txn::new()
                .when([Compare::version(refusal.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::txn(txn)]);
            let unsure = Unsure::new(
                self,
                key,
                token,
                refusal,
                Some((waiter.to_owned(), lease, known)),
                &session,
            );
            let mut copies = 0u32;
            let sent = self
                .bounded_while("a queued grant", Some(abandon), || {
                    copies += 1;
                    let (mut kv, txn) = (kv.clone(), txn.clone());
                    async move { kv.txn(txn).await }
                })
                .await;
            let resp = match sent {
                Ok(resp) => resp,
                // Refused as a whole: nothing was written. The session is replaced once.
                Err(f) if !replaced && lease_gone(&f) => {
                    unsure.settled();
                    session.end();
                    replaced = true;
                    continue;
                }
                Err(f) => return Err(f),
            };
            unsure.settled();
            let id = (key.to_owned(), waiter.to_owned());
            let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            // The attempt's own answer, inside the refusal check (which a live attempt passes).
            let granted = resp.succeeded()
                && matches!(
                    resp.op_responses().first(),
                    Some(etcd_client::TxnOpResponse::Txn(t)) if t.succeeded()
                );
            let fence = match granted {
                true => Some(revision),
                // As for a plain grant: only an earlier copy of this one counts as ours.
                false if copies > 1 => ours_in(resp.op_responses(), k.as_bytes(), token),
                false => None,
            };
            if let Some(fence) = fence {
                self.places
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                self.hold(
                    key,
                    token,
                    start + Duration::from_millis(u64::from(ttl)),
                    session,
                );
                return Ok(Queued::Granted(Some(fence.max(1) as u64)));
            }
            match rank_in(resp.op_responses(), place.as_bytes()) {
                Some(rank) => self.keep_place(key, waiter, Some(rank), lease, session),
                // Our place is gone (its lease ran out): the next attempt joins again.
                None => {
                    self.places
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id);
                }
            }
            return Ok(Queued::Waiting { retry_in: None });
        }
    }
}

impl EtcdBackend {
    /// A watch on the key and its queue: any delete in either may make us the head of a free
    /// key.
    fn watch_deletes(&self, key: &str, with_queue: bool, skip_own: bool) -> Box<dyn Waiter> {
        let (tx, rx) = watch::channel(0u64);
        let inner = Arc::downgrade(&self.inner);
        let k = self.inner.key(key);
        let range = self.inner.queue_prefix(key);
        let task = io::runtime().spawn(async move {
            let mut ends = 0u64;
            let mut first = true;
            // A watch breaks with its member (killed, restarted, cut off): it is opened again
            // on another one, and its waiter woken, since a delete may have gone unseen.
            loop {
                if !first {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let client = match inner.upgrade() {
                    Some(i) if !i.closed.load(Ordering::Acquire) => match i.client().await {
                        Ok(c) => c,
                        Err(_) => return,
                    },
                    _ => return,
                };
                let options = WatchOptions::new()
                    .with_filters([WatchFilterType::NoPut])
                    .with_prev_key();
                let Ok(mut stream) = client
                    .watch_client()
                    .watch(k.clone(), Some(options.clone()))
                    .await
                else {
                    first = false;
                    continue;
                };
                if with_queue
                    && stream
                        .watch(range.clone(), Some(options.with_prefix()))
                        .await
                        .is_err()
                {
                    first = false;
                    continue;
                }
                if !first {
                    ends += 1;
                    let _ = tx.send(ends);
                }
                first = false;
                while let Ok(Some(resp)) = stream.message().await {
                    let Some(inner) = inner.upgrade() else { return };
                    for ev in resp.events() {
                        if ev.event_type() != EventType::Delete {
                            continue;
                        }
                        let own = skip_own
                            && ev.prev_kv().is_some_and(|kv| {
                                let released =
                                    inner.released.lock().unwrap_or_else(|p| p.into_inner());
                                std::str::from_utf8(kv.value()).is_ok_and(|t| released.contains(t))
                            });
                        if !own {
                            ends += 1;
                            let _ = tx.send(ends);
                        }
                    }
                }
            }
        });
        Box::new(KeyWatch {
            rx,
            task: task.abort_handle(),
        })
    }
}

impl Queue for EtcdBackend {
    fn acquire_queued(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: &str,
        lease: u32,
        fenced: bool,
    ) -> Op<Queued> {
        let (key, token, waiter) = (key.to_owned(), token.to_owned(), waiter.to_owned());
        self.run(move |inner, abandon| async move {
            let got = inner
                .acquire_queued(&key, &token, ttl, &waiter, lease, &abandon)
                .await?;
            Ok(match got {
                Queued::Granted(fence) if !fenced => {
                    let _ = fence;
                    Queued::Granted(None)
                }
                other => other,
            })
        })
    }

    fn leave(&self, key: &str, waiter: &str) -> Op<()> {
        let (key, waiter) = (key.to_owned(), waiter.to_owned());
        self.run(move |inner, _| async move { inner.leave_queue(&key, &waiter).await })
    }

    fn wakeups(&self, key: &str, _waiter: &str) -> Box<dyn Waiter> {
        self.watch_deletes(key, true, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(options: EtcdOptions) -> Option<String> {
        match EtcdBackend::new(options) {
            Err(Error::Validation { field, .. }) => Some(field),
            Err(e) => panic!("not a validation error: {e}"),
            Ok(_) => None,
        }
    }

    #[test]
    fn refuses_bad_options_naming_the_field() {
        let ok = || EtcdOptions::new(vec!["127.0.0.1:2379".into()]);
        assert_eq!(field_of(ok()), None);
        assert_eq!(
            field_of(EtcdOptions::new(vec![])).as_deref(),
            Some("endpoints")
        );
        for bad in ["127.0.0.1", "http://h:0", "h:port", "http://h:2379/x", ""] {
            assert_eq!(
                field_of(EtcdOptions::new(vec![bad.into()])).as_deref(),
                Some("endpoints"),
                "{bad}"
            );
        }
        assert_eq!(
            field_of(EtcdOptions::new(vec!["https://h:2379".into()])).as_deref(),
            Some("tls.ca")
        );
        assert_eq!(
            field_of(EtcdOptions {
                session_ttl_s: 1,
                ..ok()
            })
            .as_deref(),
            Some("sessionTtl")
        );
        assert_eq!(
            field_of(EtcdOptions {
                username: Some("u".into()),
                ..ok()
            })
            .as_deref(),
            Some("auth")
        );
        assert_eq!(
            field_of(EtcdOptions {
                prefix: String::new(),
                ..ok()
            })
            .as_deref(),
            Some("prefix")
        );
    }

    #[test]
    fn a_failed_connection_is_a_request_that_never_left() {
        let refused =
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable("tcp connect error"));
        assert!(not_sent(&refused));
        let no_leader =
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable("etcdserver: no leader"));
        assert!(
            !not_sent(&no_leader),
            "a member without a leader saw the request"
        );
        // An election's answers are sent again; a refusal of the request itself is not.
        for (status, again) in [
            (
                tonic::Status::unavailable("etcdserver: leader changed"),
                true,
            ),
            (tonic::Status::unavailable("etcdserver: no leader"), true),
            (tonic::Status::cancelled("operation was canceled"), true),
            (tonic::Status::unknown("transport error"), true),
            (
                tonic::Status::unavailable("invalid peer certificate"),
                false,
            ),
            (
                tonic::Status::not_found("etcdserver: requested lease not found"),
                false,
            ),
            (
                tonic::Status::invalid_argument("etcdserver: key is not provided"),
                false,
            ),
            (
                tonic::Status::permission_denied("etcdserver: permission denied"),
                false,
            ),
        ] {
            let text = status.message().to_owned();
            assert_eq!(
                retryable(&etcd_client::Error::GRpcStatus(status)),
                again,
                "{text}"
            );
        }
        let f = failure_of(
            &["hunter2-pw".into()],
            etcd_client::Error::GRpcStatus(tonic::Status::invalid_argument(
                "etcdserver: authentication failed, invalid user ID or password hunter2-pw",
            )),
        );
        assert_eq!(f.kind, BackendErrorKind::Auth);
        assert!(!f.message.contains("hunter2-pw"));
    }
}
