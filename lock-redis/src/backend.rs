//! The backend: connecting to one master or the Redlock nodes, capabilities, inspection,
//! listing and forced release. The protocol is in `attempt.rs`, `lease.rs`, `node/` and, for
//! Redlock, `redlock.rs`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use distlock_core::backend::{Renewer, held_among};
use distlock_core::{
    AcquireRequest, Attempt, Capabilities, ClientConfig, Error, FencingGuarantee, FencingToken,
    LockBackend, LockInfo, LockName, LossDetection, Result, WakeUp,
};
use futures::StreamExt;
use futures::future::join_all;
use futures::stream::BoxStream;

use crate::attempt::{RedisAttempt, remaining};
use crate::keys::{KeysCache, LockKeys};
use crate::node::{Holding, Node, NodeTls, within};
use crate::renew::RedisRenewer;
use crate::{MAX_PERMITS, RedisConfig, Topology};
use crate::{observe, redlock};

/// The shortest ttl on one master (also Sentinel, Cluster): a renewal every ttl/3 is one
/// round trip (a script), and it must land within the two thirds of the ttl left, less the
/// drift allowance. 200 ms leaves it about 130 ms: many round trips on a LAN, room for a
/// scheduler hiccup or a Cluster redirect; shorter leases expire under ordinary load.
const MIN_TTL: Duration = Duration::from_millis(200);

/// The shortest Redlock ttl: a renewal must reach a majority of the masters, each within the
/// per-node timeout of ttl/10, and the validity left must cover the slowest of them. 500 ms
/// gives each node 50 ms.
const REDLOCK_MIN_TTL: Duration = Duration::from_millis(500);

/// The Redis [`LockBackend`]: one master (`redis`) or Redlock over N masters (`redlock`).
/// Made by [`connect`](crate::connect) or [`RedisBackend::connect`]. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RedisBackend {
    shared: Arc<BackendState>,
}

/// What one backend holds, shared by its clones, attempts, leases and renewer: the nodes,
/// the configuration, the renewer and the keys cache.
#[derive(Debug)]
pub(crate) struct BackendState {
    pub(crate) nodes: Vec<Node>,
    pub(crate) config: RedisConfig,
    pub(crate) client: ClientConfig,
    /// The one batch of automatic renewals of this backend's leases (see `renew.rs`).
    pub(crate) renewer: Arc<dyn Renewer>,
    /// The keys of the names acquired lately.
    pub(crate) keys: KeysCache,
}

impl RedisBackend {
    /// Connects to the nodes of `config`. One master must answer within the operation
    /// timeout; for Redlock, a majority must (the others are connected lazily and retried).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a bad configuration, [`Error::Unavailable`] when the
    /// server(s) cannot be reached in time.
    pub async fn connect(config: RedisConfig, client: ClientConfig) -> Result<Self> {
        config.validate()?;
        client.validate()?;
        if config.wait_replicas > 0 && config.wait_timeout > client.operation_timeout / 2 {
            // A poll (the acquisition, then its replicas' wait, then a give-back) must end
            // within the operation timeout: past it, the poll is cut short and the grant stays.
            return Err(Error::InvalidConfig(format!(
                "wait_timeout ({:?}) must be at most half the operation timeout ({:?})",
                config.wait_timeout, client.operation_timeout
            )));
        }
        let tls = NodeTls::load(&config).await?;
        let timeout = client.operation_timeout;
        let node = match config.topology() {
            Topology::Sentinel => Some(Node::sentinel(&config, tls.clone(), timeout).await?),
            Topology::Cluster => Some(Node::cluster(&config, tls.clone(), timeout).await?),
            _ => None,
        };
        if let Some(node) = node {
            return Ok(Self {
                shared: Arc::new(BackendState {
                    renewer: Arc::new(RedisRenewer::new(std::slice::from_ref(&node))),
                    nodes: vec![node],
                    config,
                    client,
                    keys: KeysCache::default(),
                }),
            });
        }
        let clients = config
            .nodes
            .iter()
            .map(|url| tls.client(url, &config.client_name))
            .collect::<Result<Vec<_>>>()?;
        Self::with_clients(clients, config, client).await
    }

