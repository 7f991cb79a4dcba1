//! The Redis/Valkey backend, standalone or Cluster.
//!
//! Acquire is `SET key token NX PX ttl`; release, extend and `is_held` are compare-then-act Lua
//! scripts sent by EVALSHA, with EVAL when a restarted server has lost its script cache. The
//! connections and their I/O live on a small Tokio runtime of this crate's own; the engine
//! waits for answers on its thread through one-shot channels.

#[cfg(unix)]
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use redis::aio::MultiplexedConnection;
use redis::Client;

use crate::backend::shared::io::{self, redact, runtime, Failure};
use crate::contract::{extend_each, Backend, GivenUp, KeyInfo, Op, Queue, Renewal};
use crate::rt::error::{BackendErrorKind, Error};

mod conn;
mod doctor;
#[cfg(unix)]
mod event_loop_link;
mod failure;
mod gate;
mod grant;
// The health of a connection on the event loop, which only a link (Unix) makes.
#[cfg_attr(not(unix), allow(dead_code))]
mod health;
mod keys;
// Only an event-loop link (Unix) makes one.
#[cfg_attr(not(unix), allow(dead_code))]
mod loop_conn;
mod operator;
mod options;
mod pushes;
mod queue;
pub mod redlock;
mod scripts;

use conn::Conn;
use gate::{Gate, Priority};
pub use keys::{fence_key, hash_tag};
use keys::{lock_keys, slot_of};
pub(crate) use operator::Seen;
use options::secrets_of;
pub use options::{RedisOptions, WaitForReplicas};
use scripts::{run_lua, scripts, MAX_KEYS_PER_SCRIPT, RESERVED_PREFIX, WAITED_SUFFIX};

struct Inner {
    options: RedisOptions,
    /// Passwords of the URLs, removed from every message.
    secrets: Vec<String>,
    client: Option<Client>,
    conn: tokio::sync::Mutex<Option<Conn>>,
    closed: std::sync::atomic::AtomicBool,
    /// Connections for writes followed by WAIT, one per request in flight, so a WAIT holds up
    /// nobody else's commands.
    replicated: Mutex<Vec<MultiplexedConnection>>,
    warning: Mutex<Option<String>>,
    /// Set once a connection's eviction check has answered (or was refused), and once its
    /// warning went to the sink.
    eviction_checked: std::sync::atomic::AtomicBool,
    warned: std::sync::atomic::AtomicBool,
    /// Failed connection attempts so far, and the last one's failure: an operation that
    /// waited while an attempt failed takes that failure (see `conn`).
    connect_failures: std::sync::atomic::AtomicU64,
    connect_failed: Mutex<Option<Failure>>,
    /// This adapter's pub/sub channel (`locco:wake:<channel>`), and its subscriber.
    channel: String,
    pushes: pushes::Pushes,
}

/// A Redis or Valkey server, or a Redis Cluster.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
    /// Where a warning found at connect goes (see `on_warning`).
    warn: Option<std::rc::Rc<dyn Fn(String)>>,
    /// The connection on the engine's thread, when the host's event loop drives it.
    #[cfg(unix)]
    link: Option<std::rc::Rc<crate::backend::redis::event_loop_link::Link>>,
    /// Bounds the operations in flight on the connection, renewals first (see `gate`).
    gate: std::rc::Rc<Gate>,
}

