//! Redlock: one lock over several independent Redis servers (no replication between them),
//! granted when a majority of them grant it.
//!
//! Each server is an ordinary [`RedisBackend`] (its connection, scripts, timeouts, TLS and
//! failure mapping); this backend only fans every verb out to all of them at once, bounds each
//! server's answer by a short per-server timeout, and counts the votes:
//!
//! - a **yes** is "granted / released / extended / held by our token",
//! - a **no** is the server's answer that the key is not ours (held by another, or absent),
//! - a **failure** is an error or no answer within the per-server timeout.
//!
//! With `n` servers and a quorum `q = n / 2 + 1`, the verdict is:
//! - *yes* when at least `q` servers said yes;
//! - *no* when more than `n - q` said no: then no majority could say yes whatever the failed
//!   servers would have answered, so the "no" is proven (contention, for an acquire);
//! - otherwise, a *failure* ([`Error::Backend`]): the failed servers could have changed the
//!   outcome. A backend failure is never reported as contention unless contention is proven.
//!
//! Time. The engine starts a lease when its request leaves and ends it 1% of the TTL early (see
//! [`crate::rt::clock::lease_end`]). Redlock's own validity rule, `ttl - elapsed - drift > 0`, is checked
//! on top, with `drift = ttl / 100 + 2 ms`. The servers are asked for `ttl + drift`: each
//! server's key is set no earlier than the request left, so it outlives the engine's local
//! lease (which ends at `sent + 0.99 ttl`) by more than the drift, even on a server whose clock
//! runs 1% fast. The engine's clock rule is thereby kept as it is for one server.

use std::cell::{Cell, RefCell};
use std::future::Future;

use futures_util::future::{FutureExt, LocalBoxFuture, Shared};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Instant;

use crate::backend::redis::{RedisBackend, RedisOptions, Seen};
use crate::contract::{Backend, GivenUp, KeyInfo, Op};
use crate::rt::error::{BackendErrorKind, Error, Result};
use crate::rt::event_loop::EventLoop;
#[cfg(unix)]
use crate::rt::task::{LocalFuture, Spawn};
use crate::rt::timer::{LocalTimer, Sleep, ThreadTimer, Timer};

/// Fewer servers than this cannot survive the loss of one of them.
pub const MIN_SERVERS: usize = 3;

/// The per-server timeout when none is given: an upper bound; an acquire or extension also
/// waits at most a tenth of its TTL for each server.
pub const DEFAULT_SERVER_TIMEOUT_MS: u64 = 250;

/// The votes needed out of `n` servers.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// The clock drift allowed for a lease of `ttl` ms: 1% of it (rounded up) plus 2 ms.
pub fn drift_ms(ttl: u32) -> u32 {
    ttl.div_ceil(100).saturating_add(2)
}

/// The lease each server is asked for: the TTL plus the drift, so the servers' keys outlive the
/// engine's local lease (see the module's notes).
pub fn server_ttl(ttl: u32) -> u32 {
    ttl.saturating_add(drift_ms(ttl))
}

/// What is left of a lease of `ttl` ms after `elapsed_ms`, less the drift. Only a positive
/// validity is a lock.
pub fn validity_ms(ttl: u32, elapsed_ms: f64) -> f64 {
    ttl as f64 - elapsed_ms - drift_ms(ttl) as f64
}

/// How long to wait for each server in an operation with a lease of `ttl` ms (`None`: a
/// release or a check): `limit`, cut to a tenth of the TTL (a short TTL gets up to a third of
/// it, at most 50 ms, so a busy machine does not turn every short lease into timeouts), at
/// least 1 ms.
pub fn per_server_timeout(limit: u64, ttl: Option<u32>) -> u64 {
    let fraction = |t: u64| (t / 10).max((t / 3).min(50));
    let cut = ttl.map_or(limit, |t| limit.min(fraction(t as u64)));
    cut.max(1)
}

/// The verdict of a set of votes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Yes,
    No,
    /// Too many failures to tell.
    Failed,
}

/// Votes counted so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    pub servers: usize,
    pub yes: usize,
    pub no: usize,
    pub failed: usize,
}

impl Tally {
    pub fn new(servers: usize) -> Self {
        Tally {
            servers,
            ..Tally::default()
        }
    }

    fn pending(&self) -> usize {
        self.servers - self.yes - self.no - self.failed
    }

