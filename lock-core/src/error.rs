//! The error type shared by every backend, and the reasons a held lock can be lost.

use std::fmt;
use std::time::Duration;

/// A boxed error from a backend's client library, kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of every lock operation, whatever the backend.
///
/// Variants are backend-neutral; the backend's own error is kept as the `source`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name is not acceptable (empty, too long, contains NUL).
    #[error("invalid lock name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name (truncated).
        name: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The options are inconsistent or outside the backend's limits.
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// A URL, endpoint list or backend configuration is malformed.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// `acquire` did not get the lock before its wait deadline.
    #[error("timed out after {waited:?} waiting for lock {name:?}")]
    Timeout {
        /// The lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The lock was held by this guard but has been lost.
    #[error("lock {name:?} was lost: {reason}")]
    Lost {
        /// The lock name.
        name: String,
        /// Why it was lost.
        reason: LossReason,
    },
    /// The server says this owner does not hold the lock (it expired, or somebody else holds it).
    #[error("lock {name:?} is not held by this owner")]
    NotHeld {
        /// The lock name.
        name: String,
    },
    /// A quorum-based backend (Redlock) could not get a majority.
    #[error("quorum not reached for lock {name:?}: {reached} of {needed} needed ({})", NodeOutcome::list(.nodes))]
    QuorumNotReached {
        /// The lock name.
        name: String,
        /// Nodes that agreed.
        reached: usize,
        /// Nodes needed (a majority).
        needed: usize,
        /// What each node answered.
        nodes: Vec<NodeOutcome>,
    },
    /// The server could not be reached, or did not answer within the operation timeout.
    #[error("backend unavailable: {message}")]
    Unavailable {
        /// What failed, in plain words.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The server answered with something the lock protocol cannot work with (a key of the wrong
    /// type, a table of the wrong shape, a read-only replica, a script error).
    #[error("backend error: {message}")]
    Backend {
        /// What went wrong, in plain words.
        message: String,
        /// The client library's error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The name is in use as another kind of lock: a semaphore asked for with another number
    /// of permits than its holders use, or a semaphore name used as a read-write lock.
    #[error("lock {name:?} cannot be acquired as asked: {message}")]
    Mismatch {
        /// The lock name.
        name: String,
        /// What its holders use it as, and what was asked.
        message: String,
    },
    /// The backend, or the cargo feature that would provide it, does not support this operation.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A blocking call (`distlock::blocking`) was made from an async context, where blocking
    /// the thread would stall its runtime or deadlock: use the async API there, or make the
    /// call from `tokio::task::spawn_blocking` or a thread of your own.
    #[error(
        "distlock::blocking: `{operation}` was called from an async context, where blocking the thread would stall or deadlock its runtime; use the async API there, or call it from spawn_blocking or a plain thread"
    )]
    BlockingInAsyncContext {
        /// The blocking method that was called.
        operation: &'static str,
    },
}

impl Error {
    /// Whether trying the same operation again later can succeed.
    ///
    /// True for [`Error::Timeout`], [`Error::Unavailable`] and [`Error::QuorumNotReached`].
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Timeout { .. } | Self::Unavailable { .. } | Self::QuorumNotReached { .. }
        )
    }

    /// An [`Error::Unavailable`] with a source.
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// An [`Error::Backend`] with a source.
    pub fn backend(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// An [`Error::NotHeld`] for `name`: the server says the owner no longer holds it.
    pub fn not_held(name: impl fmt::Display) -> Self {
        Self::NotHeld {
            name: name.to_string(),
        }
    }

    /// Whether the error says the caller does not (or no longer) hold the lock.
    pub fn is_not_held(&self) -> bool {
        matches!(self, Self::NotHeld { .. } | Self::Lost { .. })
    }
}

