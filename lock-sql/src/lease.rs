//! A held lock: renewal and release, checked against the row's owner and version.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_core::{Error, Lease, LockName, Result};

use crate::backend::{Inner, micros};
use crate::error::map_err;

#[derive(Debug)]
pub(crate) struct SqlLease {
    pub(crate) inner: Arc<Inner>,
    pub(crate) name: LockName,
    pub(crate) owner: String,
    pub(crate) version: i64,
}

impl SqlLease {
    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.to_string(),
        }
    }
}

#[async_trait]
impl Lease for SqlLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let renewed = self
            .inner
            .db
            .renew(self.name.as_str(), &self.owner, self.version, micros(ttl))
            .await
            .map_err(|e| map_err("renew", e))?;
        if renewed {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }

    async fn release(&self) -> Result<()> {
        let released = self
            .inner
            .db
            .release(self.name.as_str(), &self.owner, self.version)
            .await
            .map_err(|e| map_err("release", e))?;
        if released {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }
}
