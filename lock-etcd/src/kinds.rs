//! The shared (read) and permit (semaphore) kinds: the steps of an acquisition that differ
//! from the mutex's. The exclusive kind (the mutex, the write side) keeps its own steps in
//! `attempt.rs`; a reader's waiting steps are the mutex's with a narrower read.
//!
//! # One queue, three kinds
//!
//! Every acquisition of a name, of any kind, is a key in the name's range, and the keys are
//! ordered by `create_revision` (the fencing token of whoever holds with that key). The key's
//! name says its kind (`keys::kind_tag`), so a kind's keys can be read, counted and compared as
//! a range inside a transaction. A key holds when every key before it is compatible with it:
//!
//! - a writer (exclusive key) when it is first;
//! - a reader (shared key) when no writer key is before it: readers queued behind a waiting
//!   writer wait for it (no writer starvation), readers before it hold together;
//! - a permit of N when fewer than N keys are before it, all permits of N.
//!
//! Keys before a key only ever leave (a later key has a higher create revision), so a key that
//! holds keeps holding until it is deleted, and two incompatible keys never both hold: the
//! later one has the earlier one before it.
//!
//! # Mismatch
//!
//! An acquisition compares its kind with the keys before it that it reads (in the transaction
//! that queues it, and at every later read of its place; the first key for `try_acquire`): a
//! writer the key just ahead of it, a reader every key that can block it, a permit every key
//! before it. A semaphore of another N, or a semaphore used as a lock, answers
//! [`Error::Mismatch`](distlock_core::Error::Mismatch), and the attempt's abandon removes its
//! key. Two kinds racing on one name can still both queue for a moment; the holding rule
//! above keeps that safe, and the later reads refuse the one that queued behind the other
//! (not only the other's key that happened to be the newest when it queued).
//!
//! # Wake-ups: each waiter watches only what blocks it
//!
//! - A writer watches its immediate predecessor's deletion (the mutex's rule).
//! - A reader watches the deletions of the keys that are not shared (the writers' part of the
//!   range) and counts the writer keys ahead of it as a permit waiter counts its keys (a
//!   permit of one): it holds on the deletion of the last, without a read. A writer's release
//!   thus lets in the readers up to the next writer with one event each, and never wakes the
//!   next writer. A reader whose watch started after its read (its client's first wait on the
//!   name) reads once more, every writer key before it.
//! - A permit waiter watches the deletions in the name's range and *counts* them: the read
//!   that placed it gave the keys before its own (all permits of N, by name), the first
//!   deletion of each of those names is one fewer, and when fewer than N are left it holds,
//!   with no read (`wake::PermitCount` says why the count is exact). A release thus hands its
//!   permit to the first waiter in one watch event, as the mutex's does; every waiter behind
//!   counts the same event and moves up one place without a request. Once the count cannot
//!   be trusted (the waiter's own key deleted, a watch cancelled or started after the read),
//!   any deletion sends the waiter back to read (and a key of another kind ahead refuses it,
//!   see Mismatch above). The watches do not ask for each deleted key's last version
//!   (`prev_kv`), which etcd reads from its store for every watch and every event.
//!
//! A permit waiter's range watch is kept by the client between waits like a predecessor
//! watch (`wake.rs`), so the next wait on the name starts counting from its read without
//! opening a watch. Each release is one event per waiter of the name (server-side fan-out;
//! no waiter sends anything for it but the one that now holds, which sends nothing either).
//! Clients of an earlier version, whose waiters behind the first one waited for their
//! predecessor's *touch* (a put by a waiter turning holder), see no touch from this version:
//! they move up when their predecessor is deleted instead, later but never wrongly.

use distlock_core::{Result, Step};
use etcd_client::{
    Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use tracing::debug;

use crate::attempt::{EtcdAttempt, header_revision};
use crate::error::{map_err, protocol};
use crate::keys;
use crate::wake::{Blocker, PermitCount};

/// Where a permit stands, from the keys before it (all permits of its N: a key of another
/// kind refuses it, see [`EtcdAttempt::check_kinds`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PermitPlace {
    /// Fewer than N keys before it: it holds.
    Holder,
    /// N or more keys before it: it waits, counting them (see [`PermitCount`]).
    Waiting { ahead: usize },
}

/// Classifies a permit of `permits` behind `ahead` keys, all permits of its N.
pub(crate) fn permit_place(ahead: usize, permits: u32) -> PermitPlace {
    let n = usize::try_from(permits).unwrap_or(usize::MAX);
    if ahead >= n {
        PermitPlace::Waiting { ahead }
    } else {
        PermitPlace::Holder
    }
}

