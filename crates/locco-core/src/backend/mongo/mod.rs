//! The MongoDB backend: one document per key (`key`, `uniqueValue`, `expireAt`, and `grant`, the
//! marker of the attempt that took it), expiry compared on the server clock through `$$NOW`.
//!
//! Acquire is one pipeline upsert on `key`, atomic without a transaction; it rests on the unique
//! index on `key`, without which two upserts of a missing key could both insert. Dates are
//! computed with `$toLong`/`$toDate` arithmetic, which MongoDB 4.2 already has.
//!
//! The extensions that fall due together go in one `updateMany` per ttl over their keys and
//! tokens, then one `find` that tells each lock its own outcome (see [`Inner::extend_many`]).
//!
//! ## The fair queue
//!
//! A key's queue lives *in its lock document*, as `queue: [{ w: waiter, a: adapter, exp }]`,
//! oldest first. MongoDB updates one document atomically, so keeping the places beside the
//! lease makes "the key is free and no live place is ahead of us" one condition of the same
//! pipeline upsert that takes the key: every attempt, queued or a try, stays one command, and
//! the uncontended one differs from the queue-less upsert only by a filter over a missing
//! array (a queue in a second collection could not be read and written in the same atomic
//! step without a transaction). A place whose `exp` passed is dropped by the next write.
//!
//! A release that finds live places does not delete the document: it leaves it *free but
//! reserved* (no `uniqueValue`, `expireAt` at the last place's end, so the TTL index still
//! removes it once every place ran out), and pushes a wake to the head. A free key is one
//! without `uniqueValue` or whose `expireAt` passed; a release without waiters still deletes
//! the document in one command. An older adapter, which reads only `expireAt`, sees a
//! reserved key as held: it can wait longer, never barge or overlap.
//!
//! Pushes go through `<collectionName>-wakes`: a release (or a leave, or an attempt that finds
//! a free key its head has not come for) inserts `{ w, a, at }` for the head, and each adapter
//! keeps one change stream on that collection, filtered to its own `a`, that wakes the waiter
//! through its [`WakeBoard`]. A head in the releasing adapter itself is woken directly. The
//! wakes expire through a TTL index on `at`. Without change streams, or while the stream is
//! down, waiters fall back to their re-checks; after the stream was lost, every waiter of the
//! adapter re-checks at once.
//!
//! A lock whose holder died keeps its queue only as long as the document lives: the TTL
//! monitor may remove a document whose lease ran out before the head took it (it runs once a
//! minute on MongoDB); the waiters then queue again on their next re-check, in their order of
//! arrival.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::error::{ErrorKind, WriteFailure};
use mongodb::options::{
    Acknowledgment, ClientOptions, IndexOptions, ReadPreference, ReturnDocument, SelectionCriteria,
    WriteConcern,
};
use mongodb::{Client, Collection, IndexModel};

use crate::backend::shared::io::{self, redact, Failure};
use crate::backend::shared::wake_board::WakeBoard;
use crate::contract::queue::{Queue, Queued};
use crate::contract::value::holder_of;
use crate::contract::{Backend, KeyInfo, Op, Renewal, Waiter};
use crate::rt::error::{BackendErrorKind, Error};

mod doctor;

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
    /// This adapter's name in the places it holds, so that a wake reaches only it.
    adapter_id: String,
    board: WakeBoard,
    /// Whether the change stream of wakes was started (with the first queued attempt).
    pushes_started: AtomicBool,
    stop: Arc<tokio::sync::Notify>,
    lane: io::Lane,
}

/// Locks in a MongoDB collection.
#[derive(Clone)]
pub struct MongoBackend {
    inner: Arc<Inner>,
}

/// The driver's connection pool when the URL does not size it (the driver's own default, set
/// explicitly so that the lane below always matches it).
const DEFAULT_POOL_SIZE: u32 = 10;

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
fn lane_for(url: &str) -> io::Lane {
    match pool_size_of(url).unwrap_or(DEFAULT_POOL_SIZE) {
        0 => io::Lane::default(),
        n => io::Lane::new((n as usize).min(io::LANE_WIDTH)),
    }
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
                client: tokio::sync::OnceCell::new(),
                secrets,
                indexes_ready: tokio::sync::OnceCell::new(),
                closed: Default::default(),
                adapter_id: crate::rt::ids::random_token(),
                board: WakeBoard::default(),
                pushes_started: AtomicBool::new(false),
                stop: Arc::new(tokio::sync::Notify::new()),
                lane: lane_for(&options.url),
                options,
            }),
        })
    }

    /// Closes the client; operations afterwards fail.
    pub fn close(&self) {
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.inner.stop.notify_one();
        if let Some(client) = self.inner.client.get().cloned() {
            io::runtime().spawn(async move { client.shutdown().await });
        }
    }

    /// `work` on the I/O thread, in this backend's lane; a grant checks the [`io::OnAbandon`]
    /// before it sends (see [`io::OnAbandon::still_wanted`]).
    fn run<T: Send + 'static, F>(&self, work: impl FnOnce(Arc<Inner>, io::OnAbandon) -> F) -> Op<T>
    where
        F: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let inner = self.inner.clone();
        io::run_in(&self.inner.lane, "mongo", move |abandon| {
            work(inner, abandon)
        })
    }
}

