//! How the one logical master of a lock is found: fixed (`redis://`), named by Sentinels
//! (`redis+sentinel://`, followed across failovers) or the master of the lock's slot in a
//! Redis Cluster (`redis+cluster://`, routed by the client library's cluster client).
//!
//! [`Conn`] is what the lock scripts run on (a `ConnectionLike` for all three), [`Endpoint`]
//! tells the pub/sub subscriber, the restart watch and the observers where to connect now.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use distlock_core::backend::unpoisoned as lock;
use distlock_core::{Error, Result};
use futures::StreamExt;
use futures::future::join_all;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tokio::task::AbortHandle;

use crate::RedisConfig;
use crate::error::RedisError;
use crate::node::NodeTls;
use crate::restart::Restarts;

/// The connection the lock commands run on.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One master (single-master and Redlock nodes): the auto-reconnecting manager.
    Direct(ConnectionManager),
    /// The master the Sentinels name now.
    Sentinel(Arc<SentinelMaster>),
    /// A Redis Cluster (MOVED/ASK and topology refresh by the client library).
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Direct(_) => "Conn::Direct",
            Self::Sentinel(_) => "Conn::Sentinel",
            Self::Cluster(_) => "Conn::Cluster",
        })
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Direct(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
            Self::Sentinel(master) => {
                let master = master.clone();
                Box::pin(async move {
                    let mut conn = master.connection();
                    let result = conn.req_packed_command(cmd).await;
                    master.check(result.as_ref().err());
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
            Self::Sentinel(master) => {
                let master = master.clone();
                Box::pin(async move {
                    let mut conn = master.connection();
                    let result = conn.req_packed_commands(cmd, offset, count).await;
                    master.check(result.as_ref().err());
                    result
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Direct(conn) => conn.get_db(),
            Self::Cluster(_) => 0,
            Self::Sentinel(master) => master.template.db,
        }
    }
}

impl Conn {
    /// Runs `cmd` (keyless, e.g. `WAIT`) on the master that serves `key` (a plain command
    /// elsewhere), on the same connection as the lock's own commands.
    pub(crate) async fn on_master_of(&self, key: &str, cmd: &Cmd) -> redis::RedisResult<Value> {
        match self {
            Self::Cluster(conn) => {
                let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                conn.clone().route_command(cmd.clone(), routing).await
            }
            other => cmd.query_async(&mut other.clone()).await,
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
    /// The server to subscribe release wake-ups on: the master, or a node of the cluster
    /// (classic `PUBLISH` reaches every node of a cluster), the next one after each failure
    /// (`attempt` counts them).
    pub(crate) fn pubsub_client(&self, attempt: usize) -> Option<redis::Client> {
        match self {
            Self::Fixed(client) => Some((**client).clone()),
            Self::Sentinel(master) => Some(master.client()),
            Self::Cluster(topology) => topology.any_node(attempt),
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

// ------------------------------------------------------------------------------------------
// Sentinel

/// The master the Sentinels name, with a connection to it, replaced when they name another.
pub(crate) struct SentinelMaster {
    name: String,
    sentinels: Vec<(String, redis::Client)>,
    template: NodeTemplate,
    timeout: Duration,
    current: Mutex<Current>,
    /// One resolution at a time; the last one's end, to space them.
    resolving: tokio::sync::Mutex<Option<Instant>>,
    /// The `+switch-master` listeners, stopped with the master.
    listeners: Mutex<Vec<AbortHandle>>,
}

struct Current {
    addr: String,
    client: redis::Client,
    conn: ConnectionManager,
}

impl std::fmt::Debug for SentinelMaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelMaster")
            .field("name", &self.name)
            .field("master", &self.addr())
            .finish_non_exhaustive()
    }
}

impl Drop for SentinelMaster {
    fn drop(&mut self) {
        for task in lock(&self.listeners).drain(..) {
            task.abort();
        }
    }
}

/// How long a failed or finished resolution keeps the next one waiting.
const RESOLVE_SPACING: Duration = Duration::from_millis(50);

impl SentinelMaster {
    /// Asks the Sentinels (`config.nodes`) for the master `config.sentinel_master`, connects to
    /// it and starts listening for `+switch-master` on every Sentinel.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when no Sentinel names a master within `timeout`.
    pub(crate) async fn connect(
        config: &RedisConfig,
        tls: NodeTls,
        timeout: Duration,
    ) -> Result<Arc<Self>> {
        let name = config.sentinel_master.clone().unwrap_or_default();
        let template = NodeTemplate::new(&config.nodes[0], tls, config)?;
        let mut sentinels = Vec::new();
        for node in &config.nodes {
            let (host, port) = host_port(node).ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "invalid Sentinel address {}",
                    distlock_core::service_url::redact(node)
                ))
            })?;
            let client = template.sentinel_client(&host, port)?;
            sentinels.push((format!("{host}:{port}"), client));
        }
        let (host, port) = resolve(&sentinels, &name, timeout)
            .await
            .map_err(|e| e.into_lock_error(&format!("ask the Sentinels for master {name:?}")))?;
        let client = template.client(&host, port)?;
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config(timeout))
            .map_err(|e| RedisError::classify(&host, e).into_lock_error("connect"))?;
        let master = Arc::new(Self {
            name,
            sentinels,
            template,
            timeout,
            current: Mutex::new(Current {
                addr: format!("{host}:{port}"),
                client,
                conn,
            }),
            resolving: tokio::sync::Mutex::new(None),
            listeners: Mutex::new(Vec::new()),
        });
        let listeners = master
            .sentinels
            .iter()
            .map(|(_, client)| {
                tokio::spawn(listen(Arc::downgrade(&master), client.clone())).abort_handle()
            })
            .collect();
        *lock(&master.listeners) = listeners;
        Ok(master)
    }

    /// The current master's address.
    pub(crate) fn addr(&self) -> String {
        lock(&self.current).addr.clone()
    }

    /// The current master's client.
    pub(crate) fn client(&self) -> redis::Client {
        lock(&self.current).client.clone()
    }

    fn connection(&self) -> ConnectionManager {
        lock(&self.current).conn.clone()
    }

    /// After a failed request: a master that is gone or was made a replica (`READONLY`) is
    /// looked up again, in the background.
    fn check(self: &Arc<Self>, error: Option<&redis::RedisError>) {
        let Some(error) = error else { return };
        let moved = error.is_io_error()
            || error.is_connection_refusal()
            || error.is_connection_dropped()
            || error.is_timeout()
            || error.code() == Some("READONLY")
            || error.to_string().contains("READONLY");
        if moved && let Ok(handle) = tokio::runtime::Handle::try_current() {
            let master = self.clone();
            handle.spawn(async move { master.refresh().await });
        }
    }

    /// Asks the Sentinels again and, if they name another master, switches every new request
    /// to it. Spaced: concurrent callers share one resolution.
    pub(crate) async fn refresh(&self) {
        let Ok(mut last) = self.resolving.try_lock() else {
            // Someone is resolving now: its answer serves us too.
            let _ = self.resolving.lock().await;
            return;
        };
        if last.is_some_and(|at| at.elapsed() < RESOLVE_SPACING) {
            return;
        }
        let resolved = resolve(&self.sentinels, &self.name, self.timeout).await;
        *last = Some(Instant::now());
        let Ok((host, port)) = resolved else { return };
        let addr = format!("{host}:{port}");
        if addr == self.addr() {
            return;
        }
        let Ok(client) = self.template.client(&host, port) else {
            return;
        };
        let Ok(conn) =
            ConnectionManager::new_lazy_with_config(client.clone(), manager_config(self.timeout))
        else {
            return;
        };
        let mut current = lock(&self.current);
        tracing::warn!(
            master = %self.name,
            old = %current.addr,
            new = %addr,
            "Sentinel failover: the lock's master moved"
        );
        *current = Current { addr, client, conn };
    }
}

/// The master the Sentinels name: asked of all at once, the address most of those that
/// answered give (ties: the first Sentinel's).
async fn resolve(
    sentinels: &[(String, redis::Client)],
    name: &str,
    timeout: Duration,
) -> std::result::Result<(String, u16), RedisError> {
    let asks = sentinels.iter().map(|(addr, client)| async move {
        let ask = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(name)
                .query_async::<Option<(String, u16)>>(&mut conn)
                .await
        };
        match tokio::time::timeout(timeout, ask).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(RedisError::classify(addr, e)),
            Err(_) => Err(RedisError::timeout(addr)),
        }
    });
    let answers = join_all(asks).await;
    let mut votes: Vec<((String, u16), usize)> = Vec::new();
    let mut failure = None;
    for answer in answers {
        match answer {
            Ok(Some(addr)) => match votes.iter_mut().find(|(a, _)| *a == addr) {
                Some((_, n)) => *n += 1,
                None => votes.push((addr, 1)),
            },
            Ok(None) => {}
            Err(e) => failure = Some(e),
        }
    }
    let best = votes.iter().map(|(_, n)| *n).max().unwrap_or(0);
    match votes.into_iter().find(|(_, n)| *n == best) {
        Some((addr, _)) => Ok(addr),
        None => Err(failure.unwrap_or_else(|| RedisError {
            kind: crate::RedisErrorKind::Other,
            node: sentinels
                .iter()
                .map(|(a, _)| a.as_str())
                .collect::<Vec<_>>()
                .join(","),
            source: Some(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no Sentinel knows the master name",
            ))),
        })),
    }
}

