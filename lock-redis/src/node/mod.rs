//! One Redis master: its connection and its subscriber (here), the lock scripts run on it
//! (`locking.rs`; the calls of the shared and permit kinds' scripts in `kinds.rs`), operators'
//! requests (`admin.rs`), and TLS (`tls.rs`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use distlock_core::backend::Contended;
use distlock_core::{Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::topology::{ClusterTopology, Conn, Endpoint, Lane, SentinelMaster};

use crate::RedisConfig;
use crate::error::{RedisError, RedisErrorKind};
use crate::restart::{self, Restarts};
use crate::wake::Subscriber;

mod admin;
mod locking;
mod tls;

pub(crate) use admin::Holding;
pub(crate) use locking::{Answer, ReleaseMode, seed_floor};
pub(crate) use tls::NodeTls;
use tls::wrong_port;

/// One master: a multiplexed, auto-reconnecting connection and a lazily opened subscriber.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) addr: String,
    pub(crate) conn: Conn,
    /// Where a `wait_replicas` grant's renewal and `WAIT` go: with `wait_replicas`, a
    /// connection of their own (see [`Lane::Waits`]); the same as `conn` otherwise.
    pub(crate) waits: Conn,
    /// Where the background connections go (election observers' too).
    pub(crate) endpoint: Endpoint,
    pub(crate) sub: Subscriber,
    /// Learns that the server restarted (and forgot its locks), or that a failover replaced
    /// it (Sentinel). `None` for a cluster: each master has its own, in the topology.
    pub(crate) restarts: Option<Arc<Restarts>>,
    /// Whether the server takes `SET ... NX GET` (Redis >= 7.0); cleared at the first
    /// refusal, after which every acquisition runs the script.
    pub(crate) fast_path: AtomicBool,
    /// Locks this client saw contended lately (a refused fast path, a busy answer of the
    /// script, a release that found waiters): their acquisitions go straight to the script,
    /// and their releases to the full release script. A refused fast path costs a round trip,
    /// so on a contended lock it doubled the round trips of an acquisition (and, while the
    /// fast path was a `MULTI` whose `INCR` always ran, the counter's growth: 13,099 values
    /// for 6,550 acquisitions in an independent benchmark); the short release script
    /// ([`RELEASE_ALONE`](crate::scripts::RELEASE_ALONE)) costs a round trip when waiters
    /// are queued. An uncontended lock keeps both short paths.
    pub(crate) contended: Contended,
}

