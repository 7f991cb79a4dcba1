//! The SQL of one lock table: its DDL, the statements of each verb, and the one test of a live
//! lock the operator verbs share.

use crate::rt::error::Error;

use super::options::{names, Names};
use super::queue::{waiters_ddl, FairStatements};

/// The statements that create the lock table, its fence sequence and its waiter table, for a
/// migration. They run through the simple query protocol as one string.
pub fn locks_ddl(table_name: &str) -> Result<String, Error> {
    let n = names(table_name)?;
    let mut ddl = format!(
        "CREATE TABLE IF NOT EXISTS {t} (key text PRIMARY KEY, token text NOT NULL, expires_at timestamptz NOT NULL);\n\
         CREATE SEQUENCE IF NOT EXISTS {s};",
        t = n.table,
        s = n.sequence
    );
    if let Some(w) = &n.waiters {
        ddl.push('\n');
        ddl.push_str(&waiters_ddl(w));
    }
    Ok(ddl)
}

/// The statements of one table. `acquire` … `sweep` serve a table without a waiter table;
/// `fair` replaces them when it has one.
pub(super) struct Statements {
    pub(super) acquire: String,
    pub(super) acquire_fenced: String,
    pub(super) release: String,
    pub(super) extend: String,
    /// [`Statements::extend`] for many rows: `$1` keys, `$2` tokens, `$3` ttls, answering the
    /// `(key, token)` of each row it renewed.
    pub(super) extend_many: String,
    pub(super) is_held: String,
    pub(super) sweep: String,
    /// `$1` key: the token and ms left of the key's row, when it is a live lock (see
    /// [`live_lock`]).
    pub(super) inspect: String,
    /// `$1` prefix, `$2` limit: key, token and ms left of the live locks, in key order.
    pub(super) list: String,
    /// `$1` key: deletes the key's row whatever its token, only when it is a live lock; one
    /// row when it was.
    pub(super) force_release: String,
    pub(super) fair: Option<FairStatements>,
}

impl Statements {
    pub(super) fn new(n: &Names) -> Self {
        let t = &n.table;
        let fence = format!("nextval('{}')", n.sequence.replace('\'', "''"));
        let grant = |returning: &str| {
            format!(
                "INSERT INTO {t} AS l (key, token, expires_at) \
                 VALUES ($1, $2, clock_timestamp() + $3::float8 * interval '1 millisecond') \
                 ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at \
                 WHERE l.expires_at <= clock_timestamp() RETURNING {returning}"
            )
        };
        Statements {
            acquire: grant("1::int8"),
            acquire_fenced: grant(&fence),
            release: format!(
                "DELETE FROM {t} WHERE key = $1 AND token = $2 RETURNING expires_at > clock_timestamp()"
            ),
            extend: format!(
                "UPDATE {t} SET expires_at = clock_timestamp() + $3::float8 * interval '1 millisecond' \
                 WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp() RETURNING 1"
            ),
            // The same columns, clock and conditions as `extend`, for every renewal at once.
            extend_many: format!(
                "UPDATE {t} AS l SET expires_at = clock_timestamp() + r.ttl * interval '1 millisecond' \
                 FROM unnest($1::text[], $2::text[], $3::float8[]) AS r(key, token, ttl) \
                 WHERE l.key = r.key AND l.token = r.token AND l.expires_at > clock_timestamp() \
                 RETURNING l.key, l.token"
            ),
            is_held: format!(
                "SELECT 1 FROM {t} WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()"
            ),
            sweep: format!("DELETE FROM {t} WHERE expires_at <= clock_timestamp()"),
            inspect: format!(
                "SELECT token, {LEFT_MS} FROM {t} WHERE key = $1 AND {lock}",
                lock = live_lock("")
            ),
            // `key >= $1` lets the planner walk the primary key from the prefix on (in every
            // collation a string sorts after its prefixes); the `left` test keeps it exact.
            list: format!(
                "SELECT key, token, {LEFT_MS} FROM {t} WHERE key >= $1 \
                 AND left(key, length($1)) = $1 AND {lock} ORDER BY key LIMIT $2",
                lock = live_lock("")
            ),
            force_release: format!(
                "DELETE FROM {t} WHERE key = $1 AND {lock} RETURNING true",
                lock = live_lock("")
            ),
            fair: n
                .waiters
                .as_ref()
                .map(|w| FairStatements::new(t, w, &fence, &live_lock(""))),
        }
    }
}

