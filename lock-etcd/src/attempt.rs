//! One acquisition: a queue key on the client's lease, waiting for the keys ahead of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::backend::{Retries, RetryPolicy, spawn_cleanup};
use distlock_core::{Acquired, Attempt, AttemptMode, FencingToken, Result, Step};
use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions, WatchStream,
};
use tracing::debug;

use crate::backend::Shared;
use crate::error::{lease_not_found, map_err, protocol};
use crate::keys::{QueueKey, key_string};
use crate::lease::EtcdLease;
use crate::session::LeaseSlot;
use crate::wake::{next_event, sleep_until};

pub(crate) fn token(revision: i64) -> FencingToken {
    FencingToken::new(u64::try_from(revision).unwrap_or(0))
}

/// One acquisition: a queue key of the client on its lease, with the owner as its value.
pub(crate) struct EtcdAttempt {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: String,
    pub(crate) mode: AttemptMode,
    pub(crate) ttl: Duration,
    pub(crate) owner: String,
    pub(crate) key: Arc<QueueKey>,
    /// The lease the key is attached to.
    pub(crate) slot: Option<Arc<LeaseSlot>>,
    /// The key's create revision once it is known to be queued.
    pub(crate) rev: Option<i64>,
    /// The predecessor to watch and the revision to watch from.
    pub(crate) watch_target: Option<(String, i64)>,
    /// The predecessor watched, the stream, and the revision the watch started after.
    pub(crate) watch: Option<(String, WatchStream, i64)>,
}

impl EtcdAttempt {
    fn acquired(&mut self, slot: Arc<LeaseSlot>, rev: i64, lease_started: Instant) -> Step {
        self.watch = None;
        let lease = EtcdLease {
            shared: self.shared.clone(),
            slot,
            name: self.name.clone(),
            key: self.key.clone(),
            rev,
        };
        Step::Acquired(Acquired::new(Box::new(lease), token(rev)).with_lease_started(lease_started))
    }

