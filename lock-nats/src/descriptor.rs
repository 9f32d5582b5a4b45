//! The NATS backend's descriptor, opened by [`connect`](crate::connect).

use std::sync::Arc;

use distlock_core::{ClientConfig, Descriptor, DistributedLock, Result};
use futures::future::BoxFuture;

fn open(url: String, config: ClientConfig) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>>> {
    Box::pin(async move { Ok(crate::connect(&url, config).await?.into_dyn()) })
}

/// `nats://`, `tls://` and `nats+tls://` (TLS): leases on JetStream's per-message ttls, which
/// the stream's leader ends by its wall clock.
pub const NATS: Descriptor = Descriptor::new(
    "nats",
    &["nats", "tls", "nats+tls"],
    "nats://h1:p1,h2:p2/bucket?replicas=3 or tls://user:pass@h1:p1?ca=PATH&cert=PATH&key=PATH",
    open,
)
.with_default_port(crate::DEFAULT_PORT);
