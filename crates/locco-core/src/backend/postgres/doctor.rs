//! `check_safety` for PostgreSQL: the lock table's unique key, the role's rights, the fence
//! sequence, commit durability and replication, and the clock (`clock_timestamp()`). Reads
//! only: it never creates the table, whatever `createTable` says.

use super::{Inner, Mode, PostgresBackend};
use crate::backend::shared::io::Failure;
use crate::backend::shared::safety::{check_clock, Finding, SafetyOptions, Severity};
use crate::contract::Op;

impl PostgresBackend {
    /// Checks the server and the lock table against what the locks rely on (see
    /// [`crate::backend::shared::safety`]).
    pub fn check_safety(&self, options: SafetyOptions) -> Op<Vec<Finding>> {
        self.run(move |inner, abandon| async move {
            let client = inner.client(&abandon).await?;
            abandon.clear();
            let mut found = Vec::new();
            if inner.options.mode == Mode::Table {
                table_findings(&inner, &client, &mut found).await?;
            }
            durability_findings(&inner, &client, &mut found).await?;
            let (c, i) = (&**client, &*inner);
            let clock = check_clock(
                "PostgreSQL",
                "clock_timestamp()",
                0.001,
                &options,
                move || async move {
                    let row = c
                        .query_one(
                            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8",
                            &[],
                        )
                        .await
                        .map_err(|e| i.failure(e))?;
                    Ok::<f64, Failure>(row.get(0))
                },
            )
            .await;
            found.push(clock);
            Ok(found)
        })
    }
}

/// What the catalog says of the lock table and its sequence, for this role.
struct TableFacts {
    exists: bool,
    unique_key: bool,
    /// SELECT, INSERT, UPDATE, DELETE: the ones missing.
    missing_rights: Vec<&'static str>,
    sequence_exists: bool,
    sequence_usage: bool,
}

async fn table_findings(
    inner: &Inner,
    client: &tokio_postgres::Client,
    found: &mut Vec<Finding>,
) -> Result<(), Failure> {
    // One privilege per call: with a list, has_table_privilege answers whether *any* is held.
    let row = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL, \
               EXISTS (SELECT 1 FROM pg_index i \
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
                 WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indpred IS NULL \
                   AND i.indnkeyatts = 1 AND a.attname = 'key'), \
               COALESCE(has_table_privilege(to_regclass($1), 'SELECT'), false), \
               COALESCE(has_table_privilege(to_regclass($1), 'INSERT'), false), \
               COALESCE(has_table_privilege(to_regclass($1), 'UPDATE'), false), \
               COALESCE(has_table_privilege(to_regclass($1), 'DELETE'), false), \
               to_regclass($2) IS NOT NULL, \
               COALESCE(has_sequence_privilege(to_regclass($2), 'USAGE'), false)",
            &[&inner.names.table, &inner.names.sequence],
        )
        .await
        .map_err(|e| inner.failure(e))?;
    let rights = ["SELECT", "INSERT", "UPDATE", "DELETE"];
    let facts = TableFacts {
        exists: row.get(0),
        unique_key: row.get(1),
        missing_rights: (0..4)
            .filter(|i| !row.get::<_, bool>(2 + i))
            .map(|i| rights[i])
            .collect(),
        sequence_exists: row.get(6),
        sequence_usage: row.get(7),
    };
    let table = &inner.names.plain;
    let sequence = inner.names.sequence.replace('"', "");
    found.extend(judge_table(
        &facts,
        table,
        &sequence,
        inner.options.create_table,
    ));
    Ok(())
}

fn judge_table(
    facts: &TableFacts,
    table: &str,
    sequence: &str,
    create_table: bool,
) -> Vec<Finding> {
    let ddl = format!("the statements of postgresLocksDdl('{table}')");
    if !facts.exists {
        let (severity, why) = if create_table {
            (
                Severity::Info,
                "the adapter creates it (createTable is on) at its first operation, if this role \
                 may create tables in the schema",
            )
        } else {
            (
                Severity::Warning,
                "createTable is off, so every lock operation fails until the table exists",
            )
        };
        return vec![Finding::new(
            "postgres.table",
            severity,
            format!("the lock table {table} does not exist"),
            why,
            format!("run {ddl} in a migration, or let the adapter create it (createTable: true)"),
        )];
    }
    let mut out = Vec::new();
    if !facts.unique_key {
        out.push(Finding::new(
            "postgres.primary-key",
            Severity::Unsafe,
            format!("the lock table {table} has no primary key or unique index on key alone"),
            "acquire relies on INSERT … ON CONFLICT (key): without a unique key the statement \
             fails, and a table that once let two rows of one key in can answer both as \
             held, a double grant",
            format!(
                "delete duplicate keys, then ALTER TABLE {table} ADD PRIMARY KEY (key); or \
                 recreate the table from {ddl}"
            ),
        ));
    }
    if !facts.missing_rights.is_empty() {
        let missing = facts.missing_rights.join(", ");
        out.push(Finding::new(
            "postgres.privileges",
            Severity::Unsafe,
            format!("this role lacks {missing} on the lock table {table}"),
            "acquire inserts or updates a row, release deletes it, isHeld reads it: without \
             each of these rights that verb fails, and a lock that cannot be released or \
             extended is held to the end of its TTL",
            format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO <role>"),
        ));
    }
    let fencing_why = "a fenced acquire (Locker fencing: true) takes its token from this \
                       sequence, so every fenced acquire fails; unfenced locks work";
    if !facts.sequence_exists {
        out.push(Finding::new(
            "postgres.fence-sequence",
            Severity::Warning,
            format!("the fence sequence {sequence} does not exist"),
            fencing_why,
            format!(
                "CREATE SEQUENCE IF NOT EXISTS {sequence} (it is in {ddl}), if you use fencing"
            ),
        ));
    } else if !facts.sequence_usage {
        out.push(Finding::new(
            "postgres.fence-sequence",
            Severity::Warning,
            format!("this role has no USAGE on the fence sequence {sequence}"),
            fencing_why,
            format!("GRANT USAGE ON SEQUENCE {sequence} TO <role>, if you use fencing"),
        ));
    }
    out
}