    fn put_op(&self, slot: &LeaseSlot) -> TxnOp {
        TxnOp::put(
            self.key.key.clone(),
            self.owner.clone(),
            Some(PutOptions::new().with_lease(slot.id)),
        )
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
                Compare::create_revision(self.key.range.clone(), CompareOp::Equal, 0).with_prefix(),
            ])
            .and_then([self.put_op(&slot)])
            .or_else([TxnOp::get(self.key.range.clone(), Some(first))]);
        let before = self.key.may_exist();
        self.key.set_may_exist(true);
        self.slot = Some(slot.clone());
        match self.shared.client.kv_client().txn(txn).await {
            Err(err) if lease_not_found(&err) => {
                slot.mark_dead();
                self.key.set_may_exist(before);
                Ok(None)
            }
            Err(err) => Err(map_err("acquiring", err)),
            Ok(resp) if resp.succeeded() => {
                let rev = header_revision(resp.header())?;
                Ok(Some(self.acquired(slot, rev, lease_started)))
            }
            Ok(resp) => {
                let first = match resp.op_responses().into_iter().next() {
                    Some(TxnOpResponse::Get(mut get)) => get.take_kvs().into_iter().next(),
                    _ => None,
                };
                match first {
                    Some(kv) if before && kv.key() == self.key.key.as_bytes() => {
                        let rev = kv.create_revision();
                        Ok(Some(self.acquired(slot, rev, lease_started)))
                    }
                    _ => {
                        self.key.set_may_exist(before);
                        Ok(Some(Step::busy(None)))
                    }
                }
            }
        }
    }

    /// `acquire`, first step: join the queue and learn the predecessor in one transaction.
    async fn poll_enqueue(&mut self) -> Result<Option<Step>> {
        let slot = self.shared.fresh_slot(self.ttl).await?;
        let lease_started = slot.refreshed();
        let last = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::get(self.key.range.clone(), Some(last)),
                self.put_op(&slot),
            ])
            .or_else([TxnOp::get(self.key.key.clone(), None)]);
        let before = self.key.may_exist();
        self.key.set_may_exist(true);
        let resp = match self.shared.client.kv_client().txn(txn).await {
            Err(err) if lease_not_found(&err) => {
                slot.mark_dead();
                self.key.set_may_exist(before);
                return Ok(None);
            }
            Err(err) => return Err(map_err("joining the lock queue", err)),
            Ok(resp) => resp,
        };
        let revision = header_revision(resp.header())?;
        let first_kvs = match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(mut get)) => get.take_kvs(),
            _ => return Err(protocol("a transaction answered without its read")),
        };
        if !resp.succeeded() {
            // Our key exists already: an earlier poll's answer was lost. Find its place.
            match first_kvs.first() {
                Some(kv) => {
                    self.rev = Some(kv.create_revision());
                    if self.slot.is_none() {
                        self.slot = Some(slot);
                    }
                }
                None => self.rev = None,
            }
            return Ok(None);
        }
        self.slot = Some(slot.clone());
        match first_kvs.first() {
            None => Ok(Some(self.acquired(slot, revision, lease_started))),
            Some(pred) => {
                self.rev = Some(revision);
                self.watch_target = Some((key_string(pred.key()), revision + 1));
                Ok(Some(Step::busy(None)))
            }
        }
    }

    /// Whether our key (created at `rev`) exists, and the last key before it.
    async fn position_txn(&self, rev: i64, serializable: bool) -> Result<etcd_client::TxnResponse> {
        let mut before = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(rev - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        if serializable {
            before = before.with_serializable();
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.key.clone(),
                CompareOp::Equal,
                rev,
            )])
            .and_then([TxnOp::get(self.key.range.clone(), Some(before))]);
        self.shared
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| map_err("checking the lock queue", e))
    }

    /// `acquire`, later steps: is there still a key before ours?
    async fn poll_position(&mut self, rev: i64) -> Result<Option<Step>> {
        let Some(slot) = self.slot.clone() else {
            self.rev = None;
            return Ok(None);
        };
        if slot.refreshed().elapsed() >= slot.ttl / 10
            && !slot.keep_alive(&self.shared.client, Instant::now()).await?
        {
            self.rev = None; // the lease and our key are gone: queue again
            return Ok(None);
        }
        let lease_started = slot.refreshed();
        // First a serializable read, answered by whichever member the request reaches without
        // a quorum round: any snapshot that holds our key and no key before it proves that
        // every earlier key is gone for good (create revisions never come back). A lagging
        // snapshot (our key not in it yet, or a predecessor that may be gone meanwhile) is
        // confirmed by a linearizable read.
        let mut resp = self.position_txn(rev, true).await?;
        let head = resp.succeeded()
            && matches!(
                resp.op_responses().first(),
                Some(TxnOpResponse::Get(get)) if get.kvs().is_empty()
            );
        if !head {
            resp = self.position_txn(rev, false).await?;
        }
        if !resp.succeeded() {
            debug!(name = %self.name, "our queue key vanished; queueing again");
            self.rev = None;
            self.watch = None;
            self.watch_target = None;
            return Ok(None);
        }
        let revision = header_revision(resp.header())?;
        let kvs = match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(mut get)) => get.take_kvs(),
            _ => return Err(protocol("a transaction answered without its read")),
        };
        match kvs.first() {
            None => Ok(Some(self.acquired(slot, rev, lease_started))),
            Some(pred) => {
                self.watch_target = Some((key_string(pred.key()), revision + 1));
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
        // Every step is safe to repeat (a repeated put finds its own key), so a transport
        // error is retried at once: the client balances over the endpoints, and a request
        // routed to a member that just went down fails before the balancer skips it. A lease
        // that vanished, or a lost answer, costs one more round: `Step::Again`.
        let mut retries = Retries::new(RetryPolicy::TRANSIENT);
        loop {
            let result = match (self.mode, self.rev) {
                (AttemptMode::Try, _) => self.poll_try().await,
                (AttemptMode::Wait, None) => self.poll_enqueue().await,
                (AttemptMode::Wait, Some(rev)) => self.poll_position(rev).await,
            };
            match result {
                Err(err) if err.is_retryable() && retries.pause("an acquire step", &err).await => {}
                other => return Ok(other?.unwrap_or(Step::Again)),
            }
        }
    }

    async fn changed(&mut self) {
        loop {
            if let Some((pred, from)) = self.watch_target.clone() {
                if self.watch.as_ref().is_none_or(|(k, _, _)| *k != pred) {
                    self.watch = None;
                    // From "now", not from `from`: a watch that starts in the past is served by
                    // etcd's catch-up loop, which runs every 100 ms. The gap between our read
                    // and the watch's start is closed below by polling once more.
                    let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
                    match self
                        .shared
                        .client
                        .watch_client()
                        .watch(pred.clone(), Some(options))
                        .await
                    {
                        Ok(mut stream) => match stream.message().await {
                            Ok(Some(created)) if created.created() => {
                                // No revision (never seen): trust the watch; the core's
                                // backoff maximum bounds a missed gap, a re-poll loop would not.
                                let start = header_revision(created.header()).unwrap_or(0);
                                self.watch = Some((pred, stream, start));
                            }
                            // Anything else (an event, an error, the end): poll again.
                            _ => return,
                        },
                        Err(err) => {
                            // Leave it to the core's backoff to poll again.
                            debug!(%err, "cannot watch the predecessor");
                            self.watch_target = None;
                        }
                    }
                }
                if let Some((_, _, start)) = &self.watch
                    && from <= *start
                {
                    // The predecessor may have gone between our read and the watch's start.
                    return;
                }
            }
            // While queued, our key lives on the client's lease: keep it alive.
            let keepalive_at = self.slot.as_ref().map(|s| s.refreshed() + s.ttl / 3);
            tokio::select! {
                event = next_event(&mut self.watch) => match event {
                    Some(true) => {
                        self.watch = None;
                        self.watch_target = None;
                        return;
                    }
                    Some(false) => {}
                    None => {
                        self.watch = None;
                        self.watch_target = None;
                    }
                },
                () = sleep_until(keepalive_at) => {
                    if let Some(slot) = &self.slot {
                        match slot.keep_alive(&self.shared.client, Instant::now()).await {
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

    async fn abandon(self: Box<Self>) -> Result<()> {
        if !self.key.may_exist() {
            return Ok(());
        }
        let mut kv = self.shared.client.kv_client();
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
        let key = self.key.clone();
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
        Ok(())
    }
}