impl RedisBackend {
    /// Checks the options; connects on first use, so construction never blocks.
    pub fn new(mut options: RedisOptions) -> Result<Self, Error> {
        options.validate()?;
        let secrets = secrets_of(&options.urls);
        let redact = |m: String| redact(&secrets, m);
        let client = if options.cluster {
            None
        } else {
            let built = match &options.tls_ca {
                Some(ca) => Client::build_with_tls(
                    options.urls[0].as_str(),
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(ca.clone()),
                    },
                ),
                None => Client::open(options.urls[0].as_str()),
            };
            Some(built.map_err(|e| Error::validation("url", redact(e.to_string())))?)
        };
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                options,
                secrets,
                client,
                conn: tokio::sync::Mutex::new(None),
                closed: Default::default(),
                replicated: Mutex::default(),
                warning: Mutex::default(),
                eviction_checked: Default::default(),
                warned: Default::default(),
                connect_failures: Default::default(),
                connect_failed: Mutex::default(),
                channel: crate::rt::ids::random_token()[..16].to_owned(),
                pushes: Default::default(),
            }),
            warn: None,
            #[cfg(unix)]
            link: None,
            gate: Gate::new(gate::DEFAULT_IN_FLIGHT),
        })
    }

    /// Sends a warning found at connect (an eviction policy that can drop lock keys) to
    /// `sink`, on this thread, before any answer that used the connection is returned: so the
    /// host hears of it before its first grant.
    pub fn on_warning(&mut self, sink: std::rc::Rc<dyn Fn(String)>) {
        self.warn = Some(sink);
    }

    /// Does the I/O of a plain-TCP standalone server on the engine's thread, driven by
    /// `host`. TLS, a Cluster and `waitForReplicas` stay on the I/O thread.
    #[cfg(unix)]
    pub fn on_event_loop(&mut self, host: std::rc::Rc<dyn crate::rt::event_loop::EventLoop>) {
        let o = &self.inner.options;
        let Some(client) = &self.inner.client else {
            return;
        };
        if o.wait_for_replicas.is_some() {
            return;
        }
        self.link = crate::backend::redis::event_loop_link::Link::new(
            host,
            client.get_connection_info().clone(),
            self.inner.secrets.clone(),
            o.connect_timeout_ms,
            o.command_timeout_ms,
        );
    }

    /// Connects now rather than on first use. Answers a warning found at connect (an
    /// eviction policy that can drop lock keys), once.
    pub fn connect(&self) -> Op<Option<String>> {
        // With a sink, the warning goes there (see `on_warning`), not in this answer.
        let to_sink = self.warn.is_some();
        self.with_conn(move |inner, _| async move {
            if to_sink {
                return Ok(None);
            }
            Ok(inner.warning.lock().ok().and_then(|mut w| w.take()))
        })
    }

    /// Drops the connections; operations after this fail.
    pub fn close(&self) {
        use std::sync::atomic::Ordering;
        self.inner.closed.store(true, Ordering::Release);
        self.inner.pushes.close();
        self.inner.replicated.lock().map(|mut r| r.clear()).ok();
        #[cfg(unix)]
        if let Some(link) = &self.link {
            link.close();
        }
        let inner = self.inner.clone();
        runtime().spawn(async move { inner.conn.lock().await.take() });
    }

    fn run<T: Send + 'static, F>(&self, work: impl FnOnce(Arc<Inner>) -> F) -> Op<T>
    where
        F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let inner = self.inner.clone();
        io::run("redis", move |_| work(inner))
    }

    /// Runs `work` with the connection once the gate lets it in: on this thread when the
    /// event loop drives it, otherwise on the I/O thread.
    fn with_conn<T: Send + 'static, F>(
        &self,
        work: impl FnOnce(Arc<Inner>, Conn) -> F + Send + 'static,
    ) -> Op<T>
    where
        F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    {
        self.with_conn_as(Priority::Other, None, work)
    }

    /// `with_conn` for a grant: one the caller gives up before it has left is not sent (see
    /// [`GivenUp`]).
    fn grant_with_conn<T: Send + 'static, F>(
        &self,
        work: impl FnOnce(Arc<Inner>, Conn) -> F + Send + 'static,
    ) -> Op<T>
    where
        F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let given_up = GivenUp::default();
        self.with_conn_as(Priority::Other, Some(given_up.clone()), work)
            .given_up_by(given_up)
    }

    /// [`Self::with_conn`], waiting in `priority`'s queue while the connection is full.
    fn with_conn_as<T: Send + 'static, F>(
        &self,
        priority: Priority,
        given_up: Option<GivenUp>,
        work: impl FnOnce(Arc<Inner>, Conn) -> F + Send + 'static,
    ) -> Op<T>
    where
        F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let inner = self.inner.clone();
        let warn = self.warn.clone();
        let gate = self.gate.clone();
        let given_up = move || given_up.as_ref().is_some_and(GivenUp::get);
        #[cfg(unix)]
        if let Some(link) = self.link.clone() {
            return Op::pending(async move {
                inner.check_open().map_err(Failure::into_error)?;
                let _room = gate.enter(priority).await;
                let lent = link.lend().await?;
                let mut conn = Conn::Local(lent.conn.clone());
                // Every operation checks until one check has answered, not only the first user
                // of a connection: an operation must not answer before the warning is known.
                let unchecked = !inner.eviction_checked.load(Ordering::Acquire);
                if lent.first_use() || unchecked {
                    inner.check_eviction(&mut conn).await;
                }
                if given_up() {
                    return Err(io::not_sent("redis").into_error());
                }
                let answer = work(inner.clone(), conn).await;
                inner.deliver_warning(warn.as_deref());
                answer.map_err(|f| link.failed(&lent, f).into_error())
            });
        }
        Op::pending(async move {
            let _room = gate.enter(priority).await;
            let answer = io::run("redis", {
                let inner = inner.clone();
                move |_| async move {
                    let conn = inner.conn().await?;
                    if given_up() {
                        return Err(io::not_sent("redis"));
                    }
                    work(inner, conn).await
                }
            })
            .await;
            inner.deliver_warning(warn.as_deref());
            answer
        })
    }
}

