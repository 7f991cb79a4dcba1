//! PostgreSQL advisory locks: the `advisory` mode of the PostgreSQL backend.
//!
//! A lock is `pg_try_advisory_lock(<64-bit key>)` on a pooled connection that is then kept out
//! of the pool for as long as the lock is held: the server's session holds the lock, and no
//! table is written. Each held lock has a small task on the I/O thread that owns its
//! connection and answers release, extend and `is_held` on it, in order. The task ends the
//! lock when
//! - the holder releases it (`pg_advisory_unlock`, and the connection goes back to the pool;
//!   an unlock that fails closes the connection instead, so the lock is lost, not released);
//! - the lease runs out without an extension (the same unlock: the next holder can take the
//!   key once the TTL is over, as with every other backend);
//! - the connection ends (terminated, the server restarted, the network broke): the server has
//!   dropped the lock with the session, and [`Advisory::watch_lost`] tells the engine at once.
//!
//! Keys: a string key is hashed with SHA-256 (see [`advisory_key`]); with [`Keys::Integer`] the
//! key is a decimal 64-bit integer taken as is, to share locks with other programs.
//!
//! Fencing tokens come from the sequence `<tableName>_fence` (the one the table mode uses),
//! taken in the same statement only when the lock was granted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Connect;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::Socket;

use super::{validation_failure, Inner};
use crate::backend::shared::io::{self, Failure};
use crate::contract::value::holder_of;
use crate::contract::{KeyInfo, Op};
use crate::rt::error::{BackendErrorKind, Error};

/// Where the PostgreSQL backend keeps its locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// One row per key in `tableName`, leases on the server clock.
    #[default]
    Table,
    /// Session-level advisory locks, one pooled connection per held lock.
    Advisory,
}

/// How an advisory lock's key becomes the 64-bit number PostgreSQL locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Keys {
    /// SHA-256 of `<tableName>:<key>`, see [`advisory_key`].
    #[default]
    Hash,
    /// The key is a decimal integer in the range of a signed 64-bit integer, used as is.
    Integer,
}

/// The advisory lock number of a string key: the first 8 bytes of the SHA-256 digest of
/// `<namespace>:<key>` (UTF-8), read as a big-endian signed 64-bit integer. The namespace is the
/// adapter's `tableName`, so adapters with different names are separate lock spaces, as their
/// tables are in the table mode. In SQL the same number is
/// `('x' || left(encode(sha256(convert_to('<namespace>:' || key, 'UTF8')), 'hex'), 16))::bit(64)::bigint`.
///
/// It is stable across processes, platforms and versions. Two different keys whose numbers
/// collide share one lock: never two holders at once, but one waits for the other
/// (about one chance in 2^64 per pair of keys).
pub fn advisory_key(namespace: &str, key: &str) -> i64 {
    let mut h = Sha256::new();
    h.update(namespace.as_bytes());
    h.update(b":");
    h.update(key.as_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// An integer key: an optional `-` and decimal digits, within `i64`.
fn integer_key(key: &str) -> Result<i64, Error> {
    let digits = key.strip_prefix('-').unwrap_or(key);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::validation(
            "key",
            format!(
                "{key:?} is not a decimal integer, which keys: 'integer' needs (a Locker's \
                 keyPrefix is part of the key)"
            ),
        ));
    }
    key.parse::<i64>().map_err(|_| {
        Error::validation(
            "key",
            format!("{key:?} is outside the range of a signed 64-bit integer"),
        )
    })
}

/// A pool's connect step that also reports when a connection ends, so that a held advisory
/// lock learns at once that its session is gone.
pub(super) struct Watched<T> {
    tls: T,
    ended: watch::Sender<u64>,
}

impl<T> Watched<T> {
    pub(super) fn new(tls: T, ended: watch::Sender<u64>) -> Self {
        Watched { tls, ended }
    }
}