/// `$$NOW` plus `ttl` ms, with operators MongoDB 4.2 has (no `$add` on a date, no `$dateAdd`).
fn now_plus(ttl: u32) -> Document {
    doc! { "$toDate": { "$add": [ { "$toLong": "$$NOW" }, i64::from(ttl) ] } }
}

/// The document is ours and its lease still runs.
fn ours_live(key: &str, token: &str) -> Document {
    live(doc! { "key": key, "uniqueValue": token })
}

/// The documents `filter` matches whose lease still runs by the server's clock. The clock test
/// is an `$expr` beside the filter in an `$and`, not a field of it: MongoDB plans both the same,
/// but a planner that gives up on a filter with `$expr` in it (secantusd-rs does) would scan the
/// whole collection for every release and extension instead of using the key's index.
fn live(filter: Document) -> Document {
    doc! { "$and": [ filter, { "$expr": { "$gt": [ "$expireAt", "$$NOW" ] } } ] }
}

/// The documents `filter` matches that are live leases this library wrote: a string `key`, a
/// string token in `uniqueValue`, a date in `expireAt` that the server's clock has not passed,
/// and no `queue` or an array of places. The one test of the operator verbs (`inspect`, `list`,
/// `forceRelease`), so that what they show is exactly what a forced release would delete, and
/// neither counts nor deletes anything else in the collection: a key only reserved for a
/// waiter, or a document the application put there.
///
/// The types are read by the aggregation `$type` in the `$expr`, not by a query's `$type`,
/// which also matches an array holding a value of that type (and a query on `key` matches an
/// array containing the key); and only a date compares with `$$NOW` as a lease end (a BSON
/// timestamp sorts after every date).
fn lock_where(filter: Document) -> Document {
    let is = |field: &str, ty: &str| doc! { "$eq": [ { "$type": field }, ty ] };
    doc! { "$and": [ filter, { "$expr": { "$and": [
        is("$key", "string"),
        is("$uniqueValue", "string"),
        is("$expireAt", "date"),
        { "$in": [ { "$type": "$queue" }, [ "missing", "array" ] ] },
        { "$gt": [ "$expireAt", "$$NOW" ] },
    ] } } ] }
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
                // The size the lane was made for (see `lane_for`).
                options.max_pool_size.get_or_insert(DEFAULT_POOL_SIZE);
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

    async fn database(&self) -> Result<mongodb::Database, Failure> {
        let client = self.client().await?;
        Ok(match &self.options.db_name {
            Some(name) => client.database(name),
            None => client
                .default_database()
                .unwrap_or_else(|| client.database("locco")),
        })
    }

    /// Where wakes are pushed: `<collectionName>-wakes`.
    async fn wakes(&self) -> Result<Collection<Document>, Failure> {
        let db = self.database().await?;
        Ok(db.collection::<Document>(&format!("{}-wakes", self.options.collection_name)))
    }

    async fn collections(&self) -> Result<(Collection<Document>, Collection<Document>), Failure> {
        let db = self.database().await?;
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

    /// The pipeline upsert: takes the key when it is free and no live place is ahead of
    /// `waiter` (a try, `None`, never queues and needs an empty queue). A queued attempt that
    /// is not granted joins the queue at the back, or renews its place.
    async fn attempt(
        &self,
        locks: &Collection<Document>,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: Option<(&str, u32)>,
    ) -> Result<Attempt, Failure> {
        // `grant` marks which attempt took the key: the token alone cannot tell, since a
        // second acquire with the same token must fail (no re-entrancy).
        let attempt = crate::rt::ids::random_token();
        let update = attempt_pipeline(token, ttl, &attempt, waiter, &self.adapter_id);
        let projection = match waiter {
            None => doc! { "grant": 1, "_id": 0 },
            Some(_) => {
                doc! { "grant": 1, "uniqueValue": 1, "expireAt": 1, "queue": 1, "at": 1, "_id": 0 }
            }
        };
        // A queued attempt that lost the race to insert the document asks once more: the
        // document exists then, and it must get its place.
        let tries = if waiter.is_some() { 2 } else { 1 };
        for _ in 0..tries {
            let result = locks
                .find_one_and_update(doc! { "key": key }, update.clone())
                .upsert(true)
                .return_document(ReturnDocument::After)
                .projection(projection.clone())
                .write_concern(self.write_concern())
                .await;
            match result {
                Ok(Some(doc)) => return Ok(Attempt::of(doc, &attempt, waiter.map(|w| w.0))),
                Ok(None) => return Ok(Attempt::default()),
                // Two upserts of a missing key raced and the unique index refused the second:
                // another holder has it.
                Err(e) if is_duplicate_key(&e) => continue,
                Err(e) => return Err(self.failure(e)),
            }
        }
        Ok(Attempt::default())
    }

    /// Takes the key's next fencing token.
    async fn fence_next(&self, fences: &Collection<Document>, key: &str) -> Result<u64, Failure> {
        let counter = fences
            .find_one_and_update(doc! { "_id": key }, doc! { "$inc": { "fence": 1_i64 } })
            .upsert(true)
            .return_document(ReturnDocument::After)
            .write_concern(self.write_concern())
            .await
            .map_err(|e| self.failure(e))?;
        let fence = counter.and_then(|d| match d.get("fence") {
            Some(Bson::Int64(n)) => Some(*n as u64),
            Some(Bson::Int32(n)) => Some(*n as u64),
            _ => None,
        });
        fence.ok_or_else(|| {
            Failure::new(
                "mongo",
                BackendErrorKind::Protocol,
                "the fence counter answered no number",
            )
        })
    }

    /// Deletes our live key. With live places it stays as a free key reserved for its head,
    /// who is woken. True when the key was ours.
    async fn release(
        &self,
        locks: &Collection<Document>,
        key: &str,
        token: &str,
    ) -> Result<bool, Failure> {
        self.release_where(locks, ours_live(key, token)).await
    }

    /// [`Inner::release`] of the live lease `filter` matches.
    async fn release_where(
        &self,
        locks: &Collection<Document>,
        filter: Document,
    ) -> Result<bool, Failure> {
        // Nobody waits (the usual case): one delete, as without a queue.
        // (A queue whose places all ran out takes the second step.)
        let mut alone = filter.clone();
        alone.insert("queue", doc! { "$exists": false });
        let deleted = locks
            .delete_one(alone)
            .write_concern(self.write_concern())
            .await
            .map_err(|e| self.failure(e))?;
        if deleted.deleted_count == 1 {
            return Ok(true);
        }
        let reserve = vec![
            doc! { "$set": { "queue": live_places() } },
            doc! { "$set": {
                "uniqueValue": "$$REMOVE",
                "expireAt": { "$ifNull": [ { "$max": place_field("$queue", "exp") }, "$$NOW" ] },
                "queue": { "$cond": [ { "$eq": [ { "$size": "$queue" }, 0 ] }, "$$REMOVE", "$queue" ] },
                "at": "$$NOW",
            } },
        ];
        let after = locks
            .find_one_and_update(filter, reserve)
            .return_document(ReturnDocument::After)
            .projection(doc! { "queue": 1, "_id": 0 })
            .write_concern(self.write_concern())
            .await
            .map_err(|e| self.failure(e))?;
        let Some(after) = after else { return Ok(false) };
        if let Some(head) = places_of(&after).into_iter().next() {
            self.wake(locks, head).await;
        }
        Ok(true)
    }

    /// Tells a head that it may try now: directly when it waits in this adapter, else through
    /// the wakes collection. Best effort: a lost wake costs the waiter one re-check.
    async fn wake(&self, _locks: &Collection<Document>, (waiter, adapter): (String, String)) {
        if adapter == self.adapter_id {
            self.board.wake(&waiter);
            return;
        }
        if let Ok(wakes) = self.wakes().await {
            let wake = doc! { "w": waiter, "a": adapter, "at": mongodb::bson::DateTime::now() };
            let _ = wakes
                .insert_one(wake)
                .write_concern(self.write_concern())
                .await;
        }
    }
}

/// One renewal: key, token, ttl.
type Renewing = (String, String, u32);

impl Inner {
    /// Renews many locks, each exactly as [`Backend::extend`] would answer: one `updateMany`
    /// per ttl among them (usually one) of the live documents whose key is one of theirs and
    /// whose token is one of theirs, with the single extension's update; then, unless nothing
    /// matched, one `find` of their keys on a live lease, which answers each lock.
    ///
    /// Two lists, not the pairs: an `$or` of a thousand (key, token) pairs is planned as a scan
    /// of the collection by some servers (secantusd-rs), and a batched write of an update per
    /// lock costs the server a transaction each (4-5 times the CPU of this, measured there).
    /// The lists also match a key whose document carries another lock's token, so the count
    /// cannot say which matched: the find does. The unique index gives a key one document,
    /// which carries one token. A document that carries our token on a live lease after the
    /// update carried it on a live lease when the update ran (only a holder of our token
    /// writes it, and nothing revives an expired lease), so the update matched it and renewed
    /// its lease: `true`. One that does not is gone, expired or another holder's: `false`, as
    /// the single extension answers (or, should the new lease already have run out, as it
    /// would a moment later: never `true` for a lock not held).
    async fn extend_many(&self, renewals: &[Renewing]) -> Result<Vec<bool>, Failure> {
        let (locks, _) = self.collections().await?;
        let mut by_ttl: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
        for (i, (_, _, ttl)) in renewals.iter().enumerate() {
            by_ttl.entry(*ttl).or_default().push(i);
        }
        let updates = by_ttl.iter().map(|(ttl, group)| {
            let keys: Vec<&str> = group.iter().map(|&i| renewals[i].0.as_str()).collect();
            let tokens: Vec<&str> = group.iter().map(|&i| renewals[i].1.as_str()).collect();
            let filter = live(doc! { "key": { "$in": keys }, "uniqueValue": { "$in": tokens } });
            let update = vec![doc! { "$set": { "expireAt": now_plus(*ttl) } }];
            let locks = &locks;
            async move {
                let changed = locks
                    .update_many(filter, update)
                    .write_concern(self.write_concern())
                    .await
                    .map_err(|e| self.failure(e))?;
                Ok::<_, Failure>(changed.matched_count)
            }
        });
        let matched: u64 = futures_util::future::try_join_all(updates)
            .await?
            .into_iter()
            .sum();
        if matched == 0 {
            return Ok(vec![false; renewals.len()]);
        }
        let keys: Vec<&str> = renewals.iter().map(|(key, _, _)| key.as_str()).collect();
        let mut found = locks
            .find(live(doc! { "key": { "$in": keys } }))
            .projection(doc! { "key": 1, "uniqueValue": 1, "_id": 0 })
            // Every document in the first reply: no getMore round trips.
            .batch_size(u32::try_from(renewals.len()).unwrap_or(u32::MAX))
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .await
            .map_err(|e| self.failure(e))?;
        // The token on each live key's document (one document a key).
        let mut live_tokens = std::collections::HashMap::new();
        while found.advance().await.map_err(|e| self.failure(e))? {
            let d = found.current();
            if let (Ok(key), Ok(token)) = (d.get_str("key"), d.get_str("uniqueValue")) {
                live_tokens.insert(key.to_owned(), token.to_owned());
            }
        }
        Ok(renewals
            .iter()
            .map(|(key, token, _)| live_tokens.get(key) == Some(token))
            .collect())
    }
}

/// What a queued attempt learned from the document it wrote.
#[derive(Default)]
struct Attempt {
    granted: bool,
    /// The key is free (released, or its lease ran out) but promised to `head`.
    free: bool,
    head: Option<(String, String)>,
    /// ms until the holder's lease ends, when we are the head of a held key.
    retry_in: Option<f64>,
}

impl Attempt {
    fn of(doc: Document, attempt: &str, waiter: Option<&str>) -> Self {
        let granted = doc.get_str("grant").is_ok_and(|g| g == attempt);
        let Some(waiter) = waiter.filter(|_| !granted) else {
            return Attempt {
                granted,
                ..Default::default()
            };
        };
        let at = doc.get_datetime("at").ok().map(|d| d.timestamp_millis());
        let end = doc
            .get_datetime("expireAt")
            .ok()
            .map(|d| d.timestamp_millis());
        let held =
            doc.get_str("uniqueValue").is_ok() && matches!((at, end), (Some(a), Some(e)) if e > a);
        let head = places_of(&doc).into_iter().next();
        let we_lead = head.as_ref().is_some_and(|(w, _)| w == waiter);
        let retry_in = match (held && we_lead, at, end) {
            (true, Some(a), Some(e)) => Some((e - a) as f64),
            _ => None,
        };
        Attempt {
            granted,
            free: !held,
            head: head.filter(|_| !we_lead),
            retry_in,
        }
    }
}

/// The places of a document: waiter and adapter, oldest first.
fn places_of(doc: &Document) -> Vec<(String, String)> {
    let Ok(queue) = doc.get_array("queue") else {
        return Vec::new();
    };
    queue
        .iter()
        .filter_map(|p| p.as_document())
        .filter_map(|p| {
            Some((
                p.get_str("w").ok()?.to_owned(),
                p.get_str("a").ok()?.to_owned(),
            ))
        })
        .collect()
}

/// The document's places whose lease still runs, oldest first.
fn live_places() -> Document {
    doc! { "$filter": {
        "input": { "$ifNull": [ "$queue", [] ] },
        "cond": { "$gt": [ "$$this.exp", "$$NOW" ] },
    } }
}

/// One field of every place in `array` (`$map`, since some servers answer `$a.b` on an empty
/// array with a missing value).
fn place_field(array: &str, field: &str) -> Document {
    doc! { "$map": { "input": array, "in": format!("$$this.{field}") } }
}

/// The acquire pipeline (see [`Inner::attempt`]). Helper fields `_q` (the live places), `_f`
/// (the key is free), `_ok` (we take it) and `_in` (we have a place) are dropped at the end.
fn attempt_pipeline(
    token: &str,
    ttl: u32,
    attempt: &str,
    waiter: Option<(&str, u32)>,
    adapter: &str,
) -> Vec<Document> {
    let free = doc! { "$or": [
        { "$eq": [ { "$ifNull": [ "$uniqueValue", Bson::Null ] }, Bson::Null ] },
        { "$eq": [ { "$type": "$expireAt" }, "missing" ] },
        { "$lte": [ "$expireAt", "$$NOW" ] },
    ] };
    let Some((me, lease)) = waiter else {
        // A try: one stage, which never writes the queue (the next queued write drops the
        // places that ran out), so that the uncontended grant costs what it did without one.
        let nobody_waits = doc! { "$cond": [
            { "$eq": [ { "$type": "$queue" }, "missing" ] },
            true,
            { "$eq": [ { "$size": live_places() }, 0 ] },
        ] };
        let ok = doc! { "$and": [ free.clone(), nobody_waits ] };
        return vec![doc! { "$set": {
            "uniqueValue": { "$cond": [ ok.clone(), token, "$uniqueValue" ] },
            "expireAt": { "$cond": [ ok.clone(), now_plus(ttl), "$expireAt" ] },
            "grant": { "$cond": [ ok, attempt, "$grant" ] },
        } }];
    };
    let nobody_ahead = doc! { "$or": [
        { "$eq": [ { "$size": "$_q" }, 0 ] },
        { "$eq": [ { "$arrayElemAt": [ place_field("$_q", "w"), 0 ] }, me ] },
    ] };
    let without_me = doc! { "$filter": { "input": "$_q", "cond": { "$ne": [ "$$this.w", me ] } } };
    let place_end = now_plus(lease);
    // Waiting on a free key reserves it: no holder, and the document lives as long as its
    // last place.
    let reserve = doc! { "$and": [ { "$not": [ "$_ok" ] }, "$_f" ] };
    let renewed = doc! { "$map": { "input": "$_q", "in": { "$cond": [
        { "$eq": [ "$$this.w", me ] },
        { "w": "$$this.w", "a": "$$this.a", "exp": place_end.clone() },
        "$$this",
    ] } } };
    let joined = doc! { "$concatArrays": [ "$_q", [ { "w": me, "a": adapter, "exp": place_end.clone() } ] ] };
    let set = doc! {
        "uniqueValue": { "$cond": [ "$_ok", token, { "$cond": [ reserve.clone(), "$$REMOVE", "$uniqueValue" ] } ] },
        "expireAt": { "$cond": [ "$_ok", now_plus(ttl), { "$cond": [ reserve,
            { "$max": [ place_end, { "$max": place_field("$_q", "exp") } ] },
            "$expireAt",
        ] } ] },
        "grant": { "$cond": [ "$_ok", attempt, "$grant" ] },
        "queue": { "$cond": [ "$_ok", without_me, { "$cond": [ "$_in", renewed, joined ] } ] },
        "at": "$$NOW",
    };
    vec![
        doc! { "$set": { "_q": live_places(), "_f": free } },
        doc! { "$set": {
            "_ok": { "$and": [ "$_f", nobody_ahead ] },
            "_in": { "$in": [ me, place_field("$_q", "w") ] },
        } },
        doc! { "$set": set },
        doc! { "$set": { "queue": { "$cond": [ { "$eq": [ { "$size": "$queue" }, 0 ] }, "$$REMOVE", "$queue" ] } } },
        doc! { "$unset": [ "_q", "_f", "_ok", "_in" ] },
    ]
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
        self.run(move |inner, abandon| async move {
            let (locks, _) = inner.collections().await?;
            abandon.still_wanted("mongo")?;
            Ok(inner
                .attempt(&locks, &key, &token, ttl, None)
                .await?
                .granted)
        })
    }

    fn release(&self, key: &str, token: &str) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(move |inner, _| async move {
            let (locks, _) = inner.collections().await?;
            inner.release(&locks, &key, &token).await
        })
    }

    fn extend(&self, key: &str, token: &str, ttl: u32) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(move |inner, _| async move {
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

    /// Every renewal in an `updateMany` per ttl and at most one `find` (see
    /// [`Inner::extend_many`]).
    fn extend_many(&self, renewals: &[Renewal<'_>]) -> Op<Vec<crate::rt::error::Result<bool>>> {
        if renewals.is_empty() {
            return Op::ready(Ok(Vec::new()));
        }
        let renewals: Vec<Renewing> = renewals
            .iter()
            .map(|r| (r.key.to_owned(), r.token.to_owned(), r.ttl))
            .collect();
        // A heartbeat does not wait for room in the lane.
        let inner = self.inner.clone();
        let op = io::run("mongo", move |_| async move {
            inner.extend_many(&renewals).await
        });
        let each = |all: Vec<bool>| all.into_iter().map(Ok).collect();
        match op {
            Op::Ready(answer) => Op::Ready(answer.map(|all| all.map(each))),
            Op::Pending(fut, stop) => {
                Op::Pending(Box::pin(async move { fut.await.map(each) }), stop)
            }
        }
    }

    fn is_held(&self, key: &str, token: &str) -> Op<bool> {
        let (key, token) = (key.to_owned(), token.to_owned());
        self.run(move |inner, _| async move {
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
        self.run(move |inner, abandon| async move {
            let (locks, fences) = inner.collections().await?;
            abandon.still_wanted("mongo")?;
            if !inner
                .attempt(&locks, &key, &token, ttl, None)
                .await?
                .granted
            {
                return Ok(None);
            }
            inner.fence_next(&fences, &key).await.map(Some)
        })
    }

    fn queue(&self) -> Option<&dyn Queue> {
        Some(self)
    }

    fn inspect(&self, key: &str) -> Op<KeyInfo> {
        let key = key.to_owned();
        self.run(move |inner, _| async move {
            let (locks, fences) = inner.collections().await?;
            let mut found = inner.look(&locks, doc! { "key": &key }, 1).await?;
            let mut info = found.pop().unwrap_or(KeyInfo {
                key: key.clone(),
                ..KeyInfo::default()
            });
            let counter = fences
                .find_one(doc! { "_id": &key })
                .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
                .await
                .map_err(|e| inner.failure(e))?;
            info.fence = counter.and_then(|d| match d.get("fence") {
                Some(Bson::Int64(n)) => Some(*n as u64),
                Some(Bson::Int32(n)) => Some(*n as u64),
                _ => None,
            });
            Ok(info)
        })
    }

    /// A prefix regex on `key` (anchored, so it walks the unique index), then one look at
    /// the fence counters of the keys found.
    fn list(&self, prefix: &str, limit: u32) -> Op<Vec<KeyInfo>> {
        let pattern = format!("^{}", regex_escape(prefix));
        self.run(move |inner, _| async move {
            let (locks, fences) = inner.collections().await?;
            let filter = doc! { "key": { "$regex": pattern } };
            let mut found = inner.look(&locks, filter, limit).await?;
            let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
            let mut counters = fences
                .find(doc! { "_id": { "$in": keys } })
                .await
                .map_err(|e| inner.failure(e))?;
            let mut by_key = std::collections::HashMap::new();
            while counters.advance().await.map_err(|e| inner.failure(e))? {
                let d = counters
                    .deserialize_current()
                    .map_err(|e| inner.failure(e))?;
                let fence = match d.get("fence") {
                    Some(Bson::Int64(n)) => *n as u64,
                    Some(Bson::Int32(n)) => *n as u64,
                    _ => continue,
                };
                if let Ok(k) = d.get_str("_id") {
                    by_key.insert(k.to_owned(), fence);
                }
            }
            for info in &mut found {
                info.fence = by_key.get(&info.key).copied();
            }
            Ok(found)
        })
    }

    /// Like a release by anyone's token: with live places the key stays, reserved for its
    /// head, who is woken.
    fn force_release(&self, key: &str) -> Op<bool> {
        let key = key.to_owned();
        self.run(move |inner, _| async move {
            let (locks, _) = inner.collections().await?;
            inner
                .release_where(&locks, lock_where(doc! { "key": &key }))
                .await
        })
    }
}

/// A string taken literally in a regular expression.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\^$.|?*+()[]{}-/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Inner {
    /// The live leases among the documents `filter` matches (at most `limit`, in key order),
    /// with the time left by the server's clock: those [`lock_where`] accepts.
    async fn look(
        &self,
        locks: &Collection<Document>,
        filter: Document,
        limit: u32,
    ) -> Result<Vec<KeyInfo>, Failure> {
        let pipeline = vec![
            doc! { "$match": lock_where(filter) },
            doc! { "$sort": { "key": 1 } },
            doc! { "$limit": i64::from(limit.max(1)) },
            doc! { "$project": {
                "_id": 0, "key": 1, "uniqueValue": 1,
                "left": { "$subtract": [ { "$toLong": "$expireAt" }, { "$toLong": "$$NOW" } ] },
            } },
        ];
        let mut cursor = locks
            .aggregate(pipeline)
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .await
            .map_err(|e| self.failure(e))?;
        let mut out = Vec::new();
        while cursor.advance().await.map_err(|e| self.failure(e))? {
            let d = cursor.deserialize_current().map_err(|e| self.failure(e))?;
            let left = match d.get("left") {
                Some(Bson::Int64(n)) => *n as f64,
                Some(Bson::Int32(n)) => f64::from(*n),
                Some(Bson::Double(n)) => *n,
                _ => 0.0,
            };
            out.push(KeyInfo {
                key: d.get_str("key").unwrap_or_default().to_owned(),
                held: true,
                ttl_left: Some(left.max(0.0)),
                fence: None,
                holder: d.get_str("uniqueValue").ok().and_then(holder_of),
            });
        }
        Ok(out)
    }
}

impl Queue for MongoBackend {
    fn acquire_queued(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: &str,
        lease: u32,
        fenced: bool,
    ) -> Op<Queued> {
        self.start_pushes();
        let (key, token, waiter) = (key.to_owned(), token.to_owned(), waiter.to_owned());
        let lease = lease.max(MIN_PLACE_LEASE_MS);
        self.run(move |inner, abandon| async move {
            let (locks, fences) = inner.collections().await?;
            abandon.still_wanted("mongo")?;
            let attempt = inner
                .attempt(&locks, &key, &token, ttl, Some((&waiter, lease)))
                .await?;
            if attempt.granted {
                let fence = match fenced {
                    true => Some(inner.fence_next(&fences, &key).await?),
                    false => None,
                };
                return Ok(Queued::Granted(fence));
            }
            // A free key promised to a head that has not come: its push may have been lost.
            if let (true, Some(head)) = (attempt.free, attempt.head) {
                inner.wake(&locks, head).await;
            }
            Ok(Queued::Waiting {
                retry_in: attempt.retry_in,
            })
        })
    }

    fn leave(&self, key: &str, waiter: &str) -> Op<()> {
        let (key, waiter) = (key.to_owned(), waiter.to_owned());
        self.run(move |inner, _| async move {
            let (locks, _) = inner.collections().await?;
            let without = vec![
                doc! { "$set": { "queue": { "$filter": {
                    "input": live_places(), "cond": { "$ne": [ "$$this.w", &waiter ] },
                } } } },
                doc! { "$set": {
                    "queue": { "$cond": [ { "$eq": [ { "$size": "$queue" }, 0 ] }, "$$REMOVE", "$queue" ] },
                    "at": "$$NOW",
                } },
            ];
            let after = locks
                .find_one_and_update(doc! { "key": &key, "queue.w": &waiter }, without)
                .return_document(ReturnDocument::After)
                .projection(doc! { "uniqueValue": 1, "expireAt": 1, "queue": 1, "at": 1, "_id": 0 })
                .write_concern(inner.write_concern())
                .await
                .map_err(|e| inner.failure(e))?;
            // The new head of a free key may take it now (a spurious wake, when we were not
            // the head, costs it one attempt).
            if let Some(after) = after {
                let state = Attempt::of(after, "", Some(""));
                if let (true, Some(head)) = (state.free, state.head) {
                    inner.wake(&locks, head).await;
                }
            }
            Ok(())
        })
    }

    fn wakeups(&self, _key: &str, waiter: &str) -> Box<dyn Waiter> {
        self.inner.board.listen(waiter)
    }
}

/// A place in a key's queue never lives shorter than this, whatever the engine asks.
const MIN_PLACE_LEASE_MS: u32 = 100;
/// How often a change stream with nothing to tell checks whether its adapter is still there.
const IDLE_CHECK: Duration = Duration::from_secs(5);
/// Wakes are kept this long for a change stream that resumes; they are read at once.
const WAKES_KEEP: Duration = Duration::from_secs(60);

impl MongoBackend {
    /// Opens the change stream of wakes, once: with the adapter's first queued attempt, so
    /// that it is usually in place by the time that attempt's waiter waits.
    fn start_pushes(&self) {
        if !self.inner.pushes_started.swap(true, Ordering::AcqRel) {
            let stop = self.inner.stop.clone();
            io::runtime().spawn(watch_wakes(Arc::downgrade(&self.inner), stop));
        }
    }
}

/// Passes each wake for this adapter on to its waiter, until the adapter is closed or gone.
/// A stream that fails or ends is opened again with a backoff, and every waiter re-checks.
async fn watch_wakes(inner: Weak<Inner>, stop: Arc<tokio::sync::Notify>) {
    use futures_util::StreamExt;
    let mut backoff = Duration::from_millis(50);
    let mut was_open = false;
    let mut ttl_index = false;
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        if strong.closed.load(Ordering::Acquire) {
            return;
        }
        let (board, id) = (strong.board.clone(), strong.adapter_id.clone());
        let open = async {
            let wakes = strong.wakes().await?;
            if !ttl_index && strong.options.create_indexes {
                let index = IndexModel::builder()
                    .keys(doc! { "at": 1 })
                    .options(
                        IndexOptions::builder()
                            .expire_after(WAKES_KEEP)
                            .name("locco_at_ttl".to_string())
                            .build(),
                    )
                    .build();
                ttl_index = wakes.create_index(index).await.is_ok();
            }
            let filter = doc! { "$match": { "operationType": "insert", "fullDocument.a": &id } };
            wakes
                .watch()
                .pipeline([filter])
                .await
                .map_err(|e| strong.failure(e))
        };
        let opened = tokio::time::timeout(Duration::from_secs(5), open).await;
        drop(strong);
        if let Ok(Ok(mut stream)) = opened {
            if was_open {
                board.wake_all();
            }
            was_open = true;
            backoff = Duration::from_millis(50);
            loop {
                tokio::select! {
                    event = stream.next() => match event {
                        Some(Ok(event)) => {
                            let wake = event.full_document.filter(|d| d.get_str("a").is_ok_and(|a| a == id));
                            if let Some(waiter) = wake.as_ref().and_then(|d| d.get_str("w").ok()) {
                                board.wake(waiter);
                            }
                        }
                        _ => break,
                    },
                    _ = stop.notified() => return,
                    _ = tokio::time::sleep(IDLE_CHECK) => {
                        if inner.strong_count() == 0 {
                            return;
                        }
                    }
                }
            }
            // Pushes may have been missed while the stream was down.
            board.wake_all();
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.notified() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_reads_its_turn_from_the_document_it_wrote() {
        use mongodb::bson::DateTime;
        let at = DateTime::from_millis(1_000_000);
        let place = |w: &str| doc! { "w": w, "a": "A", "exp": DateTime::from_millis(1_003_000) };
        // Held, we are the head: wait for the holder's lease end, nobody to wake.
        let held = doc! {
            "uniqueValue": "t", "expireAt": DateTime::from_millis(1_000_400), "at": at,
            "queue": [ place("me"), place("other") ], "grant": "g",
        };
        let a = Attempt::of(held, "mine", Some("me"));
        assert!(!a.granted && !a.free && a.head.is_none());
        assert_eq!(a.retry_in, Some(400.0));
        // Free but promised to another head: wake it, no hint for us.
        let reserved = doc! { "expireAt": DateTime::from_millis(1_003_000), "at": at, "queue": [ place("other"), place("me") ] };
        let a = Attempt::of(reserved, "mine", Some("me"));
        assert!(a.free && a.retry_in.is_none());
        assert_eq!(a.head, Some(("other".to_string(), "A".to_string())));
        // A lease that ran out is free too.
        let lapsed = doc! { "uniqueValue": "t", "expireAt": DateTime::from_millis(999_000), "at": at, "queue": [ place("other") ] };
        assert!(Attempt::of(lapsed, "mine", Some("me")).free);
        // Our own grant.
        assert!(Attempt::of(doc! { "grant": "mine" }, "mine", Some("me")).granted);
    }

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
    fn the_pool_size_comes_from_the_url_whatever_its_case() {
        assert_eq!(pool_size_of("mongodb://h/db?w=1&maxPoolSize=3"), Some(3));
        assert_eq!(pool_size_of("mongodb://h/?MAXPOOLSIZE=0"), Some(0));
        assert_eq!(pool_size_of("mongodb://h/db?minPoolSize=2"), None);
        assert_eq!(pool_size_of("mongodb://h/db"), None);
    }
}
