//! What an etcd error is to the engine: its kind, whether the request may go again, whether it
//! ever left.

use crate::backend::shared::io::{redact, Failure};
use crate::rt::error::BackendErrorKind;

pub(super) fn failure_of(secrets: &[String], e: etcd_client::Error) -> Failure {
    use etcd_client::Error as E;
    let (kind, message, code) = match &e {
        E::GRpcStatus(s) => {
            use tonic::Code;
            let kind = match s.code() {
                Code::Unauthenticated | Code::PermissionDenied => BackendErrorKind::Auth,
                Code::InvalidArgument
                    if s.message().contains("authentication failed")
                        || s.message().contains("user name is empty") =>
                {
                    BackendErrorKind::Auth
                }
                Code::DeadlineExceeded => BackendErrorKind::Timeout,
                Code::Unavailable if s.message().contains("certificate") => BackendErrorKind::Tls,
                Code::Unavailable => BackendErrorKind::Io,
                _ => BackendErrorKind::Other,
            };
            let mut message = s.message().to_string();
            if message.is_empty() {
                message = format!("{:?}", s.code());
            }
            (kind, message, Some(format!("{:?}", s.code())))
        }
        E::TransportError(t) => {
            let text = format!(
                "{t}: {}",
                std::error::Error::source(t)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            );
            let kind =
                if text.contains("certificate") || text.contains("tls") || text.contains("TLS") {
                    BackendErrorKind::Tls
                } else {
                    BackendErrorKind::Io
                };
            (kind, text, None)
        }
        E::IoError(_) => (BackendErrorKind::Io, e.to_string(), None),
        E::InvalidArgs(_) | E::InvalidUri(_) | E::EndpointError(_) => {
            (BackendErrorKind::Config, e.to_string(), None)
        }
        _ => (BackendErrorKind::Other, e.to_string(), None),
    };
    Failure {
        code,
        ..Failure::new("etcd", kind, redact(secrets, format!("etcd: {message}")))
    }
}

/// What a leader election or a dropped connection answers: the leader changed or is being
/// elected, the member has none, the stream was cancelled, the connection broke. The request
/// may or may not have been applied; every request this adapter sends is safe to send again
/// (a grant finds its own token and answers granted, a delete compares the token, reads and
/// keep-alives change nothing), so it is sent again within `requestTimeout`.
pub(super) fn retryable(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    use tonic::Code;
    let tls =
        |text: &str| text.contains("certificate") || text.contains("tls") || text.contains("TLS");
    match e {
        E::GRpcStatus(s) => match s.code() {
            Code::Unavailable => !tls(s.message()),
            Code::Cancelled | Code::Aborted => true,
            Code::Unknown => {
                let m = s.message();
                !tls(m)
                    && [
                        "transport",
                        "connection",
                        "h2 protocol",
                        "broken pipe",
                        "reset",
                    ]
                    .iter()
                    .any(|w| m.contains(w))
            }
            _ => false,
        },
        E::TransportError(t) => !tls(&format!("{t:?}")),
        E::IoError(_) => true,
        _ => false,
    }
}

/// A failure to connect: the request was never delivered.
pub(super) fn not_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable && s.message().contains("connect")
        }
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

pub(super) fn timeout_failure(what: &str, ms: u64, last: Option<&Failure>) -> Failure {
    let last = last.map_or(String::new(), |f| {
        format!("; the last answer: {}", f.message)
    });
    Failure::new(
        "etcd",
        BackendErrorKind::Timeout,
        format!("etcd: no answer to {what} within {ms} ms (requestTimeout){last}"),
    )
}

/// The cluster no longer knows the session's lease (expired during a long pause, or lost
/// with a member's restart): nothing was written, and a new session is needed.
pub(super) fn lease_gone(f: &Failure) -> bool {
    f.message.contains("requested lease not found")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_connection_is_a_request_that_never_left() {
        let refused =
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable("tcp connect error"));
        assert!(not_sent(&refused));
        let no_leader =
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable("etcdserver: no leader"));
        assert!(
            !not_sent(&no_leader),
            "a member without a leader saw the request"
        );
        // An election's answers are sent again; a refusal of the request itself is not.
        for (status, again) in [
            (
                tonic::Status::unavailable("etcdserver: leader changed"),
                true,
            ),
            (tonic::Status::unavailable("etcdserver: no leader"), true),
            (tonic::Status::cancelled("operation was canceled"), true),
            (tonic::Status::unknown("transport error"), true),
            (
                tonic::Status::unavailable("invalid peer certificate"),
                false,
            ),
            (
                tonic::Status::not_found("etcdserver: requested lease not found"),
                false,
            ),
            (
                tonic::Status::invalid_argument("etcdserver: key is not provided"),
                false,
            ),
            (
                tonic::Status::permission_denied("etcdserver: permission denied"),
                false,
            ),
        ] {
            let text = status.message().to_owned();
            assert_eq!(
                retryable(&etcd_client::Error::GRpcStatus(status)),
                again,
                "{text}"
            );
        }
        let f = failure_of(
            &["hunter2-pw".into()],
            etcd_client::Error::GRpcStatus(tonic::Status::invalid_argument(
                "etcdserver: authentication failed, invalid user ID or password hunter2-pw",
            )),
        );
        assert_eq!(f.kind, BackendErrorKind::Auth);
        assert!(!f.message.contains("hunter2-pw"));
    }
}