    /// The verdict once it cannot change any more, whatever the servers still to answer say.
    pub fn verdict(&self) -> Option<Verdict> {
        let q = quorum(self.servers);
        if self.yes >= q {
            Some(Verdict::Yes)
        } else if self.no > self.servers - q {
            Some(Verdict::No)
        } else if self.pending() == 0 {
            Some(Verdict::Failed)
        } else {
            None
        }
    }
}

/// How to reach the servers.
#[derive(Debug, Clone)]
pub struct RedlockOptions {
    /// One set of options per independent server (each standalone: one URL, no Cluster).
    pub servers: Vec<RedisOptions>,
    /// The longest wait for any one server's answer, ms. Default
    /// [`DEFAULT_SERVER_TIMEOUT_MS`]; an acquire or extension also waits at most ttl / 10.
    pub server_timeout_ms: u64,
}

impl RedlockOptions {
    pub fn new(urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        RedlockOptions {
            servers: urls.into_iter().map(RedisOptions::new).collect(),
            server_timeout_ms: DEFAULT_SERVER_TIMEOUT_MS,
        }
    }
}

/// Locks over several independent Redis servers, granted by a majority (Redlock).
#[derive(Clone)]
pub struct RedlockBackend {
    servers: Rc<Vec<RedisBackend>>,
    /// `host:port` of each server, for messages (never a password).
    labels: Rc<Vec<String>>,
    server_timeout_ms: u64,
    /// Runs the answers nobody waits for any more (a server that answers after the verdict).
    host: Option<Rc<dyn EventLoop>>,
    /// Those answers still due, which [`RedlockBackend::drained`] waits for.
    late: Rc<Late>,
    /// The deadlines of rounds, on the host's thread.
    timer: Option<LocalTimer>,
    gate: Rc<Gate>,
}

/// The work left to the host after a verdict (answers of slower servers, give-backs): a
/// release resolves at a majority, but the process that closes the adapter next (a command
/// line run that then exits) must not cut the rest off, or a minority keeps the key until its
/// lease ends.
#[derive(Default)]
struct Late {
    running: Cell<usize>,
    wakers: RefCell<Vec<Waker>>,
}

impl Late {
    fn run(self: &Rc<Self>, host: &Rc<dyn EventLoop>, work: impl Future<Output = ()> + 'static) {
        self.running.set(self.running.get() + 1);
        let late = self.clone();
        host.spawn(Box::pin(async move {
            work.await;
            late.running.set(late.running.get() - 1);
            if late.running.get() == 0 {
                late.wakers.take().into_iter().for_each(Waker::wake);
            }
        }));
    }

