//! The PostgreSQL backend: one row per key, every comparison on the server clock.
//!
//! Acquire is one `INSERT … ON CONFLICT (key) DO UPDATE … WHERE expires_at <= clock_timestamp()`;
//! the fenced acquire takes `nextval` of `<table>_fence` in the same statement. Release and
//! extend compare the token, and extend never revives an expired row; the heartbeats that fall
//! due together renew in one `UPDATE … FROM unnest(keys, tokens, ttls)`. A statement the engine
//! stops waiting for (its budget ran out, say, behind another transaction's row lock) is
//! cancelled on the server and its connection closed, never pooled again; a statement timeout
//! on every connection bounds what no cancel reaches. Such a wait still keeps its connection
//! for the rest of its attempt, so acquisitions and the operator verbs share one connection
//! fewer than the pool has: the last one is kept for holders (release, extend, `isHeld`),
//! whose renewals must not wait behind acquisitions of a key some transaction has locked.
//!
//! Waiters take turns in `<table>_waiters` (see [`queue`]): a release notifies
//! the head of the key's queue, and a try is refused while anyone waits. Without that table
//! (`createTable: false` and a migration that made or granted only the lock table) the
//! backend works as before, without the queue: waiters poll and race for a free key.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime as PoolRuntime,
};
use tokio_postgres::error::SqlState;

use crate::backend::shared::io::{self, redact, Failure, OnAbandon};
use crate::contract::value::holder_of;
use crate::contract::{extend_each, Backend, KeyInfo, Op, Queue, Renewal};
use crate::rt::error::{BackendErrorKind, Error};

mod advisory;
mod doctor;
mod options;
pub(crate) mod queue;
mod sql;
mod tls;

pub use advisory::{advisory_key, Keys, Mode};
pub use options::PostgresOptions;
use options::{names, password_of, split_sslmode, Names};
use queue::{Connect, Pushes};
pub use sql::locks_ddl;
use sql::{params, Params, Statements};
use tls::tls_config;

/// `list` and `forceRelease` are not there in the advisory mode: the server's session holds
/// the lock, with no token, lease or key on the server to read (only the key's 64-bit number).
fn advisory_refusal(verb: &str) -> Error {
    Error::validation(
        "mode",
        format!(
            "the postgres backend cannot {verb} keys in the advisory mode (the lock is a \
             session's pg_advisory_lock: the server keeps only the key's 64-bit number, with no \
             key, token or lease; see pg_locks); use the table mode"
        ),
    )
}

struct Inner {
    options: PostgresOptions,
    names: Names,
    sql: Statements,
    pool: Pool,
    /// The connections' TLS set-up, which a cancel request must use too.
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    secrets: Vec<String>,
    /// The table (and, once fencing is used, the sequence) has been made or checked; with
    /// whether its waiter table is there for us to use.
    table_ready: tokio::sync::OnceCell<bool>,
    sequence_ready: tokio::sync::OnceCell<()>,
    closed: std::sync::atomic::AtomicBool,
    lane: io::Lane,
    pushes: Pushes,
    /// Counts the pooled connections that ended, so an advisory lock's holder learns at once
    /// that its session is gone.
    ended: tokio::sync::watch::Sender<u64>,
    /// Turns for everything but a holder's statements (release, extend, `isHeld`): one
    /// connection fewer than the pool has (when it has two or more). A statement that waits
    /// behind another transaction's row lock keeps its connection until its attempt ends, so
    /// without this, acquisitions of one blocked key could take every connection and make a
    /// healthy lock's renewal wait past its lease.
    turns: tokio::sync::Semaphore,
}

/// Locks in a PostgreSQL table.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
    /// In advisory mode: the sessions that hold locks.
    advisory: Option<Arc<advisory::Advisory>>,
}