impl Node {
    /// Connects to the master of `client` (made by [`NodeTls::client`], or the
    /// application's own), naming the connection `name`. A master that does not answer
    /// within `timeout` still gets a node (connected lazily, retried by the connection
    /// manager) and the failure, for the caller's quorum count.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a database the server does not have.
    pub(crate) async fn connect(
        client: redis::Client,
        name: &str,
        timeout: Duration,
    ) -> Result<(Self, Option<RedisError>)> {
        let info = client.get_connection_info();
        let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        let addr = info.addr().to_string();
        let db = info.redis_settings().db();
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(200));
        let eager = tokio::time::timeout(
            timeout,
            ConnectionManager::new_with_config(client.clone(), manager_config.clone()),
        )
        .await
        .unwrap_or_else(|_| {
            Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "connect timed out",
            )))
        });
        let (conn, failure, run_id) = match eager {
            Ok(mut conn) => {
                // Lets operators (and the tests' fault hooks) find the connection in CLIENT
                // LIST; a reconnected connection is unnamed. Best effort, except that it is
                // the first command: a server that wants credentials (NOAUTH) says so here,
                // at connect time, not at the first lock.
                let named: redis::RedisResult<()> = tokio::time::timeout(
                    timeout,
                    redis::cmd("CLIENT")
                        .arg("SETNAME")
                        .arg(name)
                        .query_async(&mut conn),
                )
                .await
                .unwrap_or(Ok(()));
                if let Err(err) = named
                    && matches!(err.code(), Some("NOAUTH" | "WRONGPASS"))
                {
                    return Err(RedisError::classify(&addr, err).into_lock_error("connect"));
                }
                let run_id = restart::run_id(&mut conn, timeout).await.ok().flatten();
                (conn, None, run_id)
            }
            Err(err) if err.to_string().contains("refused to switch database") => {
                return Err(Error::InvalidConfig(format!(
                    "Redis database {db} does not exist on {addr} (the server has fewer \
                     databases: see `databases` in redis.conf)"
                )));
            }
            Err(err) => {
                let mut failure = RedisError::classify(&addr, err);
                if matches!(
                    failure.kind,
                    RedisErrorKind::Timeout | RedisErrorKind::Connection
                ) && let Some(why) = wrong_port(&addr, tls, timeout / 4).await
                {
                    failure = RedisError::tls(&addr, why);
                }
                let lazy = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
                    .map_err(|e| RedisError::classify(&addr, e).into_lock_error("connect"))?;
                (lazy, Some(failure), None)
            }
        };
        let restarts = Arc::new(Restarts::new(client.clone(), timeout, run_id));
        let endpoint = Endpoint::Fixed(Box::new(client));
        let sub = Subscriber::new(endpoint.clone(), addr.clone(), timeout);
        let conn = Conn::Direct(conn);
        let node = Self {
            addr,
            waits: conn.clone(),
            conn,
            endpoint,
            sub,
            restarts: Some(restarts),
            fast_path: AtomicBool::new(true),
            contended: Contended::default(),
        };
        Ok((node, failure))
    }

    /// The master the Sentinels name (see [`SentinelMaster`]). Its `run_id` is read at once,
    /// so that a failover later shows as a new one.
    ///
    /// # Errors
    /// As [`SentinelMaster::connect`]; credentials the master refuses.
    pub(crate) async fn sentinel(
        config: &RedisConfig,
        tls: NodeTls,
        timeout: Duration,
    ) -> Result<Self> {
        let master = SentinelMaster::connect(config, tls, timeout).await?;
        let mut conn = Conn::Sentinel(master.clone(), Lane::Locks);
        let waits = Conn::Sentinel(master.clone(), Lane::Waits);
        let addr = master.addr();
        let named: redis::RedisResult<()> = tokio::time::timeout(
            timeout,
            redis::cmd("CLIENT")
                .arg("SETNAME")
                .arg(&config.client_name)
                .query_async(&mut conn),
        )
        .await
        .unwrap_or(Ok(()));
        if let Err(err) = named {
            return Err(RedisError::classify(&addr, err).into_lock_error("connect"));
        }
        if config.wait_replicas > 0 {
            // Connected now (and named, best effort): the first grant does not pay for it.
            let _ = tokio::time::timeout(
                timeout,
                redis::cmd("CLIENT")
                    .arg("SETNAME")
                    .arg(&config.client_name)
                    .query_async::<()>(&mut waits.clone()),
            )
            .await;
        }
        let run_id = restart::run_id(&mut conn, timeout)
            .await
            .ok()
            .flatten()
            .map(|id| (id, addr.clone()));
        let restarts = Arc::new(Restarts::sentinel(Arc::downgrade(&master), timeout, run_id));
        let endpoint = Endpoint::Sentinel(master);
        let sub = Subscriber::new(endpoint.clone(), addr.clone(), timeout);
        Ok(Self {
            addr: format!(
                "sentinel master {:?}",
                config.sentinel_master.as_deref().unwrap_or("")
            ),
            conn,
            waits,
            endpoint,
            sub,
            restarts: Some(restarts),
            fast_path: AtomicBool::new(true),
            contended: Contended::default(),
        })
    }

    /// A Redis Cluster (see [`ClusterTopology`]).
    ///
    /// # Errors
    /// As [`ClusterTopology::connect`].
    pub(crate) async fn cluster(
        config: &RedisConfig,
        tls: NodeTls,
        timeout: Duration,
    ) -> Result<Self> {
        let topology = ClusterTopology::connect(config, tls, timeout).await?;
        let conn = Conn::Cluster(topology.conn.clone());
        let waits = Conn::Cluster(topology.waits.clone());
        let addr = "cluster".to_owned();
        let endpoint = Endpoint::Cluster(topology);
        let sub = Subscriber::new(endpoint.clone(), addr.clone(), timeout);
        Ok(Self {
            addr,
            conn,
            waits,
            endpoint,
            sub,
            restarts: None,
            fast_path: AtomicBool::new(true),
            contended: Contended::default(),
        })
    }

    /// A failure of a request: a read-only answer on a Sentinel or Cluster master means a
    /// failover demoted it: retryable; a Sentinel's master is looked up again (also for a
    /// refusal a batch renewal answers for one of its locks, which no request check sees).
    pub(crate) fn classify(&self, e: redis::RedisError) -> RedisError {
        let mut error = RedisError::classify(&self.addr, e);
        if error.kind == RedisErrorKind::ReadOnly && !matches!(self.conn, Conn::Direct(_)) {
            error.kind = RedisErrorKind::Failover;
            if let Endpoint::Sentinel(master) = &self.endpoint {
                master.look_again();
            }
        }
        error
    }

    /// The cluster's topology, for a cluster node.
    pub(crate) fn cluster_topology(&self) -> Option<&Arc<ClusterTopology>> {
        match &self.endpoint {
            Endpoint::Cluster(topology) => Some(topology),
            _ => None,
        }
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Runs `fut` with a per-node timeout.
pub(crate) async fn within<T>(
    node: &Node,
    timeout: Duration,
    fut: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisError> {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or_else(|_| Err(RedisError::timeout(&node.addr)))
}
