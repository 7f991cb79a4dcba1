//! `check_safety` for etcd: the cluster's size, its leader, and its alarms. etcd exposes no
//! clock to read (a lease is timed by the leader), so the clock check is reported as not run.

use etcd_client::{AlarmAction, AlarmType};

use super::{failure_of, EtcdBackend};
use crate::backend::shared::safety::{Finding, SafetyOptions, Severity};
use crate::contract::Op;
use crate::rt::error::BackendErrorKind;

impl EtcdBackend {
    /// Checks the cluster against what the locks rely on (see [`crate::backend::shared::safety`]).
    pub fn check_safety(&self, _options: SafetyOptions) -> Op<Vec<Finding>> {
        self.run(move |inner, _| async move {
            let mut client = inner.client().await?;
            let mut found = Vec::new();
            match client.member_list().await {
                Ok(list) => {
                    let voters = list.members().iter().filter(|m| !m.is_learner()).count();
                    found.extend(judge_members(voters));
                }
                // The client connects lazily: an unreachable cluster shows here first, and is
                // a failure of the check, not a finding.
                Err(e) => {
                    let failure = failure_of(&inner.secrets, e);
                    if unreachable(failure.kind) {
                        return Err(failure);
                    }
                    found.push(Finding::not_checked(
                        "etcd.members",
                        "the cluster's members (MemberList)",
                        failure.message,
                    ));
                }
            }
            match client.status().await {
                Ok(status) if status.leader() == 0 => found.push(Finding::new(
                    "etcd.leader",
                    Severity::Unsafe,
                    "the member answering has no leader",
                    "without a leader etcd grants no lease and writes nothing: every acquire \
                     fails, and held locks cannot be extended",
                    "restore a quorum of members (more than half of them up and reachable)",
                )),
                Ok(status) if !status.errors().is_empty() => found.push(Finding::new(
                    "etcd.status",
                    Severity::Warning,
                    format!("the member reports errors: {}", status.errors().join("; ")),
                    "a member in trouble may refuse or delay lock writes",
                    "see the member's log and etcdctl endpoint status",
                )),
                Ok(_) => {}
                Err(e) => found.push(Finding::not_checked(
                    "etcd.status",
                    "the member's status (Status)",
                    failure_of(&inner.secrets, e).message,
                )),
            }
            match client.alarm(AlarmAction::Get, AlarmType::None, None).await {
                Ok(alarms) if !alarms.alarms().is_empty() => {
                    let kinds: Vec<String> = alarms
                        .alarms()
                        .iter()
                        .map(|a| format!("{:?} on member {:x}", a.alarm(), a.member_id()))
                        .collect();
                    found.push(Finding::new(
                        "etcd.alarms",
                        Severity::Unsafe,
                        format!("the cluster has alarms raised: {}", kinds.join(", ")),
                        "with NOSPACE raised etcd refuses every write, so no lock can be taken \
                         or extended; CORRUPT means a member's data cannot be trusted",
                        "free space (compact and defragment) or fix the member, then disarm the \
                         alarm (etcdctl alarm disarm)",
                    ));
                }
                Ok(_) => {}
                Err(e) => found.push(Finding::not_checked(
                    "etcd.alarms",
                    "the cluster's alarms (Alarm)",
                    failure_of(&inner.secrets, e).message,
                )),
            }
            found.push(Finding::new(
                "clock.rate",
                Severity::Info,
                "the clock check does not apply to etcd: it has no clock to read",
                "an etcd lease is timed by the leader's own clock and renewed by keep-alives; \
                 the holder's local lease still ends 1% of the TTL early",
                "nothing to do",
            ));
            Ok(found)
        })
    }
}

fn unreachable(kind: BackendErrorKind) -> bool {
    matches!(
        kind,
        BackendErrorKind::Io | BackendErrorKind::Timeout | BackendErrorKind::Tls
    )
}

fn judge_members(voters: usize) -> Option<Finding> {
    match voters {
        1 => Some(Finding::new(
            "etcd.members",
            Severity::Warning,
            "the cluster has a single voting member",
            "a single member is a single point of failure: while it is down no lock can be \
             taken or kept, and a lost disk loses every lock",
            "run three or five members",
        )),
        n if n % 2 == 0 => Some(Finding::new(
            "etcd.members",
            Severity::Info,
            format!("the cluster has {n} voting members, an even number"),
            format!(
                "a quorum of {} survives no more failures than {} members would, with more \
                 members to go wrong",
                n / 2 + 1,
                n - 1
            ),
            "run an odd number of members (3 or 5)",
        )),
        _ => None,
    }
}