impl PostgresBackend {
    /// Checks the options and makes the pool; connects on first use.
    pub fn new(options: PostgresOptions) -> Result<Self, Error> {
        let names = names(&options.table_name)?;
        let (url, sslmode) = split_sslmode(&options.url);
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| Error::validation("url", e.to_string()))?;
        let secrets = password_of(&config);
        config.connect_timeout(Duration::from_millis(options.connect_timeout_ms));
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let verify = match sslmode.as_deref() {
            None | Some("disable") | Some("allow") | Some("prefer") => None,
            Some("require") => Some(false),
            Some("verify-ca") | Some("verify-full") => Some(true),
            Some(other) => {
                return Err(Error::validation(
                    "url",
                    format!("unknown sslmode {other:?}"),
                ))
            }
        };
        let (ended, _) = tokio::sync::watch::channel(0u64);
        let (manager, tls) = match verify {
            None if options.tls_ca.is_none() => (
                Manager::from_connect(
                    config.clone(),
                    advisory::Watched::new(tokio_postgres::NoTls, ended.clone()),
                    manager_config,
                ),
                None,
            ),
            _ => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                let tls = tls_config(verify.unwrap_or(true), options.tls_ca.as_deref())?;
                let connector = tokio_postgres_rustls::MakeRustlsConnect::new(tls);
                (
                    Manager::from_connect(
                        config.clone(),
                        advisory::Watched::new(connector.clone(), ended.clone()),
                        manager_config,
                    ),
                    Some(connector),
                )
            }
        };
        let mut pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(PoolRuntime::Tokio1);
        if options.mode == Mode::Advisory {
            // Held locks grow the pool to its peak; the most recently used connection (warm on
            // both sides) serves the next acquire.
            pool = pool.queue_mode(deadpool_postgres::QueueMode::Lifo);
        }
        if let Some(ms) = options.statement_timeout() {
            // Only where none is in force: a timeout the operator chose (role, database, URL
            // options) wins. A SET rather than a startup option, which poolers such as
            // PgBouncer refuse.
            let set: Arc<str> = format!(
                "SELECT set_config('statement_timeout', '{ms}', false) \
                 WHERE current_setting('statement_timeout') = '0'"
            )
            .into();
            pool = pool.post_create(Hook::async_fn(move |client, _| {
                let set = set.clone();
                Box::pin(
                    async move { client.batch_execute(&set).await.map_err(HookError::Backend) },
                )
            }));
        }
        let pool = pool
            .build()
            .map_err(|e| Error::validation("poolSize", e.to_string()))?;
        let pool_size = pool.status().max_size;
        let sql = Statements::new(&names);
        let pushes = Pushes::new(Connect {
            config,
            tls: tls.clone(),
        });
        let mode = options.mode;
        let inner = Arc::new(Inner {
            options,
            names,
            sql,
            pool,
            tls,
            secrets,
            table_ready: tokio::sync::OnceCell::new(),
            sequence_ready: tokio::sync::OnceCell::new(),
            closed: Default::default(),
            lane: io::Lane::default(),
            pushes,
            ended,
            turns: tokio::sync::Semaphore::new(pool_size.saturating_sub(1).max(1)),
        });
        let advisory = match mode {
            Mode::Table => None,
            Mode::Advisory => Some(Arc::new(advisory::Advisory::new(inner.clone()))),
        };
        Ok(PostgresBackend { inner, advisory })
    }

    /// Closes the pool; operations afterwards fail.
    pub fn close(&self) {
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.inner.pool.close();
        self.inner.pushes.close();
        if let Some(a) = &self.advisory {
            a.close();
        }
    }

    /// Deletes expired rows; answers how many.
    pub fn sweep_expired(&self) -> Op<u64> {
        if self.advisory.is_some() {
            // No rows: a lock ends with its session or its lease.
            return Op::ready(Ok(0));
        }
        self.run(|inner, abandon| async move {
            let _turn = inner.turn(&abandon).await?;
            let client = inner.client(&abandon).await?;
            let fair = inner.ready(&client).await?;
            let sweep = inner.sql.fair(fair).map_or(&inner.sql.sweep, |f| &f.sweep);
            let delete = client.execute(sweep, &[]);
            let (answer, discard) = inner.cancellable(&client, &abandon, delete).await;
            if discard {
                drop(deadpool_postgres::Object::take(client));
            }
            answer
        })
    }

    fn run<T: Send + 'static, F>(&self, work: impl FnOnce(Arc<Inner>, OnAbandon) -> F) -> Op<T>
    where
        F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let inner = self.inner.clone();
        io::run_in(&self.inner.lane, "postgres", move |abandon| {
            work(inner, abandon)
        })
    }

    /// One statement on one key. `query` picks it, knowing whether the table has a usable
    /// waiter table, with how many of `params` it takes (`None`: nothing to send); `answer`
    /// reads its rows, knowing the same. `who` says whether it waits for a turn.
    fn key_op<T: Send + 'static>(
        &self,
        who: Who,
        params: Params,
        query: impl FnOnce(&Statements, bool) -> Option<(&String, usize)> + Send + 'static,
        answer: impl FnOnce(Vec<tokio_postgres::Row>, bool) -> T + Send + 'static,
        fenced: bool,
    ) -> Op<T> {
        self.statement(Some(&self.inner.lane), who, params, query, answer, fenced)
    }

    /// [`Self::key_op`] in `lane`, or at once without one (a heartbeat).
    fn statement<T: Send + 'static>(
        &self,
        lane: Option<&io::Lane>,
        who: Who,
        params: Params,
        query: impl FnOnce(&Statements, bool) -> Option<(&String, usize)> + Send + 'static,
        answer: impl FnOnce(Vec<tokio_postgres::Row>, bool) -> T + Send + 'static,
        fenced: bool,
    ) -> Op<T> {
        let inner = self.inner.clone();
        let work = move |abandon: OnAbandon| async move {
            let _turn = match who {
                Who::Holder => None,
                Who::Other => Some(inner.turn(&abandon).await?),
            };
            let client = inner.client(&abandon).await?;
            let fair = inner.ready(&client).await?;
            if fenced {
                inner.sequence(&client).await?;
            }
            let Some((sql, n)) = query(&inner.sql, fair) else {
                return Ok(answer(Vec::new(), fair));
            };
            let statement = client
                .prepare_cached(sql)
                .await
                .map_err(|e| inner.failure(e))?;
            let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                params[..n].iter().map(|p| &**p as _).collect();
            let query = client.query(&statement, &params);
            let (rows, discard) = inner.cancellable(&client, &abandon, query).await;
            if discard {
                drop(deadpool_postgres::Object::take(client));
            }
            Ok(answer(rows?, fair))
        };
        match lane {
            Some(lane) => io::run_in(lane, "postgres", work),
            None => io::run("postgres", work),
        }
    }
}