    /// Uses the application's own clients (`redis::Client` holds the address, credentials,
    /// TLS settings and database of one master): one for a single master, three or more for
    /// Redlock over independent masters. `options` gives the lock options (fairness, handoff,
    /// timeouts, client name); its nodes are replaced by the clients' addresses (without
    /// credentials) and its mode by the number of clients. The backend opens its own
    /// connections from the clients (a multiplexed connection and a subscriber per master),
    /// as a `ConnectionManager` of the application would.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), distlock_core::Error> {
    /// use distlock_redis::{RedisBackend, RedisConfig, redis};
    /// use distlock_core::{ClientConfig, LockClient};
    ///
    /// let app_client = redis::Client::open("redis://:secret@10.0.0.5:6379/0").expect("url");
    /// let options = RedisConfig::single("redis://unused")?.with_fair(true);
    /// let backend =
    ///     RedisBackend::from_clients(vec![app_client], options, ClientConfig::default()).await?;
    /// let locks = LockClient::new(backend);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for no client, two clients (Redlock needs three or more) or
    /// bad options; otherwise as [`RedisBackend::connect`].
    pub async fn from_clients(
        clients: Vec<redis::Client>,
        mut options: RedisConfig,
        client: ClientConfig,
    ) -> Result<Self> {
        options.nodes = clients.iter().map(describe).collect();
        options.redlock = clients.len() > 1;
        options.sentinel_master = None;
        options.cluster = false;
        options.wait_replicas = 0;
        Self::with_clients(clients, options, client).await
    }

    async fn with_clients(
        clients: Vec<redis::Client>,
        config: RedisConfig,
        client: ClientConfig,
    ) -> Result<Self> {
        config.validate()?;
        client.validate()?;
        let timeout = client.operation_timeout;
        let connects = clients
            .into_iter()
            .map(|c| Node::connect(c, &config.client_name, timeout));
        let mut nodes = Vec::new();
        let mut failures = Vec::new();
        for result in join_all(connects).await {
            let (node, failure) = result?;
            if let Some(failure) = failure {
                failures.push(failure);
            }
            nodes.push(node);
        }
        let reachable = nodes.len() - failures.len();
        if reachable < config.quorum() {
            let mut failures = failures.into_iter();
            return Err(match (config.redlock, failures.next()) {
                (false, Some(failure)) => failure.into_lock_error("connect"),
                (_, first) => Error::Unavailable {
                    message: format!(
                        "only {reachable} of {} Redis masters reachable, {} needed{}",
                        nodes.len(),
                        config.quorum(),
                        first
                            .as_ref()
                            .map(|f| format!(" ({}: {})", f.node, f.kind))
                            .unwrap_or_default()
                    ),
                    source: first.map(Into::into),
                },
            });
        }
        Ok(Self {
            shared: Arc::new(BackendState {
                renewer: Arc::new(RedisRenewer::new(&nodes)),
                nodes,
                config,
                client,
                keys: KeysCache::default(),
            }),
        })
    }

    /// The configuration (for a backend [`from_clients`](Self::from_clients), the clients'
    /// addresses as its nodes).
    pub fn config(&self) -> &RedisConfig {
        &self.shared.config
    }
}

impl BackendState {
    pub(crate) fn redlock(&self) -> bool {
        self.config.redlock
    }

    pub(crate) fn quorum(&self) -> usize {
        self.config.quorum()
    }

    /// Redlock's per-node timeout: much smaller than the ttl.
    pub(crate) fn node_timeout(&self, ttl: Duration) -> Duration {
        let op = self.client.operation_timeout;
        self.config
            .node_timeout
            .unwrap_or_else(|| (ttl / 10).max(Duration::from_millis(5)))
            .min(op)
    }

    /// Per-node timeout of releases and abandons: not time-critical, but must end before
    /// the core's operation timeout.
    pub(crate) fn cleanup_timeout(&self) -> Duration {
        self.client.operation_timeout * 3 / 4
    }

    /// How often a waiter acquiring with `ttl` must poll to stay in the queue.
    pub(crate) fn refresh(&self, ttl: Duration) -> Duration {
        self.config.waiter_timeout_for(ttl) / 3
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn name(&self) -> &'static str {
        match self.shared.config.topology() {
            Topology::Redlock => "redlock",
            Topology::Sentinel => "redis-sentinel",
            Topology::Cluster => "redis-cluster",
            _ => "redis",
        }
    }

