//! The MongoDB backend: one document per key (`key`, `uniqueValue`, `expireAt`, and `grant`, the
//! marker of the attempt that took it), expiry compared on the server clock through `$$NOW`.
//!
//! Acquire is one pipeline upsert on `key`, atomic without a transaction; it rests on the unique
//! index on `key`, without which two upserts of a missing key could both insert. Dates are
//! computed with `$toLong`/`$toDate` arithmetic, which MongoDB 4.2 already has.

use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::error::{ErrorKind, WriteFailure};
use mongodb::options::{
    Acknowledgment, ClientOptions, IndexOptions, ReadPreference, ReturnDocument, SelectionCriteria,
    WriteConcern,
};
use mongodb::{Client, Collection, IndexModel};

use crate::backend::io::{self, redact, Failure};
use crate::backend::{Backend, Op};
use crate::engine::error::{BackendErrorKind, Error};

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
}

/// The index specs the lock collection needs, in the shape `createIndexes` takes.
pub fn locks_indexes() -> Vec<Document> {
    vec![
        doc! { "key": { "key": 1 }, "name": "locco_key_unique", "unique": true },
        doc! { "key": { "expireAt": 1 }, "name": "locco_expireAt_ttl", "expireAfterSeconds": 0 },
    ]
}

/// [`locks_indexes`] as JSON text.
pub fn locks_indexes_json() -> String {
    let specs: Vec<serde_json::Value> = locks_indexes()
        .into_iter()
        .map(|d| Bson::Document(d).into_relaxed_extjson())
        .collect();
    serde_json::Value::Array(specs).to_string()
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

struct Inner {
    options: MongoOptions,
    client: tokio::sync::OnceCell<Client>,
    secrets: Vec<String>,
    indexes_ready: tokio::sync::OnceCell<()>,
    closed: std::sync::atomic::AtomicBool,
}

/// Locks in a MongoDB collection.
#[derive(Clone)]
pub struct MongoBackend {
    inner: Arc<Inner>,
}

fn secrets_of(url: &str) -> Vec<String> {
    url.split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, p)| p.to_string())
        .filter(|p| !p.is_empty())
        .into_iter()
        .collect()
}

impl MongoBackend {
    /// Checks the options; connects on first use.
    pub fn new(options: MongoOptions) -> Result<Self, Error> {
        if !(options.url.starts_with("mongodb://") || options.url.starts_with("mongodb+srv://")) {
            return Err(Error::validation(
                "url",
                "must start with mongodb:// or mongodb+srv://",
            ));
        }
        if let Some(db) = &options.db_name {
            check_name("dbName", db, 63)?;
        }
        check_name("collectionName", &options.collection_name, 120)?;
        let secrets = secrets_of(&options.url);
        Ok(MongoBackend {
            inner: Arc::new(Inner {
                options,
                client: tokio::sync::OnceCell::new(),
                secrets,
                indexes_ready: tokio::sync::OnceCell::new(),
                closed: Default::default(),
            }),
        })
    }

    /// Closes the client; operations afterwards fail.
    pub fn close(&self) {
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(client) = self.inner.client.get().cloned() {
            io::runtime().spawn(async move { client.shutdown().await });
        }
    }

    fn run<T: Send + 'static, F>(&self, work: impl FnOnce(Arc<Inner>) -> F) -> Op<T>
    where
        F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let inner = self.inner.clone();
        io::run("mongo", move |_| work(inner))
    }
}

/// `$$NOW` plus `ttl` ms, with operators MongoDB 4.2 has (no `$add` on a date, no `$dateAdd`).
fn now_plus(ttl: u32) -> Document {
    doc! { "$toDate": { "$add": [ { "$toLong": "$$NOW" }, i64::from(ttl) ] } }
}

/// The document is ours and its lease still runs.
fn ours_live(key: &str, token: &str) -> Document {
    doc! { "key": key, "uniqueValue": token, "$expr": { "$gt": [ "$expireAt", "$$NOW" ] } }
}

/// A driver error as a sentence: the error kind's own text, without the driver's labels and
/// source fields; a failed server selection names each server and why it was unusable rather
/// than dumping the topology.
fn sentence(e: &mongodb::error::Error) -> String {
    match &*e.kind {
        ErrorKind::ServerSelection { message, .. } => {
            let servers = servers_of(message);
            if servers.is_empty() {
                format!(
                    "no MongoDB server could be used: {}",
                    first_sentence(message)
                )
            } else {
                format!("no MongoDB server could be used: {}", servers.join("; "))
            }
        }
        kind => kind.to_string(),
    }
}

