//! A held lock: its queue key's lease, renewal, release, and the removal of a lapsed key.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::backend::{RenewItem, Renewer, downcast_lease};
use distlock_core::{Error, Lease, Result};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use tracing::debug;

use crate::backend::BackendState;
use crate::checks::{CHECKS_PER_TXN, keys_are_ours};
use crate::error::{attempts, protocol, retryable};
use crate::keys::{self, QueueKey};
use crate::session::LeaseSlot;

/// A held lock: its queue key, first in line, on the client's lease.
pub(crate) struct EtcdLease {
    pub(crate) shared: Arc<BackendState>,
    pub(crate) slot: Arc<LeaseSlot>,
    pub(crate) key: Arc<QueueKey>,
    pub(crate) rev: i64,
}

impl fmt::Debug for EtcdLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLease")
            .field("key", &self.key.key)
            .field("revision", &self.rev)
            .field("lease", &self.slot.id)
            .finish_non_exhaustive()
    }
}

impl EtcdLease {
    /// The lock's name, read back from its queue key (`<prefix>/<escaped name>/...`): for
    /// error messages only, so that a held lock keeps no copy of it.
    fn name(&self) -> String {
        let range = self.key.range();
        keys::name_of_range(&self.shared.prefix, range).unwrap_or_else(|| range.to_owned())
    }

    /// Deletes our key if it is still the one we created (by its create revision); true if
    /// it was. A lost answer is repeated only if the request never left: a repeated delete
    /// whose first answer was lost would find nothing and answer "not held".
    async fn delete_ours(&self, what: &str) -> Result<bool> {
        let key = &self.key.key;
        // Compared on our key's create revision, which no later key can have: safe to send
        // again after an unanswered attempt or any transport failure (CI, 2026-11-26: a
        // release sent as the leader died failed with `transport error (Unknown)`, and the
        // waiter then waited out the ttl).
        let (resp, unanswered) = attempts(what, retryable, &self.shared.members, || {
            let mut kv = self.shared.client.kv_client();
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    self.rev,
                )])
                .and_then([TxnOp::delete(key.clone(), None)]);
            async move { kv.txn(txn).await }
        })
        .await
        .map_err(|e| e.into_error(what))?;
        // The key of this acquisition is gone either way (nobody else puts it).
        self.key.deleted();
        // After an unanswered attempt, a key found gone was most likely deleted by that
        // attempt: the release counts as done (a loss before it is reported by the guard's
        // renewal, not here).
        Ok(resp.succeeded() || unanswered)
    }
}

/// Renews the held locks of one client together: one keepalive per lease slot (the client's
/// lease of each ttl, which every key of that ttl lives on) and one transaction that reads
/// every batched key, each lock then held exactly as [`EtcdLease::renew`] says (its slot alive
/// and its key still there with its create revision). Shared by every kind (exclusive,
/// shared, permit): each holds through the same queue key.
#[derive(Debug, Default)]
pub(crate) struct EtcdRenewer;

#[async_trait]
impl Renewer for EtcdRenewer {
    /// One transaction of key reads per batch: etcd's default `--max-txn-ops` is 128.
    fn max_batch(&self) -> usize {
        CHECKS_PER_TXN
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Result<()>>> {
        let started = Instant::now();
        let leases: Vec<Option<&EtcdLease>> = items
            .iter()
            .map(|item| downcast_lease::<EtcdLease>(item.lease))
            .collect();
        let foreign = || {
            Err(Error::Backend {
                message: "a lease of another client in an etcd renewal".into(),
                source: None,
            })
        };
        let Some(shared) = leases.iter().flatten().next().map(|l| l.shared.clone()) else {
            return Ok(items.iter().map(|_| foreign()).collect());
        };
        let ours: Vec<Option<&EtcdLease>> = leases
            .into_iter()
            .map(|l| l.filter(|l| Arc::ptr_eq(&l.shared, &shared)))
            .collect();
        // The distinct slots, each kept alive once (concurrently with the reads).
        let mut slots: Vec<&Arc<LeaseSlot>> = Vec::new();
        for lease in ours.iter().flatten() {
            if !slots.iter().any(|s| Arc::ptr_eq(s, &lease.slot)) {
                slots.push(&lease.slot);
            }
        }
        let keys: Vec<(&str, i64)> = ours
            .iter()
            .flatten()
            .map(|l| (l.key.key.as_str(), l.rev))
            .collect();
        let (alive, read) = tokio::join!(
            futures::future::join_all(slots.iter().map(|slot| slot.keep_alive(
                &shared.client,
                &shared.members,
                started
            )),),
            keys_are_ours(&shared.client, &shared.members, &keys)
        );
        let read = read.map_err(|e| e.into_error("renewing"))?;
        // A keepalive that failed (no answer, a transport error) fails the batch as a whole:
        // each lock is then retried like a failed renewal.
        let alive = alive.into_iter().collect::<Result<Vec<bool>>>()?;
        let mut answers = read.into_iter();
        Ok(ours
            .iter()
            .map(|lease| {
                let Some(lease) = lease else {
                    return foreign();
                };
                let ours = answers
                    .next()
                    .flatten()
                    .ok_or_else(|| protocol("a transaction answered without its read"))?;
                let at = slots.iter().position(|s| Arc::ptr_eq(s, &lease.slot));
                let alive = at.and_then(|at| alive.get(at)).is_some_and(|a| *a);
                if alive && ours {
                    Ok(())
                } else {
                    Err(Error::not_held(lease.name()))
                }
            })
            .collect())
    }
}

#[async_trait]
impl Lease for EtcdLease {
    fn renewer(&self) -> Option<Arc<dyn Renewer>> {
        Some(self.shared.renewer.clone())
    }

    async fn renew(&self, ttl: Duration) -> Result<()> {
        let started = Instant::now();
        let (alive, ours) = tokio::join!(
            self.slot
                .keep_alive(&self.shared.client, &self.shared.members, started),
            self.shared.key_is_ours(&self.key.key, self.rev)
        );
        let _ = ttl; // the slot's lease has the ttl the key was created with
        if !alive? || !ours? {
            return Err(Error::not_held(self.name()));
        }
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        tracing::trace!(target: "distlock_etcd::wait", key = %self.key.key, "release sent");
        let deleted = self.delete_ours("releasing").await?;
        tracing::trace!(target: "distlock_etcd::wait", key = %self.key.key, "release answered");
        if !deleted {
            return Err(Error::not_held(self.name()));
        }
        Ok(())
    }

    /// Our key lives on the client's lease, which other guards keep alive: once this lock ran
    /// out (renewal stopped, the hold limit reached, the guard abandoned) the key is deleted
    /// here, or it would stay held.
    async fn expired(&self) -> Result<()> {
        if self.delete_ours("deleting an expired lock key").await? {
            debug!(key = %self.key.key, "expired lock key deleted");
        }
        Ok(())
    }
}
