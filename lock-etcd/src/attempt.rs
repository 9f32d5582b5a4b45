//! One acquisition: a queue key on the client's lease, waiting for the keys ahead of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::backend::{AcquireRequest, Retries, RetryPolicy, spawn_cleanup};
use distlock_core::{Acquired, Attempt, AttemptMode, Error, FencingToken, LockKind, Result, Step};
use etcd_client::{
    Compare, CompareOp, GetOptions, GetResponse, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};
use tokio::task::JoinHandle;
use tracing::{debug, trace};

use crate::backend::BackendState;
use crate::error::{ATTEMPT_TIMEOUT, lease_not_found, map_err, protocol};
use crate::keys::{self, QueueKey, key_string};
use crate::lease::EtcdLease;
use crate::session::LeaseSlot;
use crate::wake::{Blocker, PermitCount, Watch, Woken, next_event, sleep_until};

/// The token of a key created at `revision`.
pub(crate) fn token(revision: i64) -> Result<FencingToken> {
    FencingToken::from_server(revision, "etcd's create revision")
}

/// One acquisition: a queue key of the client on its lease, with the owner as its value.
pub(crate) struct EtcdAttempt {
    pub(crate) shared: Arc<BackendState>,
    pub(crate) name: String,
    pub(crate) mode: AttemptMode,
    pub(crate) ttl: Duration,
    pub(crate) owner: Arc<str>,
    /// What is asked for; the key's name says it too (see [`keys::kind_tag`]).
    pub(crate) kind: LockKind,
    pub(crate) key: Arc<QueueKey>,
    /// The lease the key is attached to.
    pub(crate) slot: Option<Arc<LeaseSlot>>,
    /// The key's create revision once it is known to be queued.
    pub(crate) rev: Option<i64>,
    /// What to watch (the key or keys that block us) and the revision to watch from.
    pub(crate) watch_target: Option<(Blocker, i64)>,
    /// The watch of `watch_target`'s blocker (or of an earlier one, until replaced).
    pub(crate) watch: Option<Watch>,
    /// A permit waiter's count of the keys ahead of its key, from its last read and its
    /// watch's deletions since (see [`PermitCount`]).
    pub(crate) count: Option<PermitCount>,
    /// A transaction that may put our key, in a task of its own, while its answer is awaited:
    /// still here when the caller was cancelled meanwhile (see [`Self::put_txn`]).
    pub(crate) put: Option<JoinHandle<Result<etcd_client::TxnResponse, etcd_client::Error>>>,
}

impl EtcdAttempt {
    /// An attempt of `request`, on a key of its own in the name's range.
    pub(crate) fn new(shared: &Arc<BackendState>, request: AcquireRequest) -> Self {
        let range = keys::name_range(&shared.prefix, request.name.as_str());
        let key = QueueKey::new(shared, range, request.kind);
        Self {
            shared: shared.clone(),
            name: request.name.as_str().to_owned(),
            mode: request.mode,
            ttl: request.ttl,
            owner: request.owner,
            kind: request.kind,
            key,
            slot: None,
            rev: None,
            watch_target: None,
            watch: None,
            count: None,
            put: None,
        }
    }

    /// [`Error::Mismatch`] if a queue key `key` of the name says it is held (or asked for) as
    /// a kind ours can never join.
    pub(crate) fn check_kind(&self, key: &[u8]) -> Result<()> {
        let theirs = keys::key_kind(self.key.range(), key);
        match self.kind.mismatch(theirs) {
            Some(message) => Err(Error::Mismatch {
                name: self.name.clone(),
                message,
            }),
            None => Ok(()),
        }
    }

    /// [`check_kind`](Self::check_kind) of every key of `ahead` (the keys before ours that
    /// were read): an attempt queued behind a key of another kind, the head or not, is
    /// refused rather than left to wait until that key goes and hold a name used as another
    /// kind.
    pub(crate) fn check_kinds(&self, ahead: &[etcd_client::KeyValue]) -> Result<()> {
        ahead.iter().try_for_each(|kv| self.check_kind(kv.key()))
    }

