//! A held lock: renewal and release of the holder's node, on the server's clock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::Renewer;
use distlock_core::{Error, Lease, LockName, LossReason, Result};
use futures::future::BoxFuture;
use zookeeper_client as zk;

use crate::error::zk_error;
use crate::keys::held_data;
use crate::session::Session;

/// The pause before a release is sent again after a lost connection.
const RELEASE_RETRY: Duration = Duration::from_millis(50);

/// A held lock: our node at the head of the queue.
pub(crate) struct ZkLease {
    pub(crate) session: Arc<Session>,
    pub(crate) name: LockName,
    pub(crate) path: String,
    ttl: Duration,
}

impl fmt::Debug for ZkLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLease")
            .field("path", &self.path)
            .field("session", &self.session.client.session_id())
            .finish_non_exhaustive()
    }
}

impl ZkLease {
    /// The lease of the holder's node `path`, acquired with `ttl`.
    pub(crate) fn new(session: Arc<Session>, name: LockName, path: String, ttl: Duration) -> Self {
        Self {
            session,
            name,
            path,
            ttl,
        }
    }
}

#[async_trait]
impl Lease for ZkLease {
    fn renewer(&self) -> Option<Arc<dyn Renewer>> {
        Some(self.session.renewer.clone())
    }

    async fn renew(&self, ttl: Duration) -> Result<()> {
        self.session.check_connected()?;
        // Only we write our node; it exists only while we hold (or a contender removed it
        // after expiry, or the session ended): a plain set_data is owner-checked and atomic.
        match self
            .session
            .client
            .set_data(&self.path, &held_data(ttl), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(zk::Error::NoNode | zk::Error::SessionExpired) => Err(Error::not_held(&self.name)),
            Err(err) => Err(zk_error("renewing the lock", err)),
        }
    }

    /// Deletes the holder's node. A release is worth waiting for (the core's operation
    /// timeout bounds it): the node would otherwise hold the lock for the rest of its ttl. A
    /// connection lost meanwhile (a server of the ensemble going down) is waited out while the
    /// session lives, and the delete sent again; a node found gone after such a loss was
    /// removed by the first delete (only its holder removes a live session's node before its
    /// ttl ran out, and a lease that ran out was already reported lost by the watchdog).
    async fn release(&self) -> Result<()> {
        let mut connection_lost = false;
        loop {
            self.session.connected().await;
            match self.session.client.delete(&self.path, None).await {
                Ok(()) => return Ok(()),
                Err(zk::Error::NoNode) if connection_lost => return Ok(()),
                Err(zk::Error::NoNode | zk::Error::SessionExpired) => {
                    return Err(Error::not_held(&self.name));
                }
                Err(zk::Error::ConnectionLoss) => {
                    connection_lost = true;
                    // The state watcher may not say "disconnected" yet: no tight loop.
                    tokio::time::sleep(RELEASE_RETRY).await;
                }
                Err(err) => return Err(zk_error("releasing the lock", err)),
            }
        }
    }

    fn loss_signal(&self) -> Option<BoxFuture<'static, LossReason>> {
        let client = self.session.client.clone();
        let path = self.path.clone();
        let ttl = self.ttl;
        // A removed node: the core tells an expiry (past the local deadline) from a removal.
        let gone = || LossReason::ReleasedElsewhere;
        Some(Box::pin(async move {
            let mut states = client.state_watcher();
            // Most holds are short: the watch on our node (one more request) is set only after
            // a tenth of the ttl. Until then a session expiry still ends the lease at once, and
            // a node removed meanwhile is found by that first check (or by renewal).
            let arm = tokio::time::sleep(ttl / 10);
            tokio::pin!(arm);
            loop {
                if states.peek_state().is_terminated() {
                    return LossReason::SessionExpired;
                }
                tokio::select! {
                    () = &mut arm => break,
                    state = states.changed() => {
                        if state.is_terminated() {
                            return LossReason::SessionExpired;
                        }
                    }
                }
            }
            // A persistent watch, not a one-shot: every renewal changes the node's data, and a
            // one-shot watch would cost one more request per lock per renewal to set again
            // (which batched renewal saves). Data changes are ignored; a deletion or a session
            // end is the loss.
            let mut watcher = loop {
                if states.peek_state().is_terminated() {
                    return LossReason::SessionExpired;
                }
                match client.watch(&path, zk::AddWatchMode::Persistent).await {
                    Ok(watcher) => break watcher,
                    Err(
                        zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed,
                    ) => return LossReason::SessionExpired,
                    Err(_) => {
                        // Disconnected: the renewal deadline covers us; try again once the
                        // connection state changes.
                        let _ = tokio::time::timeout(Duration::from_millis(200), states.changed())
                            .await;
                    }
                }
            };
            // Whether the node must be looked at: once the watch is set (it may have gone just
            // before), and after each reconnection (events during a connection loss may be
            // lost: ZOOKEEPER-4698).
            let mut look = true;
            loop {
                if look {
                    if states.peek_state().is_terminated() {
                        return LossReason::SessionExpired;
                    }
                    match client.check_stat(&path).await {
                        Ok(None) => return gone(),
                        Ok(Some(_)) => look = false,
                        Err(
                            zk::Error::SessionExpired
                            | zk::Error::ClientClosed
                            | zk::Error::AuthFailed,
                        ) => return LossReason::SessionExpired,
                        Err(_) => {
                            let _ =
                                tokio::time::timeout(Duration::from_millis(200), states.changed())
                                    .await;
                            continue;
                        }
                    }
                }
                // Never called after a terminal session event (the watcher panics then).
                let event = watcher.changed().await;
                match event.event_type {
                    zk::EventType::NodeDeleted => return gone(),
                    zk::EventType::Session if event.session_state.is_terminated() => {
                        return LossReason::SessionExpired;
                    }
                    zk::EventType::Session => {
                        look = matches!(
                            event.session_state,
                            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
                        );
                    }
                    _ => {} // our own renewal changed the data
                }
            }
        }))
    }
}
