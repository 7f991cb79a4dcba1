//! Wake-ups: a watch on a key (and its queue) that tells a waiter when a delete may have freed
//! it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchFilterType, WatchOptions};
use tokio::sync::watch;

use crate::backend::shared::io;
use crate::contract::Waiter;

use super::EtcdBackend;

/// A waiter's watch on its key; dropping it cancels the watch.
pub(super) struct KeyWatch {
    rx: watch::Receiver<u64>,
    task: tokio::task::AbortHandle,
}

impl Waiter for KeyWatch {
    fn released(&mut self) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(async move {
            // A watch that ended (no connection) wakes nobody: the poll is the backstop.
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EtcdBackend {
    /// A watch on the key and its queue: any delete in either may make us the head of a free
    /// key.
    pub(super) fn watch_deletes(
        &self,
        key: &str,
        with_queue: bool,
        skip_own: bool,
    ) -> Box<dyn Waiter> {
        let (tx, rx) = watch::channel(0u64);
        let inner = Arc::downgrade(&self.inner);
        let k = self.inner.key(key);
        let range = self.inner.queue_prefix(key);
        let task = io::runtime().spawn(async move {
            let mut ends = 0u64;
            let mut first = true;
            // A watch breaks with its member (killed, restarted, cut off): it is opened again
            // on another one, and its waiter woken, since a delete may have gone unseen.
            loop {
                if !first {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let client = match inner.upgrade() {
                    Some(i) if !i.closed.load(Ordering::Acquire) => match i.client().await {
                        Ok(c) => c,
                        Err(_) => return,
                    },
                    _ => return,
                };
                let options = WatchOptions::new()
                    .with_filters([WatchFilterType::NoPut])
                    .with_prev_key();
                let Ok(mut stream) = client
                    .watch_client()
                    .watch(k.clone(), Some(options.clone()))
                    .await
                else {
                    first = false;
                    continue;
                };
                if with_queue
                    && stream
                        .watch(range.clone(), Some(options.with_prefix()))
                        .await
                        .is_err()
                {
                    first = false;
                    continue;
                }
                if !first {
                    ends += 1;
                    let _ = tx.send(ends);
                }
                first = false;
                while let Ok(Some(resp)) = stream.message().await {
                    let Some(inner) = inner.upgrade() else { return };
                    for ev in resp.events() {
                        if ev.event_type() != EventType::Delete {
                            continue;
                        }
                        let own = skip_own
                            && ev.prev_kv().is_some_and(|kv| {
                                let released =
                                    inner.released.lock().unwrap_or_else(|p| p.into_inner());
                                std::str::from_utf8(kv.value()).is_ok_and(|t| released.contains(t))
                            });
                        if !own {
                            ends += 1;
                            let _ = tx.send(ends);
                        }
                    }
                }
            }
        });
        Box::new(KeyWatch {
            rx,
            task: task.abort_handle(),
        })
    }
}
