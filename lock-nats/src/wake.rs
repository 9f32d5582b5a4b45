//! Wake-ups: the server republishes every message stored in the bucket's stream (headers
//! only) under `_distlock.<bucket>.`; a waiter subscribes to its name's part before it reads
//! the queue, so no removal after the read is missed, and wakes on the removal (a release's
//! purge, a ttl's expiry marker, a force-release) of the last key that blocks it, counting
//! the removals since its read: an exclusive waiter once every key ahead is gone, a reader
//! once every writer ahead is, a permit waiter of N at place `i` once `i + 1 - N` keys ahead
//! are. New entries and renewals never unblock anyone, and a release wakes the waiters it
//! lets in, not the name's every waiter (each of which would read the whole queue again).

use async_nats::Subscriber;
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::kinds::is_marker;

/// A subscription to a name's events.
#[derive(Debug)]
pub(crate) struct Wake {
    sub: Option<Subscriber>,
}

impl Wake {
    /// Subscribes to `events` (a name's `_distlock.<bucket>.<name>.>`).
    ///
    /// # Errors
    /// When the subscription cannot be sent (the connection is closed).
    pub(crate) async fn subscribe(
        client: &async_nats::Client,
        events: &str,
    ) -> distlock_core::Result<Self> {
        let sub = client
            .subscribe(events.to_owned())
            .await
            .map_err(|err| crate::error::request("subscribe", err))?;
        Ok(Self { sub: Some(sub) })
    }

    /// Whether the subscription is open (a closed one wakes nobody).
    pub(crate) fn open(&self) -> bool {
        self.sub.is_some()
    }

    /// Resolves once `needed` distinct keys of those `blockers` names (the subjects of the
    /// entries that block the waiter, by the last read) were removed, counted in `removed`
    /// (the caller clears it when it reads the queue again), or at the removal of a key the
    /// event does not name. Cancel safe: a dropped call loses no event but the one being
    /// read, and keeps its count in `removed`. A closed subscription never resolves again
    /// (the attempt's `retry_after` still polls).
    pub(crate) async fn removal(
        &mut self,
        blockers: &[String],
        needed: usize,
        removed: &mut Vec<String>,
    ) {
        loop {
            let Some(sub) = self.sub.as_mut() else {
                return std::future::pending().await;
            };
            match sub.next().await {
                Some(message) if is_marker(message.headers.as_ref()) => {
                    let Some(key) = message
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("Nats-Subject"))
                        .map(|s| s.as_str())
                    else {
                        return;
                    };
                    if blockers.iter().any(|b| b == key) && !removed.iter().any(|r| r == key) {
                        removed.push(key.to_owned());
                    }
                    if removed.len() >= needed {
                        return;
                    }
                }
                Some(_) => {}
                None => {
                    self.sub = None;
                    return;
                }
            }
        }
    }
}

/// A stream that yields on every event of a name (for observers of an election), and once
/// at the start, once the subscription is in place (so nothing between the caller's read and
/// the subscription is missed).
pub(crate) fn events(client: async_nats::Client, events: String) -> BoxStream<'static, ()> {
    futures::stream::once(async move { client.subscribe(events).await.ok() })
        .flat_map(|sub| match sub {
            Some(sub) => futures::stream::once(async {})
                .chain(sub.map(|_| ()))
                .boxed(),
            None => futures::stream::empty().boxed(),
        })
        .boxed()
}