/// The reads of a `try_acquire` of a permit of N: the name's newest key (its `count` is the
/// size of the whole range, whatever the limit) and the number of permit keys of N. (A
/// waiting `acquire` reads every key before its own instead, to count them by name.)
fn semaphore_reads(range: &str, permits: u32) -> [TxnOp; 2] {
    let (start, end) = keys::permit_range(range, permits);
    let newest = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(1)
        .with_keys_only();
    let same = GetOptions::new().with_range(end).with_count_only();
    [
        TxnOp::get(range, Some(newest)),
        TxnOp::get(start, Some(same)),
    ]
}

fn get_of(resp: Option<TxnOpResponse>) -> Result<etcd_client::GetResponse> {
    match resp {
        Some(TxnOpResponse::Get(get)) => Ok(get),
        _ => Err(protocol("a transaction answered without its read")),
    }
}

impl EtcdAttempt {
    /// `try_acquire` of a read lock: put our key only if the name has no writer key (holding
    /// or waiting); readers only, or nobody: we hold. One transaction, nothing left behind.
    pub(crate) async fn poll_try_shared(&mut self) -> Result<Option<Step>> {
        let slot = self.shared.fresh_slot(self.ttl).await?;
        let lease_started = slot.refreshed();
        let range = self.key.range().to_owned();
        let writers_end = keys::non_shared_end(&range);
        let first_writer = GetOptions::new()
            .with_range(writers_end.clone())
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new()
            .when([
                Compare::create_revision(self.key.key.clone(), CompareOp::Equal, 0),
                Compare::create_revision(range.clone(), CompareOp::Equal, 0)
                    .with_range(writers_end),
            ])
            .and_then([self.put_op(&slot)])
            .or_else([
                TxnOp::get(range, Some(first_writer)),
                TxnOp::get(
                    self.key.key.clone(),
                    Some(GetOptions::new().with_keys_only()),
                ),
            ]);
        self.slot = Some(slot.clone());
        let Some((resp, before)) = self.put_txn(&slot, txn, "acquiring").await? else {
            return Ok(None);
        };
        if resp.succeeded() {
            let rev = header_revision(resp.header())?;
            return Ok(Some(self.acquired(slot, rev, lease_started)?));
        }
        let mut reads = resp.op_responses().into_iter();
        let writer = get_of(reads.next())?;
        let ours = get_of(reads.next())?;
        if let Some(kv) = ours.kvs().first() {
            // An earlier poll's put whose answer was lost: it was put with no writer queued,
            // so every writer is behind it and it holds.
            return Ok(Some(self.acquired(
                slot,
                kv.create_revision(),
                lease_started,
            )?));
        }
        self.key.set_may_exist(before);
        if let Some(kv) = writer.kvs().first() {
            self.check_kind(kv.key())?;
        }
        Ok(Some(Step::busy(None)))
    }

    /// `try_acquire` of a permit: read the queue, and if fewer than N permits of N hold and
    /// nobody waits, put our key only if no key of the name changed since the read (a release
    /// meanwhile only frees more). Two requests, nothing left behind; a change between them
    /// answers `Step::Again` (read again).
    pub(crate) async fn poll_try_permit(&mut self, permits: u32) -> Result<Option<Step>> {
        let slot = self.shared.fresh_slot(self.ttl).await?;
        let lease_started = slot.refreshed();
        let range = self.key.range().to_owned();
        let [newest, same] = semaphore_reads(&range, permits);
        let ours = TxnOp::get(
            self.key.key.clone(),
            Some(GetOptions::new().with_keys_only()),
        );
        let read = Txn::new().and_then([newest, same, ours]);
        let resp = self
            .shared
            .client
            .kv_client()
            .txn(read)
            .await
            .map_err(|e| map_err("reading the semaphore", e))?;
        let revision = header_revision(resp.header())?;
        let mut reads = resp.op_responses().into_iter();
        let (all, same, ours) = (
            get_of(reads.next())?,
            get_of(reads.next())?,
            get_of(reads.next())?,
        );
        self.slot = Some(slot.clone());
        if let Some(kv) = ours.kvs().first() {
            // An earlier poll's put whose answer was lost: it was put with fewer than N
            // holders and nobody waiting, so it holds.
            return Ok(Some(self.acquired(
                slot,
                kv.create_revision(),
                lease_started,
            )?));
        }
        if let Some(kv) = all.kvs().first() {
            self.check_kind(kv.key())?;
        }
        let free = all.count() < i64::from(permits) && same.count() == all.count();
        if !free {
            return Ok(Some(Step::busy(None)));
        }
        let txn = Txn::new()
            .when([
                Compare::create_revision(self.key.key.clone(), CompareOp::Equal, 0),
                Compare::mod_revision(range, CompareOp::Less, revision + 1).with_prefix(),
            ])
            .and_then([self.put_op(&slot)]);
        let Some((resp, before)) = self.put_txn(&slot, txn, "acquiring").await? else {
            return Ok(None);
        };
        if resp.succeeded() {
            let rev = header_revision(resp.header())?;
            return Ok(Some(self.acquired(slot, rev, lease_started)?));
        }
        // A key of the name changed since the read: read again.
        self.key.set_may_exist(before);
        Ok(None)
    }