    /// Holder data on one master, Sentinel and Cluster; not on Redlock (see
    /// `RedisLease::set_data` for why), nor release of a hold by its token, nor semaphores.
    fn capabilities(&self) -> Capabilities {
        let redlock = self.shared.redlock();
        let fencing = if redlock {
            FencingGuarantee::BestEffort
        } else {
            FencingGuarantee::SingleNode
        };
        let min_ttl = if redlock { REDLOCK_MIN_TTL } else { MIN_TTL };
        Capabilities::new(fencing)
            .with_fifo(self.shared.config.fair && !redlock)
            .with_wake_up(WakeUp::Event)
            .with_ttl_range(min_ttl, Duration::from_secs(7 * 24 * 3600))
            .with_loss_detection(LossDetection::Renewal)
            .with_list(true)
            .with_force_release(true)
            .with_release_hold(!redlock)
            .with_holder_data(!redlock)
            .with_shared(true)
            .with_max_permits(if redlock { 0 } else { MAX_PERMITS })
    }

    fn begin(&self, request: AcquireRequest) -> Box<dyn Attempt> {
        let keys = self.shared.keys.get(&request.name);
        // Redlock: every node must order waiters alike, so the arrival score comes from here
        // (a client's clock orders waiters, and so decides whether a new reader passes a
        // queued writer; it never decides whether two kinds hold at once).
        let score = if self.shared.redlock() {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_micros().to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Box::new(RedisAttempt {
            shared: self.shared.clone(),
            keys,
            request,
            score,
            subs: Vec::new(),
            settled: false,
            polled: false,
            seen: Vec::new(),
            handed: Vec::new(),
        })
    }

    /// Client-side caching in broadcasting mode on every master (see `observe.rs`): the
    /// server pushes an invalidation to the observer's own connection whenever the name's
    /// lock or holders key changes (new holder, release, renewal, expiry), so lockers do no
    /// extra work at all. The stream yields once tracking is active and at every push; it
    /// ends (the observer reads at intervals) when no master accepts tracking.
    fn watch(&self, name: &LockName) -> Option<BoxStream<'static, ()>> {
        let keys = LockKeys::new(name);
        let timeout = self.shared.client.operation_timeout;
        let streams = self
            .shared
            .nodes
            .iter()
            .map(|n| observe::changes(&n.endpoint, &keys, timeout));
        Some(futures::stream::select_all(streams).boxed())
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let keys = LockKeys::new(name);
        let shared = &self.shared;
        if !shared.redlock() {
            let node = &shared.nodes[0];
            let holding = node
                .inspect(&keys)
                .await
                .map_err(|e| e.into_lock_error("inspect"))?;
            return Ok(match holding {
                Holding::Free => None,
                Holding::Exclusive {
                    owner,
                    pttl,
                    data,
                    counter,
                } => Some(
                    LockInfo::new(
                        owner,
                        counter.filter(|c| *c > 0).map(FencingToken::new),
                        remaining(pttl),
                    )
                    .with_data(data),
                ),
                Holding::Holds { kind, holders } => {
                    let count = u32::try_from(holders.len()).unwrap_or(u32::MAX);
                    let Some(latest) = holders.into_iter().max_by_key(|h| h.token) else {
                        return Ok(None);
                    };
                    // The data of the holder shown (one more round trip; it is keyed by
                    // the owner, so it is that hold's or none, even if it ended meanwhile).
                    let data = node
                        .data_of(&keys, &latest.owner)
                        .await
                        .map_err(|e| e.into_lock_error("inspect"))?;
                    Some(
                        LockInfo::new(
                            latest.owner,
                            latest.token.map(FencingToken::new),
                            remaining(latest.remaining),
                        )
                        .with_holders(kind, count)
                        .with_data(data),
                    )
                }
            });
        }
        redlock::inspect(shared, &keys).await
    }