    async fn drained(&self) {
        std::future::poll_fn(|cx| {
            if self.running.get() == 0 {
                return Poll::Ready(());
            }
            self.wakers.borrow_mut().push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

/// The first connection to every server (see [`RedlockBackend::opened`]).
#[derive(Default)]
struct Gate {
    open: Cell<bool>,
    waiting: RefCell<Option<Connecting>>,
}

type Connecting = Shared<LocalBoxFuture<'static, Vec<Result<Option<String>>>>>;

/// The part of a URL after the credentials and before the path: `host:port`.
fn label_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest).to_owned()
}

/// Polls `ops` until they have all answered or `deadline` passes; the answers are dropped.
async fn settle<T>(ops: Vec<Op<T>>, mut deadline: Sleep) {
    let mut ops: Vec<Option<Op<T>>> = ops.into_iter().map(Some).collect();
    std::future::poll_fn(|cx| {
        for slot in ops.iter_mut() {
            if let Some(op) = slot {
                if Pin::new(op).poll(cx).is_ready() {
                    *slot = None;
                }
            }
        }
        if ops.iter().all(Option::is_none) || deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        Poll::Pending
    })
    .await
}

/// The host's event loop as the engine's spawner (for the thread-local timer).
#[cfg(unix)]
struct HostSpawn(Rc<dyn EventLoop>);

#[cfg(unix)]
impl Spawn for HostSpawn {
    fn spawn(&self, task: LocalFuture<()>) {
        self.0.spawn(task);
    }
}

impl RedlockBackend {
    pub fn new(options: RedlockOptions) -> Result<Self> {
        let n = options.servers.len();
        if n < MIN_SERVERS {
            return Err(Error::validation(
                "urls",
                format!(
                    "Redlock needs at least {MIN_SERVERS} independent Redis servers (an odd number \
                     such as 3 or 5 is best), got {n}"
                ),
            ));
        }
        if options.server_timeout_ms == 0 {
            return Err(Error::validation("serverTimeout", "must be at least 1 ms"));
        }
        let mut labels = Vec::with_capacity(n);
        let mut servers = Vec::with_capacity(n);
        for (i, mut o) in options.servers.into_iter().enumerate() {
            if o.urls.len() != 1 || o.cluster {
                return Err(Error::validation(
                    "urls",
                    "each Redlock server is one standalone Redis URL (not a Cluster)",
                ));
            }
            let label = label_of(&o.urls[0]);
            if labels.contains(&label) {
                return Err(Error::validation(
                    "urls",
                    format!(
                        "{label} is given twice: Redlock's servers must be independent (urls[{i}])"
                    ),
                ));
            }
            o.wait_for_replicas = None;
            let backend = RedisBackend::new(o).map_err(|e| match e {
                Error::Validation { message, .. } => {
                    Error::validation(format!("urls[{i}]"), message)
                }
                other => other,
            })?;
            labels.push(label);
            servers.push(backend);
        }
        Ok(RedlockBackend {
            servers: Rc::new(servers),
            labels: Rc::new(labels),
            server_timeout_ms: options.server_timeout_ms,
            host: None,
            late: Rc::default(),
            timer: None,
            gate: Rc::default(),
        })
    }

    /// Sends each server's warning found at connect to `sink` (see [`RedisBackend::on_warning`]).
    pub fn on_warning(&mut self, sink: Rc<dyn Fn(String)>) {
        let servers = Rc::make_mut(&mut self.servers);
        servers.iter_mut().for_each(|s| s.on_warning(sink.clone()));
    }

    /// Lets the host's event loop drive each server's connection (see
    /// [`RedisBackend::on_event_loop`]), and run the answers that come after a verdict.
    #[cfg(unix)]
    pub fn on_event_loop(&mut self, host: Rc<dyn EventLoop>) {
        let servers = Rc::make_mut(&mut self.servers);
        servers
            .iter_mut()
            .for_each(|s| s.on_event_loop(host.clone()));
        let spawn: Rc<dyn Spawn> = Rc::new(HostSpawn(host.clone()));
        self.timer = Some(LocalTimer::new(Rc::new(ThreadTimer), spawn));
        self.host = Some(host);
    }

    /// How many servers, and how many votes a verdict needs.
    pub fn servers(&self) -> (usize, usize) {
        (self.servers.len(), quorum(self.servers.len()))
    }

    /// Connects to every server now; answers the first warning found (see
    /// [`RedisBackend::connect`]).
    pub fn connect(&self) -> Op<Option<String>> {
        let gate = self.opened();
        Op::pending(async move {
            let Some(gate) = gate else { return Ok(None) };
            let answers = gate.await;
            let mut warning = None;
            let mut failure = None;
            let mut connected = false;
            for a in answers {
                match a {
                    Ok(w) => {
                        connected = true;
                        warning = warning.or(w);
                    }
                    Err(e) => failure = failure.or(Some(e)),
                }
            }
            match (connected, failure) {
                (false, Some(e)) => Err(e),
                _ => Ok(warning),
            }
        })
    }

    /// The first connection to every server, which every operation waits for (bounded by the
    /// per-server timeout) until it has happened: requests then reach each server in the order
    /// they were made, so callers racing for one key on a fresh adapter meet the same winner on
    /// every server instead of splitting the vote. `None` once it happened.
    fn opened(&self) -> Option<Connecting> {
        if self.gate.open.get() {
            return None;
        }
        let mut waiting = self.gate.waiting.borrow_mut();
        let shared = waiting.get_or_insert_with(|| {
            let ops: Vec<_> = self.servers.iter().map(RedisBackend::connect).collect();
            let (gate, deadline) = (self.gate.clone(), self.deadline(self.server_timeout_ms));
            let n = ops.len();
            async move {
                let mut slots: Vec<Option<Op<Option<String>>>> =
                    ops.into_iter().map(Some).collect();
                let mut answers: Vec<Result<Option<String>>> = (0..n).map(|_| Ok(None)).collect();
                let mut deadline = deadline;
                std::future::poll_fn(|cx| {
                    for (i, slot) in slots.iter_mut().enumerate() {
                        if let Some(op) = slot {
                            if let Poll::Ready(a) = Pin::new(op).poll(cx) {
                                answers[i] = a;
                                *slot = None;
                            }
                        }
                    }
                    let done = slots.iter().all(Option::is_none);
                    if done || deadline.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(());
                    }
                    Poll::Pending
                })
                .await;
                gate.open.set(true);
                gate.waiting.borrow_mut().take();
                answers
            }
            .boxed_local()
            .shared()
        });
        Some(shared.clone())
    }

    /// Drops every server's connections; operations after this fail.
    pub fn close(&self) {
        self.servers.iter().for_each(RedisBackend::close);
    }

    /// Resolves once the answers still due after earlier verdicts have come or timed out
    /// (each bounded by its round's deadline): what `close` waits for before it closes.
    pub fn drained(&self) -> Op<()> {
        let late = self.late.clone();
        Op::pending(async move {
            late.drained().await;
            Ok(())
        })
    }

    /// One deadline for a round: on the engine thread's own timer when the host runs one
    /// (registering it is then a map insert, no lock and no wake-up of the timer thread).
    fn deadline(&self, ms: u64) -> Sleep {
        match &self.timer {
            Some(t) => t.sleep(ms as f64),
            None => ThreadTimer.sleep(ms as f64),
        }
    }

    /// Sends `op` to every server and counts the votes until the verdict cannot change, each
    /// server bounded by `timeout_ms` (one deadline for the round). The answers still due after
    /// the verdict are left to the host's event loop, under the same deadline (or awaited here
    /// without one). Fails, sending nothing, when `given_up` is set before the requests leave
    /// (they wait for the first connections; see [`GivenUp`]).
    fn vote<T: 'static>(
        &self,
        timeout_ms: u64,
        op: impl Fn(&RedisBackend) -> Op<T> + 'static,
        yes: impl Fn(&T) -> bool + 'static,
        given_up: Option<GivenUp>,
    ) -> impl Future<Output = Result<Ballot<T>>> + 'static {
        let labels = self.labels.clone();
        let host = self.host.clone();
        let (gate, this) = (self.opened(), self.clone());
        async move {
            if let Some(gate) = gate {
                gate.await;
            }
            if given_up.as_ref().is_some_and(GivenUp::get) {
                return Err(Error::backend(
                    "redis",
                    BackendErrorKind::Timeout,
                    "given up before the Redlock servers were connected; nothing was sent",
                ));
            }
            let mut slots: Vec<Option<Op<T>>> = this.servers.iter().map(|s| Some(op(s))).collect();
            let mut deadline = this.deadline(timeout_ms);
            let n = slots.len();
            let mut ballot = Ballot {
                tally: Tally::new(n),
                answers: (0..n).map(|_| None).collect(),
            };
            let early = host.is_some();
            std::future::poll_fn(|cx| {
                for (i, slot) in slots.iter_mut().enumerate() {
                    let Some(fut) = slot else { continue };
                    if let Poll::Ready(answer) = Pin::new(fut).poll(cx) {
                        *slot = None;
                        match &answer {
                            Ok(v) if yes(v) => ballot.tally.yes += 1,
                            Ok(_) => ballot.tally.no += 1,
                            Err(_) => ballot.tally.failed += 1,
                        }
                        ballot.answers[i] = Some(answer);
                    }
                }
                if ballot.tally.pending() == 0 || (early && ballot.tally.verdict().is_some()) {
                    return Poll::Ready(());
                }
                if deadline.as_mut().poll(cx).is_ready() {
                    for (i, slot) in slots.iter_mut().enumerate() {
                        if slot.take().is_some() {
                            ballot.tally.failed += 1;
                            ballot.answers[i] = Some(Err(Error::backend(
                                "redis",
                                BackendErrorKind::Timeout,
                                format!(
                                    "server {} of {n} ({}) did not answer within {timeout_ms} ms",
                                    i + 1,
                                    labels[i]
                                ),
                            )));
                        }
                    }
                    return Poll::Ready(());
                }
                Poll::Pending
            })
            .await;
            let late: Vec<Op<T>> = slots.into_iter().flatten().collect();
            if let (Some(host), false) = (host, late.is_empty()) {
                this.late.run(&host, settle(late, deadline));
            }
            Ok(ballot)
        }
    }

    /// Releases on every server that did not answer "held by another" (fire and forget when
    /// the host runs it; awaited, bounded, otherwise), for a grant that is not a lock.
    fn give_back(&self, key: &str, token: &str, answers: &[Option<Result<bool>>]) -> Op<()> {
        let ops: Vec<_> = self
            .servers
            .iter()
            .zip(answers)
            .filter(|(_, a)| !matches!(a, Some(Ok(false))))
            .map(|(s, _)| s.release(key, token))
            .collect();
        let work = settle(ops, self.deadline(self.server_timeout_ms));
        match &self.host {
            Some(host) => {
                self.late.run(host, work);
                Op::ready(Ok(()))
            }
            None => Op::pending(async move {
                work.await;
                Ok(())
            }),
        }
    }

    /// The error for a verdict that failed: how the servers voted, and why those that failed
    /// did.
    fn failure(&self, what: &str, ballot: &Ballot<bool>, words: (&str, &str)) -> Error {
        let t = ballot.tally;
        let mut kinds = ballot.answers.iter().filter_map(|a| match a {
            Some(Err(Error::Backend { kind, .. })) => Some(*kind),
            _ => None,
        });
        let first_kind = kinds.next().unwrap_or(BackendErrorKind::Other);
        let kind = if kinds.all(|k| k == first_kind) {
            first_kind
        } else {
            BackendErrorKind::Other
        };
        let reasons: Vec<String> = ballot
            .answers
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a {
                Some(Err(e)) => Some(format!("{}: {e}", self.labels[i])),
                None => Some(format!("{}: no answer", self.labels[i])),
                _ => None,
            })
            .collect();
        let message = format!(
            "{what}: no majority ({} of {}) of the Redlock servers answered in agreement: {} {}, \
             {} {}, {} failed ({})",
            quorum(t.servers),
            t.servers,
            t.yes,
            words.0,
            t.no,
            words.1,
            t.failed + t.pending(),
            reasons.join("; ")
        );
        Error::backend("redis", kind, message)
    }

    /// A ballot's answer: a non-backend error of any server (a bad key) first, then the verdict.
    fn decide(&self, what: &str, ballot: &Ballot<bool>, words: (&str, &str)) -> Result<Verdict> {
        for a in ballot.answers.iter().flatten() {
            if let Err(e @ (Error::Validation { .. } | Error::Internal(_))) = a {
                return Err(e.clone());
            }
        }
        match ballot.tally.verdict() {
            Some(Verdict::Failed) | None => Err(self.failure(what, ballot, words)),
            Some(v) => Ok(v),
        }
    }

    /// An acquire or extension of a lease of `ttl` ms: the verdict, and whether it came in time.
    fn leased(
        &self,
        what: &'static str,
        key: &str,
        token: &str,
        ttl: u32,
        op: impl Fn(&RedisBackend, &str, &str, u32) -> Op<bool> + 'static,
        give_back: bool,
    ) -> Op<bool> {
        let started = Instant::now();
        let px = server_ttl(ttl);
        let timeout_ms = per_server_timeout(self.server_timeout_ms, Some(ttl));
        let (k, t) = (key.to_owned(), token.to_owned());
        let given_up = GivenUp::default();
        let ballot = self.vote(
            timeout_ms,
            move |s| op(s, &k, &t, px),
            |granted| *granted,
            Some(given_up.clone()),
        );
        let (this, key, token) = (self.clone(), key.to_owned(), token.to_owned());
        Op::pending(async move {
            // Nothing sent, nothing to give back.
            let ballot = ballot.await?;
            let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
            let words = if give_back {
                ("granted", "held by another holder")
            } else {
                ("extended", "not ours")
            };
            let verdict = this.decide(&format!("{what} of {key:?}"), &ballot, words);
            let answer = match verdict {
                Ok(Verdict::Yes) if validity_ms(ttl, elapsed_ms) > 0.0 => return Ok(true),
                Ok(Verdict::Yes) => Err(Error::backend(
                    "redis",
                    BackendErrorKind::Timeout,
                    format!(
                        "{what} of {key:?}: a majority of the Redlock servers agreed, but only after \
                         {elapsed_ms:.0} ms, past the lease's validity (ttl {ttl} ms less the drift \
                         of {} ms)",
                        drift_ms(ttl)
                    ),
                )),
                Ok(_) => Ok(false),
                // Held on some servers, not on enough to prove it with others silent: the
                // engine tries again within its budget rather than failing at once.
                Err(mut e) if give_back && ballot.tally.no > 0 => {
                    if let Error::Backend { held_in_part, .. } = &mut e {
                        *held_in_part = true;
                    }
                    Err(e)
                }
                Err(e) => Err(e),
            };
            if give_back {
                let _ = this.give_back(&key, &token, &ballot.answers).await;
            }
            answer
        })
        .given_up_by(given_up)
    }

    /// A release or check: a majority's answer, or a failure.
    fn counted(
        &self,
        what: &'static str,
        key: &str,
        op: impl Fn(&RedisBackend) -> Op<bool> + 'static,
        words: (&'static str, &'static str),
    ) -> Op<bool> {
        let timeout_ms = per_server_timeout(self.server_timeout_ms, None);
        let ballot = self.vote(timeout_ms, op, |yes| *yes, None);
        let (this, key) = (self.clone(), key.to_owned());
        Op::pending(async move {
            let ballot = ballot.await?;
            let verdict = this.decide(&format!("{what} of {key:?}"), &ballot, words)?;
            Ok(verdict == Verdict::Yes)
        })
    }
}

