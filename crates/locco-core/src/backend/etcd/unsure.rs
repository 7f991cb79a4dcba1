//! What this adapter cleans up after itself: a record whose answer was lost ([`Unsure`]), deleted
//! by its token, and an attempt's refusal mark, put until that is confirmed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::PutOptions;

use crate::backend::shared::io;

use super::lease::Session;
use super::Inner;

/// The pause between two attempts to delete a record of ours that nobody will use.
pub(super) const SWEEP_PAUSE: Duration = Duration::from_millis(200);

/// What a grant or a queued attempt may have written while its answer is lost: the lock key
/// under its token and, for a queued attempt, our place. Until [`Unsure::settled`], dropping
/// it (any error, the engine giving the request up, the request dropped) hands both to this
/// adapter's own clean-up, which outlasts the engine's one give-back: the key is deleted by
/// its token until that is confirmed or the session ends ([`Inner::sweep`]), and the place is
/// kept as ours, so that its timer removes it once its waiter stops renewing it
/// ([`Inner::keep_place`]). A guard rather than a call on each error path, so that no exit
/// path can leave a record nobody tracks.
pub(super) struct Unsure {
    inner: Arc<Inner>,
    key: String,
    token: String,
    /// The attempt's refusal mark ([`Inner::refusal_key`]).
    refusal: String,
    /// The waiter, its place's lease in ms, and its rank when known.
    place: Option<(String, u32, Option<i64>)>,
    session: Arc<Session>,
    settled: bool,
}

impl Unsure {
    pub(super) fn new(
        inner: &Arc<Inner>,
        key: &str,
        token: &str,
        refusal: String,
        place: Option<(String, u32, Option<i64>)>,
        session: &Arc<Session>,
    ) -> Self {
        Unsure {
            inner: inner.clone(),
            key: key.to_owned(),
            token: token.to_owned(),
            refusal,
            place,
            session: session.clone(),
            settled: false,
        }
    }

    /// The answer came: whatever was written is known.
    pub(super) fn settled(mut self) {
        self.settled = true;
    }
}

impl Drop for Unsure {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Some((waiter, lease, rank)) = self.place.take() {
            self.inner
                .keep_place(&self.key, &waiter, rank, lease, self.session.clone());
        }
        let (inner, session) = (self.inner.clone(), self.session.clone());
        let (key, token) = (
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        );
        let refusal = std::mem::take(&mut self.refusal);
        io::runtime().spawn(async move {
            inner.refuse(&refusal, &session).await;
            inner.sweep(key, token, session).await;
        });
    }
}

impl Inner {
    /// Deletes a lock key of ours that nobody will use (`value == token → delete`), again and
    /// again until the delete is confirmed or the session that keeps the key is lost: the key
    /// then goes with the session's lease.
    pub(super) async fn sweep(self: Arc<Self>, key: String, token: String, session: Arc<Session>) {
        while !session.is_lost() && !self.closed.load(Ordering::Acquire) {
            if self.delete_ours(&key, &token).await.is_ok() {
                return;
            }
            tokio::time::sleep(SWEEP_PAUSE).await;
        }
    }

    /// Puts an attempt's refusal mark, again until that is confirmed or the session is lost:
    /// from then on no copy of the attempt can write (a copy on a lost session's lease goes
    /// with it). The mark is on the session's lease, so it lasts as long as a copy could.
    async fn refuse(&self, refusal: &str, session: &Arc<Session>) {
        while !session.is_lost() && !self.closed.load(Ordering::Acquire) {
            let put = async {
                let kv = self.client().await?.kv_client();
                self.bounded("a refusal", || {
                    let mut kv = kv.clone();
                    let options = PutOptions::new().with_lease(session.id);
                    async move { kv.put(refusal, "", Some(options)).await }
                })
                .await
            };
            if put.await.is_ok() {
                return;
            }
            tokio::time::sleep(SWEEP_PAUSE).await;
        }
    }

    /// [`Inner::sweep`] in the background.
    pub(super) fn sweep_later(self: &Arc<Self>, key: &str, token: &str, session: Arc<Session>) {
        let (key, token) = (key.to_owned(), token.to_owned());
        io::runtime().spawn(self.clone().sweep(key, token, session));
    }
}
