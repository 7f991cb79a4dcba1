//! A Redis connection whose I/O runs on the engine's thread, driven by the host's event loop
//! (see [`crate::EventLoop`]): no thread hop between a lock operation and its socket.
//!
//! Used for a plain-TCP standalone server. The `redis` crate still does the protocol: its
//! multiplexed connection runs over [`LoopStream`], and its driver is a task on the engine's
//! thread. Only the TCP connect goes through the I/O thread (it may resolve a name).

use std::cell::RefCell;
use std::io::Read;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::future::{FutureExt, LocalBoxFuture, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionInfo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::backend::io::{self, runtime, Failure};
use crate::backend::redis::failure::failure_of;
use crate::engine::error::{BackendErrorKind, Error};
use crate::engine::event_loop::{EventLoop, LoopActivity, SocketWatch, LOOP_ACTIVITY};
use crate::engine::task::{first, First};

/// A non-blocking socket read on the engine's thread; the host writes what it is sent.
struct LoopStream {
    // Declared first so it is dropped first, while the socket is still open.
    watch: Box<dyn SocketWatch>,
    sock: Arc<TcpStream>,
    /// What the watchdog knows: requests in flight, and when the server last sent anything.
    health: Arc<Health>,
    /// Where reads land first: the codec hands over uninitialised space, which would
    /// otherwise be zeroed on every read.
    scratch: Box<[u8]>,
    /// Polls since the last read, while the loop reports nothing to read.
    polls_since_read: u32,
}

/// See `poll_read`.
const READ_EVERY: u32 = 8;

// SAFETY: the `redis` crate asks for a `Send` stream because its drivers usually run on a
// thread pool. This one is created, polled and dropped on the engine's thread only: the
// connection and its driver never leave it (they are `Rc`-held or run by the host's `spawn`).
unsafe impl Send for LoopStream {}

impl AsyncRead for LoopStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        // The driver polls its stream whenever it is woken (once per request sent). A read
        // goes out when the loop saw bytes come in since the last one found none, and
        // otherwise on every READ_EVERY-th poll only: answers that arrive during a long turn
        // are still taken in it, which keeps a deep pipeline flowing.
        if !this.watch.may_read() {
            this.polls_since_read += 1;
            if this.polls_since_read < READ_EVERY {
                this.watch.wait_readable(cx);
                return Poll::Pending;
            }
        }
        this.polls_since_read = 0;
        let room = buf.remaining().min(this.scratch.len());
        loop {
            match (&*this.sock).read(&mut this.scratch[..room]) {
                Ok(n) => {
                    // Answers arriving, however slowly, show the server is alive, even while
                    // the operations they finish have not run yet.
                    if n > 0 {
                        this.health.progress_ms.store(now_ms(), Ordering::Release);
                    }
                    buf.put_slice(&this.scratch[..n]);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    this.watch.wait_readable(cx);
                    return Poll::Pending;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for LoopStream {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        // A lone request leaves at once (a sequential caller waits for nothing else); with
        // others in flight it joins this turn's write, and their answers are on the way.
        let this = self.get_mut();
        let now = this.health.in_flight.load(Ordering::Acquire) <= 1;
        Poll::Ready(this.watch.send(buf, now).map(|()| buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(self.sock.shutdown(std::net::Shutdown::Write))
    }
}

/// Milliseconds since a process-wide origin (the watchdog reads it on the I/O thread).
fn now_ms() -> u64 {
    LoopActivity::now_ms()
}

/// What the watchdog on the I/O thread knows of a connection.
struct Health {
    sock: Arc<TcpStream>,
    in_flight: AtomicUsize,
    /// Whether an operation has used the connection yet.
    used: AtomicBool,
    /// Whether the watchdog closed the connection for want of an answer.
    timed_out: AtomicBool,
    /// When the connection last received bytes or finished an operation, or got busy after
    /// being idle: answers come in order, so the oldest request written has waited since.
    progress_ms: AtomicU64,
    ended: AtomicBool,
}

impl Health {
    fn busy(self: &Arc<Self>) -> Busy {
        if self.in_flight.fetch_add(1, Ordering::AcqRel) == 0 {
            self.progress_ms.store(now_ms(), Ordering::Release);
        }
        Busy(self.clone())
    }

    fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }
}

/// One request in flight; an answer (or giving up on it) counts as progress.
struct Busy(Arc<Health>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.progress_ms.store(now_ms(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

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
    conn: MultiplexedConnection,
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
    pub conn: MultiplexedConnection,
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
                // A connection whose driver ended (the server closed it) is not lent: the
                // operation would fail on it for nothing.
                State::Ready(c) if !c.health.ended.load(Ordering::Acquire) => return Ok(lent(c)),
                State::Connecting(f) => f.clone(),
                State::Ready(_) | State::Idle => {
                    let f = self.clone().connect().boxed_local().shared();
                    *state = State::Connecting(f.clone());
                    f
                }
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

    /// Drops the connection; its driver ends once the last request on it is answered.
    pub fn close(&self) {
        if let State::Ready(c) = std::mem::replace(&mut *self.state.borrow_mut(), State::Idle) {
            c.health.end();
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
        let stream = LoopStream {
            watch,
            sock: sock.clone(),
            health: health.clone(),
            scratch: vec![0; 16 * 1024].into_boxed_slice(),
            polls_since_read: 0,
        };
        // Timeouts are ours (the watchdog, and the bound below): the crate's would need a
        // Tokio runtime on this thread.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(None)
            .set_response_timeout(None);
        let setup =
            MultiplexedConnection::new_with_config(self.info.redis_settings(), stream, config);
        // The handshake (HELLO, AUTH) gets what is left of the connect timeout.
        let deadline =
            io::sleep(Duration::from_millis(timeout_ms).saturating_sub(started.elapsed()));
        let (conn, driver) = match first(setup, deadline).await {
            First::Left(r) => r.map_err(|e| failure_of(&self.secrets, e).into_error())?,
            First::Right(_) => {
                let _ = sock.shutdown(std::net::Shutdown::Both);
                let message = format!("connecting to Redis did not finish within {timeout_ms} ms");
                return Err(Failure::new("redis", BackendErrorKind::Timeout, message).into_error());
            }
        };
        let ended = health.clone();
        self.host.spawn(Box::pin(async move {
            driver.await;
            ended.end();
        }));
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
