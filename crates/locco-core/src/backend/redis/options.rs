//! How to reach Redis ([`RedisOptions`]), the checks on it, the database each URL selects,
//! and the passwords its URLs carry.

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
    /// Cluster. The database is the path (`/4`) or the `db` parameter (`?db=4`); `db` is the
    /// only parameter a URL takes.
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
    /// Each URL's database is put where the driver reads it, the path, so that `?db=4` selects
    /// it as `/4` does.
    pub(super) fn validate(&mut self) -> Result<(), Error> {
        let several = self.urls.len() > 1;
        for (i, url) in self.urls.iter_mut().enumerate() {
            let field = match several {
                true => format!("urls[{i}]"),
                false => "url".to_string(),
            };
            let db = with_database_in_path(url, &field)?;
            if db != 0 && self.cluster {
                return Err(Error::validation(
                    field,
                    format!("selects database {db}, but a Redis Cluster has only database 0"),
                ));
            }
        }
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

/// Reads the database of a `redis://` or `rediss://` URL, from its path (`/4`) or its `db`
/// parameter (`?db=4`), and rewrites the URL with the database in its path and no query: the
/// driver reads only the path. Any other parameter is refused, as is a database given twice
/// differently. A socket URL (`unix://`, `redis+unix://`), whose path is the socket's, and text
/// that is not a URL are left as they are for the driver to read or refuse.
fn with_database_in_path(url: &mut String, field: &str) -> Result<i64, Error> {
    let Some(mut parsed) = redis::parse_redis_url(url) else {
        return Ok(0);
    };
    if !matches!(parsed.scheme(), "redis" | "rediss" | "valkey" | "valkeys") {
        return Ok(0);
    }
    let invalid = |why: String| Error::validation(field, why);
    let number = |text: &str| {
        text.parse::<u32>().map(i64::from).map_err(|_| {
            invalid(format!(
                "names database {text:?}, which is not a whole number >= 0 (redis://host:port/4 \
                 or redis://host:port?db=4)"
            ))
        })
    };
    let path = parsed.path().trim_matches('/');
    let mut db = match path {
        "" => None,
        text => Some(number(text)?),
    };
    for (name, value) in parsed.query_pairs() {
        if name != "db" {
            return Err(invalid(format!(
                "has parameter {name}, which this adapter does not apply; a Redis URL takes db \
                 (the database, as in ?db=4)"
            )));
        }
        let given = number(&value)?;
        match db {
            Some(first) if first != given => {
                return Err(invalid(format!(
                    "names database {first} and database {given}; give one, as /{given} or \
                     ?db={given}"
                )))
            }
            _ => db = Some(given),
        }
    }
    let db = db.unwrap_or(0);
    if parsed.query().is_some() {
        parsed.set_query(None);
        parsed.set_path(&format!("/{db}"));
        *url = parsed.to_string();
    }
    Ok(db)
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

    fn database_of(url: &str) -> Result<(i64, String), String> {
        let mut url = url.to_string();
        match with_database_in_path(&mut url, "url") {
            Ok(db) => Ok((db, url)),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn the_database_is_the_path_or_the_db_parameter() {
        assert_eq!(database_of("redis://h:1"), Ok((0, "redis://h:1".into())));
        assert_eq!(
            database_of("redis://h:1/4"),
            Ok((4, "redis://h:1/4".into()))
        );
        assert_eq!(
            database_of("rediss://u:p%40ss@h:1?db=4#insecure"),
            Ok((4, "rediss://u:p%40ss@h:1/4#insecure".into()))
        );
        assert_eq!(
            database_of("redis://h:1/4?db=4"),
            Ok((4, "redis://h:1/4".into()))
        );
        assert_eq!(
            database_of("redis+unix:///tmp/r.sock?db=2"),
            Ok((0, "redis+unix:///tmp/r.sock?db=2".into())),
            "a socket URL's db is the driver's to read"
        );
        for bad in [
            "redis://h:1/x",
            "redis://h:1/-1",
            "redis://h:1/1/2",
            "redis://h:1?db=",
            "redis://h:1/4?db=5",
            "redis://h:1?db=4&db=5",
            "redis://h:1?protocol=3",
        ] {
            assert!(database_of(bad).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn a_cluster_has_only_database_0() {
        let mut o = RedisOptions::new("redis://h:1/0");
        o.urls.push("redis://h:2?db=3".into());
        o.cluster = true;
        let e = o.validate().unwrap_err().to_string();
        assert!(e.contains("urls[1]") && e.contains("database 3"), "{e}");
        o.urls[1] = "redis://h:2?db=0".into();
        assert!(o.validate().is_ok());
        assert_eq!(o.urls[1], "redis://h:2/0");
    }

    #[test]
    fn passwords_are_redacted() {
        let secrets = secrets_of(&["redis://app:s3cr%40t@localhost:6379".to_string()]);
        assert_eq!(
            redact(&secrets, "auth s3cr@t failed (s3cr%40t)".into()),
            "auth *** failed (***)"
        );
    }
}
