//! `check_safety` for MongoDB: the write concern against the topology, the unique and TTL
//! indexes, the storage engine's durability, and the clock (`hello`'s `localTime`). Reads
//! only: it never creates an index, whatever `createIndexes` says.

use mongodb::bson::{doc, Bson, Document};

use super::{Inner, MongoBackend};
use crate::backend::shared::io::Failure;
use crate::backend::shared::safety::{check_clock, Finding, SafetyOptions, Severity};
use crate::contract::Op;

impl MongoBackend {
    /// Checks the server and the lock collection against what the locks rely on (see
    /// [`crate::backend::shared::safety`]).
    pub fn check_safety(&self, options: SafetyOptions) -> Op<Vec<Finding>> {
        self.run(move |inner, _| async move {
            let db = inner.database().await?;
            let first = hello(&inner, &db).await?;
            let mut found = Vec::new();
            let set_name = first.get_str("setName").ok().map(str::to_owned);
            found.extend(judge_write_concern(
                inner.options.write_concern_w,
                set_name.as_deref(),
            ));
            index_findings(&inner, &db, &mut found).await;
            storage_findings(&db, &mut found).await;
            if first.get_datetime("localTime").is_ok() {
                let (i, d) = (&*inner, &db);
                let clock = check_clock(
                    "MongoDB",
                    "hello's localTime",
                    1.0,
                    &options,
                    move || async move {
                        let h = hello(i, d).await?;
                        h.get_datetime("localTime")
                            .map(|t| t.timestamp_millis() as f64)
                            .map_err(|_| {
                                Failure::new(
                                    "mongo",
                                    crate::rt::error::BackendErrorKind::Protocol,
                                    "hello has no localTime",
                                )
                            })
                    },
                )
                .await;
                found.push(clock);
            } else {
                found.push(Finding::not_checked(
                    "clock.rate",
                    "the server's clock",
                    "its hello answer carries no localTime",
                ));
            }
            Ok(found)
        })
    }
}

/// `hello`, or `isMaster` from a server that predates it.
async fn hello(inner: &Inner, db: &mongodb::Database) -> Result<Document, Failure> {
    match db.run_command(doc! { "hello": 1 }).await {
        Ok(d) => Ok(d),
        // Only a server that answered, refusing the command, gets the older one: an
        // unreachable one would make the check wait out its timeout twice.
        Err(e) if !matches!(&*e.kind, mongodb::error::ErrorKind::Command(_)) => {
            Err(inner.failure(e))
        }
        Err(_) => db
            .run_command(doc! { "isMaster": 1 })
            .await
            .map_err(|e| inner.failure(e)),
    }
}

fn judge_write_concern(w: Option<u32>, set_name: Option<&str>) -> Option<Finding> {
    match (w, set_name) {
        (Some(0), _) => Some(Finding::new(
            "mongo.write-concern",
            Severity::Unsafe,
            "lock writes use w: 0 (unacknowledged)",
            "the adapter cannot know whether an acquire was applied, so it cannot tell a grant \
             from contention",
            "use writeConcern { w: 'majority' } (the default)",
        )),
        (Some(1), Some(set)) => Some(Finding::new(
            "mongo.write-concern",
            Severity::Warning,
            format!("lock writes use w: 1 on the replica set {set:?}"),
            "a grant acknowledged by the primary alone can be rolled back when a secondary that \
             lacks it is elected; the key is then free while its holder still works: two \
             holders",
            "leave writeConcern unset (w: 'majority')",
        )),
        (None, None) => Some(Finding::new(
            "mongo.topology",
            Severity::Info,
            "the server is a standalone (no replica set)",
            "w: 'majority' on a standalone is the one server's acknowledgement; a crash before \
             the journal is written can lose a grant, and there is no failover",
            "run a replica set for locks that must survive a server's loss",
        )),
        _ => None,
    }
}

async fn index_findings(inner: &Inner, db: &mongodb::Database, found: &mut Vec<Finding>) {
    let name = &inner.options.collection_name;
    let answer = db
        .run_command(doc! { "listIndexes": name.as_str(), "cursor": {} })
        .await;
    let indexes: Vec<Document> = match answer {
        Ok(reply) => reply
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_array("firstBatch").ok())
            .map(|b| b.iter().filter_map(|d| d.as_document().cloned()).collect())
            .unwrap_or_default(),
        Err(e) => {
            let missing = matches!(&*e.kind, mongodb::error::ErrorKind::Command(c) if c.code == 26);
            if missing {
                found.push(missing_collection(name, inner.options.create_indexes));
            } else {
                found.push(Finding::not_checked(
                    "mongo.indexes",
                    "the lock collection's indexes (listIndexes)",
                    inner.failure(e).message,
                ));
            }
            return;
        }
    };
    let on = |field: &str, i: &Document| {
        i.get_document("key")
            .is_ok_and(|k| k.len() == 1 && k.contains_key(field))
    };
    let unique = indexes
        .iter()
        .any(|i| on("key", i) && i.get_bool("unique").unwrap_or(false));
    let ttl = indexes
        .iter()
        .any(|i| on("expireAt", i) && i.get("expireAfterSeconds").is_some_and(is_number));
    found.extend(judge_indexes(name, unique, ttl));
}

