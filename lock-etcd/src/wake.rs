//! What wakes a waiter: a watch on the key(s) ahead of it that block it, or the deadline.

use std::time::Instant;

use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchStream};

/// What a waiting attempt watches: the one key (or, for the first permit waiter, the name's
/// range) whose change may unblock it. Deletions always wake; puts only where `puts` says so
/// (a permit waiter learns that its predecessor became a holder by the predecessor's touch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Blocker {
    /// The key, or the start of the watched range.
    pub(crate) key: String,
    /// Whether every key starting with `key` is watched.
    pub(crate) prefix: bool,
    /// Whether a put wakes too.
    pub(crate) puts: bool,
}

impl Blocker {
    /// A deletion of `key` (the mutex's predecessor watch, a reader's writer watch).
    pub(crate) fn deletion(key: String) -> Self {
        Self {
            key,
            prefix: false,
            puts: false,
        }
    }

    /// The watch request: deletions only unless puts wake too.
    pub(crate) fn options(&self) -> WatchOptions {
        let mut options = WatchOptions::new();
        if !self.puts {
            options = options.with_filters([WatchFilterType::NoPut]);
        }
        if self.prefix {
            options = options.with_prefix();
        }
        options
    }
}

/// The next watch answer: `Some(true)` for a deletion (or a cancelled watch, or a put where
/// the blocker's puts wake), `Some(false)` for anything else, `None` when the stream failed.
/// Never resolves without a watch.
pub(crate) async fn next_event(watch: &mut Option<(Blocker, WatchStream, i64)>) -> Option<bool> {
    let Some((blocker, stream, _)) = watch else {
        return std::future::pending().await;
    };
    match stream.message().await {
        Ok(Some(resp)) => Some(
            resp.canceled()
                || resp
                    .events()
                    .iter()
                    .any(|e| blocker.puts || e.event_type() == EventType::Delete),
        ),
        Ok(None) | Err(_) => None,
    }
}

pub(crate) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
