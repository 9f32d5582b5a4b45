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
//! An acquisition compares its kind with the newest key before it (read in the transaction
//! that queues it, or the first key for `try_acquire`): a semaphore of another N, or a
//! semaphore used as a lock, answers [`Error::Mismatch`](distlock_core::Error::Mismatch), and
//! the attempt's abandon removes its key. Two kinds racing on one name can still both queue
//! for a moment; the holding rule above keeps that safe.
//!
//! # Wake-ups: each waiter watches only what blocks it
//!
//! - A writer watches its immediate predecessor's deletion (the mutex's rule).
//! - A reader watches the deletion of the latest writer key before it: the release of that
//!   writer wakes exactly the readers up to the next writer, and never the next writer.
//! - A permit waiter at index N (the first waiter) watches the deletions in the name's range:
//!   any deletion before it frees a permit (deletions after it, waiters leaving, wake it in
//!   vain). A waiter further back watches its immediate predecessor's deletion *and puts*:
//!   when the predecessor turns from first waiter into holder, it *touches* its key (a put of
//!   the same value on the same lease, guarded by its create revision) if it has a successor,
//!   and that put tells the successor that it is now the first waiter, to watch the range.
//!   Watching one fixed key instead would miss releases: with holders k0, k1 of 2 and k2
//!   watching k0, k1's release would never wake k2.
//!
//! Interleavings: the successor check and the holder check are one linearizable read, so a
//! successor queued after it reads the predecessor as a holder already (and watches the
//! range at once), and one queued before it is touched. A successor whose watch starts after
//! the touch polls once more (the watch's start revision is past its read). A predecessor that
//! leaves (release, abandon, expiry) is deleted, which wakes the successor too. So one release
//! of a permit wakes the first waiter, which takes the permit, plus one touch event for the
//! next waiter; the waiters further back sleep.

use std::time::Instant;

use std::sync::Arc;

use distlock_core::{Result, Step};
use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use tracing::debug;

use crate::attempt::{EtcdAttempt, header_revision};
use crate::error::{lease_not_found, map_err, protocol};
use crate::keys::{self, key_string};
use crate::session::LeaseSlot;
use crate::wake::Blocker;

/// Where a permit waiter stands, from the keys before it (newest first, at most N + 1 of them).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PermitPlace {
    /// Fewer than N keys before it, all permits of N: it holds.
    Holder,
    /// Exactly N permit holders before it: any deletion among them frees a permit.
    FirstWaiter,
    /// Further back (or behind a key of another kind): its predecessor blocks it.
    Behind,
}

/// Classifies a permit of `permits` from the kinds of the keys before it (any order), of which
/// `complete` says whether all were read (otherwise more than `kinds.len()` exist).
pub(crate) fn permit_place(
    kinds: &[distlock_core::LockKind],
    complete: bool,
    permits: u32,
) -> PermitPlace {
    let ours = distlock_core::LockKind::Permit { permits };
    let n = usize::try_from(permits).unwrap_or(usize::MAX);
    if !complete || kinds.iter().any(|k| *k != ours) || kinds.len() > n {
        PermitPlace::Behind
    } else if kinds.len() == n {
        PermitPlace::FirstWaiter
    } else {
        PermitPlace::Holder
    }
}

