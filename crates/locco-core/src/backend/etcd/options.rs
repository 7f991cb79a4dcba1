//! How to reach etcd and where the locks live ([`EtcdOptions`]), and the checks on it.

use crate::rt::error::Error;

/// How to reach etcd and where the locks live.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// `host:port` or `http(s)://host:port`, one per member.
    pub endpoints: Vec<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// PEM of the CA that signed the members' certificates; TLS is on when set.
    pub ca: Option<String>,
    /// Prefix of every lock key. Default `locco/`.
    pub prefix: String,
    /// TTL of the session lease, in seconds. Default 10, at least 2.
    pub session_ttl_s: u32,
    /// Milliseconds to connect. Default 5000.
    pub connect_timeout_ms: u64,
    /// Milliseconds for one request. Default 5000.
    pub request_timeout_ms: u64,
}

impl EtcdOptions {
    pub fn new(endpoints: Vec<String>) -> Self {
        EtcdOptions {
            endpoints,
            username: None,
            password: None,
            ca: None,
            prefix: "locco/".into(),
            session_ttl_s: 10,
            connect_timeout_ms: 5000,
            request_timeout_ms: 5000,
        }
    }

    /// What [`EtcdBackend::new`](super::EtcdBackend::new) refuses before it builds anything.
    pub(super) fn validate(&self) -> Result<(), Error> {
        if self.endpoints.is_empty() {
            return Err(Error::validation(
                "endpoints",
                "needs at least one endpoint",
            ));
        }
        for e in &self.endpoints {
            let rest = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"))
                .unwrap_or(e);
            let port = rest.rsplit_once(':').map(|(_, p)| p);
            if rest.is_empty()
                || rest.contains('/')
                || !port.is_some_and(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
            {
                return Err(Error::validation(
                    "endpoints",
                    format!("{e:?} is not host:port or http(s)://host:port"),
                ));
            }
            if e.starts_with("https://") && self.ca.is_none() {
                // rustls needs roots; without a CA there are none.
                return Err(Error::validation(
                    "tls.ca",
                    "an https:// endpoint needs tls.ca (the PEM of the members' CA)",
                ));
            }
        }
        if self.username.is_some() != self.password.is_some() {
            return Err(Error::validation(
                "auth",
                "needs both username and password",
            ));
        }
        if self.session_ttl_s < 2 {
            return Err(Error::validation(
                "sessionTtl",
                "must be at least 2000 ms (etcd's lease granularity is a second)",
            ));
        }
        if self.prefix.is_empty() {
            return Err(Error::validation("prefix", "must not be empty"));
        }
        Ok(())
    }
}
