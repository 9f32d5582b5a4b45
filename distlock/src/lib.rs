//! Distributed locks with fencing tokens, automatic renewal and loss detection, over Redis,
//! Redlock, etcd, ZooKeeper, PostgreSQL, MySQL/MariaDB and SQLite, behind one trait.
//!
//! The rest of this page is the project README; its Rust code runs as doc tests.
#![doc = ""]
#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod password_file;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

// What an application uses is at the root; the interface a backend implements
// (`LockBackend`, `Attempt`, `Step`, `Lease`, ...) is under `distlock::backend`.
pub use distlock_core::backend::{self, LockInfo};
pub use distlock_core::{
    AcquireOptions, Backoff, BoxError, Capabilities, ClientConfig, DistributedLock, Error,
    FencingGuarantee, FencingToken, Footprint, Leader, LockClient, LockGuard, LockKind, LockName,
    LossDetection, LossReason, MultiGuard, NodeOutcome, NodeResult, OwnerId, Renewal, Result,
    WakeUp, memory, service_url,
};

#[cfg(feature = "blocking")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocking")))]
pub mod blocking;
pub use distlock_core::telemetry;

/// The etcd backend (feature `etcd`).
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use distlock_etcd as etcd;
/// The Redis and Redlock backends (feature `redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use distlock_redis as redis;
/// The SQL backends (features `postgres`, `mysql`, `sqlite`).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use distlock_sql as sql;
/// The ZooKeeper backend (feature `zookeeper`).
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub use distlock_zookeeper as zookeeper;

/// Connects to the lock service at `url` with the default [`ClientConfig`].
///
/// Every backend with a password also takes the option `password_file=PATH`: the password is
/// read from that file once, here (its content without one trailing newline), so that it
/// never appears in a process's arguments or environment, and is never echoed.
///
/// # Errors
/// [`Error::InvalidConfig`] for a malformed URL, [`Error::Unsupported`] for a scheme whose
/// cargo feature is off or a `password_file` that cannot be read, and the backend's connection
/// errors.
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    connect_with(url, ClientConfig::default()).await
}