    pub(crate) fn acquired(
        &mut self,
        slot: Arc<LeaseSlot>,
        rev: i64,
        lease_started: Instant,
    ) -> Result<Step> {
        self.park_watch();
        let lease = EtcdLease {
            shared: self.shared.clone(),
            slot,
            key: self.key.clone(),
            rev,
            owner: self.owner.clone(),
        };
        Ok(Step::Acquired(
            Acquired::new(Box::new(lease), token(rev)?).with_lease_started(lease_started),
        ))
    }

    /// Hands our watch, if any, to the client's idle watches for the next wait on its key.
    pub(crate) fn park_watch(&mut self) {
        if let Some(watch) = self.watch.take() {
            self.shared.watches.park(watch);
        }
    }

    pub(crate) fn put_op(&self, slot: &LeaseSlot) -> TxnOp {
        TxnOp::put(
            self.key.key.clone(),
            &*self.owner,
            Some(PutOptions::new().with_lease(slot.id)),
        )
    }

    /// Sends `txn`, which may put our key: marks the key as possibly existing first. `None`:
    /// the lease was gone (marked dead; poll again). The caller calls
    /// [`QueueKey::set_may_exist`] with the answer's `before` when its put did not happen.
    ///
    /// The transaction runs in a task of its own ([`Self::put`]): a caller cancelled while
    /// it is on its way leaves it running, and [`Attempt::abandon`] deletes the key only
    /// after its answer. Otherwise the delete could reach the server first and find nothing,
    /// and the put that came after it would leave a key (held, or queued ahead of later
    /// acquisitions) until the lease expires.
    pub(crate) async fn put_txn(
        &mut self,
        slot: &LeaseSlot,
        txn: Txn,
        what: &str,
    ) -> Result<Option<(etcd_client::TxnResponse, bool)>> {
        if let Some(earlier) = self.put.as_mut() {
            // An earlier put whose wait timed out (the core retries the poll): its answer
            // first, so that at most one is on its way when an abandon comes.
            let _ = earlier.await;
            self.put = None;
        }
        let before = self.key.may_exist();
        self.key.set_may_exist(true);
        let mut kv = self.shared.client.kv_client();
        let put = self
            .put
            .insert(tokio::spawn(async move { kv.txn(txn).await }));
        let answer = put.await;
        self.put = None;
        let answer = answer.map_err(|err| Error::backend(format!("{what}: {err}"), err))?;
        match answer {
            Err(err) if lease_not_found(&err) => {
                slot.mark_dead();
                self.key.set_may_exist(before);
                Ok(None)
            }
            Err(err) => Err(map_err(what, err)),
            Ok(resp) => Ok(Some((resp, before))),
        }
    }

    /// `try_acquire`: put the key only if the name has no key at all (nobody holds or waits).
    async fn poll_try(&mut self) -> Result<Option<Step>> {
        let slot = self.shared.fresh_slot(self.ttl).await?;
        let lease_started = slot.refreshed();
        // Otherwise read the first key: ours if an earlier poll's answer was lost.
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new()
            .when([
                Compare::create_revision(self.key.range().to_owned(), CompareOp::Equal, 0)
                    .with_prefix(),
            ])
            .and_then([self.put_op(&slot)])
            .or_else([TxnOp::get(self.key.range().to_owned(), Some(first))]);
        self.slot = Some(slot.clone());
        let Some((resp, before)) = self.put_txn(&slot, txn, "acquiring").await? else {
            return Ok(None);
        };
        match resp {
            resp if resp.succeeded() => {
                let rev = header_revision(resp.header())?;
                Ok(Some(self.acquired(slot, rev, lease_started)?))
            }
            resp => {
                let first = match resp.op_responses().into_iter().next() {
                    Some(TxnOpResponse::Get(mut get)) => get.take_kvs().into_iter().next(),
                    _ => None,
                };
                match first {
                    Some(kv) if before && kv.key() == self.key.key.as_bytes() => {
                        let rev = kv.create_revision();
                        Ok(Some(self.acquired(slot, rev, lease_started)?))
                    }
                    other => {
                        self.key.set_may_exist(before);
                        if let Some(kv) = other {
                            self.check_kind(kv.key())?;
                        }
                        Ok(Some(Step::busy(None)))
                    }
                }
            }
        }
    }