impl<T> Connect for Watched<T>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn connect(
        &self,
        pg_config: &tokio_postgres::Config,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<
                        (tokio_postgres::Client, tokio::task::JoinHandle<()>),
                        tokio_postgres::Error,
                    >,
                > + Send
                + '_,
        >,
    > {
        let tls = self.tls.clone();
        let pg_config = pg_config.clone();
        let ended = self.ended.clone();
        Box::pin(async move {
            let (client, connection) = pg_config.connect(tls).await?;
            let task = tokio::spawn(async move {
                // The connection is dropped here, so `Client::is_closed` is true before anyone
                // hears of the end.
                let _ = connection.await;
                ended.send_modify(|n| *n = n.wrapping_add(1));
            });
            Ok((client, task))
        })
    }
}

type Reply = oneshot::Sender<Result<bool, Failure>>;

enum Command {
    Extend(u32, Reply),
    IsHeld(Reply),
    Release(Reply),
}

/// How a held lock ended: `true` when its session did (the engine then reports it lost).
type Ended = watch::Receiver<Option<bool>>;

struct Holder {
    token: String,
    id: u64,
    commands: mpsc::UnboundedSender<Command>,
    ended: Ended,
    /// Where the end is told. A release tells it from the thread that asked for the release,
    /// with the answer, so the engine's watch (see [`Advisory::watch_lost`]) settles there
    /// without another wake from the I/O thread.
    end: Arc<watch::Sender<Option<bool>>>,
}

struct Sql {
    acquire: String,
    acquire_fenced: String,
}

const RELEASE: &str = "SELECT pg_advisory_unlock($1)";
/// The holder of the advisory lock `$1`/`$2` (as in [`HELD`]), in any session: the session's
/// `application_name`, which a labelled lock's session carries (see [`LABEL_PREFIX`]).
const INSPECT: &str = "SELECT COALESCE(a.application_name, '') FROM pg_locks l \
     LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' \
     AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1 AND l.granted LIMIT 1";
/// A labelled lock's session is named `locco:<holder>` while it holds the lock: the server
/// keeps no token or lease for an advisory lock, but every session shows its name in
/// `pg_stat_activity`. A name has at most 63 bytes, so a longer label is cut.
const LABEL_PREFIX: &str = "locco:";
const NAME_BYTES: usize = 63;

/// The session name for a holder's label, cut at a character boundary to fit.
fn session_name(holder: &str) -> String {
    let mut name = format!("{LABEL_PREFIX}{holder}");
    let mut end = name.len().min(NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name.truncate(end);
    name
}
/// Whether this session holds the advisory lock `$1` (bigint locks show as classid, objid and
/// objsubid 1 in pg_locks).
const HELD: &str = "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
     AND pid = pg_backend_pid() AND classid = $1 AND objid = $2 AND objsubid = 1 AND granted)";

/// The advisory locks of one adapter.
pub(super) struct Advisory {
    base: Arc<Inner>,
    sql: Sql,
    held: Mutex<HashMap<i64, Holder>>,
    /// How many locks `held` has, for an acquire that waits for a pooled connection: once
    /// every connection holds a lock, none will come free for it.
    holding: watch::Sender<usize>,
    next_id: AtomicU64,
    sequence_made: tokio::sync::OnceCell<()>,
    /// A spare connection is being opened (see [`Advisory::keep_a_spare`]).
    warming: std::sync::atomic::AtomicBool,
}

/// How many idle connections an advisory adapter keeps ready for the next acquires.
const SPARES: usize = 2;

/// The server-side answer of an acquire: granted, with a fence when fenced.
type Grant = Option<Option<u64>>;

impl Advisory {
    pub(super) fn new(base: Arc<Inner>) -> Self {
        let seq = base.names.sequence.replace('\'', "''");
        Advisory {
            sql: Sql {
                acquire: "SELECT CASE WHEN pg_try_advisory_lock($1) THEN 0::int8 END".into(),
                acquire_fenced: format!(
                    "SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('{seq}') END"
                ),
            },
            base,
            held: Mutex::default(),
            holding: watch::channel(0).0,
            next_id: AtomicU64::new(1),
            sequence_made: tokio::sync::OnceCell::new(),
            warming: Default::default(),
        }
    }

