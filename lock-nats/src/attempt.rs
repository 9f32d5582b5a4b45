//! One acquisition: an entry in the name's queue, and the poll that decides whether it holds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::backend::{AcquireRequest, Acquired, Attempt, AttemptMode, Step, spawn_cleanup};
use distlock_core::{FencingToken, LockKind, Result};

use crate::backend::{BackendState, Key};
use crate::error::Written;
use crate::keys::{EntryValue, NameKeys, Slot};
use crate::kinds::Queue;
use crate::lease::{HeldKey, NatsLease};
use crate::wake::{Count, Heard, Wake};

/// How often at most the waiter next in line reads the queue while its count of removals is
/// trusted (see `NatsAttempt::counting`).
const NEXT_IN_LINE_READ: Duration = Duration::from_secs(5);

/// How long past its ttl (by the server's timestamps) an entry the server still keeps is
/// removed by a waiter behind it.
const STALE_MARGIN_NS: i128 = 2_000_000_000;

/// An acquisition of one name: its entry's subject (a tag of its own), and once written, its
/// revision and first revision (its place in the queue and its fencing token).
pub(crate) struct NatsAttempt {
    state: Arc<BackendState>,
    keys: NameKeys,
    name: String,
    /// Its key.
    slot: Slot,
    owner: Arc<str>,
    kind: LockKind,
    ttl: Duration,
    mode: AttemptMode,
    /// The entry's last revision, once written.
    rev: Option<u64>,
    /// Its first revision.
    first: u64,
    /// When the write the server's ttl runs from was sent.
    written: Instant,
    /// When the first write (a create, or a renewal) that may have been stored unbeknown to
    /// the attempt was sent: one whose answer never came, or an entry a replicated stream's
    /// read did not show. A create that finds the entry keeps it with its ttl running from
    /// then (a renewal cancelled in flight and stored moves the entry, and the next renewal
    /// is refused). Cleared once a write of ours is stored.
    unanswered: Option<Instant>,
    /// The last revision of this attempt's latest entry known to be gone (removed, expired,
    /// or given up): an entry of ours read back at or below it is not one to keep. A single
    /// server killed and restarted brings back keys removed in the seconds before (see
    /// `Queue::observed`); kept, such an entry would take its old place, ahead of holders
    /// granted since.
    gone: u64,
    wake: Option<Wake>,
    /// The removals since the last read of the entries that keep it waiting.
    count: Count,
    /// What the last wake-up heard: enough of them gone (the entry holds, see [`Count`]), or
    /// a removal the count cannot place (read the queue).
    heard: Heard,
    /// When the queue was last read, and the entry's first revision then.
    read: Option<(Instant, u64)>,
}

impl NatsAttempt {
    pub(crate) fn new(state: Arc<BackendState>, request: AcquireRequest) -> Self {
        let keys = NameKeys::new(&state.bucket, request.name.as_str());
        let slot = state.slots.take(&keys, request.name.as_str(), &state.tag);
        Self {
            state,
            keys,
            name: request.name.as_str().to_owned(),
            slot,
            owner: request.owner,
            kind: request.kind,
            ttl: request.ttl,
            mode: request.mode,
            rev: None,
            first: 0,
            written: Instant::now(),
            unanswered: None,
            gone: 0,
            wake: None,
            count: Count::default(),
            heard: Heard::Nothing,
            read: None,
        }
    }

    fn value(&self) -> EntryValue {
        EntryValue {
            kind: self.kind,
            first: self.first,
            owner: self.owner.to_string(),
            data: None,
        }
    }

    /// No entry any more: the last one is gone or given up (see `gone`), and the next create
    /// expects no key.
    fn requeue(&mut self) {
        if let Some(rev) = self.rev.take() {
            self.gone = self.gone.max(rev);
        }
        self.first = 0;
        self.slot.expected = 0;
    }

