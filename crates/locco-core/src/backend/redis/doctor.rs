//! `check_safety` for Redis: eviction, persistence, replicas against `waitForReplicas`, a
//! Cluster's slots, and the clock (`TIME`). Reads only; a refused command is an info finding.

use std::sync::Arc;

use super::{Conn, Inner, RedisBackend};
use crate::backend::shared::io::Failure;
use crate::backend::shared::safety::{check_clock, Finding, SafetyOptions, Severity};
use crate::contract::Op;

impl RedisBackend {
    /// Checks the server against what the locks rely on (see [`crate::backend::shared::safety`]).
    pub fn check_safety(&self, options: SafetyOptions) -> Op<Vec<Finding>> {
        self.run(move |inner| async move {
            if inner.options.cluster {
                return check_cluster(&inner, &options).await;
            }
            let conn = inner.conn().await?;
            Ok(check_node(&inner, conn, &options).await)
        })
    }
}

/// The checks of one server: its settings, its replicas (standalone), its Cluster state
/// (a Cluster node), and the clock.
async fn check_node(inner: &Arc<Inner>, mut conn: Conn, options: &SafetyOptions) -> Vec<Finding> {
    let mut found = Vec::new();
    config_findings(inner, &mut conn, &mut found).await;
    if inner.options.cluster {
        cluster_findings(&mut conn, &mut found).await;
    } else {
        replica_findings(inner, &mut conn, &mut found).await;
    }
    let clock = check_clock("Redis", "TIME", 0.001, options, || {
        let mut conn = conn.clone();
        let inner = inner.clone();
        async move { server_time(&inner, &mut conn).await }
    })
    .await;
    found.push(clock);
    found
}

/// A Cluster is checked node by node, over a plain connection to each seed: a Cluster client
/// routes CONFIG and CLUSTER INFO by its own rules, and cannot connect at all to a Cluster
/// without slots, which is what most needs saying. A finding several nodes share is kept
/// once, naming how many.
async fn check_cluster(
    inner: &Arc<Inner>,
    options: &SafetyOptions,
) -> Result<Vec<Finding>, Failure> {
    let mut per_node: Vec<Vec<Finding>> = Vec::new();
    let mut last_failure = None;
    let timeout = std::time::Duration::from_millis(inner.options.connect_timeout_ms);
    for client in inner.pubsub_clients() {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(std::time::Duration::from_millis(
                inner.options.command_timeout_ms,
            )));
        match client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
            Ok(c) => per_node.push(check_node(inner, Conn::Node(c), options).await),
            Err(e) => last_failure = Some(inner.failure(e)),
        }
    }
    if per_node.is_empty() {
        return Err(last_failure.unwrap_or_else(|| {
            Failure::new(
                "redis",
                crate::rt::error::BackendErrorKind::Config,
                "no seed URL of the Cluster could be opened",
            )
        }));
    }
    let nodes = per_node.len();
    let mut merged: Vec<(Finding, usize)> = Vec::new();
    for f in per_node.into_iter().flatten() {
        // Clock readings differ a little from node to node: keep the worst one.
        let same = merged
            .iter_mut()
            .find(|(m, _)| m.id == f.id && (m.message == f.message || f.id == "clock.rate"));
        match same {
            Some((m, n)) => {
                *n += 1;
                if f.severity > m.severity {
                    *m = f;
                }
            }
            None => merged.push((f, 1)),
        }
    }
    let mut out: Vec<Finding> = merged
        .into_iter()
        .map(|(mut f, n)| {
            if nodes > 1 && f.id != "clock.rate" {
                f.message = format!("{} (on {n} of {nodes} nodes checked)", f.message);
            }
            f
        })
        .collect();
    if let Some(at) = out.iter().position(|f| f.id == "clock.rate") {
        let clock = out.remove(at);
        out.push(clock);
    }
    Ok(out)
}

async fn server_time(inner: &Inner, conn: &mut Conn) -> Result<f64, Failure> {
    let (secs, micros): (u64, u64) = conn
        .query(&redis::cmd("TIME"))
        .await
        .map_err(|e| inner.failure(e))?;
    Ok(secs as f64 * 1000.0 + micros as f64 / 1000.0)
}

/// `CONFIG GET name` as its value; `Err` with the server's reason when refused.
async fn config(conn: &mut Conn, name: &str) -> Result<String, String> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg(name);
    let reply: Vec<String> = conn.query(&cmd).await.map_err(|e| e.to_string())?;
    reply
        .get(1)
        .cloned()
        .ok_or_else(|| format!("the server has no setting {name}"))
}

