//! The ZooKeeper backend's descriptors (plain and, with the feature `tls`, TLS), opened by
//! [`connect`](crate::connect).

use std::sync::Arc;

use distlock_core::{ClientConfig, Descriptor, DistributedLock, Result};
use futures::future::BoxFuture;

use crate::ZkConfig;

fn open(url: String, config: ClientConfig) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>>> {
    Box::pin(async move { Ok(crate::connect(&url, config).await?.into_dyn()) })
}

/// `zk://`: a holder node's lease runs from its `mtime`, the leader's wall clock.
pub const ZK: Descriptor = Descriptor::new(
    "zookeeper",
    &["zk"],
    "zk://[user:pass@]h1:p1,h2:p2[/chroot][?auth=sasl]",
    open,
)
.with_default_port(ZkConfig::DEFAULT_PORT);

/// `zks://`: ZooKeeper over TLS (feature `tls`).
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub const ZKS: Descriptor = Descriptor::new(
    "zookeeper",
    &["zks"],
    "zks://[user:pass@]h1:p1[/chroot]?ca=PATH (TLS)",
    open,
)
.with_default_port(ZkConfig::DEFAULT_PORT);
