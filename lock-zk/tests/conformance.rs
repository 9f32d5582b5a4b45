//! The shared conformance suite against a real ZooKeeper server.

mod common;

use std::sync::Arc;

use conformance_tests::{Harness, server_var};

async fn harness() -> Option<Arc<dyn Harness>> {
    let server = server_var("zk", "DISTLOCK_TEST_ZK_CONNECT")?;
    Some(Arc::new(common::ZkHarness::new(&server).await))
}

conformance_tests::conformance_suite!(zk, crate::harness);
