//! A held lock: its queue key's lease, renewal, release, and the reaper of a lapsed key.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::{Error, Lease, Result};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use tokio::sync::watch;
use tracing::debug;

use crate::backend::Shared;
use crate::error::{TRANSPORT_RETRIES, map_err, not_sent, retry_pause};
use crate::keys::QueueKey;
use crate::session::LeaseSlot;

/// A held lock: its queue key, first in line, on the client's lease.
pub(crate) struct EtcdLease {
    pub(crate) shared: Arc<Shared>,
    pub(crate) slot: Arc<LeaseSlot>,
    pub(crate) name: String,
    pub(crate) key: Arc<QueueKey>,
    pub(crate) rev: i64,
    /// The instant after which the reaper deletes the key; `None` once released.
    pub(crate) reaper: watch::Sender<Option<Instant>>,
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
    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.clone(),
        }
    }
}

#[async_trait]
impl Lease for EtcdLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let started = Instant::now();
        let (alive, ours) = tokio::join!(
            self.slot.keep_alive(&self.shared.client, started),
            self.shared.key_is_ours(&self.key.key, self.rev)
        );
        if !alive? || !ours? {
            return Err(self.not_held());
        }
        self.reaper.send_if_modified(|deadline| match deadline {
            Some(d) if *d < started + ttl => {
                *d = started + ttl;
                true
            }
            _ => false,
        });
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        let mut failures = 0;
        let key = &self.key.key;
        let resp = loop {
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    self.rev,
                )])
                .and_then([TxnOp::delete(key.clone(), None)]);
            match self.shared.client.kv_client().txn(txn).await {
                // Only a request that never left may be repeated: a repeated delete whose first
                // answer was lost would find nothing and answer `NotHeld`.
                Err(err) if not_sent(&err) && failures < TRANSPORT_RETRIES => {
                    retry_pause(&mut failures).await;
                }
                other => break other.map_err(|e| map_err("releasing", e))?,
            }
        };
        self.reaper.send_replace(None);
        self.key.deleted();
        if !resp.succeeded() {
            return Err(self.not_held());
        }
        Ok(())
    }
}

/// Deletes a held key whose guard stopped renewing (abandoned, hold limit, renewal disabled)
/// once its ttl has passed, so that the lease other guards keep alive does not keep it held.
pub(crate) async fn reap(
    queue_key: Arc<QueueKey>,
    rev: i64,
    mut rx: watch::Receiver<Option<Instant>>,
) {
    loop {
        let Some(deadline) = *rx.borrow_and_update() else {
            return;
        };
        tokio::select! {
            () = tokio::time::sleep_until(deadline.into()) => {
                if *rx.borrow() == Some(deadline) {
                    break;
                }
            }
            changed = rx.changed() => {
                if changed.is_err() {
                    // The lease handle is gone without a release: wait out the last deadline.
                    let Some(deadline) = *rx.borrow() else { return };
                    tokio::time::sleep_until(deadline.into()).await;
                    break;
                }
            }
        }
    }
    let key = &queue_key.key;
    for _ in 0..10 {
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key.clone(), None)]);
        match queue_key.shared.client.kv_client().txn(txn).await {
            Ok(resp) => {
                if resp.succeeded() {
                    debug!(%key, "expired lock key deleted");
                }
                // The key of this acquisition is gone either way (nobody else puts it).
                queue_key.deleted();
                return;
            }
            Err(err) => {
                debug!(%err, %key, "deleting an expired lock key failed, retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
