//! The connections a command goes out on ([`Conn`]), and how an adapter makes them: connect,
//! the eviction check, the connection of its own for a write followed by WAIT.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::FutureExt;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, RedisError, Value};

use crate::backend::shared::io::{self, Failure};
use crate::contract::GivenUp;
use crate::rt::error::BackendErrorKind;

use super::failure::failure_of;
use super::grant::set_nx;
use super::grant::{GrantReply, GrantRequest};
use super::keys::lock_keys;
use super::scripts::{run_lua, scripts, unknown_script, Lua};
use super::{loop_conn, Inner, WaitForReplicas};

/// How long the Cluster client waits before it sends a request again after TRYAGAIN (a slot
/// half moved), CLUSTERDOWN or LOADING, at least and at most (ms), and how many times it
/// sends one (redirects count too). The crate's own waits (1.28 s, doubling up to minutes)
/// outlast a lease's slack, and other requests stalled behind one waiting so: a held lock's
/// renewal was lost while a slot moved. 50 tries ride out some 5 s of a slot move or a
/// failover (16 gave up after 3 s, failing an acquisition that had the time to wait); the
/// engine's deadlines cut a request sooner.
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (10, 200);
const CLUSTER_TRIES: u32 = 50;

/// Whether the driver has ended `conn`'s connection (the server closed it, or an idle
/// `timeout` did), found without a round trip and without writing anything.
///
/// A request refused by an ended connection and one lost in flight both come back as the
/// same "broken pipe", and the second may have run on the server: sent again, a SET NX
/// would find its own first run's key and answer "held by someone else", a release would
/// answer "not held", a fenced grant would take a second fence. So no failed request is
/// sent again; instead the connection is looked at before an operation. The driver's task
/// ends with its connection, and a request handed to an ended task fails at once, unsent.
/// A PING polled once then dropped tells which: refused at once, the connection had ended
/// (and a [`ConnectionManager`] starts a new one, which the operation then waits for);
/// otherwise it sits in the queue of a live task (which cannot run meanwhile: the I/O
/// runtime has one thread), and that task skips a request whose caller has gone, so nothing
/// is written. A connection that dies after this look fails its request as before.
pub(super) fn has_ended(conn: &mut impl ConnectionLike) -> bool {
    static PING: LazyLock<redis::Cmd> = LazyLock::new(|| redis::cmd("PING"));
    let refused = conn.req_packed_command(&PING).now_or_never();
    matches!(refused, Some(Err(e)) if e.is_connection_dropped())
}

#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// A connection on the engine's thread (see `event_loop_link`).
    #[cfg_attr(not(unix), allow(dead_code))]
    Local(loop_conn::LoopConn),
    /// A connection of its own to one node (the doctor's, node by node).
    Node(MultiplexedConnection),
}

impl Conn {
    /// `SET key token NX PX ttl`: whether it set the key.
    pub(super) async fn set_nx(
        &mut self,
        key: &str,
        token: &str,
        ttl: u32,
    ) -> Result<bool, RedisError> {
        if let Conn::Local(c) = self {
            let mut ttl_digits = itoa::Buffer::new();
            let args: [&[u8]; 6] = [
                b"SET",
                key.as_bytes(),
                token.as_bytes(),
                b"NX",
                b"PX",
                ttl_digits.format(ttl).as_bytes(),
            ];
            return Ok(match c.command(&args).await? {
                Value::Okay => true,
                Value::Nil => false,
                other => redis::from_redis_value::<Option<String>>(other)?.is_some(),
            });
        }
        let set: Option<String> = self.query(&set_nx(key, token, ttl)).await?;
        Ok(set.is_some())
    }

    pub(super) async fn script<T: redis::FromRedisValue, K: AsRef<str>>(
        &mut self,
        lua: &Lua,
        keys: &[K],
        args: &[&str],
    ) -> Result<T, RedisError> {
        // On the event-loop link EVALSHA is encoded directly; a server that does not know the
        // script yet answers NOSCRIPT, and the call goes again below with the body.
        if let Conn::Local(c) = self {
            let numkeys = keys.len().to_string();
            let mut argv: Vec<&[u8]> = Vec::with_capacity(3 + keys.len() + args.len());
            argv.extend([&b"EVALSHA"[..], lua.hash().as_bytes(), numkeys.as_bytes()]);
            argv.extend(keys.iter().map(|k| k.as_ref().as_bytes()));
            argv.extend(args.iter().map(|a| a.as_bytes()));
            match c.command(&argv).await {
                Err(e) if unknown_script(&e) => {
                    return self.query(&lua.eval_of(&lua.evalsha(keys, args))).await;
                }
                answer => return Ok(redis::from_redis_value(answer?)?),
            }
        }
        self.evalsha(lua, &lua.evalsha(keys, args)).await
    }

