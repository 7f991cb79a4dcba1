//! The client, and how one request goes out: bounded by `requestTimeout`, sent again after an
//! election's or a dropped connection's failure.

use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, TlsOptions};

use crate::backend::shared::io::{self, Failure};
use crate::rt::error::BackendErrorKind;

use super::failure::{failure_of, not_sent, retryable, timeout_failure};
use super::Inner;

/// The pause before a request is sent again after an election's or a connection's failure:
/// an election takes a few hundred ms.
pub(super) const RESEND_PAUSE: Duration = Duration::from_millis(50);

impl Inner {
    fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.options.request_timeout_ms)
    }

    /// One request, bounded by `requestTimeout`, sent again after a failure that an election
    /// or a dropped connection gives (see [`retryable`]).
    pub(super) async fn bounded<T, F>(
        &self,
        what: &str,
        send: impl FnMut() -> F,
    ) -> Result<T, Failure>
    where
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        self.bounded_while(what, None, send).await
    }

    /// [`Inner::bounded`] for a grant: sent again only while the engine still wants it, since
    /// one that leaves after the engine gave it up lands after the release of its token.
    pub(super) async fn bounded_while<T, F>(
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

    pub(super) async fn client(&self) -> Result<Client, Failure> {
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
}
