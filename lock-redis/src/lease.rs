//! A held lock: renewal and release on one master; the Redlock quorum rounds are in
//! `redlock.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{LossEpochs, Renewer};
use distlock_core::{Error, Lease, LockKind, LockName, LossReason, Result};
use futures::future::BoxFuture;

use crate::backend::BackendState;
use crate::keys::LockKeys;
use crate::node::ReleaseMode;
use crate::redlock;
use crate::restart::Restarts;

#[derive(Debug)]
pub(crate) struct RedisLease {
    pub(crate) shared: Arc<BackendState>,
    /// The lock key only (what batched renewal needs): the name's other keys are made on
    /// demand ([`RedisLease::keys`]), so that a held lock keeps one key, not five.
    pub(crate) lock: String,
    pub(crate) owner: Arc<str>,
    pub(crate) name: LockName,
    /// Exclusive, shared or a permit: which scripts renew and release it.
    pub(crate) kind: LockKind,
    /// The lease length it was acquired with: the slack of its data's expiry (see
    /// [`SET_DATA`](crate::scripts::SET_DATA)).
    pub(crate) ttl: Duration,
    /// Whether data was ever stored with this hold (set before the write is sent, never
    /// cleared): only then does the batched renewal extend the data key too, so that holds
    /// without data pay nothing for it there.
    pub(crate) has_data: AtomicBool,
    /// Cluster: the watch of the lock's master, when one had already confirmed that master
    /// when the lock was taken
    /// ([`confirmed_watch_for`](crate::topology::ClusterTopology::confirmed_watch_for)): the
    /// guard joins its loss epochs ([`Lease::shared_loss`]), as on one master, instead of a
    /// loss future of its own that the client's watchdog task must be woken to poll when the
    /// guard starts and ends. `None` elsewhere, and on a cluster for the first guards of a
    /// master, a slot not in the cached map, or a watch that is blind or gone (their future
    /// looks for the master, starts its watch, and looks again if a stale slot map named
    /// it); a watch that ends between the lease and the guard's start leaves the guard to the
    /// future as well (see `shared_loss`).
    pub(crate) cluster_watch: Option<Arc<Restarts>>,
    /// Redlock: the masters whose requests of the acquisition round were still running when
    /// a majority granted it; the release waits for each there (see [`redlock::Unsettled`]).
    pub(crate) unsettled: Option<redlock::Unsettled>,
}

impl RedisLease {
    /// Every key of the lock's name (for a single renewal or a release).
    pub(crate) fn keys(&self) -> LockKeys {
        LockKeys::new(&self.name)
    }
}

#[async_trait]
impl Lease for RedisLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let shared = &self.shared;
        if !shared.redlock() {
            let renewed = shared.nodes[0]
                .renew(&self.keys(), &self.owner, ttl, self.kind)
                .await
                .map_err(|e| e.into_lock_error("renew"))?;
            return if renewed {
                Ok(())
            } else {
                Err(Error::not_held(&self.name))
            };
        }
        redlock::renew(self, ttl).await
    }

    /// Cluster, without a confirmed watch of the lock's master yet (see
    /// [`RedisLease::cluster_watch`]): the watch of the master that serves the lock's slot,
    /// which reports a restart and its replacement by a failover, looked for again when a
    /// stale slot map named a server that is no master. (Single master and Sentinel: see
    /// `shared_loss`. Redlock: one master's restart does not lose a lock held on a majority;
    /// renewal tells.)
    fn loss_signal(&self) -> Option<BoxFuture<'static, LossReason>> {
        // The core asks `shared_loss` first: a watch that is gone now (it never comes back)
        // was gone then too, and the guard joined nothing; one still watching now was then.
        if self.shared.redlock() || self.cluster_watch.as_ref().is_some_and(|w| !w.is_gone()) {
            return None;
        }
        let node = &self.shared.nodes[0];
        if let Some(topology) = node.cluster_topology() {
            let (topology, key) = (topology.clone(), self.lock.clone());
            return Some(Box::pin(async move {
                loop {
                    match topology.restarts_for(&key).await {
                        Some(restarts) if restarts.watchable() => {
                            if let Some(reason) = restarts.loss().await {
                                return reason;
                            }
                            // A stale slot map named that master: look again.
                        }
                        _ => return std::future::pending().await,
                    }
                }
            }));
        }
        None
    }

    /// Single master: a server restart forgets the lock, so the node's restart watch, shared
    /// by all of its guards, reports it at once ([`LossReason::ServerRestarted`]). Sentinel:
    /// the same watch follows the master the Sentinels name, so a failover shows as a new
    /// server ([`LossReason::Failover`]). Cluster: the confirmed watch of the lock's master,
    /// when it had one (see [`RedisLease::cluster_watch`]; otherwise `loss_signal`).
    fn shared_loss(&self) -> Option<(LossEpochs, u64)> {
        if self.shared.redlock() {
            return None;
        }
        let node = &self.shared.nodes[0];
        if node.cluster_topology().is_some() {
            return self.cluster_watch.as_ref().and_then(Restarts::shared_loss);
        }
        let restarts = node.restarts.as_ref()?;
        if !restarts.watchable() {
            return None;
        }
        restarts.shared_loss()
    }

    /// Every kind, on every topology: see `renew.rs`.
    fn renewer(&self) -> Option<Arc<dyn Renewer>> {
        Some(self.shared.renewer.clone())
    }

    /// One master (also Sentinel, Cluster): the owner-checked script
    /// [`SET_DATA`](crate::scripts::SET_DATA) on the lock's master; the data lives in the
    /// name's data hash, extended and deleted with the hold (see the crate docs, "Holder
    /// data").
    ///
    /// Redlock: [`Error::Unsupported`] (the backend does not declare
    /// [`holder_data`](distlock_core::Capabilities::holder_data)). Each master would keep its
    /// own copy, and a write that reaches a majority but not every master leaves them
    /// disagreeing: telling the latest value from an older one would take a version per write
    /// and a majority read that writes the latest back (a quorum register), two more rounds
    /// on every inspect and per holder for read locks, and a hold re-acquired on a master
    /// after a restart would start there without the data. Redlock's guarantees are best
    /// effort already; the data is left to the single-master topologies.
    async fn set_data(&self, data: Option<&str>) -> Result<()> {
        let shared = &self.shared;
        if shared.redlock() {
            return Err(Error::Unsupported(
                "Redlock stores no data with a hold: the masters' copies could disagree".into(),
            ));
        }
        if data.is_some() {
            self.has_data.store(true, Ordering::Relaxed);
        }
        let set = shared.nodes[0]
            .set_data(&self.keys(), &self.owner, self.kind, self.ttl, data)
            .await
            .map_err(|e| e.into_lock_error("set data"))?;
        if set {
            Ok(())
        } else {
            Err(Error::not_held(&self.name))
        }
    }

    async fn release(&self) -> Result<()> {
        let shared = &self.shared;
        if !shared.redlock() {
            let node = &shared.nodes[0];
            let (owner, config, mode) = (&*self.owner, &shared.config, ReleaseMode::Release);
            let hand_over = config.hand_over_lease(self.ttl);
            // The exclusive release needs no key but the lock's own and its siblings.
            let released = if self.kind == LockKind::Exclusive {
                node.release_lock(&self.lock, owner, config, mode, hand_over)
                    .await
            } else {
                node.release(&self.keys(), owner, config, mode, self.kind, hand_over)
                    .await
            }
            .map_err(|e| e.into_lock_error("release"))?;
            return if released {
                Ok(())
            } else {
                Err(Error::not_held(&self.name))
            };
        }
        redlock::release(self).await
    }
}