    /// Sends `cmd`, an EVALSHA of `lua` (see [`run_lua`]).
    pub(super) async fn evalsha<T: redis::FromRedisValue>(
        &mut self,
        lua: &Lua,
        cmd: &redis::Cmd,
    ) -> Result<T, RedisError> {
        match self {
            Conn::Single(c) => run_lua(c, lua, cmd).await,
            Conn::Cluster(c) => run_lua(c, lua, cmd).await,
            Conn::Local(c) => run_lua(c, lua, cmd).await,
            Conn::Node(c) => run_lua(c, lua, cmd).await,
        }
    }

    pub(super) async fn grant(&mut self, request: &GrantRequest) -> Result<GrantReply, RedisError> {
        match self {
            Conn::Single(c) => request.send(c).await,
            Conn::Cluster(c) => request.send(c).await,
            Conn::Local(c) => request.send(c).await,
            Conn::Node(c) => request.send(c).await,
        }
    }

    pub(super) async fn query<T: redis::FromRedisValue>(
        &mut self,
        cmd: &redis::Cmd,
    ) -> Result<T, RedisError> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
            Conn::Local(c) => cmd.query_async(c).await,
            Conn::Node(c) => cmd.query_async(c).await,
        }
    }
}

impl Inner {
    pub(super) fn failure(&self, e: RedisError) -> Failure {
        failure_of(&self.secrets, e)
    }

    fn timeout_failure(&self, what: &str, ms: u64) -> Failure {
        let message = format!("{what} did not finish within {ms} ms");
        Failure::new("redis", BackendErrorKind::Timeout, message)
    }

    async fn connect(self: &Arc<Self>) -> Result<Conn, Failure> {
        let o = &self.options;
        let connect_timeout = Duration::from_millis(o.connect_timeout_ms);
        let response_timeout = Duration::from_millis(o.command_timeout_ms);
        let attempt = async {
            if o.cluster {
                let mut builder = ClusterClientBuilder::new(o.urls.clone())
                    .connection_timeout(connect_timeout)
                    .response_timeout(response_timeout)
                    .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
                    .max_retry_wait(CLUSTER_RETRY_WAIT_MS.1)
                    .retries(CLUSTER_TRIES);
                if let Some(ca) = &o.tls_ca {
                    builder = builder.certs(redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(ca.clone()),
                    });
                }
                let client = builder.build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            } else {
                let client = self
                    .client
                    .clone()
                    .expect("a standalone backend has a client");
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(response_timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                Ok(Conn::Single(
                    ConnectionManager::new_with_config(client, config).await?,
                ))
            }
        };
        let mut conn = match tokio::time::timeout(connect_timeout, attempt).await {
            Ok(r) => r.map_err(|e| self.failure(e))?,
            Err(_) => return Err(self.timeout_failure("connecting to Redis", o.connect_timeout_ms)),
        };
        self.check_eviction(&mut conn).await;
        Ok(conn)
    }

    /// Hands a warning found at connect to `sink`, once for the adapter's life (several
    /// operations may each have found it while the first check was in flight).
    pub(super) fn deliver_warning(&self, sink: Option<&dyn Fn(String)>) {
        let Some(sink) = sink else { return };
        if let Some(text) = self.warning.lock().ok().and_then(|mut w| w.take()) {
            if !self.warned.swap(true, std::sync::atomic::Ordering::AcqRel) {
                sink(text);
            }
        }
    }