/// Whose statement it is: a holder's (release, extend, `isHeld`) may use any pooled
/// connection; any other waits for one of [`Inner::turns`], so one connection stays free for
/// the holders.
#[derive(Clone, Copy)]
enum Who {
    Holder,
    Other,
}

impl Inner {
    /// Runs one statement the engine may give up on. If it does, a cancel request goes to the
    /// server over the connection's own TLS set-up and is awaited, and the statement gets a
    /// while to end: a grant that slipped in first is still answered, so the engine gives it
    /// back. The second value says the connection must then be closed, not pooled: whether
    /// the cancel landed or not, it must never meet a later statement of a reused connection.
    async fn cancellable<T>(
        &self,
        client: &tokio_postgres::Client,
        abandon: &OnAbandon,
        statement: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> (Result<T, Failure>, bool) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        abandon.set(move || {
            let _ = stop.send(());
        });
        if abandon.is_abandoned() {
            abandon.clear();
            let late = "the statement was not sent: its caller gave up waiting";
            let failure = Failure::new("postgres", BackendErrorKind::Timeout, late);
            return (Err(failure), false);
        }
        let mut statement = std::pin::pin!(statement);
        tokio::select! {
            biased;
            answer = &mut statement => {
                abandon.clear();
                return (answer.map_err(|e| self.failure(e)), false);
            }
            // A dropped sender (after `clear`) disables this branch.
            Ok(()) = stopped => {}
        }
        let wait = Duration::from_millis(self.options.connect_timeout_ms);
        let token = client.cancel_token();
        // A failed or timed-out cancel changes nothing below: the connection goes either way,
        // and the statement timeout ends the statement on the server.
        let _ = match &self.tls {
            Some(tls) => tokio::time::timeout(wait, token.cancel_query(tls.clone())).await,
            None => tokio::time::timeout(wait, token.cancel_query(tokio_postgres::NoTls)).await,
        };
        let answer = match tokio::time::timeout(wait, &mut statement).await {
            Ok(answer) => answer.map_err(|e| self.failure(e)),
            Err(_) => Err(Failure::new(
                "postgres",
                BackendErrorKind::Timeout,
                "an abandoned statement did not end after its cancel request",
            )),
        };
        (answer, true)
    }