    /// Removes the entry at `rev` if it is still there (a compare-and-set) and leaves none
    /// (see `requeue`); the next create expects the removal's marker.
    async fn give_up(&mut self, rev: u64) -> Result<()> {
        let removed = self.state.purge(&self.slot.subject, rev, None).await?;
        self.gone = self.gone.max(rev);
        self.requeue();
        if let Written::Stored(marker) = removed {
            // Every earlier write of ours expected an older revision: none can land now.
            self.unanswered = None;
            self.slot.expected = marker;
        }
        Ok(())
    }

    fn acquired(&self, rev: u64, alone: bool) -> Acquired {
        let key = HeldKey {
            name: self.name.clone(),
            subject: self.slot.subject.clone(),
            range: self.keys.range.clone(),
            slot: self.slot.hold(),
            alone,
        };
        let lease = NatsLease::new(self.state.clone(), self.value(), rev, key, self.ttl);
        Acquired::new(Box::new(lease), FencingToken::new(self.first))
            .with_lease_started(self.written)
    }

    /// Writes the entry only if the last revision of the name's range is `last` (nobody came
    /// or left since it was read): then the entry holds. `alone`: no other entry was live.
    async fn write_on_range(&mut self, last: u64, alone: bool) -> Result<Step> {
        let publish = BackendState::put(
            &self.value(),
            self.ttl,
            last,
            Some(self.keys.range.as_str()),
        );
        let sent = Instant::now();
        self.unanswered.get_or_insert(sent);
        match self
            .state
            .send("acquire", &self.slot.subject, publish)
            .await?
        {
            Written::Stored(rev) => {
                self.unanswered = None;
                self.rev = Some(rev);
                self.first = rev;
                self.written = sent;
                if !self.state.replicated {
                    return Ok(Step::Acquired(self.acquired(rev, alone)));
                }
                self.read_after_write(rev, alone).await
            }
            Written::Conflict => {
                self.unanswered = None;
                Ok(Step::Again)
            }
        }
    }

    /// On a replicated stream, whether the entry just written at `rev` on a range read as
    /// admitting it holds: read back, it holds, or it is removed (and the attempt goes on).
    /// Raft applies in sequence order: once ours is read back, every lower one is. A walk, one
    /// message after the other: an entry's place is its first revision, and an entry ahead of
    /// ours renewed (or its data set) since sits after ours. A shortcut that took ours, as the
    /// range's first message, for the head let two hold; and two reads sent together (the
    /// range's first message and the one after ours) may be answered out of order (a request
    /// routed to the stream's leader).
    async fn read_after_write(&mut self, rev: u64, alone: bool) -> Result<Step> {
        let queue = Queue::read(&self.state, &self.keys).await?;
        match queue.position(&self.slot.subject) {
            Some(at) if queue.holds(at) => {
                let alone = alone && queue.entries.len() == 1;
                Ok(Step::Acquired(self.acquired(rev, alone)))
            }
            _ => {
                self.give_up(rev).await?;
                Ok(Step::Again)
            }
        }
    }

    /// The client's last release of the name left it free at a known revision (see
    /// `Slot::clean`): one write expecting that revision on the range takes it, with no read.
    async fn take_free(&mut self) -> Result<Option<Step>> {
        if !self.slot.clean || self.rev.is_some() || self.unanswered.is_some() {
            return Ok(None);
        }
        self.slot.clean = false;
        match self.write_on_range(self.slot.expected, true).await? {
            Step::Again => Ok(None),
            step => Ok(Some(step)),
        }
    }

    /// `try_acquire`: one write, stored only if the name's range is as read and admits the
    /// entry with nobody waiting.
    async fn poll_try(&mut self) -> Result<Step> {
        if let Some(step) = self.take_free().await? {
            return Ok(step);
        }
        let queue = Queue::read(&self.state, &self.keys).await?;
        queue.check_kind(&self.name, self.kind)?;
        if !queue.admits(self.kind) {
            return Ok(Step::busy(None));
        }
        self.write_on_range(queue.last, queue.entries.is_empty())
            .await
    }

