//! What a driver error is to the engine: its kind, and a sentence without the driver's labels.

use mongodb::error::{ErrorKind, WriteFailure};

use crate::backend::shared::io::{redact, Failure};
use crate::rt::error::BackendErrorKind;

use super::Inner;

/// A driver error as a sentence: the error kind's own text, without the driver's labels and
/// source fields; a failed server selection names each server and why it was unusable rather
/// than dumping the topology.
pub(super) fn sentence(e: &mongodb::error::Error) -> String {
    match &*e.kind {
        ErrorKind::ServerSelection { message, .. } => {
            let servers = servers_of(message);
            if servers.is_empty() {
                format!(
                    "no MongoDB server could be used: {}",
                    first_sentence(message)
                )
            } else {
                format!("no MongoDB server could be used: {}", servers.join("; "))
            }
        }
        kind => kind.to_string(),
    }
}

/// "host:port: why" for each server of a topology description.
fn servers_of(topology: &str) -> Vec<String> {
    topology
        .split("Address: ")
        .skip(1)
        .map(|part| {
            let address = part.split([',', ' ']).next().unwrap_or_default();
            let why = part
                .split_once("Error: ")
                .map(|(_, e)| {
                    let e = e.trim_start_matches("Kind: ");
                    e.split(", labels:").next().unwrap_or(e).trim()
                })
                .filter(|e| !e.is_empty());
            let kind = part
                .split_once("Type: ")
                .and_then(|(_, t)| t.split([',', ' ']).next())
                .unwrap_or("Unknown");
            match why {
                Some(why) => format!("{address}: {why}"),
                None => format!("{address}: a {kind} server, not one this URL accepts"),
            }
        })
        .collect()
}

fn first_sentence(text: &str) -> &str {
    text.split(". ").next().unwrap_or(text)
}

impl Inner {
    pub(super) fn failure(&self, e: mongodb::error::Error) -> Failure {
        let code = match &*e.kind {
            ErrorKind::Command(c) => Some(c.code.to_string()),
            ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code.to_string()),
            ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code.to_string()),
            _ => None,
        };
        let kind = match &*e.kind {
            ErrorKind::Authentication { .. } => BackendErrorKind::Auth,
            ErrorKind::Command(c) if c.code == 13 || c.code == 18 => BackendErrorKind::Auth,
            ErrorKind::ServerSelection { .. } => BackendErrorKind::Timeout,
            ErrorKind::Io(_) | ErrorKind::ConnectionPoolCleared { .. } => BackendErrorKind::Io,
            ErrorKind::InvalidArgument { .. } => BackendErrorKind::Config,
            ErrorKind::InvalidResponse { .. } => BackendErrorKind::Protocol,
            _ => BackendErrorKind::Other,
        };
        Failure {
            code,
            ..Failure::new("mongo", kind, redact(&self.secrets, sentence(&e)))
        }
    }
}

pub(super) fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    match &*e.kind {
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code == 11000,
        ErrorKind::Command(c) => c.code == 11000,
        _ => false,
    }
}