    /// A turn for a statement that is not a holder's; given up (unsent) when the engine stops
    /// waiting first.
    async fn turn(&self, abandon: &OnAbandon) -> Result<tokio::sync::SemaphorePermit<'_>, Failure> {
        if let Ok(turn) = self.turns.try_acquire() {
            return Ok(turn);
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        abandon.set(move || {
            let _ = stop.send(());
        });
        let closed = || {
            Failure::new(
                "postgres",
                BackendErrorKind::Config,
                "the Postgres adapter is closed",
            )
        };
        tokio::select! {
            turn = self.turns.acquire() => {
                abandon.clear();
                turn.map_err(|_| closed())
            }
            _ = stopped => Err(io::not_sent("postgres")),
        }
    }

    fn failure(&self, e: tokio_postgres::Error) -> Failure {
        let code = e.code().map(|c| c.code().to_string());
        let kind = match e.code() {
            Some(c)
                if *c == SqlState::INVALID_PASSWORD
                    || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
            {
                BackendErrorKind::Auth
            }
            Some(c) if *c == SqlState::INSUFFICIENT_PRIVILEGE => BackendErrorKind::Auth,
            Some(c) if *c == SqlState::QUERY_CANCELED || *c == SqlState::LOCK_NOT_AVAILABLE => {
                BackendErrorKind::Timeout
            }
            Some(_) => BackendErrorKind::Other,
            None if e.is_closed() => BackendErrorKind::Io,
            None => {
                let m = format!("{e:?}").to_ascii_lowercase();
                if m.contains("tls") || m.contains("certificate") || m.contains("handshake") {
                    BackendErrorKind::Tls
                } else if m.contains("timeout") || m.contains("timed out") {
                    BackendErrorKind::Timeout
                } else {
                    BackendErrorKind::Io
                }
            }
        };
        let detail = match e.as_db_error() {
            Some(db) => db.message().to_string(),
            None => {
                let source = std::error::Error::source(&e)
                    .map(|s| format!(": {s}"))
                    .unwrap_or_default();
                format!("{e}{source}")
            }
        };
        Failure {
            code,
            ..Failure::new("postgres", kind, redact(&self.secrets, detail))
        }
    }