    /// Writes the entry (or finds the one whose answer was lost), or renews it once a third
    /// of its ttl has passed: a waiter keeps its place while it waits.
    async fn keep_entry(&mut self) -> Result<bool> {
        match self.rev {
            None => {
                let sent = Instant::now();
                let created = *self.unanswered.get_or_insert(sent);
                let publish = BackendState::put(&self.value(), self.ttl, self.slot.expected, None);
                match self
                    .state
                    .send("acquire", &self.slot.subject, publish)
                    .await?
                {
                    Written::Stored(rev) => {
                        self.rev = Some(rev);
                        self.first = rev;
                        self.written = sent;
                    }
                    Written::Conflict => match self.state.key(&self.slot.subject).await? {
                        // An earlier write of ours whose answer never came was stored (a
                        // create, or a renewal that moved the entry): its ttl runs from then.
                        // Unless that ttl has run out (the server may keep it a moment, but
                        // the waiters behind may act on its end), or the entry is one known
                        // gone and brought back by a restart: then its place is no longer
                        // ours. Remove it (at the revision read) and create a new one.
                        Key::Live(entry) if *entry.value.owner == *self.owner => {
                            if entry.rev <= self.gone || created.elapsed() >= self.ttl {
                                self.give_up(entry.rev).await?;
                                return Ok(false);
                            }
                            self.rev = Some(entry.rev);
                            self.first = entry.token();
                            self.written = created;
                        }
                        // Another lease of this client still has the key.
                        Key::Live(_) => {
                            self.slot.fresh(&self.keys);
                            return Ok(false);
                        }
                        // The marker was not the one we knew (or has expired): expect it.
                        Key::Marker(rev) => {
                            self.slot.expected = rev;
                            return Ok(false);
                        }
                        Key::Empty => {
                            self.slot.expected = 0;
                            return Ok(false);
                        }
                    },
                }
                self.unanswered = None;
            }
            // Paused past its ttl: the server may not have removed the entry yet, but the
            // waiters behind may already act on its end. Renewing it would bring back a place
            // ahead of them: remove it (if still ours) and queue again.
            Some(rev) if self.written.elapsed() >= self.ttl => {
                self.give_up(rev).await?;
                return Ok(false);
            }
            Some(rev) if self.written.elapsed() >= self.ttl / 3 => {
                let sent = Instant::now();
                let publish = BackendState::put(&self.value(), self.ttl, rev, None);
                self.unanswered.get_or_insert(sent);
                match self
                    .state
                    .send("renew", &self.slot.subject, publish)
                    .await?
                {
                    Written::Stored(new) => {
                        self.rev = Some(new);
                        self.written = sent;
                        self.unanswered = None;
                    }
                    // Expired while we waited: a new entry, at the back of the queue. Or a
                    // renewal of ours cancelled in flight moved it: the create finds it.
                    Written::Conflict => {
                        self.requeue();
                        return Ok(false);
                    }
                }
            }
            Some(_) => {}
        }
        Ok(true)
    }

