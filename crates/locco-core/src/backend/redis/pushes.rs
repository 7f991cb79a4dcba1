//! Pushes to this adapter's waiters: one pub/sub connection per adapter, subscribed to the
//! adapter's own channel. A release publishes to the channel of the queue's head only, so a
//! push costs one message to one process, and only when someone waits.
//!
//! The subscription starts with the adapter's first queued attempt, before that attempt can
//! be answered "wait", so the first waiter does not miss its first push.
//!
//! A push only says "try now". One that is lost (a dropped connection, a failover, or one sent
//! in the moment before the first subscription took effect) is covered by the waiters'
//! re-checks; after a subscription dropped, every waiter re-checks at once when it is back.
//! (Not after the first: a wake-up nobody lost would cost every waiter one of its retries.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::Client;

use crate::backend::shared::io::runtime;
use crate::backend::shared::wake_board::WakeBoard;
use crate::contract::Waiter;

/// How often a subscriber with nobody to tell checks whether its adapter is still there.
const IDLE_CHECK: Duration = Duration::from_secs(5);

#[derive(Default)]
pub(super) struct Pushes {
    board: WakeBoard,
    started: AtomicBool,
    stop: Arc<tokio::sync::Notify>,
}

impl Pushes {
    /// Subscribes, once: with the adapter's first queued attempt, so that the subscription is
    /// in place by the time that caller (or a later one) waits.
    pub fn start(&self, clients: impl FnOnce() -> Vec<Client>, channel: impl FnOnce() -> String) {
        if !self.started.swap(true, Ordering::AcqRel) {
            let (board, stop) = (self.board.clone(), self.stop.clone());
            runtime().spawn(subscribe(
                clients(),
                channel(),
                board,
                Arc::downgrade(&stop),
            ));
        }
    }

    /// Where `waiter` hears its pushes.
    pub fn listen(&self, waiter: &str) -> Box<dyn Waiter> {
        self.board.listen(waiter)
    }

    pub fn close(&self) {
        self.stop.notify_one();
    }
}

/// Subscribes to `channel` on one of `clients` (the seeds of a Cluster, where a classic
/// PUBLISH reaches every node) and passes each push on, until the adapter is closed or gone.
async fn subscribe(
    clients: Vec<Client>,
    channel: String,
    board: WakeBoard,
    stop: Weak<tokio::sync::Notify>,
) {
    let mut backoff = Duration::from_millis(50);
    let mut resubscribed = false;
    for client in clients.iter().cycle() {
        let Some(stopped) = stop.upgrade() else {
            return;
        };
        let connect = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let connected = tokio::time::timeout(Duration::from_secs(5), connect).await;
        if let Ok(Ok(pubsub)) = connected {
            if resubscribed {
                board.wake_all();
            }
            resubscribed = true;
            backoff = Duration::from_millis(50);
            let mut messages = pubsub.into_on_message();
            loop {
                tokio::select! {
                    m = messages.next() => match m {
                        Some(msg) => {
                            if let Ok(place) = msg.get_payload::<String>() {
                                let waiter = place.split_once('|').map_or(place.as_str(), |p| p.1);
                                board.wake(waiter);
                            }
                        }
                        None => break,
                    },
                    _ = stopped.notified() => return,
                    _ = tokio::time::sleep(IDLE_CHECK) => {
                        if Weak::strong_count(&stop) <= 1 {
                            return;
                        }
                    }
                }
            }
        }
        // No wake-up per failed try: while pushes are down the waiters' re-checks carry them,
        // and the subscription that comes back wakes them all.
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stopped.notified() => return,
        }
        drop(stopped);
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}
