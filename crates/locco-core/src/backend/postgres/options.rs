//! How to reach PostgreSQL and where the locks live ([`PostgresOptions`]): the table name's
//! checks, the URL's `sslmode` and password.

use crate::rt::error::Error;

use super::advisory::{Keys, Mode};

/// The longest identifier PostgreSQL keeps.
const MAX_IDENTIFIER_BYTES: usize = 63;
/// `<table>_fence` must fit in an identifier too.
const MAX_FENCED_TABLE_CHARS: usize = MAX_IDENTIFIER_BYTES - "_fence".len();
/// And `<table>_waiters`, or the table keeps no queue.
const MAX_QUEUED_TABLE_CHARS: usize = MAX_IDENTIFIER_BYTES - "_waiters".len();

/// How to reach PostgreSQL and where the locks live.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// A `postgres://` URL (or key=value string). `sslmode=require` encrypts; `verify-full`
    /// also checks the certificate and host name.
    pub url: String,
    /// Plain or schema-qualified. Default `locco_locks`.
    pub table_name: String,
    /// Create the table and the fence sequence on first use. Default true.
    pub create_table: bool,
    /// Connections in the pool. Default 10.
    pub pool_size: usize,
    /// Milliseconds to establish a connection. Default 5000.
    pub connect_timeout_ms: u64,
    /// PEM certificate(s) to trust for TLS, instead of the system's roots.
    pub tls_ca: Option<Vec<u8>>,
    /// Milliseconds after which the server itself stops a statement, set on each new
    /// connection. `None`: twice `connect_timeout_ms`, at least one second (10 s by default).
    /// `Some(0)`: leave the server's setting. Either way a `statement_timeout` already in
    /// force (from the URL's `options`, the role, the database or the server) is kept.
    pub statement_timeout_ms: Option<u64>,
    /// Rows in a table (the default), or session-level advisory locks.
    pub mode: Mode,
    /// How an advisory lock's key becomes its 64-bit number (advisory mode only).
    pub keys: Keys,
}

impl PostgresOptions {
    pub fn new(url: impl Into<String>) -> Self {
        PostgresOptions {
            url: url.into(),
            table_name: "locco_locks".into(),
            create_table: true,
            pool_size: 10,
            connect_timeout_ms: 5000,
            tls_ca: None,
            statement_timeout_ms: None,
            mode: Mode::Table,
            keys: Keys::Hash,
        }
    }

    /// The statement timeout to set, if any. Our statements touch one row and take
    /// milliseconds; one that runs for twice the time we allow just to reach the server is
    /// stuck behind a lock, and the engine normally cancels it long before. The timeout is the
    /// backstop for when that cancel cannot arrive (the network to the server broke, or this
    /// process died while the statement waited).
    pub(super) fn statement_timeout(&self) -> Option<u64> {
        match self.statement_timeout_ms {
            Some(0) => None,
            Some(ms) => Some(ms),
            None => Some(self.connect_timeout_ms.saturating_mul(2).max(1000)),
        }
    }
}

/// A checked table name, quoted part by part, its sequence and its waiter table.
#[derive(Debug, Clone)]
pub(super) struct Names {
    pub(super) table: String,
    pub(super) sequence: String,
    /// `None` when `<table>_waiters` would not fit in an identifier (the server would cut it
    /// short, and two tables could then share one queue).
    pub(super) waiters: Option<String>,
    /// The table name without quotes, for messages and `to_regclass`.
    pub(super) plain: String,
    pub(super) fence_ok: Result<(), String>,
}