    /// The part of the name's range whose keys block an acquisition of ours that came
    /// later: every key for a writer, the writers (every non-shared key) for a reader.
    pub(crate) fn blockers(&self, options: GetOptions) -> GetOptions {
        match self.kind {
            LockKind::Shared => options.with_range(keys::non_shared_end(self.key.range())),
            _ => options.with_prefix(),
        }
    }

    /// The transaction that queues our key: if it does not exist yet, `reads` and then the
    /// put; otherwise a read of our key. Answers the revision and the reads, or `None` when
    /// polling again is needed (the lease was gone; or our key existed, from an earlier poll
    /// whose answer was lost, and `rev` now says where it is, or it was on a lease the attempt
    /// does not keep alive, and it was removed).
    pub(crate) async fn enqueue_txn(
        &mut self,
        slot: &Arc<LeaseSlot>,
        reads: Vec<TxnOp>,
        what: &str,
    ) -> Result<Option<(i64, Vec<GetResponse>)>> {
        let mut ops = reads;
        ops.push(self.put_op(slot));
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then(ops)
            .or_else([TxnOp::get(self.key.key.clone(), None)]);
        let Some((resp, _)) = self.put_txn(slot, txn, what).await? else {
            return Ok(None);
        };
        let revision = header_revision(resp.header())?;
        let succeeded = resp.succeeded();
        let gets: Vec<GetResponse> = resp
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get),
                _ => None,
            })
            .collect();
        let Some(first) = gets.first() else {
            return Err(protocol("a transaction answered without its read"));
        };
        if !succeeded {
            // Our key exists already: an earlier poll's answer was lost. Find its place, and
            // keep alive the lease it is on: this poll's, or the one an earlier poll queued
            // it with (a lease that died since took its keys with it). Keeping the old one
            // after this poll's put landed on a new lease, the attempt found that lease dead
            // on every poll and queued again, forever.
            match first.kvs().first() {
                Some(kv) if kv.lease() == slot.id => {
                    self.rev = Some(kv.create_revision());
                    self.slot = Some(slot.clone());
                }
                Some(kv) if self.slot.as_ref().is_some_and(|s| s.id == kv.lease()) => {
                    self.rev = Some(kv.create_revision());
                }
                // On a lease the attempt does not keep alive: not a place it can keep. Removed,
                // and put again on the next poll (the key's number stays the attempt's).
                Some(_) => {
                    self.rev = None;
                    self.shared
                        .client
                        .kv_client()
                        .delete(self.key.key.clone(), None)
                        .await
                        .map_err(|e| map_err("removing a queue key on an unknown lease", e))?;
                    self.key.set_may_exist(false);
                }
                None => self.rev = None,
            }
            return Ok(None);
        }
        self.slot = Some(slot.clone());
        Ok(Some((revision, gets)))
    }

    /// `acquire`, first step: join the queue and learn the predecessor in one transaction (for
    /// a reader, every writer key before ours, the latest first; see `kinds.rs` for permits).
    async fn poll_enqueue(&mut self) -> Result<Option<Step>> {
        trace!(target: "distlock_etcd::wait", me = %self.key.key, "enqueue");
        let slot = self.shared.fresh_slot(self.ttl).await?;
        let lease_started = slot.refreshed();
        // The newest key before ours: our predecessor. A reader reads every writer key
        // before it, usually a few, to count them by name.
        let mut last = GetOptions::new()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_keys_only();
        if self.kind != LockKind::Shared {
            last = last.with_limit(1);
        }
        let read = TxnOp::get(self.key.range().to_owned(), Some(self.blockers(last)));
        let Some((revision, mut gets)) = self
            .enqueue_txn(&slot, vec![read], "joining the lock queue")
            .await?
        else {
            return Ok(None);
        };
        let mut before = gets
            .pop()
            .ok_or_else(|| protocol("a transaction answered without its read"))?;
        match before.kvs().first() {
            None => {
                trace!(target: "distlock_etcd::wait", me = %self.key.key, "enqueued: head");
                Ok(Some(self.acquired(slot, revision, lease_started)?))
            }
            Some(pred) => {
                trace!(target: "distlock_etcd::wait", me = %self.key.key, rev = revision, pred = %key_string(pred.key()), "queued behind");
                self.rev = Some(revision);
                // Held as a semaphore: the abandon that follows the error removes our key. (A
                // writer read only the newest key; a reader every key that can block it.)
                self.check_kinds(before.kvs())?;
                // A reader counts the writers ahead of it (the read ran before the put, so it
                // has the keys before ours).
                let blocker = match self.kind {
                    LockKind::Shared => self.count_writers(before.take_kvs()),
                    _ => Blocker::deletion(key_string(pred.key())),
                };
                self.watch_target = Some((blocker, revision + 1));
                Ok(Some(Step::busy(None)))
            }
        }
    }

    /// Makes sure the attempt watches its `watch_target`'s blocker (a kept watch, or a new
    /// one); false when the attempt must poll now instead (the watch was refused, or started
    /// after the read, which may have missed a change in between).
    async fn watch_blocker(&mut self) -> bool {
        let Some((pred, from)) = self.watch_target.clone() else {
            return true;
        };
        if self.watch.as_ref().is_none_or(|w| w.blocker != pred) {
            self.park_watch();
            self.watch = self.shared.watches.take(&pred);
            if self.watch.is_some() {
                trace!(target: "distlock_etcd::wait", me = %self.key.key, key = %pred.key, from, "watch reused");
            }
        }
        if self.watch.is_none() {
            // From "now", not from `from`: a watch that starts in the past is served by
            // etcd's catch-up loop, which runs every 100 ms. The gap between our read
            // and the watch's start is closed below by polling once more.
            trace!(target: "distlock_etcd::wait", me = %self.key.key, key = %pred.key, from, "watch opening");
            let mut stream =
                self.shared
                    .hub
                    .watch(&self.shared.client, &self.shared.members, pred.clone());
            match tokio::time::timeout(ATTEMPT_TIMEOUT, stream.created()).await {
                Ok(Some(start)) => {
                    trace!(target: "distlock_etcd::wait", me = %self.key.key, start, from, "watch created");
                    self.watch = Some(Watch {
                        blocker: pred,
                        stream,
                        start,
                        kept: false,
                    });
                }
                // Refused or cancelled (a compaction, an expired token): poll again.
                Ok(None) => return false,
                Err(_) => {
                    // The stream's member went silent, perhaps: the client opens a
                    // new stream; the core's backoff polls again.
                    debug!("a watch create went unanswered");
                    stream.reopen();
                    drop(stream);
                    self.watch_target = None;
                }
            }
        }
        // A reused watch started before our read: it misses nothing.
        if let Some(watch) = &self.watch
            && from <= watch.start
        {
            // The predecessor may have gone between our read and the watch's start.
            return false;
        }
        true
    }

    /// A queued waiter whose count of the keys ahead says it holds (a permit waiter, a reader;
    /// see [`PermitCount`]) takes the hold without a read: `None` for any other poll. The
    /// count is used once; its lease, checked here, vouches for its key (a reader's watch does
    /// not see its own key).
    async fn held_by_count(&mut self) -> Result<Option<Step>> {
        let counted = self.count.take().is_some_and(|c| c.holds());
        let (true, Some(rev)) = (counted, self.rev) else {
            return Ok(None);
        };
        let Some(slot) = self.queued_slot().await? else {
            return Ok(Some(Step::Again));
        };
        trace!(target: "distlock_etcd::wait", me = %self.key.key, rev, "held by the count");
        let lease_started = slot.refreshed();
        Ok(Some(self.acquired(slot, rev, lease_started)?))
    }

    /// A reader's wait behind the writer keys `ahead`: it counts their deletions in the range
    /// of the keys that are not shared, and holds once none is left.
    fn count_writers(&mut self, ahead: Vec<etcd_client::KeyValue>) -> Blocker {
        let range = self.key.range().to_owned();
        let end = keys::non_shared_end(&range);
        let ahead = ahead.into_iter().map(|kv| kv.into_key_value().0);
        self.count = Some(PermitCount::new(ahead, 1, self.key.key.clone()));
        Blocker::between(range, end)
    }

    /// Whether our key (created at `rev`) exists, and the last key before it that blocks us
    /// (first; a reader gets every writer key before it, usually a few, to count them).
    async fn position_txn(&self, rev: i64, serializable: bool) -> Result<etcd_client::TxnResponse> {
        let mut before = GetOptions::new()
            .with_max_create_revision(rev - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_keys_only();
        if self.kind != LockKind::Shared {
            before = before.with_limit(1);
        }
        let mut before = self.blockers(before);
        if serializable {
            before = before.with_serializable();
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.key.clone(),
                CompareOp::Equal,
                rev,
            )])
            .and_then([TxnOp::get(self.key.range().to_owned(), Some(before))]);
        self.shared
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| map_err("checking the lock queue", e))
    }

    /// The lease of a queued key, refreshed if its last refresh is not recent. `None`: the
    /// lease and our key are gone (or were never known): queue again.
    pub(crate) async fn queued_slot(&mut self) -> Result<Option<Arc<LeaseSlot>>> {
        let Some(slot) = self.slot.clone() else {
            self.rev = None;
            return Ok(None);
        };
        // A lease known dead took our key with it, however recently it was refreshed.
        if slot.is_dead() || slot.refreshed().elapsed() >= slot.ttl / 10 {
            trace!(target: "distlock_etcd::wait", me = %self.key.key, "position: keepalive first");
            if !slot
                .keep_alive(&self.shared.client, &self.shared.members, Instant::now())
                .await?
            {
                self.rev = None;
                return Ok(None);
            }
        }
        Ok(Some(slot))
    }

    /// `acquire`, later steps: is there still a key before ours?
    async fn poll_position(&mut self, rev: i64) -> Result<Option<Step>> {
        let Some(slot) = self.queued_slot().await? else {
            return Ok(None);
        };
        let lease_started = slot.refreshed();
        // First a serializable read, answered by whichever member the request reaches without
        // a quorum round: any snapshot that holds our key and no key before it proves that
        // every earlier key is gone for good (create revisions never come back). A lagging
        // snapshot (our key not in it yet, or a predecessor that may be gone meanwhile) is
        // confirmed by a linearizable read.
        trace!(target: "distlock_etcd::wait", me = %self.key.key, rev, "position poll");
        let mut resp = self.position_txn(rev, true).await?;
        let head = resp.succeeded()
            && matches!(
                resp.op_responses().first(),
                Some(TxnOpResponse::Get(get)) if get.kvs().is_empty()
            );
        if !head {
            trace!(target: "distlock_etcd::wait", me = %self.key.key, rev, "position: linearizable read");
            resp = self.position_txn(rev, false).await?;
        }
        if !resp.succeeded() {
            debug!(name = %self.name, "our queue key vanished; queueing again");
            self.rev = None;
            self.park_watch();
            self.watch_target = None;
            return Ok(None);
        }
        let revision = header_revision(resp.header())?;
        let kvs = match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(mut get)) => get.take_kvs(),
            _ => return Err(protocol("a transaction answered without its read")),
        };
        match kvs.first() {
            None => {
                trace!(target: "distlock_etcd::wait", me = %self.key.key, rev, "position: head");
                Ok(Some(self.acquired(slot, rev, lease_started)?))
            }
            Some(pred) => {
                trace!(target: "distlock_etcd::wait", me = %self.key.key, rev, at = revision, pred = %key_string(pred.key()), "position: behind");
                // The key now ahead of a writer, or any ahead of a reader, may be of another
                // kind that the first read did not show (a newer key of our kind hid it).
                self.check_kinds(&kvs)?;
                // A reader's read has every writer key before ours (see `position_txn`).
                let blocker = if self.kind == LockKind::Shared {
                    self.count_writers(kvs)
                } else {
                    Blocker::deletion(key_string(pred.key()))
                };
                self.watch_target = Some((blocker, revision + 1));
                Ok(Some(Step::busy(None)))
            }
        }
    }
}

