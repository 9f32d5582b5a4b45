//! The raw floor of ZooKeeper for the shared benchmark harness (feature `bench`).

use std::sync::Arc;

use async_trait::async_trait;
use distlock_bench::{BenchHooks, RawFloor, ServerCounter, Target, exchange, probe_error as error};
use distlock_core::{ClientConfig, Error, LockName};
use zookeeper_client as zk;

use crate::ZkConfig;
use crate::acl::node_acls;
use crate::keys::{ephemeral_sequential, persistent};
use crate::session::{connect_client, connector, create_base};

fn unavailable(what: &str, err: zk::Error) -> Error {
    Error::unavailable(format!("ZooKeeper {what}: {err}"), err)
}

/// The cheapest ZooKeeper lock cycle: create an ephemeral sequential node under the lock's
/// node, then delete it (two writes, each one round trip and one fsync). It connects as the
/// lock client does: with the same credentials (and the same restricted ACL on its nodes) and
/// over TLS when the configuration says so.
pub struct ZkFloor {
    client: zk::Client,
    acls: zk::Acls<'static>,
    config: ZkConfig,
    created: std::collections::HashSet<String>,
}

impl std::fmt::Debug for ZkFloor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkFloor")
            .field("hosts", &self.config.hosts())
            .field("digest_user", &self.config.digest_user())
            .field("tls", &self.config.tls().is_some())
            .finish_non_exhaustive()
    }
}

impl ZkFloor {
    /// Opens its own session.
    ///
    /// # Errors
    /// [`Error::Unavailable`] if no server answers; [`Error::InvalidConfig`] for unreadable
    /// TLS files.
    pub async fn connect(config: &ZkConfig) -> Result<Self, Error> {
        let client = connect_client(connector(config).await?, config)
            .await
            .map_err(|e| unavailable("connecting", e))?;
        Ok(Self {
            client,
            acls: node_acls(config.digest().is_some()),
            config: config.clone(),
            created: Default::default(),
        })
    }

    /// Runs `cycles` raw cycles on a scratch name, to warm the server's JVM up (the first
    /// ~1000 operations after a start run 2-4x slower).
    ///
    /// # Errors
    /// The first failed cycle.
    pub async fn warm_up(&mut self, cycles: u64) -> Result<(), Error> {
        for _ in 0..cycles {
            self.cycle("lock-zk-warm-up").await?;
        }
        Ok(())
    }

    /// The lock node of `name`, created (with the chroot and base) on first use.
    async fn lock_node(&mut self, name: &str) -> Result<String, Error> {
        let parent = self.config.lock_path(&LockName::new(name)?);
        if !self.created.contains(&parent) {
            // The chroot and base as the lock client creates them, then the lock node.
            create_base(&self.client, &self.config, self.acls).await?;
            match self
                .client
                .create(&parent, b"", &persistent(self.acls))
                .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(unavailable("creating the lock node", e)),
            }
            self.created.insert(parent.clone());
        }
        Ok(parent)
    }
}

/// The contended floor: one ephemeral node per lock, created by the winner; the others set an
/// `exists` watch and try again when it fires (every waiter wakes, a herd the size of the
/// run's clients). One write to acquire, one to release, no queue and no fencing.
#[async_trait]
impl distlock_bench::ContendedFloor for ZkFloor {
    fn label(&self) -> &str {
        "create ephemeral + exists watch + delete"
    }

    async fn acquire(&mut self, name: &str, wait: std::time::Duration) -> Result<(), Error> {
        let held = format!("{}/floor-held", self.lock_node(name).await?);
        let options = zk::CreateMode::Ephemeral.with_acls(self.acls);
        let client = &self.client;
        let take = async {
            loop {
                match client.create(&held, b"", &options).await {
                    Ok(_) => return Ok(()),
                    Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(unavailable("create", e)),
                }
                let (stat, watch) = client
                    .check_and_watch_stat(&held)
                    .await
                    .map_err(|e| unavailable("exists", e))?;
                if stat.is_some() {
                    watch.changed().await;
                }
            }
        };
        tokio::time::timeout(wait, take)
            .await
            .map_err(|_| Error::Timeout {
                name: name.to_owned(),
                waited: wait,
            })?
    }

    async fn release(&mut self, name: &str) -> Result<(), Error> {
        let held = format!("{}/floor-held", self.lock_node(name).await?);
        self.client
            .delete(&held, None)
            .await
            .map_err(|e| unavailable("delete", e))
    }
}