impl crate::contract::Coordination for RedisBackend {
    fn peek(&self, key: &str) -> Op<Option<String>> {
        // A key reserved for a waiter has no holder yet; the holder's token is before the mark.
        let value = self.get(key);
        Op::pending(async move {
            let value = value.await?;
            Ok(value.filter(|v| !v.starts_with(RESERVED_PREFIX)).map(|v| {
                match v.strip_suffix(WAITED_SUFFIX) {
                    Some(token) => token.to_owned(),
                    None => v,
                }
            }))
        })
    }

    fn put(&self, key: &str, value: &str, ttl: u32) -> Op<()> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(value).arg("PX").arg(ttl);
        self.with_conn(move |inner, mut conn| async move {
            conn.query::<()>(&cmd).await.map_err(|e| inner.failure(e))
        })
    }

    fn get(&self, key: &str) -> Op<Option<String>> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        self.with_conn(move |inner, mut conn| async move {
            conn.query::<Option<String>>(&cmd)
                .await
                .map_err(|e| inner.failure(e))
        })
    }

    fn delete(&self, key: &str) -> Op<()> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(key);
        self.with_conn(move |inner, mut conn| async move {
            conn.query::<()>(&cmd).await.map_err(|e| inner.failure(e))
        })
    }
}

impl Backend for RedisBackend {
    fn name(&self) -> &str {
        "redis"
    }