/// Checks a table name before any SQL is built from it. Only plain identifiers pass, so
/// nothing a caller writes can change the statements.
pub(super) fn names(table_name: &str) -> Result<Names, Error> {
    let invalid = |why: String| Error::validation("tableName", why);
    let parts: Vec<&str> = table_name.split('.').collect();
    if parts.len() > 2 {
        return Err(invalid(format!(
            "{table_name:?} has more than one dot; use schema.table"
        )));
    }
    for part in &parts {
        let mut chars = part.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok
            || !part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        {
            return Err(invalid(format!(
                "{table_name:?} is not a plain identifier: use letters, digits, _ and $, starting \
                 with a letter or _ (no quotes, spaces or semicolons)"
            )));
        }
        if part.len() > MAX_IDENTIFIER_BYTES {
            return Err(invalid(format!(
                "{part:?} is longer than {MAX_IDENTIFIER_BYTES} bytes"
            )));
        }
    }
    let table_part = parts[parts.len() - 1];
    let quote = |p: &str| format!("\"{p}\"");
    let table = parts.iter().map(|p| quote(p)).collect::<Vec<_>>().join(".");
    // The same schema, another name.
    let beside = |suffix: &str| {
        let mut named: Vec<String> = parts.iter().map(|p| quote(p)).collect();
        *named.last_mut().expect("one part at least") = quote(&format!("{table_part}{suffix}"));
        named.join(".")
    };
    let sequence = beside("_fence");
    let waiters =
        (table_part.chars().count() <= MAX_QUEUED_TABLE_CHARS).then(|| beside("_waiters"));
    let fence_ok = if table_part.chars().count() > MAX_FENCED_TABLE_CHARS {
        Err(format!(
            "{table_part:?} is longer than {MAX_FENCED_TABLE_CHARS} characters, so its fence \
             sequence name would not fit in a PostgreSQL identifier"
        ))
    } else {
        Ok(())
    };
    Ok(Names {
        table,
        sequence,
        waiters,
        plain: table_name.to_string(),
        fence_ok,
    })
}

/// `sslmode` from a URL; tokio-postgres reads only disable/prefer/require, so the verifying
/// modes are taken out here and applied to the TLS set-up.
pub(super) fn split_sslmode(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), None);
    };
    let mut mode = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| match kv.split_once('=') {
            Some(("sslmode", v)) => {
                mode = Some(v.to_string());
                false
            }
            _ => true,
        })
        .collect();
    let rebuilt = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (rebuilt, mode)
}

pub(super) fn password_of(config: &tokio_postgres::Config) -> Vec<String> {
    config
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        for bad in [
            "locks; DROP TABLE users",
            "\"locks\"",
            "locks --",
            "lo cks",
            "a.b.c",
            "1locks",
            "locks'",
            "",
            &"x".repeat(64),
        ] {
            assert!(names(bad).is_err(), "{bad:?} must be refused");
        }
        let n = names("app.locco_locks").unwrap();
        assert_eq!(n.table, "\"app\".\"locco_locks\"");
        assert_eq!(n.sequence, "\"app\".\"locco_locks_fence\"");
        assert!(names(&"x".repeat(58)).unwrap().fence_ok.is_err());
        assert!(names(&"x".repeat(57)).unwrap().fence_ok.is_ok());
        assert_eq!(
            n.waiters.as_deref(),
            Some("\"app\".\"locco_locks_waiters\"")
        );
        assert_eq!(names(&"x".repeat(56)).unwrap().waiters, None);
        assert!(names(&"x".repeat(55)).unwrap().waiters.is_some());
    }

    #[test]
    fn statement_timeout_follows_the_connect_timeout() {
        let mut o = PostgresOptions::new("postgres://h/db");
        assert_eq!(o.statement_timeout(), Some(10_000));
        o.connect_timeout_ms = 100;
        assert_eq!(o.statement_timeout(), Some(1000));
        o.statement_timeout_ms = Some(250);
        assert_eq!(o.statement_timeout(), Some(250));
        o.statement_timeout_ms = Some(0);
        assert_eq!(o.statement_timeout(), None);
    }

    #[test]
    fn sslmode_is_taken_out_of_the_url() {
        assert_eq!(
            split_sslmode("postgres://u@h/db?sslmode=verify-full&application_name=x"),
            (
                "postgres://u@h/db?application_name=x".to_string(),
                Some("verify-full".to_string())
            )
        );
        assert_eq!(
            split_sslmode("postgres://u@h/db"),
            ("postgres://u@h/db".to_string(), None)
        );
    }
}
