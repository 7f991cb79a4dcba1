//! The adapter's one etcd lease: the end this process reckons for it, how it is granted, and
//! the task that keeps it alive.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::shared::io::Failure;

use super::client::RESEND_PAUSE;
use super::failure::retryable;
use super::Inner;

/// The adapter's session: one lease, kept alive by one task.
pub(super) struct Session {
    pub(super) id: i64,
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

    pub(super) fn ends(&self) -> Instant {
        *self.ends.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An acknowledged beat: the lease lives on until `ends` at least.
    fn renewed(&self, ends: Instant) {
        let mut slot = self.ends.lock().unwrap_or_else(|p| p.into_inner());
        *slot = (*slot).max(ends);
    }

    pub(super) fn is_lost(&self) -> bool {
        *self.lost.borrow() || Instant::now() >= self.ends()
    }

    /// Marks the session lost: its locks are reported lost at once, and the next grant opens
    /// a new session.
    pub(super) fn end(&self) {
        let _ = self.lost.send(true);
    }

    /// Resolves once the session is lost: told so, or past its end on the clock.
    pub(super) async fn over(&self) {
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

impl Inner {
    /// The live session, opened (lease granted, keep-alive started) when there is none.
    pub(super) async fn session(self: &Arc<Self>) -> Result<Arc<Session>, Failure> {
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
