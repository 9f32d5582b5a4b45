//! Wake-ups: the server republishes every message stored in the bucket's stream (headers
//! only) under `_distlock.<bucket>.`; a waiter subscribes to its name's part before it reads
//! the queue, so no removal after the read is missed, and wakes on the removal (a release's
//! purge, a ttl's expiry marker, a force-release) of a key that blocks it: an exclusive
//! waiter its predecessor, a reader the nearest writer ahead, a permit waiter any key ahead.
//! New entries and renewals never unblock anyone, and a release wakes one exclusive waiter,
//! not the name's every waiter.

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

    /// Resolves at the next removal of one of the keys `blockers` names (the subjects of
    /// the entries that block the waiter, by the last read). Cancel safe: a dropped call
    /// loses no event but the one being read. A closed subscription never resolves again
    /// (the attempt's `retry_after` still polls).
    pub(crate) async fn removal(&mut self, blockers: &[String]) {
        loop {
            let Some(sub) = self.sub.as_mut() else {
                return std::future::pending().await;
            };
            match sub.next().await {
                Some(message) if is_marker(message.headers.as_ref()) => {
                    let removed = message
                        .headers
                        .as_ref()
                        .and_then(|h| h.get("Nats-Subject"))
                        .map(|s| s.as_str());
                    if removed.is_none_or(|r| blockers.iter().any(|b| b == r)) {
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