async fn config_findings(inner: &Inner, conn: &mut Conn, found: &mut Vec<Finding>) {
    let policy = match config(conn, "maxmemory-policy").await {
        Ok(p) => p,
        Err(why) => {
            found.push(Finding::not_checked(
                "redis.config",
                "maxmemory-policy and persistence (CONFIG GET)",
                inner.redact(why),
            ));
            return;
        }
    };
    let maxmemory: u64 = config(conn, "maxmemory")
        .await
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if let Some(f) = judge_eviction(&policy, maxmemory) {
        found.push(f);
    }
    let appendonly = config(conn, "appendonly").await.ok();
    let save = config(conn, "save").await.ok();
    let fsync = config(conn, "appendfsync").await.ok();
    if let (Some(aof), Some(save)) = (appendonly, save) {
        found.extend(judge_persistence(aof == "yes", &save, fsync.as_deref()));
    }
}

/// Eviction: whether the server may drop a lock key to free memory.
fn judge_eviction(policy: &str, maxmemory: u64) -> Option<Finding> {
    if policy == "noeviction" {
        return None;
    }
    let fix = "run the lock Redis with maxmemory-policy noeviction (CONFIG SET maxmemory-policy \
               noeviction, and in redis.conf), or on a server of its own whose other keys cannot \
               fill it; a full server then refuses new locks instead of dropping held ones";
    let volatile = policy.starts_with("volatile-");
    let which = if volatile {
        "evicts keys that have a TTL, and every lock key has one: locks are the first candidates"
    } else {
        "evicts any key, lock keys included"
    };
    let why = format!(
        "the policy {which}. An evicted lock key is free: the next acquire of it succeeds while \
         the holder still works under the lock, so two holders own one key"
    );
    if maxmemory == 0 {
        return Some(Finding::new(
            "redis.maxmemory-policy",
            Severity::Warning,
            format!(
                "maxmemory-policy is {policy}, but maxmemory is 0 (no limit), so nothing is \
                 evicted yet"
            ),
            format!("{why}, as soon as someone sets a memory limit"),
            fix,
        ));
    }
    Some(Finding::new(
        "redis.maxmemory-policy",
        Severity::Unsafe,
        format!("maxmemory-policy is {policy} with maxmemory {maxmemory} bytes"),
        why,
        fix,
    ))
}

/// Persistence: what a restart of the server forgets.
fn judge_persistence(aof: bool, save: &str, fsync: Option<&str>) -> Vec<Finding> {
    let rdb = !save.trim().is_empty();
    if !aof && !rdb {
        // A warning, not unsafe: it takes a crash or restart, and even with persistence a
        // restart loses the writes since the last fsync; the durable fix is operational.
        return vec![Finding::new(
            "redis.persistence",
            Severity::Warning,
            "neither AOF (appendonly no) nor RDB snapshots (save \"\") are on",
            "a restart of the server forgets every lock. Holders that were working under a lock \
             keep working, and anyone can take the same keys at once: two holders for every key \
             held across the restart",
            "turn on AOF (appendonly yes, appendfsync always), or keep a restarted server out of \
             use for longer than the longest TTL (a delayed restart), so every lease it forgot \
             has ended",
        )];
    }
    let mut out = Vec::new();
    if !aof {
        out.push(Finding::new(
            "redis.persistence",
            Severity::Info,
            format!("only RDB snapshots are on (save \"{save}\"), no AOF"),
            "a restart brings back the last snapshot: locks taken since then are forgotten, and \
             their keys can be taken again while their holders still work",
            "turn on AOF with appendfsync always, or restart the server only after the longest \
             TTL has passed",
        ));
    } else if let Some(f) = fsync.filter(|f| *f != "always") {
        out.push(Finding::new(
            "redis.appendfsync",
            Severity::Info,
            format!("AOF is on with appendfsync {f}"),
            "a crash of the server (not a clean restart) loses the writes not yet on disk: up \
             to about a second of acquires with everysec, more with no. Those keys can be taken \
             again while their holders still work",
            "set appendfsync always if a crash must not forget a lock (slower writes), or \
             restart a crashed server only after the longest TTL",
        ));
    }
    out
}