    /// `acquire` of a permit, first step: in one transaction, read the keys before ours (the
    /// newest first, keys only: a waiter counts them by name, see [`PermitCount`]) and put
    /// our key.
    pub(crate) async fn poll_enqueue_permit(&mut self, permits: u32) -> Result<Option<Step>> {
        let slot = self.shared.fresh_slot(self.ttl).await?;
        let lease_started = slot.refreshed();
        let before = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_keys_only();
        let reads = vec![TxnOp::get(self.key.range(), Some(before))];
        let Some((revision, mut gets)) = self
            .enqueue_txn(&slot, reads, "joining the semaphore queue")
            .await?
        else {
            return Ok(None);
        };
        let mut before = gets
            .pop()
            .ok_or_else(|| protocol("a transaction answered without its read"))?;
        self.rev = Some(revision);
        if before.kvs().is_empty() {
            return Ok(Some(self.acquired(slot, revision, lease_started)?));
        }
        // The keys before ours (the read runs before the put); held or queued as another
        // kind: the abandon that follows the error removes our key.
        let place = self.place_permit(&before, permits)?;
        if place == PermitPlace::Holder {
            return Ok(Some(self.acquired(slot, revision, lease_started)?));
        }
        Ok(Some(self.wait_permit(
            &place,
            before.take_kvs(),
            permits,
            revision,
        )))
    }

    /// Where a permit of `permits` stands behind the keys of `before` (every key before
    /// ours); [`Error::Mismatch`](distlock_core::Error::Mismatch) behind a key of another kind.
    fn place_permit(
        &self,
        before: &etcd_client::GetResponse,
        permits: u32,
    ) -> distlock_core::Result<PermitPlace> {
        self.check_kinds(before.kvs())?;
        Ok(permit_place(before.kvs().len(), permits))
    }

    /// `acquire` of a permit, later steps (when its count does not say it holds, see
    /// `EtcdAttempt::held_by_count`): where is our key now? One linearizable read of the keys
    /// before ours (keys only).
    pub(crate) async fn poll_position_permit(
        &mut self,
        rev: i64,
        permits: u32,
    ) -> Result<Option<Step>> {
        let Some(slot) = self.queued_slot().await? else {
            return Ok(None);
        };
        let lease_started = slot.refreshed();
        let before = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(rev - 1)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.key.clone(),
                CompareOp::Equal,
                rev,
            )])
            .and_then([TxnOp::get(self.key.range().to_owned(), Some(before))]);
        let resp = self
            .shared
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| map_err("checking the semaphore queue", e))?;
        if !resp.succeeded() {
            debug!(name = %self.name, "our semaphore key vanished; queueing again");
            self.rev = None;
            self.park_watch();
            self.watch_target = None;
            return Ok(None);
        }
        let revision = header_revision(resp.header())?;
        let mut before = get_of(resp.op_responses().into_iter().next())?;
        match self.place_permit(&before, permits)? {
            PermitPlace::Holder => Ok(Some(self.acquired(slot, rev, lease_started)?)),
            place => Ok(Some(self.wait_permit(
                &place,
                before.take_kvs(),
                permits,
                revision,
            ))),
        }
    }

    /// A permit waiter's wait (`place` is not `Holder`) behind the keys `before`, read at
    /// `revision`: it watches the deletions in the name's range, and counts those ahead of it
    /// where it can.
    fn wait_permit(
        &mut self,
        place: &PermitPlace,
        before: Vec<etcd_client::KeyValue>,
        permits: u32,
        revision: i64,
    ) -> Step {
        self.count = match place {
            PermitPlace::Waiting { .. } => Some(PermitCount::new(
                before.into_iter().map(|kv| kv.into_key_value().0),
                permits,
                self.key.key.clone(),
            )),
            PermitPlace::Holder => None,
        };
        let blocker = Blocker::range(self.key.range().to_owned());
        self.watch_target = Some((blocker, revision + 1));
        Step::busy(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permit_waiter_knows_its_place() {
        assert_eq!(permit_place(0, 2), PermitPlace::Holder);
        assert_eq!(permit_place(1, 2), PermitPlace::Holder);
        assert_eq!(permit_place(2, 2), PermitPlace::Waiting { ahead: 2 });
        assert_eq!(permit_place(3, 2), PermitPlace::Waiting { ahead: 3 });
    }
}
