//! How to reach Redis ([`RedisOptions`]), the checks on it, and the passwords its URLs carry.

use crate::rt::error::Error;

/// `waitForReplicas`: a grant or extension counts only once this many replicas have it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WaitForReplicas {
    pub replicas: u32,
    pub timeout_ms: u64,
}

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// One URL (`redis://` or `rediss://`, user and password in it), or the seed nodes of a
    /// Cluster.
    pub urls: Vec<String>,
    pub cluster: bool,
    /// Milliseconds to establish a connection. Default 5000.
    pub connect_timeout_ms: u64,
    /// Milliseconds to wait for any one answer. Default 5000.
    pub command_timeout_ms: u64,
    pub wait_for_replicas: Option<WaitForReplicas>,
    /// PEM certificate(s) to trust for `rediss://`, instead of the system's roots.
    pub tls_ca: Option<Vec<u8>>,
}

impl RedisOptions {
    pub fn new(url: impl Into<String>) -> Self {
        RedisOptions {
            urls: vec![url.into()],
            cluster: false,
            connect_timeout_ms: 5000,
            command_timeout_ms: 5000,
            wait_for_replicas: None,
            tls_ca: None,
        }
    }

    /// What [`RedisBackend::new`](super::RedisBackend::new) refuses before it builds anything.
    pub(super) fn validate(&self) -> Result<(), Error> {
        if self.urls.is_empty() {
            return Err(Error::validation("url", "give url, or urls for a Cluster"));
        }
        if self.urls.len() > 1 && !self.cluster {
            return Err(Error::validation("urls", "several URLs need cluster: true"));
        }
        if self.cluster && self.wait_for_replicas.is_some() {
            return Err(Error::validation(
                "waitForReplicas",
                "is not supported on a Cluster: WAIT must run on the connection that wrote, \
                 which a Cluster client does not guarantee",
            ));
        }
        if let Some(w) = self.wait_for_replicas {
            if w.replicas == 0 || w.timeout_ms == 0 {
                return Err(Error::validation(
                    "waitForReplicas",
                    "needs replicas >= 1 and a timeout >= 1 ms",
                ));
            }
        }
        Ok(())
    }
}

pub(super) fn secrets_of(urls: &[String]) -> Vec<String> {
    urls.iter()
        .filter_map(|u| {
            let rest = u.split_once("://")?.1;
            let userinfo = rest.split_once('@')?.0;
            let password = userinfo.split_once(':').map_or(userinfo, |(_, p)| p);
            (!password.is_empty()).then(|| password.to_string())
        })
        .flat_map(|p| {
            let decoded = percent_decode(&p);
            [p, decoded]
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::shared::io::redact;

    #[test]
    fn passwords_are_redacted() {
        let secrets = secrets_of(&["redis://app:s3cr%40t@localhost:6379".to_string()]);
        assert_eq!(
            redact(&secrets, "auth s3cr@t failed (s3cr%40t)".into()),
            "auth *** failed (***)"
        );
    }
}
