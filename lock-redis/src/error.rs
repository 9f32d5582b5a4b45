//! Typed Redis failures, kept as the `source` of [`distlock_core::Error`].

use std::fmt;

use distlock_core::Error;

/// What went wrong on one Redis node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedisErrorKind {
    /// A key used by the lock holds another data type (`WRONGTYPE`): something else occupies
    /// the lock name's keys.
    WrongType,
    /// The server is a read-only replica (`READONLY`): connect to the master.
    ReadOnly,
    /// A script was missing (`NOSCRIPT`) and could not be reloaded.
    NoScript,
    /// The connection was refused (nothing listens there).
    ConnectionRefused,
    /// The server does not understand a command the lock sends (`SET ... NX GET` needs
    /// Redis 7.0; older servers are served by the scripts alone).
    Unsupported,
    /// No answer in time.
    Timeout,
    /// The connection broke or could not be established.
    Connection,
    /// Any other server or protocol error.
    Other,
}

impl fmt::Display for RedisErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::WrongType => "a lock key holds a value of another type (WRONGTYPE)",
            Self::ReadOnly => "the server is a read-only replica (READONLY)",
            Self::NoScript => "a lock script is missing on the server (NOSCRIPT)",
            Self::Unsupported => "the server does not support a command (syntax error)",
            Self::ConnectionRefused => "connection refused",
            Self::Timeout => "no answer in time",
            Self::Connection => "connection failed",
            Self::Other => "server error",
        })
    }
}

/// A Redis failure on one node, as the `source` of an [`Error::Backend`] or
/// [`Error::Unavailable`]; downcast to it to tell the cases apart. It displays as its kind only:
/// the error that carries it names the node.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct RedisError {
    /// What kind of failure.
    pub kind: RedisErrorKind,
    /// The node's address.
    pub node: String,
    /// The client library's error, when there is one.
    #[source]
    pub source: Option<redis::RedisError>,
}

impl RedisError {
    /// Whether retrying later can help (connection problems and timeouts).
    pub fn is_transient(&self) -> bool {
        matches!(
            self.kind,
            RedisErrorKind::ConnectionRefused
                | RedisErrorKind::Timeout
                | RedisErrorKind::Connection
        )
    }

    pub(crate) fn timeout(node: &str) -> Self {
        Self {
            kind: RedisErrorKind::Timeout,
            node: node.to_owned(),
            source: None,
        }
    }

    pub(crate) fn classify(node: &str, err: redis::RedisError) -> Self {
        let kind = match err.code() {
            Some("WRONGTYPE") => RedisErrorKind::WrongType,
            Some("READONLY") => RedisErrorKind::ReadOnly,
            Some("NOSCRIPT") => RedisErrorKind::NoScript,
            _ if err.is_connection_refusal() => RedisErrorKind::ConnectionRefused,
            _ if err.is_timeout() => RedisErrorKind::Timeout,
            _ if err.is_io_error() || err.is_connection_dropped() => RedisErrorKind::Connection,
            _ => {
                // Script and transaction errors carry the original code inside their message
                // (a queued command's READONLY shows as "ReadOnly").
                let text = err.to_string();
                if text.contains("WRONGTYPE") {
                    RedisErrorKind::WrongType
                } else if text.contains("READONLY") || text.contains("ReadOnly") {
                    RedisErrorKind::ReadOnly
                } else if text.contains("syntax error") {
                    RedisErrorKind::Unsupported
                } else {
                    RedisErrorKind::Other
                }
            }
        };
        Self {
            kind,
            node: node.to_owned(),
            source: Some(err),
        }
    }

    /// The distlock error for this failure during `what` (e.g. "acquire").
    pub(crate) fn into_lock_error(self, what: &str) -> Error {
        // The kind says it all, except for another server error: then the server's words.
        let reason = match self.kind {
            RedisErrorKind::Other => self.summary(),
            _ => self.kind.to_string(),
        };
        let message = if what == "connect" {
            format!("cannot connect to Redis at {}: {reason}", self.node)
        } else {
            format!("{what} on {}: {reason}", self.node)
        };
        if self.is_transient() {
            Error::unavailable(message, self)
        } else {
            Error::backend(message, self)
        }
    }

    /// One line for a quorum report.
    pub(crate) fn summary(&self) -> String {
        match &self.source {
            Some(source) => format!("{}: {source}", self.kind),
            None => self.kind.to_string(),
        }
    }
}
