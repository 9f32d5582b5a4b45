//! How the one logical master of a lock is found: fixed (`redis://`), named by Sentinels
//! (`redis+sentinel://`, followed across failovers) or the master of the lock's slot in a
//! Redis Cluster (`redis+cluster://`, routed by the client library's cluster client).
//!
//! [`Conn`] is what the lock scripts run on (a `ConnectionLike` for all three), [`Endpoint`]
//! tells the pub/sub subscriber, the restart watch and the observers where to connect now.
//! Sentinel's master is followed in `sentinel.rs`, a cluster's slots are mapped in
//! `cluster.rs`.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::{Error, Result};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::RedisConfig;
use crate::node::NodeTls;

mod cluster;
mod sentinel;

pub(crate) use cluster::ClusterTopology;
pub(crate) use sentinel::{Lane, SentinelMaster};

/// Taken by the unit tests that use the test Sentinel group's servers: one stops its
/// replicas, which another's requests to a replica would wait on.
#[cfg(test)]
pub(crate) static SENTINEL_GROUP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The connection the lock commands run on.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One master (single-master and Redlock nodes): the auto-reconnecting manager.
    Direct(ConnectionManager),
    /// The master the Sentinels name now, on one of its two connections.
    Sentinel(Arc<SentinelMaster>, Lane),
    /// A Redis Cluster (MOVED/ASK and topology refresh by the client library).
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Direct(_) => "Conn::Direct",
            Self::Sentinel(..) => "Conn::Sentinel",
            Self::Cluster(_) => "Conn::Cluster",
        })
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Direct(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
            Self::Sentinel(master, lane) => {
                let (master, lane) = (master.clone(), *lane);
                Box::pin(async move {
                    let mut conn = master.connection(lane);
                    let result = conn.req_packed_command(cmd).await;
                    master.check(result.as_ref().map(std::slice::from_ref));
                    result
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Direct(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Sentinel(master, lane) => {
                let (master, lane) = (master.clone(), *lane);
                Box::pin(async move {
                    let mut conn = master.connection(lane);
                    let result = conn.req_packed_commands(cmd, offset, count).await;
                    master.check(result.as_ref().map(Vec::as_slice));
                    result
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Direct(conn) => conn.get_db(),
            Self::Cluster(_) => 0,
            Self::Sentinel(master, _) => master.template.db,
        }
    }
}

/// Where a node's background connections (pub/sub wake-ups, the restart watch, observers)
/// go.
#[derive(Clone, Debug)]
pub(crate) enum Endpoint {
    Fixed(Box<redis::Client>),
    Sentinel(Arc<SentinelMaster>),
    Cluster(Arc<ClusterTopology>),
}

impl Endpoint {
    /// The cluster master whose connection subscribes `channel` (the master that serves its
    /// slot, as last read; no read here): `None` for a single master or the Sentinels' (one
    /// connection), and for a cluster whose slots are not known.
    pub(crate) fn pubsub_shard(&self, channel: &str) -> Option<String> {
        match self {
            Self::Fixed(_) | Self::Sentinel(_) => None,
            Self::Cluster(topology) => topology.cached_master_for(channel),
        }
    }

    /// The server to subscribe release wake-ups on: the master; in a cluster the master
    /// `shard` (where the scripts publish) while it serves slots as last read, every other
    /// attempt (`attempt` counts the failed ones) and any other node in between; else any
    /// node, the next one after each failure (classic `PUBLISH` reaches every node of a
    /// cluster).
    pub(crate) fn pubsub_client(
        &self,
        shard: Option<&str>,
        attempt: usize,
    ) -> Option<redis::Client> {
        match self {
            Self::Fixed(client) => Some((**client).clone()),
            Self::Sentinel(master) => Some(master.client()),
            Self::Cluster(topology) => match shard {
                Some(addr) if attempt.is_multiple_of(2) && topology.is_master(addr) => {
                    topology.client_for(addr).ok()
                }
                Some(addr) => topology.any_node(attempt / 2, Some(addr)),
                None => topology.any_node(attempt, None),
            },
        }
    }

    /// Reads a cluster's slots again in the background, at most once a second (nothing
    /// elsewhere): after a failure to reach a node, which a failover may have replaced.
    pub(crate) fn refresh_later(&self) {
        if let Self::Cluster(topology) = self {
            topology.refresh_later();
        }
    }

    /// The master that serves `key` now (observers track their keys there).
    pub(crate) async fn master_for(&self, key: &str) -> Option<redis::Client> {
        match self {
            Self::Fixed(client) => Some((**client).clone()),
            Self::Sentinel(master) => Some(master.client()),
            Self::Cluster(topology) => {
                // Read afresh: a failover may have moved the slot since the last read.
                let _ = topology.refresh().await;
                let addr = topology.master_addr_for(key).await?;
                topology.client_for(&addr).ok()
            }
        }
    }
}

/// Makes the clients of data nodes found at run time (a new master, cluster nodes): the
/// scheme, credentials, database and TLS settings of the URL, another address.
#[derive(Clone, Debug)]
pub(crate) struct NodeTemplate {
    base: url::Url,
    tls: NodeTls,
    name: String,
    pub(crate) db: i64,
}

impl NodeTemplate {
    pub(crate) fn new(first_node: &str, tls: NodeTls, config: &RedisConfig) -> Result<Self> {
        let base = url::Url::parse(first_node).map_err(|e| {
            Error::InvalidConfig(format!(
                "invalid node URL {}: {e}",
                distlock_core::service_url::redact(first_node)
            ))
        })?;
        let db = base
            .path()
            .trim_start_matches('/')
            .parse::<i64>()
            .unwrap_or(0);
        Ok(Self {
            base,
            tls,
            name: config.client_name.clone(),
            db,
        })
    }

    /// The URL of the data node at `host:port`.
    fn url(&self, host: &str, port: u16) -> String {
        let mut url = self.base.clone();
        let _ = url.set_host(Some(host));
        let _ = url.set_port(Some(port));
        url.into()
    }

    /// The client of the data node at `host:port`.
    pub(crate) fn client(&self, host: &str, port: u16) -> Result<redis::Client> {
        self.tls.client(&self.url(host, port), &self.name)
    }

    /// The client of a Sentinel at `host:port`: the URL's scheme and TLS, no credentials, no
    /// database.
    fn sentinel_client(&self, host: &str, port: u16) -> Result<redis::Client> {
        let mut url = self.base.clone();
        let _ = url.set_host(Some(host));
        let _ = url.set_port(Some(port));
        let _ = url.set_username("");
        let _ = url.set_password(None);
        url.set_path("");
        self.tls.client(url.as_str(), &self.name)
    }
}

/// `host:port` of a node URL.
fn host_port(url: &str) -> Option<(String, u16)> {
    let parsed = url::Url::parse(url).ok()?;
    let host = parsed.host_str()?.trim_matches(['[', ']']).to_owned();
    Some((host, parsed.port().unwrap_or(6379)))
}

fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100))
}
