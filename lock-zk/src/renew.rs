//! Batched renewal: the held nodes of one session renewed in one `multi`.

use std::sync::Arc;

use async_trait::async_trait;
use distlock_core::backend::{RenewItem, Renewer, downcast_lease};
use distlock_core::{Error, Result};
use zookeeper_client as zk;

use crate::error::zk_error;
use crate::lease::{Written, ZkLease};

/// Renews the held nodes of one session together: one `multi` of `setData`s, each exactly
/// the write `ZkLease::renew` makes (unversioned: only the holder writes its node, which
/// exists only while it holds, so the node's existence is the owner check). Shared by every
/// kind (exclusive, shared, permit): each holds through the same node write.
///
/// A `multi` is all or nothing: when one node is gone, the server fails the whole request
/// and names the first operation that failed; that lease alone is answered (`NotHeld` for a
/// missing node) and the rest is sent again, so a lost lock does not fail its batch-mates.
#[derive(Debug, Default)]
pub(crate) struct ZkRenewer;

/// The most nodes one `multi` renews: the request must fit ZooKeeper's `jute.maxbuffer`
/// (1 MB by default), and a node path of the longest name (256 bytes, up to 768 escaped, plus
/// prefix and sequence) takes under 900 bytes with its operation header: 500 stay under
/// 450 KB (typical paths, ~100 bytes, make it ~60 KB: one log entry the server writes at once).
pub(crate) const MAX_BATCH: usize = 500;

#[async_trait]
impl Renewer for ZkRenewer {
    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Result<()>>> {
        let leases: Vec<Option<&ZkLease>> = items
            .iter()
            .map(|item| downcast_lease::<ZkLease>(item.lease))
            .collect();
        let mut results: Vec<Option<Result<()>>> = leases
            .iter()
            .map(|lease| {
                lease.is_none().then(|| {
                    Err(Error::Backend {
                        message: "a lease of another backend in a ZooKeeper renewal".into(),
                        source: None,
                    })
                })
            })
            .collect();
        let Some(session) = leases.iter().flatten().next().map(|l| l.session.clone()) else {
            return Ok(results.into_iter().flatten().collect());
        };
        session.check_connected()?;
        // The items still to renew, by index; each round sends them all in one multi.
        let mut pending: Vec<usize> = (0..items.len()).filter(|&i| results[i].is_none()).collect();
        while !pending.is_empty() {
            let mut multi = session.client.new_multi_writer();
            let mut sent = Vec::with_capacity(pending.len());
            // Each node's data stays locked until the multi is sent, so that a `set_data`
            // made meanwhile is sent after it (see `ZkLease::written`).
            let answer = {
                let mut locked: Vec<std::sync::MutexGuard<'_, Written>> =
                    Vec::with_capacity(pending.len());
                let mut seen = std::collections::HashSet::with_capacity(pending.len());
                for &i in &pending {
                    let (Some(lease), Some(item)) = (leases[i], items.get(i)) else {
                        continue;
                    };
                    if !Arc::ptr_eq(&lease.session, &session) {
                        results[i] = Some(Err(Error::Backend {
                            message: "a lease of another session in a ZooKeeper renewal".into(),
                            source: None,
                        }));
                        continue;
                    }
                    // Locking one lease twice would never return.
                    if !seen.insert(std::ptr::from_ref(lease)) {
                        results[i] = Some(Err(Error::Backend {
                            message: "the same lease twice in a ZooKeeper renewal".into(),
                            source: None,
                        }));
                        continue;
                    }
                    let mut written = lease.written();
                    let data = ZkLease::renewal_data(&mut written, item.ttl);
                    match multi.add_set_data(&lease.path, &data, None) {
                        Ok(()) => {
                            sent.push(i);
                            locked.push(written);
                        }
                        Err(err) => results[i] = Some(Err(zk_error("renewing the lock", err))),
                    }
                }
                multi.commit()
            };
            match answer.await {
                Ok(_) => {
                    for i in sent {
                        results[i] = Some(Ok(()));
                    }
                    break;
                }
                Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                    // Only that node's write failed; the others are sent again.
                    let Some(&failed) = sent.get(index) else {
                        return Err(zk_error("renewing locks", source));
                    };
                    results[failed] = Some(match (source, leases[failed]) {
                        (zk::Error::NoNode, Some(lease)) => Err(Error::not_held(&lease.name)),
                        (err, _) => Err(zk_error("renewing the lock", err)),
                    });
                    sent.remove(index);
                    pending = sent;
                }
                Err(zk::MultiWriteError::RequestFailed {
                    source: zk::Error::SessionExpired,
                }) => {
                    // Every node of the session is gone with it.
                    for i in sent {
                        if let Some(lease) = leases[i] {
                            results[i] = Some(Err(Error::not_held(&lease.name)));
                        }
                    }
                    break;
                }
                Err(zk::MultiWriteError::RequestFailed { source }) => {
                    return Err(zk_error("renewing locks", source));
                }
            }
        }
        Ok(results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(Error::Backend {
                        message: "a ZooKeeper renewal left a lease unanswered".into(),
                        source: None,
                    })
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use distlock_core::LockName;

    use super::*;
    use crate::ZkConfig;
    use crate::keys::held_data;
    use crate::session::open_session;

    /// One node removed inside a batch: that lease alone is answered `NotHeld`, the multi is
    /// sent again for the rest, and they are renewed (their data rewritten).
    #[tokio::test]
    async fn a_removed_node_fails_alone_and_the_rest_is_renewed() {
        let Some(server) = conformance_tests_var() else {
            return;
        };
        let chroot = "/distlock-renew-test";
        let config = ZkConfig::new(&format!("{server}{chroot}")).unwrap();
        let session = open_session(&config, Duration::from_secs(5)).await.unwrap();
        let client = &session.client;
        let ttl = Duration::from_secs(3);
        let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        let mut leases = Vec::new();
        for i in 0..5 {
            let path = format!("/n{i}");
            let _ = client.delete(&path, None).await;
            client.create(&path, b"old", &options).await.unwrap();
            leases.push(ZkLease::new(
                session.clone(),
                LockName::new(format!("n{i}")).unwrap(),
                path,
                Duration::from_secs(1),
            ));
        }
        client.delete("/n1", None).await.unwrap();
        client.delete("/n3", None).await.unwrap();
        let items: Vec<RenewItem<'_>> = leases
            .iter()
            .map(|lease| RenewItem::new(lease, ttl))
            .collect();
        let results = session.renewer.renew_many(&items).await.unwrap();
        let held: Vec<bool> = results.iter().map(Result::is_ok).collect();
        assert_eq!(held, [true, false, true, false, true]);
        assert!(matches!(results[1], Err(Error::NotHeld { .. })));
        assert!(matches!(results[3], Err(Error::NotHeld { .. })));
        for i in [0, 2, 4] {
            let (data, _) = client.get_data(&format!("/n{i}")).await.unwrap();
            assert_eq!(data, held_data(ttl), "node {i} was not renewed");
            client.delete(&format!("/n{i}"), None).await.unwrap();
        }
    }

    /// The test server, if configured (`DISTLOCK_TEST_REQUIRE` makes a missing one fail).
    fn conformance_tests_var() -> Option<String> {
        match std::env::var("DISTLOCK_TEST_ZK_CONNECT") {
            Ok(server) => Some(server.split(',').next()?.to_owned()),
            Err(_) => {
                assert!(
                    std::env::var("DISTLOCK_TEST_REQUIRE").is_err(),
                    "DISTLOCK_TEST_ZK_CONNECT is not set"
                );
                None
            }
        }
    }
}
