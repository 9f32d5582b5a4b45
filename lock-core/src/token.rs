//! Fencing tokens and what each backend guarantees about them.

use std::fmt;

/// A number that strictly increases with every acquisition of the same lock name.
///
/// Pass it along with every write to the protected resource and have the resource reject a write
/// whose token is lower than one it has already accepted: a paused former holder's late write is
/// then refused even though it still believes it holds the lock. How far the "strictly
/// increases" promise reaches depends on the backend's [`FencingGuarantee`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value.
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The token of the number a server answered (etcd's create revision, ZooKeeper's
    /// `czxid`, a Redis counter, a SQL row version): the one checked conversion every backend
    /// uses, so a token 0 or below is never handed out.
    ///
    /// ```
    /// use distlock_core::FencingToken;
    ///
    /// assert_eq!(FencingToken::from_server(42, "a counter").unwrap().get(), 42);
    /// assert!(FencingToken::from_server(0, "a counter").is_err());
    /// ```
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) naming `what` when `value` is 0 or negative:
    /// it would sort below every token already handed out, and a resource fenced with it would
    /// take a late write it must refuse (a missing or corrupt server value, not a lock).
    pub fn from_server(value: i64, what: &str) -> crate::Result<Self> {
        match u64::try_from(value) {
            Ok(token) if token > 0 => Ok(Self(token)),
            _ => Err(crate::Error::Backend {
                message: format!("{what} is {value}, not a fencing token (it must be above 0)"),
                source: None,
            }),
        }
    }

    /// The raw value, e.g. to store next to the protected data.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({})", self.0)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

/// How far a backend's fencing tokens can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FencingGuarantee {
    /// Tokens come from a linearizable store (etcd revision, ZooKeeper zxid, SQL row version,
    /// the in-memory backend's process-wide counter): strictly increasing, always.
    Linearizable,
    /// Tokens come from a counter on one server (Redis `INCR`): strictly increasing as long as
    /// that server keeps its data (no failover to a lagging replica, no restart without fsync).
    SingleNode,
    /// Tokens are the best a protocol without consensus can do (Redlock: the maximum of the
    /// majority's counters). Do not rely on them for correctness.
    BestEffort,
}

impl fmt::Display for FencingGuarantee {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Linearizable => "linearizable",
            Self::SingleNode => "single-node",
            Self::BestEffort => "best-effort",
        })
    }
}