async fn replica_findings(inner: &Inner, conn: &mut Conn, found: &mut Vec<Finding>) {
    if inner.options.cluster {
        return;
    }
    let info: String = match conn.query(redis::cmd("INFO").arg("replication")).await {
        Ok(i) => i,
        Err(e) => {
            found.push(Finding::not_checked(
                "redis.replication",
                "replication (INFO replication)",
                inner.redact(e.to_string()),
            ));
            return;
        }
    };
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .map(str::to_owned)
    };
    let role = field("role").unwrap_or_default();
    let replicas: u32 = field("connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let wanted = inner.options.wait_for_replicas.map(|w| w.replicas);
    found.extend(judge_replicas(&role, replicas, wanted));
}

fn judge_replicas(role: &str, replicas: u32, wanted: Option<u32>) -> Vec<Finding> {
    let mut out = Vec::new();
    if role == "slave" || role == "replica" {
        out.push(Finding::new(
            "redis.role",
            Severity::Warning,
            "the URL points at a replica, not the primary",
            "a replica refuses writes (READONLY), so every acquire fails",
            "point the adapter at the primary (or at a proxy that always reaches it)",
        ));
    }
    match wanted {
        Some(w) if replicas < w => out.push(Finding::new(
            "redis.wait-for-replicas",
            Severity::Unsafe,
            format!(
                "waitForReplicas asks {w} replica(s) to acknowledge, but the server has \
                 {replicas} connected"
            ),
            "a grant counts only once that many replicas have it; with fewer connected, every \
             acquire and extension waits its timeout and fails, so no lock is ever held (the \
             grants are given back)",
            format!(
                "connect at least {w} replica(s), or lower waitForReplicas.replicas to \
                 {replicas} or fewer (leave it out with no replicas)"
            ),
        )),
        None if replicas > 0 => out.push(Finding::new(
            "redis.wait-for-replicas",
            Severity::Warning,
            format!(
                "the server has {replicas} connected replica(s), and the adapter does not set \
                 waitForReplicas"
            ),
            "replication is asynchronous: a grant acknowledged by the primary alone can be \
             missing on the replica that a failover promotes, and the new primary then grants \
             the same key again",
            "set waitForReplicas: { replicas: 1, timeout: 100 } (or more replicas), so a grant \
             counts only once a replica has it",
        )),
        _ => {}
    }
    out
}

async fn cluster_findings(conn: &mut Conn, found: &mut Vec<Finding>) {
    let info: String = match conn.query(redis::cmd("CLUSTER").arg("INFO")).await {
        Ok(i) => i,
        Err(e) => {
            found.push(Finding::not_checked(
                "redis.cluster",
                "the Cluster's state (CLUSTER INFO)",
                e.to_string(),
            ));
            return;
        }
    };
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .map(str::to_owned)
    };
    let state = field("cluster_state").unwrap_or_default();
    let assigned: u32 = field("cluster_slots_assigned")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if state != "ok" || assigned < 16384 {
        found.push(Finding::new(
            "redis.cluster",
            Severity::Unsafe,
            format!("cluster_state is {state:?} with {assigned} of 16384 slots assigned"),
            "keys in unassigned slots cannot be locked, and a Cluster that is not ok refuses \
             commands: acquires fail (CLUSTERDOWN) for some or every key",
            "assign every slot to a healthy master (redis-cli --cluster fix / check) before \
             using the Cluster for locks",
        ));
    }
}

impl Inner {
    fn redact(&self, text: String) -> String {
        crate::backend::shared::io::redact(&self.secrets, text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicting_policies_are_judged_by_maxmemory() {
        assert!(judge_eviction("noeviction", 100).is_none());
        let sev = |p, m| judge_eviction(p, m).map(|f| f.severity);
        assert_eq!(sev("allkeys-lru", 100), Some(Severity::Unsafe));
        assert_eq!(sev("volatile-ttl", 100), Some(Severity::Unsafe));
        assert_eq!(sev("volatile-lru", 0), Some(Severity::Warning));
    }

    #[test]
    fn replicas_are_judged_against_wait_for_replicas() {
        let sev = |r, w| {
            judge_replicas("master", r, w)
                .iter()
                .map(|f| f.severity)
                .collect::<Vec<_>>()
        };
        assert_eq!(sev(0, Some(1)), vec![Severity::Unsafe]);
        assert_eq!(sev(1, Some(1)), vec![]);
        assert_eq!(sev(1, None), vec![Severity::Warning]);
        assert_eq!(sev(0, None), vec![]);
    }

    #[test]
    fn no_persistence_is_a_warning() {
        let f = judge_persistence(false, "", None);
        assert_eq!(f[0].severity, Severity::Warning);
        assert!(judge_persistence(true, "", Some("always")).is_empty());
    }
}