/// Listens for `+switch-master` on one Sentinel and makes the master look again at once;
/// reconnects while the master lives.
async fn listen(master: Weak<SentinelMaster>, sentinel: redis::Client) {
    let mut pause = Duration::from_millis(100);
    loop {
        let Some(timeout) = master.upgrade().map(|m| m.timeout) else {
            return;
        };
        let subscribed = tokio::time::timeout(timeout, async {
            let mut pubsub = sentinel.get_async_pubsub().await.ok()?;
            pubsub.subscribe("+switch-master").await.ok()?;
            Some(pubsub)
        })
        .await;
        if let Ok(Some(pubsub)) = subscribed {
            pause = Duration::from_millis(100);
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                let Some(master) = master.upgrade() else {
                    return;
                };
                // "<name> <old ip> <old port> <new ip> <new port>"
                let payload: String = message.get_payload().unwrap_or_default();
                if payload.split(' ').next() == Some(master.name.as_str()) {
                    master.refresh().await;
                }
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

// ------------------------------------------------------------------------------------------
// Cluster

/// A Redis Cluster: the client library's cluster connection for the lock commands, and this
/// crate's own view of which master serves which slots (for the restart and failover watch
/// of each master, observers, listing and wake-ups).
pub(crate) struct ClusterTopology {
    pub(crate) conn: ClusterConnection,
    template: NodeTemplate,
    seeds: Vec<(String, u16)>,
    timeout: Duration,
    /// Slot ranges and the `host:port` of their master, from `CLUSTER SLOTS`.
    map: Mutex<Vec<(u16, u16, String)>>,
    /// Every node `CLUSTER SLOTS` named, masters and replicas (pub/sub may use any).
    nodes: Mutex<Vec<(String, u16)>>,
    /// The restart and failover watch of each master that serves guards.
    watches: Mutex<HashMap<String, Arc<Restarts>>>,
}

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
        let conn = tokio::time::timeout(timeout, client.get_async_connection())
            .await
            .unwrap_or_else(|_| {
                Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "connect timed out",
                )))
            })
            .map_err(|e| RedisError::classify(&shown, e).into_lock_error("connect"))?;
        let topology = Arc::new(Self {
            conn,
            template,
            seeds,
            timeout,
            map: Mutex::new(Vec::new()),
            nodes: Mutex::new(Vec::new()),
            watches: Mutex::new(HashMap::new()),
        });
        if let Err(e) = topology.refresh().await {
            return Err(e.into_lock_error("read the cluster's slots"));
        }
        // Names the connections (CLIENT SETNAME goes to every node), for CLIENT LIST.
        let mut conn = topology.conn.clone();
        let _ = tokio::time::timeout(
            timeout,
            redis::cmd("CLIENT")
                .arg("SETNAME")
                .arg(&config.client_name)
                .query_async::<Value>(&mut conn),
        )
        .await;
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

    /// Whether `addr` serves any slot as a master, as last read.
    fn is_master(&self, addr: &str) -> bool {
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

    /// A client of the node `host:port`.
    pub(crate) fn client_for(&self, addr: &str) -> Result<redis::Client> {
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse().ok()?)))
            .ok_or_else(|| Error::InvalidConfig(format!("bad node address {addr}")))?;
        self.template.client(host, port)
    }

    /// A client of one node of the cluster, the `attempt`-th in turn.
    fn any_node(&self, attempt: usize) -> Option<redis::Client> {
        let mut nodes = lock(&self.nodes).clone();
        if nodes.is_empty() {
            nodes.clone_from(&self.seeds);
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
