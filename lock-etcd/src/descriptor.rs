//! The etcd backend's descriptor, opened by [`connect`](crate::connect).

use std::sync::Arc;

use distlock_core::{ClientConfig, Descriptor, DistributedLock, Result};
use futures::future::BoxFuture;

fn open(url: String, config: ClientConfig) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>>> {
    Box::pin(async move { Ok(crate::connect(&url, config).await?.into_dyn()) })
}

/// `etcd://`, `etcds://` (TLS): leases on etcd's lessor, which runs on the leader's monotonic
/// clock.
pub const ETCD: Descriptor = Descriptor::new(
    "etcd",
    &["etcd", "etcds"],
    "etcd://h1:p1,h2:p2 or etcds://user:pass@h1:p1?ca=PATH&cert=PATH&key=PATH",
    open,
)
.with_default_port(crate::DEFAULT_PORT)
.with_monotonic_leases();
