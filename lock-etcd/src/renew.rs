//! Batched renewal: the held locks of one client renewed together, one keepalive per lease
//! slot and one transaction of key reads per batch. The keepalive itself is the lease slot's
//! (`session.rs`), shared with acquisitions and with a lock's own renewal (`lease.rs`).

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use distlock_core::backend::{RenewItem, Renewer, downcast_lease};
use distlock_core::{Error, Result};

use crate::checks::{CHECKS_PER_TXN, keys_are_ours};
use crate::error::protocol;
use crate::lease::EtcdLease;
use crate::session::LeaseSlot;

/// Renews the held locks of one client together: one keepalive per lease slot (the client's
/// lease of each ttl, which every key of that ttl lives on) and one transaction that reads
/// every batched key, each lock then held exactly as
/// [`EtcdLease::renew`](distlock_core::Lease::renew) says (its slot alive and its key still
/// there with its create revision). Shared by every kind (exclusive, shared, permit): each
/// holds through the same queue key.
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
