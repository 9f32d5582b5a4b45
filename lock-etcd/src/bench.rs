//! The raw floors of etcd for the shared benchmark harness (feature `bench`).

use async_trait::async_trait;
use distlock_bench::{BenchHooks, RawFloor, ServerCounter, Target, http_get};
use distlock_core::{ClientConfig, Error};
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

use crate::{EtcdBackend, EtcdConfig};

/// How long a floor waits for its connection (TLS handshake and authentication included).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn unavailable(what: &str, err: etcd_client::Error) -> Error {
    Error::unavailable(format!("{what}: {err}"), err)
}

/// The cheapest correct etcd lock cycle: a transaction that creates the key only if it does
/// not exist, then a delete (two raft rounds).
pub struct TxnFloor {
    client: Client,
    prefix: String,
}

impl TxnFloor {
    /// Connects its own client to `config`'s endpoints, the way the lock client connects (TLS
    /// and user included, so a TLS target is measured next to a TLS floor).
    ///
    /// # Errors
    /// As [`EtcdBackend::connect`].
    pub async fn connect(config: &EtcdConfig) -> Result<Self, Error> {
        let client = EtcdBackend::connect_client(config, CONNECT_TIMEOUT).await?;
        Ok(Self {
            client,
            prefix: format!("{}/floor/", config.prefix()),
        })
    }
}

#[async_trait]
impl RawFloor for TxnFloor {
    fn label(&self) -> &str {
        "txn create-if-absent + delete"
    }

    async fn cycle(&mut self, name: &str) -> Result<(), Error> {
        let key = format!("{}{name}", self.prefix);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), "floor", None)]);
        let resp = self
            .client
            .txn(txn)
            .await
            .map_err(|e| unavailable("txn", e))?;
        if !resp.succeeded() {
            return Err(Error::Backend {
                message: format!("{key:?} already exists"),
                source: None,
            });
        }
        self.client
            .delete(key, None)
            .await
            .map_err(|e| unavailable("delete", e))?;
        Ok(())
    }
}

/// etcd's own Lock API (v3lockpb): `lock` with a session lease granted once, then `unlock`.
pub struct LockApiFloor {
    client: Client,
    lease: i64,
    prefix: String,
    /// The key `lock` answered, while held as a contended floor.
    held: Option<Vec<u8>>,
}

impl LockApiFloor {
    /// Connects its own client and grants its session lease (60 s, not renewed: a benchmark
    /// run is shorter).
    ///
    /// # Errors
    /// As [`EtcdBackend::connect`], and [`Error::Unavailable`] if the lease cannot be granted.
    pub async fn connect(config: &EtcdConfig) -> Result<Self, Error> {
        let mut client = EtcdBackend::connect_client(config, CONNECT_TIMEOUT).await?;
        let lease = client
            .lease_grant(60, None)
            .await
            .map_err(|e| unavailable("lease grant", e))?
            .id();
        Ok(Self {
            client,
            lease,
            prefix: format!("{}/lockapi/", config.prefix()),
            held: None,
        })
    }
}

#[async_trait]
impl RawFloor for LockApiFloor {
    fn label(&self) -> &str {
        "etcd Lock API lock + unlock"
    }

    async fn cycle(&mut self, name: &str) -> Result<(), Error> {
        let options = etcd_client::LockOptions::new().with_lease(self.lease);
        let resp = self
            .client
            .lock(format!("{}{name}", self.prefix), Some(options))
            .await
            .map_err(|e| unavailable("lock", e))?;
        self.client
            .unlock(resp.key().to_vec())
            .await
            .map_err(|e| unavailable("unlock", e))?;
        Ok(())
    }
}

/// As the contended floor, etcd's Lock API queues the waiters on the server (each watches the
/// key created just before its own) and answers `lock` when the caller's key is the oldest.
#[async_trait]
impl distlock_bench::ContendedFloor for LockApiFloor {
    fn label(&self) -> &str {
        "etcd Lock API lock + unlock"
    }

    async fn acquire(&mut self, name: &str, wait: std::time::Duration) -> Result<(), Error> {
        let options = etcd_client::LockOptions::new().with_lease(self.lease);
        let lock = self
            .client
            .lock(format!("{}{name}", self.prefix), Some(options));
        let resp = tokio::time::timeout(wait, lock)
            .await
            .map_err(|_| Error::Timeout {
                name: name.to_owned(),
                waited: wait,
            })?
            .map_err(|e| unavailable("lock", e))?;
        self.held = Some(resp.key().to_vec());
        Ok(())
    }

