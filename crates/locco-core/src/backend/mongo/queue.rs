//! The fair queue's verbs: what a queued attempt learned from its document, the wake a release
//! sends to the head, and the change stream that passes wakes on to this adapter's waiters.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use mongodb::bson::{doc, Document};
use mongodb::options::{IndexOptions, ReturnDocument};
use mongodb::{Collection, IndexModel};

use crate::backend::shared::io;
use crate::contract::queue::{Queue, Queued};
use crate::contract::{Op, Waiter};

use super::pipelines::live_places;
use super::{Inner, MongoBackend};

/// What a queued attempt learned from the document it wrote.
#[derive(Default)]
pub(super) struct Attempt {
    pub(super) granted: bool,
    /// The key is free (released, or its lease ran out) but promised to `head`.
    free: bool,
    head: Option<(String, String)>,
    /// ms until the holder's lease ends, when we are the head of a held key.
    retry_in: Option<f64>,
}

impl Attempt {
    pub(super) fn of(doc: Document, attempt: &str, waiter: Option<&str>) -> Self {
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
pub(super) fn places_of(doc: &Document) -> Vec<(String, String)> {
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

impl Inner {
    /// Tells a head that it may try now: directly when it waits in this adapter, else through
    /// the wakes collection. Best effort: a lost wake costs the waiter one re-check.
    pub(super) async fn wake(
        &self,
        _locks: &Collection<Document>,
        (waiter, adapter): (String, String),
    ) {
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
}