    /// Warns once when the server may evict lock keys under memory pressure. A CONFIG GET that
    /// ACLs deny is ignored.
    pub(super) async fn check_eviction(&self, conn: &mut Conn) {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("maxmemory-policy");
        if let Ok(reply) = conn.query::<Vec<String>>(&cmd).await {
            if let Some(policy) = reply.get(1).filter(|p| p.as_str() != "noeviction") {
                let text = format!(
                    "locco-rs: Redis maxmemory-policy is '{policy}': under memory pressure the \
                     server may evict lock keys, and two holders could then own one key. Run the \
                     lock Redis with maxmemory-policy noeviction."
                );
                if let Ok(mut w) = self.warning.lock() {
                    *w = Some(text);
                }
            }
        }
        self.eviction_checked
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Where the push subscriber may connect: the server, or each seed of a Cluster.
    pub(super) fn pubsub_clients(&self) -> Vec<Client> {
        if let Some(client) = &self.client {
            return vec![client.clone()];
        }
        let open = |url: &String| match &self.options.tls_ca {
            Some(ca) => Client::build_with_tls(
                url.as_str(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                },
            ),
            None => Client::open(url.as_str()),
        };
        self.options
            .urls
            .iter()
            .filter_map(|u| open(u).ok())
            .collect()
    }

    pub(super) fn check_open(&self) -> Result<(), Failure> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            let closed = "the Redis adapter is closed";
            return Err(Failure::new("redis", BackendErrorKind::Config, closed));
        }
        Ok(())
    }

    pub(super) async fn conn(self: &Arc<Self>) -> Result<Conn, Failure> {
        use std::sync::atomic::Ordering;
        self.check_open()?;
        let failures_before = self.connect_failures.load(Ordering::Acquire);
        let mut slot = self.conn.lock().await;
        if let Some(c) = &*slot {
            let mut c = c.clone();
            // The manager replaces a connection the server closed only once a request has
            // failed on it: that request would be this operation's (see `has_ended`). Every
            // operation of a standalone server off the event loop takes its connection here,
            // the fair queue's and each Redlock server's too.
            if let Conn::Single(manager) = &mut c {
                has_ended(manager);
            }
            return Ok(c);
        }
        // An attempt that failed while this operation waited for the slot is its answer too:
        // trying again at once would make every queued operation pay a whole connect (a TLS
        // error would come twice as late, past a short lease). A later operation tries anew.
        if self.connect_failures.load(Ordering::Acquire) != failures_before {
            if let Some(failure) = self.connect_failed.lock().ok().and_then(|f| f.clone()) {
                return Err(failure);
            }
        }
        match self.connect().await {
            Ok(conn) => {
                *slot = Some(conn.clone());
                Ok(conn)
            }
            Err(failure) => {
                if let Ok(mut f) = self.connect_failed.lock() {
                    *f = Some(failure.clone());
                }
                self.connect_failures.fetch_add(1, Ordering::AcqRel);
                Err(failure)
            }
        }
    }

    /// A connection of its own for a write followed by WAIT.
    async fn replicated_conn(&self) -> Result<MultiplexedConnection, Failure> {
        // One the server closed while it waited in the pool is dropped (see `has_ended`).
        while let Some(mut c) = self.replicated.lock().ok().and_then(|mut p| p.pop()) {
            if !has_ended(&mut c) {
                return Ok(c);
            }
        }
        let client = self.client.as_ref().expect("WAIT is refused on a Cluster");
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(self.options.connect_timeout_ms)))
            .set_response_timeout(Some(Duration::from_millis(self.options.command_timeout_ms)));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| self.failure(e))
    }

    /// Gives a connection of [`Self::replicated_conn`] back for the next write.
    fn reuse_replicated(&self, conn: MultiplexedConnection) {
        if let Ok(mut pool) = self.replicated.lock() {
            pool.push(conn);
        }
    }

    /// Runs `write` on a connection of its own, then WAIT on that same connection; fewer
    /// acknowledgements than asked is a replication failure.
    pub(super) async fn write_and_wait<T: redis::FromRedisValue>(
        self: &Arc<Self>,
        w: WaitForReplicas,
        given_up: Option<&GivenUp>,
        write: impl FnOnce(
            &mut MultiplexedConnection,
        ) -> futures_util::future::BoxFuture<'_, Result<T, RedisError>>,
    ) -> Result<(T, u32), Failure> {
        let mut conn = self.replicated_conn().await?;
        if given_up.is_some_and(GivenUp::get) {
            self.reuse_replicated(conn);
            return Err(io::not_sent("redis"));
        }
        let answer = write(&mut conn).await.map_err(|e| self.failure(e))?;
        let mut wait = redis::cmd("WAIT");
        wait.arg(w.replicas).arg(w.timeout_ms);
        let acked: i64 = wait
            .query_async(&mut conn)
            .await
            .map_err(|e| self.failure(e))?;
        self.reuse_replicated(conn);
        Ok((answer, acked.max(0) as u32))
    }

    pub(super) fn replication_failure(w: WaitForReplicas, acknowledged: u32) -> Failure {
        let message = format!(
            "only {acknowledged} of {} replicas acknowledged within {} ms",
            w.replicas, w.timeout_ms
        );
        Failure {
            replication: Some((w.replicas, acknowledged)),
            ..Failure::new("redis", BackendErrorKind::Other, message)
        }
    }

    pub(super) async fn give_back(self: &Arc<Self>, key: &str, token: &str) {
        if let Ok(mut conn) = self.conn().await {
            let keys = lock_keys(key, self.options.cluster, false);
            let _ = conn
                .script::<i64, _>(&scripts().release, &keys, &[token])
                .await;
        }
    }
}