/// Connects to the lock service at `url` with the given client configuration.
///
/// # Errors
/// As [`connect`], plus [`Error::InvalidConfig`] for an invalid configuration.
pub async fn connect_with(url: &str, config: ClientConfig) -> Result<Arc<dyn DistributedLock>> {
    config.validate()?;
    // rustls has two crypto providers in this build: make ring the default before any backend
    // builds a TLS configuration.
    #[cfg(feature = "zookeeper-tls")]
    distlock_zookeeper::install_crypto_provider();
    let url = url.trim();
    let scheme = scheme_of(url)?.to_ascii_lowercase();
    let with_password = password_file::resolve(url, &scheme).await?;
    let url = with_password.as_deref().unwrap_or(url);
    match scheme.as_str() {
        "memory" => {
            let store = named_memory_store(url.get("memory://".len()..).unwrap_or_default());
            Ok(LockClient::with_config(memory::MemoryBackend::new(store), config)?.into_dyn())
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(distlock_sql::connect(url, config).await?.into_dyn()),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(distlock_sql::connect(url, config).await?.into_dyn()),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(distlock_sql::connect(url, config).await?.into_dyn()),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+unix" | "unix" | "redlock" | "redlocks" | "redis+sentinel"
        | "rediss+sentinel" | "redis+cluster" | "rediss+cluster" => {
            Ok(distlock_redis::connect(url, config).await?.into_dyn())
        }
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Ok(distlock_etcd::connect(url, config).await?.into_dyn()),
        #[cfg(feature = "zookeeper")]
        "zk" => Ok(distlock_zookeeper::connect(url, config).await?.into_dyn()),
        #[cfg(feature = "zookeeper-tls")]
        "zks" => Ok(distlock_zookeeper::connect(url, config).await?.into_dyn()),
        other => match feature_of(other) {
            Some(feature) => Err(Error::Unsupported(format!(
                "the {other}:// backend is not compiled in: enable the cargo feature `{feature}` of distlock"
            ))),
            None => Err(Error::InvalidConfig(format!(
                "unknown URL scheme {:?} in {}; expected one of {}",
                service_url::echo(other),
                service_url::redact(url),
                SCHEMES
                    .iter()
                    .flat_map(|s| s.names)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        },
    }
}

/// `url` with the option `password_file=PATH` added, for a password kept in a file (see
/// [`connect`]); the path is percent-encoded.
///
/// ```
/// let url = distlock::with_password_file("redis://app@10.0.0.5:6379", "/run/secrets/redis".as_ref());
/// assert_eq!(url, "redis://app@10.0.0.5:6379?password_file=%2Frun%2Fsecrets%2Fredis");
/// ```
pub fn with_password_file(url: &str, path: &std::path::Path) -> String {
    password_file::add_option(url, path)
}

/// One family of URL schemes that [`connect`] understands: the cargo feature that brings it
/// and whether this build has it. [`SCHEMES`] lists them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Scheme {
    /// The backend's short name, e.g. `redis`.
    pub backend: &'static str,
    /// The URL schemes, lower case (schemes are matched case-insensitively).
    pub names: &'static [&'static str],
    /// The cargo feature of `distlock` that compiles the backend in; `None`: always there.
    pub feature: Option<&'static str>,
    /// An example URL.
    pub example: &'static str,
    /// Whether this build has the backend.
    pub enabled: bool,
}

/// Every URL scheme family of [`connect`], in the order the docs list them.
///
/// ```
/// let compiled: Vec<&str> = distlock::SCHEMES
///     .iter()
///     .filter(|s| s.enabled)
///     .map(|s| s.backend)
///     .collect();
/// assert!(compiled.contains(&"memory"));
/// ```
pub const SCHEMES: &[Scheme] = &[
    Scheme {
        backend: "sqlite",
        names: &["sqlite"],
        feature: Some("sqlite"),
        example: "sqlite://PATH",
        enabled: cfg!(feature = "sqlite"),
    },
    Scheme {
        backend: "postgres",
        names: &["postgres", "postgresql"],
        feature: Some("postgres"),
        example: "postgres://user:pass@host/db[?sslmode=verify-full&sslrootcert=PATH]",
        enabled: cfg!(feature = "postgres"),
    },
    Scheme {
        backend: "mysql",
        names: &["mysql", "mariadb"],
        feature: Some("mysql"),
        example: "mysql://user:pass@host/db[?ssl-mode=verify_identity&ssl-ca=PATH]",
        enabled: cfg!(feature = "mysql"),
    },
    Scheme {
        backend: "redis",
        names: &["redis", "rediss", "redis+unix", "unix"],
        feature: Some("redis"),
        example: "redis://[user:pass@]host:port (rediss:// with TLS: ?ca=&cert=&key=)",
        enabled: cfg!(feature = "redis"),
    },
    Scheme {
        backend: "redlock",
        names: &["redlock", "redlocks"],
        feature: Some("redis"),
        example: "redlock://h1:p1,h2:p2,h3:p3 (redlocks:// with TLS)",
        enabled: cfg!(feature = "redis"),
    },
    Scheme {
        backend: "redis-sentinel",
        names: &["redis+sentinel", "rediss+sentinel"],
        feature: Some("redis"),
        example: "redis+sentinel://[user:pass@]s1:p1,s2:p2,s3:p3/master_name[/db]",
        enabled: cfg!(feature = "redis"),
    },
    Scheme {
        backend: "redis-cluster",
        names: &["redis+cluster", "rediss+cluster"],
        feature: Some("redis"),
        example: "redis+cluster://[user:pass@]h1:p1,h2:p2,h3:p3 (any nodes of the cluster)",
        enabled: cfg!(feature = "redis"),
    },
    Scheme {
        backend: "etcd",
        names: &["etcd", "etcds"],
        feature: Some("etcd"),
        example: "etcd://h1:p1,h2:p2 or etcds://user:pass@h1:p1?ca=PATH&cert=PATH&key=PATH",
        enabled: cfg!(feature = "etcd"),
    },
    Scheme {
        backend: "zookeeper",
        names: &["zk"],
        feature: Some("zookeeper"),
        example: "zk://[user:pass@]h1:p1,h2:p2[/chroot][?auth=sasl]",
        enabled: cfg!(feature = "zookeeper"),
    },
    Scheme {
        backend: "zookeeper",
        names: &["zks"],
        feature: Some("zookeeper-tls"),
        example: "zks://[user:pass@]h1:p1[/chroot]?ca=PATH (TLS)",
        enabled: cfg!(feature = "zookeeper-tls"),
    },
    Scheme {
        backend: "memory",
        names: &["memory"],
        feature: None,
        example: "memory://[NAME] (this process only)",
        enabled: true,
    },
];

fn scheme_of(url: &str) -> Result<&str> {
    if url
        .get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("sqlite:"))
    {
        return Ok("sqlite");
    }
    match url.split_once("://") {
        Some((scheme, _)) if !scheme.is_empty() => Ok(scheme),
        _ => Err(Error::InvalidConfig(format!(
            "{} is not a lock service URL: expected SCHEME://..., e.g. redis://127.0.0.1:6379",
            service_url::redact(url)
        ))),
    }
}

/// The cargo feature that provides a scheme.
fn feature_of(scheme: &str) -> Option<&'static str> {
    SCHEMES
        .iter()
        .find(|s| s.names.contains(&scheme))
        .and_then(|s| s.feature)
}

