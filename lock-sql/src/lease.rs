//! A held lock: renewal and release, checked against the row's owner and version (an
//! exclusive hold) or the holder's row and token (a shared hold or a permit).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::backend::{Renewer, retrying};
use distlock_core::{Error, Lease, LockKind, LockName, Result};

use crate::backend::{Inner, micros};
use crate::error::{RELEASE_RETRY, map_err, not_applied};
use crate::kinds::HeldBy;

#[derive(Debug)]
pub(crate) struct SqlLease {
    pub(crate) inner: Arc<Inner>,
    pub(crate) name: LockName,
    pub(crate) owner: Arc<str>,
    /// The version the acquisition set: the fencing token.
    pub(crate) version: i64,
    /// How it is held.
    pub(crate) kind: LockKind,
    /// Whether the acquisition may have left a place in the queue ([`HeldBy::queued`]).
    pub(crate) queued: bool,
}

impl SqlLease {
    /// The holder, for the statements of a shared hold or a permit; `None` for an exclusive
    /// hold.
    pub(crate) fn held(&self) -> Option<HeldBy<'_>> {
        (self.kind != LockKind::Exclusive).then_some(HeldBy {
            name: self.name.as_str(),
            owner: &self.owner,
            kind: self.kind,
            token: Some(self.version),
            queued: self.queued,
        })
    }

    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.to_string(),
        }
    }
}

impl Drop for SqlLease {
    fn drop(&mut self) {
        // Released or lost: its row may be due for a sweep within `forget_after`.
        self.inner.sweeper.touched();
        // After a release nothing is left; after a loss, what the take kept goes (a wake
        // lock's connection, MySQL's: an exclusive holder's, a joined or handed-over hold's).
        self.inner.db.forget(self.name.as_str(), &self.owner);
    }
}

#[async_trait]
impl Lease for SqlLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let db = &self.inner.db;
        let renewed = match self.held() {
            None => {
                db.renew(self.name.as_str(), &self.owner, self.version, micros(ttl))
                    .await
            }
            Some(held) => db.renew_hold(held, micros(ttl)).await,
        }
        .map_err(|e| map_err("renew", e))?;
        if renewed {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }

    /// Exclusive leases: the backend's one renewer (see [`crate::renew`]). Shared holds and
    /// permits: the same where the database renews a batch of them in one statement
    /// (PostgreSQL's function); elsewhere none, each renews itself (a transaction or a
    /// procedure call).
    fn renewer(&self) -> Option<Arc<dyn Renewer>> {
        (self.kind == LockKind::Exclusive || self.inner.db.batches_holds())
            .then(|| self.inner.renewer.clone())
    }

    async fn release(&self) -> Result<()> {
        let db = &self.inner.db;
        let released = retrying("release", RELEASE_RETRY, not_applied, || async {
            match self.held() {
                None => {
                    db.release(self.name.as_str(), &self.owner, self.version)
                        .await
                }
                Some(held) => db.release_hold(held).await,
            }
        })
        .await
        .map_err(|e| map_err("release", e))?;
        if released {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }

    /// The `data` column of the hold's row, replaced by one statement checked as a renewal
    /// is (owner, version, live lease) for an exclusive hold; for a shared hold or a permit,
    /// its holder row's, in the hold's own transaction (under the lock row's lock, checked as
    /// its renewal: the live marker, owner, token, live row). Neither expiry changes.
    async fn set_data(&self, data: Option<&str>) -> Result<()> {
        let db = &self.inner.db;
        if !db.has_data() {
            return Err(Error::Unsupported(
                "the lock table has no `data` column (a table of an earlier version): \
                 connect once with create_table on to add it"
                    .into(),
            ));
        }
        let set = match self.held() {
            None => {
                db.set_data(self.name.as_str(), &self.owner, self.version, data)
                    .await
            }
            Some(held) => db.set_hold_data(held, data).await,
        }
        .map_err(|e| map_err("set holder data", e))?;
        if set { Ok(()) } else { Err(self.not_held()) }
    }
}