/// The reads that place a permit of N: the name's newest key (its `count` is the size of the
/// whole range, whatever the limit) and the number of permit keys of N.
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

    /// `acquire` of a permit, first step: in one transaction, count the keys before ours and
    /// those that are permits of N, read the newest (our predecessor), and put our key.
    pub(crate) async fn poll_enqueue_permit(&mut self, permits: u32) -> Result<Option<Step>> {
        let slot = self.shared.fresh_slot(self.ttl).await?;
        let lease_started = slot.refreshed();
        let reads = semaphore_reads(self.key.range(), permits).into();
        let Some((revision, gets)) = self
            .enqueue_txn(&slot, reads, "joining the semaphore queue")
            .await?
        else {
            return Ok(None);
        };
        let (first, same) = match &gets[..] {
            [first, same] => (first, same),
            _ => return Err(protocol("a transaction answered without its reads")),
        };
        self.rev = Some(revision);
        let Some(pred) = first.kvs().first() else {
            return Ok(Some(self.acquired(slot, revision, lease_started)?));
        };
        // Held as another kind: the abandon that follows the error removes our key.
        self.check_kind(pred.key())?;
        let place = if same.count() == first.count() {
            let n = i64::from(permits);
            match first.count() {
                c if c < n => PermitPlace::Holder,
                c if c == n => PermitPlace::FirstWaiter,
                _ => PermitPlace::Behind,
            }
        } else {
            PermitPlace::Behind
        };
        if place == PermitPlace::Holder {
            return Ok(Some(self.acquired(slot, revision, lease_started)?));
        }
        let pred = key_string(pred.key());
        Ok(Some(self.wait_behind(place, pred, revision)))
    }

    /// `acquire` of a permit, later steps: where is our key now? One linearizable read of the
    /// keys before ours (at most N + 1) and whether a key follows ours.
    pub(crate) async fn poll_position_permit(
        &mut self,
        rev: i64,
        permits: u32,
    ) -> Result<Option<Step>> {
        let Some(slot) = self.queued_slot().await? else {
            return Ok(None);
        };
        let lease_started = slot.refreshed();
        let range = self.key.range().to_owned();
        let before = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(rev - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(i64::from(permits) + 1)
            .with_keys_only();
        let after = GetOptions::new()
            .with_prefix()
            .with_min_create_revision(rev + 1)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.key.clone(),
                CompareOp::Equal,
                rev,
            )])
            .and_then([
                TxnOp::get(range.clone(), Some(before)),
                TxnOp::get(range, Some(after)),
            ]);
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
        let mut reads = resp.op_responses().into_iter();
        let (before, after) = (get_of(reads.next())?, get_of(reads.next())?);
        let kinds: Vec<_> = before
            .kvs()
            .iter()
            .map(|kv| keys::key_kind(self.key.range(), kv.key()))
            .collect();
        let place = permit_place(&kinds, !before.more(), permits);
        match before.kvs().first() {
            Some(pred) if place != PermitPlace::Holder => Ok(Some(self.wait_behind(
                place,
                key_string(pred.key()),
                revision,
            ))),
            _ => {
                let successor = !after.kvs().is_empty();
                self.holder_touching(slot, rev, lease_started, successor)
                    .await
            }
        }
    }

    /// A permit waiter that just became a holder: if a key follows ours, its owner may be
    /// watching our key for the moment we stop being a waiter; a put of our key (same value,
    /// same lease, only if still ours) tells it.
    async fn holder_touching(
        &mut self,
        slot: Arc<LeaseSlot>,
        rev: i64,
        lease_started: Instant,
        successor: bool,
    ) -> Result<Option<Step>> {
        if successor {
            let txn = Txn::new()
                .when([Compare::create_revision(
                    self.key.key.clone(),
                    CompareOp::Equal,
                    rev,
                )])
                .and_then([TxnOp::put(
                    self.key.key.clone(),
                    &*self.owner,
                    Some(PutOptions::new().with_lease(slot.id)),
                )]);
            match self.shared.client.kv_client().txn(txn).await {
                Err(err) if lease_not_found(&err) => {
                    slot.mark_dead();
                    self.rev = None;
                    return Ok(None);
                }
                Err(err) => return Err(map_err("telling the next permit waiter", err)),
                Ok(resp) if !resp.succeeded() => {
                    self.rev = None;
                    return Ok(None);
                }
                Ok(_) => {}
            }
        }
        Ok(Some(self.acquired(slot, rev, lease_started)?))
    }

    /// A permit waiter's wait (`place` is not `Holder`), read at `revision`: the first waiter
    /// watches the deletions of the name's range, one further back its predecessor `pred`.
    fn wait_behind(&mut self, place: PermitPlace, pred: String, revision: i64) -> Step {
        let blocker = match place {
            PermitPlace::FirstWaiter => Blocker {
                key: self.key.range().to_owned(),
                prefix: true,
                puts: false,
            },
            PermitPlace::Behind | PermitPlace::Holder => Blocker {
                key: pred,
                prefix: false,
                puts: true,
            },
        };
        self.watch_target = Some((blocker, revision + 1));
        Step::busy(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::LockKind;

    #[test]
    fn a_permit_waiter_knows_its_place() {
        let p = |permits| LockKind::Permit { permits };
        assert_eq!(permit_place(&[], true, 2), PermitPlace::Holder);
        assert_eq!(permit_place(&[p(2)], true, 2), PermitPlace::Holder);
        assert_eq!(
            permit_place(&[p(2), p(2)], true, 2),
            PermitPlace::FirstWaiter
        );
        assert_eq!(permit_place(&[p(2); 3], true, 2), PermitPlace::Behind);
        assert_eq!(permit_place(&[p(2), p(2)], false, 2), PermitPlace::Behind);
        // Behind a key of another kind, whatever the count.
        assert_eq!(
            permit_place(&[LockKind::Exclusive], true, 2),
            PermitPlace::Behind
        );
        assert_eq!(permit_place(&[p(3), p(2)], true, 2), PermitPlace::Behind);
    }
}
