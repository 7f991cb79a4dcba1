//! The fair queue's verbs: a queued attempt takes a place (`<channel>|<waiter>`) in the key's
//! queue, `leave` gives it up, and the adapter's pub/sub channel wakes the waiter.

use crate::contract::{Op, Queue, Queued, Waiter};

use super::scripts::scripts;
use super::RedisBackend;

/// A place in a key's queue never lives shorter than this, whatever the engine asks.
const MIN_PLACE_LEASE_MS: u32 = 100;

impl Queue for RedisBackend {
    fn acquire_queued(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        waiter: &str,
        lease: u32,
        fenced: bool,
    ) -> Op<Queued> {
        let inner = &self.inner;
        let channel = || format!("locco:wake:{}", inner.channel);
        inner.pushes.start(|| inner.pubsub_clients(), channel);
        let place = self.place(waiter);
        let lease = lease.max(MIN_PLACE_LEASE_MS);
        self.grant_as(
            key,
            token,
            ttl,
            place,
            lease,
            fenced,
            move |(granted, n)| match granted {
                1 => Queued::Granted(fenced.then_some(n as u64)),
                _ => Queued::Waiting {
                    retry_in: (n >= 0).then_some(n as f64),
                },
            },
        )
    }

    fn leave(&self, key: &str, waiter: &str) -> Op<()> {
        if let Err(e) = self.check_key(key) {
            return Op::ready(Err(e));
        }
        let (keys, place) = (self.keys(key, false), self.place(waiter));
        self.with_conn(move |inner, mut conn| async move {
            conn.script::<i64, _>(&scripts().leave, &keys, &[&place])
                .await
                .map(drop)
                .map_err(|e| inner.failure(e))
        })
    }

    fn wakeups(&self, _key: &str, waiter: &str) -> Box<dyn Waiter> {
        self.inner.pushes.listen(waiter)
    }
}

impl RedisBackend {
    /// Our place in a queue: this adapter's channel and the waiter.
    fn place(&self, waiter: &str) -> String {
        format!("{}|{waiter}", self.inner.channel)
    }
}