/// "host:port: why" for each server of a topology description.
fn servers_of(topology: &str) -> Vec<String> {
    topology
        .split("Address: ")
        .skip(1)
        .map(|part| {
            let address = part.split([',', ' ']).next().unwrap_or_default();
            let why = part
                .split_once("Error: ")
                .map(|(_, e)| {
                    let e = e.trim_start_matches("Kind: ");
                    e.split(", labels:").next().unwrap_or(e).trim()
                })
                .filter(|e| !e.is_empty());
            let kind = part
                .split_once("Type: ")
                .and_then(|(_, t)| t.split([',', ' ']).next())
                .unwrap_or("Unknown");
            match why {
                Some(why) => format!("{address}: {why}"),
                None => format!("{address}: a {kind} server, not one this URL accepts"),
            }
        })
        .collect()
}

fn first_sentence(text: &str) -> &str {
    text.split(". ").next().unwrap_or(text)
}

impl Inner {
    fn failure(&self, e: mongodb::error::Error) -> Failure {
        let code = match &*e.kind {
            ErrorKind::Command(c) => Some(c.code.to_string()),
            ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code.to_string()),
            ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code.to_string()),
            _ => None,
        };
        let kind = match &*e.kind {
            ErrorKind::Authentication { .. } => BackendErrorKind::Auth,
            ErrorKind::Command(c) if c.code == 13 || c.code == 18 => BackendErrorKind::Auth,
            ErrorKind::ServerSelection { .. } => BackendErrorKind::Timeout,
            ErrorKind::Io(_) | ErrorKind::ConnectionPoolCleared { .. } => BackendErrorKind::Io,
            ErrorKind::InvalidArgument { .. } => BackendErrorKind::Config,
            ErrorKind::InvalidResponse { .. } => BackendErrorKind::Protocol,
            _ => BackendErrorKind::Other,
        };
        Failure {
            code,
            ..Failure::new("mongo", kind, redact(&self.secrets, sentence(&e)))
        }
    }

    async fn client(&self) -> Result<&Client, Failure> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Failure::new(
                "mongo",
                BackendErrorKind::Config,
                "the MongoDB adapter is closed",
            ));
        }
        self.client
            .get_or_try_init(|| async {
                let mut options = ClientOptions::parse(&self.options.url)
                    .await
                    .map_err(|e| self.failure(e))?;
                let timeout = Duration::from_millis(self.options.connect_timeout_ms);
                options.server_selection_timeout = Some(timeout);
                options.connect_timeout = Some(timeout);
                // Every read goes to the primary, whatever the URL asks: a lagging secondary
                // could deny a lock we were just granted.
                options.selection_criteria =
                    Some(SelectionCriteria::ReadPreference(ReadPreference::Primary));
                Client::with_options(options).map_err(|e| self.failure(e))
            })
            .await
    }

    fn write_concern(&self) -> WriteConcern {
        let w = match self.options.write_concern_w {
            Some(n) => Acknowledgment::Nodes(n),
            None => Acknowledgment::Majority,
        };
        WriteConcern::builder().w(w).build()
    }

    async fn collections(&self) -> Result<(Collection<Document>, Collection<Document>), Failure> {
        let client = self.client().await?;
        let db = match &self.options.db_name {
            Some(name) => client.database(name),
            None => client
                .default_database()
                .unwrap_or_else(|| client.database("locco")),
        };
        let name = &self.options.collection_name;
        let locks = db.collection::<Document>(name);
        let fences = db.collection::<Document>(&format!("{name}-fences"));
        self.indexes(&locks).await?;
        Ok((locks, fences))
    }

    /// Creates the indexes, or checks once that the unique index on `key` exists; a failed
    /// check runs again on the next call.
    async fn indexes(&self, locks: &Collection<Document>) -> Result<(), Failure> {
        self.indexes_ready
            .get_or_try_init(|| async {
                if self.options.create_indexes {
                    let models = vec![
                        IndexModel::builder()
                            .keys(doc! { "key": 1 })
                            .options(IndexOptions::builder().unique(true).name("locco_key_unique".to_string()).build())
                            .build(),
                        IndexModel::builder()
                            .keys(doc! { "expireAt": 1 })
                            .options(
                                IndexOptions::builder()
                                    .expire_after(Duration::from_secs(0))
                                    .name("locco_expireAt_ttl".to_string())
                                    .build(),
                            )
                            .build(),
                    ];
                    locks.create_indexes(models).await.map_err(|e| self.failure(e))?;
                    return Ok(());
                }
                use futures_util::TryStreamExt;
                let indexes: Vec<IndexModel> = locks
                    .list_indexes()
                    .await
                    .map_err(|e| self.failure(e))?
                    .try_collect()
                    .await
                    .map_err(|e| self.failure(e))?;
                let unique_on_key = indexes.iter().any(|i| {
                    i.keys == doc! { "key": 1 } && i.options.as_ref().and_then(|o| o.unique).unwrap_or(false)
                });
                if !unique_on_key {
                    return Err(Failure {
                        validation: Some("createIndexes"),
                        ..Failure::new(
                            "mongo",
                            BackendErrorKind::Config,
                            format!(
                                "collection {:?} has no unique index on key, which is what makes acquire \
                                 exclusive; create the indexes from mongoLocksIndexes() or set createIndexes: true",
                                self.options.collection_name
                            ),
                        )
                    });
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// The pipeline upsert: takes the key when it is missing or expired. True when granted.
    async fn grant(
        &self,
        locks: &Collection<Document>,
        key: &str,
        token: &str,
        ttl: u32,
    ) -> Result<bool, Failure> {
        let free = doc! { "$or": [
            { "$eq": [ { "$type": "$expireAt" }, "missing" ] },
            { "$lte": [ "$expireAt", "$$NOW" ] },
        ] };
        // `grant` marks which attempt took the key: the token alone cannot tell, since a
        // second acquire with the same token must fail (no re-entrancy).
        let attempt = crate::engine::options::random_token();
        let update = vec![doc! { "$set": {
            "uniqueValue": { "$cond": [ free.clone(), token, "$uniqueValue" ] },
            "expireAt": { "$cond": [ free.clone(), now_plus(ttl), "$expireAt" ] },
            "grant": { "$cond": [ free, &attempt, "$grant" ] },
        } }];
        let result = locks
            .find_one_and_update(doc! { "key": key }, update)
            .upsert(true)
            .return_document(ReturnDocument::After)
            .projection(doc! { "grant": 1, "_id": 0 })
            .write_concern(self.write_concern())
            .await;
        match result {
            Ok(doc) => Ok(doc
                .and_then(|d| d.get_str("grant").ok().map(|v| v == attempt))
                .unwrap_or(false)),
            // Two upserts of a missing key raced and the unique index refused the second:
            // another holder has it.
            Err(e) if is_duplicate_key(&e) => Ok(false),
            Err(e) => Err(self.failure(e)),
        }
    }
}

fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    match &*e.kind {
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code == 11000,
        ErrorKind::Command(c) => c.code == 11000,
        _ => false,
    }
}

impl Backend for MongoBackend {
    fn name(&self) -> &str {
        "mongo"
    }

    fn acquire(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(move |inner| async move {
            let (locks, _) = inner.collections().await?;
            inner.grant(&locks, &key, &token, ttl).await
        })
    }

    fn release(&self, key: &str, token: &str) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(move |inner| async move {
            let (locks, _) = inner.collections().await?;
            let deleted = locks
                .delete_one(ours_live(&key, &token))
                .write_concern(inner.write_concern())
                .await
                .map_err(|e| inner.failure(e))?;
            Ok(deleted.deleted_count == 1)
        })
    }

    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(move |inner| async move {
            let (locks, _) = inner.collections().await?;
            let update = vec![doc! { "$set": { "expireAt": now_plus(ttl) } }];
            let changed = locks
                .update_one(ours_live(&key, &token), update)
                .write_concern(inner.write_concern())
                .await
                .map_err(|e| inner.failure(e))?;
            Ok(changed.matched_count == 1)
        })
    }

    fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(move |inner| async move {
            let (locks, _) = inner.collections().await?;
            let found = locks
                .find_one(ours_live(&key, &token))
                .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
                .await
                .map_err(|e| inner.failure(e))?;
            Ok(found.is_some())
        })
    }

    fn supports_fencing(&self) -> bool {
        true
    }

    /// MongoDB cannot write two documents in one atomic step without a transaction, so the
    /// counter is a second write after the grant. Its order rests on the lease: the engine
    /// counts the token only when the whole answer arrives before the lease could have ended,
    /// and the next holder is granted only after that end or a release.
    fn acquire_fenced(&self, key: &str, token: &str, ttl: u32) -> Op<Option<u64>> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(move |inner| async move {
            let (locks, fences) = inner.collections().await?;
            if !inner.grant(&locks, &key, &token, ttl).await? {
                return Ok(None);
            }
            let counter = fences
                .find_one_and_update(doc! { "_id": &key }, doc! { "$inc": { "fence": 1_i64 } })
                .upsert(true)
                .return_document(ReturnDocument::After)
                .write_concern(inner.write_concern())
                .await
                .map_err(|e| inner.failure(e))?;
            let fence = counter.and_then(|d| match d.get("fence") {
                Some(Bson::Int64(n)) => Some(*n as u64),
                Some(Bson::Int32(n)) => Some(*n as u64),
                _ => None,
            });
            fence.map(Some).ok_or_else(|| {
                Failure::new(
                    "mongo",
                    BackendErrorKind::Protocol,
                    "the fence counter answered no number",
                )
            })
        })
    }
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
}