/// The answers of one fan-out, by server (`None`: still due when the verdict came).
struct Ballot<T> {
    tally: Tally,
    answers: Vec<Option<Result<T>>>,
}

impl Backend for RedlockBackend {
    fn name(&self) -> &str {
        "redlock"
    }

    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        self.leased(
            "acquire",
            key,
            token,
            ttl,
            |s, k, t, px| s.acquire(k, t, px),
            true,
        )
    }

    fn release(&self, key: &str, token: &str) -> Op<bool> {
        let (k, t) = (key.to_owned(), token.to_owned());
        self.counted(
            "release",
            key,
            move |s| s.release(&k, &t),
            ("released", "not ours"),
        )
    }

    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        self.leased(
            "extend",
            key,
            token,
            ttl,
            |s, k, t, px| s.extend(k, t, px),
            false,
        )
    }

    fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        let (k, t) = (key.to_owned(), token.to_owned());
        self.counted(
            "isHeld",
            key,
            move |s| s.is_held(&k, &t),
            ("held by us", "not ours"),
        )
    }

    fn no_fencing_reason(&self) -> Option<String> {
        Some(
            "Redlock cannot hand out fencing tokens: its servers are independent, so no counter \
             keeps growing across a change of majority. Use the PostgreSQL or etcd backend for \
             fencing tokens"
                .into(),
        )
    }

    fn acquire_fenced(&self, _key: &str, _token: &str, _ttl: u32) -> Op<Option<u64>> {
        let reason = self.no_fencing_reason().unwrap_or_default();
        Op::ready(Err(Error::validation("fencing", reason)))
    }
    /// Every server's view; the key is held when a quorum of servers hold one value (see
    /// [`merged`]). Fewer than a quorum of answers is the first server's failure.
    fn inspect(&self, key: &str) -> Op<KeyInfo> {
        let ops: Vec<_> = self.servers.iter().map(|s| s.seen(key)).collect();
        let (key, n) = (key.to_owned(), self.servers.len());
        Op::pending(async move {
            let answers = answered(futures_util::future::join_all(ops).await, n)?;
            Ok(merged(key, answers.iter().collect(), n).0)
        })
    }

    /// Every server's list, each key kept when a quorum of servers hold one value.
    fn list(&self, prefix: &str, limit: u32) -> Op<Vec<KeyInfo>> {
        // Each server may list keys the others do not: each lists them all.
        let ops: Vec<_> = self
            .servers
            .iter()
            .map(|s| s.seen_under(prefix, u32::MAX))
            .collect();
        let n = self.servers.len();
        Op::pending(async move {
            let lists = answered(futures_util::future::join_all(ops).await, n)?;
            let mut by_key: std::collections::BTreeMap<&str, Vec<&Seen>> = Default::default();
            lists
                .iter()
                .flatten()
                .for_each(|s| by_key.entry(&s.info.key).or_default().push(s));
            Ok(by_key
                .into_iter()
                .map(|(k, seen)| merged(k.to_owned(), seen, n).0)
                .filter(|i| i.held)
                .take(limit as usize)
                .collect())
        })
    }

    /// Removes what `inspect` shows: the value a quorum of servers hold, from every server
    /// that holds it (each by the same test of a lock as a single server's forced release).
    /// `false`, touching nothing, when no quorum holds one value: the fragments of a split
    /// vote end with their leases. Fewer than a quorum of answers is a failure (the key may
    /// still be held on a quorum).
    fn force_release(&self, key: &str) -> Op<bool> {
        let ops: Vec<_> = self.servers.iter().map(|s| s.seen(key)).collect();
        let (this, key, n) = (self.clone(), key.to_owned(), self.servers.len());
        Op::pending(async move {
            let answers = answered(futures_util::future::join_all(ops).await, n)?;
            let Some(value) = merged(key.clone(), answers.iter().collect(), n).1 else {
                return Ok(false);
            };
            let ops: Vec<_> = this
                .servers
                .iter()
                .map(|s| s.force_release_value(&key, Some(&value)))
                .collect();
            let removed = answered(futures_util::future::join_all(ops).await, n)?;
            Ok(removed.iter().any(Option::is_some))
        })
    }
}