    async fn client(&self, abandon: &OnAbandon) -> Result<deadpool_postgres::Object, Failure> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Failure::new(
                "postgres",
                BackendErrorKind::Config,
                "the Postgres adapter is closed",
            ));
        }
        // If the engine gives up while a connection is being made (or the table checked), the
        // work still runs to the point where a statement would be sent, and stops there: a
        // connection dropped half-made would cost the next attempt a whole new connect, and
        // with a short lease every attempt would be abandoned the same way. `cancellable`
        // replaces this with a real cancel once a statement is on the wire.
        abandon.set(|| {});
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e)
            | deadpool_postgres::PoolError::PostCreateHook(HookError::Backend(e)) => {
                self.failure(e)
            }
            deadpool_postgres::PoolError::Timeout(_) => Failure::new(
                "postgres",
                BackendErrorKind::Timeout,
                "no pooled connection came free in time",
            ),
            other => Failure::new(
                "postgres",
                BackendErrorKind::Other,
                redact(&self.secrets, other.to_string()),
            ),
        })
    }

    /// Makes the table, or checks it once when `createTable` is off; answers whether its
    /// waiter table is usable. A failed check runs again on the next call.
    async fn ready(&self, client: &tokio_postgres::Client) -> Result<bool, Failure> {
        self.table_ready
            .get_or_try_init(|| async {
                if self.options.create_table {
                    self.create_table(client).await?;
                } else {
                    self.check_table(client).await?;
                }
                self.queue_usable(client).await
            })
            .await
            .copied()
    }

    /// Whether the waiter table exists and this role may use it. An older migration (or one
    /// that granted only the lock table) leaves the backend without the queue, not broken.
    async fn queue_usable(&self, client: &tokio_postgres::Client) -> Result<bool, Failure> {
        let Some(waiters) = &self.names.waiters else {
            return Ok(false);
        };
        // One privilege per call: with a list, has_table_privilege answers whether *any* is held.
        let row = client
            .query_one(
                "SELECT COALESCE((SELECT has_table_privilege(r, 'SELECT') AND has_table_privilege(r, 'INSERT') \
                   AND has_table_privilege(r, 'UPDATE') AND has_table_privilege(r, 'DELETE') \
                   FROM to_regclass($1) r WHERE r IS NOT NULL), false)",
                &[waiters],
            )
            .await
            .map_err(|e| self.failure(e))?;
        Ok(row.get(0))
    }

    /// Checks a table made by a migration: it exists, with a unique key.
    async fn check_table(&self, client: &tokio_postgres::Client) -> Result<(), Failure> {
        let row = client
                    .query_one(
                        "SELECT to_regclass($1) IS NOT NULL, EXISTS ( \
                           SELECT 1 FROM pg_index i \
                           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
                           WHERE i.indrelid = to_regclass($1) AND i.indisunique \
                             AND i.indnkeyatts = 1 AND a.attname = 'key')",
                        &[&self.names.table],
                    )
                    .await
                    .map_err(|e| self.failure(e))?;
        let (exists, unique): (bool, bool) = (row.get(0), row.get(1));
        if !exists {
            return Err(validation_failure(format!(
                        "table {} does not exist; create it from postgresLocksDdl() or set createTable: true",
                        self.names.plain
                    )));
        }
        if !unique {
            return Err(validation_failure(format!(
                        "table {} has no primary key or unique index on key alone, which ON CONFLICT (key) needs",
                        self.names.plain
                    )));
        }
        Ok(())
    }

    /// Creates the table and sequence, safely when several processes start at once: two
    /// concurrent `CREATE … IF NOT EXISTS` of one name can both pass the existence check and
    /// one then fails on a catalog index (`pg_type_typname_nsp_index`). A transaction-scoped
    /// advisory lock on the name serialises our creators; the lock ends with the implicit
    /// transaction of the one query string (no explicit BEGIN, so a failure cannot leave the
    /// pooled connection inside an aborted transaction). A creator outside that lock (a
    /// migration) can still collide, so a duplicate error means "made meanwhile": try once
    /// more, and the IF NOT EXISTS then finds it.
    async fn create_table(&self, client: &tokio_postgres::Client) -> Result<(), Failure> {
        let ddl = locks_ddl(&self.names.plain).map_err(config_failure)?;
        // The name is a checked identifier (letters, digits, _, $ and one dot): safe to quote.
        let guarded = format!(
            "SELECT pg_advisory_xact_lock(hashtext('locco-rs create table {}'));\n{ddl}",
            self.names.plain
        );
        let mut tries = 0;
        loop {
            tries += 1;
            match client.batch_execute(&guarded).await {
                Ok(()) => return Ok(()),
                Err(e) if tries < 2 && is_duplicate(&e) => continue,
                Err(e) => return Err(self.failure(e)),
            }
        }
    }

    /// Checks the fence sequence once, before the first fenced acquire.
    async fn sequence(&self, client: &tokio_postgres::Client) -> Result<(), Failure> {
        if let Err(why) = &self.names.fence_ok {
            return Err(validation_failure(why.clone()));
        }
        self.sequence_ready
            .get_or_try_init(|| async {
                let row = client
                    .query_one(
                        "SELECT to_regclass($1) IS NOT NULL, \
                           to_regclass($1) IS NOT NULL AND has_sequence_privilege(to_regclass($1), 'USAGE')",
                        &[&self.names.sequence],
                    )
                    .await
                    .map_err(|e| self.failure(e))?;
                let (exists, usable): (bool, bool) = (row.get(0), row.get(1));
                let seq = self.names.sequence.replace('"', "");
                if !exists {
                    return Err(validation_failure(format!(
                        "sequence {seq} does not exist; create it from postgresLocksDdl() for fencing"
                    )));
                }
                if !usable {
                    return Err(validation_failure(format!(
                        "this role has no USAGE on sequence {seq}: GRANT USAGE ON SEQUENCE {seq} TO <role>"
                    )));
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }
}

/// An object of that name appeared between the existence check and the insert in the catalog.
fn is_duplicate(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::UNIQUE_VIOLATION
            || *c == SqlState::DUPLICATE_TABLE
            || *c == SqlState::DUPLICATE_OBJECT
    })
}