/// `memory://NAME` URLs with the same NAME share one store within the process.
fn named_memory_store(name: &str) -> memory::MemoryStore {
    static STORES: OnceLock<Mutex<HashMap<String, memory::MemoryStore>>> = OnceLock::new();
    let stores = STORES.get_or_init(Mutex::default);
    let mut stores = stores
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    stores.entry(name.to_owned()).or_default().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_urls_share_a_store_by_name() {
        let opts = AcquireOptions::default();
        let a = connect("memory://shared").await.unwrap();
        let b = connect("memory://shared").await.unwrap();
        let c = connect("memory://other").await.unwrap();
        let guard = a.try_acquire("x", &opts).await.unwrap().unwrap();
        assert!(b.try_acquire("x", &opts).await.unwrap().is_none());
        let other = c.try_acquire("x", &opts).await.unwrap().unwrap();
        guard.release().await.unwrap();
        other.release().await.unwrap();
    }

    #[test]
    fn every_scheme_connect_routes_has_a_table_row() {
        for scheme in [
            "sqlite",
            "postgresql",
            "mariadb",
            "rediss",
            "redis+unix",
            "redlock",
            "redlocks",
            "redis+sentinel",
            "rediss+cluster",
            "zk",
            "zks",
        ] {
            assert!(feature_of(scheme).is_some(), "{scheme}");
        }
        assert_eq!(feature_of("memory"), None);
        assert_eq!(feature_of("zk"), Some("zookeeper"));
        assert_eq!(feature_of("zks"), Some("zookeeper-tls"));
    }

    #[tokio::test]
    async fn bad_urls_are_explained() {
        for (url, needle) in [
            ("", "not a lock service URL"),
            ("127.0.0.1:6379", "not a lock service URL"),
            ("ftp://x", "unknown URL scheme"),
            (
                "ftp://x",
                "redlocks, redis+sentinel, rediss+sentinel, redis+cluster, rediss+cluster, etcd",
            ),
        ] {
            let err = connect(url).await.unwrap_err();
            assert!(matches!(err, Error::InvalidConfig(_)), "{url}: {err}");
            assert!(err.to_string().contains(needle), "{url}: {err}");
        }
    }
}