    fn number(&self, key: &str) -> Result<i64, Error> {
        match self.base.options.keys {
            Keys::Hash => Ok(advisory_key(&self.base.names.plain, key)),
            Keys::Integer => integer_key(key),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Holder>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this process holds `n` with a live session (then nobody else can have it).
    fn held_here(&self, n: i64) -> bool {
        self.held()
            .get(&n)
            .is_some_and(|h| h.ended.borrow().is_none() && !h.commands.is_closed())
    }

    pub(super) fn acquire(self: &Arc<Self>, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let op = self.grant(key, token, ttl, false);
        Op::pending(async move { op.await.map(|g| g.is_some()) })
    }

    pub(super) fn acquire_fenced(
        self: &Arc<Self>,
        key: &str,
        token: &str,
        ttl: u32,
    ) -> Op<Option<u64>> {
        let op = self.grant(key, token, ttl, true);
        Op::pending(async move { op.await.map(Option::flatten) })
    }

    fn grant(self: &Arc<Self>, key: &str, token: &str, ttl: u32, fenced: bool) -> Op<Grant> {
        let n = match self.number(key) {
            Ok(n) => n,
            Err(e) => return Op::ready(Err(e)),
        };
        // Held by this process: nobody else can have it, so no round trip.
        if self.held_here(n) {
            return Op::ready(Ok(None));
        }
        let this = self.clone();
        let token = token.to_owned();
        io::run("postgres", move |abandon| async move {
            let base = &this.base;
            let max = base.pool.status().max_size;
            let full = || {
                Failure::new(
                    "postgres",
                    BackendErrorKind::Other,
                    format!(
                        "every connection of the pool (poolSize {max}) holds an advisory lock; \
                         a held advisory lock keeps its connection, so raise poolSize"
                    ),
                )
            };
            let mut holding = this.holding.subscribe();
            if *holding.borrow_and_update() >= max {
                return Err(full());
            }
            // Waiting for a connection while the others' grants land: once they all hold
            // locks, none comes back until a lock ends, so fail now, as when they already did.
            let client = tokio::select! {
                biased;
                client = base.client(&abandon) => client?,
                Ok(_) = holding.wait_for(|n| *n >= max) => return Err(full()),
            };
            if fenced {
                this.sequence(&client).await?;
            }
            let sql = if fenced {
                &this.sql.acquire_fenced
            } else {
                &this.sql.acquire
            };
            let statement = client
                .prepare_cached(sql)
                .await
                .map_err(|e| base.failure(e))?;
            // From here the connection may hold the lock: should this task end before it is
            // handed over (a panic), it is closed, never pooled with a lock inside.
            let client = Connection(Some(client));
            // The lease starts when the request leaves, after the engine's own start.
            let sent = Instant::now();
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&n];
            let query = client.get().query_one(&statement, &params);
            let (row, discard) = base.cancellable(client.get(), &abandon, query).await;
            if discard {
                // Closing the session gives back whatever it was granted.
                drop(client);
                return row.map(|_| None);
            }
            let fence: Option<i64> = row?.get(0);
            let Some(fence) = fence else {
                client.give_back();
                return Ok(None);
            };
            // A label names the session (one more statement, only for a labelled lock). Best
            // effort: a lock whose name could not be set is still a lock, without a holder.
            let mut named = false;
            if let Some(holder) = holder_of(&token) {
                let set = "SELECT set_config('application_name', $1, false)";
                let name = session_name(&holder);
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&name];
                named = client.get().execute(set, &params).await.is_ok();
            }
            this.hold(n, token, client, sent + ms(ttl), named);
            Ok(Some(fenced.then_some(fence as u64)))
        })
    }