    async fn poll_wait(&mut self) -> Result<Step> {
        if let Some(step) = self.take_free().await? {
            return Ok(step);
        }
        // Where a read is one request (a single server's batched direct get), subscribed
        // before the read only if this client's attempts on the name had to wait lately:
        // elsewhere (a free name, a reader beside readers) the first read finds the entry
        // holding, and a subscription would only be sent every write of the name (16 readers
        // of one name: a dozen messages an acquisition; a free name: its own write's). Should
        // the read say it must wait, it subscribes then and reads again. Where a read takes a
        // request per key (a replicated stream's walk, a stream without direct gets), a
        // second one would cost more than the events: subscribed first, always.
        if self.wake.is_none()
            && (!self.state.reads_direct() || self.state.waited.lately(&self.name))
        {
            self.wake = Some(Wake::subscribe(&self.state.client, &self.keys.events).await?);
        }
        if !self.keep_entry().await? {
            return Ok(Step::Again);
        }
        // Kept until a read rebuilds the count: a poll cancelled mid-read loses nothing.
        let heard = self.heard;
        if heard == Heard::Enough
            && self.count_trusted()
            && let Some(rev) = self.rev
        {
            // Enough of the entries ahead of it by the last read are gone, and none joins
            // ahead (see `Count`): it holds, at the revision of its last renewal. It waited:
            // the client's next attempt on the name subscribes first.
            self.state.waited.saw(&self.name);
            return Ok(Step::Acquired(self.acquired(rev, false)));
        }
        if heard == Heard::Nothing && self.counting() {
            // Still waiting: the name stays one whose attempts subscribe first.
            self.state.waited.saw(&self.name);
            return Ok(self.waiting());
        }
        // Until this read ends in a new count, no count is trusted: a read that ends otherwise
        // (a stale entry purged, a read older than our entry) must not leave the last one,
        // built for what may be an earlier entry of ours, in force.
        self.count = Count::default();
        self.read = None;
        let connects = self.connects();
        if let Some(wake) = self.wake.as_mut() {
            wake.drain();
        }
        let queue = Queue::read_behind(&self.state, &self.keys, &self.slot.subject).await?;
        queue.check_kind(&self.name, self.kind)?;
        // An entry over by its own timestamp plus ttl, and by a margin more, by the server's
        // later timestamps, that the server still keeps (a server restarted after a kill
        // brought such entries back, and a waiter behind one timed out in distlock check):
        // its owner's deadline passed long ago, so remove it, only at the revision read (a
        // renewal that got there first keeps it), and read again.
        let stale: Vec<(String, u64)> = queue
            .entries
            .iter()
            .filter(|e| e.subject != self.slot.subject)
            .filter(|e| {
                e.expires_ns
                    .is_some_and(|end| end + STALE_MARGIN_NS < queue.newest_ns)
            })
            .map(|e| (e.subject.clone(), e.rev))
            .collect();
        if !stale.is_empty() {
            for (subject, rev) in stale {
                self.state.purge(&subject, rev, None).await?;
            }
            return Ok(Step::Again);
        }
        let Some(position) = queue.position(&self.slot.subject) else {
            // Expired or removed between our write and the read. Or, on a replicated stream,
            // not shown yet by a leader still applying its log: then it may be there, its ttl
            // running from its last write, and the create finds it (not gone, only unseen).
            if self.state.replicated && self.rev.take().is_some() {
                self.unanswered.get_or_insert(self.written);
            }
            self.requeue();
            return Ok(Step::Again);
        };
        if queue.entries[position].token() != self.first {
            // An earlier entry of our key: the read was served from a state older than our
            // entry (a stream leader still applying its log after a failover), so it may miss
            // entries ahead of ours too. Once it shows our entry, it shows every one ahead
            // (applied in sequence order).
            return Ok(Step::busy(Some(Duration::from_millis(10))));
        }
        if queue.holds(position) {
            // The queue may have been read after a renewal of ours: hold at that revision.
            let rev = queue.entries[position].rev;
            let alone = queue.entries.len() == 1 && queue.last == rev;
            return Ok(Step::Acquired(self.acquired(rev, alone)));
        }
        self.state.waited.saw(&self.name);
        if self.wake.is_none() {
            // Read unsubscribed: a removal between that read and the subscription would go
            // unheard. Subscribe, then read again: the server takes the subscription before
            // the read sent after it, so what it does not tell, the read shows.
            self.wake = Some(Wake::subscribe(&self.state.client, &self.keys.events).await?);
            return Ok(Step::Again);
        }
        let (blockers, needed) = queue.blockers(position);
        let own = (self.slot.subject.clone(), queue.entries[position].rev);
        self.count = Count::new(blockers, needed, own, connects);
        self.read = Some((Instant::now(), self.first));
        self.heard = Heard::Nothing;
        Ok(self.waiting())
    }

