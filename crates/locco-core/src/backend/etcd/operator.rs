//! What an operator sees and does: `inspect`, `list` and `forceRelease` of the locks under the
//! prefix.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::backend::shared::io::Failure;
use crate::contract::value::holder_of;
use crate::contract::KeyInfo;

use super::keys::range_end;
use super::Inner;

impl Inner {
    /// What an operator sees of one stored key (`full`, the prefix included). The lease's
    /// time left is known only for a lock this adapter holds: each holder keeps its locks'
    /// deadlines itself (see the module docs), the key carries only the session lease.
    fn info_of(&self, key: String, kv: &etcd_client::KeyValue) -> KeyInfo {
        let value = String::from_utf8_lossy(kv.value());
        let ttl_left = {
            let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.get(&key)
                .filter(|h| h.token.as_bytes() == kv.value() && !h.session.is_lost())
                .map(|h| {
                    h.deadline
                        .min(h.session.ends())
                        .saturating_duration_since(Instant::now())
                        .as_secs_f64()
                        * 1000.0
                })
        };
        KeyInfo {
            key,
            held: ttl_left != Some(0.0),
            ttl_left,
            // The fence of a grant is the key's create revision.
            fence: Some(kv.create_revision() as u64),
            holder: holder_of(&value),
        }
    }

    /// Whether a stored key is a lock this library wrote: a key of the lock namespace (under
    /// the prefix, outside the queues' `\x01` range), attached to a lease (every lock is on
    /// its adapter's session; an application's plain key has none), holding a token (UTF-8,
    /// not empty). `inspect`, `list` and `forceRelease` all judge by it, so the preview and
    /// the action agree, and anything else is left alone.
    fn is_lock(&self, kv: &etcd_client::KeyValue) -> bool {
        let name = kv.key().strip_prefix(self.options.prefix.as_bytes());
        name.is_some_and(|n| !n.is_empty() && n[0] != 1)
            && kv.lease() != 0
            && !kv.value().is_empty()
            && std::str::from_utf8(kv.value()).is_ok()
    }

    /// The stored key for `key`, when it is a lock ([`Inner::is_lock`]).
    async fn read_lock(&self, key: &str) -> Result<Option<etcd_client::KeyValue>, Failure> {
        let kv = self.client().await?.kv_client();
        let got = self
            .bounded("a read", || {
                let (mut kv, k) = (kv.clone(), self.key(key));
                async move { kv.get(k, None::<GetOptions>).await }
            })
            .await?;
        Ok(got.kvs().first().filter(|kv| self.is_lock(kv)).cloned())
    }

    pub(super) async fn inspect(&self, key: &str) -> Result<KeyInfo, Failure> {
        Ok(match self.read_lock(key).await? {
            Some(found) => self.info_of(key.to_owned(), &found),
            None => KeyInfo {
                key: key.to_owned(),
                ..KeyInfo::default()
            },
        })
    }

    /// A range read from `<prefix><wanted>` to the end of that prefix; the queues' keys
    /// (`<prefix>\x01q/…`) and whatever is not a lock are left out.
    pub(super) async fn list(&self, wanted: &str, limit: u32) -> Result<Vec<KeyInfo>, Failure> {
        let kv = self.client().await?.kv_client();
        let start = self.key(wanted);
        let end = range_end(start.as_bytes());
        let from = match wanted.is_empty() {
            true => format!("{}\u{2}", self.options.prefix),
            false => start,
        };
        let mut found = Vec::new();
        let mut from = from.into_bytes();
        // Pages of `limit` keys, until `limit` locks are found: keys that are not locks
        // would otherwise take places in the answer.
        loop {
            let got = self
                .bounded("a read", || {
                    let (mut kv, from, end) = (kv.clone(), from.clone(), end.clone());
                    let options = GetOptions::new()
                        .with_range(end)
                        .with_limit(i64::from(limit));
                    async move { kv.get(from, Some(options)).await }
                })
                .await?;
            let prefix = self.options.prefix.as_bytes();
            for kv in got.kvs().iter().filter(|kv| self.is_lock(kv)) {
                let Some(key) = kv.key().strip_prefix(prefix) else {
                    continue;
                };
                let Ok(key) = String::from_utf8(key.to_vec()) else {
                    continue;
                };
                let info = self.info_of(key, kv);
                if info.held && found.len() < limit as usize {
                    found.push(info);
                }
            }
            match got.kvs().last() {
                Some(last) if got.more() && found.len() < limit as usize => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(found),
            }
        }
    }

    /// Deletes the lock under `key`, whatever its token; `true` when it did. Only a lock
    /// ([`Inner::is_lock`]) is deleted, and only the very one that was judged: the delete
    /// compares the key's revision with the read's. A holder here forgets it (its next
    /// extend reads the key, so it would fail anyway); waiters watching the key see the
    /// delete as a release.
    pub(super) async fn force_release(&self, key: &str) -> Result<bool, Failure> {
        let Some(found) = self.read_lock(key).await? else {
            return Ok(false);
        };
        let kv = self.client().await?.kv_client();
        let k = self.key(key);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                k.clone(),
                CompareOp::Equal,
                found.mod_revision(),
            )])
            .and_then([TxnOp::delete(k, None)]);
        Ok(self
            .bounded("a release", || {
                let (mut kv, txn) = (kv.clone(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await?
            .succeeded())
    }
}
