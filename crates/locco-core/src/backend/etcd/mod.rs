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
//!
//! [`retryable`]: failure::retryable

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::shared::io::{self, Failure};
use crate::contract::{Backend, KeyInfo, Op, Queue, Renewal, Waiter};
use crate::rt::error::{BackendErrorKind, Error};

mod client;
mod doctor;
mod failure;
mod key_watch;
mod keys;
mod lease;
mod operator;
mod options;
mod queue;
mod unsure;

use failure::{failure_of, lease_gone};
use lease::Session;
pub use options::EtcdOptions;
use queue::Place;
use unsure::Unsure;

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

/// Operations in one transaction at most: etcd refuses more than `--max-txn-ops` (128 by
/// default), so a batch of extensions is sent as transactions of this many gets.
const MAX_TXN_OPS: usize = 128;

/// Released tokens remembered at most; past this the set starts again (a spare wake costs one
/// attempt).
const RELEASED_MAX: usize = 4096;

/// Locks in etcd.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

impl EtcdBackend {
    /// Checks the options; connects on first use.
    pub fn new(options: EtcdOptions) -> Result<Self, Error> {
        options.validate()?;
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
}
