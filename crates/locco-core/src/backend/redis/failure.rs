//! How a Redis driver error becomes a `BackendError`: its kind, its code, and a message with
//! every secret removed. Shared by the backend and its event-loop link.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::backend::shared::io::{redact, Failure};
use crate::rt::error::BackendErrorKind;

/// A driver failure as a `BackendError`, with every secret removed from the message.
pub(crate) fn failure_of(secrets: &[String], e: RedisError) -> Failure {
    // The server's own codes first: the driver files NOAUTH under no kind of its own.
    if matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM")) {
        return Failure {
            code: e.code().map(str::to_string),
            ..Failure::new(
                "redis",
                BackendErrorKind::Auth,
                redact(secrets, e.to_string()),
            )
        };
    }
    let text = e.to_string();
    // "HTTP/1.1 400 …": the first byte of the answer is no RESP type.
    if text.contains("unknown type 'H'") {
        let message = format!(
            "{}: the server answered HTTP, not Redis: is the URL's port a Redis server's?",
            redact(secrets, text)
        );
        return Failure::new("redis", BackendErrorKind::Protocol, message);
    }
    let kind = match e.kind() {
        ErrorKind::AuthenticationFailed => BackendErrorKind::Auth,
        ErrorKind::Server(ServerErrorKind::NoPerm) => BackendErrorKind::Auth,
        ErrorKind::Io if e.is_timeout() => BackendErrorKind::Timeout,
        ErrorKind::Io => {
            let m = e.to_string().to_ascii_lowercase();
            if [
                "tls",
                "certificate",
                "handshake",
                "invalidcontenttype",
                "corrupt",
            ]
            .iter()
            .any(|w| m.contains(w))
            {
                BackendErrorKind::Tls
            } else {
                BackendErrorKind::Io
            }
        }
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => BackendErrorKind::Protocol,
        ErrorKind::InvalidClientConfig => BackendErrorKind::Config,
        ErrorKind::Server(ServerErrorKind::ResponseError) => {
            let m = e.to_string();
            if m.contains("NOAUTH") || m.contains("WRONGPASS") {
                BackendErrorKind::Auth
            } else {
                BackendErrorKind::Script
            }
        }
        _ if e.is_timeout() => BackendErrorKind::Timeout,
        _ => BackendErrorKind::Other,
    };
    Failure {
        code: e.code().map(str::to_string),
        ..Failure::new("redis", kind, redact(secrets, e.to_string()))
    }
}