pub(crate) fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Result<i64> {
    header
        .map(etcd_client::ResponseHeader::revision)
        .filter(|r| *r > 0)
        .ok_or_else(|| protocol("a response without a revision"))
}

#[async_trait]
impl Attempt for EtcdAttempt {
    async fn poll(&mut self) -> Result<Step> {
        if let Some(step) = self.held_by_count().await? {
            return Ok(step);
        }
        // Every step is safe to repeat (a repeated put finds its own key), so a transport
        // error is retried at once: the client balances over the endpoints, and a request
        // routed to a member that just went down fails before the balancer skips it. A lease
        // that vanished, or a lost answer, costs one more round: `Step::Again`.
        let mut retries = Retries::new(RetryPolicy::TRANSIENT);
        loop {
            let result = match (self.mode, self.rev, self.kind) {
                (AttemptMode::Try, _, LockKind::Shared) => self.poll_try_shared().await,
                (AttemptMode::Try, _, LockKind::Permit { permits }) => {
                    self.poll_try_permit(permits).await
                }
                (AttemptMode::Try, _, _) => self.poll_try().await,
                (AttemptMode::Wait, None, LockKind::Permit { permits }) => {
                    self.poll_enqueue_permit(permits).await
                }
                (AttemptMode::Wait, Some(rev), LockKind::Permit { permits }) => {
                    self.poll_position_permit(rev, permits).await
                }
                (AttemptMode::Wait, None, _) => self.poll_enqueue().await,
                (AttemptMode::Wait, Some(rev), _) => self.poll_position(rev).await,
            };
            match result {
                Err(err) if err.is_retryable() && retries.pause("an acquire step", &err).await => {}
                other => return Ok(other?.unwrap_or(Step::Again)),
            }
        }
    }

