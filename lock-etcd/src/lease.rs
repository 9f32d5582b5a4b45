//! A held lock: its queue key's lease, renewal, release, and the removal of a lapsed key.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::backend::Renewer;
use distlock_core::{Error, Lease, Result};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tracing::debug;

use crate::backend::BackendState;
use crate::error::{attempts, retryable};
use crate::keys::{self, QueueKey};
use crate::session::LeaseSlot;

/// A held lock: its queue key, first in line, on the client's lease.
pub(crate) struct EtcdLease {
    pub(crate) shared: Arc<BackendState>,
    pub(crate) slot: Arc<LeaseSlot>,
    pub(crate) key: Arc<QueueKey>,
    pub(crate) rev: i64,
    /// The owner, the first part of the key's value (see [`keys::value_with_data`]).
    pub(crate) owner: Arc<str>,
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
    pub(crate) fn name(&self) -> String {
        let range = self.key.range();
        keys::name_of_range(&self.shared.prefix, range).unwrap_or_else(|| range.to_owned())
    }

    /// Deletes our key if it is still the one we created (by its create revision); true if
    /// it was, or if an attempt went unanswered and the repeat found the key gone with its
    /// lease still alive (see [`Self::deleted_by_us`]).
    async fn delete_ours(&self, what: &str) -> Result<bool> {
        // Compared on our key's create revision, which no later key can have: safe to send
        // again after an unanswered attempt or any transport failure (CI, 2026-11-26: a
        // release sent as the leader died failed with `transport error (Unknown)`, and the
        // waiter then waited out the ttl).
        let (succeeded, unanswered) = self
            .if_ours(what, TxnOp::delete(self.key.key.clone(), None))
            .await?;
        // The key of this acquisition is gone either way (nobody else puts it).
        self.key.deleted();
        Ok(self.deleted_by_us(succeeded, unanswered).await)
    }

    /// Whether a delete of our key that `succeeded` (or not) after attempts of which one went
    /// `unanswered` (or none) took the key. A repeat that found the key gone after an
    /// unanswered attempt asks whether the key's lease lives: alive, that attempt deleted it;
    /// gone, the lease's end took the key before the release, a loss that the guard's renewal
    /// no longer reports (a release stops it). A forced release (`distlock unlock --force`)
    /// cannot be told from our own deletion; a lease that cannot be asked about counts as
    /// living (the release as done).
    pub(crate) async fn deleted_by_us(&self, succeeded: bool, unanswered: bool) -> bool {
        if succeeded || !unanswered {
            return succeeded;
        }
        let alive = self
            .slot
            .keep_alive(&self.shared.client, &self.shared.members, Instant::now())
            .await;
        alive.unwrap_or(true)
    }

    /// Applies `op` in a transaction comparing our key's create revision with ours, sent
    /// again after a transport failure: whether it applied, and whether an attempt went
    /// unanswered.
    async fn if_ours(&self, what: &str, op: TxnOp) -> Result<(bool, bool)> {
        let key = &self.key.key;
        let (resp, unanswered) = attempts(what, retryable, &self.shared.members, || {
            let mut kv = self.shared.client.kv_client();
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    self.rev,
                )])
                .and_then([op.clone()]);
            async move { kv.txn(txn).await }
        })
        .await
        .map_err(|e| e.into_error(what))?;
        Ok((resp.succeeded(), unanswered))
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

    /// Rewrites our key's value as the owner and `data` ([`keys::value_with_data`]), in a
    /// transaction comparing the key's create revision with ours (the fencing token: no later
    /// key can have it), keeping the key's lease: the token and the lease stay, the data ends
    /// with the key. Safe to send again after an unanswered attempt (the same put).
    async fn set_data(&self, data: Option<&str>) -> Result<()> {
        let put = TxnOp::put(
            self.key.key.clone(),
            keys::value_with_data(&self.owner, data),
            Some(PutOptions::new().with_ignore_lease()),
        );
        let (succeeded, _) = self.if_ours("setting the holder data", put).await?;
        if !succeeded {
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
