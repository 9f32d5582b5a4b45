//! Wake-ups: the server republishes every message stored in the bucket's stream (headers
//! only) under `_distlock.<bucket>.`; a waiter subscribes to its name's part before the read
//! of the queue that it waits by (on a single server it may read once before, unsubscribed,
//! and hold if it can), so no removal after that read is missed, and counts the removals (a
//! release's purge, a ttl's expiry marker, a force-release) of the keys that block it
//! ([`Count`]): an exclusive waiter holds once every key ahead is gone, a reader once every
//! writer ahead is, a permit waiter of N at place `i` once `i + 1 - N` keys ahead are, each
//! on that removal and with no read. New entries and renewals never unblock anyone, and a
//! release wakes the waiters it lets in, not the name's every waiter.

use async_nats::Subscriber;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};

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

    /// Drops the events delivered so far, unread: call just before a read of the queue, which
    /// sees every removal they tell of (each was stored before the client had it), except a
    /// read served by a stream leader still applying its log after a failover: such a removal
    /// is then learnt by the waiter's next read (see `NatsAttempt::counting`).
    pub(crate) fn drain(&mut self) {
        while let Some(sub) = self.sub.as_mut() {
            match sub.next().now_or_never() {
                Some(Some(_)) => {}
                Some(None) => self.sub = None,
                None => break,
            }
        }
    }

    /// Whether the subscription is open (a closed one wakes nobody).
    pub(crate) fn open(&self) -> bool {
        self.sub.is_some()
    }

    /// Resolves on the removal that lets the waiter counting in `count` hold
    /// ([`Heard::Enough`]), or on one the count cannot place ([`Heard::Look`]: read the
    /// queue). Cancel safe: a dropped call loses no event and keeps its count. A closed
    /// subscription answers `Look` once, then never resolves again (the attempt's
    /// `retry_after` still polls).
    pub(crate) async fn removal(&mut self, count: &mut Count) -> Heard {
        loop {
            let Some(sub) = self.sub.as_mut() else {
                return std::future::pending().await;
            };
            match sub.next().await {
                Some(message) if is_marker(message.headers.as_ref()) => {
                    let headers = message.headers.as_ref();
                    let header = |name: &str| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
                    let subject = header("Nats-Subject");
                    let seq = header("Nats-Sequence").and_then(|s| s.parse::<u64>().ok());
                    match count.removal(subject, seq) {
                        Heard::Nothing => {}
                        heard => return heard,
                    }
                }
                Some(_) => {}
                None => {
                    self.sub = None;
                    return Heard::Look;
                }
            }
        }
    }
}

/// What a removal told a waiter (see [`Count::removal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Nothing that changes its wait.
    Nothing,
    /// Enough of the entries ahead are gone: it holds, with no read.
    Enough,
    /// A removal the count cannot place (its own entry's, or one that names no key or
    /// sequence): read the queue.
    Look,
}

/// A waiter's count of the removals since its last read of the queue: the entries that keep it
/// waiting by that read (every one ahead of an exclusive entry or a permit, the writers ahead
/// of a reader), with their revisions then, and how many of them must leave before it holds
/// (a permit of N at place `i`: `i + 1 - N`; any other kind: all).
///
/// Counting is enough to hold on, with no read: the read saw every entry ahead (an entry's place
/// is its first revision, so none created later is ever ahead; the read is retried until it
/// shows the waiter's own entry, and then shows every one before it), and the subscription,
/// open before that read, delivers the removals after it (at most once: a lost one only
/// delays the waiter until its next read), in the stream's order. A removal of a key
/// counts only if stored after the revision the read saw of it: a key is its client's for one
/// acquisition at a time but is reused by the next one, so the marker of an earlier entry of
/// the same key must not count against the entry the read saw. (Not "after the read": a read
/// is a walk of the range, one message per request, and finds a removal stored while it walked
/// past the entry it removed.) The events delivered before the read are dropped
/// ([`Wake::drain`]), and a count holds only on the connection the read was made on (see
/// [`Count::connects`]): a server killed and restarted may bring back entries whose removal
/// its subscribers had already been told of (`distlock check`, restart fault: a permit waiter
/// paused across a restart counted removals that its read after it did not reflect, and held
/// as the third of two permits).
#[derive(Debug, Default)]
pub(crate) struct Count {
    /// The subjects of the entries that block the waiter, with their revisions as read.
    blockers: Vec<(String, u64)>,
    /// How many of them must be gone before the waiter holds.
    needed: usize,
    /// Those gone since the read.
    removed: Vec<String>,
    /// The waiter's own key, and its entry's revision as read.
    own: (String, u64),
    /// The client's connection count before the read ([`async_nats::Statistics::connects`]).
    connects: u64,
}

