//! What an operator sees and does: `inspect`, `list` (SCAN MATCH, on a Cluster over each
//! master) and `forceRelease`, with the lock's value a Redlock compares across servers.

use crate::backend::shared::io::Failure;
use crate::contract::value::holder_of;
use crate::contract::{KeyInfo, Op};

use super::conn::Conn;
use super::keys::{fence_key, hash_tag};
use super::scripts::{scripts, SIDE_SUFFIXES, WAITED_SUFFIX};
use super::{Inner, RedisBackend};

/// A key as an operator is shown it, and the value of the lock it carries (the token and
/// label, without the queue's mark), by which a Redlock tells which servers agree.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub info: KeyInfo,
    pub value: Option<String>,
}

impl RedisBackend {
    /// What `inspect` shows, with the lock's value.
    pub(crate) fn seen(&self, key: &str) -> Op<Seen> {
        let key = key.to_owned();
        self.with_conn(
            move |inner, mut conn| async move { inspect_key(&inner, &mut conn, key).await },
        )
    }

    /// What `list` shows, with each lock's value: SCAN MATCH over the keys (on a Cluster, over
    /// each master), then one inspection per key found; the side keys are skipped.
    pub(crate) fn seen_under(&self, prefix: &str, limit: u32) -> Op<Vec<Seen>> {
        let pattern = format!("{}*", glob_escape(prefix));
        let cluster = self.inner.options.cluster;
        self.with_conn(move |inner, mut conn| async move {
            let keys = scan_keys(&inner, &mut conn, &pattern, cluster).await?;
            let candidates: Vec<String> = keys
                .into_iter()
                .filter(|k| !SIDE_SUFFIXES.iter().any(|s| k.ends_with(s)))
                .collect();
            // The reads of a chunk go out together, pipelined on the connection.
            let mut found = Vec::new();
            for chunk in candidates.chunks(256) {
                let reads = chunk.iter().map(|key| {
                    let (inner, mut conn, key) = (inner.clone(), conn.clone(), key.clone());
                    async move { inspect_key(&inner, &mut conn, key).await }
                });
                for seen in futures_util::future::join_all(reads).await {
                    let seen = seen?;
                    if seen.info.held {
                        found.push(seen);
                    }
                }
                if found.len() >= limit as usize {
                    break;
                }
            }
            found.sort_by(|a, b| a.info.key.cmp(&b.info.key));
            found.truncate(limit as usize);
            Ok(found)
        })
    }

    /// Releases the lock on `key` by force (see FORCE_RELEASE_BODY), only when its value is
    /// `only` if that is given; answers the value removed.
    pub(crate) fn force_release_value(&self, key: &str, only: Option<&str>) -> Op<Option<String>> {
        if let Err(e) = self.check_key(key) {
            return Op::ready(Err(e));
        }
        let keys = self.keys(key, false);
        let args: Vec<String> = only.map(str::to_owned).into_iter().collect();
        self.with_conn(move |inner, mut conn| async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let removed: String = conn
                .script(&scripts().force_release, &keys, &args)
                .await
                .map_err(|e| inner.failure(e))?;
            Ok((!removed.is_empty()).then_some(removed))
        })
    }
}

/// `*`, `?`, `[`, `]` and `\\` taken literally in a SCAN MATCH pattern.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

async fn inspect_key(inner: &Inner, conn: &mut Conn, key: String) -> Result<Seen, Failure> {
    // On a Cluster, a key with '}' but no hash tag has no fence counter in its slot (it could
    // never be fenced): its lock alone is read.
    let fenceless = inner.options.cluster && hash_tag(&key).is_none() && key.contains('}');
    let mut keys = vec![key.clone()];
    if !fenceless {
        keys.push(fence_key(&key));
    }
    let (value, ttl, fence): (String, i64, String) = conn
        .script(&scripts().inspect, &keys, &[])
        .await
        .map_err(|e| inner.failure(e))?;
    // The script answers a value only for a lock (see `lock_at_lua`).
    let held = !value.is_empty();
    let info = KeyInfo {
        key,
        held,
        ttl_left: held.then_some(ttl as f64),
        fence: fence.parse::<u64>().ok(),
        holder: held.then(|| holder_of(&value)).flatten(),
    };
    let value = held.then(|| match value.strip_suffix(WAITED_SUFFIX) {
        Some(v) => v.to_owned(),
        None => value,
    });
    Ok(Seen { info, value })
}

/// Every key matching `pattern`: one SCAN walk, on a Cluster one per master.
async fn scan_keys(
    inner: &Inner,
    conn: &mut Conn,
    pattern: &str,
    cluster: bool,
) -> Result<Vec<String>, Failure> {
    use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
    let scan = |cursor: &str| {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        cmd
    };
    let mut keys = Vec::new();
    let Conn::Cluster(c) = conn else {
        let mut cursor = "0".to_owned();
        loop {
            let (next, batch): (String, Vec<String>) = conn
                .query(&scan(&cursor))
                .await
                .map_err(|e| inner.failure(e))?;
            keys.extend(batch);
            if next == "0" {
                return Ok(keys);
            }
            cursor = next;
        }
    };
    debug_assert!(cluster);
    // The first page from every master at once (answered per node address), then each
    // master's walk on its own.
    let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let first = c
        .route_command(scan("0"), all)
        .await
        .map_err(|e| inner.failure(e))?;
    let per_node: Vec<(String, (String, Vec<String>))> =
        redis::from_redis_value(first).map_err(|e| inner.failure(e.into()))?;
    for (addr, (mut cursor, batch)) in per_node {
        keys.extend(batch);
        let (host, port) = addr.rsplit_once(':').unwrap_or((&addr, "6379"));
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: host.to_owned(),
            port: port.parse().unwrap_or(6379),
        });
        while cursor != "0" {
            let page = c
                .route_command(scan(&cursor), route.clone())
                .await
                .map_err(|e| inner.failure(e))?;
            let (next, batch): (String, Vec<String>) =
                redis::from_redis_value(page).map_err(|e| inner.failure(e.into()))?;
            keys.extend(batch);
            cursor = next;
        }
    }
    Ok(keys)
}