#[async_trait]
impl RawFloor for ZkFloor {
    fn label(&self) -> &str {
        "create ephemeral-sequential + delete"
    }

    async fn cycle(&mut self, name: &str) -> Result<(), Error> {
        let parent = self.lock_node(name).await?;
        let (_, seq) = self
            .client
            .create(
                &format!("{parent}/floor."),
                b"",
                &ephemeral_sequential(self.acls),
            )
            .await
            .map_err(|e| unavailable("create", e))?;
        self.client
            .delete(&format!("{parent}/floor.{seq}"), None)
            .await
            .map_err(|e| unavailable("delete", e))
    }
}

/// A benchmark target for `config`: every client opens its own session; the floor is
/// [`ZkFloor`].
pub fn target(label: &str, config: &ZkConfig) -> Target {
    let (clients, floor) = (Arc::new(config.clone()), Arc::new(config.clone()));
    Target::new(label, move || {
        let config = clients.clone();
        async move {
            let client = crate::connect_with((*config).clone(), ClientConfig::default()).await?;
            Ok(client.into_dyn())
        }
    })
    .with_floor({
        let config = floor.clone();
        move || {
            let config = config.clone();
            async move { Ok(Box::new(ZkFloor::connect(&config).await?) as Box<dyn RawFloor>) }
        }
    })
    .with_contended_floor(move || {
        let config = floor.clone();
        async move { contended(&config).await }
    })
}

async fn contended(config: &ZkConfig) -> Result<Box<dyn distlock_bench::ContendedFloor>, Error> {
    Ok(Box::new(ZkFloor::connect(config).await?))
}

/// The contended floor for a lock URL: [`ZkFloor`]'s ephemeral node with an `exists` watch.
/// `distlock bench` calls it.
///
/// # Errors
/// As [`floor`].
pub async fn contended_floor(url: &str) -> Result<Box<dyn distlock_bench::ContendedFloor>, Error> {
    contended(&ZkConfig::from_url(url)?).await
}

/// The raw floor for a lock URL: [`ZkFloor`]. `distlock bench` calls it.
///
/// # Errors
/// [`Error::InvalidConfig`] for a bad URL, [`Error::Unavailable`] when ZooKeeper cannot be
/// reached.
pub async fn floor(url: &str) -> Result<Box<dyn RawFloor>, Error> {
    let config = ZkConfig::from_url(url)?;
    Ok(Box::new(ZkFloor::connect(&config).await?))
}

/// The hooks of `zk://`: [`floor`], [`contended_floor`] and, without SASL, the server counter
/// ([`server_counter`]).
pub const ZK: BenchHooks = BenchHooks::new()
    .with_floor(|url| Box::pin(async move { floor(&url).await }))
    .with_contended_floor(|url| Box::pin(async move { contended_floor(&url).await }))
    .with_server_counter(
        |url| !url.contains("auth=sasl"),
        |url| Box::pin(async move { server_counter(&url) }),
    );

/// The hooks of `zks://`: the floors over TLS (`mntr` is read in plain text only).
#[cfg(feature = "tls")]
pub const ZKS: BenchHooks = BenchHooks::new()
    .with_floor(|url| Box::pin(async move { floor(&url).await }))
    .with_contended_floor(|url| Box::pin(async move { contended_floor(&url).await }));

/// The server's own request counter for `distlock bench --scenario hold`:
/// `zk_packets_received` of the `mntr` four-letter word (whitelisted by scripts/services.sh),
/// summed over the connect string's servers.
///
/// # Errors
/// None yet: the servers are read when the counter is.
pub fn server_counter(url: &str) -> Result<Box<dyn ServerCounter>, Error> {
    Ok(Box::new(Zk {
        hosts: distlock_bench::url_hosts(url, ZkConfig::DEFAULT_PORT).1,
    }))
}

/// ZooKeeper servers, read with `mntr`.
#[derive(Debug)]
struct Zk {
    hosts: Vec<String>,
}

#[async_trait]
impl ServerCounter for Zk {
    fn label(&self) -> &str {
        "ZooKeeper mntr zk_packets_received"
    }

    async fn read(&mut self) -> Result<u64, Error> {
        let mut total = 0;
        for host in &self.hosts {
            let reply = exchange(host, b"mntr").await?;
            let value = reply
                .lines()
                .find_map(|l| {
                    l.strip_prefix("zk_packets_received")?
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .ok_or_else(|| {
                    error(
                        host,
                        "no zk_packets_received in mntr (is mntr whitelisted?)",
                    )
                })?;
            total += value;
        }
        Ok(total)
    }
}