    /// Makes the fence sequence (with `createTable`) or checks it, once.
    async fn sequence(&self, client: &tokio_postgres::Client) -> Result<(), Failure> {
        if let Err(why) = &self.base.names.fence_ok {
            return Err(validation_failure(why.clone()));
        }
        if self.base.options.create_table {
            self.sequence_made
                .get_or_try_init(|| async {
                    // Two-integer advisory keys are a space apart from the bigint ones locks use.
                    let ddl = format!(
                        "SELECT pg_advisory_xact_lock(0, hashtext('locco-rs create sequence {}'));\n\
                         CREATE SEQUENCE IF NOT EXISTS {};",
                        self.base.names.plain, self.base.names.sequence
                    );
                    let mut tries = 0;
                    loop {
                        tries += 1;
                        match client.batch_execute(&ddl).await {
                            Ok(()) => return Ok(()),
                            Err(e) if tries < 2 && super::is_duplicate(&e) => continue,
                            Err(e) => return Err(self.base.failure(e)),
                        }
                    }
                })
                .await?;
        }
        self.base.sequence(client).await
    }

    /// Keeps a granted lock: its connection stays out of the pool with a task of its own.
    fn hold(
        self: &Arc<Self>,
        n: i64,
        token: String,
        client: Connection,
        deadline: Instant,
        named: bool,
    ) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (commands, inbox) = mpsc::unbounded_channel();
        let (end, ended) = watch::channel(None);
        let end = Arc::new(end);
        let ended_tx = end.clone();
        {
            let mut held = self.held();
            held.insert(
                n,
                Holder {
                    token,
                    id,
                    commands,
                    ended,
                    end,
                },
            );
            self.holding.send_replace(held.len());
        }
        self.keep_a_spare();
        let this = self.clone();
        tokio::spawn(async move {
            let session = Session {
                n,
                client,
                deadline,
                wait: ms(u32::try_from(this.base.options.connect_timeout_ms).unwrap_or(u32::MAX)),
                unlocked: false,
                named,
            };
            let (lost, released, reply) = session.run(&this, id, inbox).await;
            // Told before the reply: a release that ended the session (its unlock failed) has
            // lost the lock, and the engine's watch learns that no later than the release's
            // caller. A release that worked is told by the caller's side (see `command`).
            if lost || !released {
                ended_tx.send_replace(Some(lost));
            }
            if let Some((reply, answer)) = reply {
                let _ = reply.send(answer);
            }
        });
    }

    /// Held locks take connections out of the pool for good, so the next acquire would often
    /// pay for a new connection (and a short budget run out on it). When a lock takes the last
    /// idle connection, [`SPARES`] more are opened in the background, while the pool has room.
    /// (Only then: to open one, the pool must have none idle, or it hands out an idle one.)
    fn keep_a_spare(self: &Arc<Self>) {
        let status = self.base.pool.status();
        if status.available > 0 || status.size >= status.max_size {
            return;
        }
        if self.warming.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let pool = &this.base.pool;
            let status = pool.status();
            let want = SPARES.min(status.max_size.saturating_sub(status.size));
            // Opened side by side, then all given back, idle.
            let wait = Duration::from_millis(this.base.options.connect_timeout_ms);
            let opened = futures_util::future::join_all(
                (0..want).map(|_| tokio::time::timeout(wait, pool.get())),
            )
            .await;
            drop(opened);
            this.warming.store(false, Ordering::Release);
        });
    }

    /// Sends a command to the task of the lock `key` holds with `token`; `false` when there is
    /// none (released, expired, or its session ended).
    fn command(&self, key: &str, token: &str, make: impl FnOnce(Reply) -> Command) -> Op<bool> {
        let n = match self.number(key) {
            Ok(n) => n,
            Err(e) => return Op::ready(Err(e)),
        };
        let (reply, answer) = oneshot::channel();
        let command = make(reply);
        let releases = matches!(command, Command::Release(_));
        let end = {
            let held = self.held();
            let Some(h) = held.get(&n).filter(|h| h.token == token) else {
                return Op::ready(Ok(false));
            };
            if h.commands.send(command).is_err() {
                return Op::ready(Ok(false));
            }
            releases.then(|| h.end.clone())
        };
        Op::pending(async move {
            let answer = match answer.await {
                Ok(r) => r.map_err(Failure::into_error),
                // The task ended first: the lock is gone.
                Err(_) => Ok(false),
            };
            if let Some(end) = end {
                // Released (unless it had ended before): a watch of the lock settles, not lost.
                end.send_if_modified(|e| e.is_none() && e.replace(false).is_none());
            }
            answer
        })
    }

    /// Whether any session holds the key's advisory lock, and its holder's label when the
    /// holding session is named after one. The server keeps no lease or fence for it.
    pub(super) fn inspect(&self, key: &str) -> Op<KeyInfo> {
        let n = match self.number(key) {
            Ok(n) => n,
            Err(e) => return Op::ready(Err(e)),
        };
        let base = self.base.clone();
        let key = key.to_owned();
        io::run("postgres", move |abandon| async move {
            let client = base.client(&abandon).await?;
            let (class, obj) = ((n as u64 >> 32) as u32, n as u64 as u32);
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&class, &obj];
            let rows = client
                .query(INSPECT, &params)
                .await
                .map_err(|e| base.failure(e))?;
            let name: Option<String> = rows.first().map(|r| r.get(0));
            Ok(KeyInfo {
                key,
                held: name.is_some(),
                ttl_left: None,
                fence: None,
                holder: name
                    .and_then(|n| n.strip_prefix(LABEL_PREFIX).map(str::to_owned))
                    .filter(|h| !h.is_empty()),
            })
        })
    }

    pub(super) fn release(&self, key: &str, token: &str) -> Op<bool> {
        self.command(key, token, Command::Release)
    }

    pub(super) fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        self.command(key, token, |r| Command::Extend(ttl, r))
    }

    pub(super) fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        self.command(key, token, Command::IsHeld)
    }

    /// Settles `Ok` when the session holding `key` for `token` ends; `Err` when the lock ends
    /// otherwise (released, expired). The engine asks once, right after the grant: a lock that
    /// is no longer here by then ended with its session in between (terminated, or its
    /// socket broke while the engine's thread was busy), so it is lost at once.
    pub(super) fn watch_lost(&self, key: &str, token: &str) -> Option<Op<()>> {
        let n = self.number(key).ok()?;
        let watched = self
            .held()
            .get(&n)
            .filter(|h| h.token == token)
            .map(|h| h.ended.clone());
        let Some(mut ended) = watched else {
            return Some(Op::ready(Ok(())));
        };
        Some(Op::pending(async move {
            let lost = match ended.wait_for(Option::is_some).await {
                Ok(v) => *v == Some(true),
                Err(_) => false,
            };
            if lost {
                Ok(())
            } else {
                Err(Error::Internal(
                    "the lock ended without losing its session".into(),
                ))
            }
        }))
    }

    /// Ends every session that holds a lock: the server drops their locks, and each is lost.
    pub(super) fn close(&self) {
        let holders: Vec<Holder> = {
            let mut held = self.held();
            let all = held.drain().map(|(_, h)| h).collect();
            self.holding.send_replace(0);
            all
        };
        drop(holders);
    }

    /// Forgets the lock `n` when task `id` still holds it.
    fn forget(&self, n: i64, id: u64) {
        let mut held = self.held();
        if held.get(&n).is_some_and(|h| h.id == id) {
            held.remove(&n);
            self.holding.send_replace(held.len());
        }
    }
}