    /// `SCAN` over the lock keys (one master), then each candidate is read as
    /// [`inspect`](LockBackend::inspect) reads it. Redlock: the names found on any node, each
    /// reported only if a majority agrees on its holder (the same view `inspect` gives), so a
    /// lock held on a minority only is not listed; fails when fewer than a majority of nodes
    /// can be scanned.
    async fn list(&self, prefix: Option<&str>, limit: usize) -> Result<Vec<(LockName, LockInfo)>> {
        let shared = &self.shared;
        let prefix = prefix.unwrap_or("");
        // Candidates include reservations and keys expiring meanwhile: scan for some more.
        let enough = limit.saturating_mul(2).max(limit.saturating_add(16));
        let timeout = shared.client.operation_timeout;
        if let Some(topology) = shared.nodes[0].cluster_topology() {
            // Every master's keys: each master scanned on a connection of its own.
            let node = &shared.nodes[0];
            let _ = topology.refresh().await;
            let mut candidates = std::collections::BTreeSet::new();
            for master in topology.masters() {
                let client = topology.client_for(&master)?;
                let names = within(node, timeout, async {
                    let conn = client
                        .get_multiplexed_async_connection()
                        .await
                        .map_err(|e| crate::RedisError::classify(&master, e))?;
                    node.scan_names_on(conn, prefix, enough).await
                })
                .await
                .map_err(|e| e.into_lock_error("list"))?;
                candidates.extend(names);
            }
            return held_among(self, candidates, limit).await;
        }
        let scans = join_all(
            shared
                .nodes
                .iter()
                .map(|n| within(n, timeout, n.scan_names(prefix, enough))),
        )
        .await;
        let mut candidates = std::collections::BTreeSet::new();
        let mut answered = 0;
        let mut failure = None;
        for scan in scans {
            match scan {
                Ok(names) => {
                    answered += 1;
                    candidates.extend(names);
                }
                Err(err) => failure = Some(err),
            }
        }
        if answered < shared.quorum() {
            return Err(match failure {
                Some(err) if !shared.redlock() => err.into_lock_error("list"),
                failure => Error::Unavailable {
                    message: format!(
                        "list reached {answered} of {} Redis masters, {} needed",
                        shared.nodes.len(),
                        shared.quorum()
                    ),
                    source: failure.map(Into::into),
                },
            });
        }
        held_among(self, candidates, limit).await
    }

    /// `SCAN` of every master (Cluster: each master of the cluster; Redlock: every node,
    /// summed) for the keys of the names, counted by kind: `lock`, `fence`, `queue`,
    /// `alive`, `holders`, `tokens`, `data`.
    async fn footprint(&self, prefix: &str) -> Result<Option<distlock_core::Footprint>> {
        let mut footprint = distlock_core::Footprint::new("keys");
        let shared = &self.shared;
        let node = &shared.nodes[0];
        if let Some(topology) = node.cluster_topology() {
            let _ = topology.refresh().await;
            for master in topology.masters() {
                let client = topology.client_for(&master)?;
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| {
                        crate::RedisError::classify(&master, e).into_lock_error("footprint")
                    })?;
                node.count_keys_on(conn, prefix, &mut footprint)
                    .await
                    .map_err(|e| e.into_lock_error("footprint"))?;
            }
            return Ok(Some(footprint));
        }
        for node in &shared.nodes {
            node.count_keys_on(node.conn.clone(), prefix, &mut footprint)
                .await
                .map_err(|e| e.into_lock_error("footprint"))?;
        }
        Ok(Some(footprint))
    }

    /// Runs the release script as the current holder (see `Node::force_release`) on every
    /// node: waiters get the same handoff and pub/sub wake-up as after a release, and the
    /// fencing counters are kept, so the next token is higher. Redlock: removed from every
    /// master that answers, `true` if a majority of masters held it for one owner, `false` if
    /// none could have (a copy on fewer was no lock, as for a release); fails when the masters
    /// that did not answer could have made up that majority (the others free it at expiry).
    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let keys = LockKeys::new(name);
        let shared = &self.shared;
        if !shared.redlock() {
            return shared.nodes[0]
                .force_release(&keys, &shared.config)
                .await
                .map(|owners| !owners.is_empty())
                .map_err(|e| e.into_lock_error("force release"));
        }
        redlock::force_release(shared, &keys, name).await
    }

    /// One master only (the hold's token read, then its owner-checked release script): a Redlock token is
    /// the largest of the majority's counters at acquisition, which no node can check, so
    /// Redlock does not declare it.
    async fn release_hold(
        &self,
        name: &LockName,
        owner: &str,
        token: FencingToken,
    ) -> Result<bool> {
        let shared = &self.shared;
        if shared.redlock() {
            return Err(Error::Unsupported(
                "Redlock cannot release a hold by its token: no node can check it".into(),
            ));
        }
        shared.nodes[0]
            .release_hold(&LockKeys::new(name), &shared.config, owner, token.get())
            .await
            .map_err(|e| e.into_lock_error("release of a hold"))
    }
}

/// A node URL for an application's client: its address and database, never its credentials.
fn describe(client: &redis::Client) -> String {
    let info = client.get_connection_info();
    let scheme = match info.addr() {
        redis::ConnectionAddr::TcpTls { .. } => "rediss",
        redis::ConnectionAddr::Unix(_) => "redis+unix",
        _ => "redis",
    };
    format!("{scheme}://{}/{}", info.addr(), info.redis_settings().db())
}