    /// How many times the client has connected (see [`Count::connects`]).
    fn connects(&self) -> u64 {
        let stats = self.state.client.statistics();
        stats.connects.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waiting: polled again when a blocker leaves (`changed`) or the entry is due for
    /// renewal.
    fn waiting(&self) -> Step {
        let renew_in = (self.ttl / 3).saturating_sub(self.written.elapsed());
        Step::busy(Some(renew_in.max(Duration::from_millis(10))))
    }

    /// Whether a poll that only renewed the waiting entry may skip reading the queue: the
    /// entry is the one the count was built for, the subscription that counts the removals
    /// ahead of it is open on the connection that read (see [`Count`]), and the last read is
    /// less than [`NEXT_IN_LINE_READ`] old (at most a third of a ttl), or two ttls when more
    /// than one removal is still needed (a read also finds entries the server kept past their
    /// end, and kinds that cannot share the name). Such a poll is the core's safety net against
    /// a lost wake-up (its backoff's longest pause, 200 ms). A wake-up is lost with the
    /// connection (which forces a read), and otherwise rarely: a route between cluster servers
    /// broken, or a removal dropped before a read served by a stream leader that had not
    /// applied it yet; the read bound is what such a waiter waits. 64 permit waiters each
    /// reading the whole queue (a request per entry) every third of a ttl kept the server busy
    /// and the semaphore at a few acquisitions a second; the waiter next in line used to read
    /// it on every safety-net poll.
    fn counting(&self) -> bool {
        let fresh = if self.count.left() > 1 {
            2 * self.ttl
        } else {
            (self.ttl / 3).min(NEXT_IN_LINE_READ)
        };
        self.wake.as_ref().is_some_and(Wake::open)
            && self.count_trusted()
            && self.read.is_some_and(|(at, _)| at.elapsed() < fresh)
    }

    /// Whether the count is of the current entry and was read on the current connection.
    fn count_trusted(&self) -> bool {
        self.read.is_some_and(|(_, first)| first == self.first)
            && self.count.connects() == self.connects()
    }
}

#[async_trait]
impl Attempt for NatsAttempt {
    async fn poll(&mut self) -> Result<Step> {
        match self.mode {
            AttemptMode::Try => self.poll_try().await,
            AttemptMode::Wait => self.poll_wait().await,
        }
    }

    async fn changed(&mut self) {
        match self.wake.as_mut() {
            Some(wake) => {
                let heard = wake.removal(&mut self.count).await;
                // A `Look` not yet acted on stays: only a read answers it.
                if self.heard != Heard::Look {
                    self.heard = heard;
                }
            }
            None => std::future::pending().await,
        }
    }

