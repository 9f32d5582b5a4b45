//! Redis Cluster (`redis+cluster://`): the client library's cluster connection for the lock
//! commands, and this crate's own map of which master serves which slots.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::backend::unpoisoned as lock;
use distlock_core::{Error, Result};
use redis::Value;
use redis::cluster_async::ClusterConnection;

use super::{NodeTemplate, host_port};
use crate::RedisConfig;
use crate::error::RedisError;
use crate::node::NodeTls;
use crate::restart::Restarts;

/// A Redis Cluster: the client library's cluster connection for the lock commands, and this
/// crate's own view of which master serves which slots (for the restart and failover watch
/// of each master, observers, listing and wake-ups).
pub(crate) struct ClusterTopology {
    pub(crate) conn: ClusterConnection,
    /// With `wait_replicas`, the `WAIT` lane (see [`Lane::Waits`](super::Lane::Waits)): a
    /// connection set of its own; else the lock commands' connection.
    pub(crate) waits: ClusterConnection,
    template: NodeTemplate,
    seeds: Vec<(String, u16)>,
    timeout: Duration,
    /// Slot ranges and the `host:port` of their master, from `CLUSTER SLOTS`.
    map: Mutex<Vec<(u16, u16, String)>>,
    /// Every node `CLUSTER SLOTS` named, masters and replicas (pub/sub may use any).
    nodes: Mutex<Vec<(String, u16)>>,
    /// The restart and failover watch of each master that serves guards.
    watches: Mutex<HashMap<String, Arc<Restarts>>>,
    /// When [`Self::refresh_later`] last started a read.
    last_background_refresh: Mutex<Option<Instant>>,
}

/// The least time between two background reads of the slots ([`ClusterTopology::refresh_later`]).
const REFRESH_SPACING: Duration = Duration::from_secs(1);

impl std::fmt::Debug for ClusterTopology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTopology")
            .field("seeds", &self.seeds)
            .finish_non_exhaustive()
    }
}

