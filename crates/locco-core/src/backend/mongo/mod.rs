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

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::{
    Acknowledgment, ClientOptions, IndexOptions, ReadPreference, ReturnDocument, SelectionCriteria,
    WriteConcern,
};
use mongodb::{Client, Collection, IndexModel};

use crate::backend::shared::io::{self, Failure};
use crate::backend::shared::wake_board::WakeBoard;
use crate::contract::queue::Queue;
use crate::contract::{Backend, KeyInfo, Op, Renewal};
use crate::rt::error::{BackendErrorKind, Error};

mod doctor;
mod failure;
mod operator;
mod options;
mod pipelines;
mod queue;

use failure::{is_duplicate_key, sentence};
use operator::regex_escape;
pub use options::MongoOptions;
use options::{lane_for, secrets_of, DEFAULT_POOL_SIZE};
use pipelines::{
    attempt_pipeline, live, live_places, lock_where, now_plus, ours_live, place_field,
};
use queue::{places_of, Attempt};

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

impl MongoBackend {
    /// Checks the options; connects on first use.
    pub fn new(options: MongoOptions) -> Result<Self, Error> {
        options.validate()?;
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

impl Inner {
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
