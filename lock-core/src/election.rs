//! Leader election on top of the exclusive lock: a campaign is an acquisition whose owner
//! carries the candidate's value, the term is the fencing token, and observers read the
//! holder when the backend wakes them (or at intervals).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;

use crate::{DistributedLock, Error, FencingToken, LockInfo, LockKind, LockName, Result};

/// The separator between a campaign's unique id and its value in the owner stored on the
/// server: `<32 hex digits>@<value>`.
const VALUE_AT: usize = 32;

/// The leader of an election, as anyone can read it with
/// [`DistributedLock::leader`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The value the leader campaigned with; `None` when the name is held by a plain
    /// exclusive lock rather than a campaign.
    pub value: Option<String>,
    /// The leader's term: its fencing token. Terms strictly increase across leaders (where the
    /// backend can tell the token).
    pub term: Option<FencingToken>,
    /// The owner value stored on the server.
    pub owner: String,
    /// The remaining lease, if the backend can tell.
    pub remaining: Option<Duration>,
}

impl Leader {
    /// Longest candidate value, in bytes.
    pub const MAX_VALUE_LEN: usize = 128;

    /// The leader an inspection shows: the exclusive holder, if any. Its value is the last one
    /// it proclaimed (the hold's data), else the one it campaigned with.
    pub(crate) fn from_info(info: LockInfo) -> Option<Self> {
        if info.kind != LockKind::Exclusive {
            return None;
        }
        Some(Self {
            value: campaign_value(&info.owner)
                .map(|value| info.data.unwrap_or_else(|| value.to_owned())),
            term: info.token,
            owner: info.owner,
            remaining: info.remaining,
        })
    }
}

/// Checks a leader value: at most [`Leader::MAX_VALUE_LEN`] bytes, no NUL.
pub(crate) fn check_value(value: &str) -> Result<()> {
    if value.len() > Leader::MAX_VALUE_LEN || value.contains('\0') {
        return Err(Error::InvalidOptions(format!(
            "a leader value must be at most {} bytes without NUL, got {} bytes",
            Leader::MAX_VALUE_LEN,
            value.len()
        )));
    }
    Ok(())
}

/// The owner of one campaign for `value`.
pub(crate) fn campaign_owner(value: &str) -> Result<String> {
    check_value(value)?;
    Ok(format!("{}@{value}", crate::client::unique_owner(None)))
}

/// Whether `owner` is a campaign's.
pub(crate) fn is_campaign_owner(owner: &str) -> bool {
    campaign_value(owner).is_some()
}

/// The value of a campaign's owner; `None` for any other owner.
fn campaign_value(owner: &str) -> Option<&str> {
    let (id, rest) = owner.split_at_checked(VALUE_AT)?;
    let value = rest.strip_prefix('@')?;
    id.bytes().all(|b| b.is_ascii_hexdigit()).then_some(value)
}

/// What an observer compares to tell a change: the leader's owner, term and value.
type Seen = (String, Option<FencingToken>, Option<String>);

/// The stream of [`DistributedLock::observe`]: the leader
/// now, then each change (a new owner, term or proclaimed value, or no leader), re-read on every wake-up of
/// `changes` and every `every` in any case. Errors are yielded and the observation goes on.
pub(crate) fn observe(
    locks: Arc<dyn DistributedLock>,
    name: LockName,
    changes: Option<BoxStream<'static, ()>>,
    every: Duration,
) -> BoxStream<'static, Result<Option<Leader>>> {
    struct State {
        locks: Arc<dyn DistributedLock>,
        name: LockName,
        changes: Option<BoxStream<'static, ()>>,
        every: Duration,
        /// The last yielded leader's owner, term and value (`Some(None)`: no leader).
        last: Option<Option<Seen>>,
        /// Whether a read is due without waiting (first read, or right after a wake-up).
        due: bool,
    }
    let every = every.max(Duration::from_millis(1));
    let state = State {
        locks,
        name,
        changes,
        every,
        last: None,
        due: true,
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if !std::mem::take(&mut state.due) {
                match state.changes.as_mut() {
                    Some(changes) => {
                        tokio::select! {
                            next = changes.next() => {
                                if next.is_none() {
                                    // The backend stopped waking us: read at intervals.
                                    state.changes = None;
                                }
                            }
                            () = tokio::time::sleep(state.every) => {}
                        }
                    }
                    None => tokio::time::sleep(state.every).await,
                }
            }
            let leader = match state.locks.inspect(state.name.as_str()).await {
                Ok(info) => info.and_then(Leader::from_info),
                Err(err) => return Some((Err(err), state)),
            };
            let seen = leader
                .as_ref()
                .map(|l| (l.owner.clone(), l.term, l.value.clone()));
            if state.last.as_ref() != Some(&seen) {
                state.last = Some(seen);
                return Some((Ok(leader), state));
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_campaign_owner_carries_its_value_and_nothing_else_does() {
        let owner = campaign_owner("node-1:8080").unwrap();
        assert_eq!(campaign_value(&owner), Some("node-1:8080"));
        assert_eq!(campaign_value(&campaign_owner("").unwrap()), Some(""));
        assert_eq!(campaign_value("0123456789abcdef0123456789abcdef"), None);
        assert_eq!(
            campaign_value("worker:0123456789abcdef0123456789abcdef"),
            None
        );
        assert!(campaign_owner(&"x".repeat(Leader::MAX_VALUE_LEN + 1)).is_err());
        assert!(campaign_owner("a\0b").is_err());
    }

    /// The in-memory observers are woken by the store, not by their interval (an hour here).
    #[tokio::test]
    async fn memory_observers_are_woken_by_changes() {
        use crate::AcquireOptions;
        use crate::memory::MemoryStore;
        let locks = MemoryStore::new().client();
        let mut changes = locks.observe("job", Duration::from_secs(3600));
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(5), changes.next())
                .await
                .expect("not woken")
                .expect("ended")
                .expect("failed")
        };
        assert_eq!(next().await, None);
        let term = locks
            .campaign("job", "a", &AcquireOptions::default())
            .await
            .unwrap();
        let leader = next().await.expect("a leader");
        assert_eq!(
            (leader.value.as_deref(), leader.term),
            (Some("a"), Some(term.token()))
        );
        term.release().await.unwrap();
        assert_eq!(next().await, None);
    }
}
