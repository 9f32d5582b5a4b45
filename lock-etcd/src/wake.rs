//! What wakes a waiter: a watch on the key(s) ahead of it that block it, or the deadline.
//!
//! **Watches are reused.** etcd (3.4 to 3.6) starts a watch "from now" at the revision it read
//! just before registering it; a write that commits in between leaves the new watcher
//! *unsynced*, and an unsynced watcher gets its events only from the catch-up loop, which runs
//! every 100 ms. Under contention writes are constant, so some watches opened per wait missed
//! the handoff by up to 100 ms (measured: 4 clients on one name, a waiter's deletion event
//! 58 ms after the delete was answered, `etcd_debugging_mvcc_slow_watcher_total` non-zero
//! in 6 of 132 samples). A watch that woke its waiter (or that the waiter no longer needs) is
//! therefore kept idle by the client for [`WATCH_IDLE`]: the next wait for the same key
//! takes it back, long since synced, instead of opening another. Its old events are told
//! apart by revision (only changes at or after the waiter's read wake it). The mutex's and
//! reader's key (reused by its client, see `keys.rs`) is usually the same predecessor round
//! after round, and a permit waiter's range watch is the same for every wait on the name.
//!
//! Every watch, kept or not, is a watch id on the client's one watch stream (`watcher.rs`):
//! opening a watch is one create message, and dropping one sends its cancel.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use distlock_core::backend::unpoisoned as lock;
use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchResponse};

use crate::watcher::{Answer, HubWatch};

/// What a waiting attempt watches, for deletions only: the one key ahead of it that blocks
/// it, or a range of keys (a permit waiter: the name's whole range; a reader: the part of the
/// range that is not shared keys), whose deletions the waiter counts against the keys ahead
/// of it that block it (see [`PermitCount`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Blocker {
    /// The key, or the start of the watched range.
    pub(crate) key: String,
    /// Where the watched range ends, if a range is watched.
    pub(crate) end: Option<RangeEnd>,
}

/// The end of a watched range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RangeEnd {
    /// Every key that starts with the blocker's key.
    Prefix,
    /// Up to this key (excluded).
    Before(String),
}

impl Blocker {
    /// A deletion of `key` (the mutex's predecessor watch, a reader's writer watch).
    pub(crate) fn deletion(key: String) -> Self {
        Self { key, end: None }
    }

    /// The deletions in the range of keys starting with `range` (a permit waiter's watch).
    pub(crate) fn range(range: String) -> Self {
        Self {
            key: range,
            end: Some(RangeEnd::Prefix),
        }
    }

    /// The deletions in the range of keys from `start` up to `end` (a reader's watch of the
    /// keys that are not shared).
    pub(crate) fn between(start: String, end: String) -> Self {
        Self {
            key: start,
            end: Some(RangeEnd::Before(end)),
        }
    }

    /// The watch request: deletions only, without the deleted key's last version (etcd reads
    /// it from its store for every watch that asks, per event: a range watched by 64 waiters
    /// made 64 reads of each deletion).
    pub(crate) fn options(&self) -> WatchOptions {
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        match &self.end {
            None => options,
            Some(RangeEnd::Prefix) => options.with_prefix(),
            Some(RangeEnd::Before(end)) => options.with_range(end.clone()),
        }
    }
}

/// A permit waiter's count of the keys ahead of its own, kept up to date from its range
/// watch's deletions instead of reading the queue again.
///
/// A reader counts the same way, as a permit of one, the keys ahead of it that are not shared
/// (writers): it holds once none is left. Its watch covers only those keys, so it never sees
/// its own key's deletion; before it holds by the count its lease is checked (refreshed
/// within a tenth of its ttl, or kept alive), and only the lease's end or the waiter's own
/// abandon deletes a waiting key.
///
/// Exact by construction: the count starts from a read at revision `from - 1` of the keys
/// before ours, by name (all permits of the same N: a key of another kind ahead is never
/// counted), the watch delivers every deletion of the range after that revision exactly once
/// and in order (the client's stream resumes a broken watch from the last revision it
/// delivered), and no key ever joins ahead of ours (a later key has a later create revision).
/// The first deletion of a name read ahead is the deletion of that key (it existed at the
/// read, so a key of that name made later, behind ours, since a client reuses its key names,
/// comes after it): one key fewer ahead, and the name leaves the set, so the later key's
/// deletion does not count. Once fewer than N are ahead, our key holds a permit from that
/// revision on, exactly as a read would have found. Anything the count cannot tell (our own
/// key deleted, a deletion without its key) makes it stale: the waiter reads the queue again.
#[derive(Clone, Debug)]
pub(crate) struct PermitCount {
    /// The keys ahead of ours at the last read, less those deleted since.
    ahead: HashSet<Vec<u8>>,
    permits: usize,
    /// Our key.
    key: String,
    /// Whether the count can no longer be trusted (see the type's documentation).
    stale: bool,
}