    async fn changed(&mut self) {
        loop {
            if !self.watch_blocker().await {
                return;
            }
            // While queued, our key lives on the client's lease: keep it alive.
            let keepalive_at = self
                .slot
                .as_ref()
                .map(|s| s.refreshed() + distlock_core::default_renewal_interval(s.ttl));
            let from = self.watch_target.as_ref().map_or(0, |(_, from)| *from);
            let woken = tokio::select! {
                event = next_event(&mut self.watch, from, self.count.as_mut()) => Some(event),
                () = sleep_until(keepalive_at) => None,
            };
            match woken {
                Some(Woken::Changed) => {
                    trace!(target: "distlock_etcd::wait", me = %self.key.key, "watch: deleted");
                    self.park_watch();
                    self.watch_target = None;
                    return;
                }
                Some(Woken::Cancelled) => {
                    self.watch = None;
                    self.watch_target = None;
                    return;
                }
                Some(Woken::Failed) => {
                    debug!("the watch stream failed");
                    let kept = self.watch.take().is_some_and(|w| w.kept);
                    self.watch_target = None;
                    if kept {
                        // One kept idle while the client's stream could not be opened
                        // again, perhaps: poll again at once, and a new watch replaces
                        // it. (A new one that fails is left to the core's backoff.)
                        return;
                    }
                }
                None => {
                    trace!(target: "distlock_etcd::wait", me = %self.key.key, "queued keepalive");
                    if let Some(slot) = &self.slot {
                        match slot
                            .keep_alive(&self.shared.client, &self.shared.members, Instant::now())
                            .await
                        {
                            Ok(true) => {}
                            Ok(false) => return, // our key is gone: poll queues again
                            Err(err) => {
                                debug!(%err, "keepalive while queued failed");
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                }
            }
        }
    }

    async fn abandon(mut self: Box<Self>) -> Result<()> {
        if !self.key.may_exist() {
            return Ok(());
        }
        let mut kv = self.shared.client.kv_client();
        if let Some(put) = self.put.take() {
            // The caller was cancelled while a put was on its way: delete the key once the
            // put answered (see `put_txn`), in the background, as for an unanswered put.
            let key = self.key.clone();
            tokio::spawn(async move {
                let _ = put.await;
                remove_unanswered(kv, key);
            });
            return Ok(());
        }
        if self.rev.is_some() {
            // A known queue entry: remove it now, so that the next client is not blocked.
            kv.delete(self.key.key.clone(), None)
                .await
                .map_err(|e| map_err("leaving the lock queue", e))?;
            self.key.deleted();
            return Ok(());
        }
        // A put whose answer never came (the server may be down): clean up in the background
        // rather than making the caller wait a second timeout; the key expires with the lease
        // otherwise.
        remove_unanswered(kv, self.key.clone());
        Ok(())
    }
}

/// Deletes `key`, whose put got no answer, in the background (retried; the lease frees it if
/// that fails too).
fn remove_unanswered(kv: etcd_client::KvClient, key: Arc<QueueKey>) {
    spawn_cleanup("removing an unanswered queue entry", None, move || {
        let (mut kv, key) = (kv.clone(), key.clone());
        async move {
            kv.delete(key.key.clone(), None)
                .await
                .map_err(|e| map_err("removing an unanswered queue entry", e))?;
            key.deleted();
            Ok(())
        }
    });
}

#[cfg(test)]
mod tests {
    use distlock_core::{ClientConfig, DistributedLock, LockName};
    use etcd_client::PutOptions;

    use super::*;
    use crate::{EtcdBackend, EtcdConfig};

    /// A waiter queued on the client's lease, which dies; the put that queues it again lands
    /// on the client's new lease (or, `foreign`, on a lease the client does not know), but its
    /// answer is lost (made here, as that put would have been stored); then the holder ahead
    /// leaves, and `pause` later the waiter polls. Its next put finds the key: it must hold on
    /// the client's new lease, which it keeps alive.
    /// The test server's configuration under a prefix of its own (`label` and a random part);
    /// `None` without a server.
    fn config(label: &str) -> Option<EtcdConfig> {
        let endpoints = conformance_tests::server_var("etcd", "DISTLOCK_TEST_ETCD_ENDPOINTS")?;
        let prefix = format!("{label}-{}", uuid::Uuid::new_v4().simple());
        let config = EtcdConfig::new(endpoints.split(',')).and_then(|c| c.with_prefix(&prefix));
        Some(config.expect("etcd endpoints"))
    }

    async fn lost_put_on_a_new_lease(pause: Duration, foreign: bool) {
        let Some(config) = config("lost-put") else {
            return;
        };
        let holder = crate::connect_with(config.clone(), ClientConfig::default())
            .await
            .expect("connect the holder");
        // A tenth of it (2 s) is far more than the set-up takes, loaded machine or not.
        let ttl = Duration::from_secs(20);
        let opts = distlock_core::AcquireOptions::default().with_ttl(Duration::from_secs(30));
        let held = holder.acquire("lost-put", &opts).await.expect("hold");
        let backend = EtcdBackend::connect(&config, Duration::from_secs(5))
            .await
            .expect("connect");
        let shared = backend.shared.clone();
        let request = AcquireRequest::new(
            LockName::new("lost-put").expect("name"),
            Arc::from("lost-put-waiter"),
            ttl,
            AttemptMode::Wait,
            LockKind::Exclusive,
        );
        let mut attempt = EtcdAttempt::new(&shared, request.clone());
        let step = attempt.poll().await.expect("queue");
        assert!(matches!(step, Step::Busy { .. }), "not queued: {step:?}");
        let old = attempt.slot.clone().expect("queued on a lease");
        shared
            .client
            .lease_client()
            .revoke(old.id)
            .await
            .expect("revoke the waiter's lease");
        let members = &shared.members;
        let alive = old
            .keep_alive(&shared.client, members, Instant::now())
            .await;
        assert!(!alive.expect("keepalive"), "the revoked lease still alive");
        let new = shared.fresh_slot(ttl).await.expect("a new lease");
        assert_ne!(new.id, old.id);
        let foreign = if foreign {
            let granted = shared.client.lease_client().grant(30, None).await;
            Some(granted.expect("a lease of no client").id())
        } else {
            None
        };
        let landed = foreign.unwrap_or(new.id);
        shared
            .client
            .kv_client()
            .put(
                attempt.key.key.clone(),
                keys::value_with_data("lost-put-waiter", None),
                Some(PutOptions::new().with_lease(landed)),
            )
            .await
            .expect("the put whose answer was lost");
        held.release().await.expect("release");
        tokio::time::sleep(pause).await;
        let mut acquired = None;
        for _ in 0..20 {
            match attempt.poll().await.expect("poll") {
                Step::Acquired(grant) => {
                    acquired = Some(grant);
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        let grant = acquired.expect("the waiter never held, the holder gone");
        assert_eq!(
            attempt.slot.as_ref().map(|s| s.id),
            Some(new.id),
            "held on the dead lease"
        );
        // The key's number is still the attempt's: a second attempt gets another key.
        let second = EtcdAttempt::new(&shared, request);
        assert_ne!(
            second.key.key, attempt.key.key,
            "the key given to another attempt"
        );
        let key = shared
            .client
            .kv_client()
            .get(attempt.key.key.clone(), None)
            .await;
        let on = key
            .expect("read the key")
            .kvs()
            .first()
            .map(|kv| kv.lease());
        assert_eq!(on, Some(new.id), "the key is not on the lease kept alive");
        grant.lease.release().await.expect("release the grant");
        if let Some(id) = foreign {
            shared
                .client
                .lease_client()
                .revoke(id)
                .await
                .expect("revoke");
        }
    }

    /// A release whose first attempt went unanswered and whose repeat found the key gone
    /// counts as done only while the key's lease lives: a key gone with its lease (expired
    /// while the holder paused) is a loss, which the release's stop of the watchdog would
    /// otherwise hide.
    #[tokio::test]
    async fn an_unanswered_release_of_a_key_gone_with_its_lease_is_a_loss() {
        let Some(config) = config("gone-lease") else {
            return;
        };
        let backend = EtcdBackend::connect(&config, Duration::from_secs(5))
            .await
            .expect("connect");
        let shared = backend.shared.clone();
        let request = AcquireRequest::new(
            LockName::new("gone-lease").expect("name"),
            Arc::from("gone-lease-holder"),
            Duration::from_secs(20),
            AttemptMode::Try,
            LockKind::Exclusive,
        );
        let mut attempt = EtcdAttempt::new(&shared, request);
        let step = attempt.poll().await.expect("poll");
        assert!(matches!(step, Step::Acquired(_)), "not held: {step:?}");
        let key = attempt.key.clone();
        let read = shared.client.kv_client().get(key.key.clone(), None).await;
        let rev = read.expect("read the key").kvs()[0].create_revision();
        let lease = crate::lease::EtcdLease {
            shared: shared.clone(),
            slot: attempt.slot.clone().expect("held on a lease"),
            key,
            rev,
            owner: Arc::from("gone-lease-holder"),
        };
        // Answered: what the delete said.
        assert!(lease.deleted_by_us(true, false).await);
        assert!(!lease.deleted_by_us(false, false).await);
        assert!(
            lease.deleted_by_us(false, true).await,
            "a key gone while its lease lives counts as deleted by the release"
        );
        shared
            .client
            .lease_client()
            .revoke(lease.slot.id)
            .await
            .expect("revoke the holder's lease");
        assert!(
            !lease.deleted_by_us(false, true).await,
            "a key gone with its lease counted as released"
        );
        assert!(
            lease.deleted_by_us(true, true).await,
            "a delete that took the key"
        );
    }

    /// Polled at once, while its dead lease's last refresh is recent (less than a tenth of
    /// the ttl old): it used to hold on that lease (its renewals refused: a lock reported
    /// lost, its key left on the new one).
    #[tokio::test]
    async fn a_waiter_whose_lost_put_landed_on_a_new_lease_holds_on_it() {
        lost_put_on_a_new_lease(Duration::ZERO, false).await;
    }

    /// Polled past a tenth of the ttl, when it keeps its lease alive first: it used to find
    /// the dead lease dead on every poll and queue again, forever.
    #[tokio::test]
    async fn a_waiter_whose_lost_put_landed_on_a_new_lease_is_not_stuck() {
        lost_put_on_a_new_lease(Duration::from_millis(2_100), false).await;
    }

    /// The lost put found on a lease the attempt does not keep alive: the key is put again on
    /// the client's lease.
    #[tokio::test]
    async fn a_waiter_whose_lost_put_landed_on_an_unknown_lease_queues_again() {
        lost_put_on_a_new_lease(Duration::ZERO, true).await;
    }
}