/// Commit durability and replication, as this session sees them.
struct Durability {
    synchronous_commit: String,
    fsync: String,
    standby_names: String,
    replicas: i64,
    in_recovery: bool,
}

async fn durability_findings(
    inner: &Inner,
    client: &tokio_postgres::Client,
    found: &mut Vec<Finding>,
) -> Result<(), Failure> {
    let row = client
        .query_one(
            "SELECT current_setting('synchronous_commit'), current_setting('fsync'), \
               current_setting('synchronous_standby_names'), \
               (SELECT count(*) FROM pg_stat_replication), pg_is_in_recovery()",
            &[],
        )
        .await;
    let row = match row {
        Ok(r) => r,
        Err(e) => {
            let f = inner.failure(e);
            found.push(Finding::not_checked(
                "postgres.durability",
                "synchronous_commit and replication",
                f.message,
            ));
            return Ok(());
        }
    };
    found.extend(judge_durability(&Durability {
        synchronous_commit: row.get(0),
        fsync: row.get(1),
        standby_names: row.get(2),
        replicas: row.get(3),
        in_recovery: row.get(4),
    }));
    Ok(())
}

fn judge_durability(d: &Durability) -> Vec<Finding> {
    let mut out = Vec::new();
    let lost_grant = "a grant the server acknowledged can be gone after the crash, and the key \
                      is then free while its holder still works: two holders";
    if d.in_recovery {
        out.push(Finding::new(
            "postgres.standby",
            Severity::Warning,
            "the URL points at a standby (pg_is_in_recovery() is true)",
            "a standby refuses writes, so every acquire fails",
            "point the adapter at the primary",
        ));
    }
    if d.synchronous_commit == "off" {
        out.push(Finding::new(
            "postgres.synchronous-commit",
            Severity::Warning,
            "synchronous_commit is off for this role",
            format!(
                "a commit is acknowledged before it is on disk, so a crash of the server loses \
                 the last fraction of a second of commits: {lost_grant}"
            ),
            "ALTER ROLE <role> SET synchronous_commit = on (or leave the server default on), \
             at least for the lock role",
        ));
    }
    if d.fsync == "off" {
        out.push(Finding::new(
            "postgres.fsync",
            Severity::Warning,
            "fsync is off on the server",
            format!("a crash of the machine can lose committed transactions: {lost_grant}"),
            "turn fsync on (postgresql.conf), except on a throwaway test server",
        ));
    }
    if d.replicas > 0 {
        let async_standbys = d.standby_names.trim().is_empty();
        let local = matches!(d.synchronous_commit.as_str(), "local" | "off");
        if async_standbys || local {
            let what = if async_standbys {
                "synchronous_standby_names is empty: replication is asynchronous".to_owned()
            } else {
                format!(
                    "synchronous_commit is {} for this role, so commits do not wait for the \
                     synchronous standbys",
                    d.synchronous_commit
                )
            };
            out.push(Finding::new(
                "postgres.replication",
                Severity::Warning,
                format!(
                    "{} standby(s) replicate from this server, and {what}",
                    d.replicas
                ),
                "a failover to a standby that had not yet received a grant frees that key on \
                 the new primary while its holder still works: two holders",
                "name the standbys in synchronous_standby_names and keep synchronous_commit on \
                 (or remote_apply) for the lock role, or fail over only after the longest TTL",
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> TableFacts {
        TableFacts {
            exists: true,
            unique_key: true,
            missing_rights: vec![],
            sequence_exists: true,
            sequence_usage: true,
        }
    }

    #[test]
    fn a_table_without_a_unique_key_is_unsafe() {
        assert!(judge_table(&facts(), "t", "t_fence", true).is_empty());
        let f = judge_table(
            &TableFacts {
                unique_key: false,
                ..facts()
            },
            "t",
            "t_fence",
            true,
        );
        assert_eq!(f[0].id, "postgres.primary-key");
        assert_eq!(f[0].severity, Severity::Unsafe);
    }

    #[test]
    fn asynchronous_standbys_are_a_warning() {
        let d = Durability {
            synchronous_commit: "on".into(),
            fsync: "on".into(),
            standby_names: "".into(),
            replicas: 1,
            in_recovery: false,
        };
        let f = judge_durability(&d);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].severity, Severity::Warning);
        assert!(judge_durability(&Durability { replicas: 0, ..d }).is_empty());
    }
}