/// A set-up problem found on the server: reported as a `ValidationError` on `tableName`.
fn validation_failure(message: String) -> Failure {
    Failure {
        validation: Some("tableName"),
        ..Failure::new("postgres", BackendErrorKind::Config, message)
    }
}

fn config_failure(e: Error) -> Failure {
    validation_failure(e.to_string())
}

type Rows = Vec<tokio_postgres::Row>;

/// The answers of one statement for many renewals, each `Ok`; a request in flight keeps how
/// to stop it.
fn each_ok(op: Op<Vec<bool>>) -> Op<Vec<crate::rt::error::Result<bool>>> {
    let each =
        |all: crate::rt::error::Result<Vec<bool>>| all.map(|v| v.into_iter().map(Ok).collect());
    match op {
        Op::Ready(answer) => Op::Ready(answer.map(each)),
        Op::Pending(fut, stop) => Op::Pending(Box::pin(async move { each(fut.await) }), stop),
    }
}

/// One row answered: the verb applied.
fn one(rows: Rows, _: bool) -> bool {
    rows.len() == 1
}

impl Backend for PostgresBackend {
    fn name(&self) -> &str {
        "postgres"
    }

    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        if let Some(a) = &self.advisory {
            return a.acquire(key, token, ttl);
        }
        let p = params(key, token, Some(ttl));
        self.key_op(
            Who::Other,
            p,
            |s, fair| Some((s.fair(fair).map_or(&s.acquire, |f| &f.acquire), 3)),
            one,
            false,
        )
    }

    fn release(&self, key: &str, token: &str) -> Op<bool> {
        if let Some(a) = &self.advisory {
            return a.release(key, token);
        }
        let live = |rows: Rows, _| rows.first().is_some_and(|r| r.get::<_, bool>(0));
        let p = params(key, token, None);
        self.key_op(
            Who::Holder,
            p,
            |s, fair| Some((s.fair(fair).map_or(&s.release, |f| &f.release), 2)),
            live,
            false,
        )
    }

    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        if let Some(a) = &self.advisory {
            return a.extend(key, token, ttl);
        }
        self.key_op(
            Who::Holder,
            params(key, token, Some(ttl)),
            |s, _| Some((&s.extend, 3)),
            one,
            false,
        )
    }

    /// One `UPDATE … FROM unnest(…)` for all of them, on one pooled connection, under the
    /// same statement timeout, cancel and failure mapping as a single extend. A renewal whose
    /// row the statement did not return is `false`. An advisory lock is checked on its own
    /// session (each held lock keeps one), so there is nothing to batch: one check each.
    fn extend_many(&self, renewals: &[Renewal<'_>]) -> Op<Vec<crate::rt::error::Result<bool>>> {
        if self.advisory.is_some() {
            return extend_each(self, renewals);
        }
        if renewals.is_empty() {
            return Op::ready(Ok(Vec::new()));
        }
        let keys: Vec<String> = renewals.iter().map(|r| r.key.to_owned()).collect();
        let tokens: Vec<String> = renewals.iter().map(|r| r.token.to_owned()).collect();
        let ttls: Vec<f64> = renewals.iter().map(|r| f64::from(r.ttl)).collect();
        let asked: Vec<(String, String)> =
            keys.iter().cloned().zip(tokens.iter().cloned()).collect();
        let p: Params = vec![Box::new(keys), Box::new(tokens), Box::new(ttls)];
        let renewed = move |rows: Rows, _| {
            let renewed: std::collections::HashSet<(String, String)> = rows
                .iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                .collect();
            asked
                .into_iter()
                .map(|pair| renewed.contains(&pair))
                .collect::<Vec<bool>>()
        };
        // A heartbeat does not wait for room in the lane.
        each_ok(self.statement(
            None,
            Who::Holder,
            p,
            |s, _| Some((&s.extend_many, 3)),
            renewed,
            false,
        ))
    }

    fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        if let Some(a) = &self.advisory {
            return a.is_held(key, token);
        }
        self.key_op(
            Who::Holder,
            params(key, token, None),
            |s, _| Some((&s.is_held, 2)),
            one,
            false,
        )
    }

    fn supports_fencing(&self) -> bool {
        true
    }

    fn acquire_fenced(&self, key: &str, token: &str, ttl: u32) -> Op<Option<u64>> {
        if let Err(why) = &self.inner.names.fence_ok {
            return Op::ready(Err(Error::validation("tableName", why.clone())));
        }
        if let Some(a) = &self.advisory {
            return a.acquire_fenced(key, token, ttl);
        }
        let fence = |rows: Rows, _| rows.first().map(|r| r.get::<_, i64>(0) as u64);
        let p = params(key, token, Some(ttl));
        self.key_op(
            Who::Other,
            p,
            |s, fair| {
                Some((
                    s.fair(fair)
                        .map_or(&s.acquire_fenced, |f| &f.acquire_fenced),
                    3,
                ))
            },
            fence,
            true,
        )
    }

    fn queue(&self) -> Option<&dyn Queue> {
        // Advisory locks keep no queue: their waiters poll.
        self.advisory.is_none().then_some(self as &dyn Queue)
    }

    fn watch_lost(&self, key: &str, token: &str) -> Option<Op<()>> {
        self.advisory
            .as_ref()
            .and_then(|a| a.watch_lost(key, token))
    }
    fn inspect(&self, key: &str) -> Op<KeyInfo> {
        if let Some(a) = &self.advisory {
            return a.inspect(key);
        }
        let owned = key.to_owned();
        let info = move |rows: Rows, _| {
            let row = rows.first();
            KeyInfo {
                key: owned,
                held: row.is_some(),
                ttl_left: row.map(|r| r.get::<_, f64>(1).max(0.0)),
                // The fence sequence is one for the whole table, not the key's.
                fence: None,
                holder: row.and_then(|r| holder_of(r.get::<_, &str>(0))),
            }
        };
        self.key_op(
            Who::Other,
            params(key, "", None),
            |s, _| Some((&s.inspect, 1)),
            info,
            false,
        )
    }

    fn list(&self, prefix: &str, limit: u32) -> Op<Vec<KeyInfo>> {
        if self.advisory.is_some() {
            return Op::ready(Err(advisory_refusal("list")));
        }
        let p: Params = vec![Box::new(prefix.to_owned()), Box::new(i64::from(limit))];
        let found = |rows: Rows, _| {
            rows.iter()
                .map(|r| KeyInfo {
                    key: r.get(0),
                    held: true,
                    ttl_left: Some(r.get::<_, f64>(2).max(0.0)),
                    fence: None,
                    holder: holder_of(r.get::<_, &str>(1)),
                })
                .collect()
        };
        self.key_op(Who::Other, p, |s, _| Some((&s.list, 2)), found, false)
    }

    fn force_release(&self, key: &str) -> Op<bool> {
        if self.advisory.is_some() {
            return Op::ready(Err(advisory_refusal("forceRelease")));
        }
        let live = |rows: Rows, _| rows.first().is_some_and(|r| r.get::<_, bool>(0));
        self.key_op(
            Who::Other,
            params(key, "", None),
            |s, fair| {
                Some((
                    s.fair(fair).map_or(&s.force_release, |f| &f.force_release),
                    1,
                ))
            },
            live,
            false,
        )
    }
}