/// Whether a row (named `{alias}`) is a live lock this adapter wrote: a non-empty token and a
/// lease that has not ended and is no longer than the longest TTL a lock may ask for. The one
/// test of `inspect`, `list` and `forceRelease` (and the queue's forced release), so what an
/// operator is shown is what a forced release deletes. A row another program put in the table
/// (a NULL or empty token, no expiry, `infinity`) is not a lock, nor is an expired one: they
/// are reported as not held and never deleted.
fn live_lock(alias: &str) -> String {
    format!(
        "({alias}token <> '' AND {alias}expires_at > clock_timestamp() \
         AND {alias}expires_at <= clock_timestamp() + interval '{max} milliseconds')",
        max = crate::contract::MAX_TTL_MS as u64
    )
}

/// Milliseconds left of a row's lease, by the server's clock.
const LEFT_MS: &str = "(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8";

/// A statement's parameters, `$1` first.
pub(super) type Params = Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>>;

pub(super) fn params(key: &str, token: &str, ttl: Option<u32>) -> Params {
    let mut p: Params = vec![Box::new(key.to_owned()), Box::new(token.to_owned())];
    p.extend(ttl.map(|ttl| Box::new(f64::from(ttl)) as _));
    p
}

impl Statements {
    /// The queue's statements, when the table has a waiter table we may use.
    pub(super) fn fair(&self, usable: bool) -> Option<&FairStatements> {
        self.fair.as_ref().filter(|_| usable)
    }

    /// A queued attempt, with its count of parameters; without a waiter table, a plain
    /// acquire (there is no queue to join).
    pub(super) fn queued(&self, fair: bool, fenced: bool) -> (&String, usize) {
        match (self.fair(fair), fenced) {
            (Some(f), true) => (&f.queued_fenced, 6),
            (Some(f), false) => (&f.queued, 6),
            (None, true) => (&self.acquire_fenced, 3),
            (None, false) => (&self.acquire, 3),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ddl_makes_the_waiter_table_when_its_name_fits() {
        let ddl = locks_ddl("app.locks").unwrap();
        let lines: Vec<&str> = ddl.lines().collect();
        assert_eq!(lines.len(), 3, "{ddl}");
        assert!(lines[0].starts_with("CREATE TABLE IF NOT EXISTS \"app\".\"locks\" ("));
        assert_eq!(
            lines[1],
            "CREATE SEQUENCE IF NOT EXISTS \"app\".\"locks_fence\";"
        );
        assert!(lines[2].starts_with("CREATE TABLE IF NOT EXISTS \"app\".\"locks_waiters\" ("));
        let long = locks_ddl(&"x".repeat(56)).unwrap();
        assert_eq!(
            long.lines().count(),
            2,
            "no queue for a name that does not fit"
        );
    }

    #[test]
    fn every_verb_has_a_fair_statement_when_there_is_a_waiter_table() {
        let s = Statements::new(&names("locks").unwrap());
        let fair = s.fair(true).expect("a waiter table");
        assert!(fair.release.contains("pg_notify"));
        assert!(s.fair(false).is_none(), "unusable: the plain statements");
        assert_eq!(s.queued(false, true), (&s.acquire_fenced, 3));
        assert_eq!(s.queued(true, false), (&fair.queued, 6));
        assert!(
            !s.release.contains("waiters"),
            "the plain release does not touch it"
        );
        let long = Statements::new(&names(&"x".repeat(56)).unwrap());
        assert!(long.fair(true).is_none());
    }

    #[test]
    fn the_operator_verbs_share_one_test_of_a_live_lock() {
        let s = Statements::new(&names("locks").unwrap());
        let lock = live_lock("");
        let fair = s.fair(true).expect("a waiter table");
        for sql in [&s.inspect, &s.list, &s.force_release, &fair.force_release] {
            assert!(sql.contains(&lock), "{sql}");
        }
        assert!(lock.contains("token <> ''"));
        assert!(lock.contains("interval '2147483647 milliseconds'"));
    }
}
