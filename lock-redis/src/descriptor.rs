//! The Redis backend's descriptors, one per family of URL schemes: one master (or a Unix
//! socket), Redlock, Sentinel and Cluster; all opened by [`connect`](crate::connect).

use std::sync::Arc;

use distlock_core::{ClientConfig, Descriptor, DistributedLock, Result};
use futures::future::BoxFuture;

fn open(url: String, config: ClientConfig) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>>> {
    Box::pin(async move { Ok(crate::connect(&url, config).await?.into_dyn()) })
}

/// `redis://`, `rediss://` (TLS), `redis+unix://`, `unix://`: one master.
pub const REDIS: Descriptor = Descriptor::new(
    "redis",
    &["redis", "rediss", "redis+unix", "unix"],
    "redis://[user:pass@]host:port (rediss:// with TLS: ?ca=&cert=&key=)",
    open,
)
.with_default_port(6379);

/// `redlock://`, `redlocks://` (TLS): independent masters, a majority per lock.
pub const REDLOCK: Descriptor = Descriptor::new(
    "redlock",
    &["redlock", "redlocks"],
    "redlock://h1:p1,h2:p2,h3:p3 (redlocks:// with TLS)",
    open,
)
.with_default_port(6379);

/// `redis+sentinel://`, `rediss+sentinel://`: the master that the Sentinels name.
pub const SENTINEL: Descriptor = Descriptor::new(
    "redis-sentinel",
    &["redis+sentinel", "rediss+sentinel"],
    "redis+sentinel://[user:pass@]s1:p1,s2:p2,s3:p3/master_name[/db]",
    open,
)
.with_default_port(26379)
.with_announced_addresses();

/// `redis+cluster://`, `rediss+cluster://`: a Redis Cluster, reached through any of its nodes.
pub const CLUSTER: Descriptor = Descriptor::new(
    "redis-cluster",
    &["redis+cluster", "rediss+cluster"],
    "redis+cluster://[user:pass@]h1:p1,h2:p2,h3:p3 (any nodes of the cluster)",
    open,
)
.with_default_port(6379)
.with_announced_addresses();
