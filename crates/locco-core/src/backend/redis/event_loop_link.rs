//! A Redis connection whose I/O runs on the engine's thread, driven by the host's event loop
//! (see [`crate::rt::event_loop::EventLoop`]): no thread hop between a lock operation and its socket.
//!
//! Used for a plain-TCP standalone server. The connection is a [`LoopConn`], whose reader is a
//! task on the engine's thread. Only the TCP connect goes through the I/O thread (it may
//! resolve a name).

use std::cell::RefCell;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{FutureExt, LocalBoxFuture, Shared};
use redis::ConnectionInfo;

use crate::backend::redis::failure::failure_of;
use crate::backend::redis::health::{now_ms, Busy, Health};
use crate::backend::redis::loop_conn::LoopConn;
use crate::backend::shared::io::{self, runtime, Failure};
use crate::rt::error::{BackendErrorKind, Error};
use crate::rt::event_loop::{EventLoop, LOOP_ACTIVITY};
use crate::rt::task::{first, First};

/// Answers come back in order on a Redis connection, so when the oldest request has waited
/// longer than the command timeout the connection is presumed dead: shutting the socket
/// down fails every request on it, and the next operation connects again. Time the event
/// loop spent busy (a long JavaScript task: requests queued, answers unread) does not count
/// against the server: the wait counts from the end of such a stall.
fn watch_over(health: Arc<Health>, timeout_ms: u64) {
    let period = Duration::from_millis((timeout_ms / 4).clamp(10, 250));
    runtime().spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            if health.ended.load(Ordering::Acquire) {
                return;
            }
            let now = now_ms();
            let from = health
                .progress_ms
                .load(Ordering::Acquire)
                .max(LOOP_ACTIVITY.stall_end_ms());
            let since = now.saturating_sub(from);
            let ours = LOOP_ACTIVITY.busy_ms(now) > timeout_ms / 2;
            if health.in_flight.load(Ordering::Acquire) > 0 && since > timeout_ms && !ours {
                health.timed_out.store(true, Ordering::Release);
                let _ = health.sock.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
    });
}

#[derive(Clone)]
struct Connected {
    conn: LoopConn,
    health: Arc<Health>,
}

type Connecting = Shared<LocalBoxFuture<'static, Result<Connected, Error>>>;

enum State {
    Idle,
    Connecting(Connecting),
    Ready(Connected),
}

/// The connection of one adapter, made on first use and again after a failure.
pub(crate) struct Link {
    host: Rc<dyn EventLoop>,
    info: ConnectionInfo,
    /// Passwords, removed from every message.
    secrets: Vec<String>,
    connect_timeout_ms: u64,
    command_timeout_ms: u64,
    state: RefCell<State>,
}

/// A connection lent to one operation; it counts as in flight until dropped.
pub(crate) struct Lent {
    pub conn: LoopConn,
    health: Arc<Health>,
    _busy: Busy,
}

impl Link {
    /// A link for `info` when it names a plain TCP server; `None` otherwise (TLS, a Unix
    /// socket), which the I/O thread serves.
    pub fn new(
        host: Rc<dyn EventLoop>,
        info: ConnectionInfo,
        secrets: Vec<String>,
        connect_timeout_ms: u64,
        command_timeout_ms: u64,
    ) -> Option<Rc<Link>> {
        matches!(info.addr(), redis::ConnectionAddr::Tcp(..)).then(|| {
            Rc::new(Link {
                host,
                info,
                secrets,
                connect_timeout_ms,
                command_timeout_ms,
                state: RefCell::new(State::Idle),
            })
        })
    }

    /// The live connection, connecting first when there is none or it ended. Concurrent
    /// callers share one attempt; a failed attempt is not kept.
    pub async fn lend(self: &Rc<Self>) -> Result<Lent, Error> {
        let attempt = {
            let mut state = self.state.borrow_mut();
            match &*state {
                // A connection whose reader ended (the server closed it) is not lent: the
                // operation would fail on it for nothing.
                State::Ready(c) if !c.health.ended.load(Ordering::Acquire) => return Ok(lent(c)),
                State::Ready(_) | State::Idle => {
                    let f = self.clone().connect().boxed_local().shared();
                    *state = State::Connecting(f.clone());
                    f
                }
                State::Connecting(f) => f.clone(),
            }
        };
        let result = attempt.clone().await;
        let mut state = self.state.borrow_mut();
        if matches!(&*state, State::Connecting(f) if f.ptr_eq(&attempt)) {
            *state = match &result {
                Ok(c) => State::Ready(c.clone()),
                Err(_) => State::Idle,
            };
        }
        result.map(|c| lent(&c))
    }

    /// A failure of an operation on `lent`, as the caller should hear it: the watchdog
    /// closing a connection that stopped answering is a timeout, whatever the socket then
    /// reported. After an I/O failure or a timeout the connection is forgotten, and the next
    /// operation connects again.
    pub fn failed(&self, lent: &Lent, failure: Failure) -> Failure {
        let failure = if lent.health.timed_out.load(Ordering::Acquire) {
            let message = format!(
                "Redis did not answer within {} ms (commandTimeout); the connection was closed \
                 and the next operation reconnects",
                self.command_timeout_ms
            );
            Failure::new("redis", BackendErrorKind::Timeout, message)
        } else {
            failure
        };
        if matches!(
            failure.kind,
            BackendErrorKind::Io | BackendErrorKind::Timeout
        ) {
            self.reset(lent);
        }
        failure
    }

