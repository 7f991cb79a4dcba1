//! The fair queue: our places in a key's queue, the queued attempt, and the queue's verbs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::backend::shared::io::{self, Failure};
use crate::contract::{Op, Queue, Queued, Waiter};

use super::failure::lease_gone;
use super::lease::Session;
use super::unsure::{Unsure, SWEEP_PAUSE};
use super::{ours_in, EtcdBackend, Inner};

/// A place of ours in a key's queue.
pub(super) struct Place {
    /// The place's create revision, its rank in the queue; `None` when an attempt's answer
    /// was lost and the place may or may not be there.
    revision: Option<i64>,
    deadline: Instant,
    generation: u64,
    session: Arc<Session>,
}

/// The create revision of `place` among a transaction's reads (nested ones included).
fn rank_in(responses: Vec<etcd_client::TxnOpResponse>, place: &[u8]) -> Option<i64> {
    responses.into_iter().find_map(|r| match r {
        etcd_client::TxnOpResponse::Get(g) => g
            .kvs()
            .iter()
            .find(|kv| kv.key() == place)
            .map(|kv| kv.create_revision()),
        etcd_client::TxnOpResponse::Txn(t) => rank_in(t.op_responses(), place),
        _ => None,
    })
}

// ## The fair queue
//
// A key's queue is a range of place keys, `<prefix>\x01q/<key>\x00<waiter>`, each attached to
// the waiter's session lease; a place's create revision is its rank, so the queue is ordered by
// arrival across the whole cluster. The head takes a free key in one transaction: "the key was
// never created, our place still has its revision, and every place in the range has a revision
// at least ours" → put the key, delete our place. A try (and a waiter's first attempt) needs an
// empty range. A place lives `lease` ms from its last renewal (an I/O-thread timer deletes it
// after that, as for locks), or until its session ends when its process died.
impl Inner {
    /// Records (or renews) our place and arms the timer that deletes it after `lease` ms.
    pub(super) fn keep_place(
        self: &Arc<Self>,
        key: &str,
        waiter: &str,
        revision: Option<i64>,
        lease: u32,
        session: Arc<Session>,
    ) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_millis(u64::from(lease));
        let id = (key.to_owned(), waiter.to_owned());
        self.places
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id.clone(),
                Place {
                    revision,
                    deadline,
                    generation,
                    session,
                },
            );
        let inner = Arc::downgrade(self);
        io::runtime().spawn(async move {
            tokio::time::sleep_until(deadline).await;
            let Some(inner) = inner.upgrade() else { return };
            let current = inner
                .places
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&id)
                .is_some_and(|p| p.generation == generation);
            if current {
                let _ = inner.leave_queue(&id.0, &id.1).await;
            }
        });
    }

    /// Deletes our place. One that cannot be deleted now is deleted in the background until
    /// that is confirmed, its session ends, or its waiter takes a place again.
    async fn leave_queue(self: &Arc<Self>, key: &str, waiter: &str) -> Result<(), Failure> {
        let id = (key.to_owned(), waiter.to_owned());
        let known = self
            .places
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
            .map(|p| p.session);
        let first = self.delete_place(key, waiter).await;
        if first.is_err() {
            let session = match known {
                Some(s) => Some(s),
                None => self.session.try_lock().ok().and_then(|s| s.clone()),
            };
            if let Some(session) = session {
                let inner = self.clone();
                io::runtime().spawn(async move {
                    loop {
                        tokio::time::sleep(SWEEP_PAUSE).await;
                        let back = inner
                            .places
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .contains_key(&id);
                        if back || session.is_lost() || inner.closed.load(Ordering::Acquire) {
                            return;
                        }
                        if inner.delete_place(&id.0, &id.1).await.is_ok() {
                            return;
                        }
                    }
                });
            }
        }
        first
    }

    async fn delete_place(&self, key: &str, waiter: &str) -> Result<(), Failure> {
        let kv = self.client().await?.kv_client();
        let place = self.place_key(key, waiter);
        self.bounded("leaving a queue", || {
            let (mut kv, place) = (kv.clone(), place.clone());
            async move { kv.delete(place, None).await }
        })
        .await?;
        Ok(())
    }

    /// One queued attempt (see the section's comment). Sent again after an election's failure,
    /// as a plain grant is; a lost answer leaves an [`Unsure`] record behind.
    async fn acquire_queued(
        self: &Arc<Self>,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: &str,
        lease: u32,
        abandon: &io::OnAbandon,
    ) -> Result<Queued, Failure> {
        let start = Instant::now();
        let mut replaced = false;
        loop {
            let session = self.session().await?;
            let kv = self.client().await?.kv_client();
            abandon.still_wanted("etcd")?;
            let (k, range, place) = (
                self.key(key),
                self.queue_prefix(key),
                self.place_key(key, waiter),
            );
            let known = {
                let places = self.places.lock().unwrap_or_else(|p| p.into_inner());
                places
                    .get(&(key.to_owned(), waiter.to_owned()))
                    .filter(|p| {
                        p.deadline > start && !p.session.is_lost() && p.session.id == session.id
                    })
                    .and_then(|p| p.revision)
            };
            let put_lock = TxnOp::put(
                k.clone(),
                token,
                Some(PutOptions::new().with_lease(session.id)),
            );
            let refusal = self.refusal_key(token);
            let txn = match known {
                // In the queue: the head takes a free key.
                Some(rank) => Txn::new()
                    .when([
                        Compare::create_revision(k.clone(), CompareOp::Equal, 0),
                        Compare::create_revision(place.clone(), CompareOp::Equal, rank),
                        Compare::create_revision(range.clone(), CompareOp::Greater, rank - 1)
                            .with_prefix(),
                    ])
                    .and_then([put_lock, TxnOp::delete(place.clone(), None)])
                    .or_else([TxnOp::get(place.clone(), None), TxnOp::get(k.clone(), None)]),
                // Not yet: a free key with nobody waiting is ours, else we join at the back,
                // unless an earlier copy of this attempt was applied and took the key (a
                // place put then would hold the queue up behind our own lock).
                None => Txn::new()
                    .when([
                        Compare::create_revision(k.clone(), CompareOp::Equal, 0),
                        Compare::create_revision(range.clone(), CompareOp::Equal, 0).with_prefix(),
                    ])
                    .and_then([put_lock, TxnOp::delete(place.clone(), None)])
                    .or_else([TxnOp::txn(
                        Txn::new()
                            .when([Compare::value(k.clone(), CompareOp::Equal, token)])
                            .and_then([TxnOp::get(k.clone(), None)])
                            .or_else([
                                TxnOp::put(
                                    place.clone(),
                                    waiter,
                                    Some(PutOptions::new().with_lease(session.id)),
                                ),
                                TxnOp::get(place.clone(), None),
                            ]),
                    )]),
            };
            // Every copy of this attempt needs its refusal mark absent (see [`Unsure`]).
            let txn = Txn::new()
                .when([Compare::version(refusal.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::txn(txn)]);
            let unsure = Unsure::new(
                self,
                key,
                token,
                refusal,
                Some((waiter.to_owned(), lease, known)),
                &session,
            );
            let mut copies = 0u32;
            let sent = self
                .bounded_while("a queued grant", Some(abandon), || {
                    copies += 1;
                    let (mut kv, txn) = (kv.clone(), txn.clone());
                    async move { kv.txn(txn).await }
                })
                .await;
            let resp = match sent {
                Ok(resp) => resp,
                // Refused as a whole: nothing was written. The session is replaced once.
                Err(f) if !replaced && lease_gone(&f) => {
                    unsure.settled();
                    session.end();
                    replaced = true;
                    continue;
                }
                Err(f) => return Err(f),
            };
            unsure.settled();
            let id = (key.to_owned(), waiter.to_owned());
            let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            // The attempt's own answer, inside the refusal check (which a live attempt passes).
            let granted = resp.succeeded()
                && matches!(
                    resp.op_responses().first(),
                    Some(etcd_client::TxnOpResponse::Txn(t)) if t.succeeded()
                );
            let fence = match granted {
                true => Some(revision),
                // As for a plain grant: only an earlier copy of this one counts as ours.
                false if copies > 1 => ours_in(resp.op_responses(), k.as_bytes(), token),
                false => None,
            };
            if let Some(fence) = fence {
                self.places
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                self.hold(
                    key,
                    token,
                    start + Duration::from_millis(u64::from(ttl)),
                    session,
                );
                return Ok(Queued::Granted(Some(fence.max(1) as u64)));
            }
            match rank_in(resp.op_responses(), place.as_bytes()) {
                Some(rank) => self.keep_place(key, waiter, Some(rank), lease, session),
                // Our place is gone (its lease ran out): the next attempt joins again.
                None => {
                    self.places
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id);
                }
            }
            return Ok(Queued::Waiting { retry_in: None });
        }
    }
}

impl Queue for EtcdBackend {
    fn acquire_queued(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: &str,
        lease: u32,
        fenced: bool,
    ) -> Op<Queued> {
        let (key, token, waiter) = (key.to_owned(), token.to_owned(), waiter.to_owned());
        self.run(move |inner, abandon| async move {
            let got = inner
                .acquire_queued(&key, &token, ttl, &waiter, lease, &abandon)
                .await?;
            Ok(match got {
                Queued::Granted(fence) if !fenced => {
                    let _ = fence;
                    Queued::Granted(None)
                }
                other => other,
            })
        })
    }

    fn leave(&self, key: &str, waiter: &str) -> Op<()> {
        let (key, waiter) = (key.to_owned(), waiter.to_owned());
        self.run(move |inner, _| async move { inner.leave_queue(&key, &waiter).await })
    }

    fn wakeups(&self, key: &str, _waiter: &str) -> Box<dyn Waiter> {
        self.watch_deletes(key, true, false)
    }
}