    fn coordination(&self) -> Option<&dyn crate::contract::Coordination> {
        Some(self)
    }

    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        if self.inner.options.wait_for_replicas.is_some() {
            return self.grant(key, token, ttl, "", false, |(granted, _)| granted == 1);
        }
        // The path of every uncontended lock: one command, straight to the connection.
        if let Err(e) = self.check_key(key) {
            return Op::ready(Err(e));
        }
        let (key, token) = (key.to_owned(), token.to_owned());
        self.grant_with_conn(move |inner, mut conn| async move {
            conn.set_nx(&key, &token, ttl)
                .await
                .map_err(|e| inner.failure(e))
        })
    }

    fn release(&self, key: &str, token: &str) -> Op<bool> {
        // The lock's key alone where the server allows it (see RELEASE_FAST).
        let keys = match self.inner.options.cluster {
            true => self.keys(key, false),
            false => vec![key.to_owned()],
        };
        let token = token.to_owned();
        self.with_conn(move |inner, mut conn| async move {
            let deleted: i64 = conn
                .script(&scripts().release, &keys, &[&token])
                .await
                .map_err(|e| inner.failure(e))?;
            Ok(deleted == 1)
        })
    }

    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        let ttl = ttl.to_string();
        let Some(w) = self.inner.options.wait_for_replicas else {
            return self.with_conn_as(Priority::Renewal, None, move |inner, mut conn| async move {
                let done: i64 = conn
                    .script(&scripts().extend, &[&key], &[&token, &ttl])
                    .await
                    .map_err(|e| inner.failure(e))?;
                Ok(done == 1)
            });
        };
        self.run(move |inner| async move {
            let (done, acked) = inner
                .write_and_wait(w, None, |c| {
                    Box::pin(async move {
                        let extend = &scripts().extend;
                        run_lua::<i64, _>(c, extend, &extend.evalsha(&[&key], &[&token, &ttl]))
                            .await
                    })
                })
                .await?;
            if done == 1 && acked < w.replicas {
                return Err(Inner::replication_failure(w, acked));
            }
            Ok(done == 1)
        })
    }

    fn extend_many(&self, renewals: &[Renewal<'_>]) -> Op<Vec<Result<bool, Error>>> {
        // With waitForReplicas each extension waits for its own acknowledgements.
        if self.inner.options.wait_for_replicas.is_some() || renewals.len() < 2 {
            return extend_each(self, renewals);
        }
        // One script call per ttl (they differ only for locks clamped to their deadline) and,
        // on a Cluster, per hash slot. Built as one EVALSHA command: its arguments go into one
        // buffer, not an allocation each.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut by_group: std::collections::HashMap<(u16, u32), usize> = Default::default();
        let cluster = self.inner.options.cluster;
        for (i, r) in renewals.iter().enumerate() {
            let slot = if cluster { slot_of(r.key) } else { 0 };
            let at = *by_group.entry((slot, r.ttl)).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[at].push(i);
            // The script unpacks its keys onto Lua's stack, which holds about 8,000.
            if groups[at].len() == MAX_KEYS_PER_SCRIPT {
                by_group.remove(&(slot, r.ttl));
            }
        }
        let script = &scripts().extend_many;
        let calls: Vec<(Vec<usize>, redis::Cmd)> = groups
            .into_iter()
            .map(|index| {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(script.hash()).arg(index.len());
                index.iter().for_each(|&i| {
                    cmd.arg(renewals[i].key);
                });
                cmd.arg(renewals[index[0]].ttl);
                index.iter().for_each(|&i| {
                    cmd.arg(renewals[i].token);
                });
                (index, cmd)
            })
            .collect();
        let count = renewals.len();
        let op = self.with_conn_as(Priority::Renewal, None, move |inner, conn| async move {
            let sends = calls.into_iter().map(|(index, cmd)| {
                let mut conn = conn.clone();
                async move { (index, conn.evalsha::<Vec<u8>>(script, &cmd).await) }
            });
            let mut out: Vec<Result<bool, Failure>> = vec![Ok(false); count];
            for (index, answer) in futures_util::future::join_all(sends).await {
                match answer {
                    Ok(done) if done.len() == index.len() => {
                        index
                            .iter()
                            .zip(done)
                            .for_each(|(&i, d)| out[i] = Ok(d == b'1'));
                    }
                    Ok(done) => {
                        let message = format!(
                            "EXTEND_MANY answered {} outcomes for {} keys",
                            done.len(),
                            index.len()
                        );
                        let failure = Failure::new("redis", BackendErrorKind::Protocol, message);
                        index.iter().for_each(|&i| out[i] = Err(failure.clone()));
                    }
                    Err(e) => {
                        let failure = inner.failure(e);
                        index.iter().for_each(|&i| out[i] = Err(failure.clone()));
                    }
                }
            }
            Ok(out)
        });
        Op::pending(async move {
            let out = op.await?;
            Ok(out
                .into_iter()
                .map(|r| r.map_err(Failure::into_error))
                .collect())
        })
    }

    fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.with_conn(move |inner, mut conn| async move {
            let held: i64 = conn
                .script(&scripts().is_held, &[&key], &[&token])
                .await
                .map_err(|e| inner.failure(e))?;
            Ok(held == 1)
        })
    }

    fn supports_fencing(&self) -> bool {
        true
    }

    fn acquire_fenced(&self, key: &str, token: &str, ttl: u32) -> Op<Option<u64>> {
        self.grant(key, token, ttl, "", true, |(granted, fence)| {
            (granted == 1).then_some(fence as u64)
        })
    }

    fn queue(&self) -> Option<&dyn Queue> {
        Some(self)
    }

    fn inspect(&self, key: &str) -> Op<KeyInfo> {
        let seen = self.seen(key);
        Op::pending(async move { Ok(seen.await?.info) })
    }

    fn list(&self, prefix: &str, limit: u32) -> Op<Vec<KeyInfo>> {
        let seen = self.seen_under(prefix, limit);
        Op::pending(async move { Ok(seen.await?.into_iter().map(|s| s.info).collect()) })
    }

    fn force_release(&self, key: &str) -> Op<bool> {
        let removed = self.force_release_value(key, None);
        Op::pending(async move { Ok(removed.await?.is_some()) })
    }
}

impl RedisBackend {
    fn keys(&self, key: &str, fenced: bool) -> Vec<String> {
        lock_keys(key, self.inner.options.cluster, fenced)
    }

    /// On a Cluster, a key's queue and counter must share its slot: a key with `}` but no
    /// hash tag cannot have them.
    fn check_key(&self, key: &str) -> Result<(), Error> {
        if self.inner.options.cluster && hash_tag(key).is_none() && key.contains('}') {
            return Err(Error::validation(
                "key",
                format!(
                    "{key:?} contains '}}' without a hash tag, so its queue and fencing counter \
                     cannot share its Cluster slot; give the key a hash tag such as {{order:1}}"
                ),
            ));
        }
        Ok(())
    }
}