    async fn abandon(self: Box<Self>) -> Result<()> {
        // An error (the connection down: nothing sent) leaves the entry to the removal in the
        // background below, not to its ttl: ahead in line, it would keep every waiter behind
        // it waiting. A removal sent but unanswered (the server hung past the core's limit on
        // the abandon) is stored once the server answers (tests/restart.rs).
        if let Some(rev) = self.rev
            && let Ok(Written::Stored(marker)) =
                self.state.purge(&self.slot.subject, rev, None).await
        {
            if self.slot.hold().is_some() {
                self.state.slots.released(&self.name, marker, false);
            }
            return Ok(());
        }
        if self.rev.is_none() && self.unanswered.is_none() {
            return Ok(());
        }
        // A write whose answer never came (the attempt may have been cancelled while it was
        // in flight, and it may still land), a key that moved, or a removal that failed: the
        // subject is this attempt's alone (a client's key of a name serves one attempt or
        // lease at a time), so remove whatever is there, with no expectation. Sent after the
        // write on the same connection, the stream stores it after the write. In the
        // background: a try_acquire waits for its abandon, and with the server unreachable
        // the purge would add a whole operation timeout to the refusal.
        let state = self.state.clone();
        let subject = self.slot.subject.clone();
        let slot = self.slot.hold();
        spawn_cleanup("abandoning a NATS queue entry", None, move || {
            let (state, subject, _slot) = (state.clone(), subject.clone(), slot.clone());
            async move { state.purge_any(&subject).await.map(|_| ()) }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use distlock_core::LockName;

    use super::*;
    use crate::NatsConfig;

    /// An attempt on a fresh bucket of the test server, or `None` with no server.
    async fn attempt(name: &str) -> Option<NatsAttempt> {
        let url = conformance_tests::server_var("nats", "DISTLOCK_TEST_NATS_URL")?;
        let bucket = format!(
            "attempt-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let config = NatsConfig::from_url(&url)
            .and_then(|c| c.with_bucket(&bucket))
            .expect("NATS URL");
        let state = crate::backend::open(&config, Duration::from_secs(5))
            .await
            .expect("open the bucket");
        Some(NatsAttempt::new(state, request(name)))
    }

    /// A waiting exclusive acquisition of `name` by an owner of its own, ttl 30 s.
    fn request(name: &str) -> AcquireRequest {
        AcquireRequest::new(
            LockName::new(name).expect("name"),
            Arc::from(uuid::Uuid::new_v4().simple().to_string()),
            Duration::from_secs(30),
            AttemptMode::Wait,
            LockKind::Exclusive,
        )
    }

    /// Writes the attempt's entry; its revision.
    async fn written(attempt: &mut NatsAttempt) -> u64 {
        for _ in 0..4 {
            if attempt.keep_entry().await.expect("create") {
                return attempt.rev.expect("written");
            }
        }
        panic!("no entry written in 4 tries");
    }

    /// The attempt's entry known gone (a renewal found it removed, its ttl ran out under a
    /// pause) but read back at its old revision, as a single server killed and restarted
    /// brings back a removed key: its old place is not taken again, it is removed and the next
    /// entry is written behind it.
    #[tokio::test]
    async fn an_entry_of_ours_known_gone_and_read_back_is_not_kept() {
        let Some(mut attempt) = attempt("gone").await else {
            return;
        };
        let old = written(&mut attempt).await;
        // Gone as far as the attempt knows; still on the server, as if brought back.
        attempt.requeue();
        assert!(
            !attempt.keep_entry().await.expect("create"),
            "an entry known gone was kept"
        );
        assert_eq!(attempt.rev, None);
        let new = written(&mut attempt).await;
        assert!(new > old, "the new entry {new} is not behind the old {old}");
        assert_eq!(attempt.first, new, "the old entry's token kept");
        // The new entry is this attempt's to keep: found again after a lost answer.
        lose_answer(&mut attempt, Instant::now());
        assert!(attempt.keep_entry().await.expect("create"), "not kept");
        assert_eq!((attempt.rev, attempt.first), (Some(new), new));
    }

    /// As if the attempt's last create was cancelled in flight, sent at `sent`.
    fn lose_answer(attempt: &mut NatsAttempt, sent: Instant) {
        attempt.rev = None;
        attempt.first = 0;
        attempt.unanswered = Some(sent);
    }

    /// A create whose answer never came, found a ttl after it was sent (the server may keep
    /// an entry a moment past its end): not kept, the waiters behind may already act on its
    /// end.
    #[tokio::test]
    async fn an_entry_of_ours_past_its_ttl_is_not_kept() {
        let Some(mut attempt) = attempt("late").await else {
            return;
        };
        let old = written(&mut attempt).await;
        let sent = Instant::now()
            .checked_sub(attempt.ttl)
            .expect("a clock past 30 s");
        lose_answer(&mut attempt, sent);
        assert!(
            !attempt.keep_entry().await.expect("create"),
            "an entry past its ttl was kept"
        );
        let new = written(&mut attempt).await;
        assert!(new > old, "the new entry {new} is not behind the old {old}");
        assert_eq!(attempt.first, new, "the old entry's token kept");
    }

    /// A create whose answer never came (cancelled in flight) but that was stored: the next
    /// create finds the entry and keeps it, with its place and token.
    #[tokio::test]
    async fn a_stored_create_whose_answer_was_lost_is_kept() {
        let Some(mut attempt) = attempt("lost").await else {
            return;
        };
        let sent = Instant::now();
        let rev = written(&mut attempt).await;
        lose_answer(&mut attempt, sent);
        assert!(attempt.keep_entry().await.expect("create"), "not kept");
        assert_eq!((attempt.rev, attempt.first), (Some(rev), rev));
        assert_eq!(attempt.written, sent, "its ttl runs from the lost create");
    }

    /// A renewal cancelled in flight (the core's operation timeout drops the poll) but
    /// stored: the entry is kept with its place, its ttl running from that renewal, not from
    /// the create that finds it (a grant would otherwise believe in a lease longer than the
    /// server's).
    #[tokio::test]
    async fn a_renewal_cancelled_in_flight_counts_its_ttl_from_its_sending() {
        let Some(mut attempt) = attempt("renewed").await else {
            return;
        };
        let rev = written(&mut attempt).await;
        // Due for renewal.
        attempt.written = Instant::now()
            .checked_sub(attempt.ttl / 2)
            .expect("a clock past 15 s");
        let before = Instant::now();
        {
            let renewal = attempt.keep_entry();
            tokio::pin!(renewal);
            // Polled once (the renewal is sent), then dropped, as a timeout drops it.
            assert!(
                futures::poll!(renewal.as_mut()).is_pending(),
                "answered at once"
            );
        }
        let after = Instant::now();
        let stored = async {
            loop {
                if let Key::Live(entry) = attempt.state.key(&attempt.slot.subject).await?
                    && entry.rev > rev
                {
                    return Ok(entry.rev);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let renewed: Result<u64> = tokio::time::timeout(Duration::from_secs(5), stored)
            .await
            .expect("the cancelled renewal was not stored");
        let renewed = renewed.expect("read the key");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut kept = false;
        for _ in 0..4 {
            if attempt.keep_entry().await.expect("keep") {
                kept = true;
                break;
            }
        }
        assert!(kept, "the entry was not kept");
        assert_eq!((attempt.rev, attempt.first), (Some(renewed), rev));
        assert!(
            (before..=after).contains(&attempt.written),
            "its ttl counted from {:?} after the renewal was sent",
            attempt.written.saturating_duration_since(after)
        );
    }

    /// The read after a write on a replicated stream: an entry ahead of the written one but
    /// renewed after it (or its data set) sits at a higher sequence with its old place. A read
    /// back that took the written entry, the range's first message, for the head of the queue
    /// let two hold: on the R3 cluster, a `try_acquire` whose write passed while a waiter's
    /// lower-sequence create was still proposed (see `BackendState::replicated`), once that
    /// waiter held and set its data.
    #[tokio::test]
    async fn an_entry_ahead_renewed_after_ours_keeps_ours_waiting() {
        let Some(mut ahead) = attempt("rewritten").await else {
            return;
        };
        let first = written(&mut ahead).await;
        let mut ours = NatsAttempt::new(ahead.state.clone(), request("rewritten"));
        let rev = written(&mut ours).await;
        assert!(rev > first);
        // The entry ahead renewed after ours: its message moves past ours, its place stays.
        ahead.written = Instant::now()
            .checked_sub(ahead.ttl / 2)
            .expect("a clock past 15 s");
        assert!(ahead.keep_entry().await.expect("renew"), "not renewed");
        assert!(ahead.rev.is_some_and(|renewed| renewed > rev));
        assert_eq!(ahead.first, first);
        let step = ours.read_after_write(rev, false).await.expect("read");
        assert!(
            matches!(step, Step::Again),
            "ours held behind a live entry: {step:?}"
        );
        assert_eq!(ours.rev, None, "ours was not removed");
        // Alone on a free name: it holds.
        let mut alone = attempt("alone").await.expect("a server");
        let rev = written(&mut alone).await;
        let step = alone.read_after_write(rev, true).await.expect("read");
        assert!(matches!(step, Step::Acquired(_)), "{step:?}");
    }
}
