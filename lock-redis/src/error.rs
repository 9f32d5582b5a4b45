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
    /// The server refused the credentials (`WRONGPASS`, `NOAUTH`: a wrong or missing user or
    /// password) or the ACL user lacks a permission the lock needs (`NOPERM`).
    Auth,
    /// The TLS handshake failed: an untrusted, expired or misnamed certificate, a client
    /// certificate the server refused, or a server that does not speak TLS on that port.
    Tls,
    /// A failover or resharding is under way (Sentinel, Redis Cluster): the master is down or
    /// being replaced (`CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`, `LOADING`, a redirection the
    /// cluster client gave up following, no connection to the slot's node, or `READONLY` from
    /// a master that was made a replica). Retrying helps.
    Failover,
    /// Any other server or protocol error.
    Other,
    /// The lock changed hands at each of an operation's tries (an operator's forced release
    /// that found another holder at each read): no error of the server's; retrying later helps.
    Contended,
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
            Self::Auth => "the server refused the credentials (wrong or missing user or password, or an ACL without a needed permission)",
            Self::Tls => "the TLS handshake failed",
            Self::Failover => "a failover is under way (the master is down or being replaced)",
            Self::Other => "server error",
            Self::Contended => "the lock changed hands at each try",
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
                | RedisErrorKind::Failover
                | RedisErrorKind::Contended
        )
    }

    pub(crate) fn timeout(node: &str) -> Self {
        Self {
            kind: RedisErrorKind::Timeout,
            node: node.to_owned(),
            source: None,
        }
    }

    /// The lock changed hands at each try on `node` (`why` says how often).
    pub(crate) fn contended(node: &str, why: String) -> Self {
        Self {
            kind: RedisErrorKind::Contended,
            node: node.to_owned(),
            source: Some(redis::RedisError::from(std::io::Error::other(why))),
        }
    }

    /// A TLS failure on `node` that the client library did not see as one (`why` says what
    /// the server answered instead).
    pub(crate) fn tls(node: &str, why: String) -> Self {
        Self {
            kind: RedisErrorKind::Tls,
            node: node.to_owned(),
            source: Some(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                why,
            ))),
        }
    }

    pub(crate) fn classify(node: &str, err: redis::RedisError) -> Self {
        let kind = match err.code() {
            Some("WRONGPASS" | "NOAUTH" | "NOPERM") => RedisErrorKind::Auth,
            _ if err.kind() == redis::ErrorKind::AuthenticationFailed => RedisErrorKind::Auth,
            _ if tls_failure(&err) => RedisErrorKind::Tls,
            Some("WRONGTYPE") => RedisErrorKind::WrongType,
            Some("READONLY") => RedisErrorKind::ReadOnly,
            Some("CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN" | "LOADING" | "MOVED" | "ASK") => {
                RedisErrorKind::Failover
            }
            _ if err.kind() == redis::ErrorKind::ClusterConnectionNotFound => {
                RedisErrorKind::Failover
            }
            Some("NOSCRIPT") => RedisErrorKind::NoScript,
            _ if err.is_connection_refusal() => RedisErrorKind::ConnectionRefused,
            _ if err.is_timeout() => RedisErrorKind::Timeout,
            _ if err.is_io_error() || err.is_connection_dropped() => RedisErrorKind::Connection,
            _ => {
                // Script and transaction errors carry the original code inside their message
                // (a queued command's READONLY shows as "ReadOnly").
                let text = err.to_string();
                if text.contains("NOPERM") || text.contains("NOAUTH") {
                    RedisErrorKind::Auth
                } else if text.contains("WRONGTYPE") {
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
            RedisErrorKind::Other
            | RedisErrorKind::Auth
            | RedisErrorKind::Tls
            | RedisErrorKind::Contended => self.summary(),
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
        match (&self.source, self.kind) {
            // The handshake's reason is deep in the chain (redis -> io -> rustls).
            (Some(source), RedisErrorKind::Tls) => format!(
                "{}: {}",
                self.kind,
                distlock_core::io_cause(source).unwrap_or_else(|| source.to_string())
            ),
            (Some(source), _) => format!("{}: {source}", self.kind),
            (None, _) => self.kind.to_string(),
        }
    }
}

/// Whether `err` is a refused TLS handshake: rustls reports a bad certificate, a refused
/// client certificate or a peer that does not speak TLS as an I/O error of kind `InvalidData`
/// (a retry cannot help, unlike a dropped connection).
fn tls_failure(err: &redis::RedisError) -> bool {
    type ArcError = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        // The client library keeps its I/O error behind an `Arc`, whose `source` skips it.
        let e = match e.downcast_ref::<ArcError>() {
            Some(shared) => &**shared,
            None => e,
        };
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::InvalidData {
                return true;
            }
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
            {
                return true;
            }
        }
        if e.is::<rustls::Error>() {
            return true;
        }
        next = e.source();
    }
    false
}
