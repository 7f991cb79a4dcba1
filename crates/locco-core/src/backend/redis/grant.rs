//! A grant request: the plain `SET NX PX` of a try or first attempt, or the queue script of a
//! fenced try or queued attempt; with `waitForReplicas`, counted only once replicated.

use redis::RedisError;

use crate::contract::{GivenUp, Op};

use super::scripts::{run_lua, scripts, Lua, FENCE_COUNTER_KEEP_MS};
use super::{Inner, RedisBackend};

/// The answer of the acquire script: granted, and the fence or the wait hint.
pub(super) type GrantReply = (i64, i64);

impl RedisBackend {
    /// A try (no place): never queues, never takes a key promised to a waiter.
    pub(super) fn grant<T: Send + 'static>(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        place: &str,
        fenced: bool,
        answer: impl FnOnce(GrantReply) -> T + Send + 'static,
    ) -> Op<T> {
        self.grant_as(key, token, ttl, place.to_owned(), 0, fenced, answer)
    }

    /// Sends one grant request; with `waitForReplicas`, a grant counts only once replicated.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grant_as<T: Send + 'static>(
        &self,
        key: &str,
        token: &str,
        ttl: u32,
        place: String,
        lease: u32,
        fenced: bool,
        answer: impl FnOnce(GrantReply) -> T + Send + 'static,
    ) -> Op<T> {
        if let Err(e) = self.check_key(key) {
            return Op::ready(Err(e));
        }
        let request = match place.is_empty() && !fenced {
            true => GrantRequest::SetNx(set_nx(key, token, ttl)),
            false => GrantRequest::script(self.keys(key, fenced), token, ttl, place, lease, fenced),
        };
        let Some(w) = self.inner.options.wait_for_replicas else {
            return self.grant_with_conn(move |inner, mut conn| async move {
                let reply = conn.grant(&request).await.map_err(|e| inner.failure(e))?;
                Ok(answer(reply))
            });
        };
        let (lock, token) = (key.to_owned(), token.to_owned());
        // Given up while the replicated connection was still being made: not sent.
        let given_up = GivenUp::default();
        let check = given_up.clone();
        self.run(move |inner| async move {
            let (reply, acked) = inner
                .write_and_wait(w, Some(&check), |c| {
                    Box::pin(async move { request.send(c).await })
                })
                .await?;
            if reply.0 == 1 && acked < w.replicas {
                inner.give_back(&lock, &token).await;
                return Err(Inner::replication_failure(w, acked));
            }
            Ok(answer(reply))
        })
        .given_up_by(given_up)
    }
}

pub(super) fn set_nx(key: &str, token: &str, ttl: u32) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(token).arg("NX").arg("PX").arg(ttl);
    cmd
}

/// One grant request, answered as a [`GrantReply`]. A try or a first attempt is the plain
/// `SET NX PX` (a reserved key is not free to it); a queued attempt runs the queue script.
pub(super) enum GrantRequest {
    SetNx(redis::Cmd),
    Script {
        script: &'static Lua,
        keys: Vec<String>,
        args: [String; 6],
    },
}

impl GrantRequest {
    /// A fenced try (no place), or a queued attempt.
    fn script(
        keys: Vec<String>,
        token: &str,
        ttl: u32,
        place: String,
        lease: u32,
        fenced: bool,
    ) -> Self {
        let script = if place.is_empty() {
            &scripts().try_fenced
        } else {
            &scripts().acquire
        };
        let args = [
            token.to_owned(),
            ttl.to_string(),
            place,
            lease.to_string(),
            if fenced { "1" } else { "0" }.to_owned(),
            FENCE_COUNTER_KEEP_MS.to_string(),
        ];
        GrantRequest::Script { script, keys, args }
    }

    pub(super) async fn send<C: redis::aio::ConnectionLike + Send>(
        &self,
        conn: &mut C,
    ) -> Result<GrantReply, RedisError> {
        match self {
            GrantRequest::SetNx(cmd) => {
                let set: Option<String> = cmd.query_async(conn).await?;
                Ok(if set.is_some() { (1, 0) } else { (0, -1) })
            }
            GrantRequest::Script { script, keys, args } => {
                run_lua(conn, script, &script.evalsha(keys, args)).await
            }
        }
    }
}