impl ClusterTopology {
    /// Connects to the cluster through the seed nodes `config.nodes` and reads its slots.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no seed answers within `timeout`.
    pub(crate) async fn connect(
        config: &RedisConfig,
        tls: NodeTls,
        timeout: Duration,
    ) -> Result<Arc<Self>> {
        let template = NodeTemplate::new(&config.nodes[0], tls.clone(), config)?;
        let mut seeds = Vec::new();
        for node in &config.nodes {
            seeds.push(host_port(node).ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "invalid cluster node {}",
                    distlock_core::service_url::redact(node)
                ))
            })?);
        }
        let shown = seeds
            .iter()
            .map(|(h, p)| format!("{h}:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let infos = config
            .nodes
            .iter()
            .map(|url| {
                use redis::IntoConnectionInfo;
                url.as_str().into_connection_info()
            })
            .collect::<redis::RedisResult<Vec<_>>>()
            .map_err(|e| {
                Error::InvalidConfig(format!("invalid cluster node URL ({shown}): {e}"))
            })?;
        let mut builder = redis::cluster::ClusterClientBuilder::new(infos)
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(4)
            .min_retry_wait(10)
            .max_retry_wait(200);
        if config.is_tls() {
            builder =
                builder
                    .tls(if tls.skip_verify {
                        redis::TlsMode::Insecure
                    } else {
                        redis::TlsMode::Secure
                    })
                    .certs(redis::TlsCertificates {
                        client_tls: tls.material.identity.clone().map(
                            |(client_cert, client_key)| redis::ClientTlsConfig {
                                client_cert,
                                client_key,
                            },
                        ),
                        root_cert: tls.material.ca_pem.clone(),
                    });
        }
        let client = builder.build().map_err(|e| {
            Error::InvalidConfig(format!(
                "invalid Redis Cluster configuration ({shown}): {e}"
            ))
        })?;
        let connect = async || {
            tokio::time::timeout(timeout, client.get_async_connection())
                .await
                .unwrap_or_else(|_| {
                    Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "connect timed out",
                    )))
                })
                .map_err(|e| RedisError::classify(&shown, e).into_lock_error("connect"))
        };
        let (conn, waits) = if config.wait_replicas > 0 {
            tokio::try_join!(connect(), connect())?
        } else {
            let conn = connect().await?;
            (conn.clone(), conn)
        };
        let topology = Arc::new(Self {
            conn,
            waits,
            template,
            seeds,
            timeout,
            map: Mutex::new(Vec::new()),
            nodes: Mutex::new(Vec::new()),
            watches: Mutex::new(HashMap::new()),
            last_background_refresh: Mutex::new(None),
        });
        if let Err(e) = topology.refresh().await {
            return Err(e.into_lock_error("read the cluster's slots"));
        }
        // Names the connections (CLIENT SETNAME goes to every node), for CLIENT LIST.
        let named = if config.wait_replicas > 0 { 2 } else { 1 };
        for mut conn in [topology.conn.clone(), topology.waits.clone()]
            .into_iter()
            .take(named)
        {
            let _ = tokio::time::timeout(
                timeout,
                redis::cmd("CLIENT")
                    .arg("SETNAME")
                    .arg(&config.client_name)
                    .query_async::<Value>(&mut conn),
            )
            .await;
        }
        Ok(topology)
    }

    /// Reads `CLUSTER SLOTS` (from any node that answers: the cluster connection's, then the
    /// seeds and known nodes one by one).
    pub(crate) async fn refresh(&self) -> std::result::Result<(), RedisError> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let mut conn = self.conn.clone();
        let answer = tokio::time::timeout(self.timeout, cmd.query_async::<Value>(&mut conn)).await;
        let value = match answer {
            Ok(Ok(value)) => value,
            _ => {
                let mut candidates = self.seeds.clone();
                candidates.extend(lock(&self.nodes).iter().cloned());
                let mut found = None;
                let mut failure = RedisError::timeout("cluster");
                for (host, port) in candidates {
                    let Ok(client) = self.template.client(&host, port) else {
                        continue;
                    };
                    let ask = async {
                        let mut conn = client.get_multiplexed_async_connection().await?;
                        cmd.query_async::<Value>(&mut conn).await
                    };
                    match tokio::time::timeout(self.timeout / 4, ask).await {
                        Ok(Ok(value)) => {
                            found = Some(value);
                            break;
                        }
                        Ok(Err(e)) => failure = RedisError::classify(&host, e),
                        Err(_) => failure = RedisError::timeout(&host),
                    }
                }
                found.ok_or(failure)?
            }
        };
        let (map, nodes) = parse_slots(&value);
        if !map.is_empty() {
            *lock(&self.map) = map;
            *lock(&self.nodes) = nodes;
        }
        Ok(())
    }

    /// The `host:port` of the master that serves `slot`, as last read.
    fn master_of(&self, slot: u16) -> Option<String> {
        lock(&self.map)
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|(_, _, addr)| addr.clone())
    }

    /// Reads the slots again in the background, unless a read started less than
    /// [`REFRESH_SPACING`] ago (or no runtime runs).
    pub(crate) fn refresh_later(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut last = lock(&self.last_background_refresh);
            if last.is_some_and(|at| at.elapsed() < REFRESH_SPACING) {
                return;
            }
            *last = Some(Instant::now());
        }
        let topology = self.clone();
        runtime.spawn(async move {
            let _ = topology.refresh().await;
        });
    }

    /// Whether `addr` serves any slot as a master, as last read.
    pub(crate) fn is_master(&self, addr: &str) -> bool {
        lock(&self.map).iter().any(|(_, _, a)| a == addr)
    }

    /// The `host:port` of the master that serves `key` (reading the slots if not known).
    pub(crate) async fn master_addr_for(&self, key: &str) -> Option<String> {
        let slot = key_slot(key.as_bytes());
        if let Some(addr) = self.master_of(slot) {
            return Some(addr);
        }
        self.refresh().await.ok()?;
        self.master_of(slot)
    }

    /// The `host:port` of the master that serves `key` as last read (no read: `None` when the
    /// slot is not in the map).
    pub(crate) fn cached_master_for(&self, key: &str) -> Option<String> {
        self.master_of(key_slot(key.as_bytes()))
    }

    /// A client of the node `host:port`.
    pub(crate) fn client_for(&self, addr: &str) -> Result<redis::Client> {
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse().ok()?)))
            .ok_or_else(|| Error::InvalidConfig(format!("bad node address {addr}")))?;
        self.template.client(host, port)
    }

    /// A client of one node of the cluster (other than `except`, a `host:port`), the
    /// `attempt`-th in turn.
    pub(super) fn any_node(&self, attempt: usize, except: Option<&str>) -> Option<redis::Client> {
        let mut nodes = lock(&self.nodes).clone();
        if nodes.is_empty() {
            nodes.clone_from(&self.seeds);
        }
        if let Some(except) = except {
            nodes.retain(|(host, port)| format!("{host}:{port}") != except);
        }
        let (host, port) = nodes.get(attempt % nodes.len().max(1))?;
        self.template.client(host, *port).ok()
    }

    /// Every master's `host:port`, as last read.
    pub(crate) fn masters(&self) -> Vec<String> {
        let mut masters: Vec<String> = lock(&self.map).iter().map(|(_, _, a)| a.clone()).collect();
        masters.sort();
        masters.dedup();
        masters
    }

    /// The restart and failover watch of the master that serves `key` now.
    pub(crate) async fn restarts_for(self: &Arc<Self>, key: &str) -> Option<Arc<Restarts>> {
        let addr = self.master_addr_for(key).await?;
        let mut watches = lock(&self.watches);
        if let Some(restarts) = watches.get(&addr)
            && !restarts.is_gone()
        {
            return Some(restarts.clone());
        }
        let client = self.client_for(&addr).ok()?;
        let restarts = Arc::new(Restarts::cluster_master(
            Arc::downgrade(self),
            addr.clone(),
            client,
            self.timeout,
        ));
        watches.insert(addr, restarts.clone());
        Some(restarts)
    }

    /// The watch of the master that serves `key` as last read, when it already confirmed that
    /// address a master and still watches it (see [`Restarts::confirmed`]): no read of the
    /// slots and no new watch. A guard of that master then joins the watch's loss epochs
    /// instead of a loss future of its own ([`Restarts::shared_loss`]).
    pub(crate) fn confirmed_watch_for(&self, key: &str) -> Option<Arc<Restarts>> {
        let addr = self.cached_master_for(key)?;
        let restarts = lock(&self.watches).get(&addr)?.clone();
        (restarts.confirmed() && !restarts.is_gone() && restarts.watchable()).then_some(restarts)
    }

    /// Whether `addr` still serves slots as a master: `None` when the slots cannot be read.
    pub(crate) async fn still_master(&self, addr: &str) -> Option<bool> {
        self.refresh().await.ok()?;
        Some(self.is_master(addr))
    }
}