/// The operating system's reason behind `err`, short: the first [`std::io::Error`] in its
/// source chain (itself included), as `connection refused` (lower case, without the
/// `(os error 111)`). `None` when the chain holds no I/O error. Backends use it to say in one
/// line why a connection failed when their client library wraps the reason in layers.
///
/// ```
/// let io = std::io::Error::from_raw_os_error(111); // ECONNREFUSED on Linux
/// # #[cfg(target_os = "linux")]
/// assert_eq!(distlock_core::io_cause(&io).as_deref(), Some("connection refused"));
/// ```
pub fn io_cause(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(err);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            let text = io.to_string();
            let text = text
                .find(" (os error ")
                .map_or(text.as_str(), |at| &text[..at]);
            let mut chars = text.chars();
            return Some(
                chars
                    .next()
                    .map(|first| first.to_lowercase().chain(chars).collect())
                    .unwrap_or_default(),
            );
        }
        next = err.source();
    }
    None
}

/// Why none of `hosts` (`host:port`, optionally behind `http://` or `https://`) accepts a TCP
/// connection, short (the first host's [`io_cause`]; `no answer` after `timeout`), or `None` when
/// one of them does. For client libraries that report a failed connection without its reason.
pub async fn tcp_cause<S: AsRef<str> + Sync>(
    hosts: &[S],
    timeout: std::time::Duration,
) -> Option<String> {
    let mut first = None;
    for host in hosts {
        let host = host.as_ref();
        let host = host
            .split_once("://")
            .map_or(host, |(_, rest)| rest)
            .trim_end_matches('/');
        match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(host)).await {
            Ok(Ok(_)) => return None,
            Ok(Err(err)) => {
                first.get_or_insert_with(|| io_cause(&err).unwrap_or_else(|| err.to_string()));
            }
            Err(_) => {
                first.get_or_insert_with(|| "no answer".to_owned());
            }
        }
    }
    first
}

/// Why a held lock is no longer (certainly) held. Reported by [`LockGuard::lost`](crate::LockGuard::lost).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// A renewal reached the server and was refused: somebody removed or took the lock.
    RenewalRejected,
    /// The conservative local deadline passed without a successful renewal (renewal disabled,
    /// or too slow).
    LeaseExpired,
    /// Renewals kept failing (server unreachable) until the local deadline passed.
    ConnectionLost,
    /// The backend's session ended (ZooKeeper session expiry, etcd lease revoked).
    SessionExpired,
    /// The backend observed the lock being deleted or taken by someone else.
    ReleasedElsewhere,
    /// Renewal stopped because the configured maximum hold time was reached.
    HoldLimitReached,
    /// The server restarted and forgot its locks (a Redis master without persistence).
    ServerRestarted,
    /// A failover replaced the server the lock lived on (a Redis replica promoted by Sentinel
    /// or Redis Cluster): with asynchronous replication the new master may not have the lock.
    Failover,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::RenewalRejected => "the server refused a renewal (the lock was removed or taken)",
            Self::LeaseExpired => "the lease expired before it was renewed",
            Self::ConnectionLost => "renewals failed until the lease expired (server unreachable)",
            Self::SessionExpired => "the backend session expired",
            Self::ReleasedElsewhere => "the lock was deleted or taken by someone else",
            Self::HoldLimitReached => "the maximum hold time was reached",
            Self::ServerRestarted => "the server restarted and forgot its locks",
            Self::Failover => "a failover replaced the master, which may not have the lock",
        })
    }
}

/// One node's answer in a quorum-based acquisition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeOutcome {
    /// The node's address.
    pub node: String,
    /// What it answered.
    pub result: NodeResult,
}

impl NodeOutcome {
    fn list(nodes: &[Self]) -> String {
        nodes
            .iter()
            .map(|n| format!("{}: {}", n.node, n.result))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The answer of one node in a quorum-based acquisition.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeResult {
    /// The node granted the lock.
    Acquired,
    /// Another owner holds the lock on this node.
    HeldByAnother,
    /// The node did not answer within the per-node timeout.
    TimedOut,
    /// The node answered with an error.
    Failed(String),
}

impl fmt::Display for NodeResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Acquired => f.write_str("acquired"),
            Self::HeldByAnother => f.write_str("held by another owner"),
            Self::TimedOut => f.write_str("timed out"),
            Self::Failed(e) => write!(f, "error: {e}"),
        }
    }
}

/// Shorthand for results of lock operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