fn ms(n: u32) -> Duration {
    Duration::from_millis(u64::from(n))
}

/// A pooled connection that may hold an advisory lock. Dropped, it is closed (which ends its
/// session and so its locks); only [`Connection::give_back`] returns it to the pool, once it
/// holds none: a pooled session holding a lock would grant it again to the next acquire there,
/// since a session's advisory locks are re-entrant.
struct Connection(Option<deadpool_postgres::Object>);

impl Connection {
    fn get(&self) -> &deadpool_postgres::Object {
        self.0
            .as_ref()
            .expect("a connection until it is given back or closed")
    }

    fn give_back(mut self) {
        drop(self.0.take());
    }

    fn is_open(&self) -> bool {
        self.0.is_some()
    }

    /// Closes it now.
    fn close(&mut self) {
        if let Some(c) = self.0.take() {
            drop(deadpool_postgres::Object::take(c));
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}

/// One held lock's connection and lease.
struct Session {
    n: i64,
    client: Connection,
    deadline: Instant,
    /// How long one statement may take before the session is given up.
    wait: Duration,
    /// The last unlock worked: the connection holds no lock and may go back to the pool.
    unlocked: bool,
    /// The session carries the holder's name, to be reset before it goes back to the pool.
    named: bool,
}

/// What a statement on the held connection came to.
enum Outcome<T> {
    Answer(T),
    /// The server answered with an error; the connection still works.
    Failed(Failure),
    /// The connection ended, or the statement did not end in time (the connection is then
    /// dropped, which ends the session).
    Gone(Option<Failure>),
}

impl Session {
    fn client(&self) -> &deadpool_postgres::Object {
        self.client.get()
    }

    /// Serves commands until the lock ends; answers whether it ended with its session,
    /// whether a release command ended it, and the last command's answer, still to send.
    async fn run(
        mut self,
        owner: &Advisory,
        id: u64,
        mut inbox: mpsc::UnboundedReceiver<Command>,
    ) -> (bool, bool, Option<(Reply, Result<bool, Failure>)>) {
        let mut ends = owner.base.ended.subscribe();
        let mut watching = true;
        let mut released = false;
        let (lost, reply, answer) = loop {
            if !self.client.is_open() || self.client().is_closed() {
                break (true, None, Ok(false));
            }
            tokio::select! {
                biased;
                command = inbox.recv() => match command {
                    // The adapter was closed: drop the connection, which ends the session.
                    None => {
                        self.discard();
                        break (true, None, Ok(false));
                    }
                    Some(Command::Release(reply)) => {
                        released = true;
                        let live = Instant::now() < self.deadline;
                        match self.unlock(owner).await {
                            Outcome::Answer(unlocked) => break (false, Some(reply), Ok(unlocked && live)),
                            // The session is closed, so the server drops the lock: lost, not
                            // released, and the release answers the failure.
                            Outcome::Failed(f) => {
                                self.discard();
                                break (true, Some(reply), Err(f));
                            }
                            Outcome::Gone(f) => break (true, Some(reply), f.map_or(Ok(false), Err)),
                        }
                    }
                    Some(Command::Extend(ttl, reply)) => {
                        let sent = Instant::now();
                        if sent >= self.deadline {
                            // The lease ran out: extend never revives it.
                            self.expire(owner).await;
                            break (false, Some(reply), Ok(false));
                        }
                        match self.check(owner).await {
                            Outcome::Answer(true) => {
                                self.deadline = sent + ms(ttl);
                                let _ = reply.send(Ok(true));
                            }
                            Outcome::Answer(false) => break (true, Some(reply), Ok(false)),
                            Outcome::Failed(f) => {
                                let _ = reply.send(Err(f));
                            }
                            Outcome::Gone(f) => break (true, Some(reply), f.map_or(Ok(false), Err)),
                        }
                    }
                    Some(Command::IsHeld(reply)) => {
                        let live = Instant::now() < self.deadline;
                        match self.check(owner).await {
                            Outcome::Answer(held) => {
                                let _ = reply.send(Ok(held && live));
                                if !held {
                                    break (true, None, Ok(false));
                                }
                            }
                            Outcome::Failed(f) => {
                                let _ = reply.send(Err(f));
                            }
                            Outcome::Gone(f) => break (true, Some(reply), f.map_or(Ok(false), Err)),
                        }
                    }
                },
                changed = ends.changed(), if watching => {
                    // Some pooled connection ended: the loop checks whether it was ours.
                    watching = changed.is_ok();
                }
                () = tokio::time::sleep_until(self.deadline) => {
                    self.expire(owner).await;
                    break (false, None, Ok(false));
                }
            }
        };
        owner.forget(self.n, id);
        // Back to the pool before the answer, so the next acquire finds it free; only after
        // an unlock that worked, else closed.
        let Session {
            client, unlocked, ..
        } = self;
        if unlocked && !lost {
            client.give_back();
        } else {
            drop(client);
        }
        (lost, released, reply.map(|r| (r, answer)))
    }

    /// Drops the connection for good (never back to the pool), which ends its session.
    fn discard(&mut self) {
        self.client.close();
    }

    /// One statement on the held connection, within `wait`.
    async fn statement<T>(
        &mut self,
        owner: &Advisory,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        read: impl FnOnce(&tokio_postgres::Row) -> T,
    ) -> Outcome<T> {
        let client = self.client();
        let work = async {
            let statement = client.prepare_cached(sql).await?;
            client.query_one(&statement, params).await
        };
        match tokio::time::timeout(self.wait, work).await {
            Ok(Ok(row)) => Outcome::Answer(read(&row)),
            Ok(Err(e)) if client.is_closed() => Outcome::Gone(Some(owner.base.failure(e))),
            Ok(Err(e)) => Outcome::Failed(owner.base.failure(e)),
            Err(_) => {
                self.discard();
                Outcome::Gone(Some(Failure::new(
                    "postgres",
                    BackendErrorKind::Timeout,
                    "the advisory lock's connection did not answer in time; it was closed, \
                     which ends its lock",
                )))
            }
        }
    }

    async fn unlock(&mut self, owner: &Advisory) -> Outcome<bool> {
        let n = self.n;
        let outcome = self.statement(owner, RELEASE, &[&n], |r| r.get(0)).await;
        // Unlocked, or it was not held (then the session holds nothing either).
        self.unlocked = matches!(outcome, Outcome::Answer(_));
        if self.unlocked && self.named {
            // A pooled session must not go on showing the holder: a name that cannot be reset
            // closes the connection instead.
            let reset = self.client().batch_execute("RESET application_name");
            self.unlocked = matches!(tokio::time::timeout(self.wait, reset).await, Ok(Ok(())));
            self.named = !self.unlocked;
        }
        outcome
    }

    /// Whether the session still holds the lock, asked on the session itself.
    async fn check(&mut self, owner: &Advisory) -> Outcome<bool> {
        let (class, obj) = ((self.n as u64 >> 32) as u32, self.n as u64 as u32);
        self.statement(owner, HELD, &[&class, &obj], |r| r.get(0))
            .await
    }

    /// The lease ran out: unlock, so the key is free for the next holder.
    async fn expire(&mut self, owner: &Advisory) {
        match self.unlock(owner).await {
            Outcome::Answer(_) => {}
            Outcome::Failed(_) | Outcome::Gone(_) => self.discard(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_keys_hash_to_stable_numbers() {
        // Fixed values (also what the SQL expression in the docs gives): a change here would
        // change the lock every deployed key takes.
        assert_eq!(advisory_key("locco_locks", "k"), -1902459719790302513);
        assert_eq!(
            advisory_key("locco_locks", "orders:42"),
            -1880504325017649300
        );
        assert_eq!(advisory_key("app.locks", "k"), 2883233422714140051);
        assert_ne!(
            advisory_key("locco_locks", "k"),
            advisory_key("locco_locks", "K")
        );
        assert_ne!(
            advisory_key("locco_locks", "é"),
            advisory_key("locco_locks", "e")
        );
    }

    #[test]
    fn integer_keys_are_decimal_i64() {
        assert_eq!(integer_key("12345").unwrap(), 12345);
        assert_eq!(integer_key("-1").unwrap(), -1);
        assert_eq!(integer_key("9223372036854775807").unwrap(), i64::MAX);
        assert_eq!(integer_key("-9223372036854775808").unwrap(), i64::MIN);
        for bad in [
            "",
            "-",
            "+1",
            "1e3",
            " 1",
            "0x10",
            "9223372036854775808",
            "p:1",
        ] {
            let e = integer_key(bad).expect_err(bad);
            assert!(
                matches!(e, Error::Validation { ref field, .. } if field == "key"),
                "{bad:?}: {e:?}"
            );
        }
    }
}