    async fn release(&mut self, name: &str) -> Result<(), Error> {
        let key = self.held.take().ok_or_else(|| Error::NotHeld {
            name: name.to_owned(),
        })?;
        self.client
            .unlock(key)
            .await
            .map_err(|e| unavailable("unlock", e))?;
        Ok(())
    }
}

impl std::fmt::Debug for TxnFloor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxnFloor")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for LockApiFloor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockApiFloor")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// A benchmark target: distlock over etcd at `config`, next to [`TxnFloor`].
pub fn target(label: &str, config: &EtcdConfig) -> Target {
    let (a, b) = (config.clone(), config.clone());
    Target::new(label, move || {
        let config = a.clone();
        async move {
            let client = crate::connect_with(config, ClientConfig::default()).await?;
            Ok(client.into_dyn())
        }
    })
    .with_floor({
        let config = b.clone();
        move || {
            let config = config.clone();
            async move { Ok(Box::new(TxnFloor::connect(&config).await?) as Box<dyn RawFloor>) }
        }
    })
    .with_contended_floor(move || {
        let config = b.clone();
        async move {
            Ok(Box::new(LockApiFloor::connect(&config).await?)
                as Box<dyn distlock_bench::ContendedFloor>)
        }
    })
}

/// The same target next to [`LockApiFloor`] instead.
pub fn lock_api_target(label: &str, config: &EtcdConfig) -> Target {
    let (a, b) = (config.clone(), config.clone());
    Target::new(label, move || {
        let config = a.clone();
        async move {
            let client = crate::connect_with(config, ClientConfig::default()).await?;
            Ok(client.into_dyn())
        }
    })
    .with_floor(move || {
        let config = b.clone();
        async move { Ok(Box::new(LockApiFloor::connect(&config).await?) as Box<dyn RawFloor>) }
    })
}

/// The contended floor for a lock URL: [`LockApiFloor`] (its lease lasts 60 s, longer than
/// S2). `distlock bench` calls it.
///
/// # Errors
/// As [`LockApiFloor::connect`].
pub async fn contended_floor(url: &str) -> Result<Box<dyn distlock_bench::ContendedFloor>, Error> {
    let config = EtcdConfig::from_url(url)?;
    Ok(Box::new(LockApiFloor::connect(&config).await?))
}

/// The raw floor for a lock URL (`etcd://` or `etcds://`, user included): [`TxnFloor`].
/// `distlock bench` calls it.
///
/// # Errors
/// [`Error::InvalidConfig`] for a bad URL, and the errors of [`EtcdBackend::connect`].
pub async fn floor(url: &str) -> Result<Box<dyn RawFloor>, Error> {
    let config = EtcdConfig::from_url(url)?;
    Ok(Box::new(TxnFloor::connect(&config).await?))
}

/// etcd's hooks: [`floor`], [`contended_floor`] (the Lock API) and, on plain HTTP endpoints,
/// the server counter ([`server_counter`]).
pub const ETCD: BenchHooks = BenchHooks::new()
    .with_floor(|url| Box::pin(async move { floor(&url).await }))
    .with_contended_floor(|url| Box::pin(async move { contended_floor(&url).await }))
    .with_server_counter(
        |url| url.starts_with("etcd://"),
        |url| Box::pin(async move { server_counter(&url) }),
    );

/// The server's own request counter for `distlock bench --scenario hold`: the sum of
/// `grpc_server_msg_received_total` on each endpoint's `/metrics` (plain HTTP): every request
/// message, unary or on a stream (a lease keep-alive on a stream counts once per message,
/// where `grpc_server_handled_total` would count the stream once, at its end).
///
/// # Errors
/// None yet: the endpoints are read when the counter is.
pub fn server_counter(url: &str) -> Result<Box<dyn ServerCounter>, Error> {
    Ok(Box::new(Etcd {
        hosts: distlock_bench::url_hosts(url, crate::DEFAULT_PORT).1,
    }))
}

/// etcd endpoints, read over plain HTTP.
#[derive(Debug)]
struct Etcd {
    hosts: Vec<String>,
}

#[async_trait]
impl ServerCounter for Etcd {
    fn label(&self) -> &str {
        "etcd grpc_server_msg_received_total"
    }

    async fn read(&mut self) -> Result<u64, Error> {
        let mut total = 0.0;
        for host in &self.hosts {
            let body = http_get(host, "/metrics").await?;
            total += body
                .lines()
                .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
        }
        // Counter values are integers printed as floats.
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a sum of non-negative integer counters"
        )]
        Ok(total as u64)
    }
}