    fn reset(&self, lent: &Lent) {
        let mut state = self.state.borrow_mut();
        if matches!(&*state, State::Ready(c) if Arc::ptr_eq(&c.health, &lent.health)) {
            lent.health.end();
            let _ = lent.health.sock.shutdown(std::net::Shutdown::Both);
            *state = State::Idle;
        }
    }

    /// Drops the connection; its reader ends once the last request on it is answered.
    pub fn close(&self) {
        if let State::Ready(c) = std::mem::replace(&mut *self.state.borrow_mut(), State::Idle) {
            c.health.end();
            c.conn.close();
        }
    }

    async fn connect(self: Rc<Self>) -> Result<Connected, Error> {
        let redis::ConnectionAddr::Tcp(host, port) = self.info.addr().clone() else {
            return Err(Error::Internal("a loop link needs a TCP address".into()));
        };
        let timeout_ms = self.connect_timeout_ms;
        let started = Instant::now();
        let sock = Arc::new(tcp_connect(host, port, timeout_ms).await?);
        let watch = self
            .host
            .watch(sock.as_raw_fd())
            .map_err(|e| io_error(format!("watching the Redis socket: {e}")))?;
        let health = Arc::new(Health {
            sock: sock.clone(),
            in_flight: AtomicUsize::new(0),
            used: AtomicBool::new(false),
            timed_out: AtomicBool::new(false),
            progress_ms: AtomicU64::new(now_ms()),
            ended: AtomicBool::new(false),
        });
        let settings = self.info.redis_settings();
        let (conn, reader) = LoopConn::new(sock.clone(), watch, health.clone(), settings.db());
        let ended = health.clone();
        self.host.spawn(Box::pin(async move {
            reader.await;
            ended.end();
        }));
        // The handshake (AUTH, SELECT) gets what is left of the connect timeout.
        let deadline =
            io::sleep(Duration::from_millis(timeout_ms).saturating_sub(started.elapsed()));
        let setup = handshake(conn.clone(), settings);
        match first(setup, deadline).await {
            First::Left(r) => r.map_err(|e| failure_of(&self.secrets, e).into_error())?,
            First::Right(_) => {
                conn.close();
                let _ = sock.shutdown(std::net::Shutdown::Both);
                let message = format!("connecting to Redis did not finish within {timeout_ms} ms");
                return Err(Failure::new("redis", BackendErrorKind::Timeout, message).into_error());
            }
        };
        watch_over(health.clone(), self.command_timeout_ms);
        Ok(Connected { conn, health })
    }
}

impl Lent {
    /// True for the first operation on a new connection (which runs the connect checks).
    pub fn first_use(&self) -> bool {
        !self.health.used.swap(true, Ordering::AcqRel)
    }
}

fn lent(c: &Connected) -> Lent {
    Lent {
        conn: c.conn.clone(),
        health: c.health.clone(),
        _busy: c.health.busy(),
    }
}

/// What a new connection sends first: the credentials, then the database. It speaks RESP2,
/// so no `HELLO`.
async fn handshake(
    mut conn: LoopConn,
    settings: &redis::RedisConnectionInfo,
) -> Result<(), redis::RedisError> {
    if let Some(password) = settings.password() {
        let mut auth = redis::cmd("AUTH");
        if let Some(user) = settings.username() {
            auth.arg(user);
        }
        let mut answer = auth.arg(password).query_async::<()>(&mut conn).await;
        // A server before ACLs (Redis 5) takes a password only.
        if matches!(&answer, Err(e) if e.to_string().contains("wrong number of arguments")) {
            let mut auth = redis::cmd("AUTH");
            answer = auth.arg(password).query_async::<()>(&mut conn).await;
        }
        if let Err(e) = answer {
            if e.kind() != redis::ErrorKind::Io {
                let refused = (
                    redis::ErrorKind::AuthenticationFailed,
                    "Password authentication failed",
                );
                return Err(refused.into());
            }
            return Err(e);
        }
    }
    if settings.db() != 0 {
        let mut select = redis::cmd("SELECT");
        select
            .arg(settings.db())
            .query_async::<()>(&mut conn)
            .await?;
    }
    Ok(())
}

fn io_error(message: String) -> Error {
    Failure::new("redis", BackendErrorKind::Io, message).into_error()
}

/// Connects on the I/O thread, bounded by the connect timeout; answers a non-blocking socket.
async fn tcp_connect(host: String, port: u16, timeout_ms: u64) -> Result<TcpStream, Error> {
    io::run("redis", move |_| async move {
        let connect = tokio::net::TcpStream::connect((host.as_str(), port));
        match tokio::time::timeout(Duration::from_millis(timeout_ms), connect).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                s.into_std().map_err(|e| {
                    Failure::new("redis", BackendErrorKind::Io, format!("Redis socket: {e}"))
                })
            }
            Ok(Err(e)) => Err(Failure::new(
                "redis",
                BackendErrorKind::Io,
                format!("connecting to Redis at {host}:{port}: {e}"),
            )),
            Err(_) => Err(Failure::new(
                "redis",
                BackendErrorKind::Timeout,
                format!(
                    "connecting to Redis at {host}:{port} did not finish within {timeout_ms} ms"
                ),
            )),
        }
    })
    .await
}
