//! The shared conformance suite against a real ZooKeeper server.

mod common;

use std::sync::Arc;

use conformance_tests::{Harness, server_var};

async fn harness() -> Option<Arc<dyn Harness>> {
    let server = server_var("zk", "DISTLOCK_TEST_ZK_CONNECT")?;
    let mut harness = common::ZkHarness::new(&server).await;
    // Renewed in batches (one multi per 500 nodes): the scale of issue 22.
    harness.many_locks = conformance_tests::SCALE_LOCKS;
    Some(Arc::new(harness))
}

conformance_tests::conformance_suite!(zk, crate::harness);

/// The same suite on a 3-server ensemble: every client knows all three servers; the outage
/// hook stops two of them (quorum lost).
async fn ensemble_harness() -> Option<Arc<dyn Harness>> {
    let connect = server_var("zk", "DISTLOCK_TEST_ZK_ENSEMBLE_CONNECT")?;
    Some(Arc::new(common::ZkHarness::ensemble(&connect).await))
}

conformance_tests::conformance_suite!(zk_ensemble, crate::ensemble_harness);

/// The same suite with digest credentials: every node under an ACL of that identity; the
/// harness's admin client (clean-up, forced release) authenticates as the same user.
async fn auth_harness() -> Option<Arc<dyn Harness>> {
    let url = server_var("zk", "DISTLOCK_TEST_ZK_AUTH_URL")?;
    Some(Arc::new(
        common::ZkHarness::with_url(&url, "zookeeper-auth").await,
    ))
}

conformance_tests::conformance_suite!(zk_auth, crate::auth_harness, transport_variant);

/// The same suite over TLS (to the `secureClientPort` of the same server) with digest
/// credentials; the admin client uses the plain port.
#[cfg(feature = "tls")]
async fn tls_harness() -> Option<Arc<dyn Harness>> {
    let url = server_var("zk", "DISTLOCK_TEST_ZK_TLS_URL")?;
    let plain = server_var("zk", "DISTLOCK_TEST_ZK_AUTH_URL")?;
    Some(Arc::new(
        common::ZkHarness::with_tls_url(&url, &plain, "zookeeper-auth").await,
    ))
}

#[cfg(feature = "tls")]
conformance_tests::conformance_suite!(zk_tls, crate::tls_harness, transport_variant);
