//! How to reach MongoDB and where the locks live ([`MongoOptions`]): the names MongoDB would
//! refuse, the pool size and password the URL carries.

use crate::backend::shared::io;
use crate::rt::error::Error;

/// How to reach MongoDB and where the locks live.
#[derive(Debug, Clone)]
pub struct MongoOptions {
    pub url: String,
    /// Default: the URL's database, else `locco`.
    pub db_name: Option<String>,
    /// Default `locco-locks`; the fence counters live in `<collectionName>-fences`.
    pub collection_name: String,
    /// Create the unique index on `key` and the TTL index on `expireAt` on first use.
    pub create_indexes: bool,
    /// `w` of every lock write: a number, or `None` for `majority` (the default).
    pub write_concern_w: Option<u32>,
    /// Milliseconds to find a server. Default 5000.
    pub connect_timeout_ms: u64,
}

impl MongoOptions {
    pub fn new(url: impl Into<String>) -> Self {
        MongoOptions {
            url: url.into(),
            db_name: None,
            collection_name: "locco-locks".into(),
            create_indexes: true,
            write_concern_w: None,
            connect_timeout_ms: 5000,
        }
    }

    /// What [`MongoBackend::new`](super::MongoBackend::new) refuses before it builds anything.
    pub(super) fn validate(&self) -> Result<(), Error> {
        if !(self.url.starts_with("mongodb://") || self.url.starts_with("mongodb+srv://")) {
            return Err(Error::validation(
                "url",
                "must start with mongodb:// or mongodb+srv://",
            ));
        }
        // The driver's own reading of the URL, now rather than at the first connect: an option
        // it does not know or a value it cannot read is a mistake in the options, not an outage.
        mongodb::options::ConnectionString::parse(&self.url).map_err(|e| {
            let message = match &*e.kind {
                mongodb::error::ErrorKind::InvalidArgument { message, .. } => message.clone(),
                _ => e.to_string(),
            };
            Error::validation("url", io::redact(&secrets_of(&self.url), message))
        })?;
        if let Some(db) = &self.db_name {
            check_name("dbName", db, 63)?;
        }
        check_name("collectionName", &self.collection_name, 120)?;
        Ok(())
    }
}

/// Names MongoDB would refuse, refused before anything is sent.
fn check_name(field: &str, name: &str, max: usize) -> Result<(), Error> {
    let bad = if name.is_empty() {
        Some("is empty")
    } else if name.contains('\0') {
        Some("contains a NUL character")
    } else if name.contains('$') {
        Some("contains '$'")
    } else if field == "dbName" && name.chars().any(|c| "/\\. \"*<>:|?".contains(c)) {
        Some("contains a character MongoDB does not allow in database names")
    } else if name.len() > max {
        Some("is too long")
    } else {
        None
    };
    match bad {
        Some(why) => Err(Error::validation(field, format!("{name:?} {why}"))),
        None => Ok(()),
    }
}

/// The driver's connection pool when the URL does not size it (the driver's own default, set
/// explicitly so that the lane below always matches it).
pub(super) const DEFAULT_POOL_SIZE: u32 = 10;

/// The URL's `maxPoolSize` (option names are case-insensitive); 0 means unbounded.
fn pool_size_of(url: &str) -> Option<u32> {
    let query = url.split_once('?')?.1;
    query.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        match name.eq_ignore_ascii_case("maxPoolSize") {
            true => value.parse().ok(),
            false => None,
        }
    })
}

/// As many requests in the lane as the pool has connections: a request beyond them would wait
/// inside the driver for one, past the point where the engine's give-up is checked, and a grant
/// given up there would still be sent. In the lane it waits where that is checked (and a
/// heartbeat, which takes no place, waits behind at most a pool's worth of requests).
pub(super) fn lane_for(url: &str) -> io::Lane {
    match pool_size_of(url).unwrap_or(DEFAULT_POOL_SIZE) {
        0 => io::Lane::default(),
        n => io::Lane::new((n as usize).min(io::LANE_WIDTH)),
    }
}

pub(super) fn secrets_of(url: &str) -> Vec<String> {
    url.split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, p)| p.to_string())
        .filter(|p| !p.is_empty())
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_mongodb_would_refuse_are_refused() {
        for (field, name) in [
            ("collectionName", ""),
            ("collectionName", "a$b"),
            ("collectionName", "a\0b"),
            ("dbName", "my.db"),
            ("dbName", "x".repeat(64).as_str()),
        ] {
            assert!(
                check_name(field, name, if field == "dbName" { 63 } else { 120 }).is_err(),
                "{name:?}"
            );
        }
        assert!(check_name("collectionName", "locco-locks", 120).is_ok());
    }

    #[test]
    fn the_driver_reads_the_url_at_construction() {
        let refused = |url: &str| match MongoOptions::new(url).validate() {
            Err(Error::Validation { field, message }) => (field, message),
            other => panic!("{url} gave {other:?}"),
        };
        let (field, message) = refused("mongodb://h/db?replicaSet=rs0&fooBar=1");
        assert_eq!(field, "url");
        assert!(message.contains("foobar"), "{message}");
        let (_, message) = refused("mongodb://app:s3cr3t@h/db?maxPoolSize=many");
        assert!(
            message.contains("maxpoolsize") && !message.contains("s3cr3t"),
            "{message}"
        );
        for ok in [
            "mongodb://h1:1,h2:2/db?replicaSet=rs0&w=majority&retryWrites=true",
            "mongodb+srv://cluster0.example.net/?appName=x",
        ] {
            assert!(MongoOptions::new(ok).validate().is_ok(), "{ok}");
        }
    }

    #[test]
    fn the_pool_size_comes_from_the_url_whatever_its_case() {
        assert_eq!(pool_size_of("mongodb://h/db?w=1&maxPoolSize=3"), Some(3));
        assert_eq!(pool_size_of("mongodb://h/?MAXPOOLSIZE=0"), Some(0));
        assert_eq!(pool_size_of("mongodb://h/db?minPoolSize=2"), None);
        assert_eq!(pool_size_of("mongodb://h/db"), None);
    }
}