/// The slot ranges with their master's `host:port`, and every node, of a `CLUSTER SLOTS`
/// answer.
#[allow(clippy::type_complexity, reason = "two plain lists, named in the doc")]
fn parse_slots(value: &Value) -> (Vec<(u16, u16, String)>, Vec<(String, u16)>) {
    let mut map = Vec::new();
    let mut nodes = Vec::new();
    let Value::Array(ranges) = value else {
        return (map, nodes);
    };
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end))) = (fields.first(), fields.get(1))
        else {
            continue;
        };
        for (i, node) in fields.iter().skip(2).enumerate() {
            let Value::Array(node) = node else { continue };
            let host = match node.first() {
                Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
                Some(Value::SimpleString(host)) => host.clone(),
                _ => continue,
            };
            let Some(Value::Int(port)) = node.get(1) else {
                continue;
            };
            let Ok(port) = u16::try_from(*port) else {
                continue;
            };
            if i == 0
                && let (Ok(start), Ok(end)) = (u16::try_from(*start), u16::try_from(*end))
            {
                map.push((start, end, format!("{host}:{port}")));
            }
            if !nodes.contains(&(host.clone(), port)) {
                nodes.push((host, port));
            }
        }
    }
    (map, nodes)
}

/// The cluster slot of a key: CRC16 (XMODEM) of its hash tag (or the whole key), mod 16384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for byte in tagged {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_follow_the_hash_tag() {
        // Known values (CLUSTER KEYSLOT).
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"{}x"), key_slot(b"{}x"));
    }
}