/// The answers, when at least a quorum of the `n` servers gave one; else the first failure.
fn answered<T>(all: Vec<Result<T, Error>>, n: usize) -> Result<Vec<T>, Error> {
    let mut first = None;
    let mut ok = Vec::with_capacity(all.len());
    for r in all {
        match r {
            Ok(v) => ok.push(v),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    match first {
        Some(e) if ok.len() < quorum(n) => Err(e),
        _ => Ok(ok),
    }
}

/// One key as `n` servers see it (`seen`: the answers that mention it), and the value a
/// quorum agree on. Held means a quorum of servers hold one value (one token, one label) with
/// a live lease: servers holding different tokens (a split vote) are no lock, whatever each
/// says. The holder is that value's; the time left is the quorum-th longest lease among the
/// servers that agree, when fewer than a quorum will still hold it.
fn merged(key: String, seen: Vec<&Seen>, n: usize) -> (KeyInfo, Option<String>) {
    let mut by_value: std::collections::BTreeMap<&str, Vec<&KeyInfo>> = Default::default();
    for s in seen {
        if let (true, Some(v)) = (s.info.held, &s.value) {
            by_value.entry(v).or_default().push(&s.info);
        }
    }
    // A strict majority: at most one value has one.
    let Some((value, mut agree)) = by_value.into_iter().find(|(_, a)| a.len() >= quorum(n)) else {
        return (
            KeyInfo {
                key,
                ..KeyInfo::default()
            },
            None,
        );
    };
    agree.sort_by(|a, b| {
        b.ttl_left
            .unwrap_or(0.0)
            .total_cmp(&a.ttl_left.unwrap_or(0.0))
    });
    let info = KeyInfo {
        key,
        held: true,
        ttl_left: agree[quorum(n) - 1].ttl_left,
        fence: None,
        holder: agree[0].holder.clone(),
    };
    (info, Some(value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(servers: usize, yes: usize, no: usize, failed: usize) -> Tally {
        Tally {
            servers,
            yes,
            no,
            failed,
        }
    }

    #[test]
    fn a_quorum_is_a_strict_majority() {
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
        assert_eq!(quorum(7), 4);
    }

    #[test]
    fn a_majority_of_yes_wins_even_with_failures() {
        assert_eq!(tally(5, 3, 0, 2).verdict(), Some(Verdict::Yes));
        assert_eq!(tally(5, 3, 2, 0).verdict(), Some(Verdict::Yes));
        assert_eq!(tally(3, 2, 0, 0).verdict(), Some(Verdict::Yes));
        // Decided before the last servers answer.
        assert_eq!(tally(5, 3, 0, 0).verdict(), Some(Verdict::Yes));
    }

    #[test]
    fn no_is_proven_only_when_the_failed_servers_could_not_have_changed_it() {
        // A majority held by another: contention, whatever the rest say.
        assert_eq!(tally(5, 0, 3, 0).verdict(), Some(Verdict::No));
        assert_eq!(tally(5, 1, 3, 1).verdict(), Some(Verdict::No));
        // 2 granted, 1 held, 2 down: the 2 down could have granted, so not contention.
        assert_eq!(tally(5, 2, 1, 2).verdict(), Some(Verdict::Failed));
        // A split vote with one server down: not proven either.
        assert_eq!(tally(5, 2, 2, 1).verdict(), Some(Verdict::Failed));
        // Every server answered and no majority granted: proven.
        assert_eq!(tally(5, 2, 3, 0).verdict(), Some(Verdict::No));
        // With an even count, half the servers held is enough to make a grant impossible.
        assert_eq!(tally(4, 2, 2, 0).verdict(), Some(Verdict::No));
        assert_eq!(tally(4, 0, 2, 2).verdict(), Some(Verdict::No));
        assert_eq!(tally(4, 1, 1, 2).verdict(), Some(Verdict::Failed));
    }

    #[test]
    fn servers_down_are_a_failure_never_contention() {
        assert_eq!(tally(5, 0, 0, 5).verdict(), Some(Verdict::Failed));
        assert_eq!(tally(5, 2, 0, 3).verdict(), Some(Verdict::Failed));
        assert_eq!(tally(3, 1, 0, 2).verdict(), Some(Verdict::Failed));
        assert_eq!(tally(3, 0, 1, 2).verdict(), Some(Verdict::Failed));
    }

    #[test]
    fn the_verdict_waits_while_pending_answers_could_change_it() {
        assert_eq!(tally(5, 2, 0, 0).verdict(), None);
        assert_eq!(tally(5, 2, 2, 0).verdict(), None);
        assert_eq!(tally(5, 0, 2, 2).verdict(), None);
    }

    #[test]
    fn drift_and_validity() {
        assert_eq!(drift_ms(1000), 12);
        assert_eq!(drift_ms(30_000), 302);
        assert_eq!(drift_ms(1), 3);
        assert_eq!(server_ttl(1000), 1012);
        assert_eq!(server_ttl(u32::MAX), u32::MAX);
        assert_eq!(validity_ms(1000, 0.0), 988.0);
        assert_eq!(validity_ms(1000, 500.0), 488.0);
        assert!(validity_ms(1000, 988.0) <= 0.0);
        assert!(validity_ms(10, 0.0) > 0.0);
    }

    #[test]
    fn the_servers_keys_outlive_the_engines_lease() {
        // A key set when the request left, on a server whose clock runs 1% fast, still ends
        // after the engine's local lease does.
        for ttl in [1u32, 10, 100, 1000, 30_000, 86_400_000] {
            let local_end = crate::rt::clock::lease_end(0.0, ttl);
            let server_end_on_our_clock = server_ttl(ttl) as f64 * 0.99;
            assert!(server_end_on_our_clock > local_end, "ttl {ttl}");
            // And Redlock's validity is never longer than the engine's lease.
            assert!(validity_ms(ttl, 0.0) <= local_end);
        }
    }

    #[test]
    fn per_server_timeouts_are_a_fraction_of_the_ttl() {
        assert_eq!(per_server_timeout(250, Some(10_000)), 250);
        assert_eq!(per_server_timeout(250, Some(1000)), 100);
        assert_eq!(per_server_timeout(250, Some(100)), 33);
        assert_eq!(per_server_timeout(250, Some(300)), 50);
        assert_eq!(per_server_timeout(250, Some(5)), 1);
        assert_eq!(per_server_timeout(250, None), 250);
    }

    fn seen(value: &str, ttl: f64) -> Seen {
        Seen {
            info: KeyInfo {
                key: "k".into(),
                held: true,
                ttl_left: Some(ttl),
                fence: None,
                holder: crate::contract::value::holder_of(value),
            },
            value: Some(value.into()),
        }
    }

    #[test]
    fn a_split_vote_is_no_lock() {
        let answers = [seen("a", 9000.0), seen("b", 9000.0), seen("c", 9000.0)];
        let (info, value) = merged("k".into(), answers.iter().collect(), 3);
        assert!(!info.held);
        assert_eq!((info.holder, info.ttl_left, value), (None, None, None));
    }

    #[test]
    fn the_holder_and_time_left_are_the_agreeing_quorums() {
        let a = "t1|locco:holder=A";
        let answers = [
            seen(a, 10_000.0),
            seen(a, 9000.0),
            seen(a, 8000.0),
            seen(a, 2000.0),
            seen("t2|locco:holder=B", 30_000.0),
        ];
        let (info, value) = merged("k".into(), answers.iter().collect(), 5);
        assert!(info.held);
        assert_eq!(info.holder.as_deref(), Some("A"));
        // The third longest of the four that agree: when fewer than three still hold it.
        assert_eq!(info.ttl_left, Some(8000.0));
        assert_eq!(value.as_deref(), Some(a));
    }

    #[test]
    fn labels_carry_no_password() {
        assert_eq!(
            label_of("redis://u:secret@10.0.0.1:6379/0"),
            "10.0.0.1:6379"
        );
        assert_eq!(label_of("rediss://h:7000"), "h:7000");
    }

    #[test]
    fn too_few_or_repeated_servers_are_refused() {
        let err =
            |urls: &[&str]| match RedlockBackend::new(RedlockOptions::new(urls.iter().copied())) {
                Err(Error::Validation { field, .. }) => field,
                _ => panic!("accepted {urls:?}"),
            };
        assert_eq!(err(&["redis://a:1", "redis://b:1"]), "urls");
        assert_eq!(err(&["redis://a:1", "redis://b:1", "redis://a:1"]), "urls");
        assert!(RedlockBackend::new(RedlockOptions::new([
            "redis://a:1",
            "redis://b:1",
            "redis://c:1"
        ]))
        .is_ok());
    }
}
