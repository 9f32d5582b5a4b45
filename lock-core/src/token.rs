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
