//! The SQL backend's descriptors, one per database its features compile in, all opened by
//! [`connect`](crate::connect). Leases end on the database's clock.

use std::sync::Arc;

use distlock_core::{ClientConfig, Descriptor, DistributedLock, Result};
use futures::future::BoxFuture;

fn open(url: String, config: ClientConfig) -> BoxFuture<'static, Result<Arc<dyn DistributedLock>>> {
    Box::pin(async move { Ok(crate::connect(&url, config).await?.into_dyn()) })
}

/// `sqlite://PATH`, `sqlite::memory:` (feature `sqlite`): a lock file, no server.
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub const SQLITE: Descriptor =
    Descriptor::new("sqlite", &["sqlite"], "sqlite://PATH", open).without_password();

/// `postgres://`, `postgresql://` (feature `postgres`).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub const POSTGRES: Descriptor = Descriptor::new(
    "postgres",
    &["postgres", "postgresql"],
    "postgres://user:pass@host/db[?sslmode=verify-full&sslrootcert=PATH]",
    open,
)
.with_default_port(5432);

/// `mysql://`, `mariadb://` (feature `mysql`): MySQL or MariaDB.
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub const MYSQL: Descriptor = Descriptor::new(
    "mysql",
    &["mysql", "mariadb"],
    "mysql://user:pass@host/db[?ssl-mode=verify_identity&ssl-ca=PATH]",
    open,
)
.with_default_port(3306);