fn is_number(b: &Bson) -> bool {
    matches!(b, Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_))
}

fn missing_collection(name: &str, create_indexes: bool) -> Finding {
    if create_indexes {
        Finding::new(
            "mongo.indexes",
            Severity::Info,
            format!("the lock collection {name:?} does not exist yet"),
            "the adapter creates it and its indexes (createIndexes is on) at its first lock \
             operation",
            "nothing to do, or create the indexes from mongoLocksIndexes() in a migration",
        )
    } else {
        Finding::new(
            "mongo.indexes",
            Severity::Warning,
            format!("the lock collection {name:?} does not exist, and createIndexes is off"),
            "every lock operation fails until its unique index on key exists",
            "create the collection's indexes from mongoLocksIndexes(), or set createIndexes: true",
        )
    }
}

fn judge_indexes(name: &str, unique: bool, ttl: bool) -> Vec<Finding> {
    let mut out = Vec::new();
    if !unique {
        out.push(Finding::new(
            "mongo.unique-index",
            Severity::Unsafe,
            format!("the lock collection {name:?} has no unique index on key"),
            "acquire is an upsert of the key's document; without a unique index two upserts \
             of a free key can both insert, and both callers are granted the lock",
            "create { key: 1 } with unique: true (the first of mongoLocksIndexes()), or set \
             createIndexes: true",
        ));
    }
    if !ttl {
        out.push(Finding::new(
            "mongo.ttl-index",
            Severity::Warning,
            format!("the lock collection {name:?} has no TTL index on expireAt"),
            "expiry does not depend on it (an expired lock can be taken at once), but expired \
             locks stay as documents until their key is taken again, so the collection only \
             grows",
            "create { expireAt: 1 } with expireAfterSeconds: 0 (the second of \
             mongoLocksIndexes()), or set createIndexes: true",
        ));
    }
    out
}

async fn storage_findings(db: &mongodb::Database, found: &mut Vec<Finding>) {
    let status = match db.run_command(doc! { "serverStatus": 1 }).await {
        Ok(s) => s,
        Err(e) => {
            found.push(Finding::not_checked(
                "mongo.storage",
                "the storage engine's durability (serverStatus)",
                super::sentence(&e),
            ));
            return;
        }
    };
    let engine = status.get_document("storageEngine").ok();
    let persistent = engine.and_then(|e| e.get_bool("persistent").ok());
    let name = engine
        .and_then(|e| e.get_str("name").ok())
        .unwrap_or("unknown");
    match persistent {
        Some(false) => found.push(Finding::new(
            "mongo.storage",
            Severity::Warning,
            format!("the storage engine {name:?} is not persistent"),
            "a restart of the server forgets every lock; holders still working keep working, \
             and anyone can take the same keys: two holders",
            "use a persistent storage engine (WiredTiger) for the lock database, or keep a \
             restarted server out of use for longer than the longest TTL",
        )),
        Some(true) => journal_findings(db, found).await,
        None => found.push(Finding::not_checked(
            "mongo.storage",
            "the storage engine's durability",
            "serverStatus names no storageEngine.persistent",
        )),
    }
}

/// A journal switched off (`storage.journal.enabled: false`, which servers before 6.1 accept).
/// Servers that do not answer `getCmdLineOpts` (6.1 and later always journal, and compatible
/// servers may lack the command) add nothing: `serverStatus` already spoke of durability.
async fn journal_findings(db: &mongodb::Database, found: &mut Vec<Finding>) {
    let admin = db.client().database("admin");
    let Ok(opts) = admin.run_command(doc! { "getCmdLineOpts": 1 }).await else {
        return;
    };
    let enabled = opts
        .get_document("parsed")
        .and_then(|p| p.get_document("storage"))
        .and_then(|s| s.get_document("journal"))
        .and_then(|j| j.get_bool("enabled"));
    if enabled == Ok(false) {
        found.push(Finding::new(
            "mongo.journal",
            Severity::Warning,
            "journaling is off (storage.journal.enabled: false)",
            "a crash of the server loses the writes since the last checkpoint (up to a minute): \
             grants acknowledged in that time are forgotten, and their keys can be taken again \
             while their holders still work",
            "turn journaling on (remove storage.journal.enabled: false / --nojournal)",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn w1_on_a_replica_set_is_a_warning_and_missing_indexes_are_found() {
        let sev = |w, s| judge_write_concern(w, s).map(|f| f.severity);
        assert_eq!(sev(Some(1), Some("rs0")), Some(Severity::Warning));
        assert_eq!(sev(Some(0), None), Some(Severity::Unsafe));
        assert_eq!(sev(None, Some("rs0")), None);
        let f = judge_indexes("l", false, false);
        assert_eq!(f[0].severity, Severity::Unsafe);
        assert_eq!(f[1].severity, Severity::Warning);
        assert!(judge_indexes("l", true, true).is_empty());
    }
}