impl PermitCount {
    /// The count of a waiter with keys `ahead` ahead of its key `key`, all permits of
    /// `permits`.
    pub(crate) fn new(ahead: impl IntoIterator<Item = Vec<u8>>, permits: u32, key: String) -> Self {
        Self {
            ahead: ahead.into_iter().collect(),
            permits: usize::try_from(permits).unwrap_or(usize::MAX),
            key,
            stale: false,
        }
    }

    /// Whether our key holds a permit now, by the count (no read needed).
    pub(crate) fn holds(&self) -> bool {
        !self.stale && self.ahead.len() < self.permits
    }

    /// Counts the deletions of `resp` at `from` or later; true when the waiter should poll:
    /// it holds by the count, or the count went stale.
    fn apply(&mut self, resp: &WatchResponse, from: i64) -> bool {
        self.count(
            resp.events()
                .iter()
                .filter(|e| e.event_type() == EventType::Delete)
                .map(|e| Deletion {
                    revision: e.kv().map(etcd_client::KeyValue::mod_revision),
                    key: e.kv().map(etcd_client::KeyValue::key),
                }),
            from,
        )
    }

    /// [`Self::apply`] on deletions as the count sees them.
    fn count<'a>(&mut self, deletions: impl Iterator<Item = Deletion<'a>>, from: i64) -> bool {
        for deletion in deletions {
            if deletion.revision.is_some_and(|r| r < from) {
                continue; // already in the read the count started from
            }
            match deletion.key {
                Some(key) if key == self.key.as_bytes() => self.stale = true,
                Some(key) => {
                    self.ahead.remove(key);
                }
                None => self.stale = true,
            }
        }
        self.stale || self.ahead.len() < self.permits
    }
}

/// A deletion in a watched range: its revision and the deleted key, where the event carries
/// them.
struct Deletion<'a> {
    revision: Option<i64>,
    key: Option<&'a [u8]>,
}

/// A watch: what it watches, its id on the client's stream, and the revision it started after.
pub(crate) struct Watch {
    pub(crate) blocker: Blocker,
    pub(crate) stream: HubWatch,
    pub(crate) start: i64,
    /// Whether it was kept idle before (see [`IdleWatches`]).
    pub(crate) kept: bool,
}

/// What a watch answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// A change that may unblock the waiter: poll again. The watch is still good.
    Changed,
    /// The server cancelled the watch: poll again, with a new one.
    Cancelled,
    /// The client's stream failed and could not be opened again.
    Failed,
}

/// The next watch answer that matters to a waiter whose read was at revision `from - 1`: a
/// deletion at `from` or later is [`Woken::Changed`], or, for a waiter that counts the keys
/// ahead of it (`count`), a deletion after which it holds by the count (or the count went
/// stale). The answers that change nothing (older changes; a counting waiter's deletions that
/// leave it short) are taken here, counted where they count. Cancel safe: an answer is counted
/// in `count` when it is taken, and none is taken twice. Never resolves without a watch.
pub(crate) async fn next_event(
    watch: &mut Option<Watch>,
    from: i64,
    mut count: Option<&mut PermitCount>,
) -> Woken {
    let Some(Watch { stream, .. }) = watch else {
        return std::future::pending().await;
    };
    loop {
        match stream.next().await {
            Some(Answer::Cancelled) => return Woken::Cancelled,
            Some(Answer::Events(resp)) => {
                let wakes = match count.as_deref_mut() {
                    Some(count) => count.apply(&resp, from),
                    None => resp.events().iter().any(|e| {
                        e.event_type() == EventType::Delete
                            && e.kv().is_none_or(|kv| kv.mod_revision() >= from)
                    }),
                };
                if wakes {
                    return Woken::Changed;
                }
            }
            Some(Answer::Created { .. }) => {}
            Some(Answer::Failed) | None => return Woken::Failed,
        }
    }
}

/// How long a client keeps a watch nobody waits on, for the next wait on the same key.
pub(crate) const WATCH_IDLE: Duration = Duration::from_secs(2);

/// The most idle watches a client keeps (the oldest goes first).
pub(crate) const IDLE_WATCHES: usize = 64;

/// The idle watches of one client, kept for reuse (see the module's documentation); each is
/// dropped (and so cancelled on the server) after [`WATCH_IDLE`] unused.
#[derive(Clone, Default)]
pub(crate) struct IdleWatches {
    inner: Arc<StdMutex<IdleSet>>,
}

#[derive(Default)]
struct IdleSet {
    watches: VecDeque<(Watch, Instant)>,
    /// Whether a task is sweeping out expired watches.
    sweeping: bool,
}

