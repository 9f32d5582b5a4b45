//! A held lock: renewal and release on one master or a Redlock quorum.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_core::{Error, Lease, LockName, Result};
use futures::future::join_all;

use crate::backend::Shared;
use crate::keys::LockKeys;
use crate::node::{ReleaseMode, within};

#[derive(Debug)]
pub(crate) struct RedisLease {
    pub(crate) shared: Arc<Shared>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: String,
    pub(crate) name: LockName,
}

#[async_trait]
impl Lease for RedisLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let shared = &self.shared;
        if !shared.redlock() {
            let renewed = shared.nodes[0]
                .renew(&self.keys, &self.owner, ttl)
                .await
                .map_err(|e| e.into_lock_error("renew"))?;
            return if renewed {
                Ok(())
            } else {
                Err(Error::not_held(&self.name))
            };
        }
        let started = Instant::now();
        let timeout = shared.node_timeout(ttl);
        let results = join_all(
            shared
                .nodes
                .iter()
                .map(|n| within(n, timeout, n.renew(&self.keys, &self.owner, ttl))),
        )
        .await;
        let renewed = results.iter().filter(|r| matches!(r, Ok(true))).count();
        let failed = results.iter().filter(|r| r.is_err()).count();
        let quorum = shared.quorum();
        if renewed >= quorum && started.elapsed() + shared.client.drift(ttl) < ttl {
            return Ok(());
        }
        if renewed + failed < quorum {
            return Err(Error::not_held(&self.name));
        }
        Err(Error::Unavailable {
            message: format!(
                "renewal of {:?} reached {renewed} of {} nodes ({quorum} needed) within the validity",
                self.name.as_str(),
                shared.nodes.len()
            ),
            source: results
                .into_iter()
                .find_map(Result::err)
                .map(|e| Box::new(e) as distlock_core::BoxError),
        })
    }

    async fn release(&self) -> Result<()> {
        let shared = &self.shared;
        if !shared.redlock() {
            let released = shared.nodes[0]
                .release(
                    &self.keys,
                    &self.owner,
                    &shared.config,
                    ReleaseMode::Release,
                )
                .await
                .map_err(|e| e.into_lock_error("release"))?;
            return if released {
                Ok(())
            } else {
                Err(Error::not_held(&self.name))
            };
        }
        let timeout = shared.cleanup_timeout();
        let results = join_all(shared.nodes.iter().map(|n| {
            within(
                n,
                timeout,
                n.release(
                    &self.keys,
                    &self.owner,
                    &shared.config,
                    ReleaseMode::Release,
                ),
            )
        }))
        .await;
        if results.iter().any(|r| matches!(r, Ok(true))) {
            return Ok(());
        }
        match results.into_iter().find_map(Result::err) {
            Some(err) => Err(err.into_lock_error("release")),
            None => Err(Error::not_held(&self.name)),
        }
    }
}