impl Count {
    /// A count from a read made on connection `connects` that found `blockers` (subjects and
    /// revisions) keeping the entry `own` (subject and revision) waiting until `needed` of
    /// them are gone.
    pub(crate) fn new(
        blockers: Vec<(String, u64)>,
        needed: usize,
        own: (String, u64),
        connects: u64,
    ) -> Self {
        Self {
            blockers,
            needed,
            removed: Vec::new(),
            own,
            connects,
        }
    }

    /// The connection count of the client before the read: a counted hold needs the count
    /// unchanged (no reconnect since), or it reads again.
    pub(crate) fn connects(&self) -> u64 {
        self.connects
    }

    /// How many more removals the waiter needs.
    pub(crate) fn left(&self) -> usize {
        self.needed.saturating_sub(self.removed.len())
    }

    /// Counts a removal of key `subject` stored at `seq` (either `None` when the event does not
    /// say).
    pub(crate) fn removal(&mut self, subject: Option<&str>, seq: Option<u64>) -> Heard {
        let (Some(subject), Some(seq)) = (subject, seq) else {
            return Heard::Look;
        };
        if subject == self.own.0 {
            // Its own entry removed (force-released, expired while paused) after the read: its
            // place is gone. An earlier entry's marker of the same key says nothing.
            return if seq > self.own.1 {
                Heard::Look
            } else {
                Heard::Nothing
            };
        }
        let counts = self
            .blockers
            .iter()
            .any(|(key, rev)| key == subject && seq > *rev);
        if !counts || self.removed.iter().any(|r| r == subject) {
            return Heard::Nothing;
        }
        self.removed.push(subject.to_owned());
        if self.left() == 0 {
            Heard::Enough
        } else {
            Heard::Nothing
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

#[cfg(test)]
mod tests {
    use super::{Count, Heard};

    fn count(needed: usize) -> Count {
        let blockers = [("a", 10), ("b", 12), ("c", 14)];
        let blockers = blockers.map(|(k, r)| (k.to_owned(), r)).to_vec();
        Count::new(blockers, needed, ("me".to_owned(), 16), 1)
    }

    #[test]
    fn holds_once_enough_blockers_are_gone() {
        let mut c = count(2);
        assert_eq!(c.removal(Some("b"), Some(20)), Heard::Nothing);
        assert_eq!(c.left(), 1);
        // The same key twice, a key that never blocked: no count.
        assert_eq!(c.removal(Some("b"), Some(21)), Heard::Nothing);
        assert_eq!(c.removal(Some("z"), Some(22)), Heard::Nothing);
        assert_eq!(c.left(), 1);
        assert_eq!(c.removal(Some("a"), Some(23)), Heard::Enough);
    }

    #[test]
    fn an_earlier_entry_of_a_blocking_key_does_not_count() {
        let mut c = count(1);
        // Stored before the entry the read saw of the key (12): an earlier entry's marker.
        assert_eq!(c.removal(Some("b"), Some(11)), Heard::Nothing);
        assert_eq!(c.removal(Some("b"), Some(12)), Heard::Nothing);
        assert_eq!(c.left(), 1);
        // Stored after it, even below later messages of the read's walk: it counts.
        assert_eq!(c.removal(Some("b"), Some(13)), Heard::Enough);
    }

    #[test]
    fn its_own_removal_or_an_unplaced_one_reads_again() {
        let mut c = count(3);
        assert_eq!(c.removal(Some("me"), Some(5)), Heard::Nothing);
        assert_eq!(c.removal(Some("me"), Some(17)), Heard::Look);
        assert_eq!(c.connects(), 1);
        assert_eq!(c.removal(None, Some(17)), Heard::Look);
        assert_eq!(c.removal(Some("a"), None), Heard::Look);
        assert_eq!(c.left(), 3);
    }
}