impl IdleSet {
    /// Takes out the expired watches, for the caller to drop outside the lock.
    fn expired(&mut self) -> Vec<Watch> {
        let mut gone = Vec::new();
        while self
            .watches
            .front()
            .is_some_and(|(_, since)| since.elapsed() >= WATCH_IDLE)
        {
            gone.extend(self.watches.pop_front().map(|(w, _)| w));
        }
        gone
    }
}

impl IdleWatches {
    /// An idle watch of `blocker`, if the client keeps one.
    pub(crate) fn take(&self, blocker: &Blocker) -> Option<Watch> {
        let mut set = lock(&self.inner);
        let _expired = set.expired();
        let at = set
            .watches
            .iter()
            .rposition(|(w, _)| w.blocker == *blocker)?;
        set.watches.remove(at).map(|(w, _)| w)
    }

    /// Keeps `watch` for the next wait on its key (or range).
    pub(crate) fn park(&self, mut watch: Watch) {
        watch.kept = true;
        let mut set = lock(&self.inner);
        let mut gone = set.expired();
        if set.watches.len() >= IDLE_WATCHES {
            gone.extend(set.watches.pop_front().map(|(w, _)| w));
        }
        set.watches.push_back((watch, Instant::now()));
        if !set.sweeping
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            set.sweeping = true;
            let weak = Arc::downgrade(&self.inner);
            runtime.spawn(async move {
                loop {
                    tokio::time::sleep(WATCH_IDLE).await;
                    let Some(inner) = weak.upgrade() else { return };
                    let mut set = lock(&inner);
                    let gone = set.expired();
                    if set.watches.is_empty() {
                        set.sweeping = false;
                        return;
                    }
                    drop(set);
                    drop(gone);
                }
            });
        }
        drop(set);
        drop(gone);
    }
}

pub(crate) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gone(revision: i64, key: &str) -> Deletion<'_> {
        Deletion {
            revision: Some(revision),
            key: Some(key.as_bytes()),
        }
    }

    /// Our key `p2.me.1`, read at 59 with 3 permits of 2 ahead.
    fn count() -> PermitCount {
        let ahead = ["p2.a.1", "p2.b.1", "p2.c.1"].map(|k| k.as_bytes().to_vec());
        PermitCount::new(ahead, 2, "p2.me.1".to_owned())
    }

    #[test]
    fn each_deletion_ahead_is_one_key_fewer_until_a_permit_is_free() {
        let mut c = count();
        assert!(!c.count([gone(60, "p2.a.1")].into_iter(), 60));
        assert!(!c.holds());
        assert!(c.count([gone(61, "p2.b.1")].into_iter(), 60));
        assert!(c.holds());
    }

    #[test]
    fn deletions_behind_or_before_the_read_do_not_count() {
        let mut c = count();
        // Behind ours (not read ahead): a waiter that left.
        assert!(!c.count([gone(60, "p2.z.1")].into_iter(), 60));
        // Already in the read (before `from`).
        assert!(!c.count([gone(59, "p2.a.1")].into_iter(), 60));
        assert_eq!(c.ahead.len(), 3);
        // Two deletions in one answer, one ahead and one behind.
        let both = [gone(62, "p2.a.1"), gone(62, "p2.y.1")];
        assert!(!c.count(both.into_iter(), 60));
        assert_eq!(c.ahead.len(), 2);
        // The same name again: a key made behind ours after the one ahead was deleted.
        assert!(!c.count([gone(63, "p2.a.1")].into_iter(), 60));
        assert_eq!(c.ahead.len(), 2);
        assert!(!c.holds());
    }

    #[test]
    fn a_deletion_told_twice_counts_once() {
        // A reader behind two writers counts as a permit of one.
        let writers = ["w.1", "w.2"].map(|k| k.as_bytes().to_vec());
        let mut c = PermitCount::new(writers, 1, "r.me.1".to_owned());
        assert!(!c.count([gone(60, "w.1"), gone(60, "w.1")].into_iter(), 60));
        assert!(!c.holds(), "one writer is still ahead");
        assert!(c.count([gone(61, "w.2")].into_iter(), 60));
        assert!(c.holds());
    }

    #[test]
    fn our_own_deletion_or_a_deletion_without_its_version_makes_the_count_stale() {
        let mut c = count();
        assert!(c.count([gone(60, "p2.me.1")].into_iter(), 60));
        assert!(
            !c.holds(),
            "our key is gone: read again, never hold by the count"
        );
        let mut c = count();
        let blind = Deletion {
            revision: Some(60),
            key: None,
        };
        assert!(c.count([blind].into_iter(), 60));
        assert!(!c.holds());
        // Stale stays stale, whatever follows.
        assert!(c.count([gone(61, "p2.a.1"), gone(61, "p2.b.1")].into_iter(), 60));
        assert!(!c.holds());
    }
}
