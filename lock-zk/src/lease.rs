//! A held lock: renewal and release of the holder's node, on the server's clock.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{LossEpochs, Renewer, unpoisoned};
use distlock_core::{Error, Lease, LockName, Result};
use zookeeper_client as zk;

use crate::error::zk_error;
use crate::keys::held_data_with;
use crate::session::Session;

/// The pause before a release is sent again after a lost connection.
const RELEASE_RETRY: Duration = Duration::from_millis(50);

/// A held lock: our node at the head of the queue.
pub(crate) struct ZkLease {
    pub(crate) session: Arc<Session>,
    pub(crate) name: LockName,
    pub(crate) path: String,
    /// What the node's data says besides "held": the lease's ttl as last written and the
    /// holder's data ([`Lease::set_data`]); every write of the node writes both. A write
    /// holds this lock from the moment it builds its data until its request is sent
    /// (zookeeper-client sends a request when it is called, not when its answer is awaited),
    /// so the server applies the writes of the node in the order of their data: a batched
    /// renewal that built its data before a `set_data` cannot land after it and bring the
    /// old data back (issue found by the conformance suite in CI: `inspect` right after
    /// clearing the data still showed it).
    written: Mutex<Written>,
}

/// The lease's ttl as last written and the holder's data.
pub(crate) type Written = (Duration, Option<String>);

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
            written: Mutex::new((ttl, None)),
        }
    }

    /// The lock on what the node's data says: held by a write until its request is sent
    /// (see [`ZkLease::written`]).
    pub(crate) fn written(&self) -> std::sync::MutexGuard<'_, Written> {
        unpoisoned(&self.written)
    }

    /// The node's data for a renewal to `ttl`: the held mark and the holder's data.
    pub(crate) fn renewal_data(written: &mut Written, ttl: Duration) -> Vec<u8> {
        written.0 = ttl;
        held_data_with(ttl, written.1.as_deref())
    }

    /// Writes the data that `update` makes of what was written (our node only exists while
    /// we hold it: a plain set_data is owner-checked and atomic), sent under the lock.
    async fn write(&self, update: impl FnOnce(&mut Written) -> Vec<u8>, what: &str) -> Result<()> {
        self.session.check_connected()?;
        let answer = {
            let mut written = self.written();
            let data = update(&mut written);
            self.session.client.set_data(&self.path, &data, None)
        };
        match answer.await {
            Ok(_) => Ok(()),
            Err(zk::Error::NoNode | zk::Error::SessionExpired) => Err(Error::not_held(&self.name)),
            Err(err) => Err(zk_error(what, err)),
        }
    }
}

#[async_trait]
impl Lease for ZkLease {
    fn renewer(&self) -> Option<Arc<dyn Renewer>> {
        Some(self.session.renewer.clone())
    }

    async fn renew(&self, ttl: Duration) -> Result<()> {
        // Only we write our node; it exists only while we hold (or a contender removed it
        // after expiry, or the session ended): a plain set_data is owner-checked and atomic.
        self.write(
            |written| Self::renewal_data(written, ttl),
            "renewing the lock",
        )
        .await
    }

    /// Rewrites the node with the new data and the ttl last written (which moves its `mtime`:
    /// the lease runs from now, as after a renewal). A renewal that comes after writes the new
    /// data too; one whose request was built before is sent before (see
    /// [`ZkLease::written`]).
    async fn set_data(&self, data: Option<&str>) -> Result<()> {
        self.write(
            |written| {
                written.1 = data.map(str::to_owned);
                held_data_with(written.0, data)
            },
            "setting the holder data",
        )
        .await
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

    /// The session's end (expiry, or closed): one watch for every guard of the session (see
    /// `session.rs`). Every lease of a session was taken in its epoch 0: the session's source
    /// fires once, when it ends. A node removed behind its holder (a force release) is found
    /// by the next renewal, which is refused: a watch on each node would cost a watch
    /// registration per lock and a notification per lock and renewal (every renewal changes
    /// the node's data).
    fn shared_loss(&self) -> Option<(LossEpochs, u64)> {
        Some((self.session.lost.clone(), 0))
    }
}
