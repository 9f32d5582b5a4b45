//! Distributed locks with fencing tokens, automatic renewal and loss detection, over Redis,
//! Redlock, etcd, ZooKeeper, PostgreSQL, MySQL/MariaDB and SQLite, behind one trait.
//!
//! The rest of this page is the project README; its Rust code runs as doc tests.
#![doc = ""]
#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod password_file;

use std::sync::Arc;

// What an application uses is at the root; the interface a backend implements
// (`LockBackend`, `Attempt`, `Step`, `Lease`, ...) is under `distlock::backend`.
pub use distlock_core::backend::{self, LockInfo};
pub use distlock_core::{
    AcquireOptions, Backoff, BoxError, Capabilities, ClientConfig, DistributedLock, Error,
    FencingGuarantee, FencingToken, Footprint, GatedGuard, Leader, LeaseView, LockClient,
    LockGuard, LockKind, LockName, LossDetection, LossReason, MAX_HOLDER_DATA, MultiGuard,
    NodeOutcome, NodeResult, OwnerId, Renewal, Result, UpgradeError, UpgradeableGuard,
    UpgradeableRwLock, WakeUp, WriteGuard, memory, service_url,
};
pub use distlock_core::{ConnectFn, Descriptor};

#[cfg(feature = "blocking")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocking")))]
pub mod blocking;
pub use distlock_core::telemetry;

/// The etcd backend (feature `etcd`).
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use distlock_etcd as etcd;
/// The NATS JetStream backend (feature `nats`).
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use distlock_nats as nats;
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
    let backend = backend_for(url)?;
    let with_password = password_file::resolve(url, backend).await?;
    backend
        .connect(with_password.as_deref().unwrap_or(url), config)
        .await
}

/// The backend that serves `url`'s scheme in this build.
///
/// ```
/// let backend = distlock::backend_for("memory://demo")?;
/// assert_eq!(backend.name(), "memory");
/// assert_eq!(backend.default_port(), None);
/// # Ok::<(), distlock::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidConfig`] for a URL without a scheme or with an unknown one,
/// [`Error::Unsupported`] for a scheme whose cargo feature is off (the message names it).
pub fn backend_for(url: &str) -> Result<&'static Descriptor> {
    let entry = find_backend(url)?;
    entry.descriptor.ok_or_else(|| {
        Error::Unsupported(format!(
            "the {}:// backend is not compiled in: enable the cargo feature `{}` of distlock",
            scheme_of(url.trim())
                .unwrap_or_default()
                .to_ascii_lowercase(),
            entry.feature.unwrap_or_default()
        ))
    })
}

/// The line of [`BACKENDS`] whose schemes include `url`'s, compiled in or not.
///
/// # Errors
/// [`Error::InvalidConfig`] for a URL without a scheme or with an unknown one.
pub fn find_backend(url: &str) -> Result<&'static Backend> {
    let scheme = scheme_of(url.trim())?;
    BACKENDS.iter().find(|b| b.serves(scheme)).ok_or_else(|| {
        Error::InvalidConfig(format!(
            "unknown URL scheme {:?} in {}; expected one of {}",
            service_url::echo(scheme),
            service_url::redact(url),
            BACKENDS
                .iter()
                .flat_map(|b| b.schemes)
                .copied()
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
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

/// One line of the registry of backends ([`BACKENDS`]): a family of URL schemes, the cargo
/// feature of distlock that compiles its backend in, and the backend's own [`Descriptor`]
/// when this build has it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Backend {
    /// The cargo feature of `distlock` that compiles the backend in; `None`: always there.
    pub feature: Option<&'static str>,
    /// The URL schemes, lower case (as the descriptor has them, for a build without it).
    pub schemes: &'static [&'static str],
    /// What the backend declares about itself; `None` when its feature is off.
    pub descriptor: Option<&'static Descriptor>,
    /// Its hooks for the benchmark harness (feature `bench`).
    #[cfg(feature = "bench")]
    #[cfg_attr(docsrs, doc(cfg(feature = "bench")))]
    pub bench: Option<&'static distlock_bench::BenchHooks>,
}

impl Backend {
    /// Whether `scheme` (any case) is one of its URL schemes.
    #[must_use]
    pub fn serves(&self, scheme: &str) -> bool {
        self.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme))
    }
}

/// The registry: one line per backend (per family of URL schemes), `"feature" [schemes] =>
/// crate::DESCRIPTOR`; the descriptor's bench hooks are `crate::bench::DESCRIPTOR`. A test
/// checks that each line's schemes are its descriptor's.
macro_rules! registry {
    ($($feature:literal [$($scheme:literal),+] => $krate:ident :: $name:ident,)+) => {
        /// Every backend [`connect`] knows, in the order the docs list them: the in-memory one
        /// first, then one line per backend crate's [`Descriptor`], compiled in or not.
        ///
        /// ```
        /// let compiled: Vec<&str> = distlock::BACKENDS
        ///     .iter()
        ///     .filter_map(|b| b.descriptor)
        ///     .map(|d| d.name())
        ///     .collect();
        /// assert!(compiled.contains(&"memory"));
        /// ```
        pub const BACKENDS: &[Backend] = &[
            Backend {
                feature: None,
                schemes: memory::DESCRIPTOR.schemes(),
                descriptor: Some(&memory::DESCRIPTOR),
                #[cfg(feature = "bench")]
                bench: None,
            },
            $(Backend {
                feature: Some($feature),
                schemes: &[$($scheme),+],
                #[cfg(feature = $feature)]
                descriptor: Some(&$krate::$name),
                #[cfg(not(feature = $feature))]
                descriptor: None,
                #[cfg(all(feature = "bench", feature = $feature))]
                bench: Some(&$krate::bench::$name),
                #[cfg(all(feature = "bench", not(feature = $feature)))]
                bench: None,
            },)+
        ];
    };
}

registry! {
    "sqlite" ["sqlite"] => distlock_sql::SQLITE,
    "postgres" ["postgres", "postgresql"] => distlock_sql::POSTGRES,
    "mysql" ["mysql", "mariadb"] => distlock_sql::MYSQL,
    "redis" ["redis", "rediss", "redis+unix", "unix"] => distlock_redis::REDIS,
    "redis" ["redlock", "redlocks"] => distlock_redis::REDLOCK,
    "redis" ["redis+sentinel", "rediss+sentinel"] => distlock_redis::SENTINEL,
    "redis" ["redis+cluster", "rediss+cluster"] => distlock_redis::CLUSTER,
    "etcd" ["etcd", "etcds"] => distlock_etcd::ETCD,
    "zookeeper" ["zk"] => distlock_zookeeper::ZK,
    "zookeeper-tls" ["zks"] => distlock_zookeeper::ZKS,
    "nats" ["nats", "tls", "nats+tls"] => distlock_nats::NATS,
}

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
    fn each_registry_line_has_its_descriptors_schemes() {
        for backend in BACKENDS {
            if let Some(descriptor) = backend.descriptor {
                assert_eq!(backend.schemes, descriptor.schemes(), "{descriptor:?}");
            }
        }
        let feature = |scheme: &str| BACKENDS.iter().find(|b| b.serves(scheme))?.feature;
        assert_eq!(feature("memory"), None);
        assert_eq!(feature("ZK"), Some("zookeeper"));
        assert_eq!(feature("zks"), Some("zookeeper-tls"));
        assert_eq!(feature("redlocks"), Some("redis"));
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
